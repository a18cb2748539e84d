"""A matrix's CSR arrays on the GPU (CuPy), and the relabelled matrix B = A[row_order][:, col_order] built
there (CUB's radix sort behind ``cupy.argsort``): the same arrays :func:`~tuner.formats.reorder.permute`
builds on the host.

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
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

MIN_NNZ = 1 << 20  # below this the host permutes in tens of milliseconds: not worth two copies
WORK_BYTES_PER_ENTRY = 64  # positions, rows, sources, columns, keys and the sort order (8 B each), inputs, outputs
STAGE_BYTES = 32 << 20  # one pinned staging buffer; two alternate, so a copy to the device overlaps the next fill
STAGE_THREADS = 4  # threads filling a staging buffer: one host thread copies 5-10 GB/s, PCIe takes 50


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


def usable(n_rows: int, n_cols: int, nnz: int) -> bool:
    """Whether to relabel and build layouts on the GPU: large enough, sort keys of (row, column) fit 63
    bits, a device with room.

    Example:
        >>> usable(10, 10, 100)
        False
    """
    if nnz < MIN_NNZ or n_rows >= 1 << 31 or n_cols >= 1 << 32 or not available():
        return False
    with on_device() as cupy:
        pool = cupy.get_default_memory_pool()
        return fits(nnz, cupy.cuda.runtime.memGetInfo()[0] + pool.free_bytes())


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
    """Drop ``m``'s device arrays and return the memory CuPy held for them to the device."""
    with _lock:
        _copies.pop(m, None)
    release()


def release() -> None:
    """Return the device memory CuPy keeps for reuse: the tuned kernels allocate outside its pool (nothing
    to do where CuPy was never used)."""
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        cupy.get_default_memory_pool().free_all_blocks()


def synchronize() -> None:
    """Wait for the work queued on the process's GPU (nothing to do where CuPy was never used)."""
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        with on_device():
            cupy.cuda.Device().synchronize()


def upload(array: np.ndarray):
    """A CuPy copy of a host array, copied through two pinned staging buffers (pageable copies run at a
    tenth of PCIe's rate), each filled by several threads while the other one is on its way.

    Example (on a GPU machine):
        >>> upload(np.arange(5)).get().tolist()  # doctest: +SKIP
        [0, 1, 2, 3, 4]
    """
    import cupy
    a = np.ascontiguousarray(array)
    out = cupy.empty(a.shape, a.dtype)
    n = a.nbytes
    if n <= STAGE_BYTES:
        out.set(a)
        return out
    src = a.reshape(-1).view(np.uint8)
    buffers = [cupy.cuda.alloc_pinned_memory(STAGE_BYTES) for _ in range(2)]
    stages = [np.frombuffer(b, np.uint8, STAGE_BYTES) for b in buffers]
    stream = cupy.cuda.Stream(non_blocking=True)
    done = [None, None]
    part = -(-STAGE_BYTES // STAGE_THREADS)
    with ThreadPoolExecutor(STAGE_THREADS) as pool:
        for i, start in enumerate(range(0, n, STAGE_BYTES)):
            k = i % 2
            if done[k] is not None:
                done[k].synchronize()  # the buffer's previous copy has left it
            size = min(STAGE_BYTES, n - start)
            list(pool.map(lambda p: np.copyto(stages[k][p:min(p + part, size)],
                                              src[start + p:start + min(p + part, size)]), range(0, size, part)))
            cupy.cuda.runtime.memcpyAsync(out.data.ptr + start, stages[k].ctypes.data, size,
                                          cupy.cuda.runtime.memcpyHostToDevice, stream.ptr)
            done[k] = stream.record()
    stream.synchronize()
    return out


def col_lengths(csr: DeviceCsr, n_cols: int) -> np.ndarray:
    """Stored entries per column (int64, on the host), counted on the device.

    Example (on a GPU machine):
        >>> import scipy.sparse as sp; from tuner.matrix import canonicalize  # doctest: +SKIP
        >>> col_lengths(device_csr(canonicalize(sp.eye(3, format="csr"))), 3).tolist()  # doctest: +SKIP
        [1, 1, 1]
    """
    import cupy
    return cupy.bincount(csr.indices, minlength=n_cols).astype(np.int64).get()


def permute_device(csr: DeviceCsr, row_order: np.ndarray, col_rank: np.ndarray) -> DeviceCsr:
    """The permuted CSR on the device, columns ascending in every row: new row i is old row
    ``row_order[i]``; ``col_rank``: each old column's new index (the inverse of the column order)."""
    with on_device() as cupy:
        out = _permute(cupy, csr, row_order, col_rank)
    release()
    return out


def _permute(cupy, csr: DeviceCsr, row_order, col_rank) -> DeviceCsr:
    index_dtype = csr.indices.dtype
    ptr = csr.indptr.astype(np.int64)
    order = cupy.asarray(row_order).astype(np.int64)
    n = order.size
    lengths = (ptr[1:] - ptr[:-1])[order]
    new_ptr = cupy.zeros(n + 1, np.int64)
    cupy.cumsum(lengths, out=new_ptr[1:])
    del lengths
    nnz = int(csr.indices.size)
    pos = cupy.arange(nnz, dtype=np.int64)
    row = cupy.searchsorted(new_ptr, pos, side="right") - 1  # each output entry's new row
    src = ptr[order[row]] + (pos - new_ptr[row])  # and where it comes from
    del pos, ptr, order
    cols = cupy.asarray(col_rank)[csr.indices[src]].astype(np.int64)
    key = (row << 32) | cols  # rows, then columns: one radix sort orders every row
    del row
    perm = cupy.argsort(key)
    del key
    out_cols = cols[perm].astype(index_dtype)
    del cols
    out_data = None if csr.data is None else csr.data[src[perm]]
    return DeviceCsr(new_ptr.astype(index_dtype), out_cols, out_data)


def to_host(csr: DeviceCsr) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(indptr, indices, data) copied to the host."""
    return csr.indptr.get(), csr.indices.get(), None if csr.data is None else csr.data.get()
