"""PageRank with NetworkX's semantics on a SciPy adjacency matrix (edge u -> v is A[u, v]).

Each iteration is paper 002's pull formulation: x_new = alpha (Aᵀ (x / outdeg) + (sum of x over dangling
nodes) d) + (1 - alpha) p, with the rank cache x / outdeg computed once per iteration and Aᵀ multiplied by the
tuner's SpMV. ``backend='device'`` (the default where CuPy reaches a GPU): the iterations stay on the GPU (on
one GPU, untuned, all of them in one kernel launch: :mod:`tuner.graph.resident`), or on the GPUs of a
communicator (``comm``, see :mod:`tuner.distributed.pagerank`); ``'tuned'`` (the default
with PyCUDA alone): the host drives the loop, each iteration copying x to the GPU and the product back;
``'scipy'``: the same iteration with SciPy on the host.

Stopping: NetworkX stops when the L1 change is below N x tol. Since x sums to 1 the L1 change is at most 2, so
for N >= 2 / tol (two million nodes at the default tol) that rule holds after the first iteration, whatever
the ranks. ``tol_rule='per_node'`` stops instead when no node's rank changes by ``tol`` or more.
"""
from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from ..formats.transpose import transpose
from ..matrix import MatrixError, all_finite, check_value_dtype, extrema, row_blocks

TOL_RULES = ("networkx", "per_node")


class ConvergenceError(RuntimeError):
    """The power iteration did not meet its tolerance within ``max_iter`` iterations (NetworkX raises
    ``PowerIterationFailedConvergence`` there)."""


@dataclass(frozen=True)
class IterationInfo:
    """How an iterative algorithm ended.

    Attributes:
        iterations: iterations run.
        error: the last iteration's change, as the stopping rule measures it.
        seconds: wall seconds: setup (compiling the product) and iterations.
        backend: what multiplied.
    """

    iterations: int
    error: float
    seconds: dict
    backend: str


def _node_vector(values, n: int, what: str) -> np.ndarray:
    """A length-n float64 vector from an array or a {node: value} dict, normalised to sum 1."""
    if isinstance(values, dict):
        v = np.zeros(n)
        for node, value in values.items():
            if not (0 <= int(node) < n):
                raise ValueError(f"{what} names node {node}, but the graph has nodes 0..{n - 1}")
            v[int(node)] = value
    else:
        v = np.asarray(values, dtype=np.float64).ravel()
        check_node_size(what, v.size, n)
    total = v.sum()
    check_node_values(what, not np.all(np.isfinite(v)) or bool(np.any(v < 0)), total)
    return v / total


def check_node_size(what: str, size: int, n: int) -> None:
    """Refuse a node vector of ``size`` entries for a graph of ``n`` nodes.

    Example:
        >>> check_node_size("nstart", 3, 3)
    """
    if size != n:
        raise ValueError(f"{what} has {size} entries, the graph {n} nodes")


def check_node_values(what: str, bad: bool, total: float) -> None:
    """Refuse a node vector with a negative or non-finite entry (``bad``) or one summing (``total``) to zero,
    wherever its entries were checked (the host, or the device: :func:`tuner.graph.resident.node_vector`).

    Example:
        >>> check_node_values("personalization", False, 0.0)
        Traceback (most recent call last):
        ValueError: personalization sums to zero: it must give some node a positive weight
    """
    if bad:
        raise ValueError(f"{what} must be finite and non-negative")
    if total == 0:
        raise ValueError(f"{what} sums to zero: it must give some node a positive weight")


def adjacency(A, keep_float: bool = False) -> sp.csr_matrix:
    """``A`` as a float64 CSR adjacency matrix, after the checks every algorithm needs: square, with nodes,
    finite weights. ``keep_float``: float32 values stay float32 (for products cast to float32 on the GPU
    anyway: no float64 copy of every weight on the host).

    Example:
        >>> adjacency(np.eye(2)).dtype, adjacency(np.eye(2, dtype=np.float32), keep_float=True).dtype
        (dtype('float64'), dtype('float32'))
    """
    # The caller's CSR itself where it is one: SciPy remembers on it what its scan for sorted, distinct
    # indices found, so several algorithms on one graph scan it once.
    A = A if sp.issparse(A) and A.format == "csr" else sp.csr_matrix(A)
    if A.shape[0] != A.shape[1]:
        raise MatrixError(f"an adjacency matrix is square, got {A.shape}")
    if A.shape[0] == 0:
        raise MatrixError("the graph has no nodes")
    # float64 values over A's own index arrays where nothing will sort them in place (canonical: sorted, no
    # duplicates); astype would copy them either way. Checked on several threads.
    shared = A.has_canonical_format
    kept = keep_float and A.dtype in (np.float32, np.float64)
    # Kept values are A's own array too: the algorithms read weights, never write them.
    W = sp.csr_matrix((A.data if kept else A.data.astype(np.float64), A.indices if shared else A.indices.copy(),
                       A.indptr if shared else A.indptr.copy()), shape=A.shape)
    if shared:  # known: spares every later user SciPy's scan of the indices
        W.has_canonical_format = True
    if W.nnz and not all_finite(W.data):
        raise MatrixError("edge weights must be finite")
    return W


