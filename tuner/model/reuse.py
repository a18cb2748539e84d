"""Gathers a block repeats: x's gathers that fall in a sector their own block fetched a moment before.

The cache model (:mod:`tuner.model.locality`) asks how often an LRU of the profile's capacity holds a sector
when sectors are requested in the matrix's proportions, in no particular order. A kernel's requests come in
order: a block walks a run of consecutive rows (or entries), and in a matrix whose neighbouring rows share
columns (a mesh, a web graph's pages of one site) many of its gathers fall in sectors it fetched a moment
before, still in L1 whatever x's size. So each gather is either a repeat of its block's earlier sector (an
L1 hit) or its block's first touch of that sector, which hits each level with the probability the cache
model gives that sector (:func:`~tuner.model.locality.sector_hits`: hot sectors stay cached, cold ones do
not). Without repeats this is the cache model's share exactly; a hot sector's repeats count once, as hits.

The blocks are those each kernel shape really launches (:func:`block_fractions`: rows per block from the
segment's lanes per row; ALIGNED_COO's blocks take runs of entries, :func:`run_fractions`), counted on an
evenly spaced sample of about ``SAMPLE_ENTRIES`` of their entries. Planning must not pass over every row
once per class of rows and kernel shape (a 100M-entry graph has 8M rows and some 60 of them): a class's
sampled rows are found through per-chunk counts of the rows at least so long (:func:`class_rows_at`, one
pass per bound), and a sample is counted once (:class:`Touches`) for every share of L1 its blocks may hold.
A relabelled view reads its sampled rows from the matrix it relabels.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..families.base import UNROLL, device_row_lengths, shared_layout
from ..formats.xp import host, module
from .locality import SECTOR_BYTES, distinct_counts
from .warps import ALIGNED_PARTS, NARROW, SegmentSpec, WarpHistogram, narrow_lengths, row_histogram, row_lengths_at

SAMPLE_ENTRIES = 1 << 14  # entries of sampled blocks per segment: the shares to a few percent
# A block of more entries than this (a degree-ordered graph's hub rows) is not counted: its distinct sectors
# far outgrow its share of L1, so its repeats would miss; it is served as the whole matrix's gathers are.
BLOCK_ENTRIES = 1 << 18


@dataclass(frozen=True)
class Touches:
    """A sample's gathers counted per block, whatever share of L1 each block holds.

    Attributes:
        distinct: each block's distinct sectors.
        repeats: its gathers of a sector it gathered before.
        every: per level (L1, then L1 or L2), each block's gathers' hit chances summed.
        firsts: per level, those of its first touch of each sector summed.
        gathers: the sample's gathers.
    """

    distinct: np.ndarray
    repeats: np.ndarray
    every: tuple
    firsts: tuple
    gathers: int

    def fractions(self, block_sectors: float = np.inf) -> np.ndarray:
        """Shares of the gathers L1, L2 and memory serve when each block holds ``block_sectors`` of L1."""
        if self.gathers == 0:
            return np.array([1.0, 0.0, 0.0])
        held = np.minimum(1.0, block_sectors / np.maximum(self.distinct, 1.0))  # a repeat's chance to find its sector
        out = [float((f + held * self.repeats + (1.0 - held) * (e - f)).sum()) for e, f in zip(self.every, self.firsts)]
        return np.array([out[0], out[1] - out[0], self.gathers - out[1]]) / self.gathers


def count_touches(block: np.ndarray, cols: np.ndarray, itemsize: int, hits: tuple) -> Touches:
    """:class:`Touches` of the gathers ``cols`` made by ``block`` (sorted by block), whose sector s hits L1
    with probability ``hits[0][s]`` and L1 or L2 with ``hits[1][s]``."""
    if cols.size == 0:
        return Touches(np.zeros(0), np.zeros(0), (), (), 0)
    sector = cols.astype(np.int64) // max(SECTOR_BYTES // int(itemsize), 1)
    span = int(sector.max()) + 1
    block = block.astype(np.int64)
    # Each (block, sector) once, with its gathers: every sum below runs over these, not the gathers.
    pairs, times = distinct_counts(block * span + sector)
    first, owner = pairs % span, pairs // span
    n = int(block.max()) + 1
    distinct = np.bincount(owner, minlength=n).astype(np.float64)
    repeats = np.bincount(owner, weights=times, minlength=n) - distinct
    chances = [h[first] for h in hits[:2]]
    every = tuple(np.bincount(owner, weights=c * times, minlength=n) for c in chances)
    firsts = tuple(np.bincount(owner, weights=c, minlength=n) for c in chances)
    return Touches(distinct, repeats, every, firsts, int(cols.size))


def touch_fractions(block: np.ndarray, cols: np.ndarray, itemsize: int, hits: tuple,
                    block_sectors: float = np.inf) -> np.ndarray:
    """Shares of the gathers ``cols`` (made by ``block``, sorted by block) that L1, L2 and memory serve.

    A gather of sector s hits L1 with probability ``hits[0][s]`` and L2 (or L1) with ``hits[1][s]``
    (:func:`~tuner.model.locality.sector_hits`), unless its block gathered from s before: such a repeat
    hits L1 as long as the block's distinct sectors fit its share of L1 (``block_sectors``), and a share
    ``block_sectors / distinct`` of the time when they do not (an LRU that holds that much of the block's
    working set); the rest are served like any other gather of s.

    Example (block 0 reads columns 0, 3 and 9: sectors 0, 0, 1; block 1 reads column 1: sector 0;
    sector 0 hits only L2, sector 1 only memory):
        >>> hits = (np.array([0.0, 0.0]), np.array([1.0, 0.0]))
        >>> args = np.array([0, 0, 0, 1]), np.array([0, 3, 9, 1]), 4, hits
        >>> touch_fractions(*args).tolist()  # the repeat of sector 0 hits L1
        [0.25, 0.5, 0.25]
        >>> touch_fractions(*args, block_sectors=1.0).tolist()  # block 0's 2 sectors, half of it held
        [0.125, 0.625, 0.25]
    """
    return count_touches(block, cols, itemsize, hits).fractions(block_sectors)


def served(touches: Touches, others: float, whole, block_sectors: float) -> np.ndarray:
    """Shares of a segment's gathers: the counted ``touches`` at their blocks' share of L1, and ``others``
    gathers served as the whole matrix's are (``whole``: its L1, L2 and memory shares)."""
    n = touches.gathers
    return (touches.fractions(block_sectors) * n + np.asarray(whole) * others) / max(n + others, 1.0)


