"""Where the gathers of x hit: the share of accesses served by L1, L2 and device memory.

Caches hold 32-byte sectors, not single entries of x: a hot column occupies a whole sector, and in a
graph with scattered hot nodes its neighbours in the sector are cold. So the model counts accesses per
sector (the column counts summed over each aligned group of 32 / itemsize columns) and asks how often an
LRU cache of K sectors hits a stream that requests sectors in those proportions: Che's approximation,
exact enough for caches of thousands of lines. K is each cache's *effective* capacity for gathers while the
matrix streams past, measured by the profile (uniform gathers over a growing x, :func:`fit_capacity`);
without that measurement, half the nominal size stands in.

A real cache is not that LRU: the sweep shows misses before x reaches K and fewer hits than K / S beyond
it (the streamed indices and values share the cache, and its sets are not fully associative). Where the
profile kept its sweep, each level (:class:`CacheLevel`) therefore scales Che's hit rate by what the sweep
measured over what the LRU of K predicts for uniform gathers over as many sectors as the matrix's gathers
effectively spread over (:func:`footprint`): uniform gathers then hit exactly as measured, and a few hot
sectors among many cold ones still hit as Che says.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..formats.xp import host, largest, module, on_device

SECTOR_BYTES = 32
NOMINAL_SHARE = 0.5  # of a cache left to x when its effective capacity was not measured


def sector_counts(col_lengths: np.ndarray, itemsize: int) -> np.ndarray:
    """Accesses per 32-byte sector of x: column counts summed over aligned groups of 32 / itemsize.

    Example:
        >>> sector_counts(np.arange(10), 4).tolist()
        [28, 17]
    """
    per = max(SECTOR_BYTES // int(itemsize), 1)
    c = np.asarray(col_lengths)
    if c.size == 0:
        return np.zeros(0, np.int64)
    return np.add.reduceat(c, np.arange(0, c.size, per), dtype=np.int64)  # one pass, no padded copy


def che_hit_rate(counts: np.ndarray, capacity: float) -> float:
    """Hit rate of an LRU cache of ``capacity`` items under independent requests in proportion to ``counts``.

    Che's approximation: the cache's characteristic time T solves sum_i (1 - exp(-p_i T)) = capacity and
    item i hits with probability 1 - exp(-p_i T) (:func:`che_hit_rates`, for one set of counts). Uniform
    requests over S > capacity items give capacity / S, as they must.

    Example:
        >>> round(che_hit_rate(np.ones(1000, np.int64), 250), 3)
        0.25
        >>> che_hit_rate(np.array([5, 1, 0]), 2)
        1.0
    """
    counts = np.asarray(counts)
    return float(che_hit_rates(slice_groups(counts, np.array([0, counts.size])), np.array([float(capacity)]))[0])


@dataclass(frozen=True)
class SliceGroups:
    """The accesses per sector of a tiling's slices, grouped by (slice, count): built once per tiling,
    read for every capacity and share asked of it.

    Attributes:
        used: sectors in use (count > 0) per slice.
        total: accesses per slice.
        group, value, mult: per group, its slice, its count and how many of the slice's sectors have it
            (groups ordered by slice, then count).
    """

    used: np.ndarray
    total: np.ndarray
    group: np.ndarray
    value: np.ndarray
    mult: np.ndarray

    @property
    def share(self) -> np.ndarray:
        """Each group's sectors' share of their slice's accesses (p_i of Che's approximation)."""
        return self.value / np.where(self.total > 0, self.total, 1.0)[self.group]

    def spread(self) -> np.ndarray:
        """:func:`footprint` of every slice (0 for a slice with nothing gathered)."""
        p = self.share
        entropy = -np.bincount(self.group, weights=self.mult * p * np.log(p), minlength=self.used.size)
        return np.where(self.used > 0, np.exp(entropy), 0.0)


def distinct_counts(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values of ``keys`` ascending, and how often each occurs: ``np.unique`` with
    ``return_counts`` by one sort (NumPy 2's hashing ``np.unique`` takes ten times longer on a million keys).

    Example:
        >>> [a.tolist() for a in distinct_counts(np.array([5, 1, 5, 3, 1, 5]))]
        [[1, 3, 5], [2, 1, 3]]
    """
    keys = np.asarray(keys)
    if keys.size and keys.dtype.kind in "iu" and keys.min() >= 0 and keys.max() < 4 * keys.size:
        # Keys no larger than a few times their number (a matrix's sector counts): counted, not sorted.
        c = np.bincount(keys)
        at = np.flatnonzero(c)
        return at.astype(keys.dtype, copy=False), c[at]
    keys = np.sort(keys)
    starts = np.flatnonzero(np.concatenate([[True], keys[1:] != keys[:-1]])) if keys.size else np.zeros(0, np.int64)
    return keys[starts], np.diff(np.append(starts, keys.size))


