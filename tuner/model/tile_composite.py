"""Paper 003's auto-tuning of TILE-Composite (appendix E): Algorithm 3's performance model of one tile for a
workload size, and Algorithm 2's search for each tile's best workload size, over the profiled tables.

The tables are the lookup model's (:mod:`tuner.model.lookup`): ``tile_composite:row`` and
``tile_composite:col`` measure full GPUs of row-major and column-major workloads whose rows all have w
entries, and ``tile_composite:row2`` ... ``row32`` row-major workloads of that many such rows (paper 003's
Performance(w, h)); a tile's warps gather from its own slice of x, so each tile blends the regimes by its
columns' hit rates.
"""
from __future__ import annotations

import numpy as np

from ..families.tile_composite import BLOCK_SIZE, packed_tiles, set_partition
from ..formats.tile_composite import Packings, col_shape_height, pack_many, pack_tiles
from ..matrix import CanonicalMatrix
from .tables import blended, blended_alone, height_curve, height_table, row_heights, table_for
from .tiled import tile_fractions
from .profile_data import Profile, kernel_key

MAX_CANDIDATES = 16  # workload sizes tried per tile (Algorithm 2 tries every multiple of the first row)


def tile_keys(profile: Profile, value_free: bool, block: int = BLOCK_SIZE) -> dict | None:
    """{'row': table, 'col': table, 'heights': ((rows, table), ...)} for this kernel, or None when the
    profile lacks the first two; 'heights' are the row-major tables per rows per workload it measured
    (:func:`~tuner.model.tables.row_heights`)."""
    keys = {kind: table_for(profile, kernel_key("tile_composite", kind, block, value_free))[0] for kind in ("row", "col")}
    if not all(profile.has(k) for k in keys.values()):
        return None
    return {**keys, "heights": row_heights(profile, value_free, block)}


def tile_time(lengths: np.ndarray, counts: np.ndarray, wl: int, profile: Profile, keys: dict, fractions,
              rates: dict | None = None) -> float:
    """Algorithm 3, PM(T, WL): pack the tile - ``counts`` rows of each of ``lengths``, decreasing - with
    workload size WL (lines 7-16) and time it by :func:`tile_times`. ``rates``: the tile's
    :func:`length_rates`, when already looked up.

    Example: see tests/test_tiles.py (needs a profile).
    """
    rates = rates or length_rates(lengths, profile, keys, fractions)
    return float(tile_times(pack_many(lengths, counts, [wl]), rates, profile.max_active_warps(keys["row"]))[0])


def tile_times(p: Packings, rates: dict, max_active_warps: int) -> np.ndarray:
    """PM(T, WL) of every pairing of ``p`` (a tile at a workload size): each workload looked up in its
    table by its first row's length (``rates``, from :func:`length_rates` of the lengths packed, indexed
    by ``p.source``), the warps run in waves by equations 1-5 with the work-weighted mean
    (:func:`~tuner.model.waves.wave_time`; a wave's time is then the sum of its warps' S / P, so equal
    workloads are summed at once), and the tile lasting at least as long as its slowest warp alone (and
    the slots' time alone over the resident warps).

    Example: see tests/test_tiles.py (needs a profile).
    """
    pairings = p.wls.size
    work, alone_sum, slowest = np.zeros(pairings), np.zeros(pairings), np.zeros(pairings)
    has = p.bounds[1:] > p.bounds[:-1]
    if not has.any():
        return work
    (row_perf, row_alone), (col_perf, col_alone) = ((a[p.source] for a in rates[k]) for k in ("row", "col"))
    # Rates made without per-height tables (one row's table alone) hold it for every height.
    heights, log_perf = rates.get("heights") or (np.ones(1), np.log2(rates["row"][0])[None, :])
    perf = np.where(p.row_major, height_curve(heights, log_perf, p.source, p.step), col_perf)
    rounds = np.where(p.row_major, p.step, p.step / col_shape_height(p.lengths))
    alone = np.where(p.row_major, row_alone, col_alone) * rounds
    starts = p.bounds[:-1][has]
    work[has] = np.add.reduceat(p.count * (p.lengths * p.step) / perf, starts)
    alone_sum[has] = np.add.reduceat(p.count * alone, starts)
    slowest[has] = np.maximum.reduceat(np.where(p.count > 0, alone, 0.0), starts)
    # The last row-major workload cut short at the tile's end: a row-major warp of its rows.
    tail = np.flatnonzero(p.tail_rows > 0)
    r, rows = p.tail_entry[tail], p.tail_rows[tail]
    tail_alone = row_alone[r] * rows
    work[tail] += p.lengths[r] * rows / row_perf[r]
    alone_sum[tail] += tail_alone
    slowest[tail] = np.maximum(slowest[tail], tail_alone)
    return np.maximum(np.maximum(work, alone_sum / max(int(max_active_warps), 1)), slowest)


