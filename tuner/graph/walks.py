"""Many random walks with restart at once on one GPU: one block of k columns, one walk each.

An iteration is three launches and no wait: the product pulled = Wᵀ cache of all k rank caches (the graph read
once for every walk), the update of every column (templates/walks_step.cu.j2: PageRank's step per column, the
next rank caches, each column's dangling sum and change) and the per-column reduction that records the iteration
at which a column met its tolerance. A column that met it is left as it is from then on, so each walk ends where
it would have ended alone; the host reads the columns' status an iteration behind the device (an asynchronous
copy to page-locked memory), and stops once every column has met it.

The product is chosen on the walk's own first iterations: each candidate (cuSPARSE's SpMM on the row-major
block, then each family of SpMMs of :mod:`tuner.spmm` for k columns, ``row_groups`` then ``row_tasks``, from
the most lanes per group down while fewer lanes pay) runs ``TUNING_REPEATS`` iterations, the last one timed, and the
fastest takes the rest; every one of those iterations is a step of the walk. Candidates sum a row's entries
in different orders (``row_tasks`` adds a long row's tasks atomically, in any order), so the last bits of a
result may depend on the one chosen and, with ``row_tasks``, on the run.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .. import codegen, spmm
from ..formats import device_reorder
from ..formats.xp import row_tasks
from .cusparse_products import CachedSpmm
from .device_pull import VALUE_CTYPES

STEP_BLOCK = 256
TUNING_REPEATS = 2  # iterations per candidate product while tuning: the first warms it up, the last is timed
CUSPARSE = "cusparse"  # the library's SpMM, a candidate beside ours
# n x k arrays held at once: two walks, the rank caches, the pull, the restart block, cuSPARSE's work space
VECTORS = 6


@dataclass(frozen=True)
class WalkRun:
    """How the walks of one block ended.

    Attributes:
        iterations: per column, the iteration whose change met the tolerance (0: none within ``max_iter``).
        errors: per column, that iteration's change (else the last one's), as the stopping rule measures it.
        product: the product the walk kept (:func:`tuner.spmm.label`, e.g. ``row_groups(lanes=..,block_size=..)``,
            or ``cusparse``).
        product_ms: milliseconds of each candidate's timed iteration product, by label.
        widths: the block's widths, first the caller's k, then each narrower one (:func:`walk_block`).
    """

    iterations: np.ndarray
    errors: np.ndarray
    product: str
    product_ms: dict = field(default_factory=dict)
    widths: tuple = ()


def step_source(dtype) -> tuple[str, str]:
    """The step kernels' name stem and CUDA source for values of ``dtype``.

    Example:
        >>> name, source = step_source(np.float64)
        >>> name, f"{name}_step(" in source and f"{name}_finish(" in source
        ('walks_float64', True)
    """
    dtype = np.dtype(dtype)
    if dtype not in VALUE_CTYPES:
        raise ValueError(f"the walks run in float32 or float64, got {dtype}")
    name = f"walks_{dtype.name}"
    return name, codegen.render("walks_step.cu.j2", dict(VAL=VALUE_CTYPES[dtype], block_size=STEP_BLOCK,
                                                         kernel_name=name))


def step_shape(n: int, k: int, sm_count: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """(grid, block) of the step: a block covers ``width`` columns (the power of two at least ``k``, at most
    32, so that a warp reads whole rows of a narrow block) of ``STEP_BLOCK / width`` rows; enough blocks for
    every row, at most four per SM (each adds one partial per column to the reduction).

    Example (132 SMs):
        >>> step_shape(10_000, 8, 132), step_shape(10**7, 40, 132)
        (((313, 1), (8, 32)), ((528, 2), (32, 8)))
    """
    width = spmm.column_pass(k)
    rows = STEP_BLOCK // width
    return (max(1, min(-(-n // rows), 4 * sm_count)), -(-k // width)), (width, rows)


def product_candidates(k: int) -> list:
    """The products a block of ``k`` columns tries, in the order it tries them: cuSPARSE, then each family of
    :data:`tuner.spmm.FAMILIES` from the most lanes per group to the fewest (:class:`_Tuning` stops going down
    a family once fewer lanes are slower).

    Example:
        >>> [label(c) for c in product_candidates(16)]  # doctest: +NORMALIZE_WHITESPACE
        ['cusparse', 'row_groups(lanes=32,block_size=128)', 'row_groups(lanes=32,block_size=256)',
         'row_groups(lanes=16,block_size=128)', 'row_groups(lanes=16,block_size=256)',
         'row_tasks(lanes=32,block_size=256,task_steps=32)', 'row_tasks(lanes=16,block_size=256,task_steps=32)']
    """
    return [CUSPARSE, *(p for family in spmm.FAMILIES.values()
                        for p in sorted(family(k), key=lambda p: (-p.lanes, p.block_size)))]


def fewer_lanes_may_pay(best_ms: dict, lanes: int) -> bool:
    """Whether a walk goes on to try products with fewer lanes per row than ``lanes``, from the best timed
    milliseconds of each lane count so far (``best_ms``): while ``lanes`` beat the next wider count (or none
    was timed). Fewer lanes per row idle fewer lanes on short rows and leave long rows to fewer lanes, one
    trade-off over the row lengths: once narrowing loses, narrowing further loses too.

    Example:
        >>> fewer_lanes_may_pay({32: 2.0}, 32), fewer_lanes_may_pay({32: 2.0, 16: 1.5}, 16)
        (True, True)
        >>> fewer_lanes_may_pay({32: 2.0, 16: 3.1}, 16)
        False
    """
    wider = [ms for w, ms in best_ms.items() if w > lanes]
    return not wider or best_ms[lanes] <= min(wider)


class _Tuning:
    """Which product each of a walk's first iterations runs: the candidates in turn, ``TUNING_REPEATS``
    iterations each (the last timed by CUDA events), skipping fewer lanes once they stop paying
    (:func:`fewer_lanes_may_pay`, within each family), then the fastest for the rest."""

    def __init__(self, cupy, candidates: list, repeats: int = TUNING_REPEATS):
        self.cupy, self.queue, self.repeats = cupy, list(candidates), repeats
        self.events, self.ms, self.current, self.count, self.chosen = {}, {}, None, 0, None

    def next(self) -> tuple:
        """(the candidate of the next iteration, whether to time its product)."""
        if self.chosen is not None:
            return self.chosen, False
        if self.current is None or self.count == self.repeats:
            if self.current is not None:
                self._timed(self.current)
            if not self.queue:
                self.chosen = min(self.ms, key=self.ms.get)
                return self.chosen, False
            self.current, self.count = self.queue.pop(0), 0
        self.count += 1
        return self.current, self.count == self.repeats

    def record(self, candidate, start, end) -> None:
        self.events[candidate] = (start, end)

    def _timed(self, candidate) -> None:
        start, end = self.events.pop(candidate)
        end.synchronize()
        self.ms[candidate] = self.cupy.cuda.get_elapsed_time(start, end)
        if candidate == CUSPARSE:
            return
        family = candidate.family
        best: dict = {}
        for c, ms in self.ms.items():
            if c != CUSPARSE and c.family == family:
                best[c.lanes] = min(ms, best.get(c.lanes, ms))
        level_done = not any(c != CUSPARSE and c.family == family and c.lanes == candidate.lanes for c in self.queue)
        if level_done and not fewer_lanes_may_pay(best, candidate.lanes):
            self.queue = [c for c in self.queue if c == CUSPARSE or c.family != family or c.lanes >= candidate.lanes]

    def finish(self) -> tuple:
        """(the product kept, or the one running where the walk ended first; each timed candidate's ms)."""
        for c in list(self.events):
            self._timed(c)
        return (self.chosen if self.chosen is not None else self.current), self.ms


def label(candidate) -> str:
    """A candidate product's name in reports.

    Example:
        >>> label(spmm.SpmmParams(8, 128)), label(CUSPARSE)
        ('row_groups(lanes=8,block_size=128)', 'cusparse')
    """
    return CUSPARSE if candidate == CUSPARSE else spmm.label(candidate)


def device_bytes(n: int, k: int, itemsize: int = 8) -> int:
    """Device memory a block of ``k`` walks over ``n`` nodes needs beside the graph.

    Example:
        >>> device_bytes(1000, 4)
        192000
    """
    return VECTORS * n * k * itemsize


def _functions(cupy, k: int, dtype, candidates: list) -> tuple:
    """(step, finish, {candidate: SpMM function}) on the current device, every source built at once by nvcc
    (in parallel, through the binary cache) the first time and loaded once per process
    (:func:`~tuner.graph.device_pull.device_modules`)."""
    from .device_pull import device_modules
    name, step = step_source(dtype)
    ours = [c for c in candidates if c != CUSPARSE]
    step_module, *modules = device_modules(cupy, [step] + [spmm.render(k, c, dtype, np.int32) for c in ours])
    return (step_module.get_function(f"{name}_step"), step_module.get_function(f"{name}_finish"),
            {c: module.get_function(spmm.KERNEL) for c, module in zip(ours, modules)})


def walk_block(pull, P, alpha: float, limit: float, max_rule: int, max_iter: int, candidates: list | None = None):
    """Walk every column of ``P`` (CuPy n x k, each column a restart distribution summing to 1, float64) on the
    graph of ``pull`` (:class:`~tuner.graph.device_pull.DevicePull`, in the caller's numbering) until each
    column's change (L1, or the largest with ``max_rule``) is below ``limit`` or ``max_iter`` iterations ran.
    Returns (the n x k visiting probabilities, a CuPy array, and a :class:`WalkRun`). Raises MemoryError where
    the block's arrays (:func:`device_bytes`) do not fit the free device memory. ``candidates``: the products
    to try (default :func:`product_candidates`).

    Where cuSPARSE's product was kept, whose time falls with the block's width, the walks still going move to a
    narrower block once at most half of them are (:class:`_Block`): walks of one seed set on a large graph stop
    ten or more iterations apart, and the stopped ones would otherwise be multiplied to the end.

    Example (on a GPU machine):
        >>> x, run = walk_block(pull_arrays(A, True, np.float64, small=True), P, 0.85, 1e-7, 1, 100)  # doctest: +SKIP
    """
    import cupy
    dtype = np.dtype(np.float64)
    T = pull.matrix
    n, k = int(P.shape[0]), int(P.shape[1])
    need = device_bytes(n, k, dtype.itemsize)
    free = device_reorder.free_bytes()
    if need > free:
        raise MemoryError(f"{k} walks over {n:,} nodes need {need:,} bytes of device memory beside the graph; "
                          f"{free:,} are free")
    candidates = product_candidates(k) if candidates is None else list(candidates)
    step_fn, finish_fn, ours = _functions(cupy, k, dtype, candidates)
    sm_count = cupy.cuda.Device().attributes["MultiProcessorCount"]
    inverse = pull.inverse.astype(dtype, copy=False)
    dangling = pull.dangling.astype(dtype)
    x = cupy.full((n, k), 1.0 / n, dtype)
    block = _Block(np.arange(k), x, x * inverse[:, None], P, cupy.full(k, float(dangling.sum()) / n), n, sm_count)
    out = cupy.empty((n, k), dtype)
    iterations, errors = np.zeros(k, np.int64), np.full(k, np.nan)
    indptr, indices, data = T.indptr, T.indices, T.data
    seen = [np.frombuffer(cupy.cuda.alloc_pinned_memory(16 * k), np.float64, 2 * k) for _ in range(2)]
    arrived = [None, None]
    stream = cupy.cuda.get_current_stream()
    tuning, readable, widths = _Tuning(cupy, candidates), False, [k]
    tasks: dict = {}  # row_tasks' arrays per task size, made on the device when first tried

    library = []  # cuSPARSE's SpMM on the row-major blocks, made when first tried

    def product(candidate):
        if candidate == CUSPARSE:
            if not library:
                T.has_canonical_format = True  # pull_arrays' Wᵀ is (said, not checked: CuPy's check builds kernels)
                library.append(CachedSpmm(T))
            library[0](block.cache, block.pulled)
            return block.pulled, block.k, 1
        entries = spmm.task_entries(k, candidate)
        if not entries:
            task_row, task_first, items = np.uint64(0), np.uint64(0), n
        else:
            if entries not in tasks:
                tasks[entries] = row_tasks(indptr, entries, np.int32)
            task_row, task_first, items = tasks[entries]
            block.pulled.fill(0)  # rows of no task keep the zeros, a shared row's tasks add into them
        ours[candidate]((max(1, spmm.grid(items, candidate)),), (candidate.block_size,),
                        (indptr, indices, data, block.cache, block.pulled, task_row, task_first, np.int64(items),
                         np.int64(block.k)))
        return block.pulled, block.k, 1

    iteration = 0
    for iteration in range(1, max_iter + 1):
        candidate, timed = tuning.next()
        if timed:
            start = stream.record()
        result, row_stride, col_stride = product(candidate)
        if timed:
            tuning.record(candidate, start, stream.record())
        (gx, gy), shape = block.shape
        step_fn((gx, gy), shape, (result, np.int64(row_stride), np.int64(col_stride), block.p, inverse, dangling,
                                  block.x, block.sums, block.status, block.x_new, block.cache, block.partials,
                                  np.int64(n), np.int32(block.k), np.float64(alpha), np.int32(max_rule)))
        finish_fn((block.k,), (STEP_BLOCK,), (block.partials, np.int64(gx), np.int32(block.k), block.sums,
                                              block.status, np.float64(limit), np.int64(iteration),
                                              np.int32(max_rule)))
        block.x, block.x_new = block.x_new, block.x
        slot = iteration % 2
        cupy.cuda.runtime.memcpyAsync(seen[slot].ctypes.data, block.status.data.ptr, 16 * block.k,
                                      cupy.cuda.runtime.memcpyDeviceToHost, stream.ptr)
        arrived[slot] = stream.record()
        if readable:  # the previous iteration's status, read while this one runs
            arrived[1 - slot].synchronize()
            going = int(np.count_nonzero(seen[1 - slot][:block.k] == 0))
            if going == 0:
                break
            if tuning.chosen == CUSPARSE and going <= block.k // 2:
                block = block.narrowed(out, iterations, errors)
                if block is None:
                    break
                widths.append(block.k)
                readable = False  # the copy queued above is of the wider block's status
                continue
        readable = True
    if block is not None:
        block.narrowed(out, iterations, errors, keep_going=False)
    chosen, timed_ms = tuning.finish()
    return out, WalkRun(iterations=iterations, errors=errors, product=label(chosen),
                        product_ms={label(c): float(ms) for c, ms in timed_ms.items()}, widths=tuple(widths))


class _Block:
    """The walks still going: their columns of the caller's block (``columns``), their probabilities, the next
    ones, rank caches, restart distributions, dangling sums and status (templates/walks_step.cu.j2), and the
    step's grid and partials for their width."""

    def __init__(self, columns: np.ndarray, x, cache, p, sums, n: int, sm_count: int):
        import cupy
        self.columns, self.x, self.cache, self.p, self.sums = columns, x, cache, p, sums
        self.n, self.sm_count, self.k = n, sm_count, int(columns.size)
        self.x_new, self.pulled = cupy.empty_like(x), cupy.empty_like(x)
        self.status = cupy.zeros(2 * self.k, np.float64)
        self.shape = step_shape(n, self.k, sm_count)
        self.partials = cupy.empty(2 * self.k * self.shape[0][0], np.float64)

    def narrowed(self, out, iterations: np.ndarray, errors: np.ndarray, keep_going: bool = True):
        """Write the stopped walks (per the status after every iteration queued) into their columns of ``out``,
        ``iterations`` and ``errors``, and return the block of the others; None where none is left, or without
        ``keep_going`` (every walk is then written, stopped or not)."""
        import cupy
        status = self.status.get()  # waits for the iterations queued
        stopped = status[:self.k] != 0 if keep_going else np.ones(self.k, bool)
        at = np.flatnonzero(stopped)
        done = self.columns[at]
        out[:, cupy.asarray(done)] = self.x[:, cupy.asarray(at)]
        iterations[done] = status[:self.k][at].astype(np.int64)
        errors[done] = status[self.k:][at]
        if stopped.all():
            return None
        going = cupy.asarray(np.flatnonzero(~stopped))
        return _Block(self.columns[~stopped], cupy.ascontiguousarray(self.x[:, going]),
                      cupy.ascontiguousarray(self.cache[:, going]), cupy.ascontiguousarray(self.p[:, going]),
                      self.sums[going].copy(), self.n, self.sm_count)

