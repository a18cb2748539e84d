"""SpMM: Y = A X for a block of a few dense columns (the multi-vector product of batched random walks).

``tuner.compile(A, X)`` with a dense ``X`` (n_cols x k) lands here. One kernel (templates/spmm.cu.j2), two
families (:data:`FAMILIES`): ``row_groups`` gives each row a group of lanes, ``row_tasks`` each task of a row
(up to ``task_steps`` entries per entry stream, :func:`task_entries`), so that a hub's row of a power-law graph
is spread over many groups instead of walked by one while the rest of the grid idles. A group's lanes are
``KP`` per column pass (a power of two up to 32, so that a pass reads one entry's KP consecutive values of X
at once) times ``lanes / KP`` entry streams, whose sums are added with shuffles. The parameters are tuned by
timing every candidate of both families on the product itself, a dozen or so for any k, once per structure,
block width and GPU: the choice is kept in the plan cache.
"""
from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

import numpy as np

from . import codegen, gpu
from .cache import Cache, make_key
from .families.base import CTYPES
from .formats.xp import row_tasks
from .kernel import launch_on_views
from .matrix import MatrixError, canonicalize, structure_digest

log = logging.getLogger("tuner.spmm")

TEMPLATE = "spmm.cu.j2"
KERNEL = "spmm_row_groups"
SIGNATURE = "PPPPPPPqq"  # indptr, indices, data, x, y, task_row, task_first, items, k
BLOCK_SIZES = (128, 256)
TASK_BLOCK = 256
TASK_STEPS = 32  # a row_tasks group's steps along each entry stream: a task's chain of dependent adds
TIMING_REPEATS = 20


@dataclass(frozen=True)
class SpmmParams:
    """The kernel's parameters.

    Attributes:
        lanes: lanes per group: the column pass width (:func:`column_pass`) times the entry streams, at most 32.
        block_size: threads per block.
        task_steps: 0 for a group per row (``row_groups``); else a group per task of up to ``task_steps``
            entries per entry stream of one row (``row_tasks``, :func:`task_entries`).
    """

    lanes: int
    block_size: int
    task_steps: int = 0

    @property
    def family(self) -> str:
        return "row_tasks" if self.task_steps else "row_groups"


def column_pass(k: int) -> int:
    """Columns one pass of a row's lanes covers: the power of two at least ``k``, at most 32.

    Example:
        >>> [column_pass(k) for k in (1, 3, 8, 20, 32, 100)]
        [1, 4, 8, 32, 32, 32]
    """
    return min(32, 1 << max(0, int(k) - 1).bit_length())


def lane_counts(k: int) -> list[int]:
    """Lanes per group for a block of ``k`` columns: one column pass, then doubling up to a warp.

    Example:
        >>> lane_counts(3), lane_counts(40)
        ([4, 8, 16, 32], [32])
    """
    out, lanes = [], column_pass(k)
    while lanes <= 32:
        out.append(lanes)
        lanes *= 2
    return out


def row_groups_candidates(k: int) -> list[SpmmParams]:
    """``row_groups``' parameter sets for ``k`` columns: every lane count, each block size.

    Example:
        >>> [(p.lanes, p.block_size) for p in row_groups_candidates(16)]
        [(16, 128), (16, 256), (32, 128), (32, 256)]
    """
    return [SpmmParams(lanes, b) for lanes in lane_counts(k) for b in BLOCK_SIZES]


def row_tasks_candidates(k: int) -> list[SpmmParams]:
    """``row_tasks``' parameter sets for ``k`` columns: every lane count, tasks of :data:`TASK_STEPS` steps.

    Example:
        >>> [(p.lanes, p.task_steps) for p in row_tasks_candidates(16)]
        [(16, 32), (32, 32)]
    """
    return [SpmmParams(lanes, TASK_BLOCK, TASK_STEPS) for lanes in lane_counts(k)]


FAMILIES = {"row_groups": row_groups_candidates, "row_tasks": row_tasks_candidates}


def candidates(k: int) -> list[SpmmParams]:
    """Every parameter set of every family (:data:`FAMILIES`) for a block of ``k`` columns.

    Example:
        >>> [label(p) for p in candidates(32)]  # doctest: +NORMALIZE_WHITESPACE
        ['row_groups(lanes=32,block_size=128)', 'row_groups(lanes=32,block_size=256)',
         'row_tasks(lanes=32,block_size=256,task_steps=32)']
    """
    return [p for family in FAMILIES.values() for p in family(k)]


