"""The few array operations the format builders need beyond what NumPy and CuPy spell alike, so that one
builder runs on host arrays (NumPy) or on device arrays (CuPy, whose sorts are CUB's radix sorts) and gives
the same arrays on both.

Example:
    >>> import numpy as np
    >>> repeat_by(np.array([7, 8, 9]), np.array([2, 0, 1])).tolist()
    [7, 7, 9]
"""
from __future__ import annotations

import functools

import numpy as np


def module(a):
    """The array module of ``a``: CuPy for a CuPy array, else NumPy (CuPy is never imported for NumPy).

    Example:
        >>> module(np.zeros(2)) is np
        True
    """
    if type(a).__module__.startswith("cupy"):
        import cupy
        return cupy
    return np


def on_device(a) -> bool:
    """True for a CuPy array.

    Example:
        >>> on_device(np.zeros(1))
        False
    """
    return module(a) is not np


def host(a):
    """``a`` as a NumPy array (a copy from the device for a CuPy array, through page-locked memory past a
    small size: :func:`~tuner.formats.device_reorder.download`; ``a`` itself otherwise).

    Example:
        >>> host([1, 2]).tolist()
        [1, 2]
    """
    if not on_device(a):
        return np.asarray(a)
    from .device_reorder import download
    return download(a)


def like(a, values):
    """``values`` (array-like) as an array of ``a``'s module (onto the device through page-locked memory past
    a small size: :func:`~tuner.formats.device_reorder.upload`).

    Example:
        >>> like(np.zeros(1), [3]).tolist()
        [3]
    """
    xp = module(a)
    if xp is np or on_device(values):
        return xp.asarray(values)
    from .device_reorder import upload
    return upload(np.asarray(values))


def stable_argsort(a):
    """Indices sorting ``a`` ascending, ties in index order (NumPy's radix sort for small integer types; on
    the device CUB's radix sort over an unsigned key's own bits, :mod:`~tuner.formats.device_sort`, else
    CuPy's argsort, which is always stable).

    Example:
        >>> stable_argsort(np.array([2, 1, 2, 0], np.uint16)).tolist()
        [3, 1, 0, 2]
    """
    xp = module(a)
    if xp is np:
        return np.argsort(a, kind="stable")
    if a.dtype.kind == "u" and a.dtype.itemsize <= 4:  # only the bits such keys have: CUB over 8-32 bits
        from .device_sort import argsort
        return argsort(a)[0]
    return xp.argsort(a)


def repeat_by(values, counts):
    """Each of ``values`` repeated ``counts`` times (np.repeat; CuPy's repeat takes no array of counts, so
    on the device each output position finds its source by a search of the counts' running sum).

    Example:
        >>> repeat_by(np.array([1, 2]), np.array([3, 1])).tolist()
        [1, 1, 1, 2]
    """
    if module(values) is np:
        return np.repeat(values, counts)
    return repeat_by_search(values, counts)


def repeat_by_search(values, counts):
    """:func:`repeat_by` as the device computes it, in either module: each output position finds its
    source by a search of the counts' running sum.

    Example:
        >>> repeat_by_search(np.array([1, 2, 3]), np.array([0, 2, 1])).tolist()
        [2, 2, 3]
    """
    xp = module(values)
    ends = xp.cumsum(xp.asarray(counts).astype(np.int64))
    total = int(ends[-1]) if ends.size else 0
    return values[xp.searchsorted(ends, xp.arange(total, dtype=np.int64), side="right")]


def segment_of(starts, n: int):
    """For every position 0 .. n-1 the segment holding it, segments beginning at ``starts`` (ascending,
    the first at 0): what ``repeat_by(arange(len(starts)), lengths)`` gives, by one search.

    Example:
        >>> segment_of(np.array([0, 2, 3]), 5).tolist()
        [0, 0, 1, 2, 2]
    """
    if module(starts) is np:
        return np.repeat(np.arange(starts.size, dtype=np.int64), np.diff(np.append(starts, n)))
    return segment_of_scan(starts, n)


