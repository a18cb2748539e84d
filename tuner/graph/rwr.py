"""Random walk with restart: the walker follows an out-edge (by weight) and, with probability ``restart``,
jumps back to its seeds. Its stationary distribution is PageRank personalised on the seeds with
alpha = 1 - restart (dangling nodes send the walker back to the seeds too), which is how it is computed.

Several seed sets on the GPU walk together: their visiting probabilities are the columns of one block, and
each iteration reads the graph once for all of them through the multi-vector product (:mod:`tuner.spmm`).
"""
from __future__ import annotations

import time

import numpy as np

from .pagerank import (TOL_RULES, ConvergenceError, IterationInfo, _node_vector, default_backend, edge_weights,
                       pagerank, rank_cache_factors)


def _is_many(seeds) -> bool:
    return isinstance(seeds, (list, tuple)) and len(seeds) > 0 and all(
        isinstance(s, (list, tuple, dict, np.ndarray)) for s in seeds)


def seed_vector(seeds, n: int):
    """The restart distribution of a seed set (node numbers, a node twice weighing twice; or a {node: weight}
    dict, returned as it is), unnormalised, checked against the graph's ``n`` nodes.

    Example:
        >>> seed_vector([0, 2, 2], 4).tolist()
        [1.0, 0.0, 2.0, 0.0]
    """
    if isinstance(seeds, dict):
        return seeds
    nodes = np.atleast_1d(np.asarray(seeds, dtype=np.int64))
    if nodes.size == 0:
        raise ValueError("a seed set names no node")
    if nodes.min() < 0 or nodes.max() >= n:
        raise ValueError(f"seeds name node {int(nodes.max() if nodes.max() >= n else nodes.min())}, but the graph "
                         f"has nodes 0..{n - 1}")
    return np.bincount(nodes, minlength=n).astype(np.float64)


def rwr(A, seeds, restart: float = 0.15, max_iter: int = 100, tol: float = 1e-6, weighted: bool = True,
        tol_rule: str = "per_node", backend: str | None = None, return_info: bool = False, comm=None,
        device_memory_limit=None, tune: str = "none"):
    """Random walk with restart from ``seeds`` on the graph whose edge u -> v is ``A[u, v]``.

    ``seeds``: a node, a sequence of nodes (restarting uniformly among them), a {node: weight} dict, or a list
    of such seed sets (one column of the result each; on the GPU, backends 'tuned' and 'device', they walk
    together through one multi-vector product an iteration (:func:`rwr_block`); with 'scipy' or ``comm`` each
    set is iterated on its own). Returns the visiting
    probabilities (n,) or (n, number of sets); with ``return_info`` also the :class:`IterationInfo` of each
    set. ``tol_rule`` defaults to 'per_node' (no node's probability changes by ``tol``): NetworkX has no RWR
    whose rule to follow. Other arguments (``backend``, ``comm``, ``device_memory_limit``, ``tune``) as
    :func:`~tuner.graph.pagerank.pagerank`'s; with a ``device_memory_limit`` several seed sets walk one after
    another, each through the (possibly streamed) SpMV, since the multi-vector product is not streamed.
    ``tune`` applies to the SpMV of a walk on its own; the multi-vector product is always tuned.

    Example:
        >>> import scipy.sparse as sp
        >>> A = sp.csr_matrix(np.array([[0, 1, 0], [0, 0, 1], [1, 0, 0]], dtype=float))
        >>> rwr(A, 0, restart=0.5, tol=1e-12, backend="scipy").round(4).tolist()
        [0.5714, 0.2857, 0.1429]
    """
    if not 0 < restart <= 1:
        raise ValueError(f"restart must be in (0, 1], got {restart}")
    n = A.shape[0]
    sets = list(seeds) if _is_many(seeds) else [seeds]
    backend = default_backend(backend if comm is None else "device")
    if _is_many(seeds) and backend in ("tuned", "device") and comm is None and device_memory_limit is None:
        P = np.column_stack([_node_vector(seed_vector(s, n), n, "seeds") for s in sets])
        x, infos = rwr_block(A, P, restart=restart, max_iter=max_iter, tol=tol, weighted=weighted,
                             tol_rule=tol_rule)
        return (x, infos) if return_info else x
    results = [pagerank(A, alpha=1 - restart, personalization=seed_vector(s, n), max_iter=max_iter, tol=tol,
                        weighted=weighted, tol_rule=tol_rule, backend=backend, return_info=True, comm=comm,
                        device_memory_limit=device_memory_limit, tune=tune)
               for s in sets]
    x = np.column_stack([r[0] for r in results]) if _is_many(seeds) else results[0][0]
    if not return_info:
        return x
    infos = [r[1] for r in results]
    return x, (infos if _is_many(seeds) else infos[0])