def label(params: SpmmParams) -> str:
    """A candidate's name in plans and reports.

    Example:
        >>> label(SpmmParams(8, 128)), label(SpmmParams(8, 256, 32))
        ('row_groups(lanes=8,block_size=128)', 'row_tasks(lanes=8,block_size=256,task_steps=32)')
    """
    steps = f",task_steps={params.task_steps}" if params.task_steps else ""
    return f"{params.family}(lanes={params.lanes},block_size={params.block_size}{steps})"


def task_entries(k: int, params: SpmmParams) -> int:
    """Entries of one task of ``row_tasks`` (0 for ``row_groups``): ``task_steps`` along each entry stream.

    Example:
        >>> task_entries(4, SpmmParams(32, 256, 32)), task_entries(4, SpmmParams(4, 256, 32))
        (256, 32)
    """
    return params.task_steps * (params.lanes // column_pass(k))


def render(k: int, params: SpmmParams, value_dtype, index_dtype) -> str:
    """The CUDA source of one specialisation; parameters that are not a candidate for ``k`` columns
    (:func:`candidates`) are refused: fewer lanes than a column pass would leave the kernel no entry stream,
    and its loop over a row's entries would never end.

    Example:
        >>> "#define LANES 8" in render(4, SpmmParams(8, 128), np.float32, np.int32)
        True
        >>> "#define TASK 64" in render(4, SpmmParams(8, 256, 32), np.float32, np.int32)
        True
        >>> render(40, SpmmParams(16, 128), np.float32, np.int32)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: SpmmParams(lanes=16, block_size=128, task_steps=0) is not a candidate for 40 columns: ...
    """
    if params not in candidates(k):
        raise ValueError(f"{params} is not a candidate for {k} columns: {[label(p) for p in candidates(k)]}")
    return codegen.render(TEMPLATE, dict(VAL=CTYPES[np.dtype(value_dtype)], IDX=CTYPES[np.dtype(index_dtype)],
                                         K=compiled_width(k), KP=column_pass(k), LANES=params.lanes,
                                         task=task_entries(k, params), block_size=params.block_size,
                                         kernel_name=KERNEL))


def compiled_width(k: int) -> int:
    """The block width a binary is compiled for: ``k`` up to one column pass of a warp (32), else 0 (the
    width read at run time, so that blocks wider than a pass share one binary instead of building one each).

    Example:
        >>> [compiled_width(k) for k in (1, 32, 33, 4096)]
        [1, 32, 0, 0]
    """
    return int(k) if k <= 32 else 0


def grid(items: int, params: SpmmParams) -> int:
    """Blocks of a launch over ``items`` work items (rows, or tasks for ``row_tasks``): ``lanes`` threads each.

    Example:
        >>> grid(1000, SpmmParams(8, 256))
        32
    """
    return -(-int(items) * params.lanes // params.block_size)


def check_block(X, n_rows: int, dtype, what: str = "X") -> tuple[int, int]:
    """(rows, columns) of a dense block after checking it: 2-D, ``n_rows`` rows, at least one column, real
    values that cast to ``dtype`` within their kind.

    Example:
        >>> check_block(np.zeros((5, 3)), 5, np.float32)
        (5, 3)
        >>> check_block(np.zeros(5), 5, np.float32)
        Traceback (most recent call last):
        ...
        tuner.matrix.MatrixError: X must be a 2-D block of column vectors (n x k), got shape (5,)
    """
    shape = tuple(int(v) for v in X.shape)
    if len(shape) != 2:
        raise MatrixError(f"{what} must be a 2-D block of column vectors (n x k), got shape {shape}")
    if shape[0] != n_rows:
        raise MatrixError(f"{what} has {shape[0]} rows, but A has {n_rows} columns")
    if shape[1] < 1:
        raise MatrixError(f"{what} has no columns")
    kind = np.dtype(X.dtype)
    if kind.kind not in "fiub" or not np.can_cast(kind, dtype, "same_kind"):
        raise MatrixError(f"{what} has dtype {kind}: the product takes real values cast to {np.dtype(dtype)}")
    return shape


class SpMM:
    """Y = A X on the GPU for blocks X of ``k`` columns, A uploaded once.

    ``spmm()`` multiplies the block compiled with, ``spmm(X)`` another one of the same shape (``row_tasks``
    zeroes Y first where some row has no task or several). NumPy in,
    NumPy out; a device array (CuPy, PyTorch: C-contiguous, n_cols x k) in, a device array of the same kind
    out (or ``out=``), nothing copied.

    Attributes:
        shape: (n_rows, n_cols) of A; k: columns of a block; dtype: of A, X and Y.
        params: the :class:`SpmmParams` compiled; plan: how they were chosen (each candidate's ms when timed).

    Example (on a GPU machine):
        >>> import numpy as np, scipy.sparse as sp, tuner                 # doctest: +SKIP
        >>> A = sp.random(1000, 1000, density=0.01, format="csr")          # doctest: +SKIP
        >>> X = np.random.default_rng(0).random((1000, 8))                 # doctest: +SKIP
        >>> np.allclose(tuner.compile(A, X)(), A @ X)                      # doctest: +SKIP
        True
    """

    def __init__(self, m, k: int, params: SpmmParams, cubin: bytes, X=None, operands: "_Operands | None" = None,
                 plan: dict | None = None):
        self.shape, self.k, self.dtype, self.params = m.shape, int(k), m.value_dtype, params
        self.plan = plan or {"params": asdict(params), "tune": "fixed"}
        # The matrix's device arrays, shared by the candidates a tuning times.
        self._operands = operands or _Operands(m)
        self._work = self._operands.work(task_entries(self.k, params))
        self._kernel = gpu.Kernel(cubin, KERNEL, SIGNATURE)
        self._staging = None  # device X and Y for host blocks and timing: made on first use (device callers
        # bring their own, and would otherwise hold a second X and Y for nothing)
        self._block = None if X is None else np.ascontiguousarray(X, dtype=self.dtype)

    def _buffers(self) -> tuple:
        """Device X and Y of one block, allocated on first use after checking they fit."""
        if self._staging is None:
            need = (self.shape[0] + self.shape[1]) * self.k * self.dtype.itemsize
            if need > gpu.free_memory(release_pool=True):
                raise MatrixError(f"the product needs {need:,} bytes of GPU memory for X and Y, "
                                  f"{gpu.free_memory():,} are free")
            self._staging = (gpu.alloc(self.shape[1] * self.k * self.dtype.itemsize),
                             gpu.alloc(self.shape[0] * self.k * self.dtype.itemsize))
        return self._staging

    def launch(self, x_ptr: int, y_ptr: int) -> None:
        """The product on device pointers (no checks: for timing loops and iterative solvers)."""
        task_row, task_first, items, zero = self._work
        if zero:  # rows without a task keep these zeros; a shared row's tasks add into them
            gpu.zero_async(y_ptr, self.shape[0] * self.k * self.dtype.itemsize)
        self._kernel.launch(grid(items, self.params), self.params.block_size, *self._operands.arrays, x_ptr, y_ptr,
                            task_row, task_first, np.int64(items), np.int64(self.k))

    def __call__(self, X=None, out=None):
        if X is None:
            if self._block is None:
                raise MatrixError("this product was compiled without a block: pass X")
            X = self._block
        if gpu.is_device_array(X):
            return self._call_device(X, out)
        X = np.asarray(X)
        check_block(X, self.shape[1], self.dtype)
        if X.shape[1] != self.k:
            raise MatrixError(f"X has {X.shape[1]} columns, the product was compiled for {self.k}")
        if out is None:
            out = np.empty((self.shape[0], self.k), self.dtype)
        elif not (isinstance(out, np.ndarray) and out.shape == (self.shape[0], self.k) and out.dtype == self.dtype
                  and out.flags.c_contiguous and out.flags.writeable):
            raise MatrixError(f"out must be a writeable C-contiguous {self.dtype} array of shape "
                              f"{(self.shape[0], self.k)}")
        gpu.ensure_context()
        x, y = self._buffers()
        gpu.copy_to_device(int(x), np.ascontiguousarray(X, dtype=self.dtype))
        self.launch(int(x), int(y))
        gpu.copy_to_host(out, int(y))
        return out

    def _call_device(self, X, out):
        xv = gpu.view(X)
        check_block(xv, self.shape[1], self.dtype)
        if xv.shape[1] != self.k or xv.dtype != self.dtype:
            raise MatrixError(f"X is a {xv.shape} {xv.dtype} block, the product takes ({self.shape[1]}, {self.k}) "
                              f"{self.dtype}")
        if out is None:
            out = gpu.empty_like_kind(X, (self.shape[0], self.k), self.dtype)
        ov = gpu.view(out)
        if ov.shape != (self.shape[0], self.k) or ov.dtype != self.dtype or ov.readonly:
            raise MatrixError(f"out must be a writeable ({self.shape[0]}, {self.k}) {self.dtype} device array")
        row = self.k * self.dtype.itemsize
        launch_on_views(self.launch, xv, ov, xv.shape[0] * row, ov.shape[0] * row, "X")
        return out

    def time(self, repeats: int = TIMING_REPEATS, warmup: int = 3, seed: int = 0) -> float:
        """Median milliseconds of one product (CUDA events after warm-up) on a random block."""
        block = np.random.default_rng(seed).uniform(-1, 1, (self.shape[1], self.k)).astype(self.dtype)
        x, y = self._buffers()
        gpu.copy_to_device(int(x), block)
        return float(np.median(gpu.time_launches(lambda: self.launch(int(x), int(y)), repeats, warmup)))

    def __repr__(self) -> str:
        return f"<SpMM {self.shape[0]}x{self.shape[1]} by {self.k} columns {self.dtype.name} {label(self.params)}>"


class _Operands:
    """A's arrays on the device, shared by the candidates a tuning times, and ``row_tasks``' task arrays for each
    task size, made on first use (:func:`~tuner.formats.xp.row_tasks` on the host, then uploaded)."""

    def __init__(self, m):
        need = _matrix_bytes(m)
        if need > gpu.free_memory(release_pool=True):
            raise MatrixError(f"the product needs {need:,} bytes of GPU memory for A, "
                              f"{gpu.free_memory():,} are free")
        self._arrays = tuple(gpu.upload(np.ascontiguousarray(a)) for a in (m.indptr, m.indices, m.data))
        self.arrays = tuple(int(a) for a in self._arrays)
        # The row pointers alone stay on the host, for the task arrays of a size asked for later.
        self._indptr, self._index_dtype, self._rows = np.asarray(m.indptr), m.index_dtype, m.n_rows
        self._tasks: dict[int, tuple] = {}

    def work(self, entries: int) -> tuple[int, int, int, bool]:
        """(task_row pointer, task_first pointer, work items, whether Y is zeroed first) of a launch whose
        groups take tasks of up to ``entries`` entries; ``entries`` 0: a group a row (no task arrays)."""
        if not entries:
            return 0, 0, self._rows, False
        if entries not in self._tasks:
            idx = self._index_dtype
            row, first, tasks = row_tasks(self._indptr, entries, idx)
            need = (row.size + first.size) * idx.itemsize
            if need > gpu.free_memory(release_pool=True):
                raise MatrixError(f"the row tasks need {need:,} bytes of GPU memory, {gpu.free_memory():,} are free")
            zero = bool(np.any(np.diff(first) != 1))
            # An empty array cannot be uploaded; a launch of no tasks reads none of it.
            device = tuple(gpu.upload(a if a.size else np.zeros(1, idx)) for a in (row, first))
            self._tasks[entries] = (device, tasks, zero)
        (row, first), tasks, zero = self._tasks[entries]
        return int(row), int(first), tasks, zero

    def keep(self, entries: int) -> None:
        """Free the task arrays of every task size but ``entries`` (once a tuning has chosen)."""
        self._tasks = {e: t for e, t in self._tasks.items() if e == entries}


def _matrix_bytes(m) -> int:
    return m.indptr.nbytes + m.indices.nbytes + m.nnz * m.value_dtype.itemsize


def compile_spmm(A, X, *, dtype=None, index_dtype=None, params: dict | None = None, cache_dir=None) -> SpMM:
    """Compile Y = A X for dense blocks X shaped like ``X`` (n_cols x k) on this GPU.

    ``params`` ({'lanes': ..., 'block_size': ..., 'task_steps': ...}: :class:`SpmmParams`; task_steps 0 or
    left out: ``row_groups``) skips the tuning; otherwise every candidate of both families is timed on A once
    per structure, block width, value type and GPU, and the fastest kept in the plan cache (``cache_dir``: see
    :func:`tuner.compile`). ``dtype``: of A's values, X and Y (default: A's, as SpMV's).

    Example (on a GPU machine):
        >>> spmm = compile_spmm(A, np.ones((A.shape[1], 4)))   # doctest: +SKIP
        >>> spmm.plan["tune"]                                  # doctest: +SKIP
        'measure'
    """
    m = canonicalize(A, dtype, index_dtype)
    X = X if gpu.is_device_array(X) else np.asarray(X)
    _, k = check_block(X, m.n_cols, m.value_dtype)
    info = gpu.device_info()
    cache = Cache(cache_dir)
    operands = None
    if params is not None:
        chosen, plan = SpmmParams(**params), None
        if chosen not in candidates(k):
            raise ValueError(f"{chosen} is not a candidate for {k} columns: {candidates(k)}")
    else:
        key = make_key("spmm-plan", structure_digest(m), k, m.value_dtype.name, info.name, info.capability,
                       ",".join(FAMILIES))
        plan = cache.get_json("plan", key)
        if plan is not None:
            chosen = SpmmParams(**plan["params"])
        else:
            chosen, plan, operands = _tuned(m, k, info.arch, cache)
            cache.put_json("plan", key, plan)
    cubin = codegen.compile_source(render(k, chosen, m.value_dtype, m.index_dtype), info.arch, cache=cache).cubin
    return SpMM(m, k, chosen, cubin, X=None if gpu.is_device_array(X) else X, operands=operands, plan=plan)


def _tuned(m, k: int, arch: str, cache: Cache) -> tuple[SpmmParams, dict, _Operands]:
    """Every candidate timed on ``m`` (one upload shared): the fastest, the plan recording them all, and the
    device operands (the chosen task size's arrays kept)."""
    specs = candidates(k)
    binaries = codegen.compile_many([render(k, p, m.value_dtype, m.index_dtype) for p in specs], arch, cache=cache)
    operands, times = _Operands(m), {}
    for p, b in zip(specs, binaries):
        times[p] = SpMM(m, k, p, b.cubin, operands=operands).time()
    best = min(times, key=times.get)
    operands.keep(task_entries(k, best))
    return best, {"params": asdict(best), "tune": "measure",
                  "measured_ms": [[asdict(p), ms] for p, ms in sorted(times.items(), key=lambda t: t[1])]}, operands


def evaluate(m, X: np.ndarray, params: SpmmParams) -> np.ndarray:
    """What the kernel computes, in NumPy (float64), from the same indexing: each work item's (a row's, or a
    task's of ``row_tasks``) entries, each column's sum over every entry stream of the item, the streams' sums
    then added as the shuffles add them and the items' sums into their rows (zero for a row of none). For
    the CPU tests of the template's indexing; raises RuntimeError where the items do not cover every entry
    exactly once.

    Example:
        >>> import scipy.sparse as sp
        >>> m = canonicalize(sp.csr_matrix(np.array([[1.0, 2.0], [0.0, 3.0]])))
        >>> evaluate(m, np.array([[1.0, 10.0], [2.0, 20.0]]), SpmmParams(4, 128)).tolist()
        [[5.0, 50.0], [6.0, 60.0]]
        >>> evaluate(m, np.array([[1.0, 10.0], [2.0, 20.0]]), SpmmParams(2, 256, 1)).tolist()
        [[5.0, 50.0], [6.0, 60.0]]
    """
    k = X.shape[1]
    streams = params.lanes // column_pass(k)
    indptr = np.asarray(m.indptr, np.int64)
    entries = task_entries(k, params)
    if entries:  # the kernel's task arithmetic
        item_row, first, items = row_tasks(indptr, entries, np.int64)
        start = indptr[item_row] + (np.arange(items) - first[item_row]) * entries
        end = np.minimum(start + entries, indptr[item_row + 1])
    else:
        item_row, start, end = np.arange(m.n_rows), indptr[:-1], indptr[1:]
    lengths = np.maximum(end - start, 0)
    item = np.repeat(np.arange(item_row.size), lengths)
    offset = np.arange(item.size) - np.repeat(np.cumsum(lengths) - lengths, lengths)  # within its item
    pos = start[item] + offset
    if not np.array_equal(np.sort(pos), np.arange(m.nnz)):
        raise RuntimeError(f"the work items of {label(params)} do not cover every entry exactly once")
    stream = offset % streams
    data, indices = np.asarray(m.data, np.float64), np.asarray(m.indices)
    partial = np.zeros((streams, item_row.size, k))
    for s in range(streams):  # a handful of streams: each a vectorised pass over its entries
        mine = stream == s
        np.add.at(partial[s], item[mine], data[pos[mine], None] * X[indices[pos[mine]]])
    y = np.zeros((m.n_rows, k))
    np.add.at(y, item_row, partial.sum(axis=0))
    return y
