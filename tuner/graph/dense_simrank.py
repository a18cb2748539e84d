"""SimRank's iterations on a dense similarity matrix, once S has filled in.

S_k+1 = c Wᵀ S_k W (paper 000, eq. 5-6) keeps S sparse only while node pairs are not yet joined by in-paths of
equal length; on a power-law graph, whose nodes are a few in-steps apart, S fills in within a few
iterations. The sparse iteration's SpGEMM results, and SciPy's element-wise passes over them, go through host
memory: at least 12 B (value and index) per scalar product at the host's streaming rate. A dense iteration
stays on the device: each entry of Wᵀ streams a row of S (then of Tᵀ), 2 nnz(W) n 8 B at the device's
bandwidth. Once the next iteration's products cost more that way (:func:`dense_pays`) and the dense state
fits (:func:`dense_bytes`), S goes dense and each iteration is two products of the sparse Wᵀ with n dense
columns (cuSPARSE's SpMM):

    T = Wᵀ S_k,    S_k+1 = c Wᵀ Tᵀ    (S_k is symmetric: Tᵀ = S_k W),

then the unit diagonal and NetworkX's stopping rule, all on the device; only the gap of each iteration (a
scalar) comes back, and S once at the end.

Example (1,000 nodes, 10,000 edges, a device 300 times the host's bandwidth):
    >>> dense_pays(10_000, 1_000, 10_000, 300.0), dense_pays(10_000, 1_000, 100_000, 300.0)
    (False, True)
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
DENSE_ARRAYS = 3  # S, T = Wᵀ S (then S_k+1 in its place) and Tᵀ, each n x n


def dense_pays(w_nnz: int, n: int, sparse_products: int, bandwidth_ratio: float) -> bool:
    """Whether a dense iteration (:data:`DENSE_BYTES` per entry of Wᵀ and node, on the device) moves no more
    time's worth of bytes than the sparse one (:data:`SPARSE_BYTES` per scalar product, through the host):
    ``bandwidth_ratio`` is the device's streaming bandwidth over the host's.

    Example (the dense iteration's 160 MB at 300 times the host's rate against 12 B x 50,000 there):
        >>> dense_pays(10_000, 1_000, 40_000, 300.0), dense_pays(10_000, 1_000, 50_000, 300.0)
        (False, True)
    """
    return SPARSE_BYTES * int(sparse_products) * float(bandwidth_ratio) >= DENSE_BYTES * int(w_nnz) * int(n)


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


class DenseSimRank:
    """SimRank's iterations from S (a SciPy matrix) on dense n x n arrays of ``xp`` (NumPy or CuPy), with
    ``product(X, out)`` writing Wᵀ X into ``out`` (X, out: n x n arrays of ``xp``); ``on()`` a context in
    which ``xp``'s work runs (the GPU the arrays live on).

    Example (NumPy, SciPy's product):
        >>> Wt = sp.csr_matrix(np.array([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]))  # 0 -> 1, 0 -> 2
        >>> it = DenseSimRank(sp.identity(3, format="csr"), lambda X, out: np.copyto(out, Wt @ X), np)
        >>> round(it.step(0.9), 3), it.step(0.9), it.result().toarray().round(2).tolist()
        (0.9, 0.0, [[1.0, 0.0, 0.0], [0.0, 1.0, 0.9], [0.0, 0.9, 1.0]])
    """

    def __init__(self, S: sp.spmatrix, product, xp, on=contextlib.nullcontext):
        n = S.shape[0]
        self._xp, self._product, self._on = xp, product, on
        with on():
            self._s = xp.asarray(np.asarray(S.toarray(), dtype=np.float64))
            self._t = xp.empty((n, n), np.float64)
            self._tt = xp.empty((n, n), np.float64)
        self._gap = _gap_kernel(xp)

    def step(self, c: float) -> float:
        """One iteration; the largest of ``|S_k+1 - S_k| - RTOL |S_k+1|`` over the entries (NumPy's allclose
        with atol=tolerance holds where it is at most the tolerance)."""
        with self._on():
            self._product(self._s, self._t)      # T = Wᵀ S
            self._tt[...] = self._t.T            # Tᵀ = S W
            self._product(self._tt, self._t)     # Wᵀ S W, in T's place
            self._t *= c
            self._xp.fill_diagonal(self._t, 1.0)
            gap = float(self._gap(self._t, self._s))
        self._s, self._t = self._t, self._s
        return gap

    def result(self) -> sp.csr_matrix:
        """S as a SciPy CSR matrix (its zeros left out)."""
        with self._on():
            return sp.csr_matrix(host(self._s))


def _gap_kernel(xp):
    """max(|new - old| - RTOL |new|) over the entries: one fused pass on the device (no n x n temporaries),
    a maximum per row there (CuPy gives a reduction a block per output: one output would leave the GPU to a
    single block), the n maxima's on the host."""
    if xp is np:
        return lambda new, old: (np.abs(new - old) - RTOL * np.abs(new)).max()
    rows = xp.ReductionKernel("float64 s1, float64 s0", "float64 gap", f"fabs(s1 - s0) - {RTOL!r} * fabs(s1)",
                              "fmax(a, b)", "gap = a", "-1e300", "simrank_gap")
    return lambda new, old: host(rows(new, old, axis=1)).max()


def device_simrank(Wt: sp.csr_matrix, S: sp.spmatrix) -> DenseSimRank:
    """:class:`DenseSimRank` on this GPU: Wᵀ uploaded once, S on the device, each product cuSPARSE's SpMM
    through CuPy (the SpMM family of :mod:`tuner.spmm` is built for blocks of a few columns, not n of them;
    see :func:`dense_fits_device` first).

    Example (on a GPU machine):
        >>> it = device_simrank(Wt, S)   # doctest: +SKIP
        >>> gap = it.step(0.9)           # doctest: +SKIP
    """
    import cupy
    import cupyx.scipy.sparse as cpsp

    from ..formats import device_reorder
    with device_reorder.on_device():  # the process's GPU (tuner.gpu.select_device), here and in every step
        wt = cpsp.csr_matrix(sp.csr_matrix(Wt, dtype=np.float64))

    def product(X, out):
        out[...] = wt @ X
    return DenseSimRank(S, product, cupy, on=device_reorder.on_device)
