"""The GPU backend: the only module that imports PyCUDA.

It works in the device's primary context (the one the CUDA runtime, and so CuPy and PyTorch, use), loads
cubins, launches prepared kernels on the legacy default stream, owns device memory, times with CUDA events
and reads other libraries' arrays through ``__cuda_array_interface__``.
"""
from __future__ import annotations

import atexit
import ctypes
import sys
import threading
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from . import staging
from .staging import STAGE_BYTES, drain, feed

try:  # PyCUDA is the optional 'gpu' extra: without it (or without a driver) nothing here runs.
    import pycuda.driver as drv
    _IMPORT_ERROR = None
except Exception as exc:  # noqa: BLE001 - any failure to import means 'no GPU backend'
    drv = None
    _IMPORT_ERROR = exc
try:  # the packer of prepared_call's arguments (Kernel.launch)
    from pycuda._pvt_struct import pack as _pack_args
except Exception:  # noqa: BLE001 - a PyCUDA without it: Kernel.launch goes through prepared_call
    _pack_args = None


class NoDeviceError(RuntimeError):
    """No usable CUDA GPU: PyCUDA is missing, no driver, or no device."""


# What a failed driver call raises (a kernel that does not load or launch), for callers that must not
# import PyCUDA themselves.
GpuError = drv.Error if drv is not None else RuntimeError


@dataclass(frozen=True)
class DeviceInfo:
    """What the tuner needs to know about the GPU.

    Attributes:
        name: e.g. 'NVIDIA H100 80GB HBM3'.
        capability: compute capability (major, minor).
        sm_count: streaming multiprocessors.
        l2_bytes: L2 cache size.
        memory_bytes: global memory size.
        driver_version: CUDA driver API version as an int, e.g. 13000.
        threads_per_sm, registers_per_sm, shared_bytes_per_sm, blocks_per_sm: residency limits of one SM.
        shared_bytes_per_block: the most shared memory one block may ask for (opting in past the 48 KiB default).
    """

    name: str
    capability: tuple[int, int]
    sm_count: int
    l2_bytes: int
    memory_bytes: int
    driver_version: int
    threads_per_sm: int = 2048
    registers_per_sm: int = 65536
    shared_bytes_per_sm: int = 0
    blocks_per_sm: int = 32
    shared_bytes_per_block: int = 49152

    @property
    def arch(self) -> str:
        return f"sm_{self.capability[0]}{self.capability[1]}"


_lock = threading.Lock()
_local = threading.local()
_state: dict = {}


def _probe() -> str | None:
    """None when a device can be used, else why not."""
    if drv is None:
        return (f"PyCUDA is not importable ({_IMPORT_ERROR}); install the 'gpu' extra on a machine with CUDA "
                "(README: GPU set-up)")
    try:
        drv.init()
        if drv.Device.count() == 0:
            return "the CUDA driver reports no device"
    except Exception as exc:  # noqa: BLE001
        return f"the CUDA driver could not start ({exc})"
    return None


@lru_cache(maxsize=1)
def unavailable_reason() -> str | None:
    """None when a CUDA GPU is usable, else a sentence saying why not (cached)."""
    return _probe()


def available() -> bool:
    """True when a CUDA GPU can run kernels.

    Example:
        >>> isinstance(available(), bool)
        True
    """
    return unavailable_reason() is None


def device_count() -> int:
    """CUDA devices this process sees (0 without a usable driver).

    Example:
        >>> device_count() >= 0
        True
    """
    return 0 if unavailable_reason() is not None else drv.Device.count()


def select_device(ordinal: int) -> None:
    """Work on device ``ordinal`` (default 0): once per process, before anything else here touches the GPU.

    One process per GPU (an MPI rank) picks its card here; asking for another card after the first use
    raises, since every loaded kernel and buffer belongs to the first one's context.

    Example (on a machine with several GPUs):
        >>> select_device(1)  # doctest: +SKIP
    """
    reason = unavailable_reason()
    if reason is not None:
        raise NoDeviceError(f"no CUDA GPU present: {reason}")
    count = drv.Device.count()
    if not 0 <= ordinal < count:
        raise ValueError(f"device {ordinal} does not exist: this machine has {count} GPU(s), 0..{count - 1}")
    with _lock:
        if "ctx" in _state and _state["ordinal"] != ordinal:
            raise RuntimeError(f"this process already works on GPU {_state['ordinal']}; select_device({ordinal}) "
                               "must come before the first use")
        _state["ordinal"] = ordinal


def selected_device() -> int:
    """The device this process works on: 0 unless :func:`select_device` chose another.

    Example:
        >>> selected_device() >= 0
        True
    """
    return _state.get("ordinal", 0)


