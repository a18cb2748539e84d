"""The callables :func:`tuner.compile` returns: a loaded kernel bound to the matrix's device arrays."""
from __future__ import annotations

import copy
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from . import families, gpu
from .families.base import Launch, Specialization, ceil_div
from .matrix import CanonicalMatrix, MatrixError, check_vector_dtype, check_vector_shape

SIGNATURE_CODES = {np.dtype(np.float32): "f", np.dtype(np.float64): "d"}


class DeviceArrays:
    """Device copies of host arrays, uploaded once each and shared by every kernel that reads them; device
    arrays (a layout built on the GPU) are used where they are, and held as long as the copies."""

    def __init__(self):
        self._buffers: dict[int, tuple[np.ndarray, object]] = {}

    def pointer(self, array) -> int:
        hit = self._buffers.get(id(array))
        if hit is None or hit[0] is not array:
            ptr = gpu.view(array).ptr if gpu.is_device_array(array) else gpu.upload(array)
            hit = (array, ptr)  # keeping the array alive keeps its id unique
            self._buffers[id(array)] = hit
        return int(hit[1])


class VectorCalls:
    """``product(x)`` and ``product(x, out=y)`` on NumPy vectors (copied in and out through the product's own
    ``_x_buf`` and ``_y_buf``) or contiguous device vectors (used in place), checked, around the product's
    ``launch(x_ptr, y_ptr)``; ``shape`` and ``dtype`` are the matrix's."""

    def __call__(self, x, out=None):
        if gpu.is_device_array(x):
            return self._call_device(x, out)
        if out is not None and not isinstance(out, np.ndarray):
            raise MatrixError(f"out must be a NumPy array when x is one, got {type(out).__name__}")
        x = np.asarray(x)
        check_vector_shape(x.shape, self.shape[1], "x")
        check_vector_dtype(x.dtype, self.dtype, "x", allow_safe_cast=True)
        if out is None:
            out = np.empty(self.shape[0], self.dtype)
        else:
            check_vector_shape(out.shape, self.shape[0], "out")
            check_vector_dtype(out.dtype, self.dtype, "out")
            if not (out.flags.c_contiguous and out.flags.writeable):
                raise MatrixError("out must be a contiguous, writeable array")
        gpu.ensure_context()
        gpu.copy_to_device(int(self._x_buf), np.ascontiguousarray(x, dtype=self.dtype))
        self.launch(int(self._x_buf), int(self._y_buf))
        gpu.copy_to_host(out, int(self._y_buf))
        return out

    def _call_device(self, x, out):
        xv = gpu.view(x)
        check_vector_shape(xv.shape, self.shape[1], "x")
        check_vector_dtype(xv.dtype, self.dtype, "x")
        if out is None:
            out = gpu.empty_like_kind(x, self.shape[0], self.dtype)
        elif not gpu.is_device_array(out):
            raise MatrixError(f"out must be a device array when x is one, got {type(out).__name__}")
        ov = gpu.view(out)
        check_vector_shape(ov.shape, self.shape[0], "out")
        check_vector_dtype(ov.dtype, self.dtype, "out")
        if ov.readonly:
            raise MatrixError("out is read-only")
        size = self.dtype.itemsize
        launch_on_views(self.launch, xv, ov, xv.shape[0] * size, ov.shape[0] * size, "x")
        return out