BACKENDS = ("tuned", "device", "scipy")


def edge_weights(A, weighted: bool = True, keep_float: bool = False) -> sp.csr_matrix:
    """:func:`adjacency` (``keep_float`` as there), every edge weighing 1 unless ``weighted``; negative
    weights refused.

    Example:
        >>> edge_weights(np.array([[0, 2.0], [3.0, 0]]), weighted=False).data.tolist()
        [1.0, 1.0]
    """
    W = adjacency(A, keep_float)
    if not weighted:
        canonical = W.has_canonical_format
        W = sp.csr_matrix((np.ones(W.nnz, W.dtype), W.indices, W.indptr), shape=W.shape)
        W.has_canonical_format = canonical
    if W.nnz and extrema(W.data)[0] < 0:
        raise MatrixError("edge weights must be finite and non-negative")
    return W


ROW_SUM_PIECE = 1 << 22  # entries a thread sums at least: below, one thread is quicker than starting more


def row_sums(W: sp.csr_matrix) -> np.ndarray:
    """Each row's sum as SciPy's ``W.sum(axis=1)`` gives it (NumPy's reduceat over the rows' entries), over
    pieces of rows on several threads (reduceat releases the GIL; one core takes a second for 100M entries).

    Example:
        >>> row_sums(sp.csr_matrix(np.array([[1.0, 2.0], [0, 0], [0, 4.0]]))).tolist()
        [3.0, 0.0, 4.0]
    """
    n, indptr, data = W.shape[0], W.indptr.astype(np.int64, copy=False), W.data
    out = np.zeros(n, dtype=np.result_type(data.dtype, np.float64))
    blocks = row_blocks(indptr, min(os.cpu_count() or 1, 16, max(1, W.nnz // ROW_SUM_PIECE)))

    def piece(lo: int, hi: int) -> None:
        starts, ends = indptr[lo:hi], indptr[lo + 1:hi + 1]
        full = np.flatnonzero(ends > starts)  # reduceat sums from each start to the next: empty rows skipped
        if full.size:
            out[lo + full] = np.add.reduceat(data[indptr[lo]:indptr[hi]], starts[full] - indptr[lo],
                                             dtype=out.dtype)  # float32 weights summed in float64
    if len(blocks) <= 1:  # a small graph: starting a thread costs more than its sums
        for lo, hi in blocks:
            piece(lo, hi)
        return out
    with ThreadPoolExecutor(max_workers=len(blocks)) as pool:
        list(pool.map(lambda b: piece(*b), blocks))
    return out


def rank_cache_factors(W: sp.csr_matrix) -> tuple[np.ndarray, np.ndarray]:
    """The dangling nodes (no out-weight) and each node's 1 / out-weight (0 where dangling): x times the
    latter is paper 002's rank cache.

    Example:
        >>> d, inv = rank_cache_factors(sp.csr_matrix(np.array([[0, 2.0], [0, 0]])))
        >>> d.tolist(), inv.tolist()
        ([False, True], [0.5, 0.0])
    """
    out_weight = row_sums(W)
    dangling = out_weight == 0
    return dangling, np.divide(1.0, out_weight, out=np.zeros(W.shape[0]), where=~dangling)


def _multiply(At: sp.csr_matrix, backend: str, dtype, device_memory_limit=None, tune: str = "model"):
    if backend == "scipy":
        return lambda v: At @ v
    if backend == "tuned":
        from ..operations import compile as compile_product
        return compile_product(At, dtype=dtype, device_memory_limit=device_memory_limit, tune=tune)
    raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")


def default_backend(backend: str | None, backends: tuple = BACKENDS, fallback: str = "tuned") -> str:
    """``backend`` (one of ``backends``), or where None the fastest this machine has: 'device' (iterations on
    the GPU) where CuPy reaches one, else ``fallback`` (PageRank's: 'tuned', the host driving the loop; PyCUDA
    alone).

    Example:
        >>> default_backend("scipy"), default_backend("scipy", ("device", "scipy"), "scipy")
        ('scipy', 'scipy')
    """
    if backend is not None:
        if backend not in backends:
            raise ValueError(f"backend must be one of {backends}, got {backend!r}")
        return backend
    from ..formats import device_reorder
    return "device" if device_reorder.available() else fallback


def pagerank(A, alpha: float = 0.85, personalization=None, max_iter: int = 100, tol: float = 1e-6,
             nstart=None, dangling=None, weighted: bool = True, tol_rule: str = "networkx",
             backend: str | None = None, dtype=np.float64, return_info: bool = False, comm=None,
             device_memory_limit=None, tune: str = "none"):
    """PageRank of the graph whose edge u -> v is ``A[u, v]``, as ``networkx.pagerank`` defines it.

    ``personalization``, ``nstart`` and ``dangling``: arrays of one value per node or {node: value} dicts
    (normalised; nodes missing from a dict get 0). ``weighted``: edge weights are A's values (False: every
    edge weighs 1). ``tol_rule``: 'networkx' (L1 change < N x tol) or 'per_node' (every node's change < tol).
    ``backend``: 'tuned', 'device' or 'scipy' (module docstring; default 'device' where CuPy reaches a GPU,
    else 'tuned'); ``comm``: with 'device', the GPUs to split the graph over (a :mod:`tuner.distributed`
    device communicator; default this GPU alone). ``tune``: how the product by Aᵀ is compiled
    (:func:`tuner.compile`'s modes). The default, 'none', runs every iteration of one GPU in one launch of the
    resident kernel (:mod:`tuner.graph.resident`: no layout, ready in milliseconds; the host-driven loop on the
    generic kernel where the graph does not fit or needs several GPUs): a tuned kernel waited for takes
    seconds of planning and layout on a large graph (``tune_s`` in bench-spmv.json), longer than an untuned
    PageRank of it takes in all; 'model' tunes it (for long runs; to reuse one tuned product across calls
    see :func:`tuner.distributed.pagerank.pull_product`).
    On several GPUs the ranks multiply in the tiles of the model's one-GPU plan where it plans tile_composite,
    whatever ``tune`` says (:class:`~tuner.distributed.spmv.DistributedSpMV`).
    ``device_memory_limit``: with 'tuned' or 'device', the device memory each GPU's product may hold (bytes or a figure
    such as '2G'; default what is free): a graph over it is streamed from host memory every iteration
    (:mod:`tuner.streaming`), the rank vectors staying on the GPU.
    Returns the ranks (float64, summing to 1), and with ``return_info`` an :class:`IterationInfo` too.
    Raises :class:`ConvergenceError` after ``max_iter`` iterations without meeting ``tol``.

    Example:
        >>> A = sp.csr_matrix(np.array([[0, 1, 1], [1, 0, 0], [0, 1, 0]], dtype=float))
        >>> pagerank(A, backend="scipy").round(4).tolist()
        [0.3878, 0.3974, 0.2148]
    """
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if tol_rule not in TOL_RULES:
        raise ValueError(f"tol_rule must be one of {TOL_RULES}, got {tol_rule!r}")
    check_value_dtype(dtype)
    if max_iter < 1 or tol <= 0:
        raise ValueError(f"max_iter must be positive and tol positive, got {max_iter} and {tol}")
    from ..compiler import check_tune
    backend, tune = default_backend(backend if comm is None else "device"), check_tune(tune)
    if backend == "device":
        from ..distributed.nccl import SoloDevice
        from ..distributed.pagerank import pagerank_on_devices
        return pagerank_on_devices(A, comm if comm is not None else SoloDevice(), alpha=alpha,
                                   personalization=personalization, max_iter=max_iter, tol=tol, nstart=nstart,
                                   dangling=dangling, weighted=weighted, tol_rule=tol_rule, dtype=dtype,
                                   return_info=return_info, device_memory_limit=device_memory_limit, tune=tune)
    W = edge_weights(A, weighted)
    n = W.shape[0]
    t0 = time.perf_counter()
    dangling_nodes, inverse = rank_cache_factors(W)
    multiply = _multiply(W.T.tocsr() if backend == "scipy" else transpose(W), backend, dtype, device_memory_limit,
                         tune)
    x = np.full(n, 1.0 / n) if nstart is None else _node_vector(nstart, n, "nstart")
    p = np.full(n, 1.0 / n) if personalization is None else _node_vector(personalization, n, "personalization")
    d = p if dangling is None else _node_vector(dangling, n, "dangling")
    t1 = time.perf_counter()
    for iteration in range(1, max_iter + 1):
        last = x
        pulled = np.asarray(multiply(x * inverse), dtype=np.float64)  # the rank cache, then Aᵀ pulls it
        x = alpha * (pulled + x[dangling_nodes].sum() * d) + (1 - alpha) * p
        change = np.abs(x - last)
        error = float(change.sum() if tol_rule == "networkx" else change.max())
        if error < (n * tol if tol_rule == "networkx" else tol):
            info = IterationInfo(iteration, error, {"setup": t1 - t0, "iterations": time.perf_counter() - t1},
                                 backend)
            return (x, info) if return_info else x
    raise ConvergenceError(f"PageRank did not converge in {max_iter} iterations (last change {error:.3g}, "
                           f"rule {tol_rule!r}, tol {tol})")
