"""The tiled families' launches, summed for all their tiles at once.

Every tile of tile_coo and tile_composite is a segment of warps of its own (its warps gather from its slice
of x, so its gather shares are its own), and a plan of a large graph has hundreds of tiles: summing them
one segment at a time (:func:`~tuner.model.tables.segment_sums`) cost more than the rest of planning. Here
every tile's warps are looked up in one pass, each with its tile's shares, and reduced per segment: the
same sums, in the same launch order (:class:`~tuner.model.tables.SegmentSums`).
"""
from __future__ import annotations

import numpy as np

from ..families.base import plan_matrix, shared_layout
from ..families.tile_composite import TileCompositeParams, packed_tiles
from ..families.tile_coo import TileCooParams
from ..families.tiles import bounds, ranked_tile_runs
from ..matrix import CanonicalMatrix
from .profile_data import Profile, kernel_key
from .tables import (SegmentSums, blended, blended_alone, blended_heights, column_fractions, row_heights,
                     table_for)

WARP = 32


def tile_fractions(m: CanonicalMatrix, profile: Profile, width: int) -> np.ndarray:
    """Every tile's gather shares (:func:`~tuner.model.tables.gather_fractions`), one row per tile, all
    at once and once per view, profile and width."""
    return shared_layout(m, ("tile_fractions", profile.digest, width),
                         lambda: column_fractions(m, profile, bounds(m, width), tiles=True))


def resident_share(warps: np.ndarray, resident: float) -> np.ndarray:
    """Share of each SM's L1 left to a tile's gathers while its ``warps`` run (in launch order) beside its
    neighbours' in the GPU's window of ``resident`` warps: blocks are dispatched in index order, so the
    resident warps are a window sliding over the launch, and the tiles in it gather from disjoint slices of
    x. Each of the tile's warps sees its tile hold, on average over the window's positions while it is
    resident, this share of the window: 1 - R/3W for a tile of W >= R warps, W/R (1 - W/3R) for fewer.
    A tile of far more warps than the GPU holds (tile_coo's) keeps L1 to itself.

    Example:
        >>> resident_share(np.array([100_000.0, 1_000.0, 500.0, 100.0]), 1_000.0).round(3).tolist()
        [0.997, 0.667, 0.417, 0.097]
    """
    r = np.asarray(warps, dtype=np.float64) / max(float(resident), 1.0)
    return np.where(r >= 1.0, 1.0 - 1.0 / (3.0 * np.maximum(r, 1.0)), r * (1.0 - r / 3.0))


def shared_fractions(m: CanonicalMatrix, profile: Profile, width: int, warps: np.ndarray, resident: float
                     ) -> np.ndarray:
    """Every tile's gather shares when each tile holds its :func:`resident_share` of L1 (``warps``: each
    tile's warps in the launch)."""
    return column_fractions(m, profile, bounds(m, width), resident_share(warps, resident), tiles=True)