def _context():
    """The primary context of the selected device (0 unless :func:`select_device`), current in this thread."""
    if getattr(_local, "pushed", False):  # every call of a product comes here: the common case first
        return _state["ctx"]
    reason = unavailable_reason()
    if reason is not None:
        raise NoDeviceError(f"no CUDA GPU present: {reason}")
    with _lock:
        if "ctx" not in _state:
            dev = drv.Device(_state.setdefault("ordinal", 0))
            ctx = dev.retain_primary_context()
            _state.update(dev=dev, ctx=ctx)
            atexit.register(_release)
    if not getattr(_local, "pushed", False):
        _state["ctx"].push()
        _local.pushed = True
    return _state["ctx"]


def _release() -> None:
    _loaded.clear()  # unloaded while the context still exists (unless a kernel object still holds one)
    pool = _state.pop("pool", None)
    if pool is not None:
        pool.stop_holding()  # its free blocks go back while the context still exists
    if getattr(_local, "pushed", False):
        try:
            drv.Context.pop()
        except Exception:  # noqa: BLE001 - interpreter shutdown: nothing left to do
            pass
        _local.pushed = False


def ensure_context() -> None:
    """Make the primary context current in this thread (idempotent)."""
    _context()


def leave_thread() -> None:
    """Take the primary context off this thread's stack, where this thread put it: a thread other than the
    main one that used the GPU calls this before it ends (PyCUDA aborts the process when a thread ends with a
    context on its stack). Nothing to do in a thread that never used the GPU.

    Example:
        >>> threading.Thread(target=leave_thread).start()
    """
    if getattr(_local, "pushed", False):
        drv.Context.pop()
        _local.pushed = False


@lru_cache(maxsize=1)
def device_info() -> DeviceInfo:
    """Properties of the device this process works on (:func:`select_device`).

    Example (on a GPU machine):
        >>> device_info().arch  # doctest: +SKIP
        'sm_90'
    """
    _context()
    dev = _state["dev"]
    a = drv.device_attribute
    return DeviceInfo(name=dev.name(), capability=dev.compute_capability(),
                      sm_count=dev.get_attribute(a.MULTIPROCESSOR_COUNT),
                      l2_bytes=dev.get_attribute(a.L2_CACHE_SIZE), memory_bytes=dev.total_memory(),
                      driver_version=drv.get_driver_version(),
                      threads_per_sm=dev.get_attribute(a.MAX_THREADS_PER_MULTIPROCESSOR),
                      registers_per_sm=dev.get_attribute(a.MAX_REGISTERS_PER_MULTIPROCESSOR),
                      shared_bytes_per_sm=dev.get_attribute(a.MAX_SHARED_MEMORY_PER_MULTIPROCESSOR),
                      blocks_per_sm=dev.get_attribute(a.MAX_BLOCKS_PER_MULTIPROCESSOR),
                      shared_bytes_per_block=dev.get_attribute(
                          getattr(a, "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN", a.MAX_SHARED_MEMORY_PER_BLOCK)))


# Modules loaded in this process, by cubin: a load costs a few tenths of a millisecond, as long as a small
# graph's whole product, and an algorithm's products (HITS's by A and Aᵀ, a walk's per call) often share one
# binary. They stay loaded for the process's life: a few hundred KB of device code per distinct binary.
_loaded: dict[bytes, object] = {}
_opted_in: dict[tuple[int, str], int] = {}  # (module, kernel) -> dynamic shared bytes its function is opted in to


def loaded_module(cubin: bytes):
    """The module of ``cubin`` in this process's context, loaded on its first use only.

    Example (on a GPU machine):
        >>> loaded_module(binary.cubin) is loaded_module(binary.cubin)  # doctest: +SKIP
        True
    """
    _context()
    with _lock:
        module = _loaded.get(cubin)
        if module is None:
            module = _loaded[cubin] = drv.module_from_buffer(cubin)
        return module


