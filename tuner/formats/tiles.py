"""Column tiles of paper 003 (section 3.1, Solutions 1-2, appendix E Algorithm 1).

The columns are numbered by decreasing length (the plan's degree ordering), so the hot entries of x come
first. Tiles of ``width`` consecutive columns are cut from column 0 while a tile still has a column of more
than one entry (the reuse that tiling buys; Algorithm 1, lines 6-7); everything after the last full tile
is the sparse remainder, one more tile. A kernel that visits the entries tile by tile gathers from one
slice of x at a time, small enough to stay in each SM's L1.

:func:`tile_order` puts a CSR matrix's entries tile-major (CSR order kept inside a tile, so a tile's
entries are sorted by row), and :func:`tile_entries` also finds each tile's rows: the runs of one (tile,
row). Vectorised: a division, a radix sort on the tile ids and a few passes over the entries.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from ..workers import pool as thread_pool
from .xp import host, largest, like, module, segment_of_scan, stable_argsort, tally


def tile_bounds(col_lengths: np.ndarray, width: int) -> np.ndarray:
    """Column bounds of the tiles: tile t holds columns ``bounds[t]`` to ``bounds[t + 1] - 1``.

    Full tiles of ``width`` columns are cut while the tile's longest column has more than one entry (with
    columns sorted by length that is the paper's test on the tile's first column); the rest of the columns
    form the last tile. ``width`` 0 or at least the column count gives one tile.

    Example (columns by decreasing length, tiles of 2: the third tile would start at a column of one entry):
        >>> tile_bounds(np.array([5, 4, 3, 2, 1, 1, 1, 0]), 2).tolist()
        [0, 2, 4, 8]
    """
    col_lengths = np.asarray(col_lengths)
    n = col_lengths.size
    if width < 0:
        raise ValueError(f"tile width must be >= 0, got {width}")
    if n == 0:
        return np.array([0, 0], dtype=np.int64)
    if width == 0 or width >= n:
        return np.array([0, n], dtype=np.int64)
    full = n // width
    n_tiles, at, step = full, 0, 16
    while at < full:  # tiles a growing batch at a time: the first of one entry ends them, often early on
        end = min(full, at + step)
        longest = np.maximum.reduceat(col_lengths[at * width:end * width], np.arange(0, (end - at) * width, width))
        stop = np.flatnonzero(longest <= 1)
        if stop.size:
            n_tiles = at + int(stop[0])
            break
        at, step = end, 2 * step
    bounds = np.arange(n_tiles + 1, dtype=np.int64) * width
    if bounds[-1] < n:
        bounds = np.append(bounds, n)
    return bounds


@dataclass(frozen=True, eq=False)
class TileOrder:
    """A matrix's entries in tile-major order (:func:`tile_order`): what a layout that keeps each entry as it
    is (TILE-COO) needs.

    Attributes:
        bounds: column bounds of the tiles (:func:`tile_bounds`).
        order: entry numbers (positions in the CSR arrays) in tile-major order, CSR order inside a tile.
        tile_starts: position in ``order`` where each tile's entries begin (n_tiles + 1 values).
    """

    bounds: np.ndarray
    order: np.ndarray
    tile_starts: np.ndarray

    @property
    def n_tiles(self) -> int:
        return self.bounds.size - 1


@dataclass(frozen=True, eq=False)
class TiledEntries(TileOrder):
    """A matrix's entries regrouped tile-major, with every tile's rows (:func:`tile_entries`).

    Attributes (beyond :class:`TileOrder`'s):
        run_rows: row of each (tile, row) run, tile by tile, rows ascending inside a tile.
        run_lengths: entries in each run (the row's length inside the tile).
        run_starts: position in ``order`` where each run begins.
        tile_runs: index in the runs where each tile's runs begin (n_tiles + 1 values).
    """

    run_rows: np.ndarray
    run_lengths: np.ndarray
    run_starts: np.ndarray
    tile_runs: np.ndarray

    def tile_lengths(self, t: int) -> np.ndarray:
        """Lengths of tile ``t``'s rows inside the tile, in row order."""
        return self.run_lengths[self.tile_runs[t]:self.tile_runs[t + 1]]


def tile_of(indices, bounds: np.ndarray):
    """The tile of every column index (the smallest unsigned type that holds the tile numbers), in the
    module of ``indices`` (NumPy or CuPy).

    Example:
        >>> tile_of(np.array([0, 3, 2, 7]), np.array([0, 2, 4, 8])).tolist()
        [0, 1, 1, 2]
    """
    xp = module(indices)
    bounds = host(bounds).astype(np.int64)
    n_tiles = bounds.size - 1
    key_dtype = np.uint16 if n_tiles <= np.iinfo(np.uint16).max else np.uint32
    width = int(bounds[1] - bounds[0]) if n_tiles > 1 else 0
    if n_tiles == 1:
        return xp.zeros(indices.size, dtype=key_dtype)
    if np.all(np.diff(bounds[:-1]) == width):
        # Equal tiles then the remainder: a division instead of a search.
        return xp.minimum(indices // width, n_tiles - 1).astype(key_dtype)
    return (xp.searchsorted(like(indices, bounds), indices, side="right") - 1).astype(key_dtype)


def entry_rows(indptr, positions):
    """The row of each entry at ``positions`` of a CSR matrix's arrays (host: one repeat and a gather;
    device: one search of the row pointers).

    Example:
        >>> entry_rows(np.array([0, 2, 2, 3]), np.array([2, 0, 1])).tolist()
        [2, 0, 0]
    """
    n_rows = indptr.size - 1
    row_dtype = np.int32 if n_rows < np.iinfo(np.int32).max else np.int64
    if module(positions) is np:
        return np.repeat(np.arange(n_rows, dtype=row_dtype), np.diff(indptr))[positions]
    ptr = like(positions, indptr)
    if positions.size >= n_rows and int(ptr[0]) == 0:
        # Every entry's row by one running sum, then gathered: cheaper than a search per position.
        return segment_of_scan(ptr[:-1], int(ptr[-1]), row_dtype)[positions]
    return entry_rows_search(ptr, positions).astype(row_dtype)


def entry_rows_search(indptr, positions):
    """:func:`entry_rows` as the device computes it, in either module (int64): a search of the row
    pointers, where an empty row's pointer repeats the next row's and the search lands on the last.

    Example:
        >>> entry_rows_search(np.array([0, 2, 2, 3]), np.array([2, 0, 1])).tolist()
        [2, 0, 0]
    """
    xp = module(positions)
    return xp.searchsorted(like(positions, indptr).astype(np.int64), positions, side="right") - 1


@dataclass(frozen=True, eq=False)
class RankedRuns:
    """Every tile's row lengths inside the tile, ranked in decreasing order and run-length encoded: what
    the model and Algorithms 2-3 read (which rows they are is the layout's business).

    Attributes:
        lengths: each tile's distinct lengths, decreasing, tile after tile (int64).
        counts: rows of each length (int64).
        offsets: where each tile's lengths begin (n_tiles + 1 values).
    """

    lengths: np.ndarray
    counts: np.ndarray
    offsets: np.ndarray

    @property
    def n_tiles(self) -> int:
        return self.offsets.size - 1

    def tile(self, t: int) -> tuple[np.ndarray, np.ndarray]:
        """(distinct lengths, rows of each) of tile ``t``."""
        a, b = self.offsets[t], self.offsets[t + 1]
        return self.lengths[a:b], self.counts[a:b]

    def ranked(self, t: int) -> np.ndarray:
        """Tile ``t``'s row lengths one by one, decreasing."""
        return np.repeat(*self.tile(t))


COUNTED_LENGTHS = 64  # runs shorter than this are counted in a (tile, length) table; the longer few are sorted
CHUNK_ENTRIES = 1 << 20  # entries counted at a time (whole rows)
PARALLEL_ENTRIES = 1 << 23  # count on several threads from this many entries on
SORTED_PIECE_ENTRIES = 1 << 28  # entries ranked_runs_sorted counts at once (its work: about 30 B an entry)


@dataclass(frozen=True)
class RowSample:
    """Which rows :func:`ranked_runs_many` counts on a large matrix, and what each counted row stands for.

    The rows are cut into chunks of ``chunk_entries`` entries (whole rows). A chunk holding a row of at
    least ``exact_length`` entries is always counted: such rows make a tile's long runs, few and each
    weighty. The other chunks, in order, are taken ``every`` at a time and the middle one of each group is
    counted for all of them (its counts times the group's size, so counts stay whole): in a degree-ordered
    plan matrix, rows by decreasing length (or row + column length when square), neighbouring chunks
    hold rows of nearly one length, so the middle one stands well for its group. Matrices of fewer than
    ``from_entries`` entries are counted exactly.

    Attributes:
        from_entries: sample from this many entries on.
        every: chunks in a group (1: count every row).
        chunk_entries: entries of a chunk.
        exact_length: rows at least this long are always counted.
    """

    from_entries: int = 1 << 25
    every: int = 4
    chunk_entries: int = 1 << 18
    exact_length: int = 4096

    def chunks(self, indptr: np.ndarray) -> tuple[list[tuple[int, int]], list[int]]:
        """Row ranges (a, b) to count and the integer weight of each.

        Example (10 rows of 8 entries then 32 of 1, chunks of 16 entries: rows 0-1, 2-3, ..., 8-9, 10-25,
        26-41; in groups of 4 the third chunk stands for the first four, the sixth for the last three):
            >>> s = RowSample(from_entries=0, every=4, chunk_entries=16, exact_length=1_000)
            >>> s.chunks(np.concatenate([[0], np.cumsum([8] * 10 + [1] * 32)]))
            ([(4, 6), (10, 26)], [4, 3])
            >>> RowSample(from_entries=0, every=4, chunk_entries=16, exact_length=8).chunks(np.array([0, 8, 16, 17]))
            ([(0, 2), (2, 3)], [1, 1])
        """
        nnz = int(indptr[-1])
        exact = self.every <= 1 or nnz < self.from_entries
        step = CHUNK_ENTRIES if exact else self.chunk_entries
        cuts = np.searchsorted(indptr, np.arange(step, nnz, step))
        rows = np.unique(np.concatenate([[0], cuts, [indptr.size - 1]]))
        rows = rows[np.r_[True, indptr[rows[1:]] > indptr[rows[:-1]]]] if rows.size > 1 else rows
        ranges = list(zip(rows[:-1].tolist(), rows[1:].tolist()))
        if exact or not ranges:
            return ranges, [1] * len(ranges)
        lengths = np.diff(indptr)
        longest = np.maximum.reduceat(lengths, rows[:-1])
        whole = longest >= self.exact_length
        out = [(r, 1) for r in np.flatnonzero(whole).tolist()]
        rest = np.flatnonzero(~whole)
        for g in range(0, rest.size, self.every):
            group = rest[g:g + self.every]
            out.append((int(group[group.size // 2]), int(group.size)))
        out.sort()
        return [ranges[r] for r, _ in out], [w for _, w in out]


EXACT = RowSample(every=1)  # count every row


def ranked_runs(indptr: np.ndarray, indices: np.ndarray, bounds: np.ndarray, workers: int | None = None,
                sample: RowSample = EXACT) -> RankedRuns:
    """Count every tile's rows by their length inside the tile, straight from the CSR arrays (no regrouping
    of the entries): :class:`RankedRuns`, equal to :func:`tile_entries`' runs ranked per tile.

    Example (rows [0, 1 | 2, 3] and [2]: tile 0 has a run of 2, tile 1 runs of 2 and 1):
        >>> r = ranked_runs(np.array([0, 4, 5]), np.array([0, 1, 2, 3, 2]), np.array([0, 2, 4]))
        >>> r.lengths.tolist(), r.counts.tolist(), r.offsets.tolist()
        ([2, 2, 1], [1, 1, 1], [0, 1, 3])
    """
    return ranked_runs_many(indptr, indices, [bounds], workers, sample)[0]


def ranked_runs_many(indptr: np.ndarray, indices: np.ndarray, bounds_list: list, workers: int | None = None,
                     sample: RowSample = EXACT) -> list[RankedRuns]:
    """:func:`ranked_runs` for several tilings (each from :func:`tile_bounds`) in one pass over the entries.

    The rows' column indices must be sorted (canonical CSR), so that a row's entries of one tile are
    consecutive: a run starts at every row start and wherever the tile changes. When every width is a
    multiple of the narrowest, the entries are cut once, into runs of the narrowest tiles, and the wider
    tilings merge those runs (a quarter as many as entries on a power-law graph). The entries are counted
    a million at a time, so that the passes work in cache on reused memory, and on ``workers`` threads
    for large matrices (NumPy releases the GIL in its passes): counts add up. ``sample`` may count only
    some of the rows, each counted run standing for several (:class:`RowSample`); the default counts all.

    Example (tiles of 2 and of 4 columns):
        >>> b2, b4 = np.array([0, 2, 4]), np.array([0, 4])
        >>> [r.ranked(0).tolist() for r in ranked_runs_many(np.array([0, 4, 5]), np.array([0, 1, 2, 3, 2]), [b2, b4])]
        [[2], [4, 1]]
    """
    indptr = np.asarray(indptr)
    bounds_list = [np.asarray(b, dtype=np.int64) for b in bounds_list]
    n_tiles = [b.size - 1 for b in bounds_list]
    nnz = int(indptr[-1])
    if workers is None:
        workers = min(8, os.cpu_count() or 1) if nnz >= PARALLEL_ENTRIES else 1
    ranges, weights = sample.chunks(indptr)
    chunks = work_units(indptr, ranges, weights)

    def count(group):
        dense = [np.zeros((n, COUNTED_LENGTHS), np.int64) for n in n_tiles]
        long = [[] for _ in n_tiles]
        for unit, weight in group:
            part = _chunk_counts(*_unit_csr(indptr, indices, unit), bounds_list)
            for k, (d, lt, ll) in enumerate(part):
                dense[k] += d if weight == 1 else d * weight
                long[k].append((lt, ll, np.full(lt.size, weight, np.int64)))
        return dense, long
    groups = [chunks[i::workers] for i in range(workers) if chunks[i::workers]]
    if len(groups) > 1:
        with thread_pool(len(groups)) as pool:
            parts = list(pool.map(count, groups))
    else:
        parts = [count(g) for g in groups] or [count([])]
    out = []
    for k, n in enumerate(n_tiles):
        dense = sum(p[0][k] for p in parts)
        pairs = [x for p in parts for x in p[1][k]]
        long_tile, long_length, long_weight = (np.concatenate([x[i] for x in pairs]) if pairs else np.zeros(0, np.int64)
                                               for i in range(3))
        out.append(_ranked(dense, long_tile, long_length, long_weight, n))
    return out


def ranked_runs_sorted(indptr, indices, bounds_list: list, piece_entries: int | None = None) -> list[RankedRuns]:
    """:func:`ranked_runs_many` counted exactly, every row, by whole-array passes and a table of the short
    runs per tiling (:func:`run_table`), in the module of ``indices``: on the GPU for CuPy arrays
    (milliseconds for 100M entries, where the host counts a sample of the rows in tenths of a second), only
    the counts coming back.
    Rows are counted in pieces of about ``piece_entries`` entries (default :data:`SORTED_PIECE_ENTRIES`; a
    run never crosses a row), so that the work arrays are one piece's.

    Example (tiles of 2 and of 4 columns, as :func:`ranked_runs_many`'s example):
        >>> b2, b4 = np.array([0, 2, 4]), np.array([0, 4])
        >>> [r.ranked(0).tolist() for r in ranked_runs_sorted(np.array([0, 4, 5]), np.array([0, 1, 2, 3, 2]), [b2, b4])]
        [[2], [4, 1]]
    """
    xp = module(indices)
    nnz = int(indptr[-1])
    piece = SORTED_PIECE_ENTRIES if piece_entries is None else max(int(piece_entries), 1)
    ptr = like(indices, indptr).astype(np.int64)  # where the entries are: only a few numbers come back
    n_rows = int(ptr.size) - 1
    # Row cuts at about every piece's worth of entries.
    cuts = np.unique(np.concatenate([[0], host(xp.searchsorted(ptr, xp.arange(0, nnz, piece, dtype=np.int64),
                                                               side="right") - 1), [n_rows]]))
    bounds_list = [host(b).astype(np.int64) for b in bounds_list]
    tables = [[] for _ in bounds_list]
    for r0, r1 in zip(cuts[:-1].tolist(), cuts[1:].tolist()):
        e0, e1 = (int(v) for v in host(ptr[xp.asarray([r0, r1])]))
        if e1 == e0:
            continue
        cols = indices[e0:e1]
        row_start = xp.zeros(e1 - e0, dtype=bool)
        starts = ptr[r0:r1][ptr[r0 + 1:r1 + 1] > ptr[r0:r1]] - e0
        row_start[starts] = True
        for k, bounds in enumerate(bounds_list):
            tile = tile_of(cols, bounds)
            new = row_start.copy()
            new[1:] |= tile[1:] != tile[:-1]
            run = xp.flatnonzero(new)
            del new
            length = xp.diff(xp.concatenate([run, like(run, [e1 - e0])]))
            tables[k].append(run_table(tile[run], length, bounds.size - 1))
            del tile, run, length
    out = []
    for bounds, table in zip(bounds_list, tables):  # the pieces' counts add up, as ranked_runs_many's chunks'
        n_tiles = bounds.size - 1
        dense = sum((t[0] for t in table), np.zeros((n_tiles, COUNTED_LENGTHS), np.int64))
        long_tile, long_length, long_count = (np.concatenate([t[i] for t in table] or [np.zeros(0, np.int64)])
                                              for i in (1, 2, 3))
        out.append(_ranked(dense, long_tile, long_length, long_count, n_tiles))
    return out


def run_table(tile, length, n_tiles: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Runs of ``length`` entries in tiles ``tile`` counted as :func:`_ranked` reads them, on the host: a
    (tile, length) table of those shorter than :data:`COUNTED_LENGTHS` - nearly all of them - and the longer
    ones' distinct (tile, length) pairs with how many runs have each. Counted in ``tile``'s module: the table
    by :func:`~tuner.formats.xp.tally` over cells length-major, so that the runs of one entry in every tile
    crowd its low cells (per block on the device), and only the few long runs sorted.

    Example (runs of 1, 1 and 70 entries in tile 0, one of 2 in tile 1):
        >>> dense, tile, length, count = run_table(np.array([0, 0, 1, 0]), np.array([1, 1, 2, 70]), 2)
        >>> dense[:, :3].tolist(), tile.tolist(), length.tolist(), count.tolist()
        ([[0, 2, 0], [0, 0, 1]], [0], [70], [1])
    """
    xp = module(length)
    short = COUNTED_LENGTHS - 1  # the table's lengths: 1 .. short
    cell = (xp.minimum(length, COUNTED_LENGTHS) - 1) * n_tiles + tile  # the last row (long runs) is not read
    table = host(tally(cell, COUNTED_LENGTHS * n_tiles))[:short * n_tiles].astype(np.int64)
    dense = np.zeros((n_tiles, COUNTED_LENGTHS), np.int64)
    dense[:, 1:] = table.reshape(short, n_tiles).T
    long_runs = xp.flatnonzero(length > short)
    long_length = length[long_runs]
    span = largest(long_length) + 1
    keys, counts = (host(a) for a in xp.unique(tile[long_runs].astype(np.int64) * span + long_length,
                                              return_counts=True))
    return dense, keys // span, keys % span, counts.astype(np.int64)


def work_units(indptr: np.ndarray, ranges: list[tuple[int, int]], weights: list[int],
               entries: int = CHUNK_ENTRIES) -> list[tuple[list[tuple[int, int]], int]]:
    """The row ranges to count, in order, gathered into units of about ``entries`` entries, each unit's
    ranges of one weight: a sample's chunks of a quarter of that are counted four at a time, so that the
    threads of :func:`ranked_runs_many` make a quarter as many NumPy calls (each takes the GIL) for the
    same entries.

    Example (rows of 4 entries, units of 8; the weight-1 chunk starts a unit of its own, and ranges that
    meet become one):
        >>> work_units(np.arange(0, 44, 4), [(0, 1), (2, 3), (4, 5), (6, 7), (7, 8), (9, 10)], [4, 4, 1, 4, 4, 4], 8)
        [([(0, 1), (2, 3)], 4), ([(4, 5)], 1), ([(6, 8)], 4), ([(9, 10)], 4)]
    """
    units: list[tuple[list[tuple[int, int]], int]] = []
    held = 0
    for (a, b), weight in zip(ranges, weights):
        if units and units[-1][1] == weight and held < entries:
            last = units[-1][0]
            last[-1:] = [(last[-1][0], b)] if last[-1][1] == a else [last[-1], (a, b)]
        else:
            units.append(([(a, b)], weight))
            held = 0
        held += int(indptr[b] - indptr[a])
    return units


def _unit_csr(indptr: np.ndarray, indices: np.ndarray, unit: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """The CSR arrays (row pointers from 0, column indices) of a unit's row ranges one after another: a
    single range is a slice; several are joined, each range's rows whole, so that their runs are those of
    each range counted alone."""
    if len(unit) == 1:
        a, b = unit[0]
        return indptr[a:b + 1] - indptr[a], indices[indptr[a]:indptr[b]]
    ptrs, cols, base = [np.zeros(1, dtype=indptr.dtype)], [], 0
    for a, b in unit:
        ptrs.append(indptr[a + 1:b + 1] - indptr[a] + base)
        cols.append(indices[indptr[a]:indptr[b]])
        base += int(indptr[b] - indptr[a])
    return np.concatenate(ptrs), np.concatenate(cols)


def _ranked(dense: np.ndarray, long_tile: np.ndarray, long_length: np.ndarray, long_weight: np.ndarray,
            n_tiles: int) -> RankedRuns:
    """:class:`RankedRuns` from a (tile, length) table of the short runs and the long runs' pairs, each
    standing for ``long_weight`` runs."""
    span = int(long_length.max(initial=0)) + 1
    pairs, at = np.unique(long_tile.astype(np.int64) * span + long_length, return_inverse=True)
    long_counts = np.bincount(at.ravel(), weights=long_weight, minlength=pairs.size).astype(np.int64)
    at = np.flatnonzero(dense)
    tile = np.concatenate([pairs // span, at // COUNTED_LENGTHS])
    length = np.concatenate([pairs % span, at % COUNTED_LENGTHS])
    counts = np.concatenate([long_counts, dense.ravel()[at]]).astype(np.int64)
    order = np.lexsort((-length, tile))
    tile = tile[order]
    return RankedRuns(length[order], counts[order], np.searchsorted(tile, np.arange(n_tiles + 1)).astype(np.int64))


def _width(bounds: np.ndarray) -> int:
    """The width of a tiling's full tiles (0: a single tile)."""
    return int(bounds[1] - bounds[0]) if bounds.size > 2 else 0


def _chunk_counts(indptr: np.ndarray, indices: np.ndarray, bounds_list: list) -> list:
    """Per tiling, the runs of one CSR chunk's rows: a (tile, length) table of those shorter than
    COUNTED_LENGTHS, and (tile, length) of the others."""
    nnz = int(indptr[-1])
    indices = indices[:nnz]
    widths = [_width(b) for b in bounds_list]
    narrow = min((w for w in widths if w), default=0)
    if narrow and any(w % narrow for w in widths):  # not nested: each tiling cuts the entries itself
        return [_chunk_counts(indptr, indices, [b])[0] for b in bounds_list]
    row_start = np.zeros(nnz, dtype=bool)
    row_start[indptr[:-1][np.diff(indptr) > 0]] = True
    if narrow:
        # The narrowest tiles, numbered up to a cap past every tiling's last full tile (the remainders).
        cap = max(w // narrow * (b.size - 2) for w, b in zip(widths, bounds_list) if w)
        top = (max(int(b[-1]) for b in bounds_list) - 1) // narrow  # the largest quotient: it must fit
        fine = (indices // narrow).astype(np.uint16 if top < 1 << 16 else np.uint32)
        np.minimum(fine, cap, out=fine)  # in the narrow type: half the memory of the division's
        new = np.empty(nnz, dtype=bool)
        new[:1] = True
        np.not_equal(fine[1:], fine[:-1], out=new[1:])
        new |= row_start
        starts = np.flatnonzero(new)
        run_tile, run_row_start = fine[starts], row_start[starts]
    else:  # single tiles only: the runs are the rows
        cap = 0
        starts = np.flatnonzero(row_start)
        run_tile, run_row_start = np.zeros(starts.size, np.uint16), np.ones(starts.size, dtype=bool)
    if nnz < (1 << 31):
        starts = starts.astype(np.int32)
    out = []
    for w, b in zip(widths, bounds_list):
        last = b.size - 2
        if w == narrow and last >= cap:  # the narrowest tiling's runs are the fine ones
            tile, run_starts = run_tile, starts
        else:
            tile = run_tile // (w // narrow) if w else np.zeros_like(run_tile)
            np.minimum(tile, last, out=tile)
            brk = np.empty(tile.size, dtype=bool)
            brk[:1] = True
            np.not_equal(tile[1:], tile[:-1], out=brk[1:])
            brk |= run_row_start
            at = np.flatnonzero(brk)
            tile, run_starts = tile[at], starts[at]
        length = np.empty_like(run_starts)
        np.subtract(run_starts[1:], run_starts[:-1], out=length[:-1])
        length[-1:] = nnz - run_starts[-1:]
        # One count of (tile, length) with the long runs in an extra column, dropped: no filtering.
        bins = (last + 1) * (COUNTED_LENGTHS + 1)
        kind = np.uint16 if bins <= (1 << 16) else np.int32 if bins < (1 << 31) else np.int64
        key = tile.astype(kind) * kind(COUNTED_LENGTHS + 1)
        key += np.minimum(length, COUNTED_LENGTHS).astype(kind, copy=False)
        dense = key_counts(key, bins).reshape(last + 1, -1)
        long = np.flatnonzero(length >= COUNTED_LENGTHS)
        out.append((dense[:, :COUNTED_LENGTHS], tile[long].astype(np.int64), length[long].astype(np.int64)))
    return out


def key_counts(key: np.ndarray, bins: int) -> np.ndarray:
    """How many times each of 0 .. ``bins`` - 1 occurs in ``key``: sorted, then the lengths of its runs of
    equal keys. Unlike np.bincount, which holds the GIL, a sort lets the threads of
    :func:`ranked_runs_many` count at once: on the H100's host rmat:23:12 counted on 8 threads in
    0.27-0.31 s against 0.41 s, though on one thread in 1.40 s against 1.15 s.

    Example:
        >>> key_counts(np.array([3, 0, 3, 1], np.uint16), 5).tolist()
        [1, 1, 0, 2, 0]
    """
    k = np.sort(key)
    edge = np.empty(k.size + 1, dtype=bool)
    edge[0] = edge[-1] = True
    np.not_equal(k[1:], k[:-1], out=edge[1:-1])
    at = np.flatnonzero(edge)
    out = np.zeros(bins, dtype=np.int64)
    out[k[at[:-1]]] = np.diff(at)
    return out


def tile_order(indptr, indices, bounds: np.ndarray) -> TileOrder:
    """The entries of a CSR matrix in tile-major order, CSR order inside a tile: a stable sort on the tile
    numbers (NumPy or CuPy arrays; ``order`` is then a device array, ``bounds`` and ``tile_starts`` are
    always host arrays).

    Example (two tiles of columns {0, 1} and {2, 3}):
        >>> t = tile_order(np.array([0, 3, 4]), np.array([0, 2, 3, 1]), np.array([0, 2, 4]))
        >>> t.order.tolist(), t.tile_starts.tolist()
        ([0, 3, 1, 2], [0, 2, 4])
    """
    xp = module(indices)
    bounds = host(bounds).astype(np.int64)
    n_tiles = bounds.size - 1
    nnz = int(indptr[-1])
    tile = tile_of(indices[:nnz], bounds)
    # Stable sort of small integers is a radix sort: linear in the entries.
    if xp is np:
        order = stable_argsort(tile)
        tile_counts = np.bincount(tile, minlength=n_tiles)
    else:  # CUB over the tile numbers' bits; the counts from the sorted numbers (an atomic count of a few
        # hundred bins contends)
        from .device_sort import argsort, key_bits
        order, tile = argsort(tile, key_bits(n_tiles - 1))
        tile_counts = host(xp.diff(xp.searchsorted(tile, xp.arange(n_tiles + 1, dtype=np.uint32))))
    del tile
    return TileOrder(bounds=bounds, order=order,
                     tile_starts=np.concatenate([[0], np.cumsum(tile_counts)]).astype(np.int64))


def tile_entries(indptr, indices, n_cols: int, bounds: np.ndarray) -> TiledEntries:
    """Regroup the entries of a CSR matrix tile-major (:func:`tile_order`) and find every tile's rows. The
    CSR arrays may be NumPy or CuPy (the per-entry and per-run results are then device arrays; ``bounds``,
    ``tile_starts`` and ``tile_runs`` are always host arrays): both give the same arrays.

    Example (two tiles of columns {0, 1} and {2, 3}):
        >>> t = tile_entries(np.array([0, 3, 4]), np.array([0, 2, 3, 1]), 4, np.array([0, 2, 4]))
        >>> t.order.tolist(), t.run_rows.tolist(), t.run_lengths.tolist(), t.tile_runs.tolist()
        ([0, 3, 1, 2], [0, 1, 0], [1, 1, 2], [0, 2, 3])
    """
    xp = module(indices)
    sorted_ = tile_order(indptr, indices, bounds)
    order, tile_starts = sorted_.order, sorted_.tile_starts
    nnz = int(tile_starts[-1])
    rows = entry_rows(indptr, order)
    # A run starts at every tile start and wherever the row changes inside a tile.
    new = xp.ones(nnz, dtype=bool)
    if nnz:
        new[1:] = rows[1:] != rows[:-1]
        inner = tile_starts[1:-1][tile_starts[1:-1] < nnz]
        new[like(new, inner)] = True
    run_starts = xp.flatnonzero(new)
    del new
    run_rows = rows[run_starts].astype(np.int64)
    del rows
    run_lengths = xp.diff(xp.concatenate([run_starts, like(run_starts, [nnz])]))
    tile_runs = host(xp.searchsorted(run_starts, like(run_starts, tile_starts))).astype(np.int64)
    return TiledEntries(bounds=sorted_.bounds, order=order, tile_starts=tile_starts, run_rows=run_rows,
                        run_lengths=run_lengths, run_starts=run_starts, tile_runs=tile_runs)


def tile_widths(l1_sectors: float, itemsize: int, n_cols: int, multiples=(1, 2, 4)) -> list[int]:
    """Tile widths to try: a quarter of the columns of x that fit the measured (effective) L1, in whole
    32-byte sectors, and its ``multiples`` (half and all of it; nested, so that one pass over the entries
    counts every tiling); widths that would make a single tile of the matrix collapse into one (no tiling).

    Example (the H100's measured 5,666 sectors of L1 for float32: about 45K columns):
        >>> tile_widths(5666, 4, 10_000_000)
        [11328, 22656, 45312]
        >>> tile_widths(5666, 4, 20_000)
        [11328, 0]
    """
    per_sector = max(32 // int(itemsize), 1)
    quarter = int(l1_sectors / 4) * per_sector
    out = []
    for k in multiples:
        w = quarter * k
        w = 0 if w >= n_cols or w <= 0 else w
        if w not in out:
            out.append(w)
    return out


# Entries a grouped build tiles at once: one group's work arrays (about 50 B an entry) stay near 13 GB.
GROUP_ENTRIES = 1 << 28
# A build on the device takes larger groups where this share of the free device memory holds their work.
DEVICE_GROUP_SHARE = 1 / 3


def device_group_entries(nnz: int, entry_bytes: int, free_bytes: int) -> int:
    """Entries a grouped build on the device tiles at once: :data:`GROUP_ENTRIES`, or up to all ``nnz`` where
    :data:`DEVICE_GROUP_SHARE` of ``free_bytes`` holds their work arrays and their part of the layout
    (``entry_bytes`` each): every further group scans the whole matrix for its entries and searches its row
    pointers again, so a GPU with the room builds in fewer groups.

    Example (600M entries of 8 B: 40 GB free keeps the default, 150 GB takes them in one group):
        >>> device_group_entries(600_000_000, 8, 40 * 10**9) == GROUP_ENTRIES
        True
        >>> device_group_entries(600_000_000, 8, 150 * 10**9)
        600000000
    """
    from .device_reorder import WORK_BYTES_PER_ENTRY
    fit = int(DEVICE_GROUP_SHARE * free_bytes) // (WORK_BYTES_PER_ENTRY + entry_bytes)
    return max(GROUP_ENTRIES, min(int(nnz), fit))


def tile_groups(col_lengths: np.ndarray, bounds: np.ndarray, group_entries: int = GROUP_ENTRIES) -> list:
    """Consecutive tiles gathered into groups of at most ``group_entries`` entries (a tile with more is a
    group of its own), as (first tile, end tile) pairs, from the columns' lengths and the tiles' column
    ``bounds``.

    Example (tiles of 5, 1, 4 and 7 entries, groups of at most 6):
        >>> tile_groups(np.array([5, 1, 2, 2, 7]), np.array([0, 1, 2, 4, 5]), 6)
        [(0, 2), (2, 3), (3, 4)]
    """
    bounds = host(bounds).astype(np.int64)
    total = np.concatenate([[0], np.cumsum(host(col_lengths), dtype=np.int64)])
    per_tile = total[bounds[1:]] - total[bounds[:-1]]
    groups, first, held = [], 0, 0
    for t, entries in enumerate(per_tile.tolist()):  # a loop over tiles (thousands), not entries
        if t > first and held + entries > group_entries:
            groups.append((first, t))
            first, held = t, 0
        held += entries
    groups.append((first, int(per_tile.size)))
    return groups


@dataclass(frozen=True, eq=False)
class TileGroup:
    """The entries of tiles ``first`` to ``end - 1`` of a CSR matrix, tiled on their own.

    Attributes:
        first, end: the group's tiles.
        indptr: the row pointers of the group's entries (as many rows as the matrix).
        cols, vals: its entries' columns (the matrix's numbering) and values (None: value-free), in CSR order.
        tiled: :func:`tile_entries` of the group (or only its :func:`tile_order`, where the runs were not
            asked for), its positions into ``cols``, its rows the matrix's.
    """

    first: int
    end: int
    indptr: object
    cols: object
    vals: object
    tiled: TileOrder


def grouped_tiles(indptr, indices, data, bounds: np.ndarray, col_lengths: np.ndarray,
                  group_entries: int | None = None, runs: bool = True):
    """The tiles of column ``bounds`` of a CSR matrix (NumPy or CuPy arrays), a group of consecutive
    tiles of at most ``group_entries`` entries (:func:`tile_groups`; default :data:`GROUP_ENTRIES` on the
    host, :func:`device_group_entries` on the device) at a time: the work arrays of a tiling (an entry's
    tile, its place in tile-major order, its row, the runs) then exist for one group's entries only. A
    tile-major layout whose parts depend on their own tile alone is the concatenation of its groups'
    layouts. One group is the matrix itself, no copy. ``runs``: each group's :func:`tile_entries`; else
    only its :func:`tile_order` (a layout that needs no runs then pays no pass over the entries for them).

    Example (tiles {0, 1} and {2, 3}, one group each):
        >>> indptr, indices = np.array([0, 3, 4]), np.array([0, 2, 3, 1])
        >>> [(g.first, g.cols.tolist(), g.tiled.order.tolist()) for g in
        ...  grouped_tiles(indptr, indices, None, np.array([0, 2, 4]), np.ones(4, int), group_entries=1)]
        [(0, [0, 1], [0, 1]), (1, [2, 3], [0, 1])]
    """
    xp = module(indices)
    bounds = host(bounds).astype(np.int64)
    n_rows, n_tiles = int(indptr.size) - 1, bounds.size - 1
    if group_entries is None:
        group_entries = GROUP_ENTRIES
        if xp is not np:
            from .device_reorder import free_bytes
            entry = 2 * indices.dtype.itemsize + (0 if data is None else data.dtype.itemsize)
            group_entries = device_group_entries(indices.size, entry, free_bytes())
    groups = tile_groups(col_lengths, bounds, group_entries)

    def tiled(ptr, cols, cuts):
        return tile_entries(ptr, cols, int(cuts[-1]), cuts) if runs else tile_order(ptr, cols, cuts)
    if len(groups) == 1:
        yield TileGroup(0, n_tiles, indptr, indices, data, tiled(indptr, indices, bounds))
        return
    for first, end in groups:
        lo, hi = int(bounds[first]), int(bounds[end])
        pos = _positions_between(indices, lo, hi)  # the group's entries, in CSR order
        # The group's row pointers: its entries before each row's first (a search of the ascending positions).
        ptr = xp.searchsorted(pos, like(pos, indptr).astype(pos.dtype), side="left").astype(np.int64)
        cols = indices[pos]
        part = tiled(ptr, cols - lo, bounds[first:end + 1] - lo)
        yield TileGroup(first, end, ptr, cols, None if data is None else data[pos], part)
        del pos, ptr, cols, part


def _positions_between(indices, lo: int, hi: int, piece: int | None = None):
    """Where ``lo <= indices < hi``, found a piece of ``piece`` entries (default :data:`GROUP_ENTRIES`) at a
    time: the comparisons' temporaries are one piece's, not billions of bytes.

    Example:
        >>> _positions_between(np.array([5, 1, 3, 2, 9, 3]), 2, 4, piece=4).tolist()
        [2, 3, 5]
    """
    xp = module(indices)
    piece = GROUP_ENTRIES if piece is None else piece
    found = [xp.flatnonzero((indices[a:a + piece] >= lo) & (indices[a:a + piece] < hi)) + a
             for a in range(0, int(indices.size), piece)]
    return xp.concatenate(found) if found else xp.zeros(0, np.int64)


def tile_runs(tiled: TiledEntries) -> RankedRuns:
    """The :class:`RankedRuns` of a tiling already made (its runs counted by tile and length; few numbers
    come back from the device).

    Example (tile 0: a run of 1 in row 0, of 1 in row 1; tile 1: a run of 2):
        >>> tile_runs(tile_entries(np.array([0, 3, 4]), np.array([0, 2, 3, 1]), 4, np.array([0, 2, 4]))).ranked(0).tolist()
        [1, 1]
    """
    xp = module(tiled.run_lengths)
    n_tiles = tiled.n_tiles
    tile = np.repeat(np.arange(n_tiles, dtype=np.int64), np.diff(tiled.tile_runs))
    span = largest(tiled.run_lengths) + 1
    keys, counts = xp.unique(like(tiled.run_lengths, tile) * span + tiled.run_lengths.astype(np.int64),
                             return_counts=True)
    return _runs_from_keys(host(keys), host(counts).astype(np.int64), span, n_tiles)


def merge_runs(parts: list) -> RankedRuns:
    """The :class:`RankedRuns` of a matrix from those of disjoint sets of its rows (the same tiles): the
    counts of each (tile, length) add up.

    Example:
        >>> a = RankedRuns(np.array([3, 1]), np.array([1, 2]), np.array([0, 1, 2]))
        >>> b = RankedRuns(np.array([1, 2]), np.array([5, 1]), np.array([0, 1, 2]))
        >>> m = merge_runs([a, b]); m.ranked(0).tolist(), m.ranked(1).tolist()
        ([3, 1, 1, 1, 1, 1], [2, 1, 1])
    """
    n_tiles = parts[0].n_tiles
    if any(p.n_tiles != n_tiles for p in parts):
        raise ValueError(f"runs of different tilings: {[p.n_tiles for p in parts]} tiles")
    span = max((int(p.lengths.max(initial=0)) for p in parts), default=0) + 1
    keys = np.concatenate([np.repeat(np.arange(n_tiles, dtype=np.int64), np.diff(p.offsets)) * span + p.lengths
                           for p in parts])
    keys, at = np.unique(keys, return_inverse=True)
    counts = np.bincount(at.ravel(), weights=np.concatenate([p.counts for p in parts]),
                         minlength=keys.size).astype(np.int64)
    return _runs_from_keys(keys, counts, span, n_tiles)


def _runs_from_keys(keys: np.ndarray, counts: np.ndarray, span: int, n_tiles: int) -> RankedRuns:
    """:class:`RankedRuns` from distinct keys tile x ``span`` + length and their counts."""
    tile, length = keys // span, keys % span
    order = np.lexsort((-length, tile))
    tile = tile[order]
    return RankedRuns(length[order].astype(np.int64), counts[order].astype(np.int64),
                      np.searchsorted(tile, np.arange(n_tiles + 1)).astype(np.int64))