def segment_of_search(starts, n: int):
    """:func:`segment_of` as the device computes it, in either module: one search per position (an empty
    segment's start repeats the next one's; the search lands on the last of them).

    Example:
        >>> segment_of_search(np.array([0, 2, 2, 3]), 5).tolist()
        [0, 0, 2, 3, 3]
    """
    xp = module(starts)
    return xp.searchsorted(starts, xp.arange(n, dtype=np.int64), side="right") - 1


def segment_of_scan(starts, n: int, dtype=np.int64):
    """:func:`segment_of` as the device computes it, in either module and as ``dtype``: each non-empty
    segment's start marked with its distance from the previous non-empty segment, then a running sum (one
    pass over the positions and no atomic adds, which empty segments sharing a start would contend on; a
    search per position costs one dependent load per halving of the segments).

    Example (an empty segment's start repeats the next one's; the sum lands on the last of them):
        >>> segment_of_scan(np.array([0, 2, 2, 3]), 5).tolist()
        [0, 0, 2, 3, 3]
    """
    xp = module(starts)
    starts = starts.astype(np.int64, copy=False)
    full = xp.flatnonzero(xp.diff(starts, append=xp.asarray([n], dtype=np.int64)) > 0)
    marks = xp.zeros(n, dtype=dtype)
    marks[starts[full]] = xp.diff(full, prepend=xp.zeros(1, dtype=full.dtype)).astype(dtype)
    return xp.cumsum(marks, dtype=dtype)


# CuPy's reductions (max, any, all, bincount's checks of its input, and user ReductionKernels alike) build a
# CUB kernel per type on first use: seconds of NVRTC each on a fresh install, in the middle of a first plan.
# The device passes use kernels of their own instead (:func:`largest`, :func:`tally`).
_LARGEST = r"""
template <typename T>
__global__ void tuner_largest(const T* a, long long n, unsigned long long* out) {
    unsigned long long best = 0;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        best = max(best, (unsigned long long)a[i]);
    for (int o = 16; o > 0; o >>= 1)  // every lane of every warp is here: whole blocks of warps
        best = max(best, __shfl_down_sync(0xffffffffu, best, o));
    if ((threadIdx.x & 31) == 0) atomicMax(out, best);
}
"""
_C_TYPES = {"uint8": "unsigned char", "uint16": "unsigned short", "uint32": "unsigned int",
            "uint64": "unsigned long long", "int8": "signed char", "int16": "short", "int32": "int",
            "int64": "long long"}
_FLOAT_TYPES = {"float32": "float", "float64": "double"}


@functools.cache
def _largest_module(cupy):
    return cupy.RawModule(code=_LARGEST, name_expressions=[f"tuner_largest<{t}>" for t in _C_TYPES.values()])


