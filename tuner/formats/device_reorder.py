"""A matrix's CSR arrays on the GPU (CuPy), and the relabelled matrix B = A[row_order][:, col_order] built
there (one CUB radix sort of (row, new column) keys over only their bits:
:mod:`~tuner.formats.device_sort`): the same arrays :func:`~tuner.formats.reorder.permute` builds on the host.

On the host the row gather, the column relabel and the per-row sort take seconds for 100M entries; on the
GPU they take milliseconds. The matrix crosses PCIe once (:func:`device_csr`, through pinned staging
buffers filled by several threads), and the relabelled copy stays on the device for the layout builders
(:mod:`tuner.formats.tiles` and the layouts built from it run on CuPy arrays too). Used where CuPy and a GPU
are present, the matrix is large enough for the copies to pay (``MIN_NNZ``) and the device has room for
the work arrays.
"""
from __future__ import annotations

import sys
import threading
import weakref
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from ..staging import DIRECT_MAX_BYTES, STAGE_BYTES, StagingRental, drain, feed
from .device_sort import key_bits, sort
from .xp import host, like, module, segment_of_scan

# A copy between the device and pageable host memory holds up every other thread's kernel launches for its
# whole length (an 80 MB copy down held a caller's products 20 ms each on an H200); upload and download copy
# past this size through page-locked memory on the current stream, which holds up only that stream: always
# from a background tuning's stream, and from a caller's once the rental has bought it (before, what a
# caller's pageable copy holds up is at most a tuning beside it).
PAGEABLE_MAX_BYTES = 1 << 18
RENTAL = StagingRental()  # whether copies past PAGEABLE_MAX_BYTES go through locked memory yet
MIN_NNZ = 1 << 20  # below this the host permutes in tens of milliseconds: not worth two copies
# Work of an entry being relabelled, with room to spare: its row (4 B), its key and the sort's second buffer
# (8 B each), its value and the value's second buffer; the layout builders' per-entry arrays stay below it too.
WORK_BYTES_PER_ENTRY = 64
CHUNK_ENTRIES = 1 << 27  # entries relabelled at once: their work arrays (about 9 GB) and no more are live


def available() -> bool:
    """True when CuPy can reach a GPU."""
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - no CuPy, no driver, no device: the host permutes
        return False


def fits(nnz: int, free_bytes: int) -> bool:
    """Whether the work arrays of ``nnz`` entries fit ``free_bytes`` of device memory, with half to spare.

    Example:
        >>> fits(100_000_000, 80 * 10**9), fits(2_000_000_000, 80 * 10**9)
        (True, False)
    """
    return 2 * WORK_BYTES_PER_ENTRY * nnz <= free_bytes


def usable(n_rows: int, n_cols: int, nnz: int, need_bytes: int | None = None) -> bool:
    """Whether to relabel and build layouts on the GPU: large enough, sort keys of (row, column) fit 63
    bits, a device with room for ``need_bytes`` (default: the work arrays of every entry at once, with half
    to spare, :func:`fits`).

    Example:
        >>> usable(10, 10, 100)
        False
    """
    if nnz < MIN_NNZ or n_rows >= 1 << 31 or n_cols >= 1 << 32 or not available():
        return False
    if need_bytes is None:
        return fits(nnz, free_bytes())
    return need_bytes <= free_bytes()


def relabel_bytes(nnz: int, entry_bytes: int) -> int:
    """Device memory :func:`permute_device` needs for ``nnz`` entries of ``entry_bytes`` (index and value):
    the input and the output, and the work arrays of one piece of :data:`CHUNK_ENTRIES` entries.

    Example (2.1 billion int32 pattern entries: 17 GB of copies and a 9 GB piece):
        >>> round(relabel_bytes(2_100_000_000, 4) / 1e9, 1)
        25.4
    """
    return 2 * entry_bytes * nnz + WORK_BYTES_PER_ENTRY * min(nnz, CHUNK_ENTRIES)


def free_bytes() -> int:
    """Device memory CuPy can have: what the device has free and what CuPy's pool holds unused."""
    with on_device() as cupy:
        return cupy.cuda.runtime.memGetInfo()[0] + cupy.get_default_memory_pool().free_bytes()


@contextmanager
def on_device():
    """CuPy, working on the process's GPU (:func:`tuner.gpu.select_device`) inside the block."""
    import cupy

    from .. import gpu
    with cupy.cuda.Device(gpu.selected_device()):
        yield cupy


