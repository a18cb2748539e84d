"""Plain CSR evaluation: the reference semantics every row-oriented layout reduces to."""
from __future__ import annotations

import numpy as np


def row_sums(indptr: np.ndarray, indices: np.ndarray, data: np.ndarray | None, x: np.ndarray,
             rows: np.ndarray, pattern_value: float = 1.0) -> np.ndarray:
    """Sum of ``A[r, :] @ x`` for each row id in ``rows``, read from CSR arrays (float64, vectorised).

    ``data`` None means a pattern matrix whose stored values all equal ``pattern_value``.

    Example:
        >>> row_sums(np.array([0, 2, 3]), np.array([0, 1, 1]), None, np.array([1., 2.]), np.array([1, 0]))
        array([2., 3.])
    """
    rows = np.asarray(rows, dtype=np.int64)
    starts = indptr[rows].astype(np.int64)
    lengths = indptr[rows + 1].astype(np.int64) - starts
    owner = np.repeat(np.arange(rows.size), lengths)
    # Position of every entry of the selected rows: row start plus the offset inside the row.
    offsets = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    pos = np.repeat(starts, lengths) + offsets
    values = x[indices[pos]].astype(np.float64)
    if data is not None:
        values *= data[pos]
    out = np.bincount(owner, weights=values, minlength=rows.size)
    return out if data is not None else out * pattern_value
