"""TILE-Composite of paper 003 (section 3.1, Solution 3, Fig. 1(d); appendix E Algorithm 3, lines 7-16).

Inside each column tile (:mod:`tuner.formats.tiles`) the rows are ranked by decreasing length and packed
into workloads of about one size WL: a workload starts at row i, is w = length of row i wide and
h = WL // w rows high. If w >= h it is stored row-major, every row padded to w rounded up to a warp
multiple, and a warp walks its rows CSR-vector style; otherwise it is stored column-major over h rounded
up to a warp multiple (the extra rows are the tile's next, shorter rows, or padding at its end) and each
lane of the warp walks one row ELL style, 32 rows at a time. Padding is column -1 (no fetch) and value 0;
padded rows are row -1. One warp per workload, tiles in order, a tile's longest rows first.

Paper 003 adds 256 bytes after every workload whose size is a multiple of 512 floats against partition
camping on the Tesla's eight 256-byte memory partitions; ``camping_pad`` keeps that as an option so the
report can measure whether it still pays on this GPU.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .tiles import TiledEntries

WARP = 32
CAMPING_PERIOD = 512  # entries of 4 bytes: the paper's 2048-byte partition stride
CAMPING_PAD = 64  # entries of 4 bytes: 256 bytes


def _up(v, k: int = WARP):
    return -(-v // k) * k


@dataclass(frozen=True)
class Workloads:
    """The workloads of one tile, in launch order.

    Attributes:
        start: rank (in the tile's rows by decreasing length) of each workload's first row.
        w: columns: the first row's length (row-major: padded to a warp multiple).
        h: rows: real rows (row-major) or rows padded to a warp multiple (column-major).
        row_major: True where stored row-major (w >= h before padding).
    """

    start: np.ndarray
    w: np.ndarray
    h: np.ndarray
    row_major: np.ndarray

    @property
    def slots(self) -> np.ndarray:
        return self.w * self.h

    @property
    def count(self) -> int:
        return int(self.start.size)

    def rounds(self, ranked: np.ndarray) -> np.ndarray:
        """How many times each warp repeats the shape the profile times for its width (a row-major row of
        w; a column-major block of :func:`col_shape_height` rows of w): its time alone in those units.

        Example (WL = 80: two rows of 40; 64 rows of 2 and 96 rows of 1, both profiled as 32-row blocks):
            >>> ranked = np.array([40, 2, 2] + [1] * 200)
            >>> pack(ranked, 80).rounds(ranked).tolist()
            [2.0, 2.0, 3.0, 3.0]
        """
        w = np.asarray(ranked, dtype=np.int64)[self.start]
        return np.where(self.row_major, self.h, self.h / col_shape_height(w)).astype(np.float64)

    def rectangles(self, ranked: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(first row's length, unpadded rectangle size) of every workload, given the ranked row lengths it
        was packed from: a row-major warp spends on every row what it spends on the first (the rows are
        padded to it), a column-major warp w steps per 32 rows.

        Example:
            >>> ranked = np.array([3, 2, 2, 1, 1, 1, 1])
            >>> [a.tolist() for a in pack(ranked, 4).rectangles(ranked)]
            [[3, 2, 1], [3, 4, 32]]
        """
        w = np.asarray(ranked, dtype=np.int64)[self.start]
        return w, w * self.h


def col_shape_height(w):
    """Rows of the column-major workload the profile measures for width w: the first warp multiple above
    w (taller than wide, so it is stored column-major).

    Example:
        >>> col_shape_height(np.array([1, 31, 32, 40])).tolist()
        [32, 32, 64, 64]
    """
    return _up(np.asarray(w) + 1)


def run_ends(lengths: np.ndarray) -> np.ndarray:
    """For rows ranked by decreasing length: the rank of the first shorter row, for every live row (what
    :func:`pack` steps by; computed once when one tile is packed with many workload sizes). Linear: the
    end of each run of equal lengths, repeated over the run.

    Example:
        >>> run_ends(np.array([5, 5, 2, 1, 1, 0])).tolist()
        [2, 2, 3, 5, 5]
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    live = lengths[:int(np.count_nonzero(lengths))]
    if live.size == 0:
        return np.zeros(0, dtype=np.int64)
    ends = np.append(np.flatnonzero(live[1:] != live[:-1]) + 1, live.size)
    return np.repeat(ends, np.diff(ends, prepend=0))


def pack(lengths: np.ndarray, wl: int, ends: np.ndarray | None = None) -> Workloads:
    """Algorithm 3's partition (lines 7-16) of rows with ``lengths`` ranked by decreasing length.

    One workload per step: w_j = length of its first row, h_j = WL // w_j, padded (Padding(w, h, 32)); the
    next workload starts h_j rows later (column-major: the padded h_j). Vectorised over each run of equal
    lengths, so the loop runs once per distinct length, not once per workload. ``ends``: the lengths'
    :func:`run_ends`, when already known.

    Example (Fig. 1(d) on a 32-lane GPU: rows of 3, 2, 2, 1 x 4 with WL = 4):
        >>> p = pack(np.array([3, 2, 2, 1, 1, 1, 1]), 4)
        >>> p.start.tolist(), p.w.tolist(), p.h.tolist(), p.row_major.tolist()
        ([0, 1, 3], [32, 32, 1], [1, 2, 32], [True, True, False])
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    n = lengths.size
    if n and np.any(lengths[1:] > lengths[:-1]):
        raise ValueError("pack needs row lengths ranked in decreasing order")
    if wl < 1:
        raise ValueError(f"workload size must be >= 1, got {wl}")
    live = int(np.count_nonzero(lengths))
    run_end = run_ends(lengths) if ends is None else ends
    # One step per run of equal lengths, in scalars; the workloads' arrays are built once at the end.
    firsts, counts, steps, widths, majors = [], [], [], [], []
    i = 0
    while i < live:
        w = int(lengths[i])
        h = max(wl // w, 1)
        row_major = w >= h
        step = h if row_major else _up(h)
        k = -(-(int(run_end[i]) - i) // step)  # workloads starting in this run
        firsts.append(i)
        counts.append(k)
        steps.append(step)
        widths.append(_up(w) if row_major else w)
        majors.append(row_major)
        i += step * k
    if not firsts:
        z = np.zeros(0, dtype=np.int64)
        return Workloads(z, z, z, np.zeros(0, dtype=bool))
    counts = np.array(counts, dtype=np.int64)
    h = np.repeat(np.array(steps, dtype=np.int64), counts)
    nth = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    start = np.repeat(np.array(firsts, dtype=np.int64), counts) + h * nth
    w = np.repeat(np.array(widths, dtype=np.int64), counts)
    row_major = np.repeat(np.array(majors, dtype=bool), counts)
    # A row-major workload that runs past the tile's last row holds only the rows that are left.
    h = np.where(row_major, np.minimum(h, live - start), h)
    return Workloads(start, w, h, row_major)


@dataclass(frozen=True)
class TileComposite:
    """A TILE-Composite layout (index arrays in the matrix's index dtype; values None when value-free).

    Attributes:
        cols, vals: every workload's slots, workload after workload (``wl_slot``), padding column -1, value 0.
        rows: every workload's rows (row-major: its h rows; column-major: h rows, padding -1), workload
            after workload (``wl_row``).
        wl_slot: first slot of each workload (int64).
        wl_row: first entry of ``rows`` of each workload (int64).
        wl_w: each workload's width (row-major: padded row length; column-major: columns).
        wl_h: each workload's height, negative for a column-major workload (-(padded rows)).
        tiles: number of tiles; tile_warps: first workload of each tile (n_tiles + 1 values).
    """

    cols: np.ndarray
    vals: np.ndarray | None
    rows: np.ndarray
    wl_slot: np.ndarray
    wl_row: np.ndarray
    wl_w: np.ndarray
    wl_h: np.ndarray
    tile_warps: np.ndarray

    @property
    def warps(self) -> int:
        return int(self.wl_w.size)


def tile_ranks(tiled: TiledEntries) -> tuple[np.ndarray, np.ndarray]:
    """(runs in rank order, rank of each run inside its tile): every tile's rows ranked by decreasing
    length inside the tile, ties in row order (two stable radix-friendly sorts, no per-tile loop).

    Example (tile 0 has rows of 1 and 2 entries, tile 1 a row of 1):
        >>> from tuner.formats.tiles import tile_entries
        >>> t = tile_entries(np.array([0, 1, 4]), np.array([0, 1, 0, 3]), 4, np.array([0, 2, 4]))
        >>> [r.tolist() for r in tile_ranks(t)]
        [[1, 0, 2], [1, 0, 0]]
    """
    lengths = tiled.run_lengths
    n_runs = lengths.size
    if n_runs == 0:
        z = np.zeros(0, dtype=np.int64)
        return z, z
    longest = int(lengths.max())
    key = (longest - lengths).astype(np.uint16 if longest < 1 << 16 else np.uint32)
    by_length = np.argsort(key, kind="stable")
    tile = np.repeat(np.arange(tiled.n_tiles, dtype=np.uint16 if tiled.n_tiles < 1 << 16 else np.uint32),
                     np.diff(tiled.tile_runs))
    order = by_length[np.argsort(tile[by_length], kind="stable")]
    rank = np.empty(n_runs, dtype=np.int64)
    rank[order] = np.arange(n_runs, dtype=np.int64) - np.repeat(tiled.tile_runs[:-1], np.diff(tiled.tile_runs))
    return order, rank


def build_tile_composite(indices: np.ndarray, data: np.ndarray | None, tiled: TiledEntries,
                         workload_sizes: tuple, camping_pad: bool = False, index_dtype=np.int32,
                         ranks: tuple[np.ndarray, np.ndarray] | None = None) -> TileComposite:
    """The TILE-Composite layout: every tile packed with its workload size (vectorised but for a loop
    over tiles and, inside :func:`pack`, over distinct row lengths). ``ranks``: ``tile_ranks(tiled)``,
    when already computed.

    Example (one tile; rows of 3, 1 and 2 entries with WL = 3: rows 0 and 2 are row-major workloads of one
    row each, row 1 (w = 1, h = 3) a column-major one padded to 32 rows):
        >>> from tuner.formats.tiles import tile_entries
        >>> indptr, indices = np.array([0, 3, 4, 6]), np.array([0, 1, 2, 0, 1, 2])
        >>> f = build_tile_composite(indices, None, tile_entries(indptr, indices, 3, np.array([0, 3])), (3,))
        >>> f.wl_w.tolist(), f.wl_h.tolist(), f.rows[:3].tolist(), f.cols[32:35].tolist(), f.cols[64:67].tolist()
        ([32, 32, 1], [1, 1, -32], [0, 2, 1], [1, 2, -1], [0, -1, -1])
    """
    if len(workload_sizes) != tiled.n_tiles:
        raise ValueError(f"need one workload size per tile ({tiled.n_tiles}), got {len(workload_sizes)}")
    order, rank = tile_ranks(tiled) if ranks is None else ranks
    tile_of_run = np.repeat(np.arange(tiled.n_tiles), np.diff(tiled.tile_runs))
    packs = []
    for t in range(tiled.n_tiles):
        ranked = tiled.run_lengths[order[tiled.tile_runs[t]:tiled.tile_runs[t + 1]]]
        packs.append(pack(ranked, int(workload_sizes[t])))
    counts = np.array([p.count for p in packs], dtype=np.int64)
    tile_warps = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    cat = (lambda f: np.concatenate([f(p) for p in packs]) if packs else np.zeros(0, dtype=np.int64))
    start, w, h = cat(lambda p: p.start), cat(lambda p: p.w), cat(lambda p: p.h)
    row_major = cat(lambda p: p.row_major).astype(bool)
    slots = w * h
    gap = np.where(slots % CAMPING_PERIOD == 0, CAMPING_PAD, 0) if camping_pad else 0
    wl_slot = np.concatenate([[0], np.cumsum(slots + gap)]).astype(np.int64)
    wl_row = np.concatenate([[0], np.cumsum(h)]).astype(np.int64)
    n_slots, n_row_slots = int(wl_slot[-1]), int(wl_row[-1])
    if index_dtype == np.int32 and max(n_slots, n_row_slots) > np.iinfo(np.int32).max:
        raise OverflowError(f"the TILE-Composite layout needs {n_slots} slots: more than int32 offsets hold; "
                            "compile with index_dtype=np.int64")

    # Every run's workload and its row within it, from its rank in its tile.
    wl_of_run = tile_warps[tile_of_run] + _workload_of(rank, start, tile_warps, tile_of_run)
    k = rank - start[wl_of_run]  # row inside the workload
    rows = np.full(n_row_slots, -1, dtype=index_dtype)
    rows[wl_row[:-1][wl_of_run] + k] = tiled.run_rows
    # Every entry: its run, its column inside the run, then its slot.
    run_of = np.repeat(np.arange(tiled.run_lengths.size, dtype=np.int64), tiled.run_lengths)
    c = np.arange(run_of.size, dtype=np.int64) - tiled.run_starts[run_of]
    j, kk = wl_of_run[run_of], k[run_of]
    del run_of
    slot = wl_slot[:-1][j] + np.where(row_major[j], kk * w[j] + c, c * h[j] + kk)
    del j, kk, c
    cols = np.full(n_slots, -1, dtype=index_dtype)
    cols[slot] = np.asarray(indices)[tiled.order]
    vals = None
    if data is not None:
        vals = np.zeros(n_slots, dtype=data.dtype)
        vals[slot] = data[tiled.order]
    return TileComposite(cols=cols, vals=vals, rows=rows, wl_slot=wl_slot[:-1], wl_row=wl_row[:-1],
                         wl_w=w.astype(np.int32), wl_h=np.where(row_major, h, -h).astype(np.int32),
                         tile_warps=tile_warps)


def _workload_of(rank: np.ndarray, start: np.ndarray, tile_warps: np.ndarray, tile_of_run: np.ndarray) -> np.ndarray:
    """Index, within its tile's workloads, of the workload holding each run (its rank's last start)."""
    # Offsetting every tile's ranks past the previous tiles' makes one global sorted search serve all.
    n_tiles = tile_warps.size - 1
    span = int(max(rank.max(initial=0), start.max(initial=0))) + 1
    tile_of_wl = np.repeat(np.arange(n_tiles, dtype=np.int64), np.diff(tile_warps))
    keys = tile_of_wl * span + start
    found = np.searchsorted(keys, tile_of_run * span + rank, side="right") - 1
    return found - tile_warps[tile_of_run]


def evaluate_tile_composite(f: TileComposite, x: np.ndarray, n_rows: int, pattern_value: float = 1.0) -> np.ndarray:
    """y = A x from the built arrays as the kernel reads them: every workload's slots added to the rows
    its shape assigns them (values None: a pattern matrix of ``pattern_value``).

    Example: see :func:`build_tile_composite` and tests/test_tiles.py.
    """
    y = np.zeros(n_rows)
    if f.warps == 0:
        return y
    w = f.wl_w.astype(np.int64)
    h = np.abs(f.wl_h.astype(np.int64))
    slots = w * h
    j = np.repeat(np.arange(f.warps), slots)
    s = np.arange(j.size, dtype=np.int64) - np.repeat(np.cumsum(slots) - slots, slots)
    k = np.where(f.wl_h[j] > 0, s // w[j], s % h[j])  # the slot's row inside its workload
    at = f.wl_slot[j] + s
    row = f.rows[f.wl_row[j] + k]
    col = f.cols[at]
    live = col >= 0
    if np.any(row[live] < 0):
        raise AssertionError("a slot holding an entry belongs to a padding row")
    v = x[col[live]].astype(np.float64) * (pattern_value if f.vals is None else f.vals[at[live]])
    return y + np.bincount(row[live].astype(np.int64), weights=v, minlength=n_rows)
