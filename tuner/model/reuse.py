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
evenly spaced sample of about ``SAMPLE_ENTRIES`` of their entries, so that a 100M-entry matrix costs
milliseconds. A relabelled view reads its sampled rows from the matrix it relabels.
"""
from __future__ import annotations

import numpy as np

from ..families.base import UNROLL, shared_layout
from .locality import SECTOR_BYTES
from .warps import ALIGNED_PARTS, SegmentSpec, WarpHistogram, row_histogram

SAMPLE_ENTRIES = 1 << 14  # entries of sampled blocks per segment: the shares to a few percent
# A block of more entries than this (a degree-ordered graph's hub rows) is not counted: its distinct sectors
# far outgrow its share of L1, so its repeats would miss; it is served as the whole matrix's gathers are.
BLOCK_ENTRIES = 1 << 18


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
    if cols.size == 0:
        return np.array([1.0, 0.0, 0.0])
    sector = cols.astype(np.int64) // max(SECTOR_BYTES // int(itemsize), 1)
    span = int(sector.max()) + 1
    block = block.astype(np.int64)
    pairs = np.unique(block * span + sector)
    first, owner = pairs % span, pairs // span
    n = int(block.max()) + 1
    distinct = np.bincount(owner, minlength=n).astype(np.float64)
    repeats = np.bincount(block, minlength=n) - distinct
    held = np.minimum(1.0, block_sectors / np.maximum(distinct, 1.0))  # a repeat's chance to find its sector
    out = []
    for h in hits[:2]:  # L1, then L1 or L2
        every = np.bincount(block, weights=h[sector], minlength=n)
        firsts = np.bincount(owner, weights=h[first], minlength=n)
        out.append(float((firsts + held * repeats + (1.0 - held) * (every - firsts)).sum()))
    return np.array([out[0], out[1] - out[0], cols.size - out[1]]) / cols.size


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
    def build():
        L = m.row_lengths
        rows = class_rows(m, lo, hi)
        entries = class_entries(m, lo, hi)
        blocks = -(-rows.size // rows_per_block)
        # Every k-th block, so that the sample spans the whole class (degree-ordered views put their
        # longest rows first) and holds about SAMPLE_ENTRIES entries.
        picked = np.arange(0, blocks, max(1, entries // SAMPLE_ENTRIES))
        at = (picked[:, None] * rows_per_block + np.arange(rows_per_block)).ravel()
        at = at[at < rows.size]
        size = np.bincount(at // rows_per_block, weights=L[rows[at]])[picked]
        big = float(size[size > BLOCK_ENTRIES].sum())
        at = at[np.isin(at // rows_per_block, picked[size <= BLOCK_ENTRIES])]
        lengths, cols = m.row_entries(rows[at])
        local = np.searchsorted(picked, at // rows_per_block)  # blocks numbered in the sample
        counted = touch_fractions(np.repeat(local, lengths), cols, m.value_dtype.itemsize, hits, block_sectors)
        return (counted * cols.size + np.asarray(hits[2]) * big) / max(cols.size + big, 1.0)
    return shared_layout(m, ("block_fractions", lo, hi, rows_per_block, block_sectors) + tuple(key), build)


def class_rows(m, lo: int, hi: int | None) -> np.ndarray:
    """The rows with lo <= length < hi, in order; memoised per view (candidates share classes)."""
    def build():
        L = m.row_lengths
        if lo <= 0 and hi is None:
            return np.arange(L.size)
        return np.flatnonzero((L >= lo) if hi is None else (L >= lo) & (L < hi))
    return shared_layout(m, ("class_rows", lo, hi), build)


def class_entries(m, lo: int, hi: int | None) -> int:
    """Entries of the rows with lo <= length < hi, from the row-length histogram."""
    count, entries = row_histogram(m)
    top = entries.size if hi is None else min(hi, entries.size)
    return int(entries[max(lo, 0):top].sum())


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
    def build():
        if entries_per_block > SAMPLE_ENTRIES:  # a run longer than the sample (long seg lanes): not counted
            return np.asarray(hits[2], dtype=np.float64)
        L = m.row_lengths
        ends = np.cumsum(L)
        total = int(ends[-1]) if ends.size else 0
        runs = -(-total // entries_per_block)
        picked = np.arange(0, runs, max(1, total // SAMPLE_ENTRIES)) * entries_per_block
        first = np.searchsorted(ends, picked, side="right")  # the row each run starts in
        last = np.searchsorted(ends, np.minimum(picked + entries_per_block, total) - 1, side="right")
        span = last - first + 1
        rows = np.repeat(first, span) + np.arange(int(span.sum())) - np.repeat(np.cumsum(span) - span, span)
        # A run that touches a row longer than itself (a hub's) is served as the whole matrix's gathers:
        # reading such rows whole would cost more than the rest of the sample, and a relabelled view's
        # rows are sorted only once built.
        owner = np.repeat(np.arange(picked.size), span)
        big = np.bincount(owner, weights=L[rows] > entries_per_block, minlength=picked.size) > 0
        take = ~big[owner]
        rows = rows[take]
        lengths, cols = m.row_entries(rows)
        # Each entry's place in the whole matrix, and the run it was sampled for.
        position = (np.repeat(ends[rows] - L[rows], lengths) + np.arange(int(lengths.sum()))
                    - np.repeat(np.cumsum(lengths) - lengths, lengths))
        run = np.repeat(owner[take], lengths)
        keep = (position >= picked[run]) & (position < picked[run] + entries_per_block)
        counted = touch_fractions(run[keep], cols[keep], m.value_dtype.itemsize, hits, block_sectors)
        skipped = float(np.minimum(picked[big] + entries_per_block, total).sum() - picked[big].sum())
        n = int(keep.sum())
        return (counted * n + np.asarray(hits[2]) * skipped) / max(n + skipped, 1.0)
    return shared_layout(m, ("run_fractions", entries_per_block, block_sectors) + tuple(key), build)


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