class Kernel:
    """A loaded kernel with its prepared argument signature (its module loaded once per process:
    :func:`loaded_module`)."""

    def __init__(self, cubin: bytes, name: str, signature: str, module=None):
        _context()
        self.module = module if module is not None else loaded_module(cubin)
        self.function = self.module.get_function(name)
        self.function.prepare(signature)
        # prepared_call less what it does on every call that a launch does not need (the deprecated block-shape
        # call, an import, keyword handling): about 1 us of the 6-8 us of host time a launch takes, where a small
        # graph's whole product call is host-bound.
        self._direct = _pack_args is not None and hasattr(self.function, "_launch_kernel")
        self.name = name
        self.registers = self.function.get_attribute(drv.function_attribute.NUM_REGS)
        self.shared_bytes = self.function.get_attribute(drv.function_attribute.SHARED_SIZE_BYTES)

    def sibling(self, name: str, signature: str) -> "Kernel":
        """Another kernel of the same module (the module is loaded once)."""
        return Kernel(b"", name, signature, module=self.module)

    def launch(self, grid: int, block: int, *args, shared: int = 0, stream: "Stream | None" = None) -> None:
        """Launch on ``grid`` blocks of ``block`` threads with ``shared`` bytes of dynamic shared memory (past
        48 KiB with the kernel's static shared memory, the kernel is opted in to it once), on the default
        stream or ``stream``."""
        if not grid:
            return
        if shared + self.shared_bytes > 49152 and shared > _opted_in.get((id(self.module), self.name), 0):
            # per function, not per Kernel: kernels of one loaded module share it, and a smaller opt-in made
            # through one of them would make the others' larger launches fail
            with _lock:
                key = (id(self.module), self.name)
                if shared > _opted_in.get(key, 0):
                    self.function.set_attribute(drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, int(shared))
                    _opted_in[key] = int(shared)
        if self._direct:
            self.function._launch_kernel((grid, 1, 1), (block, 1, 1), _pack_args(self.function.arg_format, *args),
                                         int(shared), None if stream is None else stream.stream)
        elif stream is None:
            self.function.prepared_call((grid, 1, 1), (block, 1, 1), *args, shared_size=int(shared))
        else:
            self.function.prepared_async_call((grid, 1, 1), (block, 1, 1), stream.stream, *args,
                                              shared_size=int(shared))


def alloc(nbytes: int):
    """Device memory of at least one byte (a zero-size allocation is an error in CUDA). Where the device is
    short, the blocks CuPy's pool keeps unused (a background tuning keeps them: see
    :func:`tuner.formats.device_reorder.releases_deferred`) are given back and the allocation tried again."""
    _context()
    try:
        return drv.mem_alloc(max(int(nbytes), 1))
    except drv.MemoryError:
        cupy = sys.modules.get("cupy")
        if cupy is None or not cupy.get_default_memory_pool().free_bytes():
            raise
        cupy.get_default_memory_pool().free_all_blocks()
        return drv.mem_alloc(max(int(nbytes), 1))


def upload(array: np.ndarray):
    """Copy a host array to new device memory (:func:`copy_to_device`: large ones through the staging buffers)."""
    buf = alloc(array.nbytes)
    copy_to_device(int(buf), array)
    return buf


def upload_pooled(array: np.ndarray):
    """Copy a host array to device memory from the pool of :func:`alloc_pooled` (no cudaMalloc on repeats)."""
    buf = alloc_pooled(array.nbytes)
    copy_to_device(int(buf), array)
    return buf


# Host copies at least this large go through the staging buffers: from a full piece on, the host's copies
# into one buffer overlap the other's crossing.
STAGED_MIN_BYTES = STAGE_BYTES


def copy_to_device(ptr: int, array: np.ndarray, queued: bool = False, stream: "Stream | None" = None) -> None:
    """Copy a host array to device memory at ``ptr``, through the page-locked staging buffers from
    :data:`STAGED_MIN_BYTES` on (:func:`tuner.staging.feed`): a vector of tens of millions of entries then
    crosses at PCIe's rate, not at a tenth of it. An array already page-locked (:func:`page_locked`) is
    copied directly. Returns once ``array`` may change; with ``queued`` (for a contiguous ``array`` that is
    page-locked and stays unchanged until the default stream has done what is queued on it so far), at once,
    the copy queued on the default stream, ordered before the kernels queued after it: the many small copies
    of a slotted page or an assembly block then cost no wait each; queued on ``stream`` where given (which
    may be capturing a :class:`Graph`)."""
    if queued:
        if array.nbytes:
            drv.memcpy_htod_async(ptr, array, stream.stream if stream is not None else None)
        return
    array = np.ascontiguousarray(array)
    if array.nbytes >= STAGED_MIN_BYTES and not page_locked(array):
        _staged_htod(ptr, array.reshape(-1).view(np.uint8))
    elif array.nbytes:
        drv.memcpy_htod(ptr, array)


def copy_to_host(array: np.ndarray, ptr: int) -> None:
    """Copy device memory at ``ptr`` into the contiguous host array ``array`` (through the staging buffers
    from :data:`STAGED_MIN_BYTES` on, unless it is :func:`page_locked`), after the work queued on the default
    stream. Copies queued without a wait go through :func:`queue_downloads`."""
    if not (array.flags.c_contiguous and array.flags.writeable):
        raise ValueError("copy_to_host needs a contiguous, writeable host array")
    if array.nbytes >= STAGED_MIN_BYTES and not page_locked(array):
        _staged_dtoh(array.reshape(-1).view(np.uint8), ptr)
    elif array.nbytes:
        drv.memcpy_dtoh(array, ptr)


