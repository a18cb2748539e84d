"""SimRank's iterations on a dense similarity matrix, once S has filled in.

S_k+1 = c Wᵀ S_k W (paper 000, eq. 5-6) keeps S sparse only while node pairs are not yet joined by in-paths of
equal length; on a power-law graph, whose nodes are a few in-steps apart, S fills in within a few
iterations. A sparse iteration pays, before its products, a compile of the tuned SpGEMM for each of its two
products whose structures are new (every iteration while S fills in: the structure's digest, the plan, the
layout and the module loads); its results, and SciPy's element-wise passes over them, then go through host
memory: at least 12 B (value and index) per scalar product at the host's streaming rate. A dense iteration
stays on the device: each entry of Wᵀ streams a row of S (then of Tᵀ), 2 nnz(W) n 8 B at the device's
bandwidth. Once the next iteration costs more time the sparse way (:func:`dense_pays`) and the dense state
fits (:func:`dense_bytes`), S goes dense and each iteration is two products of the sparse Wᵀ with n dense
columns (cuSPARSE's SpMM):

    T = Wᵀ S_k,    S_k+1 = c Wᵀ Tᵀ    (S_k is symmetric: Tᵀ = S_k W),

then the unit diagonal and NetworkX's stopping rule, all on the device; only each iteration's gap (n column
maxima) comes back, and S once at the end.

Example (1,000 nodes, 10,000 edges, a device 300 times the host's bandwidth; products compiled, then not):
    >>> dense_pays(10_000, 1_000, 10_000, 300.0), dense_pays(10_000, 1_000, 100_000, 300.0)
    (False, True)
    >>> dense_pays(10_000, 1_000, 10_000, 300.0, compile_s=2 * COMPILE_FLOOR_S)
    True
"""
from __future__ import annotations

import contextlib

import numpy as np
import scipy.sparse as sp

from ..formats.xp import host

RTOL = 1e-5  # numpy.allclose's, which NetworkX's stopping rule uses with atol=tolerance
SPARSE_BYTES = 12  # host bytes per scalar product of the sparse iteration: its result's value and index
DENSE_BYTES = 16  # device bytes per entry of Wᵀ and node of the dense iteration: two products, 8 B of S each
# The sparse iteration's host passes (SciPy's products and element-wise operations) run on one core.
HOST_GBS = 10.0
# The least a compile of the tuned SpGEMM for a structure it has not seen takes where its binaries are cached
# (digest, plan, layout, module load; measured on tiny products): what a sparse iteration pays per product
# before a process has timed one of its own (:class:`tuner.graph.simrank.ReusedProducts` times each).
COMPILE_FLOOR_S = 0.02
DENSE_ARRAYS = 3  # S_k, T = Wᵀ S_k and S_k+1, each n x n


def dense_pays(w_nnz: int, n: int, sparse_products: int, bandwidth_ratio: float, compile_s: float = 0.0) -> bool:
    """Whether a dense iteration (:data:`DENSE_BYTES` per entry of Wᵀ and node, on the device) takes no longer
    than the sparse one: ``compile_s`` seconds compiling its products for new structures, then
    :data:`SPARSE_BYTES` per scalar product through the host at :data:`HOST_GBS`. ``bandwidth_ratio``: the
    device's streaming bandwidth over the host's (0: no GPU, never dense).

    Example (the dense iteration's 160 MB at 300 times the host's rate against 12 B x 50,000 there):
        >>> dense_pays(10_000, 1_000, 40_000, 300.0), dense_pays(10_000, 1_000, 50_000, 300.0)
        (False, True)
    """
    if not bandwidth_ratio > 0:
        return False
    host_bytes_per_s = HOST_GBS * 1e9
    sparse_s = SPARSE_BYTES * int(sparse_products) / host_bytes_per_s + float(compile_s)
    return sparse_s * float(bandwidth_ratio) * host_bytes_per_s >= DENSE_BYTES * int(w_nnz) * int(n)


def bandwidth_ratio() -> float:
    """This GPU's streaming bandwidth (its profile's copy bandwidth) over :data:`HOST_GBS`; 0 without a GPU
    or a profile (no dense iterations).

    Example (on a GPU machine):
        >>> bandwidth_ratio() > 100   # doctest: +SKIP
        True
    """
    from .. import gpu
    from ..model import load_profile
    if not gpu.available():
        return 0.0
    try:
        profile = load_profile(gpu.device_info().name)
    except FileNotFoundError:
        return 0.0
    return float(profile.constants["copy_bandwidth_gbs"]) / HOST_GBS


def dense_bytes(n: int, itemsize: int = 8) -> int:
    """Device bytes of the dense state of an n-node SimRank (:data:`DENSE_ARRAYS` n x n arrays).

    Example:
        >>> dense_bytes(1000)
        24000000
    """
    return DENSE_ARRAYS * int(n) * int(n) * int(itemsize)


def dense_fits_device(n: int) -> bool:
    """Whether :func:`dense_bytes` of ``n`` nodes fit the GPU's free memory with two n x n blocks to spare
    (a product's result before it is copied into place, and a margin for cuSPARSE's work space); False
    without a GPU.

    Example (on a GPU machine):
        >>> dense_fits_device(10_000), dense_fits_device(1_000_000)   # doctest: +SKIP
        (True, False)
    """
    from .. import gpu
    if not gpu.available():
        return False
    return dense_bytes(n) + 2 * n * n * 8 <= gpu.free_memory(release_pool=True)