def length_rates(lengths: np.ndarray, profile: Profile, keys: dict, fractions) -> dict:
    """{'row': (performance, time alone), 'col': (...), 'heights': (rows, log2 performance)}: a warp's
    table performance and the time of one of its rounds alone, for a row-major and a column-major workload
    whose first row has each of ``lengths`` (whatever the workload size, a workload's shape is one of its
    tile's lengths), and the row-major performance per rows per workload measured (``keys['heights']``;
    a row of :func:`~tuner.model.tables.height_curve`'s table per height). ``fractions``: the tile's gather
    shares, or one triple per length (several tiles' lengths looked up at once)."""
    out = {}
    for kind in ("row", "col"):
        key = keys[kind]
        alone = blended_alone(profile, key, lengths, fractions)
        out[kind] = (blended(profile, key, lengths, fractions), np.asarray(alone, dtype=np.float64))
    out["heights"] = height_table(profile, keys.get("heights") or ((1, keys["row"]),), lengths, fractions)
    return out


def candidates(longest: int, entries: int, active_warps: int, limit: int = MAX_CANDIDATES) -> list[int]:
    """Algorithm 2's workload sizes - multiples of the tile's ``longest`` row, from it up to the tile's
    ``entries`` over the resident warps (at least the one), thinned geometrically to ``limit`` - plus the
    warp-multiple powers of two below the longest row.

    The paper's lower bound keeps the first workload an exact rectangle; on power-law graphs a tile's
    longest row can hold 10^4 entries, and a workload that large makes the column-major warps of its
    one-entry rows 10^4 rows deep, walked serially. Below it, a long row is simply a row-major workload by
    itself (h = max(WL // w, 1)), and the model decides.

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
    lengths = np.asarray(lengths)
    rates = length_rates(lengths, profile, keys, fractions)
    wls, times, _ = _partition(lengths, counts, np.array([0, lengths.size]), rates,
                               profile.max_active_warps(keys["row"]))
    return int(wls[0]), float(times[0])


def _partition(lengths, counts, offsets, rates: dict, max_active_warps: int) -> tuple:
    """Algorithm 2 over every tile (tile t: ``lengths[offsets[t]:offsets[t + 1]]``, decreasing) at once:
    each tile's workload size and predicted time (1 and 0 for an empty tile), and the packing of all
    tiles at all their candidate sizes with the index of each tile's chosen pairing (-1: empty)."""
    lengths, counts = np.asarray(lengths, dtype=np.int64), np.asarray(counts, dtype=np.int64)
    n_tiles = offsets.size - 1
    longest = np.zeros(n_tiles, dtype=np.int64)  # tile_extent of every tile
    runs = offsets[1:] > offsets[:-1]
    longest[runs] = lengths[offsets[:-1][runs]]
    entries = np.concatenate([[0], np.cumsum(lengths * counts)])
    entries = entries[offsets[1:]] - entries[offsets[:-1]]
    sizes = [candidates(a, b, max_active_warps) if a > 0 else [] for a, b in zip(longest.tolist(), entries.tolist())]
    packings = pack_tiles(lengths, counts, offsets, sizes)
    times = tile_times(packings, rates, max_active_warps)
    # Each tile's best pairing: the first of equals, as the paper's loop keeps it.
    order = np.lexsort((np.arange(times.size), times, packings.tile))
    best = np.full(n_tiles, -1, dtype=np.int64)
    firsts = order[np.flatnonzero(np.r_[True, np.diff(packings.tile[order]) != 0])] if order.size else order
    best[packings.tile[firsts]] = firsts
    wls, t, chosen = np.ones(n_tiles, dtype=np.int64), np.zeros(n_tiles), best >= 0
    wls[chosen], t[chosen] = packings.wls[best[chosen]], times[best[chosen]]
    return wls, t, (packings, best)


def partition_tiles(plan: CanonicalMatrix, width: int, runs, profile: Profile | None) -> tuple | None:
    """Algorithms 1-2: every tile's workload size by the model, from the tiles' :class:`RankedRuns`
    (None when there is no profile or it lacks the tile_composite tables: the family then falls back on
    Algorithm 2's bounds alone). The chosen packings are kept for the model's warps of the plan
    (:func:`~tuner.families.tile_composite.packed_tiles`). Every tile's lengths are looked up, and every tile
    packed and timed at every candidate size, at once, each tile with its own gather shares."""
    timed = timed_partition(plan, width, runs, profile)
    return None if timed is None else timed[0]


def timed_partition(plan, width: int, runs, profile: Profile | None) -> tuple[tuple, float] | None:
    """:func:`partition_tiles` and the sum of the chosen tiles' predicted times PM(T, WL) (Algorithm 3's,
    in the tables' unit), for ``plan`` a matrix or a lengths-only view in the plan's order (columns by
    the tiling's order; only its column lengths, types and shape are read)."""
    if profile is None:
        return None
    keys = tile_keys(profile, plan.value_free)
    if keys is None:
        return None
    tile = np.repeat(np.arange(runs.n_tiles), np.diff(runs.offsets))
    rates = length_rates(runs.lengths, profile, keys, tile_fractions(plan, profile, width)[tile])
    wls, times, (packings, best) = _partition(runs.lengths, runs.counts, runs.offsets, rates,
                                              profile.max_active_warps(keys["row"]))
    chosen = tuple(int(w) for w in wls)
    packed_tiles(plan, width, chosen, packings.chosen(best))
    return chosen, float(np.sum(times))


# The family's space reads a profile through this Algorithm 2: the family does not import the model.
set_partition(partition_tiles)