class SpMV(VectorCalls):
    """y = A @ x on the GPU with one tuned kernel.

    Call it with a NumPy vector (copied in and out) or a contiguous device vector of CuPy, PyTorch or
    PyCUDA (used in place, no copy); the result is of the same kind. ``out=`` takes a preallocated result
    of the same kind.

    Attributes:
        plan: the :class:`~tuner.planner.Plan` this kernel was built from.
        shape, dtype: of the matrix the kernel multiplies by.
        layout_source: how its layout came: 'device' (built on the GPU), 'built' (on the host), 'stored'
            (built on the host and kept in the cache) or 'loaded' (from the cache).

    Example (on a GPU machine):
        >>> import numpy as np, scipy.sparse as sp, tuner  # doctest: +SKIP
        >>> A = sp.random(1000, 1000, density=0.01, format="csr", dtype=np.float32)  # doctest: +SKIP
        >>> spmv = tuner.compile(A); y = spmv(np.ones(1000, np.float32))  # doctest: +SKIP
    """

    def __init__(self, matrix: CanonicalMatrix, spec: Specialization, cubin: bytes, plan,
                 arrays: DeviceArrays | None = None, launch: Launch | None = None, layout_source: str = "built"):
        self.plan = plan
        self.shape = matrix.shape
        self.dtype = matrix.value_dtype
        self.spec = spec
        self.layout_source = layout_source if launch is not None else "built"
        self._launch: Launch = launch if launch is not None else families.get(spec.family).launch(matrix, spec.params)
        # Held for the kernel's lifetime: the raw pointers below are only valid while the buffers live.
        self._device_arrays = arrays = arrays or DeviceArrays()
        self._array_ptrs = tuple(arrays.pointer(a) for _, a in self._launch.arrays)
        self._scalars = tuple(np.int64(v) for _, v in self._launch.scalars)
        self._pattern = self.dtype.type(matrix.pattern_value if matrix.value_free else 1.0)
        signature = "P" * (len(self._array_ptrs) + 2) + "q" * len(self._scalars) + SIGNATURE_CODES[self.dtype]
        self._kernel = gpu.Kernel(cubin, spec.kernel_name, signature)
        self._x_buf = gpu.alloc(self.shape[1] * self.dtype.itemsize)
        self._y_buf = gpu.alloc(self.shape[0] * self.dtype.itemsize)
        self._plan_order = False
        self._gathers = None
        if self._launch.x_gather is not None:  # a relabelled plan: gathers to and from its order
            x_gather, y_gather = self._launch.gathers_on_device or (self._launch.x_gather, self._launch.y_gather)
            self._gathers = _Gathers(
                self._kernel.sibling(spec.kernel_name + "_gather", "PPPq"),
                arrays.pointer(x_gather), arrays.pointer(y_gather),
                gpu.alloc(self.shape[1] * self.dtype.itemsize), gpu.alloc(self.shape[0] * self.dtype.itemsize))

    def launch(self, x_ptr: int, y_ptr: int) -> None:
        """Run the product on device pointers (no checks: for timing loops and iterative solvers).

        A relabelled plan runs three kernels: x gathered into the plan's order, the product, y gathered
        back; :meth:`in_plan_order` runs the product alone.
        """
        g = self._gathers
        if g is None or self._plan_order:
            self._product(x_ptr, y_ptr)
            return
        n_rows, n_cols = self.shape
        g.kernel.launch(ceil_div(n_cols, GATHER_BLOCK), GATHER_BLOCK, g.x_order, x_ptr, int(g.x_plan),
                        np.int64(n_cols))
        self._product(int(g.x_plan), int(g.y_plan))
        g.kernel.launch(ceil_div(n_rows, GATHER_BLOCK), GATHER_BLOCK, g.y_order, int(g.y_plan), y_ptr,
                        np.int64(n_rows))

    def _product(self, x_ptr: int, y_ptr: int) -> None:
        if self._launch.zero_y:
            gpu.zero_async(y_ptr, self.shape[0] * self.dtype.itemsize)
        self._kernel.launch(self._launch.grid, self._launch.block, *self._array_ptrs, x_ptr, y_ptr,
                            *self._scalars, self._pattern)

    @property
    def layout(self) -> Launch:
        """What this kernel runs on: its layout's arrays, grid and gathers (a kernel of the same specialisation
        can take it as its ``launch``)."""
        return self._launch

    @property
    def col_order(self) -> np.ndarray | None:
        """Column order of the plan: x_plan = x[col_order] (None: the plan keeps the caller's order)."""
        return self._launch.x_gather

    @property
    def row_rank(self) -> np.ndarray | None:
        """Where each of the caller's rows sits in the plan: y = y_plan[row_rank] (None: not relabelled)."""
        return self._launch.y_gather

    def in_plan_order(self) -> "SpMV":
        """The same product on vectors in the plan's order: no gathers, for iterative callers.

        Convert once on the way in and out; for a square matrix rows and columns share one order, so
        y_plan can be fed back as the next x_plan.

        Example (on a GPU machine):
            >>> inner = spmv.in_plan_order()  # doctest: +SKIP
            >>> x_plan = spmv.to_plan_order(x)  # doctest: +SKIP
            >>> for _ in range(20): x_plan = inner(x_plan)  # doctest: +SKIP
            >>> x = spmv.from_plan_order(x_plan)  # doctest: +SKIP
        """
        if self._gathers is None or self._plan_order:
            return self
        twin = copy.copy(self)
        twin._plan_order = True
        return twin

    def to_plan_order(self, x: np.ndarray) -> np.ndarray:
        """A host vector of the caller's columns, in the plan's column order."""
        return np.asarray(x) if self.col_order is None else np.asarray(x)[self.col_order]

    def from_plan_order(self, y: np.ndarray) -> np.ndarray:
        """A host vector of the plan's rows, in the caller's row order."""
        return np.asarray(y) if self.row_rank is None else np.asarray(y)[self.row_rank]

    @property
    def registers(self) -> int:
        """Registers per thread of the compiled kernel (for occupancy)."""
        return self._kernel.registers

    @property
    def shared_bytes(self) -> int:
        """Static shared memory per block of the compiled kernel."""
        return self._kernel.shared_bytes

    @property
    def buffers(self) -> tuple[int, int]:
        """Device pointers of the callable's own x and y buffers (used by the NumPy path and timings)."""
        return int(self._x_buf), int(self._y_buf)

    def wait(self, timeout: float | None = None) -> "SpMV":
        """This kernel: it is the tuned one (a :class:`~tuner.tiered.TieredSpMV` waits for its own)."""
        return self

    def explain(self) -> str:
        """Why this plan: every candidate's timing, fastest first."""
        from .planner import explain
        return explain(self.plan)

    def time(self, repeats: int = 50, warmup: int = 5, seed: int = 0) -> float:
        """Median milliseconds of one launch (CUDA events, after warm-up) on a random x."""
        return float(np.median(time_spmv(self, repeats, warmup, seed)))

    def __repr__(self) -> str:
        order = " (plan order)" if self._plan_order else ""
        return (f"<SpMV {self.shape[0]}x{self.shape[1]} {self.dtype.name} {self.spec.label()}{order} "
                f"measured={getattr(self.plan, 'measured_ms', None)}>")


