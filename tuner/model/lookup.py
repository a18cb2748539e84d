"""The lookup-table model of paper 003: per-warp table performance combined by equations 1-5."""
from __future__ import annotations

import numpy as np

from ..families.base import Specialization, shared_layout
from ..matrix import CanonicalMatrix
from .locality import regime_fractions
from .profile_data import REGIMES, Profile
from .warps import WARP_MODELS

# Tables are measured with float32 values and int32 indices; other types scale by the bytes each entry
# streams (an approximation: the gathers of x move whole 32-byte sectors either way). A profile without
# the valued tables (a reduced grid) serves valued kernels from the value-free ones the same way.
def _table(profile: Profile, key: str) -> tuple[str, int]:
    """The table to read for ``key`` and the bytes per entry it was measured with."""
    if key.endswith(":v") and key not in profile.tables and key + "f" in profile.tables:
        return key + "f", 4
    return key, 4 if key.endswith(":vf") else 8


def gather_fractions(m: CanonicalMatrix, profile: Profile) -> np.ndarray:
    c = profile.constants
    return shared_layout(m, ("gather_fractions", profile.digest), lambda: regime_fractions(
        m.col_lengths, m.value_dtype.itemsize, c["l1_bytes"], c["l2_bytes"]))


def _blended(profile: Profile, key: str, w: np.ndarray, fractions) -> np.ndarray:
    # Times add across regimes, so performances blend harmonically. Row lengths are integers: evaluate the
    # curve once per distinct length up to the longest and gather (far cheaper than interpolating per warp).
    widths = np.arange(int(w.max()) + 1, dtype=np.float64)
    inv = sum(f / profile.performance(key, r, widths) for f, r in zip(fractions, REGIMES) if f > 0)
    return (1.0 / inv)[w.astype(np.int64)]


def predict_lookup(m: CanonicalMatrix, spec: Specialization, profile: Profile) -> float:
    """Predicted kernel milliseconds of ``spec`` on ``m``.

    Each warp's performance blends the table's three gather regimes by the matrix's share of gathers
    served by L1, L2 and memory (harmonically: times add). Equations 1-5 with the work-weighted mean of
    :func:`~tuner.model.waves.wave_time` then reduce to each warp's entries at its own rate, summed over all
    warps whatever the waves, so each class of rows is summed once per matrix and shared by every candidate
    (candidates then cost microseconds; building the classes and column counts is what remains). The kernel also
    lasts at least as long as the slot time of its warps alone and its slowest warp alone.

    Example: see tests/test_model.py (needs a profile).
    """
    segments = WARP_MODELS[spec.family](m, spec.params)
    fractions = gather_fractions(m, profile)
    entry_bytes = m.index_dtype.itemsize + (0 if m.value_free else m.value_dtype.itemsize)
    work, alone_sum, alone_max, max_active = 0.0, 0.0, 0.0, 1
    for seg in segments:
        if seg.w.size == 0:
            continue
        key, profiled_bytes = _table(profile, seg.key)
        max_active = profile.max_active_warps(key)  # one launch: the same occupancy for all its warps
        w_sum, a_sum, a_max = shared_layout(m, ("segment", seg.ident, key, profile.digest),
                                            lambda: _segment_sums(profile, key, seg, fractions))
        work += w_sum * entry_bytes / profiled_bytes
        alone_sum, alone_max = alone_sum + a_sum, max(alone_max, a_max)
    t = max(work, alone_sum / max_active, alone_max)
    return float(profile.constants["launch_overhead_ms"] + t)


def _segment_sums(profile: Profile, key: str, seg, fractions) -> tuple[float, float, float]:
    """Sum of S_j / P_j at the profiled bytes, and the sum and maximum of the warps' times alone."""
    perf = _blended(profile, key, seg.w, fractions)
    widths = np.arange(int(seg.w.max()) + 1, dtype=np.float64)
    alone_by_width = sum(f * profile.alone_time(key, r, widths) for f, r in zip(fractions, REGIMES) if f > 0)
    # A block row appears as block / 32 warps, each holding its slot for the block's time alone.
    alone = alone_by_width[seg.w.astype(np.int64)]
    return float((seg.size / perf).sum()), float(alone.sum()), float(alone.max())