def _reduce(seg: np.ndarray, n_segs: int, work: np.ndarray, alone_total: np.ndarray, alone_one: np.ndarray,
            shape: tuple[np.ndarray, np.ndarray], warps: np.ndarray, threads: int, profiled: np.ndarray,
            active: np.ndarray, keys) -> SegmentSums:
    """Per-warp-shape terms summed into their segments ``seg``, the empty segments left out. ``shape``:
    each warp shape's width and warp count (for the segments' :func:`~tuner.model.tables.mean_width`);
    ``warps``: each segment's warp count; ``profiled``, ``active``, ``keys``: each segment's table's
    bytes, resident warps and key."""
    live = np.bincount(seg, minlength=n_segs) > 0
    w_sum = np.bincount(seg, weights=work, minlength=n_segs)
    a_sum = np.bincount(seg, weights=alone_total, minlength=n_segs)
    a_max = np.zeros(n_segs)
    np.maximum.at(a_max, seg, alone_one)
    width, count = shape
    counted = np.bincount(seg, weights=count, minlength=n_segs)
    widths = np.bincount(seg, weights=width * count, minlength=n_segs) / np.maximum(counted, 1e-300)
    blocks = -(-warps.astype(np.int64) * WARP // threads)
    at = np.flatnonzero(live)
    return SegmentSums(w_sum[at], profiled[at].astype(np.float64), a_sum[at], a_max[at], widths[at], blocks[at],
                       int(active[at[-1]]) if at.size else 1, tuple(keys[i] for i in at))


def tile_coo_sums(m: CanonicalMatrix, p: TileCooParams, profile: Profile) -> SegmentSums:
    """TILE-COO: a segment per tile, its entries in COO warps of 32 (ALIGNED_COO's flat kernel and table)
    looked up by the length of their row inside the tile: a row of F entries there makes F / 32 warps.

    Example: see tests/test_tiles.py (needs a profile).
    """
    runs = ranked_tile_runs(plan_matrix(m), p.tile_width)
    key, profiled = table_for(profile, kernel_key("aligned_coo", "flat", p.block_size, m.value_free))
    tile = np.repeat(np.arange(runs.n_tiles), np.diff(runs.offsets))
    keep = runs.lengths > 0
    tile, w, rows = tile[keep], runs.lengths[keep], runs.counts[keep].astype(np.float64)
    size = rows * w
    count = size / WARP  # a row contributes length / 32 warps
    n = runs.n_tiles
    warps = np.floor(np.bincount(tile, weights=size, minlength=n) / WARP)  # exact: integer entries
    fractions = shared_fractions(m, profile, p.tile_width, warps, profile.max_active_warps(key))[tile]
    alone = blended_alone(profile, key, w, fractions)
    return _reduce(tile, n, size / blended(profile, key, w, fractions), count * alone, alone, (w, count), warps,
                   p.block_size, np.full(n, profiled), np.full(n, profile.max_active_warps(key)), (key,) * n)


def tile_composite_sums(m: CanonicalMatrix, p: TileCompositeParams, profile: Profile) -> SegmentSums:
    """TILE-Composite: per tile, a segment of its row-major workloads then one of its column-major ones,
    each workload looked up by its first row's length, charged its unpadded rectangle
    (:attr:`~tuner.formats.tile_composite.Shapes.size`) and held alone for its rounds of the profiled shape,
    from the packings Algorithm 2 chose.

    Example: see tests/test_tiles.py (needs a profile).
    """
    tile, shapes = packed_tiles(plan_matrix(m), p.tile_width, p.workloads)
    n_tiles = len(p.workloads)
    length, size, rounds, h = shapes.length, shapes.size, shapes.rounds, shapes.h
    row_major = shapes.row_major.astype(bool)
    count = shapes.count.astype(np.float64)
    seg = 2 * tile + (~row_major)  # a tile's row-major segment, then its column-major one
    resident = profile.max_active_warps(table_for(profile, kernel_key("tile_composite", "row", p.block_size,
                                                                      m.value_free))[0])
    tile_warps = np.bincount(tile, weights=count, minlength=n_tiles)
    fractions = shared_fractions(m, profile, p.tile_width, tile_warps, resident)[tile]
    perf, alone = np.empty(length.size), np.empty(length.size)
    profiled, active = np.empty(2 * n_tiles), np.empty(2 * n_tiles)
    keys = [""] * (2 * n_tiles)
    heights = row_heights(profile, m.value_free, p.block_size)
    for part, major in (("row", True), ("col", False)):
        key, nbytes = table_for(profile, kernel_key("tile_composite", part, p.block_size, m.value_free))
        at = np.flatnonzero(row_major == major)
        if at.size:
            perf[at] = (blended_heights(profile, heights, length[at], h[at], fractions[at]) if major
                        else blended(profile, key, length[at], fractions[at]))
            alone[at] = blended_alone(profile, key, length[at], fractions[at])
        profiled[0 if major else 1::2] = nbytes
        active[0 if major else 1::2] = profile.max_active_warps(key)
        keys[0 if major else 1::2] = [key] * n_tiles
    warps = np.bincount(seg, weights=count, minlength=2 * n_tiles)
    return _reduce(seg, 2 * n_tiles, count * size / perf, count * rounds * alone, rounds * alone, (length, count),
                   warps, p.block_size, profiled, active, keys)


# Families whose launches are summed here, by registry name: (view, params, profile) -> SegmentSums.
TILED_SUMS = {"tile_coo": tile_coo_sums, "tile_composite": tile_composite_sums}
