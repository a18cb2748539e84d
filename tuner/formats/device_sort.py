"""Radix sorts of CuPy arrays over only the key bits that can be set, through CUB
(``templates/cub_sort.cu.j2``: a shared library per sort, which nvcc builds side by side once per GPU
architecture into the binary cache, :func:`prebuild` ahead of use or the first sort), on the current CuPy
stream.

CuPy's ``argsort`` sorts every bit of its keys and carries 8-byte indices: a (row, column) key of a matrix
with 8M rows and columns has 46 bits that can be set, and a tile number 16 or fewer, so sorting those bits
alone, and the keys alone where nothing rides with them, moves a third to a quarter of the bytes.
"""
from __future__ import annotations

import ctypes
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .. import codegen
from .xp import module

LIBRARY = "cub_sort"
_UNSIGNED = {4: ("u32", np.uint32), 8: ("u64", np.uint64)}
# Every sort, each a library of its own: nvcc takes 17 s over all six in one source on an H200 host, 10 s
# over the six side by side (the slowest alone).
FUNCTIONS = tuple(f"{LIBRARY}_keys_{k}" for k in ("u32", "u64")) + tuple(
    f"{LIBRARY}_pairs_{k}_{v}" for k in ("u32", "u64") for v in ("u32", "u64"))
_lock = threading.Lock()
_functions: dict = {}  # (arch, function) -> the function, loaded
_paths: dict = {}  # (arch, function) -> where its library was built (prebuild's cache, else the default one)


def source(function: str | None = None) -> str:
    """The CUDA source of ``function``'s library (one of :data:`FUNCTIONS`), or of all of them in one.

    Example:
        >>> "cub_sort_pairs_u64_u32(" in source(), "cub_sort_pairs_u64_u32(" in source("cub_sort_keys_u64")
        (True, False)
    """
    if function is not None and function not in FUNCTIONS:
        raise ValueError(f"no sort {function!r}: one of {FUNCTIONS}")
    return codegen.render("cub_sort.cu.j2", dict(kernel_name=LIBRARY, only=function or ""))


def key_bits(largest: int) -> int:
    """Bits a key needs to hold every value up to ``largest`` (at least 1).

    Example:
        >>> key_bits(0), key_bits(1), key_bits(8_388_607), key_bits(8_388_608)
        (1, 1, 23, 24)
    """
    return max(int(largest).bit_length(), 1)


def prebuild(arch: str, cache=None) -> None:
    """Build every sort's library for ``arch`` into ``cache`` (default: the default cache) ahead of the first
    sort, which then loads it from there: nvcc runs side by side, about ten seconds over CUB's templates.

    Example:
        >>> import tempfile; from tuner.cache import Cache
        >>> prebuild("sm_90", Cache(tempfile.mkdtemp()))  # doctest: +SKIP
    """
    from ..cache import Cache
    cache = cache or Cache()
    with ThreadPoolExecutor(max_workers=len(FUNCTIONS)) as pool:
        paths = list(pool.map(lambda f: codegen.compile_library(source(f), arch, cache), FUNCTIONS))
    with _lock:
        for function, path in zip(FUNCTIONS, paths):
            _paths.setdefault((arch, function), path)


def _function(cupy, name: str):
    """Sort ``name`` for the current device, its library loaded (every sort's library built first, side by side,
    where none was)."""
    arch = f"sm_{cupy.cuda.Device().compute_capability}"
    with _lock:
        fn = _functions.get((arch, name))
        if fn is not None:
            return fn
        path = _paths.get((arch, name))
    if path is None:
        prebuild(arch)
    with _lock:
        if (arch, name) not in _functions:
            fn = getattr(ctypes.CDLL(str(_paths[(arch, name)])), name)
            fn.restype = ctypes.c_int
            _functions[(arch, name)] = fn
        return _functions[(arch, name)]


