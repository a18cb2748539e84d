"""A rank's rows cut into the one-GPU plan's tiles, reading x where NCCL gathers it (no permutation a product).

The one-GPU tile_composite kernel is fast because each tile (a range of columns by decreasing degree, as
wide as the L1 holds) is dense enough that x is read from L1. A rank planning its own rows anew relabels
its columns its own way, so x must be permuted into that order every product, and its tiles come out thinner
and cut differently. Here a rank keeps the whole matrix's plan order and tiles: its rows of each tile become
its workloads (packed with the plan's workload sizes), and each entry's column is rewritten, once, to
where that node's x lands in the gathered buffer. So the kernel reads x straight from NCCL's buffer.

The buffer is gathered in chunks (:class:`GatherChunks`): the first holds the hottest slots of every rank,
those of the leading tiles within a small share of the columns. Only that chunk's gather is waited for: a
rank multiplies those tiles while NCCL gathers the long, cold rest of x. On a power-law graph the hub
columns carry most entries, so that phase outlasts the rest's gather; elsewhere it is simply shorter.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import scipy.sparse as sp

from ..families.tile_composite import NOMINAL_ACTIVE_WARPS, bound_workloads
from ..formats.device_reorder import DeviceCsr, gather_rows
from ..formats.tile_composite import TileComposite, build_tile_composite, concatenate_layouts
from ..formats.tiles import grouped_tiles, tile_bounds, tile_runs
from ..formats.xp import module
from .partition import RowPartition

FIRST_COLUMNS = 1 / 16  # share of x in the first chunk: the gather that is not hidden
RELABEL_PIECE = 1 << 27  # layout slots relabelled at once: the temporaries of one piece, not of all


@dataclass(eq=False)
class RankRows:
    """A rank's rows of Wᵀ already picked, in the order of its slots (``partition.rows[rank]``). Mutable:
    :func:`in_plan_numbers` renumbers its columns in place, and :func:`rank_tiles` releases its entries
    (``indices`` and ``data`` None) once they are laid out, before the layout's parts are joined.

    Attributes:
        indptr: their row pointers (int64, from 0).
        indices: their columns: the graph's node numbers, or with ``in_plan_order`` their places in the plan's
            order (:func:`in_plan_numbers`).
        data: their values, or None.
        in_plan_order: whether ``indices`` are places in the plan's order.
    """

    indptr: object
    indices: object
    data: object = None
    in_plan_order: bool = False


RENUMBER_PIECE = 1 << 27  # entries renumbered at once


def in_plan_numbers(rows: RankRows, position: np.ndarray, xp=np) -> RankRows:
    """``rows`` with each column replaced by its node's place in the plan's order (``position``), in place
    (a piece at a time: a rank holding billions of entries keeps one copy of them) where ``xp`` holds them;
    rows already renumbered are returned as they are.

    Example:
        >>> r = RankRows(np.array([0, 2]), np.array([0, 2], np.int32))
        >>> in_plan_numbers(r, np.array([2, 0, 1])) is r, r.indices.tolist(), r.in_plan_order
        (True, [2, 1], True)
    """
    if rows.in_plan_order:
        return rows
    indices = xp.asarray(rows.indices)
    places = xp.asarray(np.asarray(position).astype(indices.dtype))
    for lo in range(0, int(indices.size), RENUMBER_PIECE):
        indices[lo:lo + RENUMBER_PIECE] = places[indices[lo:lo + RENUMBER_PIECE]]
    rows.indices, rows.in_plan_order = indices, True
    return rows


@dataclass(frozen=True)
class GatherChunks:
    """Where every rank's slots sit in the gathered x: the first ``width`` slots of each rank's part (its
    nodes by decreasing degree, those no row reads last and not gathered) are cut at ``cuts``, and chunk j
    holds slots ``cuts[j]`` .. ``cuts[j+1] - 1`` of every rank, rank after rank. One NCCL all-gather per
    chunk then lands in one contiguous piece of the buffer.

    Attributes:
        parts: ranks.
        cuts: (0, ..., width), increasing.

    Example (2 ranks of 3 slots, chunks of 1 and 2 slots):
        >>> c = GatherChunks(2, (0, 1, 3))
        >>> c.offsets(np.array([0, 1, 0, 1]), np.array([0, 0, 2, 2])).tolist(), c.pieces()
        ([0, 1, 3, 5], [(0, 1, 0), (1, 3, 2)])
    """

    parts: int
    cuts: tuple

    def __post_init__(self):
        cuts = tuple(int(c) for c in self.cuts)
        if len(cuts) < 2 or cuts[0] != 0 or any(b <= a for a, b in zip(cuts, cuts[1:])):
            raise ValueError(f"cuts must rise strictly from 0 to the width, got {self.cuts!r}")
        object.__setattr__(self, "cuts", cuts)

    @property
    def width(self) -> int:
        return self.cuts[-1]

    def offsets(self, rank: np.ndarray, k: np.ndarray) -> np.ndarray:
        """Buffer position of slot ``k`` of rank ``rank`` (arrays of equal shape)."""
        cuts = np.asarray(self.cuts, np.int64)
        k = np.asarray(k, np.int64)
        j = np.searchsorted(cuts, k, side="right") - 1
        return self.parts * cuts[j] + np.asarray(rank, np.int64) * (cuts[j + 1] - cuts[j]) + (k - cuts[j])

    def pieces(self) -> list[tuple[int, int, int]]:
        """Per chunk: (first slot, end slot) of each rank's part and where the chunk starts in the buffer."""
        return [(lo, hi, self.parts * lo) for lo, hi in zip(self.cuts, self.cuts[1:])]

    def arrange(self, parts: list) -> np.ndarray:
        """The buffer from every rank's part (NumPy, at least ``width`` long each): what the chunked gathers
        write.

        Example:
            >>> GatherChunks(2, (0, 1, 3)).arrange([np.array([1, 2, 3]), np.array([4, 5, 6])]).tolist()
            [1, 4, 2, 3, 5, 6]
        """
        return np.concatenate([p[lo:hi] for lo, hi, _ in self.pieces() for p in parts])


