"""The lookup-table model of paper 003: per-warp table performance combined by equations 1-5."""
from __future__ import annotations

import numpy as np

from ..families.base import UNROLL, Specialization, shared_layout
from ..matrix import CanonicalMatrix
from .locality import regime_fractions
from .profile_data import REGIMES, Profile
from .warps import WARP, WARP_MODELS
from .waves import wave_time

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


def _batch_time(profile: Profile, fractions) -> float:
    """Milliseconds of one round of UNROLL dependent loads of a warp running alone, blended by regime."""
    lat = profile.constants["batch_latency_ms"]
    return sum(f * lat[r] for f, r in zip(fractions, REGIMES))


def predict_lookup(m: CanonicalMatrix, spec: Specialization, profile: Profile) -> float:
    """Predicted kernel milliseconds of ``spec`` on ``m``.

    Each warp's performance blends the table's three gather regimes by the matrix's share of gathers
    served by L1, L2 and memory (harmonically: times add), then equations 1-5 sum the waves.

    Example: see tests/test_model.py (needs a profile).
    """
    segments = WARP_MODELS[spec.family](m, spec.params)
    fractions = gather_fractions(m, profile)
    entry_bytes = m.index_dtype.itemsize + (0 if m.value_free else m.value_dtype.itemsize)
    sizes, perfs, alone, max_active = [], [], [], None
    for seg in segments:
        if seg.w.size == 0:
            continue
        key, profiled_bytes = _table(profile, seg.key)
        max_active = profile.max_active_warps(key)  # one launch: the same occupancy for all its warps
        perfs.append(profiled_bytes / entry_bytes * shared_layout(
            m, ("perf", seg.ident, key, profile.digest), lambda: _blended(profile, key, seg.w, fractions)))
        sizes.append(seg.size)
        alone.append(np.ceil(seg.w / (seg.lanes * UNROLL)) * _batch_time(profile, fractions))
    if not sizes:
        return float(profile.constants["launch_overhead_ms"])
    t = wave_time(np.concatenate(sizes), np.concatenate(perfs), max_active, np.concatenate(alone))
    return float(profile.constants["launch_overhead_ms"] + t)
