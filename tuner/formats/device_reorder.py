"""The relabelled matrix B = A[row_order][:, col_order] built on the GPU with CuPy (CUB's radix sort behind
``cupy.argsort``), the same arrays as :func:`~tuner.formats.reorder.permute` builds on the host.

On the host the row gather, the column relabel and the per-row sort take seconds for 100M entries; on the
GPU they take milliseconds, and the matrix crosses PCIe once each way. Used where CuPy and a GPU are present,
the matrix is large enough for the copies to pay (``MIN_NNZ``) and the device has room for the work arrays.
"""
from __future__ import annotations

import numpy as np

MIN_NNZ = 1 << 20  # below this the host permutes in tens of milliseconds: not worth two copies
WORK_BYTES_PER_ENTRY = 64  # positions, rows, sources, columns, keys and the sort order (8 B each), inputs, outputs


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
    """Whether to permute on the GPU: large enough, sort keys of (row, column) fit 63 bits, a device with room.

    Example:
        >>> usable(10, 10, 100)
        False
    """
    if nnz < MIN_NNZ or n_rows >= 1 << 31 or n_cols >= 1 << 32 or not available():
        return False
    import cupy

    from .. import gpu
    with cupy.cuda.Device(gpu.selected_device()):
        return fits(nnz, cupy.cuda.runtime.memGetInfo()[0])


def permute_arrays(indptr: np.ndarray, indices: np.ndarray, data: np.ndarray | None, row_order: np.ndarray,
                   col_rank: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(indptr, indices, data) of the permuted CSR, columns ascending in every row, computed on the GPU.

    ``col_rank``: each old column's new index (the inverse of the column order); ``data`` None (a pattern
    matrix): none moved, None returned. Runs on the process's GPU (:func:`tuner.gpu.select_device`), from
    any thread.
    """
    import cupy

    from .. import gpu
    with cupy.cuda.Device(gpu.selected_device()):
        return _permute(cupy, indptr, indices, data, row_order, col_rank)


def _permute(cupy, indptr, indices, data, row_order, col_rank):
    index_dtype = indices.dtype
    n = row_order.size
    ptr = cupy.asarray(indptr.astype(np.int64, copy=False))
    order = cupy.asarray(row_order.astype(np.int64, copy=False))
    lengths = (ptr[1:] - ptr[:-1])[order]
    new_ptr = cupy.zeros(n + 1, np.int64)
    cupy.cumsum(lengths, out=new_ptr[1:])
    nnz = int(indices.size)
    pos = cupy.arange(nnz, dtype=np.int64)
    row = cupy.searchsorted(new_ptr, pos, side="right") - 1  # each output entry's new row
    src = ptr[order[row]] + (pos - new_ptr[row])  # and where it comes from
    del pos
    cols = cupy.asarray(col_rank)[cupy.asarray(indices)[src]].astype(np.int64)
    key = (row << 32) | cols  # rows, then columns: one radix sort orders every row
    del row
    perm = cupy.argsort(key)
    del key
    out_cols = cols[perm].astype(index_dtype)
    out_data = None if data is None else cupy.asarray(data)[src[perm]]
    result = (cupy.asnumpy(new_ptr).astype(index_dtype, copy=False), cupy.asnumpy(out_cols),
              None if out_data is None else cupy.asnumpy(out_data))
    del perm, src, cols, out_cols, out_data, new_ptr, ptr, order, lengths
    cupy.get_default_memory_pool().free_all_blocks()  # the tuned kernels allocate through their own pool
    return result
