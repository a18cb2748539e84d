"""Model equations against hand-worked examples (paper 003 eq. 1-5, paper 004 Algorithms 1 and 3)."""
import contextlib
from dataclasses import replace

import numpy as np
import pytest
import scipy.sparse as sp

from tuner import families
from tuner.families import base
from tuner.families.base import Specialization
from tuner.families.binned import BinnedParams
from tuner.families.csr_vector import CsrVectorParams
from tuner.formats.binned import build_binned
from tuner.matrix import canonicalize
from tuner.model import Profile, load_profile, predict_baseline, predict_lookup, predict_many
from tuner.model.aligned_coo import choose_hybrid, cost_aligned_coo_seg, cost_coo_flat, segment_size
from tuner.model.locality import (CacheLevel, cache_sectors, che_hit_rate, fit_capacity, footprint, regime_fractions,
                                  sweep_level)
from tuner.model.occupancy import active_warps_per_sm
from tuner.model.profile_data import REGIMES, warp_rows
from tuner.model.warps import WarpHistogram, warp_segments
from tuner.model.waves import wave_time

from .conftest import power_law
from .fake_profile import fake_profile_json


@pytest.fixture
def profile():
    return Profile.from_json(fake_profile_json())


# The fake GPU as one SM of all its warp slots: every launch fills it, so tests of the tail and work
# arithmetic need not deal blocks out to SMs.
ONE_SM = {"sm_count": 1, "max_warps_per_sm": 1000}


@pytest.fixture
def one_sm():
    return Profile.from_json(fake_profile_json(**ONE_SM))


def test_waves_follow_equations_1_to_5():
    sizes = np.array([4.0, 4.0, 8.0, 8.0, 2.0])
    perf = np.array([2.0, 2.0, 4.0, 2.0, 1.0])
    # I = ceil(5 / 2) = 3 waves; eq. 5's plain mean: t_0 = 8 / 2, t_1 = 16 / 3, t_2 = 2 / 1.
    assert wave_time(sizes, perf, 2, mean="plain") == pytest.approx(4 + 16 / 3 + 2)
    # Work-weighted mean: each warp's entries at its own rate: 4/2 + 4/2, 8/4 + 8/2, 2/1.
    assert wave_time(sizes, perf, 2) == pytest.approx(4 + 6 + 2)
    # The kernel lasts at least as long as its slowest warp alone (critical path), not each wave.
    assert wave_time(sizes, perf, 2, alone=np.array([1.0, 1.0, 9.0, 1.0, 5.0])) == pytest.approx(12)
    assert wave_time(sizes, perf, 2, alone=np.array([1.0, 1.0, 20.0, 1.0, 5.0])) == pytest.approx(20)
    assert wave_time(np.array([]), np.array([]), 4) == 0.0



def test_one_full_wave_of_equal_warps_takes_total_over_performance():
    assert wave_time(np.full(100, 10.0), np.full(100, 50.0), 100) == pytest.approx(1000 / 50)


def test_csr_vector_warps_are_as_wide_as_their_longest_row():
    m = canonicalize(sp.csr_matrix((np.ones(10, np.float32), ([0, 0, 0, 1, 2, 2, 3, 4, 4, 4],
                                                                 [0, 1, 2, 0, 0, 1, 3, 0, 1, 2])), shape=(5, 5)))
    seg, = warp_segments(m, "csr_vector", CsrVectorParams(threads_per_row=16))  # 2 rows per warp
    # Warps (rows 0-1), (2-3), (4): shapes 3, 2, 3 streaming 4, 3, 3 entries.
    assert seg.warps.w.tolist() == [2, 3] and seg.warps.count.tolist() == [1.0, 2.0]
    assert seg.warps.size.tolist() == [3.0, 7.0]
    assert seg.key == "csr_vector:16:256:vf"


def test_whole_warp_rows_come_from_the_row_length_histogram():
    m = canonicalize(power_law(3000, seed=4))
    seg, = warp_segments(m, "csr_vector", CsrVectorParams(threads_per_row=32))
    w, size = seg.warps.expand()
    # Empty rows are warps too: they are launched and take their slot.
    assert (m.row_lengths == 0).any()
    assert sorted(w.tolist()) == sorted(m.row_lengths.astype(float).tolist())
    assert size.sum() == m.nnz
    # The same rows through the row-per-warp pass agree with the grouped pass at one row per warp.
    g = WarpHistogram.of_warps(m.row_lengths, m.row_lengths)
    assert g.w.tolist() == seg.warps.w.tolist() and g.count.tolist() == seg.warps.count.tolist()
    assert g.size.tolist() == seg.warps.size.tolist()


