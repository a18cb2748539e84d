"""Betweenness centrality by Brandes' algorithm with many sources at once (paper 002's use of it).

A batch of b sources runs one level-synchronous BFS: the frontier is an n x b matrix and a level is one
product Aᵀ F, which also counts the shortest paths (sigma). The dependencies are then accumulated level by
level backwards, again one product per level: delta_v += sigma_v sum over out-neighbours w one level deeper of
(1 + delta_w) / sigma_w. Shortest paths are unweighted and follow the edges' direction (edge u -> v is
A[u, v]), as NetworkX's ``betweenness_centrality`` computes on a ``DiGraph`` with ``weight=None``; the
scaling (``normalized``, ``endpoints``, ``k`` sampled sources) is NetworkX 3.6's. The same code runs on the
host (NumPy and SciPy, ``backend='scipy'``, the default) or on the GPU (CuPy; each level's product is
cuSPARSE's SpMM of the graph by the n x b frontier, ``backend='device'``).
"""
from __future__ import annotations

import random
import time

import numpy as np
import scipy.sparse as sp

from ..memory import check_fits
from .pagerank import IterationInfo, adjacency

BATCH_BYTES = 1 << 30  # memory of one batch's n x b arrays (seven of them, float64 or int32)
NODE_SOURCE_BYTES = 56  # a batch's bytes per node and source: its seven n x b arrays at 8 bytes
BACKENDS = ("device", "scipy")


def _sources(n: int, k, seed) -> tuple[np.ndarray, bool]:
    """The sources NetworkX picks (``random.Random(seed).sample`` of the nodes), and whether they are sampled."""
    if k is None or k == n:
        return np.arange(n), False
    if not isinstance(k, (int, np.integer)) or not 0 < k <= n:
        raise ValueError(f"k must be a number of source nodes in 1..{n}, got {k!r}")
    return np.array(random.Random(seed).sample(range(n), int(k)), dtype=np.int64), True


def _batch(xp, P, PT, sources, endpoints: bool) -> tuple[object, int]:
    """Every node's summed dependency on the sources of one batch (distinct nodes), and the BFS depth
    reached; ``xp``: NumPy with SciPy matrices, or CuPy with CuPy's."""
    n, b = P.shape[0], sources.size
    cols = xp.arange(b)
    sigma = xp.zeros((n, b))
    sigma[sources, cols] = 1.0
    depth = xp.full((n, b), -1, np.int32)
    depth[sources, cols] = 0
    frontier, level = sigma.copy(), 0
    while True:  # element-wise passes only (masked assignments cost CuPy a scan of the mask each)
        nxt = PT @ frontier  # paths into each node from the frontier
        nxt *= depth < 0  # only nodes not reached yet
        found = nxt > 0
        if not found.any():
            break
        level += 1
        depth = xp.where(found, np.int32(level), depth)
        sigma += nxt
        frontier = nxt
    delta = xp.zeros((n, b))
    safe_sigma = xp.where(sigma > 0, sigma, 1.0)
    for d in range(level, 0, -1):
        coef = xp.where(depth == d, (1.0 + delta) / safe_sigma, 0.0)
        delta += xp.where(depth == d - 1, sigma * (P @ coef), 0.0)
    reached = depth > 0  # neither the source nor unreached
    if not endpoints:
        return (delta * reached).sum(axis=1), level
    out = ((delta + 1.0) * reached).sum(axis=1)
    out[sources] += (depth >= 0).sum(axis=0) - 1  # each source once: the sources are distinct
    return out, level


def _rescale(bc: np.ndarray, n: int, normalized: bool, endpoints: bool, sources: np.ndarray | None) -> np.ndarray:
    """NetworkX 3.6's ``_rescale`` for a directed graph."""
    N = n if endpoints else n - 1
    if N < 2:
        return bc
    k = N if sources is None else sources.size
    if sources is None or endpoints:
        scale = 1.0 / (k * (N - 1)) if normalized else N / k
        return bc * scale
    scale_source = (1.0 / ((k - 1) * (N - 1)) if normalized else N / (k - 1)) if k > 1 else np.nan
    scale_other = 1.0 / (k * (N - 1)) if normalized else N / k
    out = bc * scale_other
    out[sources] = bc[sources] * scale_source
    return out


def betweenness(A, k: int | None = None, normalized: bool = True, endpoints: bool = False, seed=None,
                batch: int | None = None, progress=None, return_info: bool = False, backend: str = "scipy"):
    """Betweenness centrality of every node of the graph whose edge u -> v is ``A[u, v]`` (unweighted shortest
    paths), as ``networkx.betweenness_centrality(G, k, normalized, endpoints=endpoints, seed=seed)`` gives it
    for the ``DiGraph`` of A.

    ``k``: that many sources sampled as NetworkX samples them (``random.Random(seed)``), the result scaled up as
    NetworkX does; ``batch``: sources per BFS (default: as many as 1 GiB of n x batch arrays allows). Returns
    a float64 array, and with ``return_info`` an :class:`~tuner.graph.pagerank.IterationInfo` (iterations:
    the deepest BFS level). ``progress``: wraps the iterable of batches (e.g. ``tqdm.tqdm``). ``backend``:
    'scipy' (the host, the default) or 'device' (CuPy and cuSPARSE on the GPU).

    Example:
        >>> A = sp.csr_matrix(np.array([[0, 1, 0], [0, 0, 1], [0, 0, 0]]))  # the path 0 -> 1 -> 2
        >>> betweenness(A, backend="scipy").tolist()                       # 1 lies on 0 -> 2, of 2 pairs
        [0.0, 0.5, 0.0]
    """
    W = adjacency(A)
    n = W.shape[0]
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    t0 = time.perf_counter()
    if not W.has_canonical_format:  # duplicate edges count once
        W = W.copy()
        W.sum_duplicates()
    xp = np
    if backend == "device":  # the pattern's index arrays uploaded once, its ones and transpose made there
        import cupy
        import cupyx.scipy.sparse as cpsp
        xp = cupy
        P = cpsp.csr_matrix((cupy.ones(W.nnz), cupy.asarray(W.indices), cupy.asarray(W.indptr)), shape=W.shape)
    else:
        P = sp.csr_matrix((np.ones(W.nnz), W.indices, W.indptr), shape=W.shape)
    PT = P.T.tocsr()
    sources, sampled = _sources(n, k, seed)
    if batch is None:
        batch = max(1, min(sources.size, BATCH_BYTES // (NODE_SOURCE_BYTES * n)))
    elif batch < 1:
        raise ValueError(f"batch must be at least 1, got {batch}")
    batch = min(batch, max(sources.size, 1))
    if backend == "scipy":
        check_fits(NODE_SOURCE_BYTES * n * batch, f"betweenness with batches of {batch:,} sources",
                   f"{NODE_SOURCE_BYTES} B per node and source of a batch x {n:,} nodes x {batch:,}",
                   hint="pass a smaller batch=")
    bc, deepest = xp.zeros(n), 0
    starts = range(0, sources.size, batch)
    picked = xp.asarray(sources)
    for start in (progress(starts) if progress else starts):
        part, level = _batch(xp, P, PT, picked[start:start + batch], endpoints)
        bc += part
        deepest = max(deepest, level)
    bc = bc if xp is np else bc.get()
    bc = _rescale(bc, n, normalized, endpoints, sources if sampled else None)
    info = IterationInfo(deepest, 0.0, {"setup": 0.0, "iterations": time.perf_counter() - t0},
                         "cuSPARSE SpMM on 1 GPU" if backend == "device" else "scipy")
    return (bc, info) if return_info else bc