@dataclass(frozen=True, eq=False)
class DeviceCsr:
    """CSR arrays on the GPU (CuPy): row pointers and column indices in the matrix's index dtype, values in
    its value dtype (None for a pattern matrix: its kernels never read them).

    Attributes:
        indptr, indices, data: the arrays.
    """

    indptr: object
    indices: object
    data: object | None

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.indptr, self.indices, self.data) if a is not None)


_copies: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def device_csr(m) -> DeviceCsr:
    """``m``'s arrays on the GPU, uploaded once per matrix (kept while ``m`` lives, or until
    :func:`forget`). Runs on the process's GPU (:func:`tuner.gpu.select_device`)."""
    with _lock:
        hit = _copies.get(m)
        if hit is None:
            with on_device():
                expect_uploads(m.indptr.nbytes, m.indices.nbytes, 0 if m.value_free else m.data.nbytes)
                hit = DeviceCsr(upload(m.indptr), upload(m.indices), None if m.value_free else upload(m.data))
            _copies[m] = hit
    return hit


def known_copy(m) -> DeviceCsr | None:
    """``m``'s device arrays if they are there (uploaded, or built there by :func:`permute_device`)."""
    return _copies.get(m)


def keep(m, csr: DeviceCsr) -> None:
    """Record ``csr`` as ``m``'s device arrays (the relabelled matrix, built on the device)."""
    with _lock:
        _copies[m] = csr


def forget(m) -> None:
    """Drop ``m``'s device arrays (and those its :class:`HostMirror` arrays wait on) and return the memory
    CuPy held for them to the device."""
    with _lock:
        _copies.pop(m, None)
    for a in (getattr(m, "indices", None), getattr(m, "data", None)):
        if isinstance(a, HostMirror):
            a.detach()
    release()


def release() -> None:
    """Return the device memory CuPy keeps for reuse: the tuned kernels allocate outside its pool (nothing
    to do where CuPy was never used). Inside :func:`releases_deferred`, only when the device runs short.
    """
    cupy = sys.modules.get("cupy")
    if cupy is None:
        return
    if getattr(_deferred, "on", False):
        with on_device():
            free, total = cupy.cuda.runtime.memGetInfo()
        if free >= total * DEFERRED_FREE_SHARE:
            return
    cupy.get_default_memory_pool().free_all_blocks()


# A release frees with cudaFree, which waits for the whole device: every product another thread has queued
# by then waits behind the tuning's sorts. A background tuning therefore keeps CuPy's blocks (its next
# steps reuse them) while the device has at least this share of its memory free, and releases once at its end.
DEFERRED_FREE_SHARE = 0.125
_deferred = threading.local()


@contextmanager
def releases_deferred():
    """:func:`release` in this thread frees CuPy's cached blocks inside the block only when less than
    :data:`DEFERRED_FREE_SHARE` of the device's memory is free; once at the end in any case.

    Example (on a GPU machine):
        >>> with releases_deferred():  # doctest: +SKIP
        ...     tuned = tune()          # its relabelling and layouts keep their work blocks cached
    """
    before = getattr(_deferred, "on", False)
    _deferred.on = True
    try:
        yield
    finally:
        _deferred.on = before
        if not before:
            release()


def synchronize() -> None:
    """Wait for the work queued on the process's GPU (nothing to do where CuPy was never used)."""
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        with on_device():
            cupy.cuda.Device().synchronize()


def finish() -> None:
    """Wait for the work this thread queued on its current CuPy stream (nothing to do where CuPy was never
    used): what it built is then complete for any stream to read. Unlike :func:`synchronize` it does not
    wait for what other threads queued elsewhere, such as a caller's products beside a background tuning.

    Example (on a GPU machine):
        >>> launch = family.device_launch(m, params); finish()  # doctest: +SKIP
    """
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        with on_device():
            cupy.cuda.get_current_stream().synchronize()


def expect_uploads(*nbytes: int) -> None:
    """Arrays of ``nbytes`` each are about to be uploaded one after another (a matrix's): the staging rental
    (:data:`RENTAL`) buys the buffers first where those that would go through them pass its rent together.

    Example:
        >>> expect_uploads(4 << 20, 40 << 20)  # doctest: +SKIP
    """
    RENTAL.expect(sum(b for b in nbytes if b > PAGEABLE_MAX_BYTES))


