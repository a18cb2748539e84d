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


def transpose(A) -> sp.csr_matrix:
    """``A``ᵀ as a SciPy CSR matrix with sorted indices (on the GPU where :func:`on_device`).

    Example:
        >>> transpose(sp.csr_matrix(np.array([[0, 1.0], [2.0, 3.0]]))).toarray().tolist()
        [[0.0, 2.0], [1.0, 3.0]]
    """
    A = sp.csr_matrix(A)
    if on_device(A):
        with device_reorder.on_device() as cupy:
            import cupyx.scipy.sparse as cpsp
            a = cpsp.csr_matrix((cupy.asarray(A.data), cupy.asarray(A.indices.astype(np.int32, copy=False)),
                                 cupy.asarray(A.indptr.astype(np.int32, copy=False))), shape=A.shape)
            t = a.T.tocsr()  # cuSPARSE csr2csc: every row's columns ascending
            out = sp.csr_matrix((t.data.get(), t.indices.get(), t.indptr.get()), shape=(A.shape[1], A.shape[0]))
            del a, t
        device_reorder.release()
        return out
    return A.T.tocsr()