@dataclass(frozen=True)
class RankTiles:
    """A rank's rows in the one-GPU plan's tiles.

    Attributes:
        layout: the TILE-Composite layout of the rank's rows (rows numbered as the rank's slots, columns as
            positions in the gathered buffer).
        chunks: how x is gathered.
        phase_warps: (0, w1, ..., warps): the workloads of phase j read only chunks 0 .. j of x.
        tile_width: the plan's tile width; workloads: the workload size of each tile for this rank.
        n_rows: the rank's rows.
    """

    layout: TileComposite
    chunks: GatherChunks
    phase_warps: tuple
    tile_width: int
    workloads: tuple
    n_rows: int

    @property
    def nnz(self) -> int:
        return int((self.layout.cols >= 0).sum())  # counted where the layout is


def first_tiles(bounds: np.ndarray, share: float = FIRST_COLUMNS) -> int:
    """How many leading tiles (column ``bounds``) lie within ``share`` of the columns: at least one, every
    tile when there is one.

    Example (tiles of 2, 2 and 4 of 8 columns):
        >>> b = np.array([0, 2, 4, 8])
        >>> first_tiles(b, 1 / 16), first_tiles(b, 0.5), first_tiles(np.array([0, 8]))
        (1, 2, 1)
    """
    n_tiles = bounds.size - 1
    return int(min(max(np.searchsorted(bounds, share * bounds[-1], side="right") - 1, 1), n_tiles))


def gather_chunks(partition: RowPartition, order: np.ndarray, bounds: np.ndarray, t1: int,
                  read: np.ndarray, k: np.ndarray) -> GatherChunks:
    """Chunks of the gathered x: every rank's slots up to its last one that a row reads (``read``: the
    nodes whose column has entries; a partition that puts them first, as DistributedSpMV's does, gathers
    none of the others), the first chunk past every rank's last slot among the columns of the first ``t1``
    tiles (``bounds`` over the nodes in ``order``, the plan's). ``k``: each node's slot within its rank."""
    width = int(k[read].max()) + 1 if read.any() else 1
    if t1 >= bounds.size - 1 or width <= 1:
        return GatherChunks(partition.parts, (0, width))
    hot = order[:bounds[t1]]
    hot = hot[read[hot]]
    cut = int(k[hot].max()) + 1 if hot.size else 1
    return GatherChunks(partition.parts, (0, cut, width) if cut < width else (0, width))