def upload(array: np.ndarray):
    """A CuPy copy of a host array: up to :data:`PAGEABLE_MAX_BYTES` directly, up to
    :data:`~tuner.staging.DIRECT_MAX_BYTES` through one page-locked block on the current stream, larger ones
    through two pinned staging buffers (pageable copies run at a tenth of PCIe's rate and hold other threads'
    launches), each filled by several threads while the other one is on its way; all of them once locking
    host memory pays (:data:`RENTAL`): until then a caller's copies on a default stream go pageable, on the
    current stream.

    Example (on a GPU machine):
        >>> upload(np.arange(5)).get().tolist()  # doctest: +SKIP
        [0, 1, 2, 3, 4]
    """
    import cupy
    a = np.asarray(array, order="C")  # its own shape (0-d stays 0-d), contiguous
    out = cupy.empty(a.shape, a.dtype)
    n = a.nbytes
    if n <= PAGEABLE_MAX_BYTES:
        out.set(a)
        return out
    if not RENTAL.locked(n, _foreground(cupy)):
        out.set(a, stream=cupy.cuda.get_current_stream())  # ordered after the stream's kernels, as below
        return out
    if n <= DIRECT_MAX_BYTES:  # one locked block of CuPy's pool, copied on the current stream
        stream = cupy.cuda.get_current_stream()
        locked = _locked_like(cupy, a)
        np.copyto(locked, a)
        out.set(locked, stream=stream)
        stream.synchronize()  # before the block goes back to the pool
        return out
    buffers = [cupy.cuda.alloc_pinned_memory(STAGE_BYTES) for _ in range(2)]
    stages = [np.frombuffer(b, np.uint8, STAGE_BYTES) for b in buffers]
    stream = cupy.cuda.Stream(non_blocking=True)
    # CuPy may hand ``out`` memory freed by kernels still queued on the current stream: the copies wait for them.
    stream.wait_event(cupy.cuda.get_current_stream().record())
    left = [None, None]

    def put(k, start, size):
        cupy.cuda.runtime.memcpyAsync(out.data.ptr + start, stages[k].ctypes.data, size,
                                      cupy.cuda.runtime.memcpyHostToDevice, stream.ptr)
        left[k] = stream.record()
    feed(a.reshape(-1).view(np.uint8), stages, put, lambda k: left[k].synchronize())
    return out


def download(array, out: np.ndarray | None = None) -> np.ndarray:
    """A host copy of a CuPy array, as :func:`upload` copies (small ones directly, mid-sized ones through
    one page-locked block) or through two pinned staging buffers, each emptied by several threads while
    the next one fills (a copy into pageable memory runs at a tenth of PCIe's rate), once locking host
    memory pays (:data:`RENTAL`). ``out``: a
    C-contiguous host array of its shape and dtype to copy into (default: a new one).

    Example (on a GPU machine):
        >>> import cupy; download(cupy.arange(5)).tolist()  # doctest: +SKIP
        [0, 1, 2, 3, 4]
    """
    import cupy
    if out is None:
        out = np.empty(array.shape, array.dtype)
    elif out.shape != tuple(array.shape) or out.dtype != array.dtype or not out.flags.c_contiguous:
        raise ValueError(f"download into {out.dtype}{out.shape}: the array is {array.dtype}{tuple(array.shape)}, "
                         "and the destination must be C-contiguous")
    n = out.nbytes
    if n <= PAGEABLE_MAX_BYTES:
        np.copyto(out, array.get())
        return out
    if not RENTAL.locked(n, _foreground(cupy)):
        cupy.ascontiguousarray(array).get(stream=cupy.cuda.get_current_stream(), out=out)
        return out
    if n <= DIRECT_MAX_BYTES:  # one locked block of CuPy's pool, copied on the current stream
        locked = _locked_like(cupy, out)
        cupy.ascontiguousarray(array).get(stream=cupy.cuda.get_current_stream(), out=locked)
        np.copyto(out, locked)
        return out
    src = cupy.ascontiguousarray(array)
    buffers = [cupy.cuda.alloc_pinned_memory(STAGE_BYTES) for _ in range(2)]
    stages = [np.frombuffer(b, np.uint8, STAGE_BYTES) for b in buffers]
    stream = cupy.cuda.Stream(non_blocking=True)
    cupy.cuda.get_current_stream().synchronize()  # the array is complete before the side stream reads it
    done = [None, None]

    def fetch(k, start, size):
        cupy.cuda.runtime.memcpyAsync(stages[k].ctypes.data, src.data.ptr + start, size,
                                      cupy.cuda.runtime.memcpyDeviceToHost, stream.ptr)
        done[k] = stream.record()
    drain(out.reshape(-1).view(np.uint8), stages, fetch, lambda k: done[k].synchronize())
    return out