def _check(err: int, what: str) -> None:
    if err:
        raise GpuError(f"{what} failed with CUDA error {err}")


def queue_downloads(base: int, pieces, stream: "Stream | None" = None) -> None:
    """Queue on ``stream`` (default: the default stream), after its work, a copy of ``nbytes`` from device
    address ``base + offset`` to host address ``host`` for each ``(host, offset, nbytes)`` of ``pieces``,
    and return at once.
    The host ranges must be page-locked (:class:`Pinned`) and stay alive and unread until the stream has
    done what is queued on it: the driver is called directly, without PyCUDA's wrapping of each
    host array, since a slotted page sends its sums to a dozen places at every call.

    Example (on a GPU machine):
        >>> host = Pinned(np.zeros(4, np.float32))                                  # doctest: +SKIP
        >>> dev = upload(np.arange(4, dtype=np.float32))                            # doctest: +SKIP
        >>> queue_downloads(int(dev), [(host.array.ctypes.data + 4, 8, 8)])         # doctest: +SKIP
        >>> synchronize(); host.array.tolist()                                      # doctest: +SKIP
        [0.0, 2.0, 3.0, 0.0]
    """
    _context()
    copy = _libcuda().cuMemcpyDtoHAsync_v2
    if copy.argtypes is None:
        copy.argtypes = (ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p)
    handle = stream.handle if stream is not None else None
    for host, offset, nbytes in pieces:
        if nbytes:
            _check(copy(host, base + offset, nbytes, handle), f"cuMemcpyDtoHAsync of {nbytes:,} bytes")


_CU_STREAM_NON_BLOCKING = 1  # the driver's flag (PyCUDA names no stream flags)


class Stream:
    """A CUDA stream that orders with the default stream (a blocking stream), and events on it: work queued
    here starts after what the default stream queued before, and the default stream's later work waits
    for it, so callers who work on the default stream need no synchronisation of their own.

    With ``blocking=False`` it orders with nothing but what it is told to :meth:`wait` for (a non-blocking
    stream): its copies may run while the default stream's kernels do.
    """

    def __init__(self, blocking: bool = True):
        _context()
        self.stream = drv.Stream() if blocking else drv.Stream(_CU_STREAM_NON_BLOCKING)

    @property
    def handle(self) -> int:
        """The driver's handle of the stream (a CUstream), for calls made outside PyCUDA."""
        return self.stream.handle

    def wait(self, event) -> None:
        """Work queued here from now on starts after ``event`` (see :meth:`record`, :func:`default_event`)."""
        self.stream.wait_for_event(event)

    def copy_to_device(self, ptr: int, array: np.ndarray) -> None:
        """Queue a copy of ``array`` (page-locked: see :class:`Pinned`) to device memory at ``ptr``."""
        if array.nbytes:
            drv.memcpy_htod_async(ptr, array, self.stream)

    def record(self):
        """An event marking what is queued here so far (``.synchronize()``, ``.time_since(other)``)."""
        return drv.Event().record(self.stream)

    def synchronize(self) -> None:
        self.stream.synchronize()


def default_event():
    """An event marking what the default stream (and every blocking stream, which it orders with) has queued
    so far: a non-blocking :class:`Stream` that waits for it sees their results."""
    _context()
    return drv.Event().record()


_CAPTURE_RELAXED = 2  # CU_STREAM_CAPTURE_MODE_RELAXED: other threads' CUDA calls are not policed
_EVENT_DISABLE_TIMING = 2  # CU_EVENT_DISABLE_TIMING
_EVENT_RECORD_EXTERNAL = 1  # CU_EVENT_RECORD_EXTERNAL: recorded during capture, a node of the graph