def host_product(Wt: sp.csr_matrix):
    """``product(X, out, alpha, transposed)`` of :class:`DenseSimRank` on the host: ``out = alpha Wᵀ op(X)``
    with SciPy, op(X) = Xᵀ where ``transposed``.

    Example:
        >>> out = np.empty((2, 2), order="F")
        >>> host_product(sp.csr_matrix(np.array([[0.0, 1.0], [0.0, 0.0]])))(np.eye(2, order="F"), out, 2.0, True)
        >>> out.tolist()
        [[0.0, 2.0], [0.0, 0.0]]
    """
    def product(X, out, alpha=1.0, transposed=False):
        np.multiply(Wt @ (X.T if transposed else X), alpha, out=out)
    return product


class DenseSimRank:
    """SimRank's iterations from S (a SciPy matrix) on dense n x n arrays of ``xp`` (NumPy or CuPy) in
    column-major order, with ``product(X, out, alpha=1.0, transposed=False)`` writing alpha Wᵀ op(X) into
    ``out`` (op(X) = Xᵀ where ``transposed``; X and out column-major, as cuSPARSE's SpMM takes them, so that
    no step copies a transpose); ``on()`` a context in which ``xp``'s work runs (the GPU the arrays live on);
    ``dense(S)`` and ``sparse(X)`` S as such an array and back as a SciPy CSR matrix (default: on the host).

    Example (NumPy, SciPy's product):
        >>> Wt = sp.csr_matrix(np.array([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]))  # 0 -> 1, 0 -> 2
        >>> it = DenseSimRank(sp.identity(3, format="csr"), host_product(Wt), np)
        >>> round(it.step(0.9), 3), it.step(0.9), it.result().toarray().round(2).tolist()
        (0.9, 0.0, [[1.0, 0.0, 0.0], [0.0, 1.0, 0.9], [0.0, 0.9, 1.0]])
    """

    def __init__(self, S: sp.spmatrix, product, xp, on=contextlib.nullcontext, dense=None, sparse=None):
        n = S.shape[0]
        self._xp, self._product, self._on = xp, product, on
        self._sparse = sparse or sp.csr_matrix
        with on():
            self._s = (dense or (lambda M: np.asfortranarray(M.toarray(), dtype=np.float64)))(S)
            self._t = xp.empty((n, n), np.float64, order="F")
            self._next = xp.empty((n, n), np.float64, order="F")
        self._gap = _gap_kernel(xp)

    def step(self, c: float) -> float:
        """One iteration; the largest of ``|S_k+1 - S_k| - RTOL |S_k+1|`` over the entries (NumPy's allclose
        with atol=tolerance holds where it is at most the tolerance)."""
        with self._on():
            self._product(self._s, self._t)                              # T = Wᵀ S
            self._product(self._t, self._next, alpha=c, transposed=True)  # c Wᵀ Tᵀ = c Wᵀ S W
            self._xp.fill_diagonal(self._next, 1.0)
            gap = float(self._gap(self._next, self._s))
        self._s, self._next = self._next, self._s
        return gap

    def result(self) -> sp.csr_matrix:
        """S as a SciPy CSR matrix (its zeros left out)."""
        with self._on():
            return self._sparse(self._s)


def _gap_kernel(xp):
    """max(|new - old| - RTOL |new|) over the entries: one fused pass on the device (no n x n temporaries),
    a maximum per column there (CuPy gives a reduction a block per output: one output would leave the GPU to a
    single block; the columns of the column-major arrays are contiguous), the n maxima's on the host."""
    if xp is np:
        return lambda new, old: (np.abs(new - old) - RTOL * np.abs(new)).max()
    columns = xp.ReductionKernel("float64 s1, float64 s0", "float64 gap", f"fabs(s1 - s0) - {RTOL!r} * fabs(s1)",
                                 "fmax(a, b)", "gap = a", "-1e300", "simrank_gap")
    return lambda new, old: host(columns(new.T, old.T, axis=1)).max()


def device_simrank(Wt: sp.csr_matrix, S: sp.spmatrix) -> DenseSimRank:
    """:class:`DenseSimRank` on this GPU: Wᵀ uploaded once, S uploaded sparse and made dense there, each
    product cuSPARSE's SpMM through CuPy with the transpose and the factor c in its call (the SpMM family of
    :mod:`tuner.spmm` is built for blocks of a few columns, not n of them; see :func:`dense_fits_device`
    first), the result made sparse there (cuSPARSE's dense-to-CSR) and copied back as CSR.

    Example (on a GPU machine):
        >>> it = device_simrank(Wt, S)   # doctest: +SKIP
        >>> gap = it.step(0.9)           # doctest: +SKIP
    """
    import cupy
    import cupyx.cusparse
    import cupyx.scipy.sparse as cpsp

    from ..formats import device_reorder
    with device_reorder.on_device():  # the process's GPU (tuner.gpu.select_device), here and in every step
        wt = cpsp.csr_matrix(sp.csr_matrix(Wt, dtype=np.float64))
        wt.sum_duplicates()  # canonical, as cuSPARSE's SpMM wants it (a no-op for Wt made by SciPy)

    def product(X, out, alpha=1.0, transposed=False):
        cupyx.cusparse.spmm(wt, X, c=out, alpha=alpha, transb=transposed)

    def dense(M):
        out = cupy.zeros(M.shape, np.float64, order="F")
        return cupyx.cusparse.sparseToDense(cpsp.csr_matrix(sp.csr_matrix(M, dtype=np.float64)), out=out)

    def sparse(X):
        return cupyx.cusparse.denseToSparse(X, format="csr").get()
    return DenseSimRank(S, product, cupy, on=device_reorder.on_device, dense=dense, sparse=sparse)
