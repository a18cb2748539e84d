"""SpMM: Y = A X for a block of a few dense columns (the multi-vector product of batched random walks).

``tuner.compile(A, X)`` with a dense ``X`` (n_cols x k) lands here. One family, ``row_groups``
(templates/spmm.cu.j2): a group of lanes per row, ``KP`` of them per column pass (a power of two up to 32,
so that a pass reads one entry's KP consecutive values of X at once) and ``lanes / KP`` entry streams per row
whose sums are added with shuffles. Its parameters (lanes per row, block size) are tuned by timing every
candidate on the product itself, a handful for any k, once per structure, block width and GPU: the choice is
kept in the plan cache.
"""
from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

import numpy as np

from . import codegen, gpu
from .cache import Cache, make_key
from .families.base import CTYPES
from .kernel import launch_on_views
from .matrix import MatrixError, canonicalize, structure_digest

log = logging.getLogger("tuner.spmm")

TEMPLATE = "spmm.cu.j2"
KERNEL = "spmm_row_groups"
BLOCK_SIZES = (128, 256)
TIMING_REPEATS = 20


@dataclass(frozen=True)
class SpmmParams:
    """The ``row_groups`` kernel's parameters.

    Attributes:
        lanes: lanes per row: the column pass width (:func:`column_pass`) times the entry streams, at most 32.
        block_size: threads per block.
    """

    lanes: int
    block_size: int


def column_pass(k: int) -> int:
    """Columns one pass of a row's lanes covers: the power of two at least ``k``, at most 32.

    Example:
        >>> [column_pass(k) for k in (1, 3, 8, 20, 32, 100)]
        [1, 4, 8, 32, 32, 32]
    """
    return min(32, 1 << max(0, int(k) - 1).bit_length())


def candidates(k: int) -> list[SpmmParams]:
    """Every parameter set for a block of ``k`` columns: lanes from one column pass to a warp, each block size.

    Example:
        >>> [(p.lanes, p.block_size) for p in candidates(16)]
        [(16, 128), (16, 256), (32, 128), (32, 256)]
    """
    kp, out = column_pass(k), []
    lanes = kp
    while lanes <= 32:
        out += [SpmmParams(lanes, b) for b in BLOCK_SIZES]
        lanes *= 2
    return out


def render(k: int, params: SpmmParams, value_dtype, index_dtype) -> str:
    """The CUDA source of one specialisation; parameters that are not a candidate for ``k`` columns
    (:func:`candidates`) are refused: fewer lanes than a column pass would leave the kernel no entry stream,
    and its loop over a row's entries would never end.

    Example:
        >>> "#define LANES 8" in render(4, SpmmParams(8, 128), np.float32, np.int32)
        True
        >>> render(40, SpmmParams(16, 128), np.float32, np.int32)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: SpmmParams(lanes=16, block_size=128) is not a candidate for 40 columns: lanes from 32 to 32 ...
    """
    if params not in candidates(k):
        raise ValueError(f"{params} is not a candidate for {k} columns: lanes from {column_pass(k)} to 32 in powers "
                         f"of two, blocks of {BLOCK_SIZES}")
    return codegen.render(TEMPLATE, dict(VAL=CTYPES[np.dtype(value_dtype)], IDX=CTYPES[np.dtype(index_dtype)],
                                         K=compiled_width(k), KP=column_pass(k), LANES=params.lanes,
                                         block_size=params.block_size, kernel_name=KERNEL))


def compiled_width(k: int) -> int:
    """The block width a binary is compiled for: ``k`` up to one column pass of a warp (32), else 0 (the
    width read at run time, so that blocks wider than a pass share one binary instead of building one each).

    Example:
        >>> [compiled_width(k) for k in (1, 32, 33, 4096)]
        [1, 32, 0, 0]
    """
    return int(k) if k <= 32 else 0