def _foreground(cupy) -> bool:
    """Whether this thread copies on a default stream (legacy or per-thread), as a caller does; a background
    tuning queues on a stream of its own beside the caller's products, which a pageable copy would hold up."""
    return cupy.cuda.get_current_stream().ptr in (0, 1, 2)  # null, cudaStreamLegacy, cudaStreamPerThread


def _locked_like(cupy, a: np.ndarray) -> np.ndarray:
    """A page-locked host array of ``a``'s shape and dtype on a block of CuPy's pool (back there once
    dropped). The pool reuses a block only for a request of its size, and locking new memory takes
    milliseconds, so blocks come in powers of two from 1 MiB: a few sizes, each locked once."""
    block = cupy.cuda.alloc_pinned_memory(max(1 << 20, 1 << (a.nbytes - 1).bit_length()))
    return np.frombuffer(block, a.dtype, a.size).reshape(a.shape)


def device_col_lengths(csr: DeviceCsr, n_cols: int):
    """Stored entries per column (int64), counted and left where ``csr`` is (one atomic add per entry: a
    tenth of a second for 500M entries, so a matrix's count is made once and reused).

    Example:
        >>> device_col_lengths(DeviceCsr(np.array([0, 2, 3]), np.array([0, 2, 2]), None), 4).tolist()
        [1, 0, 2, 0]
    """
    xp = module(csr.indices)
    if xp is np:
        return np.bincount(csr.indices, minlength=n_cols).astype(np.int64)
    # Not CuPy's bincount: its checks of the indices' least and greatest values are reductions that CuPy
    # builds as CUB kernels on first use, seconds of NVRTC each on a fresh install. A column holds at most
    # one entry per row: fewer than 2^32.
    counts = xp.zeros(n_cols, np.uint32)
    xp.add.at(counts, csr.indices, np.uint32(1))
    return counts.astype(np.int64)


def col_lengths(csr: DeviceCsr, n_cols: int) -> np.ndarray:
    """:func:`device_col_lengths` on the host.

    Example (on a GPU machine):
        >>> import scipy.sparse as sp; from tuner.matrix import canonicalize  # doctest: +SKIP
        >>> col_lengths(device_csr(canonicalize(sp.eye(3, format="csr"))), 3).tolist()  # doctest: +SKIP
        [1, 1, 1]
    """
    return host(device_col_lengths(csr, n_cols))


def permute_device(csr: DeviceCsr, row_order: np.ndarray, col_rank: np.ndarray) -> DeviceCsr:
    """The permuted CSR on the device, columns ascending in every row: new row i is old row
    ``row_order[i]``; ``col_rank``: each old column's new index (the inverse of the column order)."""
    with on_device() as cupy:
        out = _permute(cupy, csr, row_order, col_rank)
    release()
    return out


