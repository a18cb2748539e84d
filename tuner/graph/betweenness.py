"""Betweenness centrality by Brandes' algorithm with many sources at once (paper 002's use of it).

A batch of b sources runs one level-synchronous BFS: the frontier is an n x b matrix and a level is one
product Aᵀ F, which also counts the shortest paths (sigma). The dependencies are then accumulated level by
level backwards, again one product per level: delta_v += sigma_v sum over out-neighbours w one level deeper of
(1 + delta_w) / sigma_w. Shortest paths are unweighted and follow the edges' direction (edge u -> v is
A[u, v]), as NetworkX's ``betweenness_centrality`` computes on a ``DiGraph`` with ``weight=None``; the
scaling (``normalized``, ``endpoints``, ``k`` sampled sources) is NetworkX 3.6's.

``backend='scipy'`` runs on the host, each level a SciPy product and NumPy's element-wise passes.
``backend='device'`` (the default where CuPy reaches a GPU) runs each level as one kernel launch (templates/betweenness.cu.j2): a warp
takes up to 256 edges of one node (a hub's edges are spread over many warps) and 64 of the batch's sources,
walks the edges once for all of them, reads the frontier through the neighbours' depths (no frontier array,
no work for nodes already reached) and updates depth and sigma in place, so a level costs one launch and a
flag read instead of a product and half a dozen passes over n x b arrays; the backward levels likewise, and
one launch sums the batch into the result. Its n x b arrays take 20 bytes per node and source (sigma and
delta in float64, depth in int32) where the host's take 56.
"""
from __future__ import annotations

import random
import time

import numpy as np
import scipy.sparse as sp

from .. import codegen
from ..formats.xp import row_tasks
from ..memory import check_fits, human_bytes
from .pagerank import IterationInfo, adjacency, default_backend as pagerank_backend

BATCH_BYTES = 1 << 30  # memory of one batch's n x b arrays (the default batch's bound)
NODE_SOURCE_BYTES = 56  # a batch's bytes per node and source on the host: its seven n x b arrays at 8 bytes
DEVICE_NODE_SOURCE_BYTES = 20  # on the device: sigma and delta (float64) and depth (int32)
BACKENDS = ("device", "scipy")
KERNEL_BLOCK = 256
KERNEL_KJ = 2  # sources per lane: a warp takes 64 of a node's sources
KERNEL_EDGES = 256  # edges per warp task: a hub's edges split among many warps
KERNEL_NAMES = ("bc_forward", "bc_backward", "bc_total")


def _sources(n: int, k, seed) -> tuple[np.ndarray, bool]:
    """The sources NetworkX picks (``random.Random(seed).sample`` of the nodes), and whether they are sampled."""
    if k is None or k == n:
        return np.arange(n), False
    if not isinstance(k, (int, np.integer)) or not 0 < k <= n:
        raise ValueError(f"k must be a number of source nodes in 1..{n}, got {k!r}")
    return np.array(random.Random(seed).sample(range(n), int(k)), dtype=np.int64), True


def _batch(P: sp.csr_matrix, PT: sp.csr_matrix, sources: np.ndarray, endpoints: bool) -> tuple[np.ndarray, int]:
    """Every node's summed dependency on the sources of one batch (distinct nodes), and the BFS depth
    reached, on the host (P the graph's pattern, PT its transpose)."""
    n, b = P.shape[0], sources.size
    cols = np.arange(b)
    sigma = np.zeros((n, b))
    sigma[sources, cols] = 1.0
    depth = np.full((n, b), -1, np.int32)
    depth[sources, cols] = 0
    frontier, level = sigma.copy(), 0
    while True:
        nxt = PT @ frontier  # paths into each node from the frontier
        nxt *= depth < 0  # only nodes not reached yet
        found = nxt > 0
        if not found.any():
            break
        level += 1
        depth = np.where(found, np.int32(level), depth)
        sigma += nxt
        frontier = nxt
    delta = np.zeros((n, b))
    safe_sigma = np.where(sigma > 0, sigma, 1.0)
    for d in range(level, 0, -1):
        coef = np.where(depth == d, (1.0 + delta) / safe_sigma, 0.0)
        delta += np.where(depth == d - 1, sigma * (P @ coef), 0.0)
    reached = depth > 0  # neither the source nor unreached
    if not endpoints:
        return (delta * reached).sum(axis=1), level
    out = ((delta + 1.0) * reached).sum(axis=1)
    out[sources] += (depth >= 0).sum(axis=0) - 1  # each source once: the sources are distinct
    return out, level


def default_backend(backend: str | None) -> str:
    """``backend`` (checked), or where None 'device' where CuPy reaches a GPU, else 'scipy'
    (:func:`~tuner.graph.pagerank.default_backend` with betweenness's backends).

    Example:
        >>> default_backend("scipy")
        'scipy'
    """
    return pagerank_backend(backend, BACKENDS, "scipy")