class Graph:
    """The work ``record()`` queues on ``stream`` (a non-blocking :class:`Stream`), captured once as a CUDA
    graph and launched again as one call: a repeated sequence of a few hundred small copies, kernels and
    CUB calls then costs the host one call instead of a few microseconds each, and the GPU runs them back
    to back. Everything ``record()`` queues must go to ``stream``, and it must not wait for the device;
    pointers, sizes and host addresses are fixed in the graph, so the memory it names must stay allocated
    (and page-locked) while the graph lives. The driver is called directly: PyCUDA does not wrap graphs.

    Example (on a GPU machine):
        >>> stream = Stream(blocking=False)                                          # doctest: +SKIP
        >>> host = Pinned(np.zeros(4, np.float32)); dev = upload(np.arange(4, dtype=np.float32))  # doctest: +SKIP
        >>> record = lambda: queue_downloads(int(dev), [(host.array.ctypes.data, 0, 16)], stream)  # doctest: +SKIP
        >>> graph = Graph(stream, record)                                            # doctest: +SKIP
        >>> graph.launch(stream); stream.synchronize(); host.array.tolist()        # doctest: +SKIP
        [0.0, 1.0, 2.0, 3.0]
    """

    def __init__(self, stream: Stream, record):
        _context()
        lib = _libcuda()
        handle = ctypes.c_void_p(stream.handle)
        _check(lib.cuStreamBeginCapture_v2(handle, ctypes.c_int(_CAPTURE_RELAXED)), "cuStreamBeginCapture")
        graph = ctypes.c_void_p()
        try:
            record()
        finally:
            ended = lib.cuStreamEndCapture(handle, ctypes.byref(graph))
        try:
            _check(ended, "cuStreamEndCapture")
            self._exec = ctypes.c_void_p()
            _check(lib.cuGraphInstantiateWithFlags(ctypes.byref(self._exec), graph, ctypes.c_ulonglong(0)),
                   "cuGraphInstantiate")
        finally:
            if graph.value:
                lib.cuGraphDestroy(graph)  # the executable graph keeps what it needs

    def launch(self, stream: Stream) -> None:
        """Queue the whole graph on ``stream``."""
        _check(_libcuda().cuGraphLaunch(self._exec, ctypes.c_void_p(stream.handle)), "cuGraphLaunch")

    def __del__(self):
        exe = getattr(self, "_exec", None)
        if exe is not None and exe.value:
            try:
                _libcuda().cuGraphExecDestroy(exe)
            except Exception:  # noqa: BLE001 - interpreter shutdown: the driver frees it with the context
                pass


class GraphEvent:
    """An event the host waits for at a point of a stream's work, that a :class:`Graph` captured there
    records at every launch (an external event node; an ordinary event recorded during capture marks only
    the capture). Outside a capture it is an ordinary event.

    Example (on a GPU machine):
        >>> done = GraphEvent()                                                     # doctest: +SKIP
        >>> done.record(Stream(blocking=False), capturing=False); done.synchronize()  # doctest: +SKIP
    """

    def __init__(self):
        _context()
        self._event = ctypes.c_void_p()
        _check(_libcuda().cuEventCreate(ctypes.byref(self._event), ctypes.c_uint(_EVENT_DISABLE_TIMING)),
               "cuEventCreate")

    def record(self, stream: Stream, capturing: bool) -> None:
        """Mark what ``stream`` has queued so far (in the graph being captured there, where ``capturing``)."""
        flags = _EVENT_RECORD_EXTERNAL if capturing else 0
        _check(_libcuda().cuEventRecordWithFlags(self._event, ctypes.c_void_p(stream.handle), ctypes.c_uint(flags)),
               "cuEventRecordWithFlags")

    def synchronize(self) -> None:
        """Return once the device has passed the point last recorded."""
        _check(_libcuda().cuEventSynchronize(self._event), "cuEventSynchronize")

    def __del__(self):
        event = getattr(self, "_event", None)
        if event is not None and event.value:
            try:
                _libcuda().cuEventDestroy_v2(event)
            except Exception:  # noqa: BLE001 - interpreter shutdown
                pass


class Pinned:
    """A host array page-locked in place (registered with the driver, no copy) while this object lives, so
    that copies from it (``.array`` and its slices) run at PCIe's rate and asynchronously.

    Example (on a GPU machine):
        >>> pinned = Pinned(np.arange(1 << 20, dtype=np.float32))  # doctest: +SKIP
        >>> pinned.array.size, pinned.locked                         # doctest: +SKIP
        (1048576, True)
    """

    ALREADY_REGISTERED = 712  # CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED
    PORTABLE = 1  # CU_MEMHOSTREGISTER_PORTABLE: locked for every context

    def __init__(self, array: np.ndarray):
        _context()
        self.array = np.ascontiguousarray(array)
        self._ptr = None
        self.locked = False
        if self.array.nbytes == 0:
            return
        lib = _libcuda()
        register = getattr(lib, "cuMemHostRegister_v2", None) or lib.cuMemHostRegister
        ptr = self.array.ctypes.data
        err = register(ctypes.c_void_p(ptr), ctypes.c_size_t(self.array.nbytes), ctypes.c_uint(self.PORTABLE))
        if err == self.ALREADY_REGISTERED:  # locked by another product of the same matrix: copies run as fast
            self.locked = True
            return
        _check(err, f"cuMemHostRegister of {self.array.nbytes:,} bytes")
        self._ptr, self.locked = ptr, True
        _locked[ptr] = ptr + self.array.nbytes

    def __del__(self):
        if self._ptr is not None:
            _locked.pop(self._ptr, None)
            try:
                _libcuda().cuMemHostUnregister(ctypes.c_void_p(self._ptr))
            except Exception:  # noqa: BLE001 - interpreter shutdown: the driver frees it with the process
                pass
            self._ptr = None