def _permute(cupy, csr: DeviceCsr, row_order, col_rank, chunk_entries: int | None = None) -> DeviceCsr:
    chunk_entries = CHUNK_ENTRIES if chunk_entries is None else chunk_entries
    index_dtype = csr.indices.dtype
    ptr = csr.indptr.astype(np.int64)
    order = like(csr.indices, row_order).astype(np.int64)
    n = order.size
    lengths = (ptr[1:] - ptr[:-1])[order]
    new_ptr = cupy.zeros(n + 1, np.int64)
    cupy.cumsum(lengths, out=new_ptr[1:])
    del lengths
    nnz = int(csr.indices.size)
    col_rank = like(csr.indices, col_rank)
    out_cols = cupy.empty(nnz, index_dtype)
    out_data = None if csr.data is None else cupy.empty(nnz, csr.data.dtype)
    # Output rows in pieces of about chunk_entries entries (a row longer than that is a piece of its own): the
    # work arrays below are a piece's, so the device holds the input, the output and one piece's work.
    cuts = cupy.searchsorted(new_ptr, cupy.arange(0, nnz, max(int(chunk_entries), 1), dtype=np.int64),
                             side="right") - 1
    cuts = np.unique(np.concatenate([[0], host(cuts), [n]]))
    col_bits = key_bits(col_rank.size - 1)
    starts = ptr[order]  # each new row's first entry in the source arrays
    for r0, r1 in zip(cuts[:-1].tolist(), cuts[1:].tolist()):
        e0, e1 = (int(v) for v in host(new_ptr[[r0, r1]]))
        if e1 == e0:
            continue
        # Each entry's row within the piece (a running sum over the rows' starts), then its (row, new
        # column) key and value in one pass; one radix sort of the key's bits orders every row of the piece.
        piece_ptr = new_ptr[r0:r1 + 1] - e0
        row = segment_of_scan(piece_ptr[:-1], e1 - e0, np.int32)
        key = cupy.empty(e1 - e0, np.uint64)
        vals = None if out_data is None else cupy.empty(e1 - e0, out_data.dtype)
        args = (row, starts[r0:r1], piece_ptr, csr.indices, col_rank, np.int32(col_bits))
        if cupy is np:  # the host's stand-in for the kernel below
            src = starts[r0:r1][row] + (np.arange(e1 - e0) - piece_ptr[row])
            key[:] = (row.astype(np.uint64) << np.uint64(col_bits)) | col_rank[csr.indices[src]].astype(np.uint64)
            if vals is not None:
                vals[:] = csr.data[src]
            del src
        elif vals is None:
            _relabel_keys(cupy, False)(*args, key)
        else:
            _relabel_keys(cupy, True)(*args, csr.data, key, vals)
        del row
        key, vals = sort(key, vals, key_bits(r1 - r0 - 1) + col_bits)
        out_cols[e0:e1] = key & np.uint64((1 << col_bits) - 1)
        if out_data is not None:
            out_data[e0:e1] = vals
        del key, vals
    return DeviceCsr(new_ptr.astype(index_dtype), out_cols, out_data)


_key_kernels: dict = {}


def _relabel_keys(cupy, valued: bool):
    """The kernel writing each entry's sort key (row within the piece, then the new column) and, where
    ``valued``, its value: entry i of the piece lies in piece row ``row[i]``, at ``i - piece_ptr[row]``
    past that row's first source entry ``start[row]``."""
    kernel = _key_kernels.get(valued)
    if kernel is None:
        source = ("long long s = start[row] + (i - piece_ptr[row]);\n"
                  "key = ((unsigned long long)row << col_bits) | (unsigned long long)col_rank[indices[s]];\n")
        params = "int32 row, raw int64 start, raw int64 piece_ptr, raw I indices, raw R col_rank, int32 col_bits"
        if valued:
            kernel = cupy.ElementwiseKernel(params + ", raw V data", "uint64 key, V val", source + "val = data[s];\n",
                                            "tuner_relabel_keys_values")
        else:
            kernel = cupy.ElementwiseKernel(params, "uint64 key", source, "tuner_relabel_keys")
        _key_kernels[valued] = kernel
    return kernel


def _sources(xp, ptr, rows, new_ptr):
    """For the entries of ``rows`` gathered in that order (``new_ptr``: their row pointers, from any offset):
    each entry's place among ``rows`` and its position in the source arrays (row pointers ``ptr``)."""
    pos = xp.arange(int(new_ptr[0]), int(new_ptr[-1]), dtype=np.int64)
    row = xp.searchsorted(new_ptr, pos, side="right") - 1
    return row, ptr[rows[row]] + (pos - new_ptr[row])


def gather_rows(indptr, indices, data, rows):
    """Rows ``rows`` of a CSR matrix, in that order, as ``(indptr, indices, data)`` (int64 row pointers;
    ``data`` None stays None), entries in each row as they were: SciPy's ``A[rows]`` in whichever module the
    arrays are (NumPy or CuPy).

    Example:
        >>> indptr, indices, data = np.array([0, 2, 2, 3]), np.array([4, 1, 0]), np.array([1.0, 2.0, 3.0])
        >>> ip, ix, d = gather_rows(indptr, indices, data, np.array([2, 0]))
        >>> ip.tolist(), ix.tolist(), d.tolist()
        ([0, 1, 3], [0, 4, 1], [3.0, 1.0, 2.0])
    """
    xp = module(indices)
    ptr = like(indices, indptr).astype(np.int64)
    rows = like(indices, rows).astype(np.int64)
    new_ptr = xp.zeros(rows.size + 1, np.int64)
    xp.cumsum(ptr[rows + 1] - ptr[rows], out=new_ptr[1:])
    _, src = _sources(xp, ptr, rows, new_ptr)
    return new_ptr, indices[src], None if data is None else data[src]