def kernel_source() -> str:
    """The CUDA source of the device backend's three kernels (templates/betweenness.cu.j2).

    Example:
        >>> src = kernel_source()
        >>> all(f"{name}(" in src for name in KERNEL_NAMES), "#define KJ 2" in src, "#define EDGES 256" in src
        (True, True, True)
    """
    return codegen.render("betweenness.cu.j2", dict(block_size=KERNEL_BLOCK, kj=KERNEL_KJ, edges=KERNEL_EDGES))


def _device_kernels(cupy) -> dict:
    """The kernels on the current device (:func:`~tuner.graph.device_pull.device_modules`)."""
    from .device_pull import device_modules
    module, = device_modules(cupy, [kernel_source()])
    return {name: module.get_function(name) for name in KERNEL_NAMES}


def _device_graph(cupy, W: sp.csr_matrix) -> tuple:
    """W's pattern on the device for the kernels, both ways: ((in-edge pointers, in-edge sources, tasks),
    (out-edge pointers, out-edge targets, tasks)), int32, with each way's warp tasks (:func:`_edge_tasks`); W's
    index arrays uploaded once, its transpose made there (cuSPARSE)."""
    import cupyx.scipy.sparse as cpsp

    from ..formats import device_reorder
    if W.nnz >= 2**31:
        raise ValueError(f"betweenness on the device takes graphs of fewer than 2^31 edges, this one has {W.nnz:,}: "
                         "use backend='scipy'")
    # Through the project's staging (locked memory only where that pays), not cupy.asarray, which locks
    # host memory of each array's size for a copy made once.
    up = device_reorder.upload
    device_reorder.expect_uploads(4 * W.nnz, 4 * (W.shape[0] + 1))
    indices, indptr = up(W.indices.astype(np.int32, copy=False)), up(W.indptr.astype(np.int32, copy=False))
    P = cpsp.csr_matrix((cupy.ones(W.nnz, np.float32), indices, indptr), shape=W.shape)
    PT = P.T.tocsr()
    return tuple((M.indptr, M.indices, _edge_tasks(M.indptr)) for M in (PT, P))


def _edge_tasks(indptr) -> tuple:
    """(task_node, task_first, tasks): every node's edges cut into warp tasks of up to ``KERNEL_EDGES``
    (:func:`~tuner.formats.xp.row_tasks`, int32).

    Example (nodes of 0, 600 and 3 edges, tasks of 256: none, three and one):
        >>> KERNEL_EDGES
        256
        >>> node, first, tasks = _edge_tasks(np.array([0, 0, 600, 603], np.int32))
        >>> node.tolist(), first.tolist(), tasks
        ([1, 1, 1, 2], [0, 0, 3, 4], 4)
    """
    return row_tasks(indptr, KERNEL_EDGES, np.int32)


def _check_device_fits(n: int, batch: int, nnz: int, free: int) -> None:
    """Refuse, before allocating, a batch whose n x batch arrays and the graph do not fit the ``free`` bytes of
    device memory (:func:`~tuner.formats.device_reorder.free_bytes`: the driver's free bytes and those CuPy's
    pool holds unused)."""
    need = DEVICE_NODE_SOURCE_BYTES * n * batch + 16 * (nnz + 2 * n + 2)  # the graph both ways, its tasks
    if need > free:
        raise MemoryError(f"betweenness with batches of {batch:,} sources needs about {human_bytes(need)} of device "
                          f"memory ({DEVICE_NODE_SOURCE_BYTES} B per node and source x {n:,} nodes x {batch:,}, and "
                          f"the graph both ways); {human_bytes(free)} is free: pass a smaller batch=")


