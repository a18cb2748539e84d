"""Paper 003's auto-tuning of TILE-Composite (appendix E): Algorithm 3's performance model of one tile for a
workload size, and Algorithm 2's search for each tile's best workload size, over the profiled tables.

The tables are the lookup model's (:mod:`tuner.model.lookup`): ``tile_composite:row`` and
``tile_composite:col`` measure full GPUs of row-major and column-major workloads whose rows all have w
entries; a tile's warps gather from its own slice of x, so each tile blends the regimes by its columns'
hit rates.
"""
from __future__ import annotations

import numpy as np

from ..families.tile_composite import BLOCK_SIZE, tile_extent
from ..formats.tile_composite import pack_runs
from ..formats.tiles import tile_bounds
from ..matrix import CanonicalMatrix
from .lookup import blended, gather_fractions, table_for
from .profile_data import REGIMES, Profile, kernel_key
from .waves import grouped_wave_time

MAX_CANDIDATES = 16  # workload sizes tried per tile (Algorithm 2 tries every multiple of the first row)


def tile_keys(profile: Profile, value_free: bool, block: int = BLOCK_SIZE) -> dict | None:
    """{'row': table, 'col': table} for this kernel, or None when the profile lacks them."""
    keys = {kind: table_for(profile, kernel_key("tile_composite", kind, block, value_free))[0] for kind in ("row", "col")}
    return keys if all(profile.has(k) for k in keys.values()) else None


def tile_time(lengths: np.ndarray, counts: np.ndarray, wl: int, profile: Profile, keys: dict, fractions,
              rates: dict | None = None) -> float:
    """Algorithm 3, PM(T, WL): pack the tile - ``counts`` rows of each of ``lengths``, decreasing - with
    workload size WL (lines 7-16), look every workload up in its table, and run the warps in waves by
    equations 1-5 (:func:`~tuner.model.waves.grouped_wave_time`: equal workloads are summed at once); the
    kernel lasts at least as long as its slowest warp alone. ``rates``: the tile's :func:`length_rates`,
    when already looked up (Algorithm 2 packs one tile many times).

    Example: see tests/test_tiles.py (needs a profile).
    """
    s = pack_runs(lengths, counts, wl)
    if s.workloads == 0:
        return 0.0
    rates = rates or length_rates(lengths, profile, keys, fractions)
    (row_perf, row_alone), (col_perf, col_alone) = rates["row"], rates["col"]
    perf = np.where(s.row_major, row_perf[s.run], col_perf[s.run])
    alone = np.where(s.row_major, row_alone[s.run], col_alone[s.run])
    return grouped_wave_time(s.size.astype(np.float64), perf, s.count, profile.max_active_warps(keys["row"]),
                             alone=alone * s.rounds)


def length_rates(lengths: np.ndarray, profile: Profile, keys: dict, fractions) -> dict:
    """{'row': (performance, time alone), 'col': (...)}: a warp's table performance and the time of one of
    its rounds alone, for a row-major and a column-major workload whose first row has each of ``lengths``
    (whatever the workload size, a workload's shape is one of its tile's lengths)."""
    out = {}
    for kind in ("row", "col"):
        key = keys[kind]
        alone = sum(f * profile.alone_time(key, r, lengths) for f, r in zip(fractions, REGIMES) if f > 0)
        out[kind] = (blended(profile, key, lengths, fractions), np.asarray(alone, dtype=np.float64))
    return out


def candidates(longest: int, entries: int, active_warps: int, limit: int = MAX_CANDIDATES) -> list[int]:
    """Algorithm 2's workload sizes - multiples of the tile's ``longest`` row, from it up to the tile's
    ``entries`` over the resident warps (at least the one), thinned geometrically to ``limit`` - plus the
    warp-multiple powers of two below the longest row.

    The paper's lower bound keeps the first workload an exact rectangle; on today's graphs a tile's longest
    row can hold 10^4 entries, and a workload that large makes the column-major warps of its one-entry
    rows 10^4 rows deep, walked serially. Below it, a long row is simply a row-major workload by itself
    (h = max(WL // w, 1)), and the model decides.

    Example:
        >>> candidates(4, 400, active_warps=10)
        [4, 8, 12, 16, 20, 24, 28, 32, 36, 40]
        >>> candidates(100, 1000, active_warps=4)
        [32, 64, 100, 200]
        >>> len(candidates(1, 10_000, 2)), candidates(1, 10_000, 2)[-1]
        (16, 5000)
    """
    first = max(int(longest), 1)
    top = max(int(entries) // max(active_warps, 1) // first, 1)
    ks = np.arange(1, top + 1) if top <= limit else np.unique(np.geomspace(1, top, limit).round().astype(np.int64))
    below = [1 << k for k in range(5, 31) if 1 << k < first]
    return below + [int(k) * first for k in ks]


def partition(lengths: np.ndarray, counts: np.ndarray, profile: Profile, keys: dict, fractions) -> tuple[int, float]:
    """Algorithm 2: the workload size of a tile of ``counts`` rows of each of ``lengths`` (decreasing) with
    the least predicted time, and that time.

    Example: see tests/test_tiles.py (needs a profile).
    """
    if len(lengths) == 0 or lengths[0] == 0:
        return 1, 0.0
    best = (0, np.inf)
    rates = length_rates(lengths, profile, keys, fractions)
    for wl in candidates(*tile_extent(lengths, counts), profile.max_active_warps(keys["row"])):
        t = tile_time(lengths, counts, wl, profile, keys, fractions, rates)
        if t < best[1]:
            best = (wl, t)
    return best


def partition_tiles(plan: CanonicalMatrix, width: int, runs, profile: Profile | None) -> tuple | None:
    """Algorithms 1-2: every tile's workload size by the model, from the tiles' :class:`RankedRuns`
    (None when there is no profile or it lacks the tile_composite tables: the family then falls back on
    Algorithm 2's bounds alone)."""
    if profile is None:
        return None
    keys = tile_keys(profile, plan.value_free)
    if keys is None:
        return None
    bounds = tile_bounds(plan.col_lengths, width)
    return tuple(partition(*runs.tile(t), profile, keys, gather_fractions(plan, profile, (int(a), int(b))))[0]
                 for t, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])))
