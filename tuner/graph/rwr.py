"""Random walk with restart: the walker follows an out-edge (by weight) and, with probability ``restart``,
jumps back to its seeds. Its stationary distribution is PageRank personalised on the seeds with
alpha = 1 - restart (dangling nodes send the walker back to the seeds too), which is how it is computed.
"""
from __future__ import annotations

import numpy as np

from .pagerank import pagerank


def _is_many(seeds) -> bool:
    return isinstance(seeds, (list, tuple)) and len(seeds) > 0 and all(
        isinstance(s, (list, tuple, dict, np.ndarray)) for s in seeds)


def _seed_vector(seeds, n: int):
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
        tol_rule: str = "per_node", backend: str = "tuned", return_info: bool = False, comm=None):
    """Random walk with restart from ``seeds`` on the graph whose edge u -> v is ``A[u, v]``.

    ``seeds``: a node, a sequence of nodes (restarting uniformly among them), a {node: weight} dict, or a list
    of such seed sets (one column of the result each; each set is iterated on its own). Returns the visiting
    probabilities (n,) or (n, number of sets); with ``return_info`` also the :class:`IterationInfo` of each
    set. ``tol_rule`` defaults to 'per_node' (no node's probability changes by ``tol``): NetworkX has no RWR
    whose rule to follow. Other arguments (``backend``, ``comm``) as :func:`~tuner.graph.pagerank.pagerank`'s.

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
    results = [pagerank(A, alpha=1 - restart, personalization=_seed_vector(s, n), max_iter=max_iter, tol=tol,
                        weighted=weighted, tol_rule=tol_rule, backend=backend, return_info=True, comm=comm)
               for s in sets]
    x = np.column_stack([r[0] for r in results]) if _is_many(seeds) else results[0][0]
    if not return_info:
        return x
    infos = [r[1] for r in results]
    return x, (infos if _is_many(seeds) else infos[0])
