"""TILE-COO of paper 003 (section 3.1): the entries in COO form, tile by tile.

Each tile's entries keep row order and are padded to whole warps (row -1, column -1, value 0: no row, no
fetch), so that no warp of the COO kernel mixes two tiles: a row that appears in two tiles is then summed
in two runs that never share a warp's segmented scan. The layout is the flat part of an ALIGNED_COO
(:class:`~tuner.formats.aligned_coo.AlignedCoo` with an empty seg part) and runs on its flat kernel.
"""
from __future__ import annotations

import numpy as np

from .aligned_coo import WARP, AlignedCoo, Sizes
from .tiles import TiledEntries, entry_rows
from .xp import like, module, segment_of


def build_tile_coo(indptr, indices, data, tiled: TiledEntries, index_dtype=np.int32) -> AlignedCoo:
    """The TILE-COO layout of a CSR matrix cut into ``tiled``'s tiles (NumPy arrays, or CuPy arrays and a
    tiling of them: the layout is then built on the device, the same arrays).

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