def _fetch(device_array) -> np.ndarray:
    with on_device():
        return host(device_array)


def _gather(device_array, key) -> np.ndarray:
    with on_device():
        return host(device_array[key if isinstance(key, slice) else like(device_array, key)])


class HostMirror(np.lib.mixins.NDArrayOperatorsMixin):
    """A host array that stays on the device until something on the host reads it: its dtype, shape and
    size are known without a copy, and the first read (NumPy functions and operators, indexing, methods)
    copies it once. The relabelled matrix's indices and values are mirrors: the planner and the device
    layout builders read only its lengths and its device copy, so for most compiles the copy is never
    made (half a second of PCIe and host memory for 100M entries). Once the device copy is freed
    (:meth:`detach`, from :func:`forget`), a first read calls ``rebuild`` instead.

    Example (on the host, a NumPy array stands in for the device one):
        >>> a = HostMirror(np.arange(4, dtype=np.int32), fetch=np.copy)
        >>> a.dtype, a.shape, a.copied, (a + 1).tolist(), a[1:3].tolist(), a.copied
        (dtype('int32'), (4,), False, [1, 2, 3, 4], [1, 2], True)
        >>> c = HostMirror(np.arange(10, 20), fetch=np.copy, gather=lambda a, key: a[key].copy())
        >>> c[np.array([0, 9])].tolist(), c.copied   # a gather copies only what it picks
        ([10, 19], False)
        >>> b = HostMirror(np.arange(3), rebuild=lambda: np.arange(3) * 10, fetch=np.copy)
        >>> b.detach(); np.asarray(b).tolist()
        [0, 10, 20]
    """

    def __init__(self, device_array, rebuild=None, fetch=None, gather=None):
        self._device, self._rebuild = device_array, rebuild
        self._fetch, self._gather = fetch or _fetch, gather or _gather
        self._host = None
        self._lock = threading.Lock()
        self.dtype, self.shape = np.dtype(device_array.dtype), tuple(device_array.shape)
        self.size, self.ndim = int(device_array.size), len(self.shape)
        self.nbytes = self.size * self.dtype.itemsize

    @property
    def copied(self) -> bool:
        """Whether the host copy has been made."""
        return self._host is not None

    def host(self) -> np.ndarray:
        """The host copy, made on first use (once, whichever thread asks)."""
        if self._host is None:
            with self._lock:
                if self._host is None:
                    self._host = self._fetch(self._device) if self._device is not None else self._rebuild()
                    self._device = self._rebuild = None
        return self._host

    def read_into(self, out: np.ndarray) -> None:
        """Copy the array into ``out`` (a C-contiguous host array of its shape and dtype): from the host
        copy where one is made, else straight from the device (no host copy is kept), else rebuilt.

        Example:
            >>> out = np.empty(3, np.int64); HostMirror(np.arange(3), fetch=np.copy).read_into(out); out.tolist()
            [0, 1, 2]
        """
        with self._lock:
            device = self._device if self._host is None else None
        if device is not None and self._fetch is _fetch:
            with on_device():
                download(device, out=out)
            return
        np.copyto(out, self.host())

    def detach(self) -> None:
        """Let go of the device array (its memory goes back once nothing else holds it); copied now
        where there is nothing to rebuild it from."""
        if self._rebuild is None:
            self.host()
            return
        with self._lock:
            self._device = None

    def __array__(self, dtype=None, copy=None):
        a = self.host()
        return a if dtype is None else a.astype(dtype, copy=False)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        inputs = tuple(i.host() if isinstance(i, HostMirror) else i for i in inputs)
        return getattr(ufunc, method)(*inputs, **kwargs)

    def __getitem__(self, key):
        if self._host is None and isinstance(key, (np.ndarray, slice)):
            with self._lock:  # a sample (the model's rows) or a slice: copied alone while the rest stays
                device = self._device
            if device is not None:
                return self._gather(device, key)
        return self.host()[key]

    def __len__(self) -> int:
        return self.shape[0]

    def __getattr__(self, name):  # astype, view, sum, ...: the host array's
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.host(), name)