def rank_tiles(Wt, partition: RowPartition, rank: int, order: np.ndarray, col_lengths: np.ndarray,
               tile_width: int, index_dtype=np.int32, values: bool = True, workloads: tuple | None = None,
               active_warps: int = NOMINAL_ACTIVE_WARPS, share: float = FIRST_COLUMNS, xp=np) -> RankTiles:
    """Rank ``rank``'s rows of square ``Wt`` (SciPy CSR, a DeviceCsr whose rows are then gathered on the
    device, or :class:`RankRows`: those rows already picked, the whole matrix nowhere) in the tiles of
    ``tile_width`` columns that the one-GPU plan cuts over the nodes in ``order`` (by decreasing degree),
    given the columns' ``col_lengths``;
    without ``values`` (a pattern matrix, every value the same) the layout holds none. ``workloads``: the
    workload size of every tile, best the one-GPU plan's (a rank's share of a tile then runs as that plan
    runs it, in a quarter of the warps with 4 ranks); without, Algorithm 2's bounds for the rank's share of
    each tile (:func:`~tuner.families.tile_composite.bound_workloads`). With ``xp`` CuPy the rank's entries
    are uploaded once and relabelled and laid out on the GPU (the layout's arrays CuPy arrays, equal to the
    host build's); the host only gathers the rank's rows.

    Example (4 nodes, 2 ranks):
        >>> from tuner.distributed.partition import bitonic_partition
        >>> from tuner.formats.tile_composite import evaluate_tile_composite
        >>> W = sp.csr_matrix(np.array([[0, 1, 2, 0], [3, 0, 0, 4], [5, 6, 0, 0], [0, 0, 7, 0.]]))
        >>> p = bitonic_partition(np.diff(W.indptr), 2)
        >>> order, lengths = np.array([0, 2, 1, 3]), np.bincount(W.indices, minlength=4)
        >>> t = rank_tiles(W, p, 0, order, lengths, tile_width=2)
        >>> x = np.array([1.0, 10, 100, 1000])
        >>> buf = t.chunks.arrange([np.pad(x[r], (0, p.width - r.size)) for r in p.rows])
        >>> evaluate_tile_composite(t.layout, buf, t.n_rows).tolist() == (W @ x)[p.rows[0]].tolist()
        True
    """
    n = np.asarray(col_lengths).size
    order = np.asarray(order, np.int64)
    position = np.empty(n, np.int64)
    position[order] = np.arange(n, dtype=np.int64)
    bounds = tile_bounds(np.asarray(col_lengths)[order], tile_width)
    t1 = first_tiles(bounds, share)
    read = np.asarray(col_lengths) > 0
    k = partition.slots() - partition.owner * partition.width
    chunks = gather_chunks(partition, order, bounds, t1, read, k)
    if index_dtype == np.int32 and partition.parts * chunks.width > np.iinfo(np.int32).max:
        raise OverflowError(f"the gathered x has {partition.parts * chunks.width} slots: more than int32 indices "
                            "hold; use index_dtype=np.int64")
    # Where the x of each node that a row reads lands in the buffer (-1: read by none).
    at = np.full(n, -1, np.int64)
    at[read] = chunks.offsets(partition.owner[read], k[read])
    del k

    if isinstance(Wt, RankRows):  # picked already
        Wt = in_plan_numbers(Wt, position, xp)
        indptr, cols = Wt.indptr, None
        data = xp.asarray(Wt.data) if values and Wt.data is not None else None
    elif isinstance(Wt, DeviceCsr):  # gathered where it is
        indptr, cols, data = gather_rows(Wt.indptr, Wt.indices, Wt.data if values else None, partition.rows[rank])
    else:
        mine = sp.csr_matrix(Wt)[partition.rows[rank]]  # SciPy's row gather (C++)
        # The per-entry relabels below run where the layout is built.
        indptr, cols = mine.indptr.astype(np.int64), xp.asarray(mine.indices)
        data = xp.asarray(mine.data) if values else None
        del mine
    # Columns as the plan numbers them; the layout is built a group of tiles at a time (a rank's share of a
    # billion-entry graph would not fit beside its work arrays), then its columns rewritten to buffer places.
    plan_cols = Wt.indices.astype(index_dtype, copy=False) if cols is None else \
        xp.asarray(position.astype(index_dtype))[cols]
    del cols
    if workloads is not None and len(workloads) != bounds.size - 1:
        raise ValueError(f"tiles of {tile_width} columns cut this matrix into {bounds.size - 1} tiles, but "
                         f"{len(workloads)} workload sizes were given")
    sizes, parts = [], []
    for g in grouped_tiles(xp.asarray(indptr), plan_cols, data, bounds, xp.bincount(plan_cols, minlength=n)):
        if workloads is None:
            sizes += bound_workloads(tile_runs(g.tiled), active_warps)
        wl = tuple(workloads[g.first:g.end]) if workloads is not None else tuple(sizes[g.first:g.end])
        parts.append(build_tile_composite(g.cols, g.vals, g.tiled, wl, False, index_dtype))
    del plan_cols, data
    if isinstance(Wt, RankRows):  # spent: its entries are in the parts now, and joining them needs the room
        Wt.indices = Wt.data = None
    layout = parts[0] if len(parts) == 1 else concatenate_layouts(parts)
    del parts
    layout = replace(layout, cols=_relabel(layout.cols, at[order].astype(index_dtype)))
    workloads = tuple(workloads) if workloads is not None else tuple(sizes)
    tw = layout.tile_warps
    phases = (0, int(tw[t1]), layout.warps) if len(chunks.cuts) > 2 else (0, layout.warps)
    return RankTiles(layout=layout, chunks=chunks, phase_warps=phases, tile_width=int(tile_width),
                     workloads=tuple(workloads), n_rows=int(partition.rows[rank].size))


def _relabel(cols, places: np.ndarray):
    """``places[c]`` for every column c of the layout (NumPy or CuPy), padding (-1) kept, in place and a
    piece at a time."""
    xp = module(cols)
    places = xp.asarray(places)
    for lo in range(0, int(cols.size), RELABEL_PIECE):
        c = cols[lo:lo + RELABEL_PIECE]
        cols[lo:lo + RELABEL_PIECE] = xp.where(c >= 0, places[xp.maximum(c, 0)], c)
    return cols