def block_fractions(m, lo: int, hi: int | None, rows_per_block: int, hits: tuple, block_sectors: float = np.inf,
                    key=()) -> np.ndarray:
    """:func:`touch_fractions` of the rows with lo <= length < hi (hi None: no bound) when blocks take
    ``rows_per_block`` consecutive such rows in order (binned's classes and csr_vector's rows), each holding
    ``block_sectors`` of L1, on every k-th block; memoised per view under ``key`` (what ``hits`` came from).
    ``hits``: per sector, the chance to hit L1 and L1 or L2, and the whole matrix's shares, which serve the
    sampled blocks of more than ``BLOCK_ENTRIES`` entries.

    Example (a band: each row's 3 columns around the diagonal; x far larger than a cache of 1 sector, so
    only repeats hit. A block of 8 rows reads 3 sectors for 24 entries, 2 for 23 at either end):
        >>> import scipy.sparse as sp; from tuner.matrix import canonicalize
        >>> from tuner.model.locality import CacheLevel, sector_counts, sector_hits
        >>> m = canonicalize(sp.diags([1.0, 2.0, 3.0], [-1, 0, 1], shape=(64, 64), format="csr", dtype=np.float32))
        >>> hits = sector_hits(sector_counts(m.col_lengths, 4), [CacheLevel(0.0), CacheLevel(0.0)]) + ([0.0, 0.0, 1.0],)
        >>> round(float(block_fractions(m, 0, None, 8, hits)[0]), 4), round(1 - 22 / 190, 4)
        (0.8842, 0.8842)
    """
    def share():
        touches, big = shared_layout(m, ("block_touches", lo, hi, rows_per_block) + tuple(key),
                                     lambda: _sampled_blocks(m, lo, hi, rows_per_block, hits))
        return served(touches, big, hits[2], block_sectors)
    return shared_layout(m, ("block_fractions", lo, hi, rows_per_block, block_sectors) + tuple(key), share)