def grid(n_rows: int, params: SpmmParams) -> int:
    """Blocks of a launch: ``lanes`` threads per row.

    Example:
        >>> grid(1000, SpmmParams(8, 256))
        32
    """
    return -(-int(n_rows) * params.lanes // params.block_size)


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

    ``spmm()`` multiplies the block compiled with, ``spmm(X)`` another one of the same shape. NumPy in,
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

    def __init__(self, m, k: int, params: SpmmParams, cubin: bytes, X=None, arrays=None, plan: dict | None = None):
        self.shape, self.k, self.dtype, self.params = m.shape, int(k), m.value_dtype, params
        self.plan = plan or {"params": asdict(params), "tune": "fixed"}
        need = 0 if arrays else _matrix_bytes(m)
        if need > gpu.free_memory(release_pool=True):
            raise MatrixError(f"the product needs {need:,} bytes of GPU memory for A, "
                              f"{gpu.free_memory():,} are free")
        # The matrix's device arrays, shared by the candidates a tuning times.
        self._arrays = arrays or tuple(gpu.upload(np.ascontiguousarray(a)) for a in (m.indptr, m.indices, m.data))
        self._kernel = gpu.Kernel(cubin, KERNEL, "PPPPPqq")
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
        self._kernel.launch(grid(self.shape[0], self.params), self.params.block_size,
                            *(int(a) for a in self._arrays), x_ptr, y_ptr, np.int64(self.shape[0]), np.int64(self.k))

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
        return f"<SpMM {self.shape[0]}x{self.shape[1]} by {self.k} columns {self.dtype.name} {self.params}>"


def _matrix_bytes(m) -> int:
    return m.indptr.nbytes + m.indices.nbytes + m.nnz * m.value_dtype.itemsize


def compile_spmm(A, X, *, dtype=None, index_dtype=None, params: dict | None = None, cache_dir=None) -> SpMM:
    """Compile Y = A X for dense blocks X shaped like ``X`` (n_cols x k) on this GPU.

    ``params`` ({'lanes': ..., 'block_size': ...}) skips the tuning; otherwise every candidate is timed on
    A once per structure, block width, value type and GPU, and the fastest kept in the plan cache
    (``cache_dir``: see :func:`tuner.compile`). ``dtype``: of A's values, X and Y (default: A's, as SpMV's).

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
    if params is not None:
        chosen, plan = SpmmParams(**params), None
        if chosen not in candidates(k):
            raise ValueError(f"{chosen} is not a candidate for {k} columns: {candidates(k)}")
    else:
        key = make_key("spmm-plan", structure_digest(m), k, m.value_dtype.name, info.name, info.capability)
        plan = cache.get_json("plan", key)
        if plan is not None:
            chosen = SpmmParams(**plan["params"])
        else:
            chosen, plan = _tuned(m, k, info.arch, cache)
            cache.put_json("plan", key, plan)
    cubin = codegen.compile_source(render(k, chosen, m.value_dtype, m.index_dtype), info.arch, cache=cache).cubin
    return SpMM(m, k, chosen, cubin, X=None if gpu.is_device_array(X) else X, plan=plan)


def _tuned(m, k: int, arch: str, cache: Cache) -> tuple[SpmmParams, dict]:
    """Every candidate timed on ``m`` (one upload shared): the fastest and the plan recording them all."""
    specs = candidates(k)
    binaries = codegen.compile_many([render(k, p, m.value_dtype, m.index_dtype) for p in specs], arch, cache=cache)
    arrays, times = None, {}
    for p, b in zip(specs, binaries):
        product = SpMM(m, k, p, b.cubin, arrays=arrays)
        arrays = product._arrays
        times[p] = product.time()
    best = min(times, key=times.get)
    return best, {"params": asdict(best), "tune": "measure",
                  "measured_ms": [[asdict(p), ms] for p, ms in sorted(times.items(), key=lambda t: t[1])]}


def evaluate(m, X: np.ndarray, params: SpmmParams) -> np.ndarray:
    """What the kernel computes, in NumPy (float64): each column's sum over every entry stream of a row,
    the streams' sums then added as the shuffles add them. For the CPU tests of the template's indexing.

    Example:
        >>> import scipy.sparse as sp
        >>> m = canonicalize(sp.csr_matrix(np.array([[1.0, 2.0], [0.0, 3.0]])))
        >>> evaluate(m, np.array([[1.0, 10.0], [2.0, 20.0]]), SpmmParams(4, 128)).tolist()
        [[5.0, 50.0], [6.0, 60.0]]
    """
    k = X.shape[1]
    streams = params.lanes // column_pass(k)
    rows = np.repeat(np.arange(m.n_rows), np.diff(m.indptr))
    stream = (np.arange(m.nnz) - np.asarray(m.indptr)[rows]) % streams  # which stream takes each entry
    partial = np.zeros((streams, m.n_rows, k))
    for s in range(streams):  # a handful of streams: each a vectorised pass over its entries
        at = stream == s
        np.add.at(partial[s], rows[at], np.asarray(m.data, np.float64)[at, None] * X[np.asarray(m.indices)[at]])
    return partial.sum(axis=0)