def _device_batch(cupy, graph: tuple, n: int, sources, endpoints: bool, bc) -> int:
    """:func:`_batch` on the device, one launch per BFS level (module docstring): adds the batch's
    dependencies (distinct sources, a CuPy array) to ``bc`` and returns the BFS depth reached."""
    (in_ptr, in_idx, (in_node, in_first, in_tasks)), (out_ptr, out_idx, (out_node, out_first, out_tasks)) = graph
    kernels = _device_kernels(cupy)
    b = int(sources.size)
    cols = cupy.arange(b)
    sigma = cupy.zeros((n, b))
    sigma[sources, cols] = 1.0
    depth = cupy.full((n, b), -1, np.int32)
    depth[sources, cols] = 0
    delta = cupy.zeros((n, b))
    most = 32 * cupy.cuda.Device().attributes["MultiProcessorCount"]
    warps = KERNEL_BLOCK // 32
    chunks = -(-b // (32 * KERNEL_KJ))
    block, b32 = (KERNEL_BLOCK,), np.int32(b)

    def grid(tasks: int) -> tuple:
        return (max(1, min(-(-tasks * chunks // warps), most)),)
    found = cupy.zeros(1, np.int32)  # the last level that reached a node: no reset between levels
    level = 0
    while True:
        kernels["bc_forward"](grid(in_tasks), block, (in_ptr, in_idx, in_node, in_first, np.int64(in_tasks), sigma,
                                                      depth, b32, np.int32(level + 1), found))
        if int(found.get()[0]) != level + 1:
            break
        level += 1
    for d in range(level, 0, -1):
        kernels["bc_backward"](grid(out_tasks), block, (out_ptr, out_idx, out_node, out_first, np.int64(out_tasks),
                                                        sigma, depth, delta, b32, np.int32(d)))
    kernels["bc_total"]((max(1, min(-(-n // warps), most)),), block,
                        (delta, depth, bc, np.int64(n), b32, np.int32(endpoints)))
    if endpoints:  # each source once more per node it reached, itself left out (the sources are distinct)
        bc[sources] += (depth >= 0).sum(axis=0) - 1
    return level


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
                batch: int | None = None, progress=None, return_info: bool = False, backend: str | None = None):
    """Betweenness centrality of every node of the graph whose edge u -> v is ``A[u, v]`` (unweighted shortest
    paths), as ``networkx.betweenness_centrality(G, k, normalized, endpoints=endpoints, seed=seed)`` gives it
    for the ``DiGraph`` of A.

    ``k``: that many sources sampled as NetworkX samples them (``random.Random(seed)``), the result scaled up as
    NetworkX does; ``batch``: sources per BFS (default: as many as 1 GiB of n x batch arrays allows). Returns
    a float64 array, and with ``return_info`` an :class:`~tuner.graph.pagerank.IterationInfo` (iterations:
    the deepest BFS level). ``progress``: wraps the iterable of batches (e.g. ``tqdm.tqdm``). ``backend``:
    'device' (a launch per BFS level on the GPU, through CuPy; module docstring) or 'scipy' (the host); by
    default the device where CuPy reaches a GPU, else the host.

    Example:
        >>> A = sp.csr_matrix(np.array([[0, 1, 0], [0, 0, 1], [0, 0, 0]]))  # the path 0 -> 1 -> 2
        >>> betweenness(A, backend="scipy").tolist()                       # 1 lies on 0 -> 2, of 2 pairs
        [0.0, 0.5, 0.0]
    """
    W = adjacency(A)
    n = W.shape[0]
    backend = default_backend(backend)
    t0 = time.perf_counter()
    if not W.has_canonical_format:  # duplicate edges count once
        W = W.copy()
        W.sum_duplicates()
    sources, sampled = _sources(n, k, seed)
    per_pair = DEVICE_NODE_SOURCE_BYTES if backend == "device" else NODE_SOURCE_BYTES
    if batch is None:
        batch = max(1, min(sources.size, BATCH_BYTES // (per_pair * n)))
    elif batch < 1:
        raise ValueError(f"batch must be at least 1, got {batch}")
    batch = min(batch, max(sources.size, 1))
    starts = range(0, sources.size, batch)
    deepest = 0
    if backend == "device":
        from .. import gpu
        from ..formats import device_reorder
        if not device_reorder.available():
            raise gpu.NoDeviceError("betweenness with backend='device' runs through CuPy, which reaches no GPU "
                                    "here: use backend='scipy'")
        import cupy
        _check_device_fits(n, batch, W.nnz, device_reorder.free_bytes())
        graph = _device_graph(cupy, W)
        bc, picked = cupy.zeros(n), cupy.asarray(sources)
        for start in (progress(starts) if progress else starts):
            deepest = max(deepest, _device_batch(cupy, graph, n, picked[start:start + batch], endpoints, bc))
        bc = bc.get()
    else:
        check_fits(NODE_SOURCE_BYTES * n * batch, f"betweenness with batches of {batch:,} sources",
                   f"{NODE_SOURCE_BYTES} B per node and source of a batch x {n:,} nodes x {batch:,}",
                   hint="pass a smaller batch=")
        P = sp.csr_matrix((np.ones(W.nnz), W.indices, W.indptr), shape=W.shape)
        PT = P.T.tocsr()
        bc = np.zeros(n)
        for start in (progress(starts) if progress else starts):
            part, level = _batch(P, PT, sources[start:start + batch], endpoints)
            bc += part
            deepest = max(deepest, level)
    bc = _rescale(bc, n, normalized, endpoints, sources if sampled else None)
    info = IterationInfo(deepest, 0.0, {"setup": 0.0, "iterations": time.perf_counter() - t0},
                         "device kernels on 1 GPU" if backend == "device" else "scipy")
    return (bc, info) if return_info else bc
