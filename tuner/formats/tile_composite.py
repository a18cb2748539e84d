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
from .xp import host, largest, like, module, repeat_by, segment_of, stable_argsort

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


def col_shape_height(w):
    """Rows of the column-major workload the profile measures for width w: the first warp multiple above
    w (taller than wide, so it is stored column-major).

    Example:
        >>> col_shape_height(np.array([1, 31, 32, 40])).tolist()
        [32, 32, 64, 64]
    """
    return _up(np.asarray(w) + 1)


@dataclass(frozen=True)
class Shapes:
    """Algorithm 3's workloads of one tile in runs of one shape: ``pack``'s output before it is spelt out
    workload by workload (the model sums over these, the layout needs every workload).

    Attributes:
        first: rank of the first row of each run's first workload.
        count: workloads in the run; the k-th starts at ``first + k * step``.
        step: rows between consecutive workloads (row-major: h; column-major: h padded to a warp multiple).
        length: the first row's length (the workload's w before padding).
        h: rows the workloads hold (``step``, but the tile's last row-major workload holds only the rows
            that are left: it is a run of its own).
        row_major: stored row-major (w >= h before padding).
        run: which of the packed distinct lengths ``length`` is (its index in ``pack_runs``' lengths).
    """

    first: np.ndarray
    count: np.ndarray
    step: np.ndarray
    length: np.ndarray
    h: np.ndarray
    row_major: np.ndarray
    run: np.ndarray

    @property
    def workloads(self) -> int:
        return int(self.count.sum())

    @property
    def size(self) -> np.ndarray:
        """Unpadded rectangle of each run's workloads: a row-major warp spends on every row what it spends on
        the first (the rows are padded to it), a column-major warp w steps per 32 rows.

        Example (WL = 4 over rows of 3, 2, 2, 1 x 4):
            >>> pack_runs(np.array([3, 2, 1]), np.array([1, 2, 4]), 4).size.tolist()
            [3, 4, 32]
        """
        return self.length * self.h

    @property
    def rounds(self) -> np.ndarray:
        """How many times each run's warps repeat the shape the profile times for their width (a row-major
        row of w; a column-major block of :func:`col_shape_height` rows of w): their time alone in those
        units.

        Example (WL = 80: two rows of 40; 64 rows of 2 and 96 rows of 1, both profiled as 32-row blocks):
            >>> pack_runs(np.array([40, 2, 1]), np.array([2, 2, 200]), 80).rounds.tolist()
            [2.0, 2.0, 3.0]
        """
        return np.where(self.row_major, self.h, self.h / col_shape_height(self.length)).astype(np.float64)