GATHER_BLOCK = 256  # the templates' gather kernel is written for blocks of 256 threads


def launch_on_views(launch, xv, ov, x_bytes: int, out_bytes: int, name: str) -> None:
    """``launch(x_ptr, out_ptr)`` on the device arrays of views ``xv`` (the input, ``name``) and ``ov`` (the
    output), after refusing an output that overlaps the input, in order with the input's producer: its
    stream waited for, and our work finished before the result goes back to it, unless it is a default stream
    (which our launches order with)."""
    if x_bytes and out_bytes and xv.ptr < ov.ptr + out_bytes and ov.ptr < xv.ptr + x_bytes:
        raise MatrixError(f"out overlaps {name}: the kernel reads {name} while it writes out")
    gpu.ensure_context()
    synced = gpu.wait_for_stream(xv.stream)
    launch(xv.ptr, ov.ptr)
    if synced:
        gpu.synchronize()


@dataclass(frozen=True)
class _Gathers:
    """What a relabelled plan's call adds around the product.

    Attributes:
        kernel: the module's gather kernel (dst[i] = src[order[i]]).
        x_order, y_order: device pointers of the column order and of each caller row's plan row.
        x_plan, y_plan: device buffers of x and y in the plan's order.
    """

    kernel: object
    x_order: int
    y_order: int
    x_plan: object
    y_plan: object


def random_vector(n: int, dtype, seed: int = 0) -> np.ndarray:
    """A random, non-constant test vector (never zeros or all-equal: those hide indexing errors)."""
    return _random_vector(int(n), np.dtype(dtype), seed).copy()


@lru_cache(maxsize=4)
def _random_vector(n: int, dtype: np.dtype, seed: int) -> np.ndarray:
    # Timing loops build many kernels over the same x size: draw each vector once (100M draws take ~1 s).
    v = np.random.default_rng(seed).uniform(-1.0, 1.0, n).astype(dtype)
    v.flags.writeable = False
    return v


def time_spmv(kernel: SpMV, repeats: int, warmup: int = 3, seed: int = 0) -> list[float]:
    """Per-launch milliseconds of ``kernel`` on its own buffers, x random, y poisoned beforehand."""
    x_ptr, y_ptr = kernel.buffers
    gpu.copy_to_device(x_ptr, _random_vector(kernel.shape[1], kernel.dtype, seed))
    gpu.memset_bytes(y_ptr, 0xFF, kernel.shape[0] * kernel.dtype.itemsize)  # NaN poison
    return gpu.time_launches(lambda: kernel.launch(x_ptr, y_ptr), repeats, warmup)


def adaptive_repeats(first_ms: float, budget_ms: float = 40.0, lo: int = 10, hi: int = 200) -> int:
    """How many timed runs fit a time budget, within [lo, hi].

    Example:
        >>> adaptive_repeats(1.0), adaptive_repeats(0.01), adaptive_repeats(100.0)
        (40, 200, 10)
    """
    return int(min(hi, max(lo, budget_ms // max(first_ms, 1e-6))))


def copy_bandwidth_gbs(nbytes: int = 1 << 30, repeats: int = 20) -> float:
    """Device-to-device copy bandwidth (bytes read + written per second, in GB/s), median of CUDA events."""
    src, dst = gpu.alloc(nbytes), gpu.alloc(nbytes)
    gpu.memset_bytes(int(src), 0x5A, nbytes)
    ms = np.median(gpu.time_launches(lambda: gpu.copy_device(int(dst), int(src), nbytes), repeats, warmup=3,
                                    queued=False))
    return 2 * nbytes / (ms * 1e-3) / 1e9
