"""Where the gathers of x hit: the share of accesses served by L1, L2 and device memory.

Accesses follow the column lengths: the hottest columns of x stay cached. With each cache holding the most
frequently read entries (half of each cache is left to the streamed matrix), the share of gathers that hit
a level is the share of non-zeros in the columns that fit there.
"""
from __future__ import annotations

import numpy as np

CACHE_SHARE_FOR_X = 0.5


def regime_fractions(col_lengths: np.ndarray, itemsize: int, l1_bytes: int, l2_bytes: int) -> np.ndarray:
    """Fractions of gathers served by (L1, L2, device memory); they sum to 1.

    Example:
        >>> regime_fractions(np.array([6, 2, 1, 1]), 4, l1_bytes=8, l2_bytes=24).round(2).tolist()
        [0.6, 0.3, 0.1]
    """
    counts = np.sort(np.asarray(col_lengths, dtype=np.int64))[::-1]
    total = counts.sum()
    if total == 0:
        return np.array([1.0, 0.0, 0.0])
    cum = np.concatenate([[0], np.cumsum(counts)]) / total
    k1 = int(l1_bytes * CACHE_SHARE_FOR_X // itemsize)
    k2 = int(l2_bytes * CACHE_SHARE_FOR_X // itemsize)
    f1 = cum[min(k1, counts.size)]
    f2 = cum[min(k2, counts.size)]
    return np.array([f1, f2 - f1, 1.0 - f2])
