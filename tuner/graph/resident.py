"""PageRank's iterations inside one cooperative kernel launch (templates/pagerank_resident.cu.j2).

Driven from the host, an iteration is a product, an update and a read of the change: four launches and a
round trip, about 0.1 ms, against a 5-20 us product on a graph of a few million edges. Here one launch runs
every iteration: each is two grid-wide phases (the pull over equal chunks of Wᵀ's entries, then the update,
the next rank cache and the block partials), and every block reduces the partials in the same order, so all
stop together when the change meets the tolerance. The grid is what the GPU holds at once (a cooperative
launch), at most what the graph's chunks and nodes need. Where it holds a warp for every chunk and a thread
for every node, the single kernel reads each warp's chunk and each thread's node once, before the first
iteration (:func:`single_fits`): a small graph's iteration is a chain of dependent loads, and this leaves the
gather of the ranks and the read of the rows' pulls. It reads Wᵀ as :mod:`~tuner.graph.device_pull` leaves
it on the device: no layout to build, so it is also what an untuned PageRank runs on a large graph.
Where the rank cache outgrows a quarter of L2 (:func:`relabel_pays`), the nodes are numbered by decreasing
out-degree first (one pass over the edges there): the node vectors go into that order once and the ranks
come back in the caller's.

Nothing in the kernel is atomic, so a run repeats bit for bit on the same GPU from the same factors; a
weighted graph's out-weights are summed by atomic adds on the device, which may round differently from one
setup to the next.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .. import codegen
from ..formats import xp
from .device_pull import VALUE_CTYPES, device_modules, pull_arrays
from .pagerank import ConvergenceError, IterationInfo, _node_vector, check_node_size, check_node_values

RESIDENT_BLOCK = 256
CHUNKS = (32, 64, 128, 256)  # Wᵀ's entries a warp pulls at a time: one to eight steps of 32
# The single kernel's chunks (resident_source): a chunk of 256 entries in registers leaves room for two blocks
# an SM, too few warps to hide the gathers (slower than the kernel taking chunks in turns).
SINGLE_CHUNKS = (32, 64, 128)
L2_SHARE = 4  # the rank cache's share of L2 beyond which degree order pays (relabel_pays)
CHUNKS_PER_SM = 64  # chunks an SM takes before a larger chunk is: one or two a warp (it holds 32-40 warps)
# Node vectors up to this many entries are checked and normalised on the host: its passes take about a
# nanosecond an entry (0.1 ms at this size), the device's checks five launches and a wait (0.2-0.3 ms) at any.
HOST_NODE_VALUES = 1 << 17
_kernels: dict = {}  # (value type, pattern, chunk, single, device) -> (function, blocks the GPU holds)


@dataclass(frozen=True)
class ResidentRun:
    """How a resident run ended.

    Attributes:
        iterations: iterations run (the last one met the tolerance, unless it is ``max_iter``).
        error: that iteration's change, as the stopping rule measures it.
        grid: blocks of the launch.
    """

    iterations: int
    error: float
    grid: int


def resident_source(dtype, pattern: bool, chunk: int, single: bool = False) -> tuple[str, str]:
    """The kernel's name and CUDA source for values of ``dtype``; ``pattern``: every edge has one weight,
    passed as an argument instead of read per edge; ``chunk``: entries a warp pulls at a time (of ``CHUNKS``);
    ``single``: for a grid with a warp per chunk and a thread per node, which then read their chunk and node
    once instead of every iteration (:func:`single_fits`).

    Example:
        >>> name, source = resident_source(np.float32, True, 256)
        >>> name, "#define PATTERN 1" in source
        ('pagerank_resident_float32_pattern_256', True)
        >>> resident_source(np.float64, False, 32, single=True)[0]
        'pagerank_resident_float64_weighted_32_single'
    """
    dtype = np.dtype(dtype)
    if dtype not in VALUE_CTYPES:
        raise ValueError(f"resident PageRank runs in float32 or float64, got {dtype}")
    if chunk not in (SINGLE_CHUNKS if single else CHUNKS):
        raise ValueError(f"chunk must be one of {SINGLE_CHUNKS if single else CHUNKS}"
                         f"{' for the single kernel' if single else ''}, got {chunk}")
    name = f"pagerank_resident_{dtype.name}_{'pattern' if pattern else 'weighted'}_{chunk}{'_single' if single else ''}"
    return name, codegen.render("pagerank_resident.cu.j2", dict(VAL=VALUE_CTYPES[dtype], block_size=RESIDENT_BLOCK,
                                                                 chunk=chunk, pattern=pattern, single=single,
                                                                 kernel_name=name))


def chunk_for(nnz: int, sm_count: int) -> int:
    """Entries a warp pulls at a time: the smallest of ``CHUNKS`` that leaves at most ``CHUNKS_PER_SM`` chunks
    an SM (one or two for each of the 32-40 warps an SM holds of the kernel taking chunks in turns), else
    the largest. A warp's steps of 32 entries run one after another, each waiting on its loads: a small
    graph then pays one short chunk's latency an iteration, and a large one the fewest head and tail slots.

    Example (132 SMs):
        >>> chunk_for(103_689, 132), chunk_for(948_464, 132), chunk_for(131_161_551, 132)
        (32, 128, 256)
    """
    for chunk in CHUNKS:
        if nnz <= chunk * CHUNKS_PER_SM * sm_count:
            return chunk
    return CHUNKS[-1]


def grid_for(chunks: int, n: int, max_blocks: int, single: bool = False) -> int:
    """Blocks of a run: enough for a warp per chunk and a thread per node, at most ``max_blocks`` (what the
    GPU holds at once); fewer blocks make each grid-wide barrier cheaper. ``single``: for the single kernel,
    which leaves out the chunks and nodes beyond a warp and a thread each: a ValueError where they do not fit.

    Example:
        >>> grid_for(chunks=405, n=8298, max_blocks=792), grid_for(10**6, 10**7, 792)
        (51, 792)
    """
    warps = RESIDENT_BLOCK // 32
    grid = max(1, min(max_blocks, max(-(-chunks // warps), -(-n // RESIDENT_BLOCK))))
    if single and not single_fits(chunks, n, grid):
        raise ValueError(f"the single resident kernel needs a warp a chunk and a thread a node: {chunks} chunks "
                         f"and {n} nodes on at most {max_blocks} blocks")
    return grid


def single_fits(chunks: int, n: int, grid: int) -> bool:
    """Whether a ``grid`` of blocks has a warp for each of ``chunks`` and a thread for each of ``n`` nodes: the
    run then takes the ``single`` kernel (:func:`resident_source`), which reads each warp's chunk and each
    thread's node once instead of every iteration.

    Example:
        >>> single_fits(chunks=2966, n=13436, grid=371), single_fits(chunks=12564, n=325557, grid=528)
        (True, False)
    """
    return chunks <= grid * (RESIDENT_BLOCK // 32) and n <= grid * RESIDENT_BLOCK


def relabel_pays(n: int, dtype, l2_bytes: int) -> bool:
    """Whether a run numbers the nodes by decreasing out-degree (:func:`~tuner.graph.device_pull.degree_order`)
    before its first iteration: where the rank cache (``n`` values of ``dtype``) outgrows a quarter of the
    GPU's ``l2_bytes`` of L2. A cache of a few megabytes stays cached beside the streamed entries whatever the
    order (rmat:20's 4 MB iterated no faster in degree order on an H200); a larger one does not, and degree
    order packs the hubs' entries, which most gathers read, into few lines that stay in L1 (caches of 21 to
    134 MB iterated 15-41 % faster). The relabelling costs about one pass over the entries.

    Example (50 MB of L2):
        >>> relabel_pays(1_048_576, np.float32, 50 * 2**20), relabel_pays(8_388_608, np.float32, 50 * 2**20)
        (False, True)
    """
    return n * np.dtype(dtype).itemsize * L2_SHARE > l2_bytes


def compile_all(dtype, arch: str, cache=None) -> list:
    """Every specialisation of the kernel for ``dtype`` (pattern or weighted, each chunk size, single or not)
    built at once, nvcc runs in parallel, into the binary cache: the first PageRank on a machine waits for one
    round of compiles, not one per graph size met later.

    Example:
        >>> import tempfile; from tuner.cache import Cache
        >>> len(compile_all(np.float32, "sm_90", Cache(tempfile.mkdtemp())))
        14
    """
    return codegen.compile_many([source for _, source in variant_sources(dtype)], arch, cache=cache)


def variant_sources(dtype) -> list[tuple[str, str]]:
    """(name, source) of every variant of the kernel for ``dtype``, in :data:`_VARIANTS`' order.

    Example:
        >>> len(variant_sources(np.float64)), variant_sources(np.float64)[0][0] in variant_sources(np.float64)[0][1]
        (14, True)
    """
    return [resident_source(dtype, *variant) for variant in _VARIANTS]


_VARIANTS = [(pattern, chunk, single) for pattern in (False, True) for single in (False, True)
             for chunk in (SINGLE_CHUNKS if single else CHUNKS)]


def _kernel(dtype: np.dtype, pattern: bool, chunk: int, single: bool):
    """(function, blocks the GPU holds at once) for the current device. The first call for a value type
    loads every variant of it (pattern or weighted, each chunk size, single or not) at once (their nvcc
    builds in parallel, :func:`~tuner.graph.device_pull.device_modules`): a process's first PageRank pays for
    them, not its first PageRank of each graph size (a millisecond or two each, as long as a small graph's
    whole run)."""
    import cupy
    device = cupy.cuda.Device()
    key = (dtype.name, pattern, chunk, single, device.id)
    if key not in _kernels:
        named = variant_sources(dtype)
        for variant, (name, _), module in zip(_VARIANTS, named, device_modules(cupy, [s for _, s in named])):
            function = module.get_function(name)
            per_sm = cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(function.ptr, RESIDENT_BLOCK, 0)
            _kernels[(dtype.name, *variant, device.id)] = (function, per_sm * device.attributes["MultiProcessorCount"])
    return _kernels[key]


@dataclass(frozen=True, eq=False)
class ResidentLayout:
    """Wᵀ's chunks, the kernel that iterates on them and the work arrays of a run (CuPy).

    Attributes:
        chunk: entries a warp pulls at a time (:func:`chunk_for`); chunks: Wᵀ's chunks of that many entries.
        chunk_row: each chunk's first row, then the last row.
        function: the kernel for the graph's value type, weighting and chunk, ``single`` where the grid fits
            (:func:`single_fits`); grid: its blocks (:func:`grid_for`).
        work: two rank caches, the rows' pulls, and the chunks' head and tail slots; partials: the blocks' sums.
        out: the run's [iterations, change, dangling sum].
    """

    chunk: int
    chunks: int
    chunk_row: object
    function: object
    single: bool
    grid: int
    work: object
    partials: object
    out: object


def _chunking(dtype: np.dtype, pattern: bool, n: int, nnz: int, sm_count: int) -> tuple[int, bool]:
    """(chunk, single) of a run: the smallest chunk whose single kernel the GPU holds with a warp for every
    chunk and a thread for every node, else :func:`chunk_for`'s chunk for the kernel that takes them in turns."""
    for chunk in SINGLE_CHUNKS:
        chunks = -(-nnz // chunk)
        if single_fits(chunks, n, grid_for(chunks, n, _kernel(dtype, pattern, chunk, True)[1])):
            return chunk, True
    return chunk_for(nnz, sm_count), False


def layout(matrix, dtype, pattern: bool) -> ResidentLayout:
    """The :class:`ResidentLayout` of Wᵀ (a CuPy CSR with int32 indices) for vectors of ``dtype``;
    ``pattern``: every edge weighs the same (the kernel then reads no values). Loads the kernel (every variant
    of the value type at once, built by nvcc the first time on this machine: :func:`compile_all`'s sources).

    Example (on a GPU machine; wiki-Vote on an H200):
        >>> ready = layout(pull.matrix, np.float32, True)                   # doctest: +SKIP
        >>> ready.chunk, ready.chunks, ready.single                         # doctest: +SKIP
        (64, 1621, True)
    """
    import cupy
    dtype = np.dtype(dtype)
    n, nnz = matrix.shape[0], int(matrix.indices.size)
    chunk, single = _chunking(dtype, pattern, n, nnz, cupy.cuda.Device().attributes["MultiProcessorCount"])
    chunks = -(-nnz // chunk)
    # Each chunk's first row (the last row whose pointer is at most its first entry), then the last row.
    starts = cupy.arange(chunks, dtype=np.int32) * chunk  # below nnz < 2^31
    chunk_row = cupy.empty(chunks + 1, np.int32)
    chunk_row[:chunks] = cupy.searchsorted(matrix.indptr, starts, side="right") - 1
    chunk_row[chunks] = max(n - 1, 0)
    function, max_blocks = _kernel(dtype, pattern, chunk, single)
    grid = grid_for(chunks, n, max_blocks, single)
    slots = max(chunks, 1)
    return ResidentLayout(chunk, chunks, chunk_row, function, single, grid, cupy.empty(3 * n + 2 * slots, dtype),
                          cupy.empty(2 * grid, np.float64), cupy.zeros(3, np.float64))


def iterate(layout: ResidentLayout, matrix, pattern: float | None, inverse, dangling, x, p, d, alpha: float,
            limit: float, max_rule: int, max_iter: int) -> ResidentRun:
    """Iterate PageRank on the device until the change is below ``limit`` or ``max_iter`` iterations ran.

    ``matrix``: Wᵀ as a CuPy CSR with int32 indices (its values unread where ``pattern`` gives every edge's
    weight) and ``layout`` its :func:`layout`; ``inverse`` (1 / out-weight, 0 where dangling), ``dangling`` (1
    where dangling, else 0), ``p`` (teleport) and ``d`` (dangling distribution): CuPy vectors in ``x``'s
    dtype; ``x``: the start, overwritten with the ranks. ``max_rule``: 0 for the L1 change, 1 for the largest.

    Example (on a GPU machine):
        >>> ready = layout(Wt, np.float32, True)                                    # doctest: +SKIP
        >>> iterate(ready, Wt, 1.0, inv, dang, x, p, p, 0.85, n * 1e-6, 0, 100).iterations  # doctest: +SKIP
        17
    """
    dtype = np.dtype(x.dtype)
    values = np.uint64(0) if pattern is not None else matrix.data
    layout.function((layout.grid,), (RESIDENT_BLOCK,),
                    (matrix.indptr, matrix.indices, values, dtype.type(0 if pattern is None else pattern),
                     layout.chunk_row, np.int64(layout.chunks), inverse, dangling, p, d, x, layout.work,
                     np.int64(max(layout.chunks, 1)), layout.partials, layout.out, np.int64(x.size),
                     np.float64(alpha), np.float64(limit), np.int32(max_rule), np.int32(max_iter)),
                    enable_cooperative_groups=True)
    iterations, error, _ = layout.out.get()
    return ResidentRun(int(iterations), float(error), layout.grid)


def node_vector(values, n: int, what: str, dtype):
    """:func:`~tuner.graph.pagerank._node_vector` (None: uniform) as a CuPy vector in ``dtype``; a NumPy array
    of more than ``HOST_NODE_VALUES`` entries is copied to the device once and checked and normalised there
    (one number read back instead of several host passes over it); a smaller one, or anything else (a
    {node: value} dict), goes through the host function and crosses in ``dtype``.

    Example (on a GPU machine):
        >>> node_vector(np.array([1.0, 3.0]), 2, "nstart", np.float32).tolist()   # doctest: +SKIP
        [0.25, 0.75]
    """
    import cupy

    from ..formats import device_reorder
    if values is None:
        return cupy.full(n, 1.0 / n, dtype)
    if not isinstance(values, np.ndarray) or values.dtype.kind not in "fiub" or values.size <= HOST_NODE_VALUES:
        return device_reorder.upload(_node_vector(values, n, what).astype(dtype))
    check_node_size(what, values.size, n)
    v = device_reorder.upload(np.ascontiguousarray(values).reshape(-1)).astype(np.float64, copy=False)
    # Kernels of our own (CuPy's any and sum build CUB kernels, seconds each, on a machine's first use)
    bad = xp.largest(~cupy.isfinite(v) | (v < 0))
    total = float(xp.sum64(v).get()[0])
    check_node_values(what, bool(bad), total)
    return (v / total).astype(dtype, copy=False)


def pagerank(A, alpha: float, personalization, max_iter: int, tol: float, nstart, dangling, weighted: bool,
             tol_rule: str, dtype, return_info: bool):
    """:func:`tuner.graph.pagerank` on this GPU with every iteration in one launch (arguments, result and
    errors as there, arguments already checked), or None where :func:`~tuner.graph.device_pull.pull_arrays`
    does not take the graph (the caller's path then checks it and names any problem).

    Example (on a GPU machine):
        >>> x = pagerank(A, 0.85, None, 100, 1e-6, None, None, True, "networkx", np.float32, False)  # doctest: +SKIP
    """
    import cupy

    from ..formats import device_reorder
    t0 = time.perf_counter()
    relabel = relabel_pays(A.shape[0], dtype, cupy.cuda.Device().attributes["L2CacheSize"])
    pull = pull_arrays(A, weighted, dtype, small=True, relabel=relabel)
    if pull is None:
        return None
    n, dtype = A.shape[0], np.dtype(dtype)
    x = node_vector(nstart, n, "nstart", dtype)
    p_d = node_vector(personalization, n, "personalization", dtype)
    d_d = p_d if dangling is None else node_vector(dangling, n, "dangling", dtype)
    if pull.order is not None:  # into the pull's numbering
        x, p_d = x[pull.order], p_d[pull.order]
        d_d = p_d if dangling is None else d_d[pull.order]
    inverse, is_dangling = pull.inverse.astype(dtype), pull.dangling.astype(dtype)
    limit = n * tol if tol_rule == "networkx" else tol
    ready = layout(pull.matrix, dtype, pull.pattern is not None)  # the kernel loaded (built once) before the clock
    cupy.cuda.Device().synchronize()
    t1 = time.perf_counter()
    run = iterate(ready, pull.matrix, pull.pattern, inverse, is_dangling, x, p_d, d_d, alpha, limit,
                  int(tol_rule == "per_node"), max_iter)
    t2 = time.perf_counter()
    if not run.error < limit:
        raise ConvergenceError(f"PageRank did not converge in {max_iter} iterations (last change {run.error:.3g}, "
                               f"rule {tol_rule!r}, tol {tol})")
    if pull.order is not None:  # back to the caller's numbering
        back = cupy.empty_like(x)
        back[pull.order] = x
        x = back
    ranks = device_reorder.download(x.astype(np.float64, copy=False))  # widened there, through pinned buffers
    info = IterationInfo(run.iterations, run.error, {"setup": t1 - t0, "iterations": t2 - t1,
                                                     "gather": time.perf_counter() - t2},
                         f"resident generic kernel on 1 GPU ({run.grid} blocks"
                         f"{', a chunk a warp and a node a thread, read once' if ready.single else ''}"
                         f"{', nodes by out-degree' if pull.order is not None else ''})")
    return (ranks, info) if return_info else ranks
