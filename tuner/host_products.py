"""Float64 reference products on the host, by row blocks on threads.

The benchmarks check every GPU result against SciPy in float64. SciPy's sparse products release the
interpreter lock, so blocks of rows multiplied on threads run side by side; each block widens its own values
to float64, so no float64 copy of the whole matrix is ever held. Every row is computed exactly as SciPy's
serial product computes it: the results are the same to the bit.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import scipy.sparse as sp

from .matrix import csr_on, row_blocks

BLOCK_ENTRIES = 2_000_000  # a block of rows holds at least this many entries (smaller matrices: one block)


def _rows(A: sp.csr_matrix, first: int, end: int, absolute: bool) -> sp.csr_matrix:
    """Rows [first, end) of CSR ``A`` with float64 values (absolute values where asked), the indices shared."""
    s, e = int(A.indptr[first]), int(A.indptr[end])
    data = A.data[s:e].astype(np.float64)
    if absolute:
        np.abs(data, out=data)
    indptr = (A.indptr[first:end + 1] - s).astype(A.indices.dtype, copy=False)
    return csr_on(data, A.indices[s:e], indptr, (end - first, A.shape[1]))


def _blocks(A: sp.csr_matrix, threads: int | None) -> tuple[list[tuple[int, int]], int]:
    workers = max(1, threads or min(os.cpu_count() or 1, 32))
    wanted = min(4 * workers, max(1, A.nnz // BLOCK_ENTRIES))  # several blocks a thread: skewed rows balance
    return row_blocks(A.indptr, wanted), workers


def matvec64(A, x: np.ndarray, absolute: bool = False, threads: int | None = None) -> np.ndarray:
    """y = A x in float64 (|A| x with ``absolute``), A's values widened block by block.

    Example:
        >>> A = sp.csr_matrix(np.array([[1.0, -2.0], [0.0, 3.0]], np.float32))
        >>> matvec64(A, np.array([1.0, 1.0])).tolist(), matvec64(A, np.array([1.0, 1.0]), absolute=True).tolist()
        ([-1.0, 3.0], [3.0, 3.0])
    """
    A = sp.csr_matrix(A) if not sp.isspmatrix_csr(A) else A
    x = np.asarray(x, np.float64)
    y = np.empty(A.shape[0], np.float64)
    blocks, workers = _blocks(A, threads)

    def one(block):
        first, end = block
        y[first:end] = _rows(A, first, end, absolute) @ x

    if len(blocks) <= 1:
        for b in blocks:
            one(b)
    else:
        with ThreadPoolExecutor(max_workers=min(workers, len(blocks))) as pool:
            list(pool.map(one, blocks))
    return y


def matmul64(A, B, threads: int | None = None) -> sp.csr_matrix:
    """C = A B in float64 (CSR, SciPy's entries in SciPy's order), A's row blocks multiplied on threads.

    Example:
        >>> A = sp.csr_matrix(np.array([[1.0, 2.0], [0.0, 3.0]], np.float32))
        >>> matmul64(A, A).toarray().tolist()
        [[1.0, 8.0], [0.0, 9.0]]
    """
    A = sp.csr_matrix(A) if not sp.isspmatrix_csr(A) else A
    B64 = sp.csr_matrix(B, dtype=np.float64)
    blocks, workers = _blocks(A, threads)
    if len(blocks) <= 1:
        return (A.astype(np.float64) @ B64).tocsr()
    with ThreadPoolExecutor(max_workers=min(workers, len(blocks))) as pool:
        parts = list(pool.map(lambda b: (_rows(A, b[0], b[1], False) @ B64).tocsr(), blocks))
    return sp.vstack(parts, format="csr")
