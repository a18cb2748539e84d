"""Node classes of paper 002 (section V-B3): rows split by length into classes with their own kernels.

Paper 002 uses three classes (small: a thread, medium: a warp fraction, large: a warp). Power-law graphs
also have rows of many thousands of entries that one warp serialises, so a fourth class, huge, gives each
such row a whole block. The layout is a permutation of the row ids grouped by class (original order kept
inside a class, so neighbouring threads keep reading neighbouring CSR rows) plus the class sizes; the CSR
arrays themselves are unchanged and the kernels read rows through ``row_ids``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .csr import row_sums
from .xp import module

CLASSES = ("small", "medium", "large", "huge")


@dataclass(frozen=True)
class BinnedFormat:
    """Rows grouped by length class.

    Attributes:
        row_ids: every row id once, grouped in the order of :data:`CLASSES` (index dtype of the matrix).
        counts: number of rows in each class, in the order of :data:`CLASSES`.
    """

    row_ids: np.ndarray
    counts: tuple[int, int, int, int]


def build_binned(row_lengths: np.ndarray, small_max: int, medium_max: int, huge_min: int | None = None,
                 dtype=np.int32) -> BinnedFormat:
    """Group rows by length: < small_max small, < medium_max medium, < huge_min large, the rest huge; the
    row lengths a NumPy or a CuPy array (the row ids then in the same module).

    ``huge_min`` None means no huge class (every long row is large).

    Example:
        >>> f = build_binned(np.array([1, 40, 3, 9, 5000]), small_max=8, medium_max=16, huge_min=1000)
        >>> f.row_ids.tolist(), f.counts
        ([0, 2, 3, 1, 4], (2, 1, 1, 1))
    """
    huge = np.iinfo(np.int64).max if huge_min is None else huge_min
    if not 0 < small_max <= medium_max <= huge:
        raise ValueError(f"need 0 < small_max <= medium_max <= huge_min, got {small_max}, {medium_max}, {huge_min}")
    xp = module(row_lengths)
    bounds = xp.asarray(np.array([small_max, medium_max, huge], dtype=np.int64))
    cls = xp.searchsorted(bounds, row_lengths, side="right").astype(np.int8)
    # A stable partition by class: each class's rows in order, one pass per class (no sort)
    groups = [xp.flatnonzero(cls == k) for k in range(len(CLASSES))]
    order = xp.concatenate(groups).astype(dtype, copy=False)
    return BinnedFormat(row_ids=order, counts=tuple(int(g.size) for g in groups))


def evaluate_binned(fmt: BinnedFormat, indptr, indices, data, x, n_rows: int, pattern_value: float = 1.0):
    """y = A x computed class by class through ``row_ids``, as the kernels do; rows never written stay NaN.

    Example:
        >>> f = build_binned(np.array([2, 1]), 2, 4)
        >>> evaluate_binned(f, np.array([0, 2, 3]), np.array([0, 1, 0]), None, np.array([1., 2.]), 2)
        array([3., 1.])
    """
    y = np.full(n_rows, np.nan)
    bounds = np.concatenate([[0], np.cumsum(fmt.counts)])
    for k in range(len(CLASSES)):
        rows = fmt.row_ids[bounds[k]:bounds[k + 1]]
        y[rows] = row_sums(indptr, indices, data, x, rows, pattern_value)
    return y
