"""tile_coo: paper 003's TILE-COO (section 3.1) - columns by decreasing length, cut into tiles whose slice of
x fits the L1, each tile's entries run by a COO kernel.

The COO kernel is ALIGNED_COO's flat kernel (a warp per 32 entries, segmented scan, atomic adds into a
zeroed y), so TILE-COO differs from all-flat ALIGNED_COO only in the order of its entries: tile by tile
(:mod:`tuner.formats.tile_coo`). Tile widths come from the profiled L1 (:mod:`tuner.families.tiles`).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..formats import device_reorder
from ..formats.tile_coo import build_tile_coo, build_tile_coo_grouped
from ..formats.tiles import GROUP_ENTRIES, tile_bounds
from ..matrix import CanonicalMatrix
from .aligned_coo import evaluate, layout_launch
from .base import UNROLL, Family, Launch, check_launch, ordered_device_launch, ordered_launch, shared_layout
from .tiles import TILE_ORDER, tiling, widths

BLOCK_SIZE = 256


@dataclass(frozen=True)
class TileCooParams:
    """Parameters of tile_coo.

    Attributes:
        tile_width: columns per tile (0: one tile, plain COO).
        block_size: threads per block.
        order: relabelling the tiles are cut in; 'degree' numbers columns by decreasing length, which the
            tiling presumes ('none' tiles the caller's column order).
    """

    tile_width: int = 0
    block_size: int = BLOCK_SIZE
    order: str = TILE_ORDER

    def __post_init__(self):
        if not isinstance(self.tile_width, int) or self.tile_width < 0:
            raise ValueError(f"tile_width must be an integer >= 0, got {self.tile_width!r}")
        check_launch(self.block_size, self.order)


def space(m: CanonicalMatrix, profile=None) -> list[TileCooParams]:
    """One candidate per tile width from the L1 (:func:`tuner.families.tiles.widths`), degree order."""
    return [TileCooParams(w, BLOCK_SIZE, TILE_ORDER) for w in widths(m, profile)]


def launch(m: CanonicalMatrix, p: TileCooParams) -> Launch:
    return ordered_launch(m, p.order, lambda b: _launch(b, p))


def device_launch(m: CanonicalMatrix, p: TileCooParams) -> Launch:
    """:func:`launch` built on the GPU from the relabelled matrix's device arrays: the same arrays, as CuPy
    arrays."""
    def build(m, csr, col_lengths):
        # A group of tiles at a time: the work arrays of a billion entries would not fit beside the layout.
        return layout_launch(build_tile_coo_grouped(csr.indptr, csr.indices, csr.data,
                                                    tile_bounds(col_lengths, p.tile_width), col_lengths,
                                                    m.index_dtype), p.block_size)
    return ordered_device_launch(m, p.order, build)


def device_bytes(m: CanonicalMatrix) -> int:
    """Device memory :func:`device_launch` needs beyond the relabelled matrix: the layout (a row, a column
    and a value per entry; a tile's padding to whole warps is noise) and one group's work
    (:data:`~tuner.formats.tiles.GROUP_ENTRIES`) with its part of the layout: the least it needs (a device
    with more free takes larger groups: :func:`~tuner.formats.tiles.device_group_entries`)."""
    entry = 2 * m.index_dtype.itemsize + (0 if m.value_free else m.value_dtype.itemsize)
    return entry * m.nnz + (device_reorder.WORK_BYTES_PER_ENTRY + entry) * min(m.nnz, GROUP_ENTRIES)


def _launch(m: CanonicalMatrix, p: TileCooParams) -> Launch:
    f = shared_layout(m, ("tile_coo", p.tile_width), lambda: build_tile_coo(
        m.indptr, m.indices, None if m.value_free else m.data, tiling(m, p.tile_width), m.index_dtype))
    return layout_launch(f, p.block_size)


def context(m: CanonicalMatrix, p: TileCooParams) -> dict:
    return {"block_size": p.block_size, "unroll": UNROLL, "aligned_chunks": False}


FAMILY = Family(name="tile_coo", template="aligned_coo.cu.j2", params_type=TileCooParams, space=space,
                launch=launch, context=context, evaluate=evaluate, uses_profile=True, device_launch=device_launch,
                device_bytes=device_bytes)
