"""PageRank whose iterations stay on the GPUs: each rank owns the ranks of its nodes (the rows of Aᵀ that
:class:`~tuner.distributed.spmv.DistributedSpMV` deals it), and an iteration is

1. the rank cache x / outdeg of the rank's nodes, already in its slice of the gathered buffer (the update of
   the previous iteration writes it, paper 002's once-per-iteration division);
2. NCCL's all-gather of the cache, then the rank's tuned SpMV of its rows of Aᵀ;
3. the update x_new = alpha (pulled + dangling d) + (1 - alpha) p and the next cache, one kernel;
4. the change (L1 or max) and the next dangling sum reduced on each GPU, every rank's pair gathered in one
   collective and reduced again; the host reads the change every ``check_every`` iterations.

With one GPU (:class:`~tuner.distributed.nccl.SoloDevice`) the same loop runs without the exchanges.
Semantics, tolerance rules and errors are :func:`tuner.graph.pagerank`'s.
"""
from __future__ import annotations

import time

import numpy as np
import scipy.sparse as sp

from ..graph.pagerank import TOL_RULES, ConvergenceError, IterationInfo, _node_vector, adjacency
from ..matrix import MatrixError
from .spmv import DistributedSpMV

_UPDATE = None


def _update_kernel():
    """x_new = alpha (pulled + dangling d) + (1 - alpha) p, and the next rank cache x_new / outdeg."""
    global _UPDATE
    if _UPDATE is None:
        import cupy
        _UPDATE = cupy.ElementwiseKernel(
            "T pulled, T d, T p, T inverse, raw float64 sums, float64 alpha", "T x_new, T cache",
            "x_new = (T)(alpha * ((double)pulled + sums[0] * (double)d) + (1.0 - alpha) * (double)p);"
            " cache = x_new * inverse;", "tuner_pagerank_update")
    return _UPDATE


def _warm_up(update, like, alpha) -> None:
    """Compile (NVRTC, on first use in a process) every CuPy kernel the loop runs, on scratch vectors, so that
    the iterations' time is the iterations'."""
    import cupy
    a = cupy.ones(2, like.dtype)
    b, c = cupy.empty_like(a), cupy.empty_like(a)
    update(a, a, a, a, cupy.zeros(2, np.float64), alpha, b, c)
    change = cupy.abs(b - a)
    cupy.sum(change, dtype=np.float64), cupy.max(change), cupy.sum(b * a, dtype=np.float64)
    pairs = cupy.ones(4, np.float64)
    cupy.sum(pairs[0::2]), cupy.max(pairs[1::2])


def pull_product(A, comm, dtype=np.float32, weighted: bool = True, **options) -> DistributedSpMV:
    """The distributed SpMV by Aᵀ that :func:`pagerank_on_devices` pulls ranks with, to reuse across calls
    (the compile is the costly part of a short run).

    Example (on a GPU machine):
        >>> spmv = pull_product(A, comm)                                   # doctest: +SKIP
        >>> x = pagerank_on_devices(A, comm, product=spmv)                 # doctest: +SKIP
    """
    return DistributedSpMV(_weights(A, weighted).T.tocsr().astype(dtype), comm, **options)


def _weights(A, weighted: bool) -> sp.csr_matrix:
    W = adjacency(A)
    if not weighted:
        W = sp.csr_matrix((np.ones(W.nnz), W.indices, W.indptr), shape=W.shape)
    if W.nnz and W.data.min() < 0:
        raise MatrixError("edge weights must be finite and non-negative")
    return W