def slice_groups(sectors: np.ndarray, cuts: np.ndarray) -> SliceGroups:
    """:class:`SliceGroups` of the slices ``sectors[cuts[i]:cuts[i + 1]]``: one sort of the sectors in use.

    Example:
        >>> g = slice_groups(np.array([2, 2, 0, 5, 1, 1]), np.array([0, 3, 6]))
        >>> g.used.tolist(), g.group.tolist(), g.value.tolist(), g.mult.tolist()
        ([2, 3], [0, 1, 1], [2, 1, 5], [2.0, 2.0, 1.0])
    """
    cuts = np.asarray(cuts, dtype=np.int64)
    n = cuts.size - 1
    if on_device(sectors):
        return sorted_slice_groups(sectors, cuts)
    counts = np.asarray(sectors).astype(np.int64, copy=False)
    live = counts > 0
    which = np.repeat(np.arange(n), np.diff(cuts))[live]  # the slice of each sector in use
    held = counts[live]
    group, value, mult = _pair_counts(which, held, n)
    return SliceGroups(np.bincount(which, minlength=n), np.bincount(which, weights=held, minlength=n).astype(np.float64),
                       group, value, mult.astype(np.float64))


def sorted_slice_groups(sectors, cuts: np.ndarray) -> SliceGroups:
    """:func:`slice_groups` by one sort of the (slice, count) pairs of the sectors in use, in the module of
    ``sectors`` (CuPy's radix sort on the GPU, where the planner keeps a large matrix's sector counts: its
    passes over millions of sectors cost milliseconds there instead of tenths of a second on the host, and
    hold no interpreter lock); the groups come back as host arrays, the same as :func:`slice_groups` gives.

    Example:
        >>> g = sorted_slice_groups(np.array([2, 2, 0, 5, 1, 1]), np.array([0, 3, 6]))
        >>> g.used.tolist(), g.group.tolist(), g.value.tolist(), g.mult.tolist()
        ([2, 3], [0, 1, 1], [2, 1, 5], [2.0, 2.0, 1.0])
    """
    xp = module(sectors)
    cuts = np.asarray(cuts, dtype=np.int64)
    n = cuts.size - 1
    counts = sectors.astype(np.int64, copy=False)
    live = xp.flatnonzero(counts > 0)
    if live.size == 0:
        z = np.zeros(0, np.int64)
        return SliceGroups(np.zeros(n, np.int64), np.zeros(n), z, z, np.zeros(0))
    # The slice of each sector in use: a search of the slices' ends (the sectors run from cuts[0] = 0).
    which = xp.searchsorted(xp.asarray(cuts[1:]), live, side="right")
    held = counts[live]
    scale = largest(held) + 1
    key = xp.sort(which * scale + held)
    starts = xp.flatnonzero(xp.concatenate([xp.ones(1, bool), key[1:] != key[:-1]]))
    mult = host(xp.diff(xp.concatenate([starts, xp.asarray([key.size], dtype=starts.dtype)]))).astype(np.float64)
    key = host(key[starts])
    group, value = key // scale, key % scale
    # Sectors and accesses per slice from the groups: a pass over them, not over the sectors.
    used = np.bincount(group, weights=mult, minlength=n).astype(np.int64)
    return SliceGroups(used, np.bincount(group, weights=value * mult, minlength=n), group, value, mult)


