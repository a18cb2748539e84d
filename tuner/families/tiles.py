"""What the tiled families (tile_coo, tile_composite) share: tile widths from the GPU's L1, and the
tiling of a plan's matrix, built once per matrix and width."""
from __future__ import annotations

import numpy as np

from ..formats.device_reorder import known_copy
from ..formats.tiles import (RankedRuns, RowSample, TiledEntries, ranked_runs_many, ranked_runs_sorted, tile_bounds,
                             tile_entries, tile_widths)
from ..matrix import CanonicalMatrix
from .base import known_layout, shared_layout

NOMINAL_L1_BYTES = 256 * 1024  # sm_90's L1/texture per SM, for planning without a profile
# Of that L1, what gathers of x get, in 32-byte sectors: half, the share the model leaves to x in a cache
# whose capacity was not measured (:func:`tuner.model.locality.cache_sectors`).
NOMINAL_L1_SECTORS = NOMINAL_L1_BYTES * 0.5 / 32
TILE_ORDER = "degree"  # tiling presumes columns numbered by decreasing length (paper 003, Solution 2)
# The rows the model counts of a plan matrix of 32M entries or more: the long rows and a quarter of the
# chunks of the others. Every tile's count of entries stays within a few percent of the full count (on
# rmat:23's 131M entries within 3.5 %, median 0.4 %), while the counting takes a third of the time on 2
# cores (0.27 s against 0.9 s there) and, on a host of 8, leaves cores to the other families' histograms,
# which are built meanwhile.
RUN_SAMPLE = RowSample()


def l1_sectors(profile=None) -> float:
    """The L1 capacity for gathers, in 32-byte sectors: the profile's
    (:meth:`~tuner.model.profile_data.Profile.cache_sectors`: its measurement, else half its L1), else
    half of 256 KB.

    Example:
        >>> l1_sectors()
        4096.0
    """
    return profile.cache_sectors("l1") if profile is not None else NOMINAL_L1_SECTORS


def widths(m: CanonicalMatrix, profile=None) -> list[int]:
    """Tile widths worth trying on ``m``: a quarter, half and all of the L1's columns of x (0: one tile)."""
    return tile_widths(l1_sectors(profile), m.value_dtype.itemsize, m.n_cols)


def bounds(m: CanonicalMatrix, width: int) -> np.ndarray:
    """:func:`~tuner.formats.tiles.tile_bounds` of ``m``'s columns, once per matrix (or lengths-only view)
    and width: the planner, the model's segments and the layout all ask for them."""
    return shared_layout(m, ("tile_bounds", width), lambda: tile_bounds(m.col_lengths, width))


def tiling(m: CanonicalMatrix, width: int) -> TiledEntries:
    """``m``'s entries cut into tiles of ``width`` columns (Algorithm 1's rule), once per matrix and width."""
    return shared_layout(m, ("tiles", width), lambda: tile_entries(
        m.indptr, m.indices, m.n_cols, bounds(m, width)))


def ranked_tile_runs(m: CanonicalMatrix, width: int) -> RankedRuns:
    """Every tile's rows counted by their length inside the tile (what the model and Algorithms 2-3 read),
    once per plan matrix and width: counted from the CSR arrays, without the tiling a layout needs."""
    return count_tile_runs(m, [width])[0]


def count_tile_runs(m: CanonicalMatrix, widths: list[int]) -> list[RankedRuns]:
    """:func:`ranked_tile_runs` of several widths, those not yet counted in one pass over the entries: on the
    GPU, every row, where the matrix was relabelled there (its device copy is kept); else on the host, of a
    large matrix a sample of the rows (``RUN_SAMPLE``)."""
    missing = [w for w in dict.fromkeys(widths) if known_layout(m, ("ranked_tiles", w)) is None]
    if missing:
        copy = known_copy(m) if isinstance(m, CanonicalMatrix) else None
        if copy is not None:  # relabelled on the GPU: every row counted there
            counted = ranked_runs_sorted(copy.indptr, copy.indices, [bounds(m, w) for w in missing])
        else:
            counted = ranked_runs_many(m.indptr, m.indices, [bounds(m, w) for w in missing], sample=RUN_SAMPLE)
        for w, runs in zip(missing, counted):
            shared_layout(m, ("ranked_tiles", w), lambda runs=runs: runs)
    return [known_layout(m, ("ranked_tiles", w)) for w in widths]
