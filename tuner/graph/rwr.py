"""Random walk with restart: the walker follows an out-edge (by weight) and, with probability ``restart``,
jumps back to its seeds. Its stationary distribution is PageRank personalised on the seeds with
alpha = 1 - restart (dangling nodes send the walker back to the seeds too), which is how it is computed.

Several seed sets on the GPU walk together: their visiting probabilities are the columns of one block, and
each iteration reads the graph once for all of them through a multi-vector product (:mod:`tuner.graph.walks`).
"""
from __future__ import annotations

import time

import numpy as np
import scipy.sparse as sp

from .pagerank import TOL_RULES, ConvergenceError, IterationInfo, check_node_values, default_backend, pagerank


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
    nodes, weights = _seed_entries(seeds, n)
    v = np.zeros(n)
    v[nodes] = weights
    return v


def _seed_entries(seeds, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(nodes, weights) of a seed set: node numbers (each weighing how often it is named) or a {node: weight}
    dict, unnormalised, the nodes checked against the graph's ``n``."""
    if isinstance(seeds, dict):
        nodes = np.array([int(v) for v in seeds], dtype=np.int64)
        weights = np.array(list(seeds.values()), dtype=np.float64)
    else:
        nodes, counts = np.unique(np.atleast_1d(np.asarray(seeds, dtype=np.int64)), return_counts=True)
        weights = counts.astype(np.float64)
    if nodes.size == 0:
        raise ValueError("a seed set names no node")
    if nodes.min() < 0 or nodes.max() >= n:
        raise ValueError(f"seeds name node {int(nodes.max() if nodes.max() >= n else nodes.min())}, but the graph "
                         f"has nodes 0..{n - 1}")
    return nodes, weights


def restart_block(sets, n: int) -> sp.csc_matrix:
    """The n x k restart distributions of seed sets (as :func:`seed_vector` reads them, each normalised to sum
    1) as a sparse block: a few entries per column instead of n.

    Example:
        >>> restart_block([[0, 2, 2], {1: 3.0}], 4).toarray().round(3).tolist()
        [[0.333, 0.0], [0.0, 1.0], [0.667, 0.0], [0.0, 0.0]]
    """
    rows, cols, vals = [], [], []
    for j, s in enumerate(sets):  # a loop over seed sets, each a few entries
        nodes, weights = _seed_entries(s, n)
        total = float(weights.sum())
        check_node_values("seeds", not np.all(np.isfinite(weights)) or bool(np.any(weights < 0)), total)
        rows.append(nodes)
        cols.append(np.full(nodes.size, j))
        vals.append(weights / total)
    return sp.csc_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(n, len(sets)))


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
        P = restart_block(sets, n)
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
    """Random walks with restart for every column of ``P`` (n x k restart distributions, each summing to 1; a
    NumPy array or a SciPy sparse matrix, as :func:`restart_block` makes) at once on the GPU
    (:func:`~tuner.graph.walks.walk_block`): the graph is uploaded and transposed on the device once, and each
    iteration pulls the k rank caches through one multi-vector product (the fastest on the walk's first
    iterations of :mod:`tuner.spmm`'s kernels and cuSPARSE's), then each column takes
    PageRank's update with its own restart and dangling distribution. Each column stops at the iteration where
    its change meets the tolerance (its rule as :func:`~tuner.graph.pagerank.pagerank`'s), as it would walking
    alone. Returns the n x k probabilities (float64) and an IterationInfo per column. A graph the device path
    does not take (no CuPy, no edge, integer weights, a failed check, too little device memory) walks each
    column on its own through :func:`~tuner.graph.pagerank.pagerank`, which names any problem.

    Example (on a GPU machine):
        >>> P = np.zeros((A.shape[0], 2)); P[0, 0] = P[5, 1] = 1.0      # doctest: +SKIP
        >>> x, infos = rwr_block(A, P)                                   # doctest: +SKIP
    """
    if tol_rule not in TOL_RULES:
        raise ValueError(f"tol_rule must be one of {TOL_RULES}, got {tol_rule!r}")
    if max_iter < 1 or tol <= 0:
        raise ValueError(f"max_iter must be positive and tol positive, got {max_iter} and {tol}")
    P = P.tocsc().astype(np.float64) if sp.issparse(P) else np.asarray(P, dtype=np.float64)
    n = A.shape[0]
    if P.ndim != 2 or P.shape[0] != n or P.shape[1] < 1:
        raise ValueError(f"the restart distributions are an n x k block with n = {n} (the graph's nodes) and "
                         f"k >= 1, got shape {P.shape}")
    values = P.data if sp.issparse(P) else P
    if not np.all(np.isfinite(values)) or np.any(values < 0):
        raise ValueError("the restart distributions must be finite and non-negative")
    t0 = time.perf_counter()
    walked = _walk_on_device(A, P, 1.0 - restart, n * tol if tol_rule == "networkx" else tol,
                             int(tol_rule == "per_node"), max_iter, weighted)
    if walked is None:
        column = (lambda j: P[:, j].toarray().ravel()) if sp.issparse(P) else (lambda j: P[:, j])
        results = [pagerank(A, alpha=1.0 - restart, personalization=column(j), max_iter=max_iter, tol=tol,
                            weighted=weighted, tol_rule=tol_rule, return_info=True) for j in range(P.shape[1])]
        return np.column_stack([r[0] for r in results]), [r[1] for r in results]
    x, run, t1 = walked
    seconds = {"setup": t1 - t0, "iterations": time.perf_counter() - t1}
    if np.any(run.iterations == 0):
        raise ConvergenceError(f"the random walks did not converge in {max_iter} iterations (largest change "
                               f"{float(np.max(run.errors[run.iterations == 0])):.3g}, rule {tol_rule!r}, tol {tol})")
    backend = f"multi-vector product of {P.shape[1]} columns on 1 GPU ({run.product})"
    return x, [IterationInfo(int(i), float(e), seconds, backend) for i, e in zip(run.iterations, run.errors)]


def _walk_on_device(A, P: np.ndarray, alpha: float, limit: float, max_rule: int, max_iter: int, weighted: bool):
    """(x as a host array, :class:`~tuner.graph.walks.WalkRun`, the perf_counter when the iterations began), or
    None where the device path does not take the graph (:func:`rwr_block`)."""
    from ..formats import device_reorder
    if not device_reorder.available():
        return None
    from .device_pull import pull_arrays
    from .walks import device_bytes, walk_block
    pull = pull_arrays(A, weighted, np.float64, small=True)
    if pull is None or device_bytes(*P.shape) > device_reorder.free_bytes():
        return None
    import cupy
    with device_reorder.on_device():
        if sp.issparse(P):  # a few entries a column: their triplets cross, not n x k zeros
            coo = P.tocoo()
            p = cupy.zeros(P.shape, np.float64)
            p[device_reorder.upload(coo.row.astype(np.int64)), device_reorder.upload(coo.col.astype(np.int64))] = \
                device_reorder.upload(coo.data)
        else:
            p = device_reorder.upload(np.ascontiguousarray(P))
        cupy.cuda.get_current_stream().synchronize()
        t1 = time.perf_counter()
        try:
            x, run = walk_block(pull, p, alpha, limit, max_rule, max_iter)
        except MemoryError:  # CuPy's OutOfMemoryError is one: the columns walk one by one instead
            device_reorder.release()
            return None
        return device_reorder.download(x), run, t1