def rwr_block(A, P: np.ndarray, restart: float = 0.15, max_iter: int = 100, tol: float = 1e-6,
              weighted: bool = True, tol_rule: str = "per_node") -> tuple[np.ndarray, list[IterationInfo]]:
    """Random walks with restart for every column of ``P`` (n x k restart distributions, each summing to 1)
    at once on the GPU: per iteration one tuned multi-vector product by Aᵀ (:func:`tuner.spmm.compile_spmm`)
    pulls the k rank caches, then each column takes PageRank's update with its own restart and dangling
    distribution. The walks stop together once every column's change is under the tolerance (each column's
    rule as :func:`~tuner.graph.pagerank.pagerank`'s); a column that met it sooner only comes closer to its
    fixed point. Returns the n x k probabilities (float64) and an IterationInfo per column.

    Example (on a GPU machine):
        >>> P = np.zeros((A.shape[0], 2)); P[0, 0] = P[5, 1] = 1.0      # doctest: +SKIP
        >>> x, infos = rwr_block(A, P)                                   # doctest: +SKIP
    """
    import cupy

    from ..formats import device_reorder
    from ..formats.transpose import transpose
    from ..spmm import compile_spmm
    if tol_rule not in TOL_RULES:
        raise ValueError(f"tol_rule must be one of {TOL_RULES}, got {tol_rule!r}")
    if max_iter < 1 or tol <= 0:
        raise ValueError(f"max_iter must be positive and tol positive, got {max_iter} and {tol}")
    t0 = time.perf_counter()
    W = edge_weights(A, weighted, keep_float=True)  # cast to float64 on the GPU
    n, k = W.shape[0], P.shape[1]
    if P.shape[0] != n:
        raise ValueError(f"the restart distributions have {P.shape[0]} rows, the graph {n} nodes")
    dangling_nodes, inverse = rank_cache_factors(W)
    product = compile_spmm(transpose(W, np.float64), np.zeros((n, k)))
    alpha = 1.0 - restart
    up = device_reorder.upload  # staged where locking pays; cupy.asarray locks memory of P's size every call
    p = up(np.ascontiguousarray(P, dtype=np.float64))
    inv = up(np.asarray(inverse, dtype=np.float64))[:, None]
    dangling = up(dangling_nodes.astype(np.float64))
    x = cupy.full((n, k), 1.0 / n)
    cache, pulled = cupy.empty((n, k)), cupy.empty((n, k))
    limit = n * tol if tol_rule == "networkx" else tol
    cupy.cuda.Device().synchronize()
    t1 = time.perf_counter()
    for iteration in range(1, max_iter + 1):
        cupy.multiply(x, inv, out=cache)  # the rank caches, then Aᵀ pulls all of them in one pass
        product(cache, out=pulled)
        new = alpha * (pulled + (dangling @ x)[None, :] * p) + (1 - alpha) * p
        change = cupy.abs(new - x)
        errors = (change.sum(axis=0) if tol_rule == "networkx" else change.max(axis=0)).get()
        x = new
        if np.all(errors < limit):
            seconds = {"setup": t1 - t0, "iterations": time.perf_counter() - t1}
            backend = f"multi-vector product of {k} columns on 1 GPU"
            return cupy.asnumpy(x), [IterationInfo(iteration, float(e), seconds, backend) for e in errors]
    raise ConvergenceError(f"the random walks did not converge in {max_iter} iterations (largest change "
                           f"{float(np.max(errors)):.3g}, rule {tol_rule!r}, tol {tol})")
