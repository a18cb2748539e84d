"""Reading the profile's tables for a launch segment: which table a kernel shape reads, a warp's
performance and time alone blended over the gather regimes, the share of gathers each regime serves, and
the sums over a segment's warps that equations 1-5 and the tail need (:class:`SegmentSums`).

:mod:`tuner.model.lookup` combines a launch's segments into its time; the tiled families sum all their
tiles' segments at once (:mod:`tuner.model.tiled`) from the same pieces.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..families.base import shared_layout
from ..formats import device_reorder
from ..formats.device_reorder import known_copy
from ..formats.xp import module, on_device
from ..matrix import CanonicalMatrix
from .locality import (SECTOR_BYTES, CacheLevel, SliceGroups, cache_sectors, count_hits, per_sector, sector_counts,
                       slice_fractions, slice_groups, sweep_level)
from .profile_data import REGIMES, ROW_HEIGHTS, Profile, kernel_key, row_group, warp_rows
from .warps import WarpHistogram

log = logging.getLogger("tuner.model")


# Tables are measured with float32 values and int32 indices; other types scale by the bytes each entry
# streams (an approximation: the gathers of x move whole 32-byte sectors either way). A profile without
# the valued tables (a reduced grid) serves valued kernels from the value-free ones the same way.
def table_for(profile: Profile, key: str) -> tuple[str, int]:
    """The table to read for ``key`` and the bytes per entry it was measured with."""
    if key.endswith(":v") and key not in profile.tables and key + "f" in profile.tables:
        return key + "f", 4
    return key, 4 if key.endswith(":vf") else 8


def block_threads(key: str) -> int:
    """Threads per block of the kernel shape ``key`` (:func:`~tuner.model.profile_data.kernel_key`).

    Example:
        >>> block_threads("csr_vector:8:128:v")
        128
    """
    return int(key.split(":")[2])


def cache_level(profile: Profile, level: str) -> CacheLevel:
    """Cache ``level`` ('l1' or 'l2') for gathers: its fitted LRU capacity and, where the profile kept a
    readable sweep, how the real cache departs from it (:func:`~tuner.model.locality.sweep_level`)."""
    sweep = (profile.caches or {}).get(level) or {}
    return _cache_level(cache_sectors(profile.constants, level), tuple(sweep.get("columns", ())),
                        tuple(sweep.get("ms", ())), (profile.regime_columns or {}).get(level))


@lru_cache(maxsize=64)  # read once per profile, not once per tile
def _cache_level(capacity: float, columns: tuple, ms: tuple, hit_columns) -> CacheLevel:
    if columns and hit_columns:
        try:
            return sweep_level(columns, ms, capacity, hit_columns)
        except ValueError:  # a sweep too flat to read (a reduced grid): the fitted LRU alone
            pass
    return CacheLevel(capacity)


def gather_fractions(m: CanonicalMatrix, profile: Profile, cols: tuple[int, int] | None = None) -> np.ndarray:
    """Shares of the gathers of x served by L1, L2 and memory (see :mod:`tuner.model.locality`), for the
    whole matrix or for the columns ``cols`` = (first, end) of one tile, whose warps gather from its slice
    of x alone (and find it cold in L1: :func:`column_fractions`)."""
    a, b = cols if cols is not None else (0, m.n_cols)
    return shared_layout(m, ("gather_fractions", profile.digest, cols),
                         lambda: column_fractions(m, profile, np.array([a, b]), tiles=cols is not None)[0])


def sector_hit_rates(m: CanonicalMatrix, profile: Profile) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per 32-byte sector of x, the probability that a gather of it hits L1 and that it hits L1 or L2 in a
    whole-matrix launch (:func:`~tuner.model.locality.sector_hits`), and their averages over the gathers
    (the shares of L1, L2 and memory). Memoised per view and profile.

    Example: see tests/test_reuse.py (needs a profile).
    """
    def build():
        levels = [cache_level(profile, "l1"), cache_level(profile, "l2")]
        whole = sector_groups(m, np.array([0, m.n_cols]))  # the whole-matrix gather shares' grouping
        values, (c1, c2) = count_hits(whole, levels)
        h1, h2 = with_sector_counts(m, lambda counts: per_sector(counts, values, (c1, c2)))
        # The shares from the distinct counts: each count's chance weighted by its sectors' gathers.
        gathers = values * whole.mult
        total = max(float(gathers.sum()), 1.0)
        a1, a2 = sum_of_products(gathers, c1) / total, sum_of_products(gathers, c2) / total
        return h1, h2, np.array([a1, a2 - a1, 1.0 - a2])
    return shared_layout(m, ("sector_hit_rates", profile.digest), build)