@dataclass(frozen=True)
class Packings:
    """Algorithm 3's partition of one or more tiles at several workload sizes each (:func:`pack_tiles`,
    :func:`pack_many`), flat: a *pairing* is one tile at one workload size, and it has an entry per
    distinct length of its tile (a run), in rank order, holding the workloads that start inside that run
    (all of its shape). Algorithm 2 compares the sizes from these arrays; :meth:`shapes` spells one out.

    Attributes:
        wls, tile: each pairing's workload size and tile.
        bounds: where each pairing's entries begin (pairings + 1 values).
        source: each entry's run as an index into the lengths packed (the tile's run is ``run``).
        lengths, run: each entry's length (the tile's distinct lengths of non-empty rows, decreasing) and
            its index among the tile's runs.
        first, count, step: rank of the first row of the workloads starting in the entry's run, how many
            start there, rows between them; count 0 where none does.
        row_major: those workloads are stored row-major (w >= h).
        tail_rows: per pairing, rows of a last row-major workload that would run past the tile's last row
            and so holds only the rows left (0: none); it is not in ``count``.
        tail_entry, tail_first: its entry and first row.
    """

    wls: np.ndarray
    tile: np.ndarray
    bounds: np.ndarray
    source: np.ndarray
    lengths: np.ndarray
    run: np.ndarray
    first: np.ndarray
    count: np.ndarray
    step: np.ndarray
    row_major: np.ndarray
    tail_rows: np.ndarray
    tail_entry: np.ndarray
    tail_first: np.ndarray

    def shapes(self, c: int) -> Shapes:
        """Pairing ``c``'s packing as :class:`Shapes` (runs in rank order, the tail last)."""
        a, b = int(self.bounds[c]), int(self.bounds[c + 1])
        e = a + np.flatnonzero(self.count[a:b] > 0)
        first, count, h, row_major = self.first[e], self.count[e], self.step[e], self.row_major[e]
        if self.tail_rows[c]:  # one row-major workload of the rows left, after the others
            e = np.append(e, self.tail_entry[c])
            first, count = np.append(first, self.tail_first[c]), np.append(count, 1)
            h, row_major = np.append(h, self.tail_rows[c]), np.append(row_major, True)
        return Shapes(first, count, self.step[e], self.lengths[e], h, row_major, self.run[e])

    def chosen(self, pairings: np.ndarray) -> tuple[np.ndarray, Shapes]:
        """The packings of ``pairings`` (one index per tile, -1 where a tile has none) as one flat
        :class:`Shapes` of every tile's runs, with each run's tile: what :meth:`shapes` gives tile by tile,
        the tails after all the other runs.

        Example (two tiles at WL = 4 and 2; the first one's packing as :func:`pack_many`'s example):
            >>> p = pack_tiles(np.array([3, 2, 1, 5]), np.array([1, 2, 4, 1]), np.array([0, 3, 4]), [[4], [2]])
            >>> tile, s = p.chosen(np.array([0, 1]))
            >>> tile.tolist(), s.first.tolist(), s.length.tolist()
            ([0, 0, 0, 1], [0, 1, 3, 0], [3, 2, 1, 5])
        """
        pairings = np.asarray(pairings, dtype=np.int64)
        tiles = np.flatnonzero(pairings >= 0)
        c = pairings[tiles]
        lo, n = self.bounds[c], self.bounds[c + 1] - self.bounds[c]
        e = np.repeat(lo - (np.cumsum(n) - n), n) + np.arange(int(n.sum()))
        keep = self.count[e] > 0
        e, tile = e[keep], np.repeat(tiles, n)[keep]
        tails = np.flatnonzero(self.tail_rows[c] > 0)
        t_e = self.tail_entry[c[tails]]
        every = np.concatenate([e, t_e])
        return np.concatenate([tile, tiles[tails]]), Shapes(
            np.concatenate([self.first[e], self.tail_first[c[tails]]]),
            np.concatenate([self.count[e], np.ones(tails.size, np.int64)]), self.step[every], self.lengths[every],
            np.concatenate([self.step[e], self.tail_rows[c[tails]]]),
            np.concatenate([self.row_major[e], np.ones(tails.size, bool)]), self.run[every])