def test_warps_of_every_group_size_equal_rows_grouped_directly():
    # Each halving of the rows per warp reuses the one before; the direct reshape is the definition.
    from tuner.model.warps import group_histograms
    for n in (1, 31, 33, 1000, 3001):
        L = np.random.default_rng(n).zipf(1.7, n) % 300
        for g, h in group_histograms(L).items():
            per = 32 // g
            padded = np.zeros(-(-n // per) * per, np.int64)
            padded[:n] = L
            w, size = padded.reshape(-1, per).max(axis=1), padded.reshape(-1, per).sum(axis=1)
            assert h.warps == -(-n // per) and h.size.sum() == L.sum()
            assert h.w.tolist() == np.unique(w).tolist()
            assert h.count.tolist() == np.bincount(w)[np.unique(w)].tolist()
            assert h.size.tolist() == np.bincount(w, weights=size)[np.unique(w)].tolist()


def _rows_of_lengths(L, n_cols=1000):
    """A pattern-free CSR whose row i holds columns 0 .. L[i] - 1."""
    indptr = np.concatenate([[0], np.cumsum(L)])
    cols = np.arange(indptr[-1]) - np.repeat(indptr[:-1], L)
    vals = np.random.default_rng(0).uniform(1, 2, cols.size).astype(np.float32)
    return canonicalize(sp.csr_matrix((vals, cols, indptr), shape=(L.size, n_cols)))


@pytest.mark.parametrize("group", [1, 2, 4, 8, 16])
def test_short_row_lane_groups_of_a_large_matrix_are_counted_on_a_sample_within_a_percent(monkeypatch, group):
    # Rows in no order, in regions of different mixes (as a crawl's sites): the sample's runs span them.
    from tuner.model import warps
    rng = np.random.default_rng(7)
    n = 400_000
    L = np.concatenate([rng.zipf(1.8, n // 2) % 200, rng.integers(0, 40, n // 2)])
    m = _rows_of_lengths(L)
    exact = {c: warps.group_histograms(warps.class_lengths(m, *c))[group] for c in ((0, 8), (4, 96), (0, None))}
    monkeypatch.setattr(warps, "SAMPLE_ROWS", 1 << 16)  # a sixth of the rows (the default: a sixteenth of rmat:25's)
    monkeypatch.setattr(warps, "SAMPLE_RUNS", 64)
    assert warps.row_sample(m).n_rows == 1 << 16
    for c, h in exact.items():
        got = warps.lane_groups(m, *c, (group,))[group]
        if c[1] is None:  # open to long rows: counted whole
            assert np.array_equal(got.count, h.count) and np.array_equal(got.size, h.size)
            continue
        assert abs(got.count.sum() / h.count.sum() - 1) < 0.01
        assert abs(got.size.sum() / h.size.sum() - 1) < 0.01
        # What the model sums: warps weighted by their shape's width.
        assert abs((got.w * got.count).sum() / (h.w * h.count).sum() - 1) < 0.02


def test_sorted_and_small_matrices_are_never_sampled(monkeypatch):
    from tuner.model import warps
    L = np.random.default_rng(8).integers(0, 50, 5000)
    monkeypatch.setattr(warps, "SAMPLE_ROWS", 1000)
    assert warps.row_sample(_rows_of_lengths(np.sort(L)[::-1])) is None
    assert warps.row_sample(_rows_of_lengths(L)) is not None
    monkeypatch.setattr(warps, "SAMPLE_ROWS", 5000)
    m = _rows_of_lengths(L)
    assert warps.row_sample(m) is None
    h = warps.lane_groups(m, 0, None, (4,))[4]
    assert h.warps == -(-L.size // 8) and h.size.sum() == L.sum()


def test_narrow_and_sorted_row_classes_give_the_warps_of_the_plain_pass():
    # Short-row classes keep their lengths in uint8 (rows of 255 and more clip to 255, so a class ending at
    # 255 must not take them), and rows sorted by decreasing length give each class as a slice.
    from tuner.model.warps import class_lengths, group_histograms
    rng = np.random.default_rng(5)
    lengths = np.concatenate([rng.integers(0, 300, 3000), [255, 256, 254, 1000, 0]])
    for L in (lengths, np.sort(lengths)[::-1]):
        indptr = np.concatenate([[0], np.cumsum(L)])
        cols = np.arange(indptr[-1]) - np.repeat(indptr[:-1], L)  # row i holds columns 0 .. L[i] - 1
        m = canonicalize(sp.csr_matrix((np.ones(cols.size, np.float32), cols, indptr), shape=(L.size, 1000)))
        for lo, hi in ((0, 4), (4, 96), (8, 255), (250, 255), (96, None), (0, None)):
            ref = L[(L >= lo) & (L < (hi if hi is not None else np.inf))]
            got = class_lengths(m, lo, hi)
            assert got.tolist() == ref.tolist()
            assert got.dtype == (np.uint8 if hi is not None and hi <= 255 else np.int64)
            want, have = group_histograms(ref.astype(np.int64)), group_histograms(got)
            for g in want:
                assert (have[g].w.tolist(), have[g].count.tolist(), have[g].size.tolist()) == \
                    (want[g].w.tolist(), want[g].count.tolist(), want[g].size.tolist())


def test_sorted_rows_give_every_class_s_warps_from_the_length_histogram_alone():
    # Rows by decreasing length (a degree-ordered rectangular matrix): a class's warps come from the
    # count of rows of each length, with no pass over the rows, and equal the pass over them.
    from tuner.model.warps import class_lengths, group_histograms, lane_groups
    rng = np.random.default_rng(8)
    L = np.sort(np.concatenate([rng.zipf(1.6, 4000) % 700, [0] * 50]))[::-1]
    indptr = np.concatenate([[0], np.cumsum(L)])
    cols = np.arange(indptr[-1]) - np.repeat(indptr[:-1], L)
    m = canonicalize(sp.csr_matrix((np.ones(cols.size, np.float32), cols, indptr), shape=(L.size, 700)))
    for lo, hi in ((0, 4), (0, 8), (4, 96), (8, 32), (96, None), (0, None), (600, 601)):
        got = lane_groups(m, lo, hi, (1, 2, 4, 8, 16))
        want = group_histograms(class_lengths(m, lo, hi).astype(np.int64))
        for g in want:
            assert (got[g].w.tolist(), got[g].count.tolist(), got[g].size.tolist()) == \
                (want[g].w.tolist(), want[g].count.tolist(), want[g].size.tolist())


def test_classes_inside_another_are_filtered_from_its_rows_with_the_same_warps():
    from tuner.model.warps import (SegmentSpec, class_lengths, group_histograms, histogram, outer_classes, prebuild,
                                   rows_descending)
    assert outer_classes([(4, 16), (4, 96), (8, 96), (0, 8), (0, 4), (0, None), (8, 300)]) == \
        {(4, 16): (4, 96), (8, 96): (4, 96), (0, 4): (0, 8)}
    m = canonicalize(power_law(3000, seed=21))
    assert not rows_descending(m)  # the rows in no order: each class is filtered
    segs = [SegmentSpec(lo, hi, g, 128) for lo, hi in ((4, 16), (4, 96), (8, 32), (0, 8), (0, 4)) for g in (4, 8)]
    prebuild(m, segs, workers=2)
    L = m.row_lengths
    for s in segs:
        want = group_histograms(L[(L >= s.lo) & (L < s.hi)], (s.group,))[s.group]
        h = histogram(m, s)
        assert (h.w.tolist(), h.count.tolist(), h.size.tolist()) == (want.w.tolist(), want.count.tolist(),
                                                                    want.size.tolist())
    with pytest.raises(ValueError, match="do not hold"):
        class_lengths(m, 2, 20, within=(4, 16, np.zeros(3, np.uint8)))


def test_candidates_and_predictions_built_together_equal_those_built_in_turn(profile):
    from tuner.model import predicted_candidates
    A = power_law(5000, seed=22)
    specs, predicted = predicted_candidates(canonicalize(A), profile)
    m = canonicalize(A)
    alone = families.specializations(m, profile=profile)
    assert [s.label() for s in specs] == [s.label() for s in alone]
    assert predicted == predict_many(m, alone, profile)
    assert len({s.family for s in specs}) == 5


@pytest.mark.parametrize("names", [["tile_coo"], ["csr_vector", "binned"], []])
def test_candidates_of_some_families_are_those_families_alone(profile, names):
    from tuner.model import predicted_candidates
    m = canonicalize(power_law(5000, seed=23))
    specs, predicted = predicted_candidates(m, profile, names)
    assert sorted({s.family for s in specs}) == sorted(names)
    assert [s.label() for s in specs] == [s.label() for s in families.specializations(m, names, profile=profile)]
    assert len(predicted) == len(specs) and all(p > 0 for p in predicted)


def test_caller_order_predictions_made_early_give_the_plan_made_at_once(profile, monkeypatch):
    from tuner.model import lookup
    A = power_law(5000, seed=25)
    specs, predicted = lookup.predicted_candidates(canonicalize(A), profile)
    m = canonicalize(A)
    known = lookup.caller_order_predictions(m, profile)
    assert known and all(label.endswith("order=none)") for label in known)
    assert set(known) == {s.label() for s in specs
                          if s.family in ("csr_vector", "binned", "aligned_coo") and s.params.order == "none"}
    asked = []
    real = lookup.predict_many

    def recording(m, specs, *a, **k):
        asked.extend(s.label() for s in specs)
        return real(m, specs, *a, **k)
    monkeypatch.setattr(lookup, "predict_many", recording)
    again, again_predicted = lookup.predicted_candidates(m, profile, known=known)
    assert [s.label() for s in again] == [s.label() for s in specs] and again_predicted == predicted
    assert asked and not set(asked) & set(known)  # the known ones were not predicted again


def test_caller_order_predictions_still_being_made_are_waited_for_after_the_others(profile, monkeypatch):
    # A compile hands the planner a callable for the predictions its digest thread is still making: the
    # planner predicts everything else first, then takes them, and plans as it would have at once.
    from tuner.model import lookup
    A = power_law(5000, seed=25)
    specs, predicted = lookup.predicted_candidates(canonicalize(A), profile)
    m = canonicalize(A)
    known = lookup.caller_order_predictions(m, profile)
    asked, seen_then = [], []
    real = lookup.predict_many

    def recording(m, specs, *a, **k):
        asked.extend(s.label() for s in specs)
        return real(m, specs, *a, **k)
    monkeypatch.setattr(lookup, "predict_many", recording)

    def later():
        seen_then.extend(asked)
        return known
    again, again_predicted = lookup.predicted_candidates(m, profile, known=later)
    assert [s.label() for s in again] == [s.label() for s in specs] and again_predicted == predicted
    others = {s.label() for s in specs} - set(known)
    assert set(seen_then) == others and set(asked) == others  # all of them before later(); none of its own


def test_caller_order_predictions_that_failed_are_made_by_the_planner(profile):
    from tuner.model import lookup
    A = power_law(5000, seed=26)
    specs, predicted = lookup.predicted_candidates(canonicalize(A), profile)
    again, again_predicted = lookup.predicted_candidates(canonicalize(A), profile, known=lambda: None)
    assert [s.label() for s in again] == [s.label() for s in specs] and again_predicted == predicted
    partial = dict(list(lookup.caller_order_predictions(canonicalize(A), profile).items())[:3])
    _, with_some = lookup.predicted_candidates(canonicalize(A), profile, known=lambda: partial)
    assert with_some == predicted


def test_a_layout_asked_for_on_many_threads_at_once_is_built_once():
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor
    from tuner.families.base import shared_layout
    m = canonicalize(power_law(100, seed=23))
    calls = []

    def build():
        calls.append(threading.get_ident())
        time.sleep(0.05)  # long enough for every thread to ask while it is being built
        return object()
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda _: shared_layout(m, ("test-once",), build), range(8)))
    assert len(calls) == 1 and all(g is got[0] for g in got)


def test_binned_warps_follow_the_layout_classes():
    m = canonicalize(power_law(2000, seed=3))
    p = BinnedParams(small_max=4, medium_max=32, warp_division=8, huge_min=64)
    segs = warp_segments(m, "binned", p)
    counts = build_binned(m.row_lengths, 4, 32, 64).counts
    assert [s.key.split(":")[1] for s in segs] == ["1", "4", "32", "block"]
    assert segs[0].warps.warps == -(-counts[0] // 32)
    assert segs[1].warps.warps == -(-counts[1] // 8)
    assert segs[2].warps.warps == counts[2]
    assert segs[3].warps.warps == counts[3] * 256 // 32
    assert segs[3].warps.size.sum() >= m.row_lengths[m.row_lengths >= 64].sum()


def test_gather_regimes_count_sectors_not_columns():
    # 64 columns read once each are 8 sectors of 8 reads: caches of 2 and 4 sectors hit a quarter and a half.
    assert regime_fractions(np.ones(64, np.int64), 4, l1_sectors=2, l2_sectors=4).tolist() == pytest.approx(
        [0.25, 0.25, 0.5])
    # The same reads in float64 span 16 sectors: the same caches hold half as much of x.
    assert regime_fractions(np.ones(64, np.int64), 8, 2, 4).tolist() == pytest.approx([0.125, 0.125, 0.75])
    # x that fits in L1 is served there entirely; a matrix with no entries gathers nothing from memory.
    assert regime_fractions(np.arange(100), 4, l1_sectors=64, l2_sectors=128).tolist() == [1.0, 0.0, 0.0]
    assert regime_fractions(np.zeros(5, np.int64), 4, 1, 1).tolist() == [1.0, 0.0, 0.0]


def test_scattered_hot_columns_fill_more_sectors_than_clustered_ones():
    hot = np.zeros(8192, np.int64)
    hot[:512] = 100  # 512 hot columns side by side: 64 sectors
    scattered = np.zeros(8192, np.int64)
    scattered[::16] = 100  # 512 hot columns, one per sector pair: 512 sectors
    cold = np.ones(8192, np.int64)
    clustered_l1 = regime_fractions(hot + cold, 4, l1_sectors=128, l2_sectors=1024)[0]
    scattered_l1 = regime_fractions(scattered + cold, 4, l1_sectors=128, l2_sectors=1024)[0]
    assert clustered_l1 > 0.8 > 0.4 > scattered_l1


def test_che_hit_rate_matches_lru_simulation():
    # Zipf-like requests: compare with an exact LRU simulated on a long random stream.
    from collections import OrderedDict
    counts = (1000 / np.arange(1, 201) ** 1.1).astype(np.int64) + 1
    rng = np.random.default_rng(0)
    stream = rng.choice(counts.size, size=60000, p=counts / counts.sum())
    cache, hits = OrderedDict(), 0
    for item in stream.tolist():
        if item in cache:
            hits += 1
            cache.move_to_end(item)
        else:
            cache[item] = None
            if len(cache) > 20:
                cache.popitem(last=False)
    assert che_hit_rate(counts, 20) == pytest.approx(hits / stream.size, abs=0.02)
    assert che_hit_rate(counts, 200) == 1.0 and che_hit_rate(counts, 0) == 0.0


def test_che_hit_rates_solve_every_slices_equation_at_once():
    # Power-law slices of different sizes and capacities, one solved by Newton's method together: each
    # slice's T must solve its own occupancy equation (found here by a bracketing root finder).
    from scipy.optimize import brentq
    from tuner.model.locality import che_hit_rates, slice_groups
    rng = np.random.default_rng(3)
    sizes = [500, 40, 3000, 1200]
    sectors = np.concatenate([(rng.pareto(1.2, n) * 5).astype(np.int64) for n in sizes])
    cuts = np.concatenate([[0], np.cumsum(sizes)])
    capacity = np.array([100.0, 60.0, 900.0, 1.0])
    got = che_hit_rates(slice_groups(sectors, cuts), capacity)
    for i in range(len(sizes)):
        c = sectors[cuts[i]:cuts[i + 1]]
        p = c[c > 0] / c.sum()
        if p.size <= capacity[i]:
            assert got[i] == 1.0
            continue
        t = brentq(lambda t: (1 - np.exp(-p * t)).sum() - capacity[i], 0, 1e12, xtol=1e-9, rtol=1e-14)
        assert got[i] == pytest.approx((p * (1 - np.exp(-p * t))).sum(), rel=1e-9)
    assert got[1] == 1.0 and 0 < got[3] < got[0] < 1  # the 40 sectors fit in 60; one sector of capacity hits least


def test_che_hit_rates_of_a_short_stream_count_its_first_misses():
    # Streams of 300 Zipf-like requests into an LRU that starts empty, simulated many times: with room for
    # 20 sectors (capacity misses too) and for all of them (only the first touches miss).
    from collections import OrderedDict
    from tuner.model.locality import che_hit_rates, slice_groups
    counts = (1000 / np.arange(1, 201) ** 1.1).astype(np.int64) + 1
    rng = np.random.default_rng(1)
    streams = rng.choice(counts.size, size=(400, 300), p=counts / counts.sum())
    for capacity in (20, 1000):
        hits = 0
        for stream in streams.tolist():
            cache = OrderedDict()
            for item in stream:
                if item in cache:
                    hits += 1
                    cache.move_to_end(item)
                else:
                    cache[item] = None
                    if len(cache) > capacity:
                        cache.popitem(last=False)
        got = che_hit_rates(slice_groups(counts, np.array([0, counts.size])), np.array([float(capacity)]),
                            stream=np.array([300.0]))[0]
        assert got == pytest.approx(hits / streams.size, abs=0.02)
        assert got < che_hit_rate(counts, capacity) - (0.01 if capacity == 20 else 0.2)  # the first touches


def test_fit_capacity_recovers_the_capacity_of_a_measured_sweep():
    sizes = 2.0 ** np.arange(10, 20)
    times = 3.0 + 7.0 * (1 - np.minimum(1, 40000 / sizes))
    noisy = times * (1 + 0.01 * np.random.default_rng(1).standard_normal(sizes.size))
    assert fit_capacity(sizes, noisy) == pytest.approx(40000, rel=0.1)
    with pytest.raises(ValueError, match="increasing"):
        fit_capacity(sizes[::-1], times)


def test_cache_capacity_prefers_the_measured_value():
    assert cache_sectors({"l2_bytes": 1 << 20, "l2_sectors": 123.0}, "l2") == 123.0
    assert cache_sectors({"l2_bytes": 1 << 20}, "l2") == (1 << 20) / 2 / 32


def test_cache_level_reproduces_the_sweep_for_uniform_gathers():
    # A sweep whose cache serves everything up to 1024 sectors, then fades faster than an LRU would.
    cols = [2048, 4096, 8192, 16384, 32768, 65536]  # float32: 256 .. 8192 sectors
    ms = [1.0, 1.0, 1.2, 1.7, 1.95, 2.0]
    level = sweep_level(cols, ms, capacity=1500.0, hit_columns=2048)
    assert level.footprints == (256.0, 512.0, 1024.0, 2048.0, 4096.0)
    assert level.hits == pytest.approx((1.0, 1.0, 0.8, 0.3, 0.05))
    for sectors, measured in ((1024, 0.8), (2048, 0.3), (4096, 0.05)):
        assert level.hit_rate(np.full(sectors, 7)) == pytest.approx(measured, rel=1e-6)
    # Beyond the sweep the ratio to the LRU holds: 0.05 / (1500 / 4096) of Che's 1500 / 16384.
    assert level.hit_rate(np.full(16384, 7)) == pytest.approx(0.05 / (1500 / 4096) * 1500 / 16384, rel=1e-6)
    # A few hot sectors among many cold ones still hit (Che), far more than uniform gathers over as many.
    skewed = np.ones(16384, np.int64)
    skewed[:200] = 5000
    assert level.hit_rate(skewed) > 0.9 > 0.3 > level.hit_rate(np.ones(16384, np.int64))
    # Without a sweep the level is Che's LRU of its capacity.
    assert CacheLevel(1500.0).hit_rate(np.full(3000, 7)) == pytest.approx(0.5, rel=1e-6)
    with pytest.raises(ValueError, match="three sizes"):
        sweep_level([2048, 4096], [1.0, 2.0], 1500.0, 2048)


def test_cache_level_reads_the_profile_sweep_or_falls_back_to_the_fitted_capacity():
    from tuner.model.tables import cache_level
    constants = {"l1_sectors": 1500.0, "l1_bytes": 262144}
    sweep = {"columns": [2048, 4096, 8192, 16384], "ms": [1.0, 1.0, 1.5, 2.0], "sectors": 1500.0}
    prof = Profile(gpu={}, constants=constants, tables={}, digest="d", caches={"l1": sweep},
                   regime_columns={"l1": 2048})
    assert cache_level(prof, "l1") == CacheLevel(1500.0, (256.0, 512.0, 1024.0), (1.0, 1.0, 0.5))
    flat = dict(sweep, ms=[1.0, 1.0, 1.0, 1.0])  # nothing to read off: the LRU of the fitted capacity
    assert cache_level(replace(prof, caches={"l1": flat}), "l1") == CacheLevel(1500.0)
    assert cache_level(replace(prof, caches={}), "l1") == CacheLevel(1500.0)


def test_a_warp_full_of_rows_alone_blends_from_one_row_to_the_full_warp_by_how_full_it_is():
    one = {r: {"1": 1e-3, "64": 2e-3} for r in REGIMES}
    full = {r: {"1": 3e-3, "64": 6e-3} for r in REGIMES}
    prof = Profile(gpu={}, constants={}, tables={}, digest="f", alone={"csr_vector:4:256:v": one},
                   alone_warp={"csr_vector:4:256:v": full})
    w = np.array([64.0, 64.0, 64.0, 1.0])
    got = prof.alone_time("csr_vector:4:256:v", "l1", w, fill=np.array([0.0, 0.5, 1.0, 1.0]))
    assert got.tolist() == pytest.approx([2e-3, 4e-3, 6e-3, 3e-3])
    assert prof.alone_time("csr_vector:4:256:v", "l1", w).tolist() == pytest.approx([2e-3] * 3 + [1e-3])
    assert warp_rows("csr_vector:4:256:v") == 8 and warp_rows("csr_vector:32:256:v") == 1


def test_one_hub_row_among_short_ones_runs_as_one_row_and_a_warp_of_long_rows_as_the_full_warp():
    import json
    raw = json.loads(fake_profile_json(tail_factor=1.0, max_active=1))
    raw["alone_warp"] = {k: {r: {w: 50 * t for w, t in pts.items()} for r, pts in v.items()}
                         for k, v in raw["alone"].items() if k.startswith("csr_vector:1:")}
    with_warp, without = Profile.from_json(json.dumps(raw)), Profile.from_json(fake_profile_json(tail_factor=1.0,
                                                                                                 max_active=1))
    spec = lambda m: Specialization("csr_vector", CsrVectorParams(1, 128), m.value_dtype, m.index_dtype, m.value_free)

    def matrix(lengths):
        rows = np.repeat(np.arange(len(lengths)), lengths)
        cols = np.concatenate([np.arange(n) for n in lengths])
        return canonicalize(sp.csr_matrix((np.ones(rows.size), (rows, cols)), shape=(len(lengths), 4096)))
    uniform, hub = matrix([256] * 32), matrix([256] + [1] * 31)
    # 32 rows of 256 fill their warp: its time alone is the full warp's (50 times the one row's here).
    assert predict_lookup(uniform, spec(uniform), with_warp) > 10 * predict_lookup(uniform, spec(uniform), without)
    # One row of 256 among 31 of one entry: the warp is 1/32 full and runs nearly as that one row.
    assert predict_lookup(hub, spec(hub), with_warp) < 4 * predict_lookup(hub, spec(hub), without)


def test_footprint_is_the_number_of_sectors_uniform_gathers_would_spread_over():
    assert footprint(np.full(300, 4)) == pytest.approx(300)
    assert footprint(np.array([0, 0, 9])) == pytest.approx(1.0) and footprint(np.zeros(3)) == 0.0
    assert 1 < footprint(np.array([1000, 1, 1, 1, 1])) < 1.1


def test_slices_get_the_shares_each_gets_alone():
    # Several tiles' sector counts at once, against the H100 profile's measured levels (sweeps and all):
    # every slice's row is exactly what sector_fractions gives that slice alone, including slices too
    # large for the L1 (their own solve of Che's approximation) and a slice of nothing.
    from tuner.model.locality import sector_fractions, slice_fractions
    from tuner.model.tables import cache_level
    profile = load_profile("NVIDIA H100 80GB HBM3")
    l1, l2 = cache_level(profile, "l1"), cache_level(profile, "l2")
    rng = np.random.default_rng(5)
    sectors = np.concatenate([rng.zipf(1.6, 1000), rng.integers(0, 3, 9000), np.zeros(50, np.int64),
                              rng.zipf(2.2, 20000)])
    cuts = np.array([0, 1000, 10000, 10050, 30050])
    each = slice_fractions(sectors, cuts, l1, l2)
    for row, a, b in zip(each, cuts[:-1], cuts[1:]):
        assert row.tolist() == sector_fractions(sectors[a:b], l1, l2).tolist()
    assert each[0].tolist() == each[2].tolist() == [1.0, 0.0, 0.0]  # fits the L1; nothing gathered
    assert 0.5 < each[3, 0] < each[1, 0] < 0.9 and np.allclose(each.sum(axis=1), 1.0)


def test_h100_profile_l1_serves_fewer_gathers_of_the_widest_tile():
    # The tile widths are a quarter of the L1's columns and its multiples: uniform gathers over the widest
    # tile's slice of x hit the L1 measurably less often than over the narrower ones (the sweep of the
    # committed profile); an LRU of the fitted capacity would serve all three alike.
    from tuner.formats.tiles import tile_widths
    from tuner.model.tables import cache_level
    profile = load_profile("NVIDIA H100 80GB HBM3")
    level = cache_level(profile, "l1")
    widths = tile_widths(cache_sectors(profile.constants, "l1"), 4, 10 ** 7)
    hits = [level.hit_rate(np.full(w // 8, 3)) for w in widths]
    assert hits[0] > 0.98 and hits[0] >= hits[1] > hits[2] + 0.03
    assert [che_hit_rate(np.full(w // 8, 3), level.capacity) for w in widths[:2]] == [1.0, 1.0]
    assert cache_level(profile, "l2").hit_rate(np.full(40000, 3)) > 0.99


def test_lookup_prediction_equals_hand_computation(profile):
    # 64 rows of 4 entries in 16 columns (x in L1); csr_vector with 4 lanes: 8 warps of 8 rows, each 4 x 8.
    rows = np.repeat(np.arange(64), 4)
    cols = np.tile(np.arange(4), 64)
    m = canonicalize(sp.csr_matrix((np.ones(256, np.float32), (rows, cols)), shape=(64, 16)))
    spec = Specialization("csr_vector", CsrVectorParams(4, 128), m.value_dtype, m.index_dtype, True)
    perf = 1.0e6 * 4 / 64  # the fake table at w = 4, L1 regime, for all 10 SMs of the fake GPU
    one_wave = 8 * 32 / perf
    alone = 4e-4 * 4 / 4  # a warp of rows of 4 on 4 lanes, alone; the fake profile's tail factor is 1
    assert one_wave > one_wave / 2 + alone  # the slowest warp, started halfway, ends before the wave
    # The 8 warps are 2 blocks of 128 threads: they run on 2 of the 10 SMs, each at a tenth of the table.
    assert predict_lookup(m, spec, profile) == pytest.approx(0.004 + one_wave * 10 / 2)
    # One row of 6400 entries on 4 lanes takes 0.64 ms alone, far longer than its throughput share.
    long = canonicalize(sp.csr_matrix((np.ones(6400, np.float32), (np.zeros(6400, int), np.arange(6400))),
                                      shape=(1, 6400)))
    spec1 = Specialization("csr_vector", CsrVectorParams(4, 128), long.value_dtype, long.index_dtype, True)
    work = 6400 / 1.0e6  # the fake table is flat at 1e6 entries/ms beyond w = 64
    assert predict_lookup(long, spec1, profile) == pytest.approx(0.004 + work / 2 + 4e-4 * 6400 / 4)


def test_a_launch_of_fewer_blocks_than_sms_runs_at_the_busiest_sms_share(profile):
    # Rows of 4 entries in 16 columns on 4 lanes: a block of 128 threads holds 32 rows. On the fake GPU's
    # 10 SMs, 2 blocks leave 8 SMs idle and 20 blocks give every SM 2: the second launch has 10 times the
    # work and takes twice as long; 30 blocks leave its busiest SMs 3 (time 3/2 of 20's, not 30/20).
    def beyond_launch(blocks):
        n = 32 * blocks
        ij = (np.repeat(np.arange(n), 4), np.tile(np.arange(4), n))
        m = canonicalize(sp.csr_matrix((np.ones(4 * n, np.float32), ij), shape=(n, 16)))
        spec = Specialization("csr_vector", CsrVectorParams(4, 128), m.value_dtype, m.index_dtype, True)
        return predict_lookup(m, spec, profile) - 0.004
    t2, t20, t30 = beyond_launch(2), beyond_launch(20), beyond_launch(30)
    assert t20 == pytest.approx(2 * t2)
    assert t30 == pytest.approx(3 * t2)


def test_a_small_launch_lasts_at_least_its_shapes_measured_floor(profile):
    # The 64 rows of 4 entries of the hand computation above: 2 blocks of 4 warps (4 lanes per row), so the
    # busiest SM holds 4 warps. With the floor measured for that shape, the launch lasts at least its
    # floor at 4 warps per SM; a launch of 2,000 blocks (200 per SM, 800 warps) outgrows its floor.
    import json

    def launch(n_rows):
        ij = (np.repeat(np.arange(n_rows), 4), np.tile(np.arange(4), n_rows))
        return canonicalize(sp.csr_matrix((np.ones(4 * n_rows, np.float32), ij), shape=(n_rows, 16)))

    raw = json.loads(fake_profile_json())
    raw["occupancy"] = {"width": 4, "shapes": {"csr_vector:4:128:vf": {"warps_per_sm": [2, 8, 96],
                                                                          "busy_ms": [0.04, 0.06, 0.1]}}}
    floored = Profile.from_json(json.dumps(raw))
    small, large = launch(64), launch(64_000)
    spec = lambda m: Specialization("csr_vector", CsrVectorParams(4, 128), m.value_dtype, m.index_dtype, True)  # noqa
    one_wave = 8 * 32 / (1.0e6 * 4 / 64)
    assert predict_lookup(small, spec(small), profile) == pytest.approx(0.004 + one_wave * 10 / 2)
    assert predict_lookup(small, spec(small), floored) == pytest.approx(0.004 + 0.05)  # halfway in log2 from 2 to 8
    assert predict_lookup(large, spec(large), floored) == predict_lookup(large, spec(large), profile) > 0.104
    # A shape the profile measured no floor for is predicted as before.
    other = Specialization("csr_vector", CsrVectorParams(8, 128), small.value_dtype, small.index_dtype, True)
    assert predict_lookup(small, other, floored) == predict_lookup(small, other, profile)


def test_a_hybrids_seg_lanes_last_at_least_their_chains_floor_at_their_own_warps_per_sm(profile):
    # 64 rows of 40 entries: the hybrid sends 32 of each row to its flat warps (64 warps, 8 blocks) and the
    # other 8 to 64 seg lanes of 8 slots (2 warps, 1 block: 8 warps on its SM). The flat part carries most
    # of the work, but the seg lanes' chains, measured at 4 and 16 slots, set the launch's time.
    import json
    from tuner.families.aligned_coo import AlignedCooParams
    ij = (np.repeat(np.arange(64), 40), np.tile(np.arange(40), 64))
    m = canonicalize(sp.csr_matrix((np.ones(64 * 40, np.float32), ij), shape=(64, 64)))
    spec = Specialization("aligned_coo", AlignedCooParams("hybrid", 256, "none"), m.value_dtype, m.index_dtype, True)
    segs = [s for s in warp_segments(m, "aligned_coo", spec.params) if s.warps.w.size]
    assert [(s.key, s.warps.w.tolist(), s.warps.warps) for s in segs] == [
        ("aligned_coo:seg:256:vf", [8], 2), ("aligned_coo:hflat:256:vf", [32], 64)]
    raw = json.loads(fake_profile_json())
    narrow = {"width": 4, "warps_per_sm": [2, 32], "busy_ms": [1e-5, 2e-5]}
    raw["occupancy"] = {"width": 4, "shapes": {"aligned_coo:hflat:256:vf": dict(narrow, width=32),
                                                "aligned_coo:seg:256:vf": dict(narrow)}}
    narrow_only = Profile.from_json(json.dumps(raw))
    raw["occupancy"]["shapes"]["aligned_coo:seg:256:vf"]["by_width"] = [
        {"width": 16, "warps_per_sm": [2, 32], "busy_ms": [0.04, 0.06]}]
    chained = Profile.from_json(json.dumps(raw))
    before = predict_lookup(m, spec, narrow_only)
    assert before == predict_lookup(m, spec, profile) < 0.02  # the narrow floors are below its other terms
    # 8 warps per SM: halfway in log2 between 2 and 32; 8 slots: halfway in log2 between 4 and 16.
    assert predict_lookup(m, spec, chained) == pytest.approx(0.004 + (1.5e-5 + 0.05) / 2)
    # The all-flat layout has no chain: its prediction is unchanged.
    flat = replace(spec, params=AlignedCooParams("flat", 256, "none"))
    assert predict_lookup(m, flat, chained) == predict_lookup(m, flat, narrow_only)


def test_tail_factor_scales_the_slowest_warp():
    import json
    long = canonicalize(sp.csr_matrix((np.ones(6400, np.float32), (np.zeros(6400, int), np.arange(6400))),
                                      shape=(1, 6400)))
    spec = Specialization("csr_vector", CsrVectorParams(4, 128), long.value_dtype, long.index_dtype, True)
    t = {f: predict_lookup(long, spec, Profile.from_json(fake_profile_json(tail_factor=f))) for f in (0.0, 2.0)}
    work = 6400 / 1.0e6
    assert t[0.0] == pytest.approx(0.004 + work * 10)  # no slowdown: the row is the work, of one SM of 10
    assert t[2.0] == pytest.approx(0.004 + work / 2 + 2 * 4e-4 * 6400 / 4)
    assert json.loads(fake_profile_json(tail_factor=0.5))["constants"]["tail_factor"] == 0.5


def test_lookup_bounds_a_dense_row_by_its_rounds_and_sees_locality(one_sm):
    profile = one_sm
    A = power_law(20000, seed=9).tolil()
    A[7, :] = 1.0  # one row of 20,000 entries: a thread alone needs 5,000 rounds, a block 20
    m = canonicalize(A.tocsr())
    specs = families.specializations(m)
    pred = {s.label(): predict_lookup(m, s, profile) for s in specs}
    assert all(np.isfinite(v) and v > 0 for v in pred.values())
    # One thread alone walks the dense row in 8 ms: that tail, far more than the throughput share, is added
    # to the thread-per-row kernel's time; a block of 256 lanes takes 1/256 of it.
    thread = next(s for s in specs if s.label() == "csr_vector(threads_per_row=1,block_size=256,order=none)")
    flat = Profile.from_json(fake_profile_json(tail_factor=0.0, **ONE_SM))
    work = predict_lookup(m, thread, flat) - 0.004
    assert pred[thread.label()] == pytest.approx(0.004 + work / 2 + 4e-4 * 20000)
    block = pred["binned(small_max=8,medium_max=96,warp_division=8,huge_min=96,block_size=256,order=none)"]
    assert block < pred["csr_vector(threads_per_row=1,block_size=256,order=none)"] / 10
    # The same rows gathering from ~370,000 distinct columns (x beyond half of L1) are predicted slower.
    cols = np.random.default_rng(1).choice(10**8, m.nnz, replace=False).astype(np.int64)
    wide = canonicalize(sp.csr_matrix((m.data, cols, m.indptr), shape=(m.n_rows, 10**8)))
    assert wide.col_lengths.max() == 1
    spec = next(s for s in specs if s.label() == "binned(small_max=8,medium_max=96,warp_division=8,huge_min=96,"
                                                  "block_size=256,order=none)")
    assert predict_lookup(wide, spec, profile) > predict_lookup(m, spec, profile)


def test_float64_and_valued_matrices_are_predicted_slower(profile):
    A = power_law(5000, seed=2)
    spec = lambda m: Specialization("csr_vector", CsrVectorParams(8, 256), m.value_dtype, m.index_dtype,  # noqa
                                    m.value_free)
    m32, m64 = canonicalize(A), canonicalize(A, dtype=np.float64)
    assert predict_lookup(m64, spec(m64), profile) > predict_lookup(m32, spec(m32), profile)


def test_baseline_is_bytes_over_bandwidth(profile):
    m = canonicalize(power_law(3000, seed=1))
    spec = Specialization("csr_vector", CsrVectorParams(8, 256), m.value_dtype, m.index_dtype, m.value_free)
    nbytes = m.indptr.nbytes + m.indices.nbytes + m.data.nbytes + (m.n_rows + m.n_cols) * 4
    assert predict_baseline(m, spec, profile) == pytest.approx(0.004 + nbytes / 3000e9 * 1e3)


def test_profile_interpolates_log_log_and_clamps(profile):
    key = "csr_vector:1:128:vf"
    assert profile.performance(key, "l1", np.array([16.0]))[0] == pytest.approx(1e6 * 16 / 64)
    # Between 16 and 32 the curve is linear in log-log: at w = sqrt(16 * 32) perf is sqrt of the product.
    mid = profile.performance(key, "l1", np.array([np.sqrt(16 * 32)]))[0]
    assert mid == pytest.approx(np.sqrt(1e6 * 16 / 64 * 1e6 * 32 / 64))
    assert profile.performance(key, "dram", np.array([1e6]))[0] == pytest.approx(1e5)
    assert profile.performance(key, "dram", np.array([0.0]))[0] == pytest.approx(1e5 / 64)


def test_profile_file_errors_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="python -m tuner profile"):
        load_profile(path=tmp_path / "missing.json")
    bad = tmp_path / "p.json"
    bad.write_text('{"format": 99}')
    with pytest.raises(ValueError, match="format 99"):
        load_profile(path=bad)


def test_segment_size_of_paper_004_fig_2():
    # Matrix A of Fig. 2: rows hold 3, 1, 2, 2, 1, 1 entries; Algorithm 1 gives size 4 and 3 segments.
    A = np.array([[0, 2, 0, 4, 5], [1, 0, 0, 0, 0], [0, 3, 6, 0, 0], [0, 7, 0, 8, 0], [0, 0, 0, 9, 0],
                  [10, 0, 0, 0, 0]])
    s = segment_size(np.count_nonzero(A, axis=1))
    assert (s.seg_size, s.num_segs) == (4, 3)
    assert s.seg_size * s.num_segs >= np.count_nonzero(A)


def test_segment_size_edge_cases():
    assert segment_size(np.array([], np.int64)).num_segs == 0
    s = segment_size(np.array([5]))
    assert (s.seg_size, s.num_segs) == (1, 5)


def test_aligned_coo_cost_equations():
    # flat: 64 threads, 32 active: 2 iterations x log2 32 + 0 + 2 blocks x log2 32 + 2 warps.
    assert cost_coo_flat(64, max_threads=32, blocksize=32) == 22.0
    assert cost_coo_flat(33, max_threads=1024, blocksize=256) == 1 * 5 + 1 + 1 * 8 + 2
    # seg: 4 rows per segment, 3 segments, 32 threads: 1 iteration x 3 segments + 1 warp.
    assert cost_aligned_coo_seg(4, 3, max_threads=32) == 4.0


def test_hybrid_choice_moves_warp_multiples_to_flat():
    short = choose_hybrid(np.array([3, 1, 2, 2, 1, 1]), max_threads=32)
    assert short.layout == "hybrid" and short.hybrid_cost == short.seg_cost  # nothing is flat
    long_rows = choose_hybrid(np.array([4096] * 8 + [3] * 100), max_threads=4096)
    assert long_rows.layout in ("hybrid", "flat")
    assert long_rows.seg_cost > min(long_rows.hybrid_cost, long_rows.flat_cost)


def test_occupancy_limits():
    assert active_warps_per_sm(registers=32, shared_bytes=0, block=256) == 64
    assert active_warps_per_sm(registers=64, shared_bytes=0, block=256) == 32
    assert active_warps_per_sm(registers=32, shared_bytes=100_000, block=128) == 8


def test_valued_kernels_fall_back_to_value_free_tables_scaled_by_bytes():
    import json
    # Without the tail (which does not scale with bytes), the time is the throughput term alone.
    raw = json.loads(fake_profile_json(tail_factor=0.0))
    raw["tables"] = {k: v for k, v in raw["tables"].items() if k.endswith(":vf")}
    reduced = Profile.from_json(json.dumps(raw))
    full = Profile.from_json(fake_profile_json(tail_factor=0.0))
    # Short uniform rows: the throughput term, which scales with bytes, sets the time (not a long row alone).
    m = canonicalize(sp.random(3000, 3000, density=0.005, format="csr", random_state=5, dtype=np.float32))
    assert not m.value_free
    spec = Specialization("csr_vector", CsrVectorParams(4, 256), m.value_dtype, m.index_dtype, False)
    # The fake valued and value-free tables are equal: the fallback reads the latter at 4 of 8 bytes.
    t_full, t_reduced = predict_lookup(m, spec, full), predict_lookup(m, spec, reduced)
    overhead = 0.004
    assert (t_reduced - overhead) == pytest.approx((t_full - overhead) * 2)


def test_lookup_work_term_is_the_wave_model_with_work_weighted_means(one_sm):
    profile = one_sm
    from tuner.model.tables import blended, gather_fractions
    m = canonicalize(power_law(4000, seed=11))
    spec = Specialization("binned", BinnedParams(4, 32, 8, 64), m.value_dtype, m.index_dtype, m.value_free)
    segs = [s for s in warp_segments(m, "binned", spec.params) if s.warps.w.size]
    fr = gather_fractions(m, profile)
    key = lambda s: s.key if s.key in profile.tables else s.key + "f"  # noqa: E731
    per_warp = [s.warps.expand() for s in segs]
    sizes = np.concatenate([size for _, size in per_warp])
    perf = np.concatenate([blended(profile, key(s), w, fr) for s, (w, _) in zip(segs, per_warp)])
    waves = wave_time(sizes, perf, profile.max_active_warps(key(segs[0])))
    # The fake profile's curves are so fast that the work term dominates the slot bound here; the slowest
    # warp, started halfway through the work, may outlast it (tail factor 1 in the fake profile).
    tail = max(float(profile.alone_time(key(s), "l1", s.warps.w).max()) for s in segs)
    fr_l1 = fr[0]
    assert fr_l1 == 1.0  # x is small enough for L1, so the alone times are those of the L1 regime
    assert predict_lookup(m, spec, profile) == pytest.approx(0.004 + max(waves, waves / 2 + tail), rel=1e-9)


def test_blended_rates_take_one_share_triple_or_one_per_warp(profile):
    from tuner.model.tables import blended, blended_alone
    rng = np.random.default_rng(3)
    w = rng.integers(1, 5000, 40)
    shares = rng.dirichlet([1.0, 1.0, 1.0], 40)
    shares[:10, 2] = 0.0  # some warps never reach memory: that regime is skipped for them
    key = "csr_vector:4:256:v"
    each = blended(profile, key, w, shares)
    alone = blended_alone(profile, key, w, shares)
    for i in range(w.size):
        assert each[i] == blended(profile, key, w[i:i + 1], shares[i])[0]
        assert alone[i] == blended_alone(profile, key, w[i:i + 1], shares[i])[0]
    # Harmonic in performance, linear in time: 1/4 at 1e6 and 3/4 at 1e5 (the fake table's plateau).
    assert blended(profile, key, [64], [0.25, 0.0, 0.75])[0] == pytest.approx(1 / (0.25 / 1e6 + 0.75 / 1e5))


def test_every_family_predicts_a_matrix_without_entries(profile):
    from tuner.model import predicted_candidates
    for A in (sp.csr_matrix((40, 30), dtype=np.float32), sp.csr_matrix((0, 5), dtype=np.float32)):
        m = canonicalize(A)
        specs, times = predicted_candidates(m, profile)
        assert {s.family for s in specs} == set(families.REGISTRY)
        # Nothing to stream: the launch alone (plus a relabelled plan's gathers of x and y).
        assert all(t is not None and 0.004 <= t < 0.05 for t in times)


def test_relabelled_candidate_is_the_permuted_matrix_plus_two_gathers(profile):
    from tuner.families.base import ordered_matrix
    from tuner.model.lookup import reorder_ms
    m = canonicalize(power_law(6000, 9000, seed=12))
    plain = Specialization("binned", BinnedParams(8, 32, 4), m.value_dtype, m.index_dtype, m.value_free)
    ordered = Specialization("binned", BinnedParams(8, 32, 4, order="degree"), m.value_dtype, m.index_dtype,
                             m.value_free)
    b = ordered_matrix(m, "degree")
    gathers = reorder_ms(6000, 9000, 4, 4, profile.constants)
    assert gathers == pytest.approx(2 * 0.004 + (9000 + 6000) * 12 / 3e9)  # x and y fit the fake L2
    assert predict_lookup(m, ordered, profile) == pytest.approx(predict_lookup(b, plain, profile) + gathers)


def test_sorting_columns_by_degree_packs_the_hot_gathers_into_cache():
    rng = np.random.default_rng(3)
    lengths = np.minimum(rng.zipf(1.6, 200_000), 5000)
    scattered = regime_fractions(lengths, 4, l1_sectors=500, l2_sectors=4000)
    packed = regime_fractions(np.sort(lengths)[::-1], 4, l1_sectors=500, l2_sectors=4000)
    assert packed[0] > scattered[0] + 0.05  # more L1 hits
    assert packed[2] < scattered[2]  # fewer trips to memory


def test_gather_cost_grows_with_the_share_of_the_source_beyond_l2():
    from tuner.model.lookup import gather_ms
    c = {"launch_overhead_ms": 0.0, "copy_bandwidth_gbs": 1000.0, "l2_sectors": 1000.0}  # 32 KB of L2
    fits = gather_ms(8000, 4, 4, c)  # 32 KB source: every sector read once
    assert fits == pytest.approx(8000 * 12 / 1e9)
    far = gather_ms(80_000, 4, 4, c)  # 320 KB source: 90 % of the elements cost a sector
    assert far == pytest.approx(80_000 * (12 + 32 * 0.9) / 1e9)
    assert gather_ms(0, 4, 4, c) == 0.0


def test_aligned_coo_parts_become_warps_of_their_lane_and_row_shapes():
    m = canonicalize(sp.csr_matrix(np.tril(np.ones((70, 70), np.float32))))  # rows of 1..70 entries
    seg, flat = warp_segments(m, "aligned_coo", families.get("aligned_coo").params_type("hybrid"))
    assert seg.key == "aligned_coo:seg:256:vf" and flat.key == "aligned_coo:hflat:256:vf"  # all ones: a pattern
    # Trailing entries: 1..31 for rows 1..31 and 32..63, 0..6 for 64..70 (the longest 31): one lane length.
    assert seg.warps.w.tolist() == [31] and seg.warps.size.sum() == 2 * sum(range(32)) + sum(range(7))
    # Rows of 32..63 entries have a flat head of 32, rows of 64..70 one of 64: F / 32 warps each.
    assert flat.warps.w.tolist() == [32, 64]
    assert flat.warps.count.tolist() == [32.0, 14.0] and flat.warps.size.tolist() == [1024.0, 448.0]
    whole, = [s for s in warp_segments(m, "aligned_coo", families.get("aligned_coo").params_type("seg"))
              if s.warps.w.size]
    assert whole.warps.w.tolist() == [70]


def test_all_seg_lanes_as_long_as_a_dense_row_are_predicted_slower_than_the_hybrid(profile):
    A = power_law(4000, seed=3).tolil()
    A[7, :] = 1.0  # one row of 4000 entries: all-seg lanes of 4000 slots, mostly a few lanes
    m = canonicalize(A.tocsr())
    specs = [s for s in families.specializations(m, ["aligned_coo"]) if s.params.order == "none"]
    pred = {s.params.layout: predict_lookup(m, s, profile) for s in specs}
    assert pred["seg"] > 3 * pred["hybrid"]


def test_a_profile_without_a_familys_tables_predicts_none_for_it():
    import json
    raw = json.loads(fake_profile_json())
    for key in [k for k in raw["tables"] if k.startswith("aligned_coo:")]:
        del raw["tables"][key]
    prof = Profile.from_json(json.dumps(raw))
    m = canonicalize(power_law(500, seed=2))
    specs = families.specializations(m, profile=prof)
    pred = predict_many(m, specs, prof)
    # tile_coo runs ALIGNED_COO's flat kernel and reads its tables.
    assert all((p is None) == (s.family in ("aligned_coo", "tile_coo")) for s, p in zip(specs, pred))
    from tuner.compiler import predictable
    kept, kept_pred = predictable(specs, pred, "Fake GPU")
    assert {s.family for s in kept} == {"csr_vector", "binned", "tile_composite"} and None not in kept_pred


def test_a_long_row_in_binneds_last_class_starts_after_the_earlier_classes(one_sm):
    profile = one_sm
    # 4000 rows of 2 entries (small class) then one row of 6400 (large class: one warp, launched last).
    rows = np.concatenate([np.repeat(np.arange(4000), 2), np.full(6400, 4000)])
    cols = np.concatenate([np.tile([0, 1], 4000), np.arange(6400)])
    m = canonicalize(sp.csr_matrix((np.ones(rows.size, np.float32), (rows, cols)), shape=(4001, 6400)))
    bulk = canonicalize(sp.csr_matrix((np.ones(8000, np.float32), (rows[:8000], cols[:8000])), shape=(4000, 6400)))
    p = BinnedParams(small_max=8, medium_max=16, warp_division=8, huge_min=None)
    spec = Specialization("binned", p, m.value_dtype, m.index_dtype, True)
    small_work = predict_lookup(bulk, spec, profile) - 0.004  # the bulk alone is bound by its work
    from tuner.model.tables import blended, gather_fractions
    long_work = 6400 / blended(profile, "binned:32:256:vf", np.array([6400]), gather_fractions(m, profile))[0]
    alone = 4e-4 * 6400 / 32  # the fake profile's lone warp; its tail factor is 1
    assert predict_lookup(m, spec, profile) == pytest.approx(0.004 + small_work + long_work / 2 + alone, rel=1e-6)


def _device_lengths_predictions(monkeypatch, profile, A, device_csr):
    """Every candidate's prediction of A by the host passes, then with the view's row lengths taken from
    ``device_csr(m)`` (its passes over every row done by that module)."""
    from tuner.model import warps
    m = canonicalize(A)
    host_side = predict_many(m, families.specializations(m, profile=profile), profile)
    monkeypatch.setattr(base, "DEVICE_ROWS", 0)
    monkeypatch.setattr(warps, "SAMPLE_ROWS", 64)  # the short classes sampled, as on a large matrix
    again = canonicalize(A)
    monkeypatch.setattr(base, "known_copy", lambda v: device_csr(v) if v is again else None)
    with warps.device_row_lengths(again) as lengths:
        assert lengths is not None
    device_side = predict_many(again, families.specializations(again, profile=profile), profile)
    monkeypatch.undo()
    return host_side, device_side


def test_rows_of_a_class_per_chunk_counted_from_the_device_lengths_equal_the_host_counts(monkeypatch):
    from tuner.formats.device_reorder import DeviceCsr
    from tuner.model import reuse
    A = power_law(3000, seed=27)
    on_host = canonicalize(A)
    expected = {k: reuse.rows_at_least(on_host, k).tolist() for k in (1, 4, 300)}
    m = canonicalize(A)
    monkeypatch.setattr(base, "DEVICE_ROWS", 0)
    monkeypatch.setattr(base, "known_copy", lambda v: DeviceCsr(v.indptr, v.indices, None) if v is m else None)
    assert {k: reuse.rows_at_least(m, k).tolist() for k in (1, 4, 300)} == expected
    assert sum(expected[4]) == int(np.count_nonzero(on_host.row_lengths >= 4))


@pytest.mark.gpu
def test_rows_of_a_class_per_chunk_counted_on_the_gpu_equal_the_host_counts(monkeypatch):
    cupy = pytest.importorskip("cupy")
    from tuner.formats.device_reorder import DeviceCsr
    from tuner.model import reuse
    A = power_law(70000, seed=28)
    expected = {k: reuse.rows_at_least(canonicalize(A), k).tolist() for k in (1, 4, 300)}
    m = canonicalize(A)
    monkeypatch.setattr(base, "DEVICE_ROWS", 0)
    monkeypatch.setattr(base, "known_copy", lambda v: DeviceCsr(cupy.asarray(v.indptr), cupy.asarray(v.indices),
                                                                None) if v is m else None)
    assert {k: reuse.rows_at_least(m, k).tolist() for k in (1, 4, 300)} == expected
    assert len(expected[1]) > 100


def test_warp_histograms_of_every_row_from_the_device_lengths_predict_as_the_host_passes(profile, monkeypatch):
    from tuner.formats.device_reorder import DeviceCsr
    A = power_law(6000, seed=25)
    host_side, device_side = _device_lengths_predictions(
        monkeypatch, profile, A, lambda v: DeviceCsr(v.indptr.copy(), v.indices.copy(), None))
    from tuner.model import warps
    monkeypatch.setattr(warps, "SAMPLE_ROWS", 64)
    sampled = canonicalize(A)
    assert device_side == predict_many(sampled, families.specializations(sampled, profile=profile), profile)
    assert len(host_side) == len(device_side) > 50


@pytest.mark.gpu
def test_warp_histograms_counted_on_the_gpu_equal_the_host_counts(profile, monkeypatch):
    cupy = pytest.importorskip("cupy")
    from tuner.formats.device_reorder import DeviceCsr
    from tuner.model import warps
    A = power_law(20000, seed=26)
    m = canonicalize(A)
    dev = cupy.asarray(m.row_lengths.astype(np.int32))
    for lo, hi in ((0, None), (4, 96), (0, 8), (96, None)):
        keep = (m.row_lengths >= lo) & (m.row_lengths < (hi or 1 << 40))
        on_host = warps.group_histograms(m.row_lengths[keep].astype(np.int32))
        on_gpu = warps.group_histograms(dev[cupy.asarray(keep)])
        for g, h in on_host.items():
            d = on_gpu[g]
            assert isinstance(d.w, np.ndarray) and d.w.tolist() == h.w.tolist(), (lo, hi, g)
            assert d.count.tolist() == h.count.tolist() and d.size.tolist() == h.size.tolist(), (lo, hi, g)
    _, on_gpu = _device_lengths_predictions(monkeypatch, profile, A, lambda v: DeviceCsr(
        cupy.asarray(v.indptr), cupy.asarray(v.indices), None))
    monkeypatch.setattr(warps, "SAMPLE_ROWS", 64)
    sampled = canonicalize(A)
    assert on_gpu == predict_many(sampled, families.specializations(sampled, profile=profile), profile)


@pytest.mark.parametrize("slices,top", [(1, 5), (3, 40), (400, 3000), (2000, 10**6)])
def test_slice_groups_pair_every_slice_with_its_distinct_counts_in_order_whatever_their_range(slices, top):
    from tuner.model.locality import slice_groups
    rng = np.random.default_rng(slices)
    # power-law counts (mostly small, a few up to ``top``) with empty sectors between
    sectors = np.where(rng.random(60_000) < 0.3, 0, np.minimum(rng.zipf(1.6, 60_000), top))
    cuts = np.unique(np.r_[0, rng.integers(0, sectors.size, slices - 1), sectors.size])
    g = slice_groups(sectors, cuts)
    which = np.repeat(np.arange(cuts.size - 1), np.diff(cuts))
    live = sectors > 0
    pairs, mult = np.unique(np.stack([which[live], sectors[live]]), axis=1, return_counts=True)
    assert g.group.tolist() == pairs[0].tolist() and g.value.tolist() == pairs[1].tolist()
    assert g.mult.tolist() == mult.astype(float).tolist()
    assert g.used.tolist() == np.bincount(which[live], minlength=cuts.size - 1).tolist()
    assert g.total.tolist() == np.bincount(which, weights=sectors, minlength=cuts.size - 1).tolist()


@pytest.mark.parametrize("slices,top", [(1, 5), (3, 40), (400, 3000), (2000, 10**6)])
def test_slice_groups_by_one_sort_as_the_gpu_makes_them_equal_the_tabled_ones(slices, top):
    from tuner.model.locality import slice_groups, sorted_slice_groups
    rng = np.random.default_rng(slices + 7)
    sectors = np.where(rng.random(60_000) < 0.3, 0, np.minimum(rng.zipf(1.6, 60_000), top))
    cuts = np.unique(np.r_[0, rng.integers(0, sectors.size, slices - 1), sectors.size])
    tabled, sorted_ = slice_groups(sectors, cuts), sorted_slice_groups(sectors, cuts)
    for field in ("used", "total", "group", "value", "mult"):
        a, b = getattr(tabled, field), getattr(sorted_, field)
        assert a.dtype == b.dtype and a.tolist() == b.tolist(), field
    empty = sorted_slice_groups(np.zeros(10, np.int64), np.array([0, 4, 10]))
    assert empty.used.tolist() == [0, 0] and empty.total.tolist() == [0.0, 0.0] and empty.group.size == 0


@pytest.mark.gpu
def test_slice_groups_made_on_the_gpu_equal_the_host_ones():
    cupy = pytest.importorskip("cupy")
    from tuner.model.locality import slice_groups
    rng = np.random.default_rng(5)
    sectors = np.where(rng.random(3_000_000) < 0.3, 0, np.minimum(rng.zipf(1.5, 3_000_000), 10**7))
    for cuts in (np.array([0, sectors.size]), np.unique(np.r_[0, rng.integers(0, sectors.size, 500), sectors.size])):
        on_host, on_gpu = slice_groups(sectors, cuts), slice_groups(cupy.asarray(sectors), cuts)
        for field in ("used", "total", "group", "value", "mult"):
            a, b = getattr(on_host, field), getattr(on_gpu, field)
            assert isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b), field


def test_gather_shares_from_device_sector_counts_predict_as_the_host_ones(profile, monkeypatch):
    from tuner.formats.device_reorder import DeviceCsr
    from tuner.model import tables
    A = power_law(6000, seed=31)
    m = canonicalize(A)
    host_side = predict_many(m, families.specializations(m, profile=profile), profile)
    again = canonicalize(A)
    # The device's arrays stood in by host ones: the groups come from the one-sort rule there.
    monkeypatch.setattr(tables, "DEVICE_SECTORS", 0)
    monkeypatch.setattr(tables, "known_copy", lambda v: DeviceCsr(v.indptr, v.indices, None) if v is again else None)
    monkeypatch.setattr(tables, "on_device", lambda a: True)
    monkeypatch.setattr(tables.device_reorder, "on_device", contextlib.nullcontext)
    monkeypatch.setattr(tables.device_reorder, "upload", lambda a: a.copy())
    from tuner.model import locality
    monkeypatch.setattr(locality, "on_device", lambda a: True)
    assert tables.on_gpu(again) and not tables.on_gpu(m)
    expected = tables.sector_counts(again.col_lengths, again.value_dtype.itemsize)
    assert tables._device_counts(again).tolist() == expected.tolist()  # summed by strided adds, as on the device
    device_side = predict_many(again, families.specializations(again, profile=profile), profile)
    assert device_side == host_side and len(host_side) > 50


def test_candidates_predicted_side_by_side_equal_those_predicted_one_after_another(profile, monkeypatch):
    from tuner.model import lookup
    A = power_law(5000, seed=33)
    m = canonicalize(A)
    one_by_one = predict_many(m, families.specializations(m, profile=profile), profile)
    monkeypatch.setattr(lookup, "PARALLEL_ROWS", 0)
    again = canonicalize(A)
    assert predict_many(again, families.specializations(again, profile=profile), profile, workers=4) == one_by_one
    assert sum(p is not None for p in one_by_one) > 50


@pytest.mark.gpu
def test_longest_row_found_on_the_gpu_equals_the_host_one_and_counts_no_host_lengths(monkeypatch):
    pytest.importorskip("cupy")
    from tuner.formats.device_reorder import device_csr
    A = power_law(50000, seed=34)
    monkeypatch.setattr(base, "DEVICE_ROWS", 0)
    m = canonicalize(A)
    device_csr(m)
    assert base.longest_row(m) == int(np.diff(A.indptr).max()) > 100
    assert "row_lengths" not in m.__dict__


def test_sector_hits_looked_up_by_distinct_count_equal_each_sectors_own_chance():
    from tuner.model.locality import CacheLevel, _hits_by_count, sector_hits, slice_groups
    rng = np.random.default_rng(8)
    counts = np.where(rng.random(40_000) < 0.4, 0, rng.zipf(1.4, 40_000)).astype(np.int64)
    levels = [CacheLevel(300.0, (10.0, 1000.0, 10_000.0), (1.0, 0.8, 0.5)), CacheLevel(5000.0)]
    groups = slice_groups(counts, np.array([0, counts.size]))
    spread = groups.spread()[0]
    each = _hits_by_count(counts.astype(np.float64), float(counts.sum()), levels, groups, spread)
    # Equal to rounding: NumPy's vectorised expm1 may round the last bit apart by an element's place.
    for got in (sector_hits(counts, levels), sector_hits(counts, levels, groups),
                sector_hits(counts.astype(np.uint32), levels)):
        assert all(np.allclose(a, b, rtol=1e-13, atol=0) for a, b in zip(got, each))
        assert got[0].max() > 0.05 and got[1][counts == 0].max() == 0.0
    huge = counts.copy()
    huge[7] = 10**9  # beyond a table indexed by count: searched among the distinct counts
    groups = slice_groups(huge, np.array([0, huge.size]))
    each = _hits_by_count(huge.astype(np.float64), float(huge.sum()), levels, groups, groups.spread()[0])
    assert all(np.allclose(a, b, rtol=1e-13, atol=0) for a, b in zip(sector_hits(huge, levels), each))


@pytest.mark.gpu
def test_sector_hits_looked_up_on_the_gpu_equal_the_host_ones():
    cupy = pytest.importorskip("cupy")
    from tuner.model.locality import CacheLevel, sector_hits
    rng = np.random.default_rng(9)
    counts = np.where(rng.random(2_000_000) < 0.4, 0, rng.zipf(1.4, 2_000_000)).astype(np.int64)
    levels = [CacheLevel(3000.0, (10.0, 1000.0, 100_000.0), (1.0, 0.8, 0.5)), CacheLevel(50_000.0)]
    on_host, on_gpu = sector_hits(counts, levels), sector_hits(cupy.asarray(counts), levels)
    assert all(isinstance(b, np.ndarray) and np.array_equal(a, b) for a, b in zip(on_host, on_gpu))


def test_whole_matrix_gather_shares_from_distinct_counts_equal_the_per_sector_average(profile):
    from tuner.model import tables
    m = canonicalize(power_law(400_000, seed=35))  # x far beyond L1: some gathers miss it
    h1, h2, shares = tables.sector_hit_rates(m, profile)
    counts = tables.matrix_sector_counts(m).astype(np.float64)
    per_sector = np.array([counts @ h1, counts @ h2 - counts @ h1]) / counts.sum()
    assert np.allclose(shares[:2], per_sector, rtol=1e-12, atol=0)
    assert 0.0 < shares[0] < 1.0 and shares.sum() == pytest.approx(1.0)


def test_sector_statistics_fall_back_to_the_host_when_the_gpu_runs_out_of_memory(monkeypatch, caplog):
    from tuner.formats.device_reorder import DeviceCsr
    from tuner.model import tables
    m = canonicalize(power_law(3000, seed=36))
    expected = tables.sector_groups(canonicalize(power_law(3000, seed=36)), np.array([0, m.n_cols]))
    monkeypatch.setattr(tables, "DEVICE_SECTORS", 0)
    monkeypatch.setattr(tables, "known_copy", lambda v: DeviceCsr(v.indptr, v.indices, None) if v is m else None)
    monkeypatch.setattr(tables, "on_device", lambda a: True)
    monkeypatch.setattr(tables.device_reorder, "on_device", contextlib.nullcontext)

    def full(a):
        raise MemoryError("out of memory allocating 268,435,456 bytes")
    monkeypatch.setattr(tables.device_reorder, "upload", full)
    with caplog.at_level("INFO", logger="tuner.model"):
        got = tables.sector_groups(m, np.array([0, m.n_cols]))
    assert got.value.tolist() == expected.value.tolist() and got.mult.tolist() == expected.mult.tolist()
    assert "out of memory" in caplog.text


def test_a_profile_is_read_once_per_version_of_its_file(tmp_path):
    import json
    import os
    f = tmp_path / "profile.json"
    f.write_text(fake_profile_json())
    first = load_profile(path=f)
    assert load_profile(path=f) is first
    raw = json.loads(fake_profile_json())
    raw["constants"]["copy_bandwidth_gbs"] = 1234.5
    f.write_text(json.dumps(raw))
    os.utime(f, ns=(f.stat().st_atime_ns, f.stat().st_mtime_ns + 10**9))  # a rewrite within the clock's tick
    again = load_profile(path=f)
    assert again is not first and again.constants["copy_bandwidth_gbs"] == 1234.5
    f.write_text("{")
    os.utime(f, ns=(f.stat().st_atime_ns, f.stat().st_mtime_ns + 2 * 10**9))
    with pytest.raises(ValueError, match="not a usable GPU profile"):
        load_profile(path=f)