def sort(keys, values=None, end_bit: int | None = None):
    """``keys`` (unsigned or non-negative integers of 4 or 8 bytes) sorted ascending by their low ``end_bit``
    bits (default all), ties kept in their order, and ``values`` (4 or 8 bytes an item, any dtype) moved with
    them: ``(sorted keys, sorted values or None)``. CuPy arrays are sorted by CUB and consumed (their buffers
    are sorted in place and one of them may be returned); NumPy arrays, the host's stand-in, by NumPy.

    Example (on a GPU machine):
        >>> k, v = sort(cupy.array([3, 1, 2], np.uint64), cupy.array([30, 10, 20], np.int32), end_bit=2)  # doctest: +SKIP
        >>> k.tolist(), v.tolist()                                                                       # doctest: +SKIP
        ([1, 2, 3], [10, 20, 30])
    """
    n = int(keys.size)
    if values is not None and int(values.size) != n:
        raise ValueError(f"sort: {n} keys but {values.size} values")
    if module(keys) is np:  # the host's stand-in (the builders' formulas run with NumPy in the tests)
        mask = np.array((1 << end_bit) - 1 if end_bit is not None and end_bit < 64 else -1).astype(keys.dtype)
        order = np.argsort(keys & mask, kind="stable")
        return keys[order], None if values is None else values[order]
    import cupy
    key_name, key_type = _UNSIGNED[keys.dtype.itemsize]
    end_bit = 8 * keys.dtype.itemsize if end_bit is None else int(end_bit)
    if n <= 1:
        return keys, values
    keys_b = cupy.empty(n, key_type)
    bufs = [keys.view(key_type), keys_b]
    name = f"{LIBRARY}_keys_{key_name}"
    if values is not None:
        val_name, val_type = _UNSIGNED[values.dtype.itemsize]
        name = f"{LIBRARY}_pairs_{key_name}_{val_name}"
        bufs += [values.view(val_type), cupy.empty(n, val_type)]
    fn = _function(cupy, name)
    ptrs = [ctypes.c_void_p(b.data.ptr) for b in bufs]
    stream = ctypes.c_void_p(cupy.cuda.get_current_stream().ptr)
    selector, temp_bytes = ctypes.c_int(0), ctypes.c_size_t(0)
    args = (ctypes.c_longlong(n), ctypes.c_int(0), ctypes.c_int(end_bit), ctypes.byref(selector), stream)
    status = fn(ctypes.c_void_p(0), ctypes.byref(temp_bytes), *ptrs, *args)
    if status == 0:
        temp = cupy.empty(max(int(temp_bytes.value), 1), np.uint8)
        status = fn(ctypes.c_void_p(temp.data.ptr), ctypes.byref(temp_bytes), *ptrs, *args)
    if status != 0:
        raise RuntimeError(f"{name} failed with CUDA error {status}")
    pick = selector.value
    out_keys = bufs[pick].view(keys.dtype)
    out_values = None if values is None else bufs[2 + pick].view(values.dtype)
    return out_keys, out_values


def argsort(keys, end_bit: int | None = None, index_dtype=np.int64):
    """The stable order sorting ``keys`` (CuPy, unsigned or non-negative integers of 4 or fewer bytes) by
    their low ``end_bit`` bits, as ``index_dtype``, and the sorted keys as uint32: ``(order, sorted keys)``.

    Example (on a GPU machine):
        >>> order, k = argsort(cupy.array([2, 1, 2, 0], np.uint16))   # doctest: +SKIP
        >>> order.tolist(), k.tolist()                                 # doctest: +SKIP
        ([3, 1, 0, 2], [0, 1, 2, 2])
    """
    import cupy
    n = int(keys.size)
    end_bit = 8 * keys.dtype.itemsize if end_bit is None else int(end_bit)
    wide = keys.astype(np.uint32)  # a copy: the sort consumes it
    index = cupy.arange(n, dtype=np.uint32 if n < 1 << 32 else np.uint64)
    sorted_keys, order = sort(wide, index, end_bit)
    return order.astype(index_dtype), sorted_keys