_locked: dict[int, int] = {}  # start -> end of every host range a Pinned holds page-locked


def page_locked(array: np.ndarray) -> bool:
    """Whether ``array`` lies inside a range a :class:`Pinned` holds page-locked: copies from and into it
    run at PCIe's rate directly, with no staging buffer between.

    Example:
        >>> page_locked(np.zeros(4))
        False
    """
    start = array.ctypes.data
    end = start + array.nbytes
    return any(lo <= start and end <= hi for lo, hi in list(_locked.items()))


def pinned_copy_gbs(nbytes: int = 1 << 30, repeats: int = 10) -> float:
    """Host-to-device bandwidth from page-locked memory (GB/s, 10^9 bytes a second): the median of
    ``repeats`` copies of ``nbytes`` timed with CUDA events."""
    _context()
    host = drv.pagelocked_empty(nbytes, np.uint8)
    host[:] = 7
    dev = alloc(nbytes)
    stream = Stream()
    times = []
    for _ in range(repeats + 2):
        start = stream.record()
        stream.copy_to_device(int(dev), host)
        end = stream.record()
        end.synchronize()
        times.append(end.time_since(start))
    return nbytes / (float(np.median(times[2:])) * 1e-3) / 1e9


def copy_device(dst: int, src: int, nbytes: int) -> None:
    if nbytes:
        drv.memcpy_dtod(dst, src, nbytes)


def free_memory(release_pool: bool = False) -> int:
    """Bytes of device memory free now (what a result must fit in); with ``release_pool``, after returning
    the blocks held unused by the pool of :func:`alloc_pooled` and by CuPy's (where CuPy is in use: the
    layout builders, a compile's stand-in kernel and the cuSPARSE baselines allocate there).

    Example (on a GPU machine):
        >>> free_memory() > 0  # doctest: +SKIP
        True
    """
    _context()
    if release_pool:
        if "pool" in _state:
            _state["pool"].free_held()
        cupy = sys.modules.get("cupy")
        if cupy is not None:
            cupy.get_default_memory_pool().free_all_blocks()
    return int(drv.mem_get_info()[0])


def alloc_pooled(nbytes: int):
    """Device memory of at least one byte from a pool that keeps freed blocks for the next request of their
    size: work buffers of repeated calls (SpGEMM's expansion) then skip cudaMalloc, which takes
    milliseconds for blocks of gigabytes. Freed when the returned object is."""
    from pycuda.tools import DeviceMemoryPool
    _context()
    with _lock:
        if "pool" not in _state:
            _state["pool"] = DeviceMemoryPool()
    return _state["pool"].allocate(max(int(nbytes), 1))


def device_vector(n: int, dtype, data=None):
    """A PyCUDA GPUArray of ``n`` entries (``__cuda_array_interface__``: CuPy and PyTorch take it without a
    copy), in new memory or in the allocation ``data``, which it then keeps alive.

    Example (on a GPU machine):
        >>> device_vector(4, np.float32).shape  # doctest: +SKIP
        (4,)
    """
    import pycuda.gpuarray as gpuarray
    _context()
    data = data if data is not None else alloc_pooled(int(n) * np.dtype(dtype).itemsize)
    return gpuarray.GPUArray((int(n),), np.dtype(dtype), gpudata=data)


_stages: list = []  # the two page-locked staging buffers of large copies, made at the first one
_stages_lock = threading.Lock()  # one large copy at a time uses them (a tuning thread may copy beside a caller)


def _staging_buffers() -> list:
    size = staging.STAGE_BYTES  # the pieces feed() and drain() cut: read where they read it
    if not _stages or _stages[0].size < size:
        _stages[:] = [drv.pagelocked_empty(size, np.uint8, mem_flags=drv.host_alloc_flags.PORTABLE)
                      for _ in range(2)]
    return _stages


def _staged_htod(ptr: int, src: np.ndarray) -> None:
    _context()
    with _stages_lock:
        stages = _staging_buffers()
        stream = drv.Stream()  # a blocking stream: ordered with the default stream's work before and after
        left = [drv.Event(), drv.Event()]

        def put(k: int, start: int, size: int) -> None:
            drv.memcpy_htod_async(ptr + start, stages[k][:size], stream)
            left[k].record(stream)
        feed(src, stages, put, lambda k: left[k].synchronize())


def _staged_dtoh(dst: np.ndarray, ptr: int) -> None:
    _context()
    with _stages_lock:
        stages = _staging_buffers()
        stream = drv.Stream()  # a blocking stream: it starts after the default stream's work that made the array
        arrived = [drv.Event(), drv.Event()]

        def fetch(k: int, start: int, size: int) -> None:
            drv.memcpy_dtoh_async(stages[k][:size], ptr + start, stream)
            arrived[k].record(stream)
        drain(dst, stages, fetch, lambda k: arrived[k].synchronize())


