"""Node classes of paper 002 (section V-B3): rows split by length into small, medium and large classes.

The layout is a permutation of the row ids grouped by class (original order kept inside a class) plus the
class sizes; the CSR arrays themselves are unchanged, so the kernels read rows through ``row_ids``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .csr import row_sums

CLASSES = ("small", "medium", "large")


@dataclass(frozen=True)
class BinnedFormat:
    """Rows grouped by length class.

    Attributes:
        row_ids: every row id once, small rows first, then medium, then large (index dtype of the matrix).
        counts: number of rows in each class, in the order of :data:`CLASSES`.
        small_max: rows with fewer entries than this are small.
        medium_max: rows with at least ``small_max`` and fewer than this are medium; the rest are large.
    """

    row_ids: np.ndarray
    counts: tuple[int, int, int]
    small_max: int
    medium_max: int


def build_binned(row_lengths: np.ndarray, small_max: int, medium_max: int, dtype=np.int32) -> BinnedFormat:
    """Group rows into the three node classes by their lengths.

    Example:
        >>> f = build_binned(np.array([1, 40, 3, 9]), small_max=8, medium_max=16)
        >>> f.row_ids.tolist(), f.counts
        ([0, 2, 3, 1], (2, 1, 1))
    """
    if not 0 < small_max <= medium_max:
        raise ValueError(f"need 0 < small_max <= medium_max, got {small_max}, {medium_max}")
    cls = np.searchsorted(np.array([small_max, medium_max]), row_lengths, side="right").astype(np.int8)
    order = np.argsort(cls, kind="stable").astype(dtype, copy=False)
    counts = np.bincount(cls, minlength=3)
    return BinnedFormat(row_ids=order, counts=tuple(int(c) for c in counts), small_max=small_max,
                        medium_max=medium_max)


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