def largest(a) -> int:
    """The largest of the non-negative integers or booleans ``a`` (0 for none), in ``a``'s module (see above
    for why not CuPy's ``max``).

    Example:
        >>> largest(np.array([3, 9, 4])), largest(np.zeros(0, np.int32)), largest(np.array([False, True]))
        (9, 0, 1)
    """
    if a.size == 0:
        return 0
    if a.dtype == np.bool_:
        a = a.view(np.uint8)
    xp = module(a)
    if xp is np:
        return int(a.max())
    a = xp.ascontiguousarray(a)
    out = xp.zeros(1, np.uint64)
    block = 256
    grid = int(min(-(-a.size // block), 2048))
    _largest_module(xp).get_function(f"tuner_largest<{_C_TYPES[a.dtype.name]}>")(
        (grid,), (block,), (a, np.int64(a.size), out))
    return int(out.get()[0])


_SUM64 = r"""
#define BLOCK 256
__device__ double block_sum(double s) {  // thread 0 gets the block's sum, in a fixed order
    __shared__ double warps[BLOCK / 32];
    for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0) warps[threadIdx.x >> 5] = s;
    __syncthreads();
    s = threadIdx.x < BLOCK / 32 ? warps[threadIdx.x] : 0.0;
    if (threadIdx.x < 32)
        for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);
    return s;
}
template <typename T>
__global__ void tuner_dot64(const T* a, const T* b, int times, long long n, double* partials) {
    double s = 0.0;
    for (long long i = blockIdx.x * (long long)BLOCK + threadIdx.x; i < n; i += (long long)gridDim.x * BLOCK)
        s += times ? (double)a[i] * (double)b[i] : (double)a[i];
    s = block_sum(s);
    if (threadIdx.x == 0) partials[blockIdx.x] = s;
}
__global__ void tuner_sum_partials(const double* partials, int count, double* out) {
    double s = 0.0;
    for (int i = threadIdx.x; i < count; i += BLOCK) s += partials[i];
    s = block_sum(s);
    if (threadIdx.x == 0) *out = s;
}
"""
_SUM64_GRID = 1024  # fixed: the order of the additions, and so the sum, is the same at every call


@functools.cache
def _sum64_module(cupy):
    return cupy.RawModule(code=_SUM64, name_expressions=["tuner_dot64<float>", "tuner_dot64<double>",
                                                         "tuner_sum_partials"])


def sum64(a, b=None):
    """The float64 sum of the float32 or float64 ``a`` (times ``b``, of the same dtype, entry by entry) as a
    one-element array of ``a``'s module (on the device nothing waits for it), added in the same order at
    every call (see above for why not CuPy's ``sum``).

    Example:
        >>> sum64(np.array([1.5, 2.0], np.float32), np.array([2.0, 3.0], np.float32)).tolist()
        [9.0]
    """
    kind = _FLOAT_TYPES.get(a.dtype.name)
    if kind is None:
        raise ValueError(f"sum64 adds float32 or float64 values, got {a.dtype}")
    xp = module(a)
    if xp is np:
        a64 = a.astype(np.float64, copy=False)
        return np.array([a64.sum() if b is None else a64 @ b.astype(np.float64, copy=False)])
    a = xp.ascontiguousarray(a)
    b = None if b is None else xp.ascontiguousarray(b.astype(a.dtype, copy=False))
    partials, out = xp.empty(_SUM64_GRID, np.float64), xp.empty(1, np.float64)
    grid = int(max(1, min(-(-a.size // 256), _SUM64_GRID)))
    module_ = _sum64_module(xp)
    module_.get_function(f"tuner_dot64<{kind}>")((grid,), (256,), (a, a if b is None else b, np.int32(b is not None),
                                                                 np.int64(a.size), partials))
    module_.get_function("tuner_sum_partials")((1,), (256,), (partials, np.int32(grid), out))
    return out


_TALLY = r"""
#define TALLY_BINS 2048
#define TALLY_RUN 8
template <typename A>
__device__ __forceinline__ void tally_add(A* local, A* out, unsigned long long b, A x) {
    if (b < TALLY_BINS) atomicAdd(&local[b], x);
    else atomicAdd(&out[b], x);
}
// Counts (or weight sums) of each value below ``bins``. The low bins, where the rows and warps of power-law
// graphs crowd, are kept per block in shared memory; each thread adds a run of consecutive values at a time,
// once per change of value (rows sorted by length repeat it), so the atomic adds that reach global memory
// are a block's per bin, and the values above the shared bins (few: long rows) go there directly.
template <typename V, typename W, typename A>
__global__ void tuner_tally(const V* v, const W* w, int weighted, long long n, long long bins, A* out) {
    __shared__ A local[TALLY_BINS];
    const int kept = bins < TALLY_BINS ? (int)bins : TALLY_BINS;
    for (int i = threadIdx.x; i < kept; i += blockDim.x) local[i] = 0;
    __syncthreads();
    const long long step = (long long)gridDim.x * blockDim.x * TALLY_RUN;
    for (long long at = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * TALLY_RUN; at < n; at += step) {
        const long long end = min(at + TALLY_RUN, n);
        unsigned long long cur = (unsigned long long)v[at];
        A acc = 0;
        for (long long i = at; i < end; ++i) {
            const unsigned long long b = (unsigned long long)v[i];
            if (b != cur) { tally_add(local, out, cur, acc); cur = b; acc = 0; }
            acc += weighted ? (A)w[i] : (A)1;
        }
        tally_add(local, out, cur, acc);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < kept; i += blockDim.x)
        if (local[i] != (A)0) atomicAdd(&out[i], local[i]);
}
"""
_TALLY_RUN = 8  # TALLY_RUN of the kernel: consecutive values a thread adds
_TALLY_GRID = 1024  # blocks: each flushes its shared bins once, so fewer, fuller blocks add less to global


@functools.cache
def _tally_kernel(cupy, values: str, weights: str, sums: str):
    """One instantiation per type triple, compiled on first use (cached on disk by CuPy)."""
    name = f"tuner_tally<{values},{weights},{sums}>"
    return cupy.RawModule(code=_TALLY, name_expressions=[name]).get_function(name)


def tally(values, n: int, weights=None):
    """float64 counts of each of 0 .. ``n`` - 1 among the non-negative integers ``values`` (each below
    ``n``: :func:`largest` + 1 is enough), or the sums of their ``weights``: np.bincount of a given length,
    in ``values``' module (on the device by a kernel of its own, see above for why not CuPy's bincount: the
    low bins per block in shared memory, as contended atomic adds to a few global addresses take 30 times as
    long on a 30M-row graph).

    Example:
        >>> tally(np.array([2, 0, 2]), 4).tolist(), tally(np.array([1, 1]), 2, np.array([0.5, 2.0])).tolist()
        ([1.0, 0.0, 2.0, 0.0], [0.0, 2.5])
    """
    xp = module(values)
    if xp is np:
        return np.bincount(values, weights=weights, minlength=n)[:n].astype(np.float64)
    values = xp.ascontiguousarray(values.view(np.uint8) if values.dtype == np.bool_ else values)
    exact = weights is None or weights.dtype.kind in "iub"
    acc = np.uint64 if exact else np.float64
    out = xp.zeros(max(int(n), 1), acc)
    if values.size:
        w = None if weights is None else xp.ascontiguousarray(
            weights.view(np.uint8) if weights.dtype == np.bool_ else weights)
        v_type = _C_TYPES[values.dtype.name]
        w_type = v_type if w is None else _FLOAT_TYPES.get(w.dtype.name) or _C_TYPES[w.dtype.name]
        kernel = _tally_kernel(xp, v_type, w_type, "unsigned long long" if exact else "double")
        grid = int(max(1, min(-(-values.size // (256 * _TALLY_RUN)), _TALLY_GRID)))
        kernel((grid,), (256,), (values, values if w is None else w, np.int32(w is not None), np.int64(values.size),
                                 np.int64(n), out))
    # Integer sums added modulo 2**64 are the signed totals read as int64.
    return (out.view(np.int64) if exact else out)[:n].astype(np.float64)


def prefix(counts, dtype=np.int64):
    """``[0, counts[0], counts[0] + counts[1], ...]`` in ``counts``' module (len(counts) + 1 values).

    Example:
        >>> prefix(np.array([2, 3])).tolist()
        [0, 2, 5]
    """
    xp = module(counts)
    out = xp.zeros(counts.size + 1, dtype=dtype)
    xp.cumsum(counts, dtype=dtype, out=out[1:])
    return out


def row_tasks(indptr, entries: int, dtype=np.int32) -> tuple:
    """(task_row, task_first, tasks): every row's entries cut into tasks of up to ``entries`` in order (none
    for an empty row), as ``dtype`` in ``indptr``'s module: each task's row and each row's first task (then
    the total), so that task t of row r covers entries indptr[r] + (t - task_first[r]) x ``entries`` onwards.
    A kernel that gives each task a group of lanes spreads a hub's row over many groups instead of one.
    On the device the rows come from one search per task (:func:`segment_of_search`): a handful of launches
    and one read of the total, which a walk that tries task sizes between its iterations waits for.

    Example (rows of 0, 600 and 3 entries, tasks of 256: none, three and one):
        >>> row, first, tasks = row_tasks(np.array([0, 0, 600, 603]), 256)
        >>> row.tolist(), first.tolist(), tasks
        ([1, 1, 1, 2], [0, 0, 3, 4], 4)
    """
    if entries < 1:
        raise ValueError(f"a task holds at least one entry, got {entries}")
    counts = (indptr[1:] - indptr[:-1] + (entries - 1)) // entries
    first = prefix(counts, dtype)
    tasks = int(first[-1])
    if module(indptr) is np:
        rows = np.repeat(np.arange(counts.size, dtype=dtype), counts)
    else:
        rows = segment_of_search(first[:-1], tasks).astype(dtype)
    return rows, first, tasks