def download(array, out: np.ndarray | None = None) -> np.ndarray:
    """A host copy of a device array (a PyCUDA GPUArray), by :func:`copy_to_host`: through two page-locked
    staging buffers (:func:`tuner.staging.drain`) from :data:`STAGED_MIN_BYTES` on, since a copy into pageable
    memory runs at a tenth of PCIe's rate. ``out``: a contiguous host array of the same size and dtype to copy
    into.

    Example (on a GPU machine):
        >>> download(device_vector(3, np.float32, upload(np.arange(3, dtype=np.float32)))).tolist()  # doctest: +SKIP
        [0.0, 1.0, 2.0]
    """
    if out is not None and (out.shape != array.shape or out.dtype != array.dtype or not out.flags.c_contiguous):
        raise ValueError(f"out must be a contiguous {array.dtype} array of shape {array.shape}")
    out = np.empty(array.shape, array.dtype) if out is None else out
    if out.nbytes:
        _context()
        copy_to_host(out, int(array.gpudata))
    return out


class Library:
    """A shared library of host functions that launch device work (e.g. CUB's device-wide algorithms),
    called through ctypes in the primary context, on the legacy default stream like every kernel here.
    Each function returns a cudaError_t; a non-zero one raises :class:`GpuError`."""

    def __init__(self, path):
        _context()  # the library's CUDA runtime then attaches to the same primary context
        self.path = str(path)
        self._lib = ctypes.CDLL(self.path)

    def call(self, name: str, *args) -> None:
        fn = getattr(self._lib, name)
        fn.restype = ctypes.c_int
        status = fn(*args)
        if status != 0:
            raise GpuError(f"{name} in {self.path} failed with CUDA error {status}")


def memset_bytes(ptr: int, byte: int, nbytes: int) -> None:
    if nbytes:
        drv.memset_d8(ptr, byte, nbytes)