def pagerank_on_devices(A, comm, alpha: float = 0.85, personalization=None, max_iter: int = 100,
                        tol: float = 1e-6, nstart=None, dangling=None, weighted: bool = True,
                        tol_rule: str = "networkx", dtype=np.float32, check_every: int = 1,
                        return_info: bool = False, product: DistributedSpMV | None = None, **options):
    """PageRank of ``A`` (edge u -> v is ``A[u, v]``) on the GPUs of device communicator ``comm``.

    ``comm``: :class:`~tuner.distributed.nccl.NcclComm` (one MPI rank per GPU; every rank calls this with the
    same A) or :class:`~tuner.distributed.nccl.SoloDevice`. ``dtype``: of the matrix and the vectors (the
    sums are accumulated in float64). ``options`` go to each rank's :func:`tuner.compile`; ``product``
    reuses one made by :func:`pull_product` for the same A, comm and options. Returns the whole
    rank vector (float64, A's order) on every rank, and with ``return_info`` an
    :class:`~tuner.graph.pagerank.IterationInfo` whose ``seconds`` split setup (partition, compile, upload)
    from the iterations. Other arguments: :func:`tuner.graph.pagerank`.

    Example (on a GPU machine):
        >>> from tuner.distributed.nccl import SoloDevice                   # doctest: +SKIP
        >>> x = pagerank_on_devices(A, SoloDevice(), dtype=np.float64)      # doctest: +SKIP
    """
    import cupy
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if tol_rule not in TOL_RULES:
        raise ValueError(f"tol_rule must be one of {TOL_RULES}, got {tol_rule!r}")
    if max_iter < 1 or tol <= 0 or check_every < 1:
        raise ValueError(f"max_iter, tol and check_every must be positive, got {max_iter}, {tol}, {check_every}")
    t0 = time.perf_counter()
    W = _weights(A, weighted)
    n = W.shape[0]
    out_weight = np.asarray(W.sum(axis=1)).ravel()
    dangling_nodes = out_weight == 0
    inverse = np.divide(1.0, out_weight, out=np.zeros(n), where=~dangling_nodes)
    x0 = np.full(n, 1.0 / n) if nstart is None else _node_vector(nstart, n, "nstart")
    p = np.full(n, 1.0 / n) if personalization is None else _node_vector(personalization, n, "personalization")
    d = p if dangling is None else _node_vector(dangling, n, "dangling")

    spmv = product or DistributedSpMV(W.T.tocsr().astype(dtype), comm, **options)
    if spmv.partition.owner.size != n or spmv.comm is not comm:
        raise ValueError(f"product multiplies {spmv.partition.owner.size} nodes on another communicator: "
                         "make it with pull_product(A, comm) for this graph")
    dtype = np.dtype(getattr(spmv.local, "dtype", dtype))
    rows = spmv.rows
    mine = lambda v: cupy.asarray(np.ascontiguousarray(v[rows], dtype=dtype))  # noqa: E731
    x, p_l, d_l, inv_l = mine(x0), mine(p), mine(d), mine(inverse)
    dangling_l = cupy.asarray(dangling_nodes[rows].astype(dtype))
    x_new, pulled = cupy.empty_like(x), cupy.empty_like(x)
    cache = spmv.padded(x * inv_l)[:rows.size]  # this rank's slice of the buffer NCCL gathers into
    # Every rank's [dangling sum, change], gathered in one collective a step and reduced on each GPU: one
    # exchange instead of a sum and a max.
    parts = cupy.zeros(2 * comm.size, np.float64)
    mine = parts[2 * comm.rank:2 * comm.rank + 2]
    sums = cupy.zeros(2, np.float64)  # [dangling sum, change] of the whole graph
    mine[0] = cupy.sum(x * dangling_l, dtype=np.float64)
    comm.allgather_into(mine, parts)
    sums[0] = cupy.sum(parts[0::2])
    update = _update_kernel()
    _warm_up(update, p_l, alpha)
    limit = n * tol if tol_rule == "networkx" else tol
    cupy.cuda.Device().synchronize()
    t1 = time.perf_counter()

    error, iteration = float("inf"), 0
    for iteration in range(1, max_iter + 1):
        spmv.local(spmv.gather_x(cache), out=pulled)
        update(pulled, d_l, p_l, inv_l, sums, alpha, x_new, cache)
        change = cupy.abs(x_new - x)
        mine[0] = cupy.sum(x_new * dangling_l, dtype=np.float64)
        mine[1] = (cupy.sum(change, dtype=np.float64) if tol_rule == "networkx" else
                   cupy.max(change) if change.size else 0)
        comm.allgather_into(mine, parts)
        sums[0] = cupy.sum(parts[0::2])
        sums[1] = cupy.sum(parts[1::2]) if tol_rule == "networkx" else cupy.max(parts[1::2])
        x, x_new = x_new, x
        if iteration % check_every == 0 or iteration == max_iter:
            error = float(sums[1].get())
            if error < limit:
                break
    else:
        raise ConvergenceError(f"PageRank did not converge in {max_iter} iterations (last change {error:.3g}, "
                               f"rule {tol_rule!r}, tol {tol})")
    cupy.cuda.Device().synchronize()
    t2 = time.perf_counter()
    ranks = spmv.gather(x).astype(np.float64)
    info = IterationInfo(iteration, error, {"setup": t1 - t0, "iterations": t2 - t1,
                                            "gather": time.perf_counter() - t2}, f"tuned SpMV on {comm.size} GPU(s)")
    return (ranks, info) if return_info else ranks
