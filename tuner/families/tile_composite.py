"""tile_composite: paper 003's TILE-Composite (section 3.1, Solutions 1-3; appendix E, Algorithms 1-3).

Columns by decreasing length, cut into tiles whose slice of x fits the L1 (Algorithm 1's tiles, widths from
the profiled L1: :mod:`tuner.families.tiles`); inside every tile the rows by decreasing length packed into
workloads of one size, each a warp's rectangle stored row-major (CSR-vector) or column-major (ELL)
(:mod:`tuner.formats.tile_composite`). The workload size of every tile comes from Algorithm 2 over the
lookup model (:func:`tuner.model.tile_composite.partition`); without a profile, from Algorithm 2's bounds
alone (the largest multiple of the tile's longest row that still fills the GPU once).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..formats.device_reorder import WORK_BYTES_PER_ENTRY
from ..formats.tile_composite import (Shapes, TileComposite, build_tile_composite, build_tile_composite_grouped,
                                      evaluate_tile_composite, pack_runs, tile_ranks)
from ..formats.tiles import GROUP_ENTRIES, PARALLEL_ENTRIES, RankedRuns, tile_bounds
from ..matrix import CanonicalMatrix
from ..workers import pool as thread_pool
from .base import (UNROLL, Family, Launch, check_launch, ceil_div, ordered_device_launch, ordered_launch, ordered_matrix,
                   shared_layout)
from .tiles import TILE_ORDER, count_tile_runs, ranked_tile_runs, tiling, widths

BLOCK_SIZE = 256
NOMINAL_ACTIVE_WARPS = 132 * 64  # an H100's resident warps: Algorithm 2's bound when there is no profile

# Algorithm 2 over the lookup model: (plan matrix, tile width, its tiles' RankedRuns, profile) -> every
# tile's workload size, or None where the profile lacks this family's tables. The model predicts from the
# layouts built here and so imports this module; it hands its Algorithm 2 over (:func:`set_partition`)
# rather than this module importing the model.
Partition = Callable[[CanonicalMatrix, int, RankedRuns, object], "tuple | None"]
_partition: Partition | None = None


def set_partition(partition: Partition) -> None:
    """Choose each tile's workload size by ``partition`` wherever :func:`space` is given a profile: the
    model sets :func:`tuner.model.tile_composite.partition_tiles` here as :mod:`tuner.model` is imported,
    which every profile is read through."""
    global _partition
    _partition = partition


@dataclass(frozen=True)
class TileCompositeParams:
    """Parameters of tile_composite.

    Attributes:
        tile_width: columns per tile (0: one tile).
        workloads: the workload size (entries per warp) of each tile, in tile order.
        camping_pad: leave 256 bytes after every workload whose size is a multiple of 512 entries (paper
            003's guard against partition camping), so that the report can measure whether it pays.
        block_size: threads per block.
        order: relabelling the tiles are cut in ('degree': columns by decreasing length).
    """

    tile_width: int = 0
    workloads: tuple = ()
    camping_pad: bool = False
    block_size: int = BLOCK_SIZE
    order: str = TILE_ORDER

    def __post_init__(self):
        object.__setattr__(self, "workloads", tuple(int(w) for w in self.workloads))  # lists from JSON plans
        if not isinstance(self.tile_width, int) or self.tile_width < 0:
            raise ValueError(f"tile_width must be an integer >= 0, got {self.tile_width!r}")
        if not self.workloads or min(self.workloads) < 1:
            raise ValueError(f"workloads must give each tile a size >= 1, got {self.workloads!r}")
        check_launch(self.block_size, self.order)


def ranking(m: CanonicalMatrix, width: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`~tuner.formats.tile_composite.tile_ranks` of ``m``'s tiles, once per plan matrix and width
    (the layout's order of the rows inside each tile)."""
    return shared_layout(m, ("tile_ranks", width), lambda: tile_ranks(tiling(m, width)))


def packed(m: CanonicalMatrix, width: int, t: int, wl: int, shapes: Shapes | None = None) -> Shapes:
    """Algorithm 3's packing of tile ``t`` of plan matrix ``m`` at workload size ``wl``, once per matrix: the
    planner packs it while choosing ``wl`` (and hands it over as ``shapes``), the model reads it again."""
    return shared_layout(m, ("packed", width, t, wl), lambda: shapes if shapes is not None else pack_runs(
        *ranked_tile_runs(m, width).tile(t), wl))


def packed_tiles(m: CanonicalMatrix, width: int, workloads, chosen: tuple | None = None) -> tuple:
    """(each run's tile, :class:`~tuner.formats.tile_composite.Shapes` of every run) of plan matrix ``m``'s
    tiles packed at ``workloads`` (one size per tile), flat, once per matrix, width and sizes: the planner
    hands them over as ``chosen`` (:meth:`~tuner.formats.tile_composite.Packings.chosen`) while choosing the
    sizes; else each tile is packed (:func:`packed`). The model sums all tiles from them at once."""
    def build():
        if chosen is not None:
            return chosen
        shapes = [packed(m, width, t, wl) for t, wl in enumerate(workloads)]
        tile = np.repeat(np.arange(len(shapes)), [s.length.size for s in shapes])
        return tile, Shapes(*(np.concatenate([getattr(s, f.name) for s in shapes] or [np.zeros(0, np.int64)])
                              for f in dataclasses.fields(Shapes)))
    return shared_layout(m, ("packed_tiles", width, tuple(int(w) for w in workloads)), build)


def fill_workload(longest: int, entries: int, active_warps: int) -> int:
    """Algorithm 2's bounds without a model: the largest multiple of the tile's ``longest`` row that is at
    most its ``entries`` over the GPU's resident warps (so the tile still fills the GPU), at least that row.

    Example (rows of 10, 5, 5 and 10,000 of one: 10,020 entries over 100 warps):
        >>> fill_workload(10, 10_020, 100)
        100
    """
    upper = int(entries) // max(active_warps, 1)
    return max(longest, upper // longest * longest) if longest else 1


def tile_extent(lengths: np.ndarray, counts: np.ndarray) -> tuple[int, int]:
    """(longest row, entries) of a tile of ``counts`` rows of each of ``lengths`` (decreasing).

    Example:
        >>> tile_extent(np.array([10, 5, 1]), np.array([1, 2, 10_000]))
        (10, 10020)
    """
    return (int(lengths[0]) if len(lengths) else 0), int(np.asarray(lengths) @ np.asarray(counts))


def bound_workloads(runs: RankedRuns, active_warps: int = NOMINAL_ACTIVE_WARPS) -> tuple:
    """Every tile's workload size by Algorithm 2's bounds alone (:func:`fill_workload` of its longest row and
    entries), for a tiling whose rows are counted in ``runs``.

    Example (one tile of rows 10, 5, 5 and 10,000 of one entry, over 100 warps):
        >>> bound_workloads(RankedRuns(np.array([10, 5, 1]), np.array([1, 2, 10_000]), np.array([0, 3])), 100)
        (100,)
    """
    return tuple(fill_workload(*tile_extent(*runs.tile(t)), active_warps) for t in range(runs.n_tiles))


def space(m: CanonicalMatrix, profile=None) -> list[TileCompositeParams]:
    """Per tile width from the L1: the workload sizes of Algorithm 2 (over the lookup model when the profile
    has this family's tables: :func:`set_partition`). The camping pad is not offered: on the H100 it changes
    no time measurably, and offering it would double the candidates; ``camping_pad=True`` remains for
    measuring it."""
    if profile is not None and _partition is None:
        raise RuntimeError("tile_composite was given a profile but no model to read it: import tuner.model")
    plan = ordered_matrix(m, TILE_ORDER)
    ws = widths(m, profile)
    counted = count_tile_runs(plan, ws)  # every width counted in one pass

    def params(width, runs):
        wl = _partition(plan, width, runs, profile) if profile is not None else None
        return TileCompositeParams(width, wl if wl is not None else bound_workloads(runs), False, BLOCK_SIZE,
                                   TILE_ORDER)
    if profile is not None and len(ws) > 1 and m.nnz >= PARALLEL_ENTRIES:
        # The widths' partitions share nothing but the plan matrix: its gather shares and packings are
        # whole-array passes (hundreds of milliseconds apiece on 500M entries) that run side by side.
        with thread_pool(len(ws)) as pool:
            return list(pool.map(params, ws, counted))
    return [params(w, r) for w, r in zip(ws, counted)]


def layout_of(m: CanonicalMatrix, p: TileCompositeParams) -> TileComposite:
    """The layout of plan matrix ``m``, built once per matrix and parameters."""
    t = tiling(m, p.tile_width)
    if len(p.workloads) != t.n_tiles:
        raise ValueError(f"tile_composite with tile_width={p.tile_width} cuts this matrix into {t.n_tiles} "
                         f"tiles, but {len(p.workloads)} workload sizes were given")
    return shared_layout(m, ("tile_composite", p.tile_width, p.workloads, p.camping_pad), lambda: build_tile_composite(
        m.indices, None if m.value_free else m.data, t, p.workloads, p.camping_pad, m.index_dtype,
        ranking(m, p.tile_width)))


def launch(m: CanonicalMatrix, p: TileCompositeParams) -> Launch:
    return ordered_launch(m, p.order, lambda b: _launch(layout_of(b, p), p))


def device_launch(m: CanonicalMatrix, p: TileCompositeParams) -> Launch:
    """:func:`launch` built on the GPU from the relabelled matrix's device arrays: the same arrays, as CuPy
    arrays."""
    def build(m, csr, col_lengths):
        bounds = tile_bounds(col_lengths, p.tile_width)
        if len(p.workloads) != bounds.size - 1:
            raise ValueError(f"tile_composite with tile_width={p.tile_width} cuts this matrix into "
                             f"{bounds.size - 1} tiles, but {len(p.workloads)} workload sizes were given")
        # A group of tiles at a time: the work arrays of a billion entries would not fit beside the layout.
        return _launch(build_tile_composite_grouped(csr.indptr, csr.indices, csr.data, bounds, col_lengths,
                                                    p.workloads, p.camping_pad, m.index_dtype), p)
    return ordered_device_launch(m, p.order, build)


def device_bytes(m: CanonicalMatrix) -> int:
    """Device memory :func:`device_launch` needs beyond the relabelled matrix: the layout (slots, padding
    included, counted as twice the entries) and one group's work (:data:`GROUP_ENTRIES`): the least it needs
    (a device with more free takes larger groups: :func:`~tuner.formats.tiles.device_group_entries`)."""
    entry = m.index_dtype.itemsize + (0 if m.value_free else m.value_dtype.itemsize)
    return 2 * entry * m.nnz + WORK_BYTES_PER_ENTRY * min(m.nnz, GROUP_ENTRIES)


def _launch(f: TileComposite, p: TileCompositeParams) -> Launch:
    arrays = [("cols", f.cols)] + ([("vals", f.vals)] if f.vals is not None else [])
    arrays += [("rows", f.rows), ("wl_slot", f.wl_slot), ("wl_row", f.wl_row), ("wl_w", f.wl_w), ("wl_h", f.wl_h)]
    return Launch(arrays=tuple(arrays), scalars=(("warps", f.warps),), grid=ceil_div(f.warps * 32, p.block_size),
                  block=p.block_size, zero_y=True)


def context(m: CanonicalMatrix, p: TileCompositeParams) -> dict:
    return {"block_size": p.block_size, "unroll": UNROLL}


def evaluate(m: CanonicalMatrix, built: Launch, x: np.ndarray) -> np.ndarray:
    a = dict(built.arrays)
    f = TileComposite(cols=a["cols"], vals=a.get("vals"), rows=a["rows"], wl_slot=a["wl_slot"], wl_row=a["wl_row"],
                      wl_w=a["wl_w"], wl_h=a["wl_h"], tile_warps=np.zeros(0, np.int64))
    return evaluate_tile_composite(f, x, m.n_rows, m.pattern_value if m.value_free else 1.0)


FAMILY = Family(name="tile_composite", template="tile_composite.cu.j2", params_type=TileCompositeParams,
                space=space, launch=launch, context=context, evaluate=evaluate, uses_profile=True,
                device_launch=device_launch, device_bytes=device_bytes)