def zero_async(ptr: int, nbytes: int) -> None:
    """Zero ``nbytes`` (a multiple of 4) on the default stream, queued like a kernel launch."""
    if nbytes:
        drv.memset_d32_async(ptr, 0, nbytes // 4)


def synchronize() -> None:
    _context()
    drv.Context.synchronize()


# A kernel that holds the stream until the host sets a flag in mapped host memory (or a time limit passes).
# Launches queued behind it are all issued before the GPU reaches them, so each event pair then measures
# the GPU's time of its launch rather than how fast Python issues launches (which bounds kernels of a few
# microseconds). The same technique as nvbench's blocking kernel. PTX, so that no compiler is needed here.
HOLD_PTX = r"""
.version 7.0
.target sm_75
.address_size 64

.visible .entry tuner_hold(.param .u64 flag, .param .u64 limit_ns)
{
    .reg .pred %p<3>;
    .reg .b32 %r<2>;
    .reg .b64 %rd<6>;
    ld.param.u64 %rd1, [flag];
    ld.param.u64 %rd2, [limit_ns];
    mov.u64 %rd3, %globaltimer;
SPIN:
    ld.volatile.u32 %r1, [%rd1];
    setp.ne.s32 %p1, %r1, 0;
    @%p1 bra DONE;
    mov.u64 %rd4, %globaltimer;
    sub.s64 %rd5, %rd4, %rd3;
    setp.lt.u64 %p2, %rd5, %rd2;
    @%p2 bra SPIN;
DONE:
    ret;
}
"""
HOLD_LIMIT_NS = 200_000_000  # a safety net only: the host releases the hold long before
QUEUED_BATCH = 32  # launches queued per hold: far below the driver's queue depth, so issuing never blocks


def _hold():
    """(function, host flag array, its device pointer), built once per process."""
    _context()
    with _lock:
        if "hold" not in _state:
            module = drv.module_from_buffer(HOLD_PTX.encode())
            fn = module.get_function("tuner_hold")
            fn.prepare("PQ")
            flag = drv.pagelocked_zeros(1, np.uint32, mem_flags=drv.host_alloc_flags.DEVICEMAP)
            _state["hold"] = (module, fn, flag, flag.base.get_device_pointer())
    return _state["hold"][1:]


def time_launches(run, repeats: int, warmup: int = 3, queued: bool = True) -> list[float]:
    """Milliseconds of each of ``repeats`` calls of ``run()`` measured with CUDA events after ``warmup``.

    ``queued`` (for ``run`` that only enqueues work, such as a kernel launch) holds the stream while a batch
    of launches is issued, so that the times are the GPU's, not the host's issue rate; ``run`` must not
    synchronise then. With ``queued=False`` the launches are timed as they are issued.
    """
    _context()
    for _ in range(warmup):
        run()
    starts = [drv.Event() for _ in range(repeats)]
    ends = [drv.Event() for _ in range(repeats)]
    fn, flag, flag_ptr = _hold() if queued else (None, None, None)
    for i, (s, e) in enumerate(zip(starts, ends)):
        if queued and i % QUEUED_BATCH == 0:
            flag[0] = 0
            fn.prepared_call((1, 1, 1), (1, 1, 1), flag_ptr, np.uint64(HOLD_LIMIT_NS))
        s.record()
        run()
        e.record()
        if queued and (i % QUEUED_BATCH == QUEUED_BATCH - 1 or i == repeats - 1):
            flag[0] = 1
    if repeats:
        ends[-1].synchronize()
    return [e.time_since(s) for s, e in zip(starts, ends)]


# --- arrays of other libraries -------------------------------------------------------------------------

class DeviceView(NamedTuple):
    """A contiguous device array as its ``__cuda_array_interface__`` describes it.

    Attributes:
        ptr: its first byte; shape, dtype: its own; readonly: whether it may not be written;
        stream: the producer's stream (None, 1 or 2: a default stream).
    """

    ptr: int
    shape: tuple
    dtype: np.dtype
    readonly: bool
    stream: int | None


def _cupy_of(obj):
    """CuPy where ``obj`` is one of its arrays, else None (CuPy is not imported where the caller has not)."""
    cupy = sys.modules.get("cupy")
    return cupy if cupy is not None and type(obj) is getattr(cupy, "ndarray", None) else None


def is_device_array(obj) -> bool:
    """Whether ``obj`` is an array in device memory (it has ``__cuda_array_interface__``).

    Example:
        >>> is_device_array(np.zeros(3))
        False
    """
    # A CuPy array by its type: hasattr builds the whole interface (a dict) just to see that it is there.
    return _cupy_of(obj) is not None or hasattr(obj, "__cuda_array_interface__")


def view(obj) -> DeviceView:
    """Pointer, shape and dtype of a CuPy / PyTorch / PyCUDA array (no copy); non-contiguous is refused."""
    cupy = _cupy_of(obj)
    if cupy is not None:
        # Read from the array what its interface would say: building that dict twice a call (x and y) costs
        # microseconds, as much as a small graph's product. Its stream is CuPy's current one (0: the
        # default stream, which the interface gives as 1 or 2).
        if not obj.flags.c_contiguous:
            raise ValueError(f"device array with strides {obj.strides} is not contiguous: pass a contiguous copy")
        return DeviceView(obj.data.ptr, obj.shape, obj.dtype, False, cupy.cuda.get_current_stream().ptr or None)
    cai = obj.__cuda_array_interface__
    shape = tuple(cai["shape"])
    dtype = np.dtype(cai["typestr"])
    strides = cai.get("strides")
    if strides is not None and len(shape) >= 1:
        expected = np.empty(0, dtype).itemsize
        contiguous = tuple(strides) == tuple(int(np.prod(shape[i + 1:])) * expected for i in range(len(shape)))
        if not contiguous:
            raise ValueError(f"device array with strides {tuple(strides)} is not contiguous: pass a "
                             "contiguous copy")
    ptr, readonly = cai["data"]
    return DeviceView(ptr=int(ptr or 0), shape=shape, dtype=dtype, readonly=bool(readonly),
                      stream=cai.get("stream"))


_LEGACY_STREAMS = (None, 1, 2)


@lru_cache(maxsize=1)
def _libcuda():
    return ctypes.CDLL("libcuda.so.1")


def wait_for_stream(stream: int | None) -> bool:
    """Synchronise with a producer's stream unless it is a default stream (which our launches order with).

    Returns True when it had to synchronise, so the caller also synchronises its own work before handing
    the result back to that stream.
    """
    if stream in _LEGACY_STREAMS:
        return False
    err = _libcuda().cuStreamSynchronize(ctypes.c_void_p(stream))
    if err:
        raise RuntimeError(f"cuStreamSynchronize failed with CUDA error {err}")
    return True


def empty_like_kind(like, n: int, dtype: np.dtype):
    """A new device vector of ``n`` entries of the same library (CuPy, PyTorch, PyCUDA) as ``like``."""
    lib = type(like).__module__.split(".")[0]
    if lib == "cupy":
        import cupy
        return cupy.empty(n, dtype=dtype)
    if lib == "torch":
        import torch
        tdtype = {np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64}[np.dtype(dtype)]
        return torch.empty(n, dtype=tdtype, device=like.device)
    if lib == "pycuda":
        import pycuda.gpuarray as gpuarray
        return gpuarray.empty(n, dtype=dtype)
    raise TypeError(f"cannot allocate an output like {type(like).__name__}: pass out= (any contiguous "
                    "device array with __cuda_array_interface__)")
