"""The model's view of a kernel: its warps, each with a workload and a table to look up.

Paper 003 models a kernel as rectangular workloads (w columns x h rows), one per warp. Our kernels give
each row a group of G lanes, so a warp holds 32/G rows: it is looked up in the table by its longest row
(its groups run in lockstep, so that sets its shape) and charged the entries it really streams (lanes of
shorter rows idle and load nothing); a row handled by a whole block is split over the block's warps.

The model only ever sums functions of a warp's shape over warps, so a segment keeps, per distinct shape w,
how many warps have it and how many entries they stream together: a histogram of the warps. Rows that
are warps by themselves (32 lanes, or a block, per row) come straight from one histogram of row lengths;
only groups of several rows per warp need a pass over the rows.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from ..families.aligned_coo import AlignedCooParams
from ..families.base import device_row_lengths, known_layout, longest_row, shared_layout
from ..families.binned import BinnedParams
from ..families.csr_vector import CsrVectorParams
from ..families.tile_composite import TileCompositeParams
from ..families.tile_coo import TileCooParams
from ..families.tiles import bounds
from ..formats.aligned_coo import sizes, split_lengths
from ..formats.reorder import Structure
from ..formats.xp import host, largest, module, on_device, tally
from ..matrix import CanonicalMatrix
from ..workers import pool as thread_pool
from .profile_data import kernel_key

WARP = 32


@dataclass(frozen=True)
class WarpHistogram:
    """Warps of one launch segment grouped by shape.

    Attributes:
        w: distinct row lengths the warps are looked up with (their longest row; a block row's length).
        count: warps of each shape.
        size: entries those warps stream, summed.
        rounds: for warps that repeat their profiled shape several times in turn (a TILE-Composite
            workload of h rows), the repeats summed per shape and their maximum; None: once each.
    """

    w: np.ndarray
    count: np.ndarray
    size: np.ndarray
    rounds: tuple[np.ndarray, np.ndarray] | None = None

    @classmethod
    def of_warps(cls, w: np.ndarray, size: np.ndarray, rounds: np.ndarray | None = None,
                 count: np.ndarray | None = None) -> "WarpHistogram":
        """Group per-warp shapes, sizes and (optionally) repeats of the shape; with ``count``, each entry
        stands for that many warps of its shape, size and rounds.

        Example:
            >>> h = WarpHistogram.of_warps(np.array([4, 4, 9]), np.array([8, 4, 9]), rounds=np.array([2, 1, 1]))
            >>> h.w.tolist(), h.count.tolist(), h.size.tolist(), [r.tolist() for r in h.rounds]
            ([4, 9], [2.0, 1.0], [12.0, 9.0], [[3.0, 1.0], [2.0, 1.0]])
        """
        if on_device(w):  # device passes (:func:`device_row_lengths`): the bincounts there, the histogram here
            if rounds is not None or count is not None:
                w, size, rounds, count = (None if a is None else host(a) for a in (w, size, rounds, count))
            else:
                n = largest(w) + 1
                warps, total = host(tally(w, n)), host(tally(w, n, size))
                keep = np.flatnonzero(warps)
                return cls(keep, warps[keep], total[keep]) if keep.size else EMPTY
        w = np.asarray(w, dtype=np.int64)
        if w.size == 0:
            return EMPTY
        each = None if count is None else np.asarray(count, dtype=np.float64)
        warps = np.bincount(w).astype(np.float64) if each is None else np.bincount(w, weights=each)
        total = np.bincount(w, weights=size if each is None else each * np.asarray(size, dtype=np.float64))
        keep = np.flatnonzero(warps)
        reps = None
        if rounds is not None:
            rounds = np.asarray(rounds, dtype=np.float64)
            most = np.zeros(warps.size)
            live = slice(None) if each is None else each > 0
            np.maximum.at(most, w[live], rounds[live])
            reps = (np.bincount(w, weights=rounds if each is None else each * rounds)[keep], most[keep])
        return cls(keep, warps[keep], total[keep], reps)

    @property
    def warps(self) -> int:
        return int(self.count.sum())

    def expand(self) -> tuple[np.ndarray, np.ndarray]:
        """Per-warp (w, size) with each shape's entries spread evenly over its warps (for tests, eq. 1-5)."""
        reps = self.count.astype(np.int64)
        return np.repeat(self.w, reps).astype(np.float64), np.repeat(self.size / np.maximum(self.count, 1), reps)


EMPTY = WarpHistogram(np.zeros(0, np.int64), np.zeros(0), np.zeros(0))


@dataclass(frozen=True)
class SegmentSpec:
    """Which rows one launch segment covers and how it maps them to warps.

    Attributes:
        lo, hi: rows with lo <= length < hi (hi None: no upper bound).
        group: lanes per row (1..32), 'block' for a row per block, or an ALIGNED_COO part: 'seg' (a lane
            per thread), 'flat' (COO warps that may cross rows) or 'hflat' (the hybrid's one-row warps).
        block: threads per block.
        layout: the ALIGNED_COO layout the part belongs to ('' for row-wise kernels).
        tile: for a tiled family's part (group 'tile_flat', 'tile_row' or 'tile_col'): (tile width, workload
            sizes or (), tile number).
        cols: the columns (first, end) the segment's warps gather from (None: all of them).
    """

    lo: int
    hi: int | None
    group: object
    block: int
    layout: str = ""
    tile: tuple = ()
    cols: tuple | None = None

    @property
    def ident(self) -> tuple:
        # Block size matters to the warps only for block rows: other shapes share one histogram.
        return (self.lo, self.hi, self.group, self.block if self.group == "block" else 0, self.layout, self.tile,
                self.cols)


@dataclass(frozen=True)
class WarpSegment:
    """Consecutive warps of one launch that share a table: ``key``, their histogram ``warps`` and the
    segment ``spec`` that launches them."""

    key: str
    warps: WarpHistogram
    spec: SegmentSpec | None = None

    @property
    def ident(self) -> tuple:
        return self.spec.ident if self.spec is not None else ()

    @property
    def cols(self) -> tuple | None:
        return self.spec.cols if self.spec is not None else None


def row_histogram(m: CanonicalMatrix) -> tuple[np.ndarray, np.ndarray]:
    """(rows of each length, entries in them), indexed by length; one bincount per matrix (on the GPU where
    :func:`device_row_lengths` has the lengths)."""
    def build():
        with device_row_lengths(m) as dev:
            count = np.bincount(m.row_lengths) if dev is None else host(tally(dev, longest_row(m) + 1))
        count = count.astype(np.float64)
        return count, count * np.arange(count.size)
    return shared_layout(m, ("row_histogram",), build)


def group_histograms(lengths: np.ndarray, groups=None) -> dict[int, WarpHistogram]:
    """Warps of G-lane groups over rows of ``lengths`` in order, for every G of 16, 8, ..., 1 (or those in
    ``groups``): 32/G rows per warp, shaped by the longest. One pass per halving: the longest and total of
    each 2k consecutive rows come from those of each k (the rows padded with empty ones to whole warps,
    which are then cut). Lengths of uint8 (:func:`class_lengths` of short rows) stay narrow: their totals
    over 32 rows fit uint16, and the passes move an eighth of the memory (others int32 where they fit).

    Example:
        >>> h = group_histograms(np.array([1, 5, 2, 2, 7]))[16]
        >>> h.w.tolist(), h.count.tolist(), h.size.tolist()
        ([2, 5, 7], [1.0, 1.0, 1.0], [4.0, 6.0, 7.0])
        >>> sorted(group_histograms(np.array([1, 5, 2], np.uint8), groups=(1,)))
        [1]
    """
    wanted = {WARP >> k for k in range(1, 6)} if groups is None else set(groups)
    n = lengths.size
    if n == 0:
        return {g: EMPTY for g in wanted}
    xp = module(lengths)  # NumPy, or CuPy for device lengths (the histograms come back to the host)
    # The narrowest types that hold a warp's longest row and its total: half or an eighth of the memory.
    if lengths.dtype == np.uint8:
        kinds = np.uint8, np.uint16
    elif largest(lengths) < (1 << 31) // WARP:
        kinds = np.int32, np.int32
    else:
        kinds = np.int64, np.int64
    most = xp.zeros(-(-n // WARP) * WARP, dtype=kinds[0])
    most[:n] = lengths
    total = most.astype(kinds[1])
    out = {}
    rows_per_warp = 1
    while rows_per_warp < WARP and len(out) < len(wanted):
        most = xp.maximum(most[0::2], most[1::2])
        total = total[0::2] + total[1::2]
        rows_per_warp *= 2
        if WARP // rows_per_warp in wanted:
            warps = -(-n // rows_per_warp)
            out[WARP // rows_per_warp] = WarpHistogram.of_warps(most[:warps], total[:warps])
    return out


def descending_group_histograms(count: np.ndarray, groups) -> dict[int, WarpHistogram]:
    """:func:`group_histograms` of rows sorted by decreasing length, given as ``count[v]`` rows of length v:
    straight from those counts, with no pass over the rows. Warp k holds rows k*R to k*R + R - 1 (R = 32/G),
    so it is as wide as its first row; the warps that start in one run of equal lengths share its width,
    and their entries are a difference of the rows' running total.

    Example (rows of 7, 5, 2, 2, 1 sorted: the example of :func:`group_histograms` reordered):
        >>> h = descending_group_histograms(np.array([0, 1, 2, 0, 0, 1, 0, 1]), (16,))[16]
        >>> h.w.tolist(), h.count.tolist(), h.size.tolist()
        ([1, 2, 7], [1.0, 1.0, 1.0], [1.0, 4.0, 12.0])
    """
    lengths = np.flatnonzero(count)[::-1]
    rows = np.asarray(count)[lengths].astype(np.int64)
    end = np.cumsum(rows)
    start = end - rows
    total = np.concatenate([[0], np.cumsum(rows * lengths)])  # entries of the rows before each run
    n = int(end[-1]) if end.size else 0

    def entries(r):  # entries of the first r rows
        j = np.maximum(np.searchsorted(start, r, side="right") - 1, 0)
        return total[j] + (r - start[j]) * lengths[j]
    out = {}
    for g in groups:
        per = WARP // g
        first, stop = -(-start // per), -(-end // per)  # warps that start in each run: first .. stop - 1
        has = np.flatnonzero(stop > first)
        size = entries(np.minimum(stop[has] * per, n)) - entries(first[has] * per)
        w, warps = lengths[has][::-1], (stop - first)[has][::-1]
        out[g] = WarpHistogram(w, warps.astype(np.float64), size[::-1].astype(np.float64)) if w.size else EMPTY
    return out


def per_row_histogram(m: CanonicalMatrix, lo: int, hi: int | None, warps_per_row: int) -> WarpHistogram:
    """Warps of rows that fill whole warps (32 lanes, or a block of ``warps_per_row`` warps) per row.

    Example:
        >>> import scipy.sparse as sp; from tuner.matrix import canonicalize
        >>> m = canonicalize(sp.csr_matrix(np.tril(np.ones((5, 5), np.float32))))
        >>> h = per_row_histogram(m, 2, None, warps_per_row=2)
        >>> h.w.tolist(), h.count.tolist(), h.size.tolist()
        ([2, 3, 4, 5], [2.0, 2.0, 2.0, 2.0], [2.0, 4.0, 4.0, 6.0])
    """
    count, _ = row_histogram(m)
    top = count.size if hi is None else min(hi, count.size)
    lo = max(lo, 0)
    if lo >= top:
        return EMPTY
    w = np.arange(lo, top)
    keep = np.flatnonzero(count[lo:top])
    w, rows = w[keep], count[lo:top][keep]
    # Each row's warps stream ceil(w / warps_per_row) entries each (the last lanes of a block idle).
    return WarpHistogram(w, rows * warps_per_row, rows * warps_per_row * np.ceil(w / warps_per_row))


NARROW = 255  # classes of rows shorter than this keep their lengths in uint8 (longer rows clip to 255)


def narrow_lengths(m: CanonicalMatrix) -> np.ndarray:
    """Row lengths clipped to ``NARROW`` in uint8, once per view: passes over the short rows' classes read
    an eighth of the memory.

    Example:
        >>> import scipy.sparse as sp; from tuner.matrix import canonicalize
        >>> narrow_lengths(canonicalize(sp.csr_matrix(np.ones((2, 300), np.float32)))).tolist()
        [255, 255]
    """
    return shared_layout(m, ("row_lengths_u8",), lambda: np.minimum(  # straight into uint8: no int64 copy
        m.row_lengths, NARROW, out=np.empty(m.n_rows, np.uint8), casting="unsafe"))


def class_lengths(m: CanonicalMatrix, lo: int, hi: int | None, within: tuple | None = None) -> np.ndarray:
    """Lengths of the rows with lo <= length < hi, in row order (the order the kernels visit them); uint8
    when hi <= 255. Rows sorted by decreasing length (a degree-ordered view) give a slice. ``within``:
    (lo', hi', lengths) of a class that contains this one, whose rows are filtered instead of all rows.

    Example:
        >>> import scipy.sparse as sp; from tuner.matrix import canonicalize
        >>> m = canonicalize(sp.csr_matrix(np.tril(np.ones((6, 6), np.float32))))
        >>> class_lengths(m, 2, 5).tolist(), class_lengths(m, 2, 5).dtype.name
        ([2, 3, 4], 'uint8')
        >>> class_lengths(m, 3, 4, within=(2, 5, class_lengths(m, 2, 5))).tolist()
        [3]
    """
    L = m.row_lengths
    if within is not None:
        outer_lo, outer_hi, rows = within
        if outer_lo > lo or (hi is None and outer_hi is not None) or (outer_hi is not None and outer_hi < hi):
            raise ValueError(f"rows of lengths {outer_lo}..{outer_hi} do not hold the class {lo}..{hi}")
        keep = rows >= lo if lo > outer_lo else None
        if hi is not None and hi != outer_hi:
            keep = rows < hi if keep is None else keep & (rows < hi)
        return rows if keep is None else np.compress(keep, rows)
    if lo <= 0 and hi is None:
        return L
    narrow = hi is not None and hi <= NARROW
    if rows_descending(m):
        rising = L[::-1]  # a view: counting rows of at least v is a binary search
        first = 0 if hi is None else L.size - int(np.searchsorted(rising, hi, "left"))
        end = L.size - int(np.searchsorted(rising, lo, "left"))
        part = L[first:end]
        return part.astype(np.uint8) if narrow else part
    # np.compress, not a boolean index: a quarter of its time over millions of rows.
    if narrow:
        L8 = narrow_lengths(m)
        return np.compress((L8 >= lo) & (L8 < hi) if lo > 0 else L8 < hi, L8)
    return np.compress(L >= lo if hi is None else (L >= lo) & (L < hi), L)


def outer_classes(classes) -> dict[tuple, tuple]:
    """For each class of rows (lo, hi) of short rows (hi <= 255), the widest other such class that holds
    it: its rows are filtered from that class's rows (a fraction of all rows) in the same order. The
    widest is itself held by none, so classes nest at most one deep.

    Example (binned's medium classes: 4..96 holds 4..16 and 8..32; the class of all rows is not short):
        >>> outer_classes([(4, 16), (4, 96), (8, 32), (0, 8), (0, None)])
        {(4, 16): (4, 96), (8, 32): (4, 96)}
    """
    narrow = [c for c in classes if c[1] is not None and c[1] <= NARROW]
    out = {}
    for c in narrow:
        holders = [p for p in narrow if p != c and p[0] <= c[0] and c[1] <= p[1]]
        if holders:
            out[c] = max(holders, key=lambda p: (p[1] - p[0], p))
    return out


def seg_histogram(row_lengths: np.ndarray, layout: str, counts: np.ndarray | None = None) -> WarpHistogram:
    """ALIGNED_COO's seg part: every lane holds seg_len slots, so its warps all have that one shape.
    ``counts``: rows of each of ``row_lengths`` (one each when None).

    Example (paper 004's Fig. 2: 4 lanes of 3 slots make one warp streaming 10 entries):
        >>> h = seg_histogram(np.array([3, 1, 2, 2, 1, 1]), "hybrid")
        >>> h.w.tolist(), h.count.tolist(), h.size.tolist()
        ([3], [1.0], [10.0])
    """
    g = sizes(row_lengths, layout, counts)
    if g.lanes == 0:
        return EMPTY
    return WarpHistogram(np.array([g.seg_len]), np.array([float(-(-g.lanes // WARP))]), np.array([float(g.n_seg)]))


def flat_histogram(row_lengths: np.ndarray, layout: str, counts: np.ndarray | None = None) -> WarpHistogram:
    """ALIGNED_COO's flat part: 32 entries per warp, looked up by the flat length F of the row they come
    from (the profile measures rows of one length); a row contributes F / 32 warps. ``counts``: rows of
    each of ``row_lengths`` (one each when None).

    Example:
        >>> h = flat_histogram(np.array([70, 5, 64, 64]), "hybrid")
        >>> h.w.tolist(), h.count.tolist(), h.size.tolist()
        ([64], [6.0], [192.0])
    """
    flat, _ = split_lengths(row_lengths, layout)
    rows = np.bincount(flat, weights=counts).astype(np.float64)
    w = np.flatnonzero(rows[1:]) + 1
    if w.size == 0:
        return EMPTY
    return WarpHistogram(w, rows[w] * w / WARP, rows[w] * w)


# ALIGNED_COO parts by their ``group`` name: (row lengths, layout) -> histogram.
ALIGNED_PARTS = {"seg": seg_histogram, "flat": flat_histogram, "hflat": flat_histogram}


# The tiled families' parts: every tile a segment of its own, summed for all tiles at once by
# tuner.model.tiled rather than histogrammed here one tile at a time.
TILE_PARTS = ("tile_flat", "tile_row", "tile_col")


def histogram(m: CanonicalMatrix, s: SegmentSpec) -> WarpHistogram:
    """The warps of one segment of ``m`` (memoised per matrix: candidates share segments)."""
    if s.group in TILE_PARTS:
        raise ValueError(f"{s.group!r} is a tiled family's part: its tiles are summed all at once "
                         "(tuner.model.tiled), not histogrammed one by one")

    def build():
        if s.group in ALIGNED_PARTS:  # the parts' geometry depends on the rows' lengths, not their order
            count, _ = row_histogram(m)
            lengths = np.flatnonzero(count)
            return ALIGNED_PARTS[s.group](lengths, s.layout, count[lengths].astype(np.int64))
        if s.group == "block":
            return per_row_histogram(m, s.lo, s.hi, s.block // WARP)
        if s.group == WARP:
            return per_row_histogram(m, s.lo, s.hi, 1)
        # Lane groups of several rows per warp: see class_groups.
        return shared_layout(m, _group_key(s.lo, s.hi, s.group),
                             lambda: lane_groups(m, s.lo, s.hi, (s.group,))[s.group])
    return shared_layout(m, ("warps",) + s.ident, build)


def _group_key(lo: int, hi: int | None, group: int) -> tuple:
    return ("group_warps", lo, hi, group)


def class_groups(m: CanonicalMatrix, segments: list[SegmentSpec], rows=None) -> None:
    """Build the histograms of lane groups of several rows per warp of one class of rows (``segments``
    share lo and hi) in one pass of halvings over its rows: binned's medium classes come with several.
    ``rows``: a callable giving the class's lengths in row order (:func:`class_lengths` of an outer class),
    else :func:`lane_groups` finds them."""
    lo, hi = segments[0].lo, segments[0].hi
    missing = sorted({s.group for s in segments if known_layout(m, _group_key(lo, hi, s.group)) is None})
    if missing:
        built = group_histograms(rows(), missing) if rows is not None else lane_groups(m, lo, hi, missing)
        for g, h in built.items():
            shared_layout(m, _group_key(lo, hi, g), lambda h=h: h)


def lane_groups(m: CanonicalMatrix, lo: int, hi: int | None, groups) -> dict[int, WarpHistogram]:
    """:func:`group_histograms` of the rows with lo <= length < hi for the lane groups ``groups``: from the
    row-length histogram when the rows are sorted by decreasing length (a degree-ordered view), else by a
    pass over the class's rows in order, or, for a class of short rows (hi <= ``NARROW``) of a large matrix,
    over its :func:`row_sample`'s, scaled to the class's rows. Classes open to long rows are always counted
    whole: a warp takes its longest row's time, and the few hubs of a power-law graph, which a sample holds
    or misses by chance, would swing the estimate by tens of percent."""
    if rows_descending(m):
        count, _ = row_histogram(m)
        top = count.size if hi is None else min(hi, count.size)
        part = np.zeros(max(top, 0))
        part[max(lo, 0):top] = count[max(lo, 0):top]
        return descending_group_histograms(part, groups)
    sample = row_sample(m) if hi is not None and hi <= NARROW else None
    if sample is not None:
        share = class_rows(sample, lo, hi)
        if share:  # a class the sample misses (a few rows of some rare length) is counted whole
            scale = class_rows(m, lo, hi) / share
            return {g: scaled(h, scale) for g, h in group_histograms(class_lengths(sample, lo, hi), groups).items()}
    with device_row_lengths(m) as dev:
        if dev is not None:  # every row of the class, in order, filtered and grouped on the GPU
            keep = None if lo <= 0 else dev >= lo
            if hi is not None:
                keep = dev < hi if keep is None else keep & (dev < hi)
            return group_histograms(dev if keep is None else dev[keep], groups)
    return group_histograms(class_lengths(m, lo, hi), groups)


# Beyond SAMPLE_ROWS rows in no particular order, the lane groups of short-row classes are counted on a
# sample: SAMPLE_RUNS runs of consecutive rows at evenly spaced starts, SAMPLE_ROWS in all. A warp's shape
# depends only on the rows beside it, so runs of thousands of rows keep the whole matrix's mix of
# neighbours, and their spread covers regions that differ (a crawl's sites, a generator's blocks); each
# class's warps are scaled by its rows in the whole matrix over those in the sample (both exact, from the
# row-length histograms). Short rows are common, so two million rows hold each class's shapes many times
# over, where a pass over every row of a 30M-row graph costs tenths of a second per class.
SAMPLE_ROWS = 1 << 21
SAMPLE_RUNS = 256


def row_sample(m: CanonicalMatrix):
    """The lengths-only view of :data:`SAMPLE_RUNS` evenly spaced runs of ``m``'s rows (:data:`SAMPLE_ROWS`
    rows), once per matrix; None where every row is counted (no more rows than that, or rows sorted by
    length, whose histograms come from the length counts).

    Example (a sample of 4 runs of 2 rows from 20 rows of lengths 0..19):
        >>> import scipy.sparse as sp; from tuner.matrix import canonicalize
        >>> from unittest import mock
        >>> m = canonicalize(sp.csr_matrix(np.tril(np.ones((20, 20), np.float32), -1)))
        >>> with mock.patch.multiple("tuner.model.warps", SAMPLE_ROWS=8, SAMPLE_RUNS=4):
        ...     row_sample(m).row_lengths.tolist()
        [0, 1, 6, 7, 12, 13, 18, 19]
    """
    def build():
        n = m.n_rows
        if n <= SAMPLE_ROWS or rows_descending(m):
            return (None,)
        run = SAMPLE_ROWS // SAMPLE_RUNS
        starts = np.linspace(0, n - run, SAMPLE_RUNS).astype(np.int64)
        rows = (starts[:, None] + np.arange(run)).ravel()
        lengths = row_lengths_at(m, rows)
        return (Structure(shape=(lengths.size, m.n_cols), nnz=int(lengths.sum()), index_dtype=m.index_dtype,
                          value_dtype=m.value_dtype, value_free=m.value_free, row_lengths=lengths,
                          col_lengths=np.zeros(0, np.int64)),)
    return shared_layout(m, ("row_sample", SAMPLE_ROWS, SAMPLE_RUNS), build)[0]


def row_lengths_at(m, rows: np.ndarray) -> np.ndarray:
    """The lengths (int64) of ``m``'s ``rows``: from its row lengths where they are at hand (a lengths-only
    view's, or a matrix's once counted), else from the rows' pointers alone: the model's samples of a 30M-row
    matrix need not count, and hold, every row's length (8 bytes a row) first.

    Example:
        >>> import scipy.sparse as sp; from tuner.matrix import canonicalize
        >>> m = canonicalize(sp.csr_matrix(np.tril(np.ones((5, 5), np.float32))))
        >>> row_lengths_at(m, np.array([4, 1])).tolist(), "row_lengths" in m.__dict__
        ([5, 2], False)
    """
    rows = np.asarray(rows, dtype=np.int64)
    if not isinstance(m, CanonicalMatrix) or "row_lengths" in m.__dict__:
        return m.row_lengths[rows]
    return (m.indptr[rows + 1] - m.indptr[rows]).astype(np.int64, copy=False)


def class_rows(m: CanonicalMatrix, lo: int, hi: int | None) -> float:
    """Rows of ``m`` with lo <= length < hi, from its row-length histogram."""
    count, _ = row_histogram(m)
    return float(count[max(lo, 0):count.size if hi is None else min(hi, count.size)].sum())


def scaled(h: WarpHistogram, factor: float) -> WarpHistogram:
    """``h`` with its warps and entries multiplied by ``factor`` (a sample's histogram for the whole).

    Example:
        >>> h = scaled(WarpHistogram(np.array([3]), np.array([2.0]), np.array([6.0])), 2.5)
        >>> h.count.tolist(), h.size.tolist()
        ([5.0], [15.0])
    """
    rounds = None if h.rounds is None else (h.rounds[0] * factor, h.rounds[1])
    return WarpHistogram(h.w, h.count * factor, h.size * factor, rounds)


def rows_descending(m: CanonicalMatrix) -> bool:
    """Whether ``m``'s rows come by decreasing length (checked once per matrix)."""
    def check():
        with device_row_lengths(m) as dev:
            L = m.row_lengths if dev is None else dev
            return largest(L[1:] > L[:-1]) == 0
    return shared_layout(m, ("rows_descending",), check)


def _built_by(s: SegmentSpec) -> tuple:
    """What building the segment's histogram builds: for lane groups of a few lanes, the wanted group
    sizes of its class of rows at once (:func:`class_groups`); else its own histogram."""
    return ("group_warps", s.lo, s.hi) if _few_lanes(s) else ("warps",) + s.ident


def _few_lanes(s: SegmentSpec) -> bool:
    """Rows of a lane group narrower than a warp: several rows per warp."""
    return isinstance(s.group, int) and s.group < WARP


def prebuild(m: CanonicalMatrix, segments: list[SegmentSpec], workers: int | None = None) -> None:
    """Build many segments' histograms at once (NumPy's passes over the rows release the GIL), on up to 8
    threads, no more than the CPUs (more only contend). Rows in no particular order are filtered into
    their classes from the widest class that holds them (:func:`outer_classes`): those first, then the
    classes inside them."""
    # One task per thing built: the group sizes of one class of rows share a pass (see class_groups).
    tasks: dict[tuple, list] = {}
    for s in segments:
        if known_layout(m, ("warps",) + s.ident) is None:  # built before (predicted_candidates): skipped
            tasks.setdefault(_built_by(s), []).append(s)
    classes = {(g[0].lo, g[0].hi) for g in tasks.values() if _few_lanes(g[0])}
    outer = {} if rows_descending(m) or row_sample(m) is not None else outer_classes(classes)  # sampled: short passes
    holders = set(outer.values())
    kept: dict[tuple, np.ndarray] = {}  # an outer class's rows, for the classes inside it

    def build(group):
        s = group[0]
        c = (s.lo, s.hi)
        if _few_lanes(s) and c in outer:
            o = outer[c]
            class_groups(m, group, lambda: class_lengths(m, *c, within=(*o, kept[o])))
        elif _few_lanes(s) and c in holders:
            kept[c] = class_lengths(m, *c)  # built once: the classes inside it read it
            class_groups(m, group, lambda: kept[c])
        elif _few_lanes(s):
            class_groups(m, group)
        for each in group:  # all of them, so that a later prebuild finds nothing left to do
            histogram(m, each)
    workers = workers or min(8, os.cpu_count() or 1)
    threaded = m.n_rows > (1 << 20) and workers > 1
    rows = list(tasks.values())
    for stage in ([g for g in rows if (g[0].lo, g[0].hi) not in outer or not _few_lanes(g[0])],
                  [g for g in rows if (g[0].lo, g[0].hi) in outer and _few_lanes(g[0])]):
        if threaded and len(stage) > 1:
            with thread_pool(workers) as pool:
                list(pool.map(build, stage))
        else:
            for group in stage:
                build(group)


def csr_vector_segments(m: CanonicalMatrix, p: CsrVectorParams) -> list[tuple[str, SegmentSpec]]:
    return [(kernel_key("csr_vector", p.threads_per_row, p.block_size, m.value_free),
             SegmentSpec(0, None, p.threads_per_row, p.block_size))]


def binned_segments(m: CanonicalMatrix, p: BinnedParams) -> list[tuple[str, SegmentSpec]]:
    # The binned layout keeps row order inside a class, so a class's warps are those of its rows in order.
    huge = p.huge_min if p.huge_min is not None else np.iinfo(np.int64).max
    shapes = [(0, p.small_max, 1), (p.small_max, p.medium_max, p.medium_lanes),
              (p.medium_max, p.huge_min, WARP), (huge, None, "block")]
    return [(kernel_key("binned", g, p.block_size, m.value_free), SegmentSpec(lo, hi, g, p.block_size))
            for lo, hi, g in shapes]


def aligned_coo_segments(m: CanonicalMatrix, p: AlignedCooParams) -> list[tuple[str, SegmentSpec]]:
    # The seg part's blocks come first, then the flat part's; the hybrid's flat warps never cross rows.
    flat = "hflat" if p.layout == "hybrid" else "flat"
    return [(kernel_key("aligned_coo", part, p.block_size, m.value_free), SegmentSpec(0, None, part, p.block_size,
                                                                                     p.layout))
            for part in ("seg", flat)]


def _tile_cols(m: CanonicalMatrix, width: int) -> list[tuple[int, int]]:
    cuts = bounds(m, width)  # lengths only: listing the segments builds no tiling
    return [(int(a), int(b)) for a, b in zip(cuts[:-1], cuts[1:])]


def _tile_coo_key(m: CanonicalMatrix, p: TileCooParams) -> str:
    # The COO kernel is ALIGNED_COO's flat kernel: its table serves; a tile's warps gather from its columns.
    return kernel_key("aligned_coo", "flat", p.block_size, m.value_free)


def _tile_composite_key(m: CanonicalMatrix, p: TileCompositeParams, part: str) -> str:
    return kernel_key("tile_composite", part, p.block_size, m.value_free)


def tile_coo_segments(m: CanonicalMatrix, p: TileCooParams) -> list[tuple[str, SegmentSpec]]:
    key = _tile_coo_key(m, p)
    return [(key, SegmentSpec(0, None, "tile_flat", p.block_size, tile=(p.tile_width, (), t), cols=c))
            for t, c in enumerate(_tile_cols(m, p.tile_width))]


def tile_composite_segments(m: CanonicalMatrix, p: TileCompositeParams) -> list[tuple[str, SegmentSpec]]:
    # Tile by tile, a tile's row-major workloads (its longest rows) before its column-major ones.
    cols = _tile_cols(m, p.tile_width)
    if len(cols) != len(p.workloads):
        raise ValueError(f"tile_composite with tile_width={p.tile_width} cuts this matrix into {len(cols)} tiles, "
                         f"but {len(p.workloads)} workload sizes were given")
    return [(_tile_composite_key(m, p, part[5:]),
             SegmentSpec(0, None, part, p.block_size, tile=(p.tile_width, p.workloads, t), cols=c))
            for t, c in enumerate(cols) for part in ("tile_row", "tile_col")]


SEGMENTS = {"csr_vector": csr_vector_segments, "binned": binned_segments, "aligned_coo": aligned_coo_segments,
            "tile_coo": tile_coo_segments, "tile_composite": tile_composite_segments}

# The tiled families' kernel shapes, named without listing their tiles (a segment per tile: thousands).
TILED_SHAPES = {"tile_coo": lambda m, p: {_tile_coo_key(m, p)},
                "tile_composite": lambda m, p: {_tile_composite_key(m, p, part) for part in ("row", "col")}}


def segment_keys(m: CanonicalMatrix, family: str, params) -> set[str]:
    """The kernel shapes (table keys) of a candidate's launch segments on view ``m``, each once.

    Example:
        >>> import scipy.sparse as sp; from tuner.matrix import canonicalize
        >>> from tuner.families.tile_coo import TileCooParams
        >>> m = canonicalize(sp.random(300, 300, 0.05, format="csr", dtype=np.float32, random_state=0))
        >>> segment_keys(m, "tile_coo", TileCooParams(64)) == {k for k, _ in SEGMENTS["tile_coo"](m, TileCooParams(64))}
        True
    """
    shapes = TILED_SHAPES.get(family)
    return shapes(m, params) if shapes is not None else {key for key, _ in SEGMENTS[family](m, params)}


def warp_segments(m: CanonicalMatrix, family: str, params) -> list[WarpSegment]:
    """The warps of a candidate, one segment per launch shape, in launch order.

    Example:
        >>> import scipy.sparse as sp; from tuner.matrix import canonicalize
        >>> m = canonicalize(sp.csr_matrix(np.tril(np.ones((6, 6), np.float32))))
        >>> [s.warps.warps for s in warp_segments(m, "csr_vector", CsrVectorParams(16, 128))]
        [3]
    """
    return [WarpSegment(key, histogram(m, s), s) for key, s in SEGMENTS[family](m, params)]
