"""A graph's pull matrix Wᵀ and its rank-cache factors made on the GPU from one upload of the caller's CSR.

PageRank's setup on the host passes over every edge several times before the first iteration: the checks
(finite, non-negative weights; sorted, distinct, in-range indices), the out-weights, the transpose's copies
both ways and the generic kernel's upload of Wᵀ: about a second for 100M edges, against a few milliseconds
of iterations. Here the caller's arrays cross PCIe once through pinned buffers
(:func:`~tuner.formats.device_reorder.upload`), the checks are reductions on the device, cuSPARSE transposes
(csr2csc), the out-weights are summed from Wᵀ's entries (``cupy.bincount``, float64), and Wᵀ stays on the
device for the kernel's layout: the host holds only its row pointers, its entries are
:class:`~tuner.formats.device_reorder.HostMirror` arrays copied back only if something on the host reads them.

Only the happy path runs here: a graph that fails a check (or is too small to pay for the device, or has
64-bit indices) returns None, and the host path checks it again and names the problem.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..formats import device_reorder
from ..formats.device_reorder import DeviceCsr, HostMirror
from ..formats.transpose import DEVICE_DTYPES
from ..matrix import CanonicalMatrix, MatrixError

INT32_MAX = np.iinfo(np.int32).max
# Device bytes per edge at the peak: the upload (index, weight), the check's mask, Wᵀ (index, weight) and
# cuSPARSE's csr2csc buffer, with a quarter to spare.
PULL_BYTES_PER_ENTRY = 32


def usable(A, dtype) -> bool:
    """Whether :func:`pull_on_device` takes ``A`` (a SciPy CSR graph) for products in ``dtype``: large enough
    for the device to pay, 32-bit indices (cuSPARSE's transpose), float weights, CuPy with room.

    Example:
        >>> usable(sp.eye(3, format="csr"), np.float32)   # far too small
        False
    """
    n, nnz = A.shape[0], A.nnz
    return (np.dtype(dtype) in DEVICE_DTYPES and A.dtype in DEVICE_DTYPES and nnz < INT32_MAX and n < INT32_MAX
            and device_reorder.usable(n, n, nnz, PULL_BYTES_PER_ENTRY * nnz))


def pull_on_device(A, weighted: bool, dtype):
    """``(Wt, dangling, inverse)`` for the graph of square CSR ``A`` (edge u -> v at ``A[u, v]``): ``Wt`` the
    canonical Wᵀ in ``dtype`` (every edge weighing 1 unless ``weighted``) with its arrays on the device
    (``device_reorder.device_csr(Wt)`` returns them), ``dangling`` (CuPy bool) the nodes without out-weight,
    ``inverse`` (CuPy float64) 1 / out-weight (0 where dangling). None where :func:`usable` says no or a
    check fails (the host path then names the problem).

    Example (on a GPU machine):
        >>> Wt, dangling, inverse = pull_on_device(A, True, np.float32)   # doctest: +SKIP
        >>> (Wt.to_scipy() != A.T).nnz                                     # doctest: +SKIP
        0
    """
    A = A if sp.issparse(A) and A.format == "csr" else sp.csr_matrix(A)
    n = A.shape[0]
    if A.shape[0] != A.shape[1]:
        raise MatrixError(f"an adjacency matrix is square, got {A.shape}")
    if not usable(A, dtype):
        return None
    try:
        return _pull(A, n, weighted, np.dtype(dtype))
    except MemoryError:  # CuPy's OutOfMemoryError is one: the host path builds it instead
        device_reorder.release()
        return None


def _pull(A, n: int, weighted: bool, dtype: np.dtype):
    with device_reorder.on_device() as cupy:
        import cupyx.scipy.sparse as cpsp
        up = device_reorder.upload
        indptr, indices = up(A.indptr.astype(np.int32, copy=False)), up(A.indices.astype(np.int32, copy=False))
        data = up(A.data) if weighted else None
        if not _valid(cupy, indptr, indices, data, n):
            return None
        ones = data is None
        if ones:
            data = cupy.ones(indices.size, dtype)
        lo, hi = (float(v) for v in cupy.stack([data.min(), data.max()]).astype(dtype).get()) if indices.size \
            else (None, None)
        pattern = lo if lo is not None and lo == hi else None
        t = cpsp.csr_matrix((data, indices, indptr), shape=(n, n)).T.tocsr()  # cuSPARSE csr2csc, columns ascending
        del data, indices, indptr
        degree = cupy.bincount(t.indices, minlength=n)  # out-degrees: Wᵀ's column lengths
        col_lengths = degree.astype(np.int64).get()
        if pattern is not None:  # every edge weighs the same: a node's out-weight is its out-degree times it
            out = degree.astype(np.float64) * pattern
        else:
            out = cupy.bincount(t.indices, weights=t.data, minlength=n)  # float64 sums
        dangling = out == 0
        inverse = cupy.where(dangling, 0.0, 1.0 / cupy.where(dangling, 1.0, out))
        del out, degree
        values = None if pattern is not None else t.data.astype(dtype, copy=False)
        csr = DeviceCsr(t.indptr, t.indices, values)
        host_indptr = device_reorder.download(t.indptr)
    nnz = int(csr.indices.size)
    entries = (np.broadcast_to(np.array([pattern], dtype), (nnz,)) if pattern is not None else HostMirror(csr.data))
    Wt = CanonicalMatrix(indptr=host_indptr, indices=HostMirror(csr.indices), data=entries, shape=(n, n),
                         pattern_value=pattern)
    Wt.__dict__["row_lengths"] = np.diff(host_indptr).astype(np.int64)
    Wt.__dict__["col_lengths"] = col_lengths
    device_reorder.keep(Wt, csr)
    return Wt, dangling, inverse


def _valid(cupy, indptr, indices, data, n: int) -> bool:
    """Every check of the host path at once on the device, one number read back: row pointers from 0 to
    nnz and rising, column indices in range, sorted and distinct in every row, weights finite and
    non-negative."""
    nnz = indices.size
    if indptr.size != n + 1:
        return False
    checks = [indptr[0] == 0, indptr[-1] == nnz, cupy.all(indptr[1:] >= indptr[:-1])]
    if nnz:
        rising = indices[1:] > indices[:-1]
        starts = indptr[1:-1]
        starts = starts[(starts > 0) & (starts < nnz)]
        rising[starts - 1] = True  # a row's first entry may be below the last one's
        checks += [indices.min() >= 0, indices.max() < n, cupy.all(rising)]
        if data is not None:
            checks += [cupy.all(cupy.isfinite(data)), data.min() >= 0]
    return bool(cupy.all(cupy.stack([cupy.asarray(c) for c in checks])).get())
