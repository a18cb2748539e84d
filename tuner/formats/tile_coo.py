"""TILE-COO of paper 003 (section 3.1): the entries in COO form, tile by tile.

Each tile's entries keep row order and are padded to whole warps (row -1, column -1, value 0: no row, no
fetch), so that no warp of the COO kernel mixes two tiles: a row that appears in two tiles is then summed
in two runs that never share a warp's segmented scan. The layout is the flat part of an ALIGNED_COO
(:class:`~tuner.formats.aligned_coo.AlignedCoo` with an empty seg part) and runs on its flat kernel.
"""
from __future__ import annotations

import numpy as np

from .aligned_coo import WARP, AlignedCoo, Sizes
from .tiles import TileOrder, entry_rows, grouped_tiles
from .xp import host, like, module, segment_of


def build_tile_coo(indptr, indices, data, tiled: TileOrder, index_dtype=np.int32) -> AlignedCoo:
    """The TILE-COO layout of a CSR matrix cut into ``tiled``'s tiles (NumPy arrays, or CuPy arrays and a
    tiling of them: the layout is then built on the device, the same arrays); of the tiling it reads only
    the tile-major order (:class:`~tuner.formats.tiles.TileOrder`), each entry's row found anew.

    Example (two tiles of columns {0, 1} and {2, 3}; each tile padded to 32 slots):
        >>> from tuner.formats.tiles import tile_entries
        >>> indptr, indices = np.array([0, 3, 4]), np.array([0, 2, 3, 1])
        >>> f = build_tile_coo(indptr, indices, None, tile_entries(indptr, indices, 4, np.array([0, 2, 4])))
        >>> f.flat_rows[:3].tolist(), f.flat_rows[32:35].tolist(), f.flat_cols[32:35].tolist(), f.sizes.chunks
        ([0, 1, -1], [0, 0, -1], [2, 3, -1], 2)
    """
    xp = module(tiled.order)
    counts = np.diff(tiled.tile_starts)
    padded = -(-counts // WARP) * WARP
    slot0 = np.concatenate([[0], np.cumsum(padded)]).astype(np.int64)
    n = int(slot0[-1])
    tile_of = segment_of(like(tiled.order, tiled.tile_starts[:-1]), tiled.order.size)  # of each position of ``order``
    pos = xp.arange(tiled.order.size, dtype=np.int64) + like(tile_of, slot0[:-1] - tiled.tile_starts[:-1])[tile_of]
    del tile_of
    rows = xp.full(n, -1, dtype=index_dtype)
    cols = xp.full(n, -1, dtype=index_dtype)
    rows[pos] = entry_rows(indptr, tiled.order)
    cols[pos] = indices[tiled.order]
    vals = None
    if data is not None:
        vals = xp.zeros(n, dtype=data.dtype)
        vals[pos] = data[tiled.order]
    empty = xp.zeros(0, dtype=index_dtype)
    return AlignedCoo(empty, empty, None if data is None else xp.zeros(0, dtype=data.dtype), rows, cols, vals,
                      Sizes(seg_len=0, lanes=0, n_seg=0, n_flat=n), "flat")


def build_tile_coo_grouped(indptr, indices, data, bounds: np.ndarray, col_lengths: np.ndarray,
                           index_dtype=np.int32, group_entries: int | None = None) -> AlignedCoo:
    """:func:`build_tile_coo` of the CSR matrix (NumPy or CuPy arrays) cut into the tiles of column
    ``bounds``, a group of consecutive tiles at a time (:func:`~tuner.formats.tiles.grouped_tiles`): the
    same arrays, since every tile is padded to whole warps on its own.

    Example (one tile per group gives the one-build arrays):
        >>> from tuner.formats.tiles import tile_entries
        >>> indptr, indices = np.array([0, 3, 4]), np.array([0, 2, 3, 1])
        >>> bounds, lengths = np.array([0, 2, 4]), np.ones(4, int)
        >>> one = build_tile_coo(indptr, indices, None, tile_entries(indptr, indices, 4, bounds))
        >>> two = build_tile_coo_grouped(indptr, indices, None, bounds, lengths, group_entries=1)
        >>> bool((one.flat_rows == two.flat_rows).all() and (one.flat_cols == two.flat_cols).all())
        True
    """
    xp = module(indices)
    bounds = host(bounds).astype(np.int64)
    total = np.concatenate([[0], np.cumsum(host(col_lengths), dtype=np.int64)])
    slot0 = np.concatenate([[0], np.cumsum(-(-(total[bounds[1:]] - total[bounds[:-1]]) // WARP) * WARP)])
    # Each group's part is written into the whole layout as it is made: one layout and one part, not the
    # parts and their concatenation, are live at once.
    out = None
    for g in grouped_tiles(indptr, indices, data, bounds, col_lengths, group_entries, runs=False):
        part = build_tile_coo(g.indptr, g.cols, g.vals, g.tiled, index_dtype)
        if g.first == 0 and g.end == bounds.size - 1:
            return part
        if out is None:
            n = int(slot0[-1])
            out = AlignedCoo(part.seg_rows, part.seg_cols, part.seg_vals, xp.empty(n, index_dtype),
                             xp.empty(n, index_dtype), None if data is None else xp.empty(n, data.dtype),
                             Sizes(seg_len=0, lanes=0, n_seg=0, n_flat=n), "flat")
        lo, hi = int(slot0[g.first]), int(slot0[g.end])
        for name in ("flat_rows", "flat_cols", "flat_vals"):
            if getattr(out, name) is not None:
                getattr(out, name)[lo:hi] = getattr(part, name)
        del part
    return out