def matrix_sector_counts(m: CanonicalMatrix) -> np.ndarray:
    """Gathers of each 32-byte sector of x over the whole matrix (its column lengths by sector), once per
    view, on the host (where the view's sector statistics are made on the GPU, :func:`with_sector_counts` sums
    them there instead)."""
    return shared_layout(m, ("sector_counts",), lambda: sector_counts(m.col_lengths, m.value_dtype.itemsize))


def sector_groups(m: CanonicalMatrix, cuts: np.ndarray) -> SliceGroups:
    """:func:`~tuner.model.locality.slice_groups` of the columns ``cuts[i]`` to ``cuts[i + 1]`` - 1, ranges
    of whole sectors (the tile widths are; the last may end at the last column): the matrix's sector
    counts sliced, grouped once per view and tiling (the shares differ per candidate, the sectors do not);
    on the GPU where the view's matrix is there and large (:func:`with_sector_counts`)."""
    cuts = np.asarray(cuts, dtype=np.int64)
    per = max(SECTOR_BYTES // m.value_dtype.itemsize, 1)
    first, end = cuts[0] // per, -(-cuts[-1] // per)
    return shared_layout(m, ("slice_groups", cuts.tobytes()), lambda: with_sector_counts(
        m, lambda counts: slice_groups(counts[first:end], -(-cuts // per) - first)))


DEVICE_SECTORS = 1 << 19  # from this many sectors of x on, a view's sector groupings are made on the GPU


def with_sector_counts(m, work):
    """``work(counts)`` on the view's sector counts (:func:`matrix_sector_counts`): a device (CuPy) array,
    summed there once per view, where ``m``'s CSR is on the GPU
    (:func:`~tuner.families.base.device_row_lengths`' rule) and x has :data:`DEVICE_SECTORS` sectors or more
    (:func:`on_gpu`); the host's otherwise, or where
    the device runs out of memory. A tiling's grouping of millions of sectors (a pass of sorts and masks:
    tenths of a second on the host, holding the interpreter the other planning threads wait for) then runs
    there, and only what ``work`` brings back (host arrays: its result is the same either way) comes back.

    Example:
        >>> import scipy.sparse as sp; from tuner.matrix import canonicalize
        >>> with_sector_counts(canonicalize(sp.eye(20, format="csr", dtype="float32")), lambda c: c.tolist())
        [8, 8, 4]
    """
    if on_gpu(m):
        try:
            with device_reorder.on_device():
                return work(_device_counts(m))
        except MemoryError as e:  # CuPy's OutOfMemoryError is one: the same passes on the host
            log.info("sector statistics on the host: the GPU is out of memory (%s)", e)
    return work(matrix_sector_counts(m))


def on_gpu(m) -> bool:
    """Whether the view's sector statistics are made on the GPU (see :func:`with_sector_counts`)."""
    copy = known_copy(m) if isinstance(m, CanonicalMatrix) else None
    sectors = -(-m.n_cols // max(SECTOR_BYTES // m.value_dtype.itemsize, 1))
    return copy is not None and sectors >= DEVICE_SECTORS and on_device(copy.indptr)


def _device_counts(m):
    """The view's sector counts on the device, once: its column lengths sent up and summed there by sector."""
    def build():
        per = max(SECTOR_BYTES // m.value_dtype.itemsize, 1)
        cols = device_reorder.upload(np.asarray(m.col_lengths, dtype=np.int64))
        xp = module(cols)
        padded = xp.zeros(-(-cols.size // per) * per, np.int64)  # the last sector may end past the last column
        padded[:cols.size] = cols
        counts = padded[0::per].copy()
        for k in range(1, per):  # strided adds: a reduction over an axis would be built by NVRTC on first use
            counts += padded[k::per]
        return counts
    return shared_layout(m, ("sector_counts_device",), build)


def column_fractions(m: CanonicalMatrix, profile: Profile, cuts: np.ndarray, l1_share: np.ndarray | None = None,
                     tiles: bool = False) -> np.ndarray:
    """:func:`gather_fractions` of the columns ``cuts[i]`` to ``cuts[i + 1]`` - 1 of each i, one row each, all
    at once; a range's shares are the same as when asked for alone.

    ``tiles``: the ranges are a tiling's tiles, launched one after another. Each gathers from a part of x
    that no tile before it touched, so every SM's L1 meets it cold: its gathers reach L1 as a stream of
    their number over the SMs, whose first touch of each sector misses
    (:func:`~tuner.model.locality.che_hit_rates`); the profile's tables were measured on streams long
    enough for that not to count. A whole-matrix launch is not charged so: its L1 starts cold too, but on
    the suite's small matrices the term makes the predictions worse (median error 15.7 % with it, 13.0 %
    without), for a reason not understood.

    Example: see tests/test_tiles.py (needs a profile).
    """
    itemsize = m.value_dtype.itemsize
    per = max(SECTOR_BYTES // itemsize, 1)
    l1, l2 = cache_level(profile, "l1"), cache_level(profile, "l2")
    cuts = np.asarray(cuts, dtype=np.int64)
    a, b = cuts[:-1], cuts[1:]
    if np.all(a % per == 0) and np.all((b % per == 0) | (b == m.n_cols)):
        groups = sector_groups(m, cuts)
    else:  # a range that splits a sector counts its own
        parts = [sector_counts(m.col_lengths[i:j], itemsize) for i, j in zip(a, b)]
        groups = slice_groups(np.concatenate(parts), np.cumsum([0] + [c.size for c in parts]))
    stream = groups.total / profile.constants["sm_count"] if tiles else None
    return slice_fractions(groups, None, l1, l2, l1_share, stream)


def _regimes(fractions) -> list:
    """(shares, regime) of the regimes some gather reaches: ``fractions`` is one (L1, L2, memory) triple
    or a triple per warp (n x 3), whose columns come out (none for no warps: the sums start from zeros)."""
    return [(f, r) for f, r in zip(np.asarray(fractions, dtype=np.float64).T, REGIMES) if np.any(f > 0)]


def blended(profile: Profile, key: str, w: np.ndarray, fractions) -> np.ndarray:
    """Table performance of warps of shape ``w`` whose gathers the regimes serve in ``fractions`` (one
    triple for all, or one per warp): times add across regimes, so performances blend harmonically.

    Example: see tests/test_model.py (needs a profile).
    """
    w = np.asarray(w, dtype=np.float64)
    inv = sum((f / profile.performance(key, r, w) for f, r in _regimes(fractions)), np.zeros(w.shape))
    with np.errstate(divide="ignore"):  # no regime reached (no gathers at all): no time, not a warning
        return 1.0 / inv


def row_heights(profile: Profile, value_free: bool, block: int) -> tuple:
    """((rows, table), ...): the row-major TILE-Composite tables of workloads of 1, 2, 4, ... rows that
    ``profile`` measured (one row's always; the others where the profile has them)."""
    out = []
    for h in ROW_HEIGHTS:
        key = table_for(profile, kernel_key("tile_composite", row_group(h), block, value_free))[0]
        if h == 1 or profile.has_table(key):
            out.append((h, key))
    return tuple(out)


def height_curve(heights: np.ndarray, log_perf: np.ndarray, source: np.ndarray, h: np.ndarray) -> np.ndarray:
    """Performance of workloads of ``h`` rows from tables measured at ``heights`` rows (increasing):
    ``log_perf[k, j]`` is log2 of table k's performance at the j-th length, ``source`` picks each
    workload's length; linear in log2 h between neighbouring heights, held beyond the measured ones.

    Example (tables at 1 and 4 rows: 2 rows lie halfway in log2 h):
        >>> height_curve(np.array([1, 4]), np.log2([[10.0, 20.0], [40.0, 80.0]]), np.array([0, 1, 0]),
        ...              np.array([2, 1, 64])).round(3).tolist()
        [20.0, 20.0, 40.0]
    """
    x = np.log2(np.asarray(heights, dtype=np.float64))
    if x.size == 1:
        return np.exp2(log_perf[0, source])
    lh = np.clip(np.log2(np.maximum(np.asarray(h, dtype=np.float64), 1.0)), x[0], x[-1])
    k = np.clip(np.searchsorted(x, lh, side="right") - 1, 0, x.size - 2)
    f = (lh - x[k]) / (x[k + 1] - x[k])
    return np.exp2((1.0 - f) * log_perf[k, source] + f * log_perf[k + 1, source])


def height_table(profile: Profile, heights: tuple, w: np.ndarray, fractions) -> tuple[np.ndarray, np.ndarray]:
    """(rows, log2 performance): the :func:`blended` performance at each of ``w`` in every table of
    ``heights`` = ((rows, key), ...), one row per table, as :func:`height_curve` reads them.

    Example: see tests/test_tiles.py (needs a profile).
    """
    w = np.asarray(w, dtype=np.float64).ravel()
    log_perf = np.stack([np.log2(blended(profile, key, w, fractions)) for _, key in heights]).reshape(len(heights), -1)
    return np.array([n for n, _ in heights]), log_perf


def blended_heights(profile: Profile, heights: tuple, w: np.ndarray, h: np.ndarray, fractions) -> np.ndarray:
    """:func:`blended` performance of row-major workloads of ``h`` rows of ``w`` entries, from the tables
    ``heights`` = ((rows, key), ...) measured per number of rows (:func:`height_curve`).

    Example: see tests/test_tiles.py (needs a profile).
    """
    w = np.asarray(w, dtype=np.float64)
    return height_curve(*height_table(profile, heights, w, fractions), np.arange(w.size), h).reshape(w.shape)


def blended_alone(profile: Profile, key: str, w: np.ndarray, fractions, fill=None) -> np.ndarray:
    """Time alone of warps of shape ``w`` (:meth:`~tuner.model.profile_data.Profile.alone_time`), blended
    linearly by the regimes' shares ``fractions`` (one triple, or one per warp).

    Example: see tests/test_model.py (needs a profile).
    """
    return sum((f * profile.alone_time(key, r, w, fill) for f, r in _regimes(fractions)), np.zeros(np.shape(w)))


def segment_sums(profile: Profile, key: str, warps: WarpHistogram, fractions
                 ) -> tuple[float, float, float, float]:
    """Sum of S_j / P_j at the profiled bytes, the sum and maximum of the warps' times alone, and the
    warps' mean shape (:func:`mean_width`).

    Example: see tests/test_model.py (needs a profile).
    """
    perf = blended(profile, key, warps.w, fractions)
    # A block row appears as block / 32 warps, each holding its slot for the block's time alone; a warp that
    # repeats its shape (rounds) holds it that many times longer.
    rows = warp_rows(key)
    # How full of rows as long as its longest a warp is: one hub among short rows runs as one row alone.
    fill = (warps.size / (warps.count * np.maximum(warps.w, 1) * rows)
            if rows > 1 and warps.rounds is None else None)
    alone = blended_alone(profile, key, warps.w, fractions, fill)
    width = mean_width(warps.w, warps.count)
    if warps.rounds is None:
        return float((warps.size / perf).sum()), float((warps.count * alone).sum()), float(alone.max()), width
    total, most = warps.rounds
    return float((warps.size / perf).sum()), float((total * alone).sum()), float((most * alone).max()), width


def mean_width(w: np.ndarray, count: np.ndarray) -> float:
    """The mean shape of a segment's warps, each counted once: what a lane of its typical warp walks
    (ALIGNED_COO's seg part: its slots), for the floor of a launch (:func:`~tuner.model.lookup.occupancy_floor`).

    Example:
        >>> mean_width(np.array([4, 16]), np.array([3.0, 1.0]))
        7.0
    """
    total = float(np.sum(count))
    return sum_of_products(w, count) / total if total > 0 else 0.0


def sum_of_products(a: np.ndarray, b: np.ndarray) -> float:
    """The sum of ``a * b``, without BLAS: np.dot of vectors over 10,000 elements wakes OpenBLAS's threads,
    one per core, and they spin for a while after each call, taking the cores planning's own threads
    count and build on (H100 host, rmat:23: 2-3 s more CPU per plan and a tenth more wall time, for
    two dot products per view over x's million sectors).

    Example:
        >>> sum_of_products(np.array([1, 2, 3]), np.array([0.5, 0.25, 1.0]))
        4.0
    """
    return float(np.multiply(a, b, dtype=np.float64).sum())


@dataclass(frozen=True)
class SegmentSums:
    """A launch's segments of warps (those that have any), in launch order, reduced to what the lookup
    model combines (:func:`~tuner.model.lookup.predict_lookup`).

    Attributes:
        work: each segment's sum of S_j / P_j (ms) at the bytes per entry its table was measured with.
        profiled_bytes: those bytes per entry.
        alone_sum: the segment's warps' slot time alone, summed (ms).
        alone_max: its slowest warp's time alone (ms).
        widths: its warps' mean shape (:func:`mean_width`).
        blocks: blocks the segment launches.
        max_active: warps resident on the GPU at once for the launch (one launch, one occupancy: its last
            segment's table).
        keys: each segment's table (empty where not given).
    """

    work: np.ndarray
    profiled_bytes: np.ndarray
    alone_sum: np.ndarray
    alone_max: np.ndarray
    widths: np.ndarray
    blocks: np.ndarray
    max_active: int
    keys: tuple = ()

    @classmethod
    def of_rows(cls, rows: list[tuple]) -> "SegmentSums":
        """From one (work, alone sum, alone max, mean width, blocks, profiled bytes, max active, table) tuple
        per segment.

        Example:
            >>> s = SegmentSums.of_rows([(2.0, 1.0, 0.5, 4.0, 3, 8, 100, "a"), (4.0, 1.0, 0.25, 9.0, 1, 8, 64, "b")])
            >>> s.work.tolist(), s.widths.tolist(), s.blocks.tolist(), s.max_active, s.keys
            ([2.0, 4.0], [4.0, 9.0], [3, 1], 64, ('a', 'b'))
        """
        if not rows:
            z = np.zeros(0)
            return cls(z, z, z, z, z, np.zeros(0, np.int64), 1)
        work, a_sum, a_max, width, blocks, profiled, active, keys = zip(*rows)
        return cls(np.array(work, np.float64), np.array(profiled, np.float64), np.array(a_sum, np.float64),
                   np.array(a_max, np.float64), np.array(width, np.float64), np.array(blocks, np.int64),
                   int(active[-1]), tuple(keys))
