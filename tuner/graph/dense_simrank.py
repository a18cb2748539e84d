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
columns (cuSPARSE's SpMM) and a transpose between them:

    T = Wᵀ S_k,    S_k+1 = c Wᵀ Tᵀ    (Tᵀ = S_k W),

then the unit diagonal and NetworkX's stopping rule, all on the device; only each iteration's gap (n row
maxima) comes back, and S once at the end. The dense arrays are row-major: each entry of Wᵀ then reads a row
of the dense operand, n contiguous values, where a column-major operand's row is n values a column apart,
a sector each; the transpose copied between the products costs one pass over S. On a small graph the host's
calls take as long as the device's work, so there the next iteration is queued before the host waits for the
last one's gap (:func:`lookahead_pays`).

Example (1,000 nodes, 10,000 edges, a device 300 times the host's bandwidth; products compiled, then not):
    >>> dense_pays(10_000, 1_000, 10_000, 300.0), dense_pays(10_000, 1_000, 100_000, 300.0)
    (False, True)
    >>> dense_pays(10_000, 1_000, 10_000, 300.0, compile_s=2 * COMPILE_FLOOR_S)
    True
"""
from __future__ import annotations

import contextlib
import functools

import numpy as np
import scipy.sparse as sp


RTOL = 1e-5  # numpy.allclose's, which NetworkX's stopping rule uses with atol=tolerance
SPARSE_BYTES = 12  # host bytes per scalar product of the sparse iteration: its result's value and index
DENSE_BYTES = 16  # device bytes per entry of Wᵀ and node of the dense iteration: two products, 8 B of S each
TRANSPOSE_BYTES = 16  # device bytes per entry of S of the transpose between them: 8 B read, 8 B written
# The sparse iteration's host passes (SciPy's products and element-wise operations) run on one core.
HOST_GBS = 10.0
# The least a compile of the tuned SpGEMM for a structure it has not seen takes where its binaries are cached
# (digest, plan, layout, module load; measured on tiny products): what a sparse iteration pays per product
# before a process has timed one of its own (:class:`tuner.graph.simrank.ReusedProducts` times each).
COMPILE_FLOOR_S = 0.02
DENSE_ARRAYS = 3  # S_k, T = Wᵀ S_k (then S_k+1 over it) and Tᵀ, each n x n


def dense_iteration_bytes(w_nnz: int, n: int) -> int:
    """Device bytes a dense iteration moves: :data:`DENSE_BYTES` per entry of Wᵀ and node (its two products)
    and :data:`TRANSPOSE_BYTES` per entry of S (the transpose between them).

    Example:
        >>> dense_iteration_bytes(10_000, 1_000)   # 160 MB of products, 16 MB of transpose
        176000000
    """
    return DENSE_BYTES * int(w_nnz) * int(n) + TRANSPOSE_BYTES * int(n) * int(n)


def dense_pays(w_nnz: int, n: int, sparse_products: int, bandwidth_ratio: float, compile_s: float = 0.0) -> bool:
    """Whether a dense iteration (:func:`dense_iteration_bytes` on the device) takes no longer than the sparse
    one: ``compile_s`` seconds compiling its products for new structures, then :data:`SPARSE_BYTES` per scalar
    product through the host at :data:`HOST_GBS`. ``bandwidth_ratio``: the device's streaming bandwidth over
    the host's (0: no GPU, never dense).

    Example (the dense iteration's 176 MB at 300 times the host's rate against 12 B x 50,000 there):
        >>> dense_pays(10_000, 1_000, 48_000, 300.0), dense_pays(10_000, 1_000, 49_000, 300.0)
        (False, True)
    """
    if not bandwidth_ratio > 0:
        return False
    host_bytes_per_s = HOST_GBS * 1e9
    sparse_s = SPARSE_BYTES * int(sparse_products) / host_bytes_per_s + float(compile_s)
    return sparse_s * float(bandwidth_ratio) * host_bytes_per_s >= dense_iteration_bytes(w_nnz, n)


# The host's dense iteration against its sparse one (SciPy and NumPy on one core; a 2-core x86 host, rmat:10,
# rmat:12, bcsstk16 and wiki-Vote after three sparse iterations): the sparse iteration (two products, the
# result's assembly, SciPy's element-wise passes) took 3.6-8.1 ns per scalar product of its first product; a
# product of Wᵀ by n dense columns 0.19-0.51 ns per multiply-add; the dense iteration's passes over n x n
# arrays (the product's result scaled into place, T's transpose, the diagonal and the gap) 7-28 ns per entry
# in all. The middle values below pick the faster iteration on all four.
HOST_SPARSE_NS = 6.0
HOST_MADD_NS = 0.4
HOST_ENTRY_NS = 12.0
HOST_DENSE_BYTES = 52  # per entry of S: five n x n float64 arrays at the peak and S's CSR (12 B) at the end


def host_dense_pays(w_nnz: int, n: int, sparse_products: int) -> bool:
    """Whether the host's next SimRank iteration takes less time on a dense S (:class:`DenseSimRank` with
    :func:`host_product`): ``sparse_products`` (the first product's scalar products) at
    :data:`HOST_SPARSE_NS`, against two products of ``w_nnz`` entries by n columns at :data:`HOST_MADD_NS` a
    multiply-add and n x n entries at :data:`HOST_ENTRY_NS`. The caller checks that
    :data:`HOST_DENSE_BYTES` per entry fit host memory.

    Example (4,096 nodes, 53,486 edges: sparse products of a third and a twentieth of a full S's):
        >>> host_dense_pays(53_486, 4_096, 73_000_000), host_dense_pays(53_486, 4_096, 11_000_000)
        (True, False)
    """
    dense_ns = 2 * HOST_MADD_NS * int(w_nnz) * int(n) + HOST_ENTRY_NS * int(n) * int(n)
    return HOST_SPARSE_NS * int(sparse_products) >= dense_ns


def bandwidth_ratio() -> float:
    """This GPU's streaming bandwidth (:func:`device_bandwidth_gbs`) over :data:`HOST_GBS`; 0 without a GPU
    or a profile (no dense iterations).

    Example (on a GPU machine):
        >>> bandwidth_ratio() > 100   # doctest: +SKIP
        True
    """
    return device_bandwidth_gbs() / HOST_GBS


def device_bandwidth_gbs() -> float:
    """This GPU's streaming bandwidth in GB/s, its profile's copy bandwidth; 0 without a GPU or a profile.

    Example (on a GPU machine):
        >>> device_bandwidth_gbs() > 1000   # doctest: +SKIP
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
    return float(profile.constants["copy_bandwidth_gbs"])


# The host's time to queue one dense iteration (two SpMMs through cusparse_products.CachedSpmm, the transpose
# between them, the finish launch and its copy): about 0.15 ms on an H200's host.
HOST_QUEUE_S = 1.5e-4
LOOKAHEAD_ITERATIONS = 4  # the iterations a queued-ahead one must take at most, in host time (lookahead_pays)


def lookahead_pays(w_nnz: int, n: int, device_gbs: float) -> bool:
    """Whether :class:`DenseSimRank` queues each iteration ahead: where the device's share of one
    (:func:`dense_iteration_bytes` at ``device_gbs``) takes less than the host's queueing of
    :data:`LOOKAHEAD_ITERATIONS`. Queued ahead, an iteration gains the shorter of the two shares, and a run
    that stops computes one iteration it does not use; where the device's share is the longer one, the gain
    (the host's share an iteration) takes more iterations to repay that one than SimRank's few.

    Example (4,250 GB/s):
        >>> lookahead_pays(12_210, 1_024, 4250.0), lookahead_pays(53_486, 4_096, 4250.0)
        (True, False)
    """
    if not device_gbs > 0:
        return False
    return dense_iteration_bytes(w_nnz, n) / (device_gbs * 1e9) < LOOKAHEAD_ITERATIONS * HOST_QUEUE_S


def dense_bytes(n: int, itemsize: int = 8) -> int:
    """Device bytes of the dense state of an n-node SimRank (:data:`DENSE_ARRAYS` n x n arrays).

    Example:
        >>> dense_bytes(1000)
        24000000
    """
    return DENSE_ARRAYS * int(n) * int(n) * int(itemsize)


def dense_fits_device(n: int) -> bool:
    """Whether :func:`dense_bytes` of ``n`` nodes fit the GPU's free memory with two n x n blocks to spare
    (S made sparse on the device at the end, up to 12 B an entry, and a margin for cuSPARSE's work space);
    False without a GPU.

    Example (on a GPU machine):
        >>> dense_fits_device(10_000), dense_fits_device(1_000_000)   # doctest: +SKIP
        (True, False)
    """
    from .. import gpu
    if not gpu.available():
        return False
    return dense_bytes(n) + 2 * n * n * 8 <= gpu.free_memory(release_pool=True)


def host_product(Wt: sp.csr_matrix):
    """``product(X, out, alpha)`` of :class:`DenseSimRank` on the host: ``out = alpha Wᵀ X`` with SciPy.

    Example:
        >>> out = np.empty((2, 2))
        >>> host_product(sp.csr_matrix(np.array([[0.0, 1.0], [0.0, 0.0]])))(np.eye(2), out, 2.0)
        >>> out.tolist()
        [[0.0, 2.0], [0.0, 0.0]]
    """
    def product(X, out, alpha=1.0):
        np.multiply(Wt @ X, alpha, out=out)
    return product


class DenseSimRank:
    """SimRank's iterations from S (a SciPy matrix) on dense n x n arrays of ``xp`` (NumPy or CuPy) in
    row-major order, with ``product(X, out, alpha=1.0)`` writing alpha Wᵀ X into ``out`` (both row-major, the
    order in which cuSPARSE's SpMM reads a row of X for each entry of Wᵀ contiguously) and ``xp.copyto``
    making T's transpose between the two products; ``finish(new, old)`` setting new's unit diagonal and
    returning a function that gives the gap of NumPy's allclose between them (waiting for it where the device
    computes it; default: :func:`host_finish`'s value); ``on()`` a context in which ``xp``'s work runs (the GPU
    the arrays live on); ``dense(S)`` and ``sparse(X)`` S as such an array and back as a SciPy CSR matrix
    (default: on the host).

    With ``lookahead`` (:func:`lookahead_pays`), each :meth:`step` queues the iteration after the one it
    returns before it waits for that one's gap, so the device computes while the host waits and queues,
    instead of after it (a graph of a few thousand nodes takes about as long to queue an iteration as to
    compute it). The iteration queued ahead writes T's array and the transpose's, never S's, so the one
    returned stays for :meth:`result`; a run that stops computes one iteration it does not use.

    Example (NumPy, SciPy's product):
        >>> Wt = sp.csr_matrix(np.array([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]))  # 0 -> 1, 0 -> 2
        >>> it = DenseSimRank(sp.identity(3, format="csr"), host_product(Wt), np)
        >>> round(it.step(0.9), 3), it.step(0.9), it.result().toarray().round(2).tolist()
        (0.9, 0.0, [[1.0, 0.0, 0.0], [0.0, 1.0, 0.9], [0.0, 0.9, 1.0]])
    """

    def __init__(self, S: sp.spmatrix, product, xp, on=contextlib.nullcontext, dense=None, sparse=None,
                 finish=None, lookahead: bool = True):
        n = S.shape[0]
        self._lookahead = lookahead
        self._product, self._on = product, on
        self._sparse = sparse or sp.csr_matrix
        self._finish = finish or (lambda new, old: (lambda gap=host_finish(new, old): gap))
        self._xp = xp
        with on():
            self._s = (dense or (lambda M: np.ascontiguousarray(M.toarray(), dtype=np.float64)))(S)
            self._t = xp.empty((n, n), np.float64)
            self._transposed = xp.empty((n, n), np.float64)
        self._result = self._s
        self._ahead = None  # the gap's function of the iteration queued ahead of the next step
        self._c = None

    def step(self, c: float) -> float:
        """One iteration with importance factor ``c`` (the same at every call); the largest of
        ``|S_k+1 - S_k| - RTOL |S_k+1|`` over the entries (NumPy's allclose with atol=tolerance holds where it
        is at most the tolerance)."""
        if self._c is None:
            self._c = c
        elif c != self._c:
            raise ValueError(f"DenseSimRank iterates one importance factor: {self._c}, then {c}")
        with self._on():
            gap = self._ahead or self._queue(c)
            self._result = self._s
            self._ahead = self._queue(c) if self._lookahead else None
            return float(gap())

    def _queue(self, c: float):
        """Queue the iteration from the latest S, which it only reads (its result goes over T, whose buffer
        then becomes S's); the iteration's gap's function."""
        self._product(self._s, self._t)                        # T = Wᵀ S
        self._xp.copyto(self._transposed, self._t.T)            # Tᵀ = S W, row-major
        self._product(self._transposed, self._t, alpha=c)       # c Wᵀ Tᵀ = c Wᵀ S W, over T
        gap = self._finish(self._t, self._s)
        self._s, self._t = self._t, self._s
        return gap

    def result(self) -> sp.csr_matrix:
        """S of the latest step as a SciPy CSR matrix (its zeros left out)."""
        with self._on():
            return self._sparse(self._result)


def host_finish(new: np.ndarray, old: np.ndarray) -> float:
    """``new``'s diagonal set to 1, then max(|new - old| - RTOL |new|) over the entries (NumPy arrays).

    Example:
        >>> new = np.array([[0.5, 0.2], [0.2, 0.5]])
        >>> round(host_finish(new, np.eye(2)), 6), new.diagonal().tolist()
        (0.199998, [1.0, 1.0])
    """
    np.fill_diagonal(new, 1.0)
    return float((np.abs(new - old) - RTOL * np.abs(new)).max())


# new's unit diagonal and each row's largest |new - old| - RTOL |new|, a block per row (the arrays are
# row-major: a row is contiguous), in one launch: fill_diagonal and a reduction are two launches and
# their host calls, which on a graph of a few thousand nodes take longer than the iteration's products.
FINISH_BLOCK = 256
FINISH_SOURCE = r"""
#define BLOCK FINISH_BLOCK
extern "C" __global__ void __launch_bounds__(BLOCK)
simrank_finish(double* next, const double* old, double* gaps, long long n) {
    const long long j = blockIdx.x;
    double* row = next + j * n;
    const double* was = old + j * n;
    double gap = -1e300;
    for (long long i = threadIdx.x; i < n; i += BLOCK) {
        double s1 = row[i];
        if (i == j) { s1 = 1.0; row[i] = 1.0; }
        gap = fmax(gap, fabs(s1 - was[i]) - RTOL * fabs(s1));
    }
    __shared__ double partial[BLOCK / 32];
    for (int o = 16; o > 0; o >>= 1) gap = fmax(gap, __shfl_down_sync(0xffffffffu, gap, o));
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = gap;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < BLOCK / 32; ++w) gap = fmax(gap, partial[w]);
        gaps[j] = gap;
    }
}
""".replace("FINISH_BLOCK", str(FINISH_BLOCK)).replace("RTOL", repr(RTOL))


def device_finish(cupy, n: int):
    """``finish(new, old)`` of :class:`DenseSimRank` on n x n CuPy arrays: :data:`FINISH_SOURCE`'s one launch
    and a copy of the n row maxima into page-locked memory, queued; the function it returns waits for the
    copy and gives their largest. Two such buffers alternate, so an iteration queued ahead does not write
    the maxima the host is about to read.

    Example (on a GPU machine):
        >>> finish = device_finish(cupy, 1000)   # doctest: +SKIP
        >>> gap = finish(new, old)()             # doctest: +SKIP
    """
    kernel = _finish_kernel(cupy, cupy.cuda.Device().id)
    gaps = [cupy.empty(n, np.float64) for _ in range(2)]
    maxima = [np.frombuffer(cupy.cuda.alloc_pinned_memory(8 * n), np.float64, n) for _ in range(2)]
    turn = [0]

    def finish(new, old):
        k = turn[0]
        turn[0] ^= 1
        stream = cupy.cuda.get_current_stream()
        kernel((n,), (FINISH_BLOCK,), (new, old, gaps[k], np.int64(n)))
        cupy.cuda.runtime.memcpyAsync(maxima[k].ctypes.data, gaps[k].data.ptr, 8 * n,
                                      cupy.cuda.runtime.memcpyDeviceToHost, stream.ptr)
        copied = stream.record()

        def gap():
            copied.synchronize()
            return float(maxima[k].max())
        return gap
    return finish


@functools.cache
def _finish_kernel(cupy, device: int):
    """The finish kernel loaded on ``device``, once per process (a RawKernel made anew looks its binary up
    in CuPy's cache on disk at its first launch)."""
    return cupy.RawKernel(FINISH_SOURCE, "simrank_finish")


def device_simrank(Wt: sp.csr_matrix, S: sp.spmatrix) -> DenseSimRank:
    """:class:`DenseSimRank` on this GPU: Wᵀ uploaded once, S uploaded sparse and made dense there, each
    product cuSPARSE's SpMM on row-major arrays (:class:`CachedSpmm`, the factor c in its call; the SpMM
    family of :mod:`tuner.spmm` is built for blocks of a few columns, not n of them; see
    :func:`dense_fits_device` first), the diagonal and the gap in one launch (:func:`device_finish`), the
    result made sparse there (cuSPARSE's dense-to-sparse) and copied back as CSR.

    Example (on a GPU machine):
        >>> it = device_simrank(Wt, S)   # doctest: +SKIP
        >>> gap = it.step(0.9)           # doctest: +SKIP
    """
    import cupy
    import cupyx.cusparse
    import cupyx.scipy.sparse as cpsp

    from ..formats import device_reorder
    from .cusparse_products import CachedSpmm
    with device_reorder.on_device():  # the process's GPU (tuner.gpu.select_device), here and in every step
        wt = cpsp.csr_matrix(sp.csr_matrix(Wt, dtype=np.float64))
        wt.sum_duplicates()  # canonical, as cuSPARSE's SpMM wants it (a no-op for Wt made by SciPy)
        product, finish = CachedSpmm(wt), device_finish(cupy, Wt.shape[0])
    lookahead = lookahead_pays(Wt.nnz, Wt.shape[0], device_bandwidth_gbs())

    # cuSPARSE's conversions take column-major arrays: a row-major M is the column-major array of Mᵀ.
    def dense(M):
        out = cupy.zeros(M.shape, np.float64, order="F")
        transposed = cpsp.csr_matrix(sp.csr_matrix(M.T, dtype=np.float64))
        return cupyx.cusparse.sparseToDense(transposed, out=out).T

    def sparse(X):
        return cupyx.cusparse.denseToSparse(X.T, format="csc").get().T.tocsr()  # Xᵀ's CSC: X's CSR
    return DenseSimRank(S, product, cupy, on=device_reorder.on_device, dense=dense, sparse=sparse, finish=finish,
                        lookahead=lookahead)
