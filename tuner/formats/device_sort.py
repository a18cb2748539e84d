"""Radix sorts of CuPy arrays over only the key bits that can be set, through CUB
(``templates/cub_sort.cu.j2``: a shared library nvcc builds once per GPU architecture into the binary cache,
:func:`prebuild` ahead of use or the first sort), on the current CuPy stream.

CuPy's ``argsort`` sorts every bit of its keys and carries 8-byte indices: a (row, column) key of a matrix
with 8M rows and columns has 46 bits that can be set, and a tile number 16 or fewer, so sorting those bits
alone, and the keys alone where nothing rides with them, moves a third to a quarter of the bytes.
"""
from __future__ import annotations

import ctypes
import threading

import numpy as np

from .. import codegen
from .xp import module

LIBRARY = "cub_sort"
_UNSIGNED = {4: ("u32", np.uint32), 8: ("u64", np.uint64)}
_lock = threading.Lock()
_libraries: dict = {}  # arch -> the loaded library
_paths: dict = {}  # arch -> where it was built (prebuild's cache, else the default one)


def source() -> str:
    """The library's CUDA source.

    Example:
        >>> "cub_sort_pairs_u64_u32" in source()
        True
    """
    return codegen.render("cub_sort.cu.j2", dict(kernel_name=LIBRARY))


def key_bits(largest: int) -> int:
    """Bits a key needs to hold every value up to ``largest`` (at least 1).

    Example:
        >>> key_bits(0), key_bits(1), key_bits(8_388_607), key_bits(8_388_608)
        (1, 1, 23, 24)
    """
    return max(int(largest).bit_length(), 1)


def prebuild(arch: str, cache=None) -> None:
    """Build the library for ``arch`` into ``cache`` (default: the default cache) ahead of the first sort,
    which then loads it from there: nvcc takes about ten seconds over CUB's templates.

    Example:
        >>> import tempfile; from tuner.cache import Cache
        >>> prebuild("sm_90", Cache(tempfile.mkdtemp()))  # doctest: +SKIP
    """
    from ..cache import Cache
    path = codegen.compile_library(source(), arch, cache or Cache())
    with _lock:
        _paths.setdefault(arch, path)


def _library(cupy):
    arch = f"sm_{cupy.cuda.Device().compute_capability}"
    with _lock:
        lib = _libraries.get(arch)
        if lib is None:
            path = _paths.get(arch)
            if path is None:
                from ..cache import Cache
                path = _paths[arch] = codegen.compile_library(source(), arch, Cache())
            lib = _libraries[arch] = ctypes.CDLL(str(path))
    return lib


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
    fn = getattr(_library(cupy), name)
    fn.restype = ctypes.c_int
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