def pack_many(lengths: np.ndarray, counts: np.ndarray, wls) -> Packings:
    """Algorithm 3's partition (lines 7-16) of one tile at each workload size of ``wls``: :func:`pack_tiles`
    of that tile alone.

    Example (Fig. 1(d) on a 32-lane GPU: rows of 3, 2, 2, 1 x 4 with WL = 4; with WL = 8 the rows of 3 and
    2 make one row-major workload, and the rest one column-major workload from the second row of 2):
        >>> p = pack_many(np.array([3, 2, 1]), np.array([1, 2, 4]), [4, 8])
        >>> p.count.tolist(), p.shapes(1).first.tolist(), p.shapes(1).h.tolist()
        ([1, 1, 1, 1, 1, 0], [0, 2], [2, 32])
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    return pack_tiles(lengths, counts, np.array([0, lengths.size]), [wls])


def pack_tiles(lengths: np.ndarray, counts: np.ndarray, offsets: np.ndarray, sizes: list) -> Packings:
    """Algorithm 3's partition (lines 7-16) of every tile at each of its workload sizes, all at once. Tile
    t's rows, ranked by decreasing length, come as ``counts`` rows of each of ``lengths[offsets[t]:
    offsets[t + 1]]`` (run-length encoded, decreasing); its sizes are ``sizes[t]``.

    One workload per step: w_j = length of its first row, h_j = WL // w_j, padded (Padding(w, h, 32)); the
    next workload starts h_j rows later (column-major: the padded h_j). Down the ranking w only shrinks,
    so h and the step only grow: over a stretch of runs of one step the workloads start every step rows,
    whatever their first row. Where each stretch's starts begin follows from the stretch before (a loop
    over the k-th stretches of every pairing at once); each run's workloads - those starting inside it -
    are then counted at once.

    Example (two tiles: rows of 3, 2, 2, 1 x 4 at WL = 4; one row of 5 at WL = 2, a workload of its own):
        >>> p = pack_tiles(np.array([3, 2, 1, 5]), np.array([1, 2, 4, 1]), np.array([0, 3, 4]), [[4], [2]])
        >>> [p.shapes(c).first.tolist() for c in range(2)], p.shapes(1).length.tolist()
        ([[0, 1, 3], [0]], [5])
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    counts = np.asarray(counts, dtype=np.int64)
    offsets = np.asarray(offsets, dtype=np.int64)
    n_tiles = offsets.size - 1
    per_tile = np.array([len(s) for s in sizes], dtype=np.int64)
    if per_tile.size != n_tiles:
        raise ValueError(f"packing needs workload sizes for each of the {n_tiles} tiles, got {per_tile.size}")
    wls = np.concatenate([np.asarray(s, dtype=np.int64).ravel() for s in sizes] or [np.zeros(0, np.int64)])
    if wls.size and wls.min() < 1:
        raise ValueError(f"workload size must be >= 1, got {int(wls.min())}")
    tile_of_run = np.repeat(np.arange(n_tiles), np.diff(offsets))
    if np.any((lengths[1:] >= lengths[:-1]) & (tile_of_run[1:] == tile_of_run[:-1])):
        raise ValueError("packing runs needs each tile's distinct row lengths in decreasing order")
    # Each tile's live runs (non-empty rows come first), their rows' ranks and the tile's live rows.
    live_runs = np.bincount(tile_of_run[lengths > 0], minlength=n_tiles)
    ends = np.cumsum(np.where(lengths > 0, counts, 0))
    base = np.concatenate([[0], ends])[offsets[:-1]]
    live_rows = np.zeros(n_tiles, dtype=np.int64)
    some = live_runs > 0
    live_rows[some] = ends[offsets[:-1][some] + live_runs[some] - 1] - base[some]
    # Entries: every pairing (tile at a size) times its tile's live runs.
    tile = np.repeat(np.arange(n_tiles), per_tile)
    n_entries = live_runs[tile]
    bounds = np.concatenate([[0], np.cumsum(n_entries)])
    pairing = np.repeat(np.arange(wls.size), n_entries)
    run = np.arange(int(bounds[-1])) - bounds[pairing]
    source = offsets[tile[pairing]] + run
    L = lengths[source]
    end = ends[source] - base[tile[pairing]]
    start = end - counts[source]
    h = np.maximum(wls[pairing] // L, 1)
    row_major = L >= h
    step = np.where(row_major, h, _up(h))
    # Stretches of runs of one step; each one's workloads start at its origin and every step rows after.
    new = np.ones(L.size, dtype=bool)
    np.not_equal(step[1:], step[:-1], out=new[1:])
    new[bounds[:-1][n_entries > 0]] = True
    first_entry = np.flatnonzero(new)
    owner = pairing[first_entry]
    stop = np.append(first_entry[1:], L.size) if first_entry.size else first_entry
    last_end = end[stop - 1]  # the stretch's last row (its last run's end)
    nth = np.arange(first_entry.size) - np.searchsorted(first_entry, bounds[owner])
    origins = np.empty(first_entry.size, dtype=np.int64)
    at = np.zeros(wls.size, dtype=np.int64)  # each pairing's next start
    by_nth = np.argsort(nth, kind="stable")
    cuts = np.searchsorted(nth[by_nth], np.arange(int(nth.max(initial=-1)) + 2))
    for k in range(cuts.size - 1):  # the k-th stretch of every pairing that has one
        g = by_nth[cuts[k]:cuts[k + 1]]
        p, s, e = owner[g], step[first_entry[g]], last_end[g]
        i = at[p]
        origins[g] = i
        at[p] = np.where(e > i, i + s * -(-(e - i) // s), i)  # the first start at or past the stretch's end
    origin = origins[np.cumsum(new) - 1]
    before = -(-(np.maximum(start, origin) - origin) // step)  # starts before the run (or the part reached)
    count = np.maximum(-(-(end - origin) // step) - before, 0)
    first = origin + before * step
    # The last row-major workload may run past the tile's last row: it holds only the rows that are left.
    tail_entry = np.full(wls.size, -1, dtype=np.int64)
    tail_first, over = np.zeros(wls.size, dtype=np.int64), np.zeros(wls.size, dtype=bool)
    has = n_entries > 0
    if has.any():  # each pairing's last entry where a workload starts (its first always has one)
        tail_entry[has] = np.maximum.reduceat(np.where(count > 0, np.arange(L.size), -1), bounds[:-1][has])
        t = tail_entry[has]
        tail_first[has] = first[t] + step[t] * (count[t] - 1)
        over[has] = row_major[t] & (tail_first[has] + step[t] > live_rows[tile[has]])
        count[tail_entry[over]] -= 1
    return Packings(wls, tile, bounds, source, L, run, first, count, step, row_major,
                    np.where(over, live_rows[tile] - tail_first, 0), tail_entry, tail_first)


def pack_runs(lengths: np.ndarray, counts: np.ndarray, wl: int) -> Shapes:
    """:func:`pack_many` at one workload size, as :class:`Shapes`.

    Example (Fig. 1(d) on a 32-lane GPU: rows of 3, 2, 2, 1 x 4 with WL = 4):
        >>> s = pack_runs(np.array([3, 2, 1]), np.array([1, 2, 4]), 4)
        >>> s.first.tolist(), s.count.tolist(), s.length.tolist(), s.h.tolist(), s.row_major.tolist()
        ([0, 1, 3], [1, 1, 1], [3, 2, 1], [1, 2, 32], [True, True, False])
    """
    return pack_many(lengths, counts, [wl]).shapes(0)


def pack(lengths: np.ndarray, wl: int) -> Workloads:
    """Algorithm 3's partition of rows with ``lengths`` ranked by decreasing length, workload by workload
    (:func:`pack_runs` spelt out).

    Example (Fig. 1(d) on a 32-lane GPU: rows of 3, 2, 2, 1 x 4 with WL = 4):
        >>> p = pack(np.array([3, 2, 2, 1, 1, 1, 1]), 4)
        >>> p.start.tolist(), p.w.tolist(), p.h.tolist(), p.row_major.tolist()
        ([0, 1, 3], [32, 32, 1], [1, 2, 32], [True, True, False])
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.size and np.any(lengths[1:] > lengths[:-1]):
        raise ValueError("pack needs row lengths ranked in decreasing order")
    cut = np.flatnonzero(np.diff(lengths)) + 1
    return pack_counted(lengths[np.r_[0, cut]] if lengths.size else lengths, np.diff(np.r_[0, cut, lengths.size]), wl)


def pack_counted(lengths: np.ndarray, counts: np.ndarray, wl: int) -> Workloads:
    """:func:`pack` of ``counts`` rows of each of ``lengths`` (distinct, decreasing).

    Example (the rows of :func:`pack`'s example, counted):
        >>> pack_counted(np.array([3, 2, 1]), np.array([1, 2, 4]), 4).start.tolist()
        [0, 1, 3]
    """
    return spelt(pack_runs(np.asarray(lengths, dtype=np.int64), np.asarray(counts, dtype=np.int64), wl))


def spelt(s: Shapes) -> Workloads:
    """The workloads of a packing's runs, one by one.

    Example (:func:`pack`'s example):
        >>> spelt(pack_runs(np.array([3, 2, 1]), np.array([1, 2, 4]), 4)).h.tolist()
        [1, 2, 32]
    """
    n = s.count
    nth = np.arange(int(n.sum()), dtype=np.int64) - np.repeat(np.cumsum(n) - n, n)
    start = np.repeat(s.first, n) + np.repeat(s.step, n) * nth
    w = np.repeat(np.where(s.row_major, _up(s.length), s.length), n)
    return Workloads(start, w, np.repeat(s.h, n), np.repeat(s.row_major, n))


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


def tile_ranks(tiled: TiledEntries) -> tuple:
    """(runs in rank order, rank of each run inside its tile): every tile's rows ranked by decreasing
    length inside the tile, ties in row order (two stable radix sorts, no per-tile loop), in the module of
    the tiling's runs (NumPy or CuPy).

    Example (tile 0 has rows of 1 and 2 entries, tile 1 a row of 1):
        >>> from tuner.formats.tiles import tile_entries
        >>> t = tile_entries(np.array([0, 1, 4]), np.array([0, 1, 0, 3]), 4, np.array([0, 2, 4]))
        >>> [r.tolist() for r in tile_ranks(t)]
        [[1, 0, 2], [1, 0, 0]]
    """
    lengths = tiled.run_lengths
    xp = module(lengths)
    n_runs = lengths.size
    if n_runs == 0:
        z = xp.zeros(0, dtype=np.int64)
        return z, z
    longest = largest(lengths)
    key = (longest - lengths).astype(np.uint16 if longest < 1 << 16 else np.uint32)
    by_length = stable_argsort(key)
    del key
    tile = _run_tiles(tiled)
    order = by_length[stable_argsort(tile[by_length])]
    del by_length
    # Runs are grouped by tile, and sorting by tile keeps every group where it was: position i of the
    # ranking lies in tile[i], whose runs begin at tile_runs[tile[i]].
    rank = xp.empty(n_runs, dtype=np.int64)
    rank[order] = xp.arange(n_runs, dtype=np.int64) - like(lengths, tiled.tile_runs)[tile]
    return order, rank


def _run_tiles(tiled: TiledEntries):
    """The tile of every run, in the smallest unsigned type that holds the tile numbers."""
    kind = np.uint16 if tiled.n_tiles < 1 << 16 else np.uint32
    return segment_of(like(tiled.run_lengths, tiled.tile_runs[:-1]), tiled.run_lengths.size).astype(kind)


def _tile_packings(tiled: TiledEntries, order, workload_sizes: tuple) -> list[Workloads]:
    """Every tile's workloads: its runs' lengths in rank order, counted per distinct length (on the device
    when the runs are there: only those counts come to the host), packed by Algorithm 3, all tiles in one
    pass."""
    ranked = tiled.run_lengths[order]
    xp = module(ranked)
    n_runs = ranked.size
    brk = xp.ones(n_runs, dtype=bool)
    if n_runs:
        brk[1:] = ranked[1:] != ranked[:-1]
        inner = tiled.tile_runs[1:-1][tiled.tile_runs[1:-1] < n_runs]
        brk[like(brk, inner)] = True
    at = xp.flatnonzero(brk)
    lengths = host(ranked[at]).astype(np.int64)
    at = host(at)
    counts = np.diff(np.append(at, n_runs))
    cut = np.searchsorted(at, tiled.tile_runs)  # each tile's first distinct length
    packed = pack_tiles(lengths, counts, cut, [[int(w)] for w in workload_sizes])  # every tile at once
    return [spelt(packed.shapes(t)) for t in range(tiled.n_tiles)]


def build_tile_composite(indices, data, tiled: TiledEntries, workload_sizes: tuple, camping_pad: bool = False,
                         index_dtype=np.int32, ranks: tuple | None = None) -> TileComposite:
    """The TILE-Composite layout: every tile packed with its workload size. ``ranks``:
    ``tile_ranks(tiled)``, when already computed. With the tiling and ``indices``/``data`` on the device
    (CuPy) the layout is built there and its arrays are device arrays, equal to the host build's.

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
    xp = module(tiled.run_lengths)
    order, rank = tile_ranks(tiled) if ranks is None else ranks
    packs = _tile_packings(tiled, order, workload_sizes)
    del order
    counts = np.array([p.count for p in packs], dtype=np.int64)
    tile_warps = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    cat = (lambda f: np.concatenate([f(p) for p in packs]) if packs else np.zeros(0, dtype=np.int64))
    start, w, h = cat(lambda p: p.start), cat(lambda p: p.w), cat(lambda p: p.h)
    row_major = cat(lambda p: p.row_major).astype(bool)
    slots = w * h
    gap = np.where(slots % CAMPING_PERIOD == 0, CAMPING_PAD, 0) if camping_pad else 0
    wl_slot = np.concatenate([[0], np.cumsum(slots + gap)]).astype(np.int64)
    wl_row = np.concatenate([[0], np.cumsum(h)]).astype(np.int64)
    # Slots may pass 2^31 with int32 entries: the offsets, and the kernel's slot arithmetic, are 64-bit.
    n_slots, n_row_slots = int(wl_slot[-1]), int(wl_row[-1])

    # Every run's workload and its row within it, from its rank in its tile.
    tile_of_run = _run_tiles(tiled).astype(np.int64)
    wl_of_run = like(rank, tile_warps)[tile_of_run] + _workload_of(rank, start, tile_warps, tile_of_run)
    del tile_of_run
    k = rank - like(rank, start)[wl_of_run]  # row inside the workload
    del rank
    rows = xp.full(n_row_slots, -1, dtype=index_dtype)
    rows[like(k, wl_row[:-1])[wl_of_run] + k] = tiled.run_rows
    # Every entry's slot is its run's first slot plus its column inside the run times the run's stride (1
    # in a row-major workload, h in a column-major one): per run, base - start * stride, then one repeat
    # each and a multiply-add over the entries, which are the run's consecutive entries of tiled.order.
    rm = like(k, row_major)[wl_of_run]
    h_run = like(k, h)[wl_of_run]
    stride = xp.where(rm, 1, h_run).astype(np.int64)
    base = like(k, wl_slot[:-1])[wl_of_run] + xp.where(rm, k * like(k, w)[wl_of_run], k) - tiled.run_starts * stride
    all_row_major = largest(~rm) == 0
    del rm, h_run, k, wl_of_run
    slot = xp.arange(tiled.order.size, dtype=np.int64)  # the runs cover the tiling's entries
    if all_row_major:  # row-major only (a tile of long rows): consecutive slots within each run
        slot += repeat_by(base, tiled.run_lengths)
    else:
        slot *= repeat_by(stride, tiled.run_lengths)
        slot += repeat_by(base, tiled.run_lengths)
    del stride, base
    cols = xp.full(n_slots, -1, dtype=index_dtype)
    cols[slot] = indices[tiled.order]
    vals = None
    if data is not None:
        vals = xp.zeros(n_slots, dtype=data.dtype)
        vals[slot] = data[tiled.order]
    on = lambda a: like(cols, a)  # noqa: E731 - the per-workload arrays where the slots are
    return TileComposite(cols=cols, vals=vals, rows=rows, wl_slot=on(wl_slot[:-1]), wl_row=on(wl_row[:-1]),
                         wl_w=on(w.astype(np.int32)), wl_h=on(np.where(row_major, h, -h).astype(np.int32)),
                         tile_warps=tile_warps)


def _workload_of(rank, start: np.ndarray, tile_warps: np.ndarray, tile_of_run):
    """Index, within its tile's workloads, of the workload holding each run (its rank's last start)."""
    # Offsetting every tile's ranks past the previous tiles' makes one global sorted search serve all.
    n_tiles = tile_warps.size - 1
    span = int(max(largest(rank), start.max(initial=0))) + 1
    tile_of_wl = np.repeat(np.arange(n_tiles, dtype=np.int64), np.diff(tile_warps))
    keys = like(rank, tile_of_wl * span + start)
    found = module(rank).searchsorted(keys, tile_of_run * span + rank, side="right") - 1
    return found - like(rank, tile_warps)[tile_of_run]


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


def build_tile_composite_grouped(indptr, indices, data, bounds: np.ndarray, col_lengths: np.ndarray,
                                 workload_sizes: tuple, camping_pad: bool = False, index_dtype=np.int32,
                                 group_entries: int | None = None) -> TileComposite:
    """:func:`build_tile_composite` of the CSR matrix (``indptr``, ``indices``, ``data``; NumPy or CuPy)
    cut into the tiles of column ``bounds``, built for a group of consecutive tiles at a time
    (:func:`~tuner.formats.tiles.grouped_tiles`) and concatenated: the same arrays, while the tiling's work arrays (an entry's tile, its place in tile-major
    order, its row, the runs) exist for one group's entries only. The layout is tile-major and a tile's
    workloads depend on that tile's rows alone, so the groups' layouts, their slots and rows offset by the
    groups before them, are the whole layout.

    Example (one tile per group gives the one-build arrays):
        >>> from tuner.formats.tiles import tile_entries
        >>> indptr, indices = np.array([0, 3, 4, 6]), np.array([0, 1, 3, 0, 2, 3])
        >>> bounds, lengths = np.array([0, 2, 4]), np.bincount(indices, minlength=4)
        >>> one = build_tile_composite(indices, None, tile_entries(indptr, indices, 4, bounds), (2, 2))
        >>> two = build_tile_composite_grouped(indptr, indices, None, bounds, lengths, (2, 2), group_entries=1)
        >>> all((getattr(one, f) == getattr(two, f)).all() for f in ("cols", "rows", "wl_slot", "wl_w", "wl_h"))
        True
    """
    from .tiles import grouped_tiles
    bounds = host(bounds).astype(np.int64)
    if len(workload_sizes) != bounds.size - 1:
        raise ValueError(f"need one workload size per tile ({bounds.size - 1}), got {len(workload_sizes)}")
    parts = [build_tile_composite(g.cols, g.vals, g.tiled, tuple(workload_sizes[g.first:g.end]), camping_pad,
                                  index_dtype)
             for g in grouped_tiles(indptr, indices, data, bounds, col_lengths, group_entries)]
    return parts[0] if len(parts) == 1 else concatenate_layouts(parts)


def concatenate_layouts(parts: list) -> TileComposite:
    """The layout of consecutive groups of tiles (each group's layout built on its own), each group's
    workloads after the previous groups'. Device parts whose concatenation would not fit beside them in the
    free device memory go through the host: each is copied there and dropped from ``parts`` (the caller's
    list), so the device holds the layout once, not twice; the result is on the device either way.

    Example (two tiles built apart, then joined: the second tile's workloads start after the first's slots):
        >>> from tuner.formats.tiles import tile_entries
        >>> indptr, indices = np.array([0, 2, 3]), np.array([0, 1, 0])
        >>> one = build_tile_composite(indices, None, tile_entries(indptr, indices, 2, np.array([0, 2])), (2,))
        >>> both = concatenate_layouts([one, one])
        >>> both.wl_slot.tolist() == one.wl_slot.tolist() + (one.wl_slot + one.cols.size).tolist(), both.warps
        (True, 4)
    """
    xp = module(parts[0].cols)
    arrays = ("cols", "vals", "rows", "wl_slot", "wl_row", "wl_w", "wl_h")
    if xp is not np:
        from .device_reorder import free_bytes
        size = sum(int(getattr(p, a).nbytes) for p in parts for a in arrays if getattr(p, a) is not None)
        if size > free_bytes():
            for i, p in enumerate(parts):  # each device part freed as soon as it is on the host
                parts[i] = TileComposite(**{a: None if getattr(p, a) is None else host(getattr(p, a)) for a in arrays},
                                         tile_warps=p.tile_warps)
            del p
            whole = _join(parts, np)
            return TileComposite(**{a: None if getattr(whole, a) is None else xp.asarray(getattr(whole, a))
                                    for a in arrays}, tile_warps=whole.tile_warps)
    return _join(parts, xp)


def _join(parts: list, xp) -> TileComposite:
    """:func:`concatenate_layouts` where the parts are (``xp``)."""
    slots = np.concatenate([[0], np.cumsum([p.cols.size for p in parts])]).astype(np.int64)
    row_slots = np.concatenate([[0], np.cumsum([p.rows.size for p in parts])]).astype(np.int64)
    warps = np.concatenate([[0], np.cumsum([p.warps for p in parts])]).astype(np.int64)
    vals = None if parts[0].vals is None else xp.concatenate([p.vals for p in parts])
    return TileComposite(
        cols=xp.concatenate([p.cols for p in parts]), vals=vals, rows=xp.concatenate([p.rows for p in parts]),
        wl_slot=xp.concatenate([p.wl_slot + int(s) for p, s in zip(parts, slots)]),
        wl_row=xp.concatenate([p.wl_row + int(r) for p, r in zip(parts, row_slots)]),
        wl_w=xp.concatenate([p.wl_w for p in parts]), wl_h=xp.concatenate([p.wl_h for p in parts]),
        tile_warps=np.concatenate([[0]] + [p.tile_warps[1:] + int(w) for p, w in zip(parts, warps)]).astype(np.int64))
