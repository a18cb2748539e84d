"""Aᵀ as a CSR matrix: the pull products of the graph algorithms multiply by the transposed adjacency.

SciPy transposes a CSR matrix on one core by a counting sort whose scattered writes run at about 10M entries
a second: seconds for a 100M-edge graph, most of a PageRank's setup. Where CuPy and a GPU with room are
there, the matrix is large enough for the copies to pay and its indices are 32-bit (CuPy's sparse matrices
hold int32 indices), cuSPARSE's csr2csc does it on the device: the same arrays, columns ascending in every
row.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from . import device_reorder

DEVICE_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))  # what cuSPARSE's csr2csc takes here


def on_device(A: sp.csr_matrix) -> bool:
    """Whether :func:`transpose` runs on the GPU for ``A``.

    Example:
        >>> on_device(sp.eye(3, format="csr"))   # far too small to pay for the copies
        False
    """
    n_rows, n_cols = A.shape
    return (A.dtype in DEVICE_DTYPES and A.nnz < np.iinfo(np.int32).max and max(n_rows, n_cols) < np.iinfo(np.int32).max
            and device_reorder.usable(n_cols, n_rows, A.nnz))


def transpose(A, dtype=None) -> sp.csr_matrix:
    """``A``ᵀ as a SciPy CSR matrix with sorted indices, its values cast to ``dtype`` (default: A's), on
    the GPU where :func:`on_device`. Both ways cross PCIe through pinned buffers
    (:func:`~tuner.formats.device_reorder.upload`, :func:`~tuner.formats.device_reorder.download`). When
    ``A`` is canonical (sorted, no duplicates) the result is marked so, and its users skip SciPy's scan.

    Example:
        >>> transpose(sp.csr_matrix(np.array([[0, 1.0], [2.0, 3.0]]))).toarray().tolist()
        [[0.0, 2.0], [1.0, 3.0]]
    """
    A = A if sp.issparse(A) and A.format == "csr" else sp.csr_matrix(A)  # A itself keeps SciPy's flags
    dtype = A.dtype if dtype is None else np.dtype(dtype)
    canonical = A.has_canonical_format
    if on_device(A) and dtype in DEVICE_DTYPES:
        with device_reorder.on_device() as cupy:
            import cupyx.scipy.sparse as cpsp
            up = device_reorder.upload
            a = cpsp.csr_matrix((up(A.data).astype(dtype, copy=False), up(A.indices.astype(np.int32, copy=False)),
                                 up(A.indptr.astype(np.int32, copy=False))), shape=A.shape)
            t = a.T.tocsr()  # cuSPARSE csr2csc: every row's columns ascending
            del a
            down = device_reorder.download
            out = sp.csr_matrix((down(t.data), down(t.indices), down(t.indptr)), shape=(A.shape[1], A.shape[0]))
            del t
        device_reorder.release()
    else:
        out = A.T.tocsr()
        out = out if out.dtype == dtype else out.astype(dtype)
    if canonical:
        out.has_canonical_format = True
    return out