def _sampled_blocks(m, lo: int, hi: int | None, rows_per_block: int, hits: tuple) -> tuple[Touches, float]:
    """:func:`block_fractions`' sample counted, and the entries of the sampled blocks it leaves out."""
    size_of_class, entries = class_size(m, lo, hi)
    blocks = -(-size_of_class // rows_per_block)
    # Every k-th block, so that the sample spans the whole class (degree-ordered views put their
    # longest rows first) and holds about SAMPLE_ENTRIES entries.
    picked = np.arange(0, blocks, max(1, entries // SAMPLE_ENTRIES))
    at = (picked[:, None] * rows_per_block + np.arange(rows_per_block)).ravel()
    at = at[at < size_of_class]
    rows = class_rows_at(m, lo, hi, at)
    # Blocks numbered in the sample: their sums stay as small as the sample, whatever the class's size.
    local = np.repeat(np.arange(picked.size), rows_per_block)[:at.size]
    size = np.bincount(local, weights=row_lengths_at(m, rows), minlength=picked.size)
    big = float(size[size > BLOCK_ENTRIES].sum())
    small = (size <= BLOCK_ENTRIES)[local]
    lengths, cols = m.row_entries(rows[small])
    return count_touches(np.repeat(local[small], lengths), cols, m.value_dtype.itemsize, hits), big


# A class's k-th row is found through counts per chunk of CHUNK_ROWS rows (of the rows at least so long,
# once per view and bound: binned's and csr_vector's classes share a few bounds), so that a sample of the
# class reads only its chunks' rows, not every row once per class.
CHUNK_ROWS = 256


def rows_at_least(m, length: int) -> np.ndarray:
    """Rows of at least ``length`` entries in each chunk of ``CHUNK_ROWS`` consecutive rows; memoised per
    view and length. Counted on the uint8 lengths (:func:`~tuner.model.warps.narrow_lengths`), and above
    them on the few rows they clip.

    Example (rows of lengths 0, 1, ..., 299: the first chunk holds 256 - 100 of at least 100):
        >>> import scipy.sparse as sp; from tuner.matrix import canonicalize
        >>> m = canonicalize(sp.csr_matrix(np.tril(np.ones((300, 300), np.float32), -1)))
        >>> rows_at_least(m, 100).tolist(), rows_at_least(m, 290).tolist()
        ([156, 44], [0, 10])
    """
    def build():
        n = m.n_rows
        chunks = -(-n // CHUNK_ROWS)
        with device_row_lengths(m) as dev:
            if dev is not None:  # one pass on the GPU, only the counts per chunk come back
                # From the rows' positions, not a sum per chunk: CuPy builds a reduction over an axis as
                # a CUB kernel on first use, seconds of NVRTC on a fresh install.
                xp = module(dev)
                at = xp.flatnonzero(dev >= length)
                edges = xp.searchsorted(at, xp.arange(chunks + 1, dtype=at.dtype) * CHUNK_ROWS)
                return host(xp.diff(edges)).astype(np.int64)
        if length >= NARROW:  # beyond the uint8 lengths: count among the rows they clip
            L = m.row_lengths
            clipped = shared_layout(m, ("rows_clipped",), lambda: np.flatnonzero(narrow_lengths(m) == NARROW))
            return np.bincount(clipped // CHUNK_ROWS, weights=L[clipped] >= length, minlength=chunks).astype(np.int64)
        L8 = narrow_lengths(m)
        whole = n - n % CHUNK_ROWS
        at_least = (L8 >= length).view(np.uint8)
        # Summed in uint16 (a chunk's count fits): a third of the time of int64 sums.
        counts = at_least[:whole].reshape(-1, CHUNK_ROWS).sum(axis=1, dtype=np.uint16).astype(np.int64)
        return np.append(counts, at_least[whole:].sum(dtype=np.int64)) if whole < n else counts
    return shared_layout(m, ("rows_at_least", int(length)), build)


def class_size(m, lo: int, hi: int | None) -> tuple[int, int]:
    """Rows and entries of the rows with lo <= length < hi, from the row-length histogram (its running sums,
    once per view: the planner asks for a class's size once per kernel shape that samples it)."""
    rows, entries = shared_layout(m, ("row_histogram_running",), lambda: tuple(
        np.concatenate([[0.0], np.cumsum(h)]) for h in row_histogram(m)))
    bottom, top = max(lo, 0), rows.size - 1 if hi is None else min(hi, rows.size - 1)
    if top <= bottom:
        return 0, 0
    return int(rows[top] - rows[bottom]), int(entries[top] - entries[bottom])


def class_rows_at(m, lo: int, hi: int | None, positions: np.ndarray) -> np.ndarray:
    """The rows at ``positions`` (ascending) among those with lo <= length < hi, counted in row order:
    each position's chunk from :func:`rows_at_least`, then only those chunks' rows are read, so that a
    sample of a class costs its chunks, not a pass over every row.

    Example (rows of lengths 0, 1, ..., 9: those of 3 to 7 are rows 3 to 7):
        >>> import scipy.sparse as sp; from tuner.matrix import canonicalize
        >>> m = canonicalize(sp.csr_matrix(np.tril(np.ones((10, 10), np.float32), -1)))
        >>> class_rows_at(m, 3, 8, np.array([0, 2, 4])).tolist()
        [3, 5, 7]
    """
    positions = np.asarray(positions, dtype=np.int64)
    if lo <= 0 and hi is None:
        return positions
    per_chunk, through = shared_layout(m, ("class_chunks", int(lo), hi), lambda: _running(
        rows_at_least(m, lo) - (0 if hi is None else rows_at_least(m, hi))))  # the class's samples share them
    chunks = distinct_counts(np.searchsorted(through, positions, side="right"))[0]
    rows = chunks[:, None] * CHUNK_ROWS + np.arange(CHUNK_ROWS)
    length = row_lengths_at(m, np.minimum(rows, m.n_rows - 1))
    inside = (rows < m.n_rows) & (length >= lo) & ((length < hi) if hi is not None else True)
    # A member's position: the class's rows before its chunk, then its rank among its chunk's members.
    position = (through[chunks] - per_chunk[chunks])[:, None] + np.cumsum(inside, axis=1) - 1
    inside = inside.ravel()  # compress, not a boolean index: a quarter of its time
    return np.compress(inside, rows)[np.searchsorted(np.compress(inside, position), positions)]


def _running(per_chunk: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return per_chunk, np.cumsum(per_chunk)


def run_fractions(m, entries_per_block: int, hits: tuple, block_sectors: float = np.inf, key=()) -> np.ndarray:
    """:func:`block_fractions` for blocks that take runs of ``entries_per_block`` consecutive entries of
    the whole matrix, row after row (ALIGNED_COO's parts: lanes of seg_len slots, warps of 32-entry chunks).
    Runs longer than ``SAMPLE_ENTRIES``, and runs that touch a row longer than themselves, are served as
    the whole matrix's gathers (``hits[2]``).

    Example (the band of :func:`block_fractions`: runs of 24 entries are about 8 of its rows):
        >>> import scipy.sparse as sp; from tuner.matrix import canonicalize
        >>> from tuner.model.locality import CacheLevel, sector_counts, sector_hits
        >>> m = canonicalize(sp.diags([1.0, 2.0, 3.0], [-1, 0, 1], shape=(64, 64), format="csr", dtype=np.float32))
        >>> hits = sector_hits(sector_counts(m.col_lengths, 4), [CacheLevel(0.0), CacheLevel(0.0)]) + ([0.0, 0.0, 1.0],)
        >>> round(float(run_fractions(m, 24, hits)[0]), 3), run_fractions(m, 1, hits).tolist()
        (0.921, [0.0, 0.0, 1.0])
    """
    if entries_per_block > SAMPLE_ENTRIES:  # a run longer than the sample (long seg lanes): not counted
        return np.asarray(hits[2], dtype=np.float64)
    def share():
        touches, skipped = shared_layout(m, ("run_touches", entries_per_block) + tuple(key),
                                         lambda: _sampled_runs(m, entries_per_block, hits))
        return served(touches, skipped, hits[2], block_sectors)
    return shared_layout(m, ("run_fractions", entries_per_block, block_sectors) + tuple(key), share)


def _sampled_runs(m, entries_per_block: int, hits: tuple) -> tuple[Touches, float]:
    """:func:`run_fractions`' sample counted, and the entries of the sampled runs it leaves out."""
    ends = row_ends(m)
    total = int(ends[-1]) if ends.size else 0
    runs = -(-total // entries_per_block)
    picked = np.arange(0, runs, max(1, total // SAMPLE_ENTRIES)) * entries_per_block
    # In the ends' own type: searching an int32 indptr for int64 values would copy all of it.
    first = np.searchsorted(ends, picked.astype(ends.dtype), side="right")  # the row each run starts in
    last = np.searchsorted(ends, (np.minimum(picked + entries_per_block, total) - 1).astype(ends.dtype),
                           side="right")
    span = last - first + 1
    rows = np.repeat(first, span) + np.arange(int(span.sum())) - np.repeat(np.cumsum(span) - span, span)
    # A run that touches a row longer than itself (a hub's) is served as the whole matrix's gathers:
    # reading such rows whole would cost more than the rest of the sample, and a relabelled view's
    # rows are sorted only once built.
    owner = np.repeat(np.arange(picked.size), span)
    big = np.bincount(owner, weights=row_lengths_at(m, rows) > entries_per_block, minlength=picked.size) > 0
    take = ~big[owner]
    rows = rows[take]
    lengths, cols = m.row_entries(rows)
    # Each entry's place in the whole matrix, and the run it was sampled for.
    position = (np.repeat(ends[rows] - lengths, lengths) + np.arange(int(lengths.sum()))
                - np.repeat(np.cumsum(lengths) - lengths, lengths))
    run = np.repeat(owner[take], lengths)
    keep = (position >= picked[run]) & (position < picked[run] + entries_per_block)
    skipped = float(np.minimum(picked[big] + entries_per_block, total).sum() - picked[big].sum())
    return count_touches(run[keep], cols[keep], m.value_dtype.itemsize, hits), skipped


def row_ends(m) -> np.ndarray:
    """Where each row's entries end: the CSR row pointers past the first, or for a lengths-only view their
    running sum, once.

    Example:
        >>> import scipy.sparse as sp; from tuner.matrix import canonicalize
        >>> row_ends(canonicalize(sp.csr_matrix(np.tril(np.ones((3, 3), np.float32))))).tolist()
        [1, 3, 6]
    """
    indptr = getattr(m, "indptr", None)
    if indptr is not None:
        return indptr[1:]
    return shared_layout(m, ("row_ends",), lambda: np.cumsum(m.row_lengths))


def segment_fractions(m, s: SegmentSpec, warps: WarpHistogram, hits: tuple, block_sectors: float = np.inf,
                      key=()) -> np.ndarray | None:
    """Gather shares of the blocks of the warp segment ``s`` (``warps``: its histogram; the seg part's
    lanes hold ``warps.w`` slots each), each block holding ``block_sectors`` of L1; None for a tiled
    family's part, whose shares are its tiles'.

    Example: see tests/test_reuse.py.
    """
    if s.group in ALIGNED_PARTS:
        per_thread = int(warps.w.max()) if s.group == "seg" and warps.w.size else UNROLL
        return run_fractions(m, s.block * per_thread, hits, block_sectors, key)
    if s.group == "block":
        return block_fractions(m, s.lo, s.hi, 1, hits, block_sectors, key)
    if isinstance(s.group, (int, np.integer)):
        return block_fractions(m, s.lo, s.hi, max(s.block // int(s.group), 1), hits, block_sectors, key)
    return None