def _pair_counts(which: np.ndarray, held: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct (slice, count) pairs of ``which`` (ascending) and ``held``, ordered by slice then count,
    and how often each occurs. A power-law graph's sectors hold mostly small counts: those are counted in a
    table of (slice, count) bins, and only the few larger ones sorted, rather than sorting every pair."""
    if not which.size:
        z = np.zeros(0, np.int64)
        return z, z, z
    scale = int(held.max()) + 1
    small = int(min(SMALL_COUNTS, 4 * which.size // max(n, 1)))  # the table: no larger than the pairs
    if small < 2 or n * scale <= 4 * which.size:  # every pair in a table (distinct_counts' own), or none
        key, mult = distinct_counts(which * scale + held)
        return key // scale, key % scale, mult
    under = held < small
    table = np.bincount(which[under] * small + held[under], minlength=n * small)
    at = np.flatnonzero(table)
    over = ~under
    key, big_mult = distinct_counts(which[over] * scale + held[over])
    group = np.concatenate([at // small, key // scale])
    # Within a slice every small count comes before every large one: a stable sort by slice keeps that.
    order = np.argsort(group, kind="stable")
    return (group[order], np.concatenate([at % small, key % scale])[order],
            np.concatenate([table[at], big_mult])[order])


SMALL_COUNTS = 256  # counts below this are tabled by _pair_counts; the rest sorted


def che_hit_rates(groups: SliceGroups, capacity: np.ndarray, stream: np.ndarray | None = None) -> np.ndarray:
    """:func:`che_hit_rate` of every slice of ``groups`` at once, one ``capacity`` each (:func:`che_times`):
    1 for a slice whose sectors in use all fit, 0 for a cache of no capacity.

    ``stream``: the requests each slice makes of the cache, which starts empty (None: so many that the
    first misses do not count). A request k requests in hits when its sector was requested within the last
    min(T, k); averaged over the stream of N that is (M - D(M) + max(N - T, 0) h) / N with M = min(T, N)
    and h the rate above: 1 - D(N) / N (the first touches miss) when everything fits, h as N grows.

    Example (the second slice is uniform over 4 sectors, half of which fit; 8 requests to it from empty):
        >>> g = slice_groups(np.array([5, 1, 3, 3, 3, 3]), np.array([0, 2, 6]))
        >>> che_hit_rates(g, np.array([2.0, 2.0])).round(6).tolist()
        [1.0, 0.5]
        >>> che_hit_rates(g, np.array([2.0, 2.0]), stream=np.array([1e9, 8.0])).round(3).tolist()
        [1.0, 0.423]
    """
    t = che_times(groups, capacity)
    n = t.size
    group, mult, q = groups.group, groups.mult, groups.share
    solve = np.isfinite(t) & (t > 0)
    hit = np.where(np.isfinite(t), 0.0, 1.0)
    hit[solve] = np.bincount(group, weights=mult * q * -np.expm1(-q * t[group]), minlength=n)[solve]
    if stream is None:
        return hit
    stream = np.broadcast_to(np.asarray(stream, dtype=np.float64), (n,))
    first = np.minimum(t, stream)
    occupied = np.bincount(group, weights=mult * -np.expm1(-q * first[group]), minlength=n)
    late = np.where(np.isfinite(t), np.maximum(stream - t, 0.0), 0.0)
    return np.where(stream > 0, (first - occupied + late * hit) / np.where(stream > 0, stream, 1.0), hit)


def che_times(groups: SliceGroups, capacity: np.ndarray) -> np.ndarray:
    """Che's characteristic time T of every slice of ``groups`` in an LRU of ``capacity`` sectors (one
    each), in units of the slice's requests: a sector requested a share p of the time hits with probability
    1 - exp(-p T). Infinite where the slice's sectors in use all fit, 0 for a cache of no capacity.

    T is found by Newton's method from T = capacity: the occupancy D(T) = sum_i (1 - exp(-p_i T)) is
    concave, increasing and at most T (the p_i sum to 1), so the steps rise monotonically to the root; a
    handful reach double precision. Each step is a pass over the groups, not over the sectors.

    Example (uniform over 4 sectors, 2 of which fit: 1 - exp(-T / 4) = 1 / 2):
        >>> round(float(che_times(slice_groups(np.array([3, 3, 3, 3]), np.array([0, 4])), np.array([2.0]))[0]), 4)
        2.7726
    """
    capacity = np.asarray(capacity, dtype=np.float64)
    n = capacity.size
    over = groups.used > capacity
    t = np.where(over, 0.0, np.inf)
    solve = over & (capacity > 0)
    group, mult, q = groups.group, groups.mult, groups.share
    if solve.any():
        at = solve[group]  # only the groups of slices that overflow
        g, gm, gq = group[at], mult[at], q[at]
        t[solve] = capacity[solve]
        for _ in range(100):  # Newton from below; under ten steps on graphs' tiles
            missed = -np.expm1(-gq * t[g])  # 1 - exp(-p T), exact for small p T
            short = capacity - np.bincount(g, weights=gm * missed, minlength=n)
            slope = np.bincount(g, weights=gm * gq * (1.0 - missed), minlength=n)
            step = np.where(solve & (slope > 0) & (short > 0), short / np.where(slope > 0, slope, 1.0), 0.0)
            t[solve] += step[solve]
            if np.all(step <= 1e-13 * np.where(solve, t, 1.0)):
                break
    return t


def sector_hits(counts, levels, groups: SliceGroups | None = None) -> tuple[np.ndarray, ...]:
    """Per sector of x (``counts``: its requests), the probability that a request of it hits each of
    ``levels`` (:class:`CacheLevel`, innermost first), as :func:`slice_fractions` would charge it: Che's
    1 - exp(-p T) times the level's measured departure, and no less at an outer level than at an inner one.
    Averaged over the requests they give the whole matrix's shares. ``groups``: ``counts`` as one slice
    (:func:`slice_groups`), when the caller holds it already. ``counts`` may be a device (CuPy) array:
    each sector's lookup is made there and the chances come back to the host.

    A sector's chance depends on its count alone: it is computed once per distinct count and looked up
    per sector (sectors never requested get 0).

    Example (uniform over 4 sectors, L1 of 2, L2 of 8; sector 4 never requested):
        >>> h1, h2 = sector_hits(np.array([3, 3, 3, 3, 0]), [CacheLevel(2.0), CacheLevel(8.0)])
        >>> h1.round(3).tolist(), h2.tolist()
        ([0.5, 0.5, 0.5, 0.5, 0.0], [1.0, 1.0, 1.0, 1.0, 0.0])
    """
    xp = module(counts)
    counts = counts if xp is not np else np.asarray(counts)
    if groups is None:
        groups = slice_groups(counts.astype(np.int64), np.array([0, counts.size]))
    if counts.dtype.kind not in "iu":  # counts that are not whole numbers: each sector's own chance
        spread = groups.spread()[0] if any(c.footprints for c in levels) else 0.0
        return _hits_by_count(counts.astype(np.float64), float(counts.sum()), levels, groups, spread)
    return per_sector(counts, *count_hits(groups, levels))


def per_sector(counts, values: np.ndarray, by_value: tuple) -> tuple[np.ndarray, ...]:
    """Each sector's chances looked up by its count (whole numbers, in NumPy or on the device) among the
    distinct ``values`` (ascending) that ``by_value`` holds per level (:func:`count_hits`); 0 for a sector
    never requested. Host arrays come back.

    Example:
        >>> per_sector(np.array([3, 0, 5]), np.array([3, 5]), (np.array([0.5, 0.25]),))[0].tolist()
        [0.5, 0.0, 0.25]
    """
    xp = module(counts)
    top = int(values[-1]) if values.size else 0
    if xp is np and top <= 4 * counts.size:  # a table indexed by count (calloc'd: cheap)
        out = []
        for h in by_value:
            table = np.zeros(top + 1)
            table[values] = h
            out.append(table[counts])
        return tuple(out)
    at = xp.searchsorted(xp.asarray(values), counts)
    live = counts > 0
    return tuple(host(xp.where(live, xp.asarray(np.append(h, 0.0))[at], 0.0)) for h in by_value)


def count_hits(groups: SliceGroups, levels) -> tuple[np.ndarray, tuple]:
    """:func:`sector_hits` per distinct count instead of per sector: the distinct counts of the sectors in
    use (``groups`` of one slice: ascending) and, per level, the chance that a request of a sector of that
    count hits it. Their gathers (count x sectors of it) weight them into the shares.

    Example (the uniform sectors of :func:`sector_hits`):
        >>> values, (h1, h2) = count_hits(slice_groups(np.array([3, 3, 3, 3, 0]), np.array([0, 5])),
        ...                               [CacheLevel(2.0), CacheLevel(8.0)])
        >>> values.tolist(), h1.round(3).tolist(), h2.tolist()
        ([3], [0.5], [1.0])
    """
    spread = groups.spread()[0] if any(c.footprints for c in levels) else 0.0
    values = groups.value
    return values, _hits_by_count(values.astype(np.float64), float(groups.total.sum()), levels, groups, spread)


def _hits_by_count(counts: np.ndarray, total: float, levels, groups: SliceGroups, spread: float) -> tuple:
    """:func:`sector_hits` of sectors requested ``counts`` times each out of ``total``."""
    p = counts / total if total > 0 else counts
    out, inner = [], np.zeros(counts.size)
    for level in levels:
        t = float(che_times(groups, np.array([level.capacity]))[0])
        h = np.where(counts > 0, 1.0, 0.0) if np.isinf(t) else -np.expm1(-p * t)
        if level.footprints:
            h = h * level.departure(spread)
        inner = np.maximum(h, inner)
        out.append(inner)
    return tuple(out)


@dataclass(frozen=True)
class CacheLevel:
    """One cache level for gathers: its LRU capacity and how the real cache departs from that LRU.

    Attributes:
        capacity: K, the effective LRU capacity in sectors (:func:`fit_capacity`, or a nominal share).
        footprints: sectors of x the profile's sweep gathered uniformly from, increasing (empty: no sweep).
        hits: the share of those gathers the level served at each footprint, relative to the profile's
            table of that level (1 where x is as small as there).
    """

    capacity: float
    footprints: tuple = ()
    hits: tuple = ()

    def hit_rate(self, counts: np.ndarray, spread: float | None = None) -> float:
        """Share of gathers (``counts`` per sector) this level serves: Che's LRU hit rate times the
        measured over the LRU hit rate of uniform gathers over the :func:`footprint` of ``counts`` (held
        at the sweep's ends beyond them; ``spread``: that footprint, when already known).

        Example (an LRU of 2 sectors that the sweep found to hit half as often at 4):
            >>> c = CacheLevel(2.0, (1.0, 2.0, 4.0), (1.0, 1.0, 0.25))
            >>> [round(c.hit_rate(n), 3) for n in (np.full(4, 8), np.array([8, 0, 0, 0]))]
            [0.25, 1.0]
            >>> round(CacheLevel(2.0).hit_rate(np.full(4, 8)), 3)
            0.5
        """
        hit = che_hit_rate(counts, self.capacity)
        if not self.footprints or hit == 0.0:
            return hit
        return hit * self.departure(footprint(counts) if spread is None else spread)

    def departure(self, spread):
        """Measured over LRU hit rate of uniform gathers over ``spread`` sectors (1 without a sweep); an
        array of spreads gives an array."""
        if not self.footprints:
            return 1.0 if np.ndim(spread) == 0 else np.ones(np.shape(spread))
        fp = np.asarray(self.footprints)
        lru = np.minimum(1.0, self.capacity / fp)
        ratio = np.minimum(np.asarray(self.hits) / lru, 1.0)
        out = np.interp(np.log(np.maximum(spread, 1.0)), np.log(fp), ratio)
        return float(out) if np.ndim(out) == 0 else out


def sweep_level(columns, ms, capacity: float, hit_columns: float, itemsize: int = 4) -> CacheLevel:
    """:class:`CacheLevel` of LRU ``capacity`` (sectors) from a profile sweep: uniform gathers over
    ``columns`` of x took ``ms``.

    The time at ``hit_columns`` (where the profile measured that level's table) counts as all hits and the
    sweep's last point as all misses; the hit share in between is linear in time. The points up to the last
    that still hits are kept (beyond it the ratio to the LRU holds).

    Example:
        >>> c = sweep_level([1000, 2000, 4000, 8000], [1.0, 1.0, 2.0, 3.0], 2000.0, hit_columns=1000, itemsize=32)
        >>> c.hits, c.footprints
        ((1.0, 1.0, 0.5), (1000.0, 2000.0, 4000.0))
    """
    cols = np.asarray(columns, dtype=np.float64)
    t = np.asarray(ms, dtype=np.float64)
    t_hit = float(np.interp(np.log(hit_columns), np.log(cols), t))
    if cols.size < 3 or t[-1] <= t_hit:
        raise ValueError("sweep_level needs at least three sizes whose last one is slower than the hit point")
    h = np.clip((t[-1] - t) / (t[-1] - t_hit), 0.0, 1.0)
    keep = int(np.flatnonzero(h > 0)[-1]) + 1
    sectors = cols * itemsize / SECTOR_BYTES
    return CacheLevel(float(capacity), tuple(sectors[:keep].tolist()), tuple(h[:keep].tolist()))


def footprint(counts: np.ndarray) -> float:
    """How many sectors the gathers effectively spread over: the perplexity exp(entropy) of their
    distribution (S for uniform gathers over S sectors, far fewer when a few are hot).

    Example:
        >>> footprint(np.array([3, 3, 3, 3, 0])), round(footprint(np.array([1000, 1, 1, 1])), 2)
        (4.0, 1.02)
    """
    c = np.asarray(counts, dtype=np.float64)
    c = c[c > 0]
    if c.size == 0:
        return 0.0
    p = c / c.sum()
    return float(np.exp(-(p * np.log(p)).sum()))


def regime_fractions(col_lengths: np.ndarray, itemsize: int, l1_sectors, l2_sectors) -> np.ndarray:
    """Fractions of gathers served by (L1, L2, device memory); they sum to 1.

    Example:
        >>> regime_fractions(np.ones(64, np.int64), 4, l1_sectors=2, l2_sectors=4).round(3).tolist()
        [0.25, 0.25, 0.5]
    """
    return sector_fractions(sector_counts(col_lengths, itemsize), l1_sectors, l2_sectors)


def sector_fractions(sectors: np.ndarray, l1_sectors, l2_sectors) -> np.ndarray:
    """:func:`regime_fractions` from the accesses per sector (:func:`sector_counts`); each capacity is a
    number of sectors or a :class:`CacheLevel`.

    Example:
        >>> sector_fractions(np.full(8, 8), l1_sectors=2, l2_sectors=4).round(3).tolist()
        [0.25, 0.25, 0.5]
        >>> sector_fractions(np.full(8, 8), CacheLevel(2.0, (4.0, 8.0), (0.5, 0.125)), 4).round(3).tolist()
        [0.125, 0.375, 0.5]
    """
    sectors = np.asarray(sectors)
    return slice_fractions(sectors, np.array([0, sectors.size]), l1_sectors, l2_sectors)[0]


def slice_fractions(sectors, cuts: np.ndarray | None, l1_sectors, l2_sectors,
                    l1_share: np.ndarray | None = None, l1_stream: np.ndarray | None = None) -> np.ndarray:
    """:func:`sector_fractions` of every slice ``sectors[cuts[i]:cuts[i + 1]]`` (a tiling's tiles), one row
    each, in a few passes over all of them: the slices with more sectors in use than a level holds solve
    Che's approximation together (:func:`che_hit_rates`); the others hit as far as the sweep says.
    ``sectors`` may be their :class:`SliceGroups` already (``cuts`` then unused). ``l1_share``: the share of
    L1 each slice holds while others' sectors share it (:func:`~tuner.model.tiled.resident_share`; None:
    all of it). ``l1_stream``: the gathers each slice makes of one SM's L1, which it finds cold
    (:func:`che_hit_rates`; None: a stream too long for its first misses to count).

    Example (the second slice's 8 sectors overflow an L1 of 2; the first's 2 do not, unless it holds half):
        >>> slice_fractions(np.array([8, 8, 1, 1, 1, 1, 1, 1, 1, 1]), np.array([0, 2, 10]), 2, 16).round(3).tolist()
        [[1.0, 0.0, 0.0], [0.25, 0.75, 0.0]]
        >>> slice_fractions(np.array([8, 8, 1, 1]), np.array([0, 2, 4]), 2, 16, l1_share=[0.5, 1.0]).round(3).tolist()
        [[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]]
    """
    levels = [c if isinstance(c, CacheLevel) else CacheLevel(float(c)) for c in (l1_sectors, l2_sectors)]
    groups = sectors if isinstance(sectors, SliceGroups) else slice_groups(sectors, cuts)
    n = groups.used.size
    spread = groups.spread() if any(c.footprints for c in levels) else None  # one for both levels
    hits = []
    for k, level in enumerate(levels):
        # A slice that holds only a share of L1 (other slices' sectors beside it) sees a smaller LRU, and
        # the sweep's departure at its footprint spread over that share.
        share = np.ones(n) if k or l1_share is None else np.clip(np.asarray(l1_share, dtype=np.float64), 1e-9, 1.0)
        hit = che_hit_rates(groups, level.capacity * share, None if k else l1_stream)
        if level.footprints:
            hit = np.where(hit == 0.0, hit, hit * level.departure(spread / share))
        hits.append(hit)
    h1, h2 = hits
    h2 = np.maximum(h2, h1)
    return np.stack([h1, h2 - h1, 1.0 - h2], axis=1)


def cache_sectors(constants: dict, level: str) -> float:
    """Effective capacity of a cache level ('l1' or 'l2') in sectors: measured, or half the nominal size.

    Example:
        >>> cache_sectors({"l1_bytes": 262144, "l2_bytes": 1 << 20}, "l1")
        4096.0
        >>> cache_sectors({"l1_bytes": 262144, "l1_sectors": 1000.0}, "l1")
        1000.0

    The families' tiles take the same share of the L1 they assume without a profile:
        >>> from tuner.families.tiles import NOMINAL_L1_BYTES, NOMINAL_L1_SECTORS
        >>> cache_sectors({"l1_bytes": NOMINAL_L1_BYTES}, "l1") == NOMINAL_L1_SECTORS
        True
    """
    measured = constants.get(f"{level}_sectors")
    if measured:
        return float(measured)
    return constants[f"{level}_bytes"] * NOMINAL_SHARE / SECTOR_BYTES


def fit_capacity(sizes: np.ndarray, times: np.ndarray) -> float:
    """Effective capacity (in the units of ``sizes``) of an LRU cache from a sweep of uniform gathers.

    ``times[i]`` is the cost of gathers spread uniformly over ``sizes[i]`` items (increasing). With hit
    rate h = min(1, K / size) the cost is miss + (hit - miss) * h; for each K of a fine logarithmic grid the
    two costs are fitted by least squares (relative errors), and the K with the smallest residual wins.

    Example:
        >>> s = np.array([1e3, 2e3, 4e3, 8e3, 16e3, 64e3])
        >>> t = 10 - 9 * np.minimum(1, 3000 / s)
        >>> round(fit_capacity(s, t))
        3000
    """
    sizes, times = np.asarray(sizes, dtype=np.float64), np.asarray(times, dtype=np.float64)
    if sizes.size < 3 or np.any(np.diff(sizes) <= 0) or np.any(times <= 0):
        raise ValueError("fit_capacity needs at least three increasing sizes and positive times")
    grid = np.exp(np.linspace(np.log(sizes[0] / 4), np.log(sizes[-1] * 4), 4001))
    h = np.minimum(1.0, grid[:, None] / sizes[None, :])  # (grid, points)
    wt = 1.0 / times  # relative errors: weigh each point by 1 / its time
    # Weighted least squares of times ~ a + b * h for every K at once (normal equations of two unknowns).
    s0, s1, s2 = (wt ** 2).sum(), (wt ** 2 * h).sum(axis=1), (wt ** 2 * h * h).sum(axis=1)
    t0, t1 = (wt ** 2 * times).sum(), (wt ** 2 * h * times).sum(axis=1)
    det = s0 * s2 - s1 * s1
    safe = np.where(np.abs(det) > 1e-300, det, np.inf)
    a, b = (t0 * s2 - s1 * t1) / safe, (s0 * t1 - s1 * t0) / safe
    err = ((wt * (a[:, None] + b[:, None] * h - times)) ** 2).sum(axis=1)
    err = np.where(np.isfinite(safe), err, np.inf)
    return float(grid[int(np.argmin(err))])
