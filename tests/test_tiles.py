"""TILE-COO and TILE-Composite (paper 003): tiling rule, workload packing, layouts against SciPy, and
Algorithms 2-3 over a profile."""
import dataclasses

import numpy as np
import pytest
import scipy.sparse as sp

import tuner
from tuner import families
from tuner.families.base import Specialization, ordered_matrix, ordered_structure
from tuner.families.tile_composite import TileCompositeParams, fill_workload
from tuner.families.tile_coo import TileCooParams
from tuner.families.tiles import tiling
from tuner.formats.tile_composite import CAMPING_PAD, Shapes, build_tile_composite, evaluate_tile_composite, pack
from tuner.formats.tile_coo import build_tile_coo
from tuner.formats.aligned_coo import evaluate_aligned_coo
from tuner.formats.tiles import tile_bounds, tile_widths
from tuner.matrix import canonicalize
from tuner.model import Profile, predict_lookup, predict_many
from tuner.model import tile_composite as tc_model

from .conftest import fixture_matrices, power_law
from .fake_profile import fake_profile_json


@pytest.fixture
def profile():
    return Profile.from_json(fake_profile_json())


def plan_of(A):
    return ordered_matrix(canonicalize(A), "degree")


def test_tiles_stop_at_the_first_tile_without_a_column_of_two_entries():
    # Algorithm 1, lines 6-7: the third tile would start with a column of one entry.
    assert tile_bounds(np.array([9, 7, 3, 2, 1, 1, 1, 1, 0]), 2).tolist() == [0, 2, 4, 9]
    assert tile_bounds(np.array([1, 1, 1]), 1).tolist() == [0, 3]  # no reuse: one tile
    assert tile_bounds(np.array([5, 4]), 0).tolist() == [0, 2]
    assert tile_bounds(np.zeros(0, np.int64), 8).tolist() == [0, 0]
    with pytest.raises(ValueError, match="width"):
        tile_bounds(np.array([3]), -1)


def test_tile_widths_are_shares_of_the_measured_l1_in_whole_sectors():
    assert tile_widths(4096, 4, 1 << 20) == [8192, 16384, 32768]
    assert tile_widths(5666, 4, 1 << 24) == [11328, 22656, 45312]  # nested: multiples of the quarter
    assert tile_widths(4096, 8, 1 << 20) == [4096, 8192, 16384]  # float64: half the columns per sector
    assert tile_widths(4096, 4, 100) == [0]  # x fits whole: one tile


@pytest.mark.parametrize("width", [0, 16, 64, 100_000])
@pytest.mark.parametrize("workers", [1, 3])
def test_counted_ranked_runs_equal_the_tiling_runs_ranked(width, workers):
    # The model counts each tile's runs from the CSR arrays (in row chunks on several threads); the layout
    # regroups the entries: same lengths, tile by tile.
    from tuner.formats.tile_composite import tile_ranks
    from tuner.formats.tiles import ranked_runs, tile_entries
    for A in [power_law(3000, seed=11), power_law(500, n_cols=4000, seed=2), *fixture_matrices().values()]:
        b = plan_of(A)
        bounds = tile_bounds(b.col_lengths, width)
        runs = ranked_runs(b.indptr, b.indices, bounds, workers=workers)
        t = tile_entries(b.indptr, b.indices, b.n_cols, bounds)
        ranked = t.run_lengths[tile_ranks(t)[0]]
        assert runs.n_tiles == t.n_tiles
        for k in range(t.n_tiles):
            assert np.array_equal(runs.ranked(k), ranked[t.tile_runs[k]:t.tile_runs[k + 1]])
            assert np.all(np.diff(runs.tile(k)[0]) < 0)  # distinct lengths, decreasing


@pytest.mark.parametrize("widths", [[16, 32, 64, 0], [16, 24], [100, 200, 400], [0]])
def test_tilings_counted_in_one_pass_equal_each_counted_alone(widths):
    # Nested widths merge the narrowest tiles' runs; others are cut one by one: the same counts either way.
    from tuner.formats.tiles import ranked_runs, ranked_runs_many
    for A in [power_law(3000, seed=11), power_law(500, n_cols=4000, seed=2), *fixture_matrices().values()]:
        b = plan_of(A)
        bounds = [tile_bounds(b.col_lengths, w) for w in widths]
        for workers in (1, 2):
            for r, bd in zip(ranked_runs_many(b.indptr, b.indices, bounds, workers=workers), bounds):
                alone = ranked_runs(b.indptr, b.indices, bd, workers=1)
                assert all(np.array_equal(getattr(r, f), getattr(alone, f)) for f in ("lengths", "counts", "offsets"))


def _tile_entries(runs):
    total = np.concatenate([[0], np.cumsum(runs.lengths * runs.counts)])
    return total[runs.offsets[1:]] - total[runs.offsets[:-1]]


def test_sampled_tile_counts_keep_every_long_run_and_estimate_the_rest_closely():
    # A degree-ordered R-MAT graph of 955K entries counted from a quarter of its chunks of short rows: rows
    # of 64 or more are always counted, so every run of 64 or more (the counting table's long runs) is
    # exact; the other counts stand for their group of chunks.
    from tuner.formats.tiles import COUNTED_LENGTHS, RowSample, ranked_runs_many
    from tuner.loaders import load
    b = ordered_matrix(canonicalize(load("rmat:16")), "degree")
    bounds = [tile_bounds(b.col_lengths, w) for w in (512, 1024, 2048)]
    sample = RowSample(from_entries=0, every=4, chunk_entries=4096, exact_length=COUNTED_LENGTHS)
    ranges, weights = sample.chunks(b.indptr)
    counted = sum(int(b.indptr[r] - b.indptr[a]) for a, r in ranges)
    assert counted < 0.8 * b.nnz  # fewer entries counted, though rows of 64 or more hold most of them here
    whole = RowSample(from_entries=0, every=4, chunk_entries=4096, exact_length=0).chunks(b.indptr)[0]  # all
    assert sum(weights) == len(whole)  # every chunk stood for once
    for exact, est in zip(ranked_runs_many(b.indptr, b.indices, bounds),
                          ranked_runs_many(b.indptr, b.indices, bounds, sample=sample)):
        assert est.n_tiles == exact.n_tiles > 10
        e, s = _tile_entries(exact), _tile_entries(est)
        assert abs(s.sum() / e.sum() - 1) < 0.01
        err = np.abs(s - e) / e
        assert np.median(err) < 0.03 and err.max() < 0.15
        long = [[(l, c) for l, c in zip(*r.tile(t)) if l >= COUNTED_LENGTHS] for r in (exact, est)
                for t in range(r.n_tiles)]
        assert long[:exact.n_tiles] == long[exact.n_tiles:] and sum(map(len, long)) > 100
        assert est.counts.dtype == np.int64 and np.all(est.counts > 0)


def test_sampled_chunks_counted_in_joined_units_equal_each_chunk_counted_alone(monkeypatch):
    # The sample's chunks are joined into units of about a million entries (fewer NumPy calls under the
    # GIL); the counts must be exactly those of counting every chunk by itself.
    from tuner.formats import tiles as formats_tiles
    from tuner.formats.tiles import RowSample, ranked_runs_many, work_units
    from tuner.loaders import load
    b = ordered_matrix(canonicalize(load("rmat:16")), "degree")
    bounds = [tile_bounds(b.col_lengths, w) for w in (512, 1024, 2048)]
    sample = RowSample(from_entries=0, every=4, chunk_entries=4096, exact_length=256)
    ranges, weights = sample.chunks(b.indptr)
    units = work_units(b.indptr, ranges, weights, entries=1 << 16)
    assert len(units) < len(ranges) / 3 and max(len(u) for u, _ in units) > 1  # joined, some from apart
    assert sorted(r for u, _ in units for r in u) != sorted(ranges)  # ranges that met became one
    joined = ranked_runs_many(b.indptr, b.indices, bounds, sample=sample)
    monkeypatch.setattr(formats_tiles, "work_units", lambda indptr, r, w: [([x], k) for x, k in zip(r, w)])
    alone = ranked_runs_many(b.indptr, b.indices, bounds, sample=sample)
    for j, a in zip(joined, alone):
        assert all(np.array_equal(getattr(j, f), getattr(a, f)) for f in ("lengths", "counts", "offsets"))
        assert j.n_tiles > 10 and int(j.counts.sum()) > 10_000


def test_small_matrices_and_the_default_are_counted_exactly():
    from tuner.formats.tiles import RowSample, ranked_runs_many
    b = plan_of(power_law(3000, seed=11))
    bounds = [tile_bounds(b.col_lengths, 64)]
    exact = ranked_runs_many(b.indptr, b.indices, bounds)[0]
    below = ranked_runs_many(b.indptr, b.indices, bounds, sample=RowSample(from_entries=b.nnz + 1, every=4,
                                                                             chunk_entries=64))[0]
    assert all(np.array_equal(getattr(exact, f), getattr(below, f)) for f in ("lengths", "counts", "offsets"))
    assert RowSample(from_entries=0, every=4, chunk_entries=64).chunks(b.indptr)[1].count(1) < 20


def test_runs_too_long_for_the_counting_table_are_counted_by_sorting():
    from tuner.formats.tiles import COUNTED_LENGTHS, ranked_runs
    # A row of 3 x 10^6 entries beside rows of one; chunked so that the long row's tile spans two chunks.
    n = 3_000_000
    indptr = np.array([0, 1, n + 1, n + 2, n + 3, 2 * n + 3])
    indices = np.concatenate([[5], np.arange(n), [7], [n - 1], np.arange(n)])
    runs = ranked_runs(indptr, indices, np.array([0, 10, n]), workers=2)
    assert [runs.ranked(0).tolist(), runs.ranked(1).tolist()] == [[10, 10, 1, 1], [n - 10, n - 10, 1]]
    assert runs.counts.tolist() == [2, 2, 2, 1] and n - 10 > COUNTED_LENGTHS


def test_tiled_entries_visit_every_entry_once_tile_major_rows_ascending():
    b = plan_of(power_law(3000, seed=11))
    t = tiling(b, 64)
    assert t.n_tiles > 3
    assert np.array_equal(np.sort(t.order), np.arange(b.nnz))
    tile_of_entry = np.searchsorted(t.bounds, b.indices[t.order], side="right") - 1
    assert np.all(np.diff(tile_of_entry) >= 0)
    assert t.run_lengths.sum() == b.nnz
    for k in range(t.n_tiles):
        rows = t.run_rows[t.tile_runs[k]:t.tile_runs[k + 1]]
        assert np.all(np.diff(rows) > 0)  # each row once per tile, ascending
    # The run lengths are the rows' entries inside each tile.
    dense = b.to_scipy()
    k = 1
    sub = dense[:, t.bounds[k]:t.bounds[k + 1]]
    lengths = np.diff(sub.indptr)
    assert np.array_equal(t.tile_lengths(k), lengths[lengths > 0])


@pytest.mark.parametrize("wl", [1, 4, 33, 120, 1000])
def test_packed_runs_spelt_out_are_the_workloads_of_the_ranked_rows(wl):
    # The model sums over runs of equal workloads; the layout needs each: the same partition either way.
    from tuner.formats.tile_composite import pack_runs
    rng = np.random.default_rng(wl)
    for _ in range(20):
        ranked = np.sort(np.concatenate([rng.zipf(1.6, rng.integers(1, 400)) % 500, [0] * 3]))[::-1]
        s = pack_runs(*_runs_of(ranked), wl)
        p = pack(ranked, wl)
        n = s.count
        assert s.workloads == p.count
        assert np.array_equal(np.repeat(s.first, n) + np.repeat(s.step, n) * (
            np.arange(p.count) - np.repeat(np.cumsum(n) - n, n)), p.start)
        assert np.array_equal(np.repeat(s.h, n), p.h) and np.array_equal(np.repeat(s.row_major, n), p.row_major)
        assert np.array_equal(np.repeat(s.length, n), ranked[p.start])  # a workload's w: its first row
        covered = np.where(p.row_major, p.h, np.minimum(p.h, ranked.size - p.start))
        assert covered.sum() >= np.count_nonzero(ranked)  # every live row in some workload


def algorithm_3(ranked, wl):
    """Algorithm 3, lines 7-16, walked workload by workload over the ranked rows: (start, h, row-major)."""
    out, i, live = [], 0, int(np.count_nonzero(ranked))
    while i < live:
        w = int(ranked[i])
        h = max(wl // w, 1)
        step = h if w >= h else -(-h // 32) * 32
        out.append((i, min(h, live - i) if w >= h else step, w >= h))
        i += step
    return out


@pytest.mark.parametrize("wl", [1, 3, 32, 100, 777, 4096])
def test_runs_packed_together_equal_algorithm_3_walked_row_by_row(wl):
    # pack_many counts each run's workloads at once from stretches of equal step; the paper walks rows.
    rng = np.random.default_rng(wl + 1)
    for _ in range(25):
        ranked = np.sort(np.concatenate([rng.zipf(rng.uniform(1.3, 2.5), rng.integers(1, 500)) % 3000,
                                         [0] * int(rng.integers(0, 3))]))[::-1]
        p = pack(ranked, wl)
        assert list(zip(p.start.tolist(), p.h.tolist(), p.row_major.tolist())) == algorithm_3(ranked, wl)


def test_packings_of_several_sizes_equal_each_packed_alone():
    from tuner.formats.tile_composite import pack_many, pack_runs
    lengths, counts = np.array([900, 40, 39, 7, 2, 1]), np.array([1, 3, 50, 9, 400, 2000])
    sizes = [32, 64, 900, 1800, 8192]
    many = pack_many(lengths, counts, sizes)
    for c, wl in enumerate(sizes):
        a, b = many.shapes(c), pack_runs(lengths, counts, wl)
        for f in ("first", "count", "step", "length", "h", "row_major", "run"):
            assert getattr(a, f).tolist() == getattr(b, f).tolist()
    assert many.tail_rows.tolist()[:2] == [0, 0] and pack_many(np.array([5]), np.array([3]), [10]).tail_rows[0] == 1


SHAPE_FIELDS = tuple(f.name for f in dataclasses.fields(Shapes))


def _runs_of(ranked):
    """A tile's rows ranked by decreasing length as runs: (distinct lengths descending, rows of each)."""
    lengths, counts = np.unique(ranked, return_counts=True)
    return lengths[::-1], counts[::-1]


def _packed_together(tiles, sizes):
    """Tiles given as (lengths, counts) pairs packed at once, at their ``sizes``: (run offsets, Packings)."""
    from tuner.formats.tile_composite import pack_tiles
    offsets = np.cumsum([0] + [t[0].size for t in tiles])
    return offsets, pack_tiles(np.concatenate([t[0] for t in tiles]), np.concatenate([t[1] for t in tiles]),
                               offsets, sizes)


def test_the_chosen_packings_flat_hold_each_tiles_packing_with_its_tile():
    rng = np.random.default_rng(23)
    tiles, sizes = [], []
    for k in range(30):
        ranked = np.sort(rng.zipf(rng.uniform(1.3, 2.5), rng.integers(1, 300)) % 1500)[::-1]
        if k % 7 == 0:
            ranked = np.zeros(2, np.int64)  # empty rows only: no pairing has a run
        if k % 5 == 1:
            ranked = np.full(3, 40 + k)  # long rows only: two per workload, the last one a tail
        tiles.append(_runs_of(ranked))
        sizes.append(sorted({1, 32, 2 * (40 + k), int(ranked[0]) or 1, int(rng.integers(1, 4000))}))
    _, p = _packed_together(tiles, sizes)
    starts = np.cumsum([0] + [len(s) for s in sizes])
    best = np.array([starts[t] + int(rng.integers(len(s))) for t, s in enumerate(sizes)])
    tailed = np.flatnonzero(p.tail_rows > 0)
    best[p.tile[tailed]] = tailed  # a pairing with a tail wherever a tile has one
    best[[3, 17]] = -1  # tiles without a pairing hold no runs
    tile, flat = p.chosen(best)
    assert p.tail_rows[best[best >= 0]].any()  # some tails are among them
    for t in range(len(tiles)):
        got = sorted(zip(*(getattr(flat, f)[tile == t].tolist() for f in SHAPE_FIELDS)))
        want = [] if best[t] < 0 else sorted(zip(*(getattr(p.shapes(int(best[t])), f).tolist() for f in SHAPE_FIELDS)))
        assert got == want


def test_tiles_packed_together_equal_each_packed_alone():
    from tuner.formats.tile_composite import pack_many
    rng = np.random.default_rng(11)
    tiles, sizes = [], []
    for k in range(40):
        ranked = np.sort(rng.zipf(rng.uniform(1.3, 2.5), rng.integers(1, 400)) % 2000)[::-1]
        if k % 9 == 0:
            ranked = np.zeros(int(rng.integers(1, 5)), np.int64)  # a tile of empty rows only
        tiles.append(_runs_of(ranked))  # zero-length runs last, as in a ranking
        sizes.append(sorted({1, 32, int(ranked[0]) or 1, int(rng.integers(1, 5000))}))
    offsets, together = _packed_together(tiles, sizes)
    rates = {k: (rng.uniform(1e5, 1e6, offsets[-1]), rng.uniform(1e-4, 1e-2, offsets[-1])) for k in ("row", "col")}
    times = tc_model.tile_times(together, rates, max_active_warps=50)
    c = 0
    for t, ((lengths, counts), wls) in enumerate(zip(tiles, sizes)):
        alone = pack_many(lengths, counts, wls)
        own = {k: (perf[offsets[t]:offsets[t + 1]], lone[offsets[t]:offsets[t + 1]]) for k, (perf, lone) in rates.items()}
        assert times[c:c + len(wls)].tolist() == pytest.approx(tc_model.tile_times(alone, own, 50).tolist(), rel=1e-12)
        for j in range(len(wls)):
            a, b = together.shapes(c + j), alone.shapes(j)
            assert all(getattr(a, f).tolist() == getattr(b, f).tolist() for f in SHAPE_FIELDS)
        c += len(wls)
    empty = [len(wls) for (lengths, _), wls in zip(tiles, sizes) if not lengths.any()]
    assert len(empty) == 5 and (times == 0).sum() == sum(empty)  # the empty tiles cost nothing
    assert (together.tail_rows > 0).any()


def test_packing_follows_algorithm_3_and_figure_1d():
    # Fig. 1(d): rows ranked 3, 2, 2, 1, 1, 1, 1 with WL = 4: the first row alone, then two rows of 2
    # row-major, then the single-entry rows column-major (their 4 rows padded to a warp of 32).
    p = pack(np.array([3, 2, 2, 1, 1, 1, 1]), 4)
    assert p.start.tolist() == [0, 1, 3]
    assert p.row_major.tolist() == [True, True, False]
    assert p.h.tolist() == [1, 2, 32] and p.w.tolist() == [32, 32, 1]
    # Runs of equal rows: workloads of w x WL // w; the fourth takes the last row of 40 and two rows of 3
    # (padded to 40), then the rows of 3 go column-major, 40 rows padded to 64, the last warp part padding.
    p = pack(np.array([40] * 10 + [3] * 100), 120)
    assert p.row_major[:4].all() and p.h[:4].tolist() == [3, 3, 3, 3] and p.start[:4].tolist() == [0, 3, 6, 9]
    assert not p.row_major[4:].any() and p.w[4:].tolist() == [3, 3]
    assert p.start[4:].tolist() == [12, 76] and p.h[4:].tolist() == [64, 64]
    assert pack(np.zeros(5, np.int64), 8).count == 0  # empty rows make no workloads
    with pytest.raises(ValueError, match="decreasing"):
        pack(np.array([1, 2]), 4)
    with pytest.raises(ValueError, match=">= 1"):
        pack(np.array([2, 1]), 0)
    from tuner.formats.tile_composite import pack_runs
    with pytest.raises(ValueError, match="distinct"):
        pack_runs(np.array([2, 2]), np.array([1, 1]), 4)


@pytest.mark.parametrize("name", ["power_law", "rectangular_wide", "rectangular_tall", "one_dense_row",
                                  "empty_rows", "pattern", "float64", "long_rows", "tiny", "all_empty"])
@pytest.mark.parametrize("width", [0, 16, 256])
def test_multi_tile_layouts_compute_the_scipy_product(name, width):
    A = fixture_matrices()[name]
    b = plan_of(A)
    x = np.random.default_rng(3).uniform(-1, 1, b.n_cols)
    ref = b.to_scipy().astype(np.float64) @ x
    t = tiling(b, width)
    data = None if b.value_free else b.data
    pv = b.pattern_value if b.value_free else 1.0
    coo = build_tile_coo(b.indptr, b.indices, data, t)
    assert coo.flat_rows.size % 32 == 0
    np.testing.assert_allclose(evaluate_aligned_coo(coo.parts, x, b.n_rows, pv), ref, rtol=1e-9, atol=1e-9)
    for wl in (1, 5, 64, 3000):
        for pad in (False, True):
            f = build_tile_composite(b.indices, data, t, (wl,) * t.n_tiles, pad)
            np.testing.assert_allclose(evaluate_tile_composite(f, x, b.n_rows, pv), ref, rtol=1e-9, atol=1e-9,
                                       err_msg=f"{name} width={width} wl={wl} pad={pad}")


def test_no_coo_warp_mixes_two_tiles():
    b = plan_of(power_law(2000, seed=12))
    t = tiling(b, 32)
    coo = build_tile_coo(b.indptr, b.indices, b.data, t)
    cols = coo.flat_cols.reshape(-1, 32)
    live = cols >= 0
    tile = np.where(live, np.searchsorted(t.bounds, np.where(live, cols, 0), side="right") - 1, -1)
    lo = np.where(live, tile, np.iinfo(np.int64).max).min(axis=1)
    hi = tile.max(axis=1)
    assert np.all((hi == -1) | (lo == hi))


def test_workload_slots_hold_their_shape_and_padding_fetches_nothing():
    b = plan_of(power_law(3000, seed=13))
    t = tiling(b, 128)
    f = build_tile_composite(b.indices, b.data, t, (48,) * t.n_tiles)
    rm = f.wl_h > 0
    assert np.all(f.wl_w[rm] % 32 == 0)  # row-major rows padded to a warp multiple
    assert np.all((-f.wl_h[~rm]) % 32 == 0)  # column-major rows padded to a warp multiple
    assert np.all(f.wl_w[~rm] < -f.wl_h[~rm])  # column-major workloads are taller than wide
    assert (f.cols >= 0).sum() == b.nnz and np.all(f.vals[f.cols < 0] == 0)
    assert f.tile_warps[-1] == f.warps and np.all(np.diff(f.tile_warps) >= 0)


def test_camping_pad_leaves_256_bytes_after_workloads_of_512_multiples_only():
    b = plan_of(power_law(3000, seed=14))
    t = tiling(b, 0)
    plain = build_tile_composite(b.indices, b.data, t, (512,))
    padded = build_tile_composite(b.indices, b.data, t, (512,), camping_pad=True)
    slots = plain.wl_w.astype(np.int64) * np.abs(plain.wl_h)
    hit = slots % 512 == 0
    assert hit.any() and not hit.all()
    gaps = np.diff(padded.wl_slot) - slots[:-1]
    assert set(gaps.tolist()) <= {0, CAMPING_PAD} and np.array_equal(gaps == CAMPING_PAD, hit[:-1])
    x = np.random.default_rng(4).uniform(-1, 1, b.n_cols)
    np.testing.assert_allclose(evaluate_tile_composite(padded, x, b.n_rows),
                               evaluate_tile_composite(plain, x, b.n_rows), rtol=1e-12)


def test_workload_count_must_match_the_tiles():
    m = canonicalize(power_law(3000, seed=15))
    fam = families.get("tile_composite")
    n_tiles = tiling(ordered_matrix(m, "degree"), 64).n_tiles
    with pytest.raises(ValueError, match=f"into {n_tiles} tiles, but 2 workload sizes"):
        fam.launch(m, TileCompositeParams(64, (8, 8)))
    with pytest.raises(ValueError, match="workloads"):
        TileCompositeParams(64, ())
    with pytest.raises(ValueError, match="tile_width"):
        TileCooParams(-5)
    # A plan read back from JSON gives a list: it becomes the same (hashable) parameters.
    assert TileCompositeParams(64, [8, 9]) == TileCompositeParams(64, (8, 9))


def test_a_long_workload_tuple_gets_a_short_unique_label():
    a = Specialization("tile_composite", TileCompositeParams(64, tuple(range(1, 40))), np.dtype("float32"),
                       np.dtype("int32"), False)
    b = Specialization("tile_composite", TileCompositeParams(64, tuple(range(2, 41))), np.dtype("float32"),
                       np.dtype("int32"), False)
    assert "workloads=[39:1..39#" in a.label() and a.label() != b.label() and len(a.label()) < 120


def test_without_a_profile_each_tile_fills_the_gpu_once():
    assert fill_workload(10, 10_020, 100) == 100  # 10,020 entries over 100 warps, a multiple of the first row
    assert fill_workload(300, 302, 100) == 300  # never below the longest row
    assert fill_workload(0, 0, 100) == 1  # an empty tile still gets a valid size


def test_algorithm_2_picks_the_workload_size_of_least_modelled_time(profile):
    b = plan_of(power_law(6000, seed=16))
    lengths, counts = np.unique(tiling(b, 0).tile_lengths(0), return_counts=True)
    lengths, counts = lengths[::-1], counts[::-1]
    keys = tc_model.tile_keys(profile, False)
    fr = np.array([0.2, 0.5, 0.3])
    options = tc_model.candidates(lengths[0], lengths @ counts, profile.max_active_warps(keys["row"]))
    assert all(o % lengths[0] == 0 or (o < lengths[0] and o % 32 == 0) for o in options) and lengths[0] in options
    times = {wl: tc_model.tile_time(lengths, counts, wl, profile, keys, fr) for wl in options}
    wl, t = tc_model.partition(lengths, counts, profile, keys, fr)
    assert len(set(times.values())) > 3 and t == min(times.values()) and times[wl] == t


def test_tile_times_are_equations_1_to_5_over_every_workload_spelt_out():
    # Rates per distinct length, made up; each workload is looked up by its first row, charged its
    # rectangle, and held alone for its rounds (row-major: h rows; column-major: h / (w + 1 up to 32)).
    rng = np.random.default_rng(7)
    # A power-law tile, and one whose last row-major workload is cut short (7 rows of 50 in threes).
    check_tile_times(np.sort(rng.zipf(1.7, 3000) % 700)[::-1], [32, 700, 1400, 5000], rng)
    assert check_tile_times(np.array([50] * 7), [150, 100], rng).tail_rows.tolist() == [1, 1]


def check_tile_times(ranked, sizes, rng):
    from tuner.formats.tile_composite import col_shape_height, pack_many
    from tuner.model.waves import wave_time
    lengths, counts = np.unique(ranked[ranked > 0], return_counts=True)
    lengths, counts = lengths[::-1], counts[::-1]
    rates = {k: (rng.uniform(1e5, 1e6, lengths.size), rng.uniform(1e-4, 1e-2, lengths.size)) for k in ("row", "col")}
    # Row-major workloads of 4 or more rows run at a second table's rate; between 1 and 4 rows, at a rate
    # geometric in the rows between the two.
    four = rates["row"][0] * rng.uniform(1.0, 2.0, lengths.size)
    rates["heights"] = (np.array([1, 4]), np.log2(np.stack([rates["row"][0], four])))
    packed = pack_many(lengths, counts, sizes)
    times = tc_model.tile_times(packed, rates, max_active_warps=40)
    for wl, t in zip(sizes, times):
        p = pack(ranked, wl)
        first = ranked[p.start]
        run = np.searchsorted(-lengths, -first)
        kind = np.where(p.row_major, 0, 1)
        f = np.clip(np.log2(p.h) / 2, 0, 1)
        row = rates["row"][0][run] ** (1 - f) * four[run] ** f
        perf = np.choose(kind, [row, rates["col"][0][run]])
        unit = np.choose(kind, [rates["row"][1][run], rates["col"][1][run]])
        rounds = np.where(p.row_major, p.h, p.h / col_shape_height(first))
        assert t == pytest.approx(wave_time(first * p.h, perf, 40, alone=unit * rounds), rel=1e-12)
    assert len(set(np.round(times, 12))) == len(sizes)
    return packed


def test_tile_time_is_equations_1_to_5_over_the_packed_workloads(profile):
    # Rows of 64 with WL = 64: one-row row-major warps of 64 entries, table 1e6 (l1) -> 64 / 1e6 ms each.
    keys = tc_model.tile_keys(profile, False)
    t = tc_model.tile_time(np.array([64]), np.array([4000]), 64, profile, keys, np.array([1.0, 0.0, 0.0]))
    assert t == pytest.approx(4000 * 64 / 1e6)


def test_the_model_sees_the_locality_that_narrow_tiles_buy(profile):
    # Each tile's warps gather from its own columns: tiles of 256 columns (32 sectors) fit an L1 of 64
    # sectors and hit it always; all 2,048 columns (256 sectors) hit it a quarter of the time. With rows of
    # 64 entries per tile either way on the table's plateau, the L1's doubled rate shows.
    prof = Profile.from_json(fake_profile_json(l1_sectors=64.0, l2_sectors=1e6))
    m = canonicalize(sp.random(500, 2048, density=0.25, format="csr", random_state=5, dtype=np.float32))
    spec = lambda w: Specialization("tile_coo", TileCooParams(w), m.value_dtype, m.index_dtype, False)
    assert predict_lookup(m, spec(256), prof) < 0.8 * predict_lookup(m, spec(0), prof)


def test_with_a_profile_the_space_uses_its_l1_and_algorithm_2(profile):
    prof = Profile.from_json(fake_profile_json(l1_sectors=128.0))
    m = canonicalize(power_law(6000, seed=17))
    specs = families.specializations(m, ["tile_coo", "tile_composite"], profile=prof)
    widths = sorted({s.params.tile_width for s in specs})
    assert widths == [256, 512, 1024]  # a quarter, half and all of 128 sectors of 8 floats
    # Predicted on the relabelled matrix's tiles (the caller's order cuts different ones).
    assert all(p is not None and p > 0 for p in predict_many(m, specs, prof))
    b = ordered_matrix(m, "degree")
    for s in specs:
        if s.family == "tile_composite":
            t = tiling(b, s.params.tile_width)
            ranked = [np.sort(t.tile_lengths(k))[::-1] for k in range(t.n_tiles)]
            assert all(wl in tc_model.candidates(r[0], r.sum(), prof.max_active_warps("tile_composite:row:256:v"))
                       for wl, r in zip(s.params.workloads, ranked) if r.size)


def test_the_widths_partitioned_side_by_side_give_the_workloads_of_one_after_another(profile, monkeypatch):
    from tuner.families import tile_composite as tc
    prof = Profile.from_json(fake_profile_json(l1_sectors=128.0))
    one_after_another = tc.space(canonicalize(power_law(6000, seed=18)), prof)
    monkeypatch.setattr(tc, "PARALLEL_ENTRIES", 0)
    side_by_side = tc.space(canonicalize(power_law(6000, seed=18)), prof)
    assert len(side_by_side) == 3 and side_by_side == one_after_another


def tiled_case():
    """A profile whose L1 holds 16 sectors and an R-MAT graph cut into tiles of 32 to 128 columns (the full
    tiles fit that L1, the last one, of the columns with one entry or none, does not: its gather shares
    differ), with the tiled candidates Algorithm 2 makes for it."""
    prof = Profile.from_json(fake_profile_json(l1_sectors=16.0, l2_sectors=400.0))
    m = canonicalize(tuner.load("rmat:13"))
    return prof, m, families.specializations(m, ["tile_coo", "tile_composite"], profile=prof)


def tile_by_tile(view, spec, prof):
    """The tiled launch's SegmentSums one tile at a time: each tile's warps as a histogram (TILE-COO: COO
    warps by the row's length inside the tile; TILE-Composite: row-major then column-major workloads of the
    chosen packing), summed by segment_sums with that tile's gather shares (from its share of L1 beside the
    tiles resident with it)."""
    from tuner.families.base import plan_matrix
    from tuner.families.tile_composite import packed
    from tuner.families.tiles import bounds, ranked_tile_runs
    from tuner.model.profile_data import kernel_key
    from tuner.model.tables import SegmentSums, gather_fractions, segment_sums, table_for
    from tuner.model.warps import WarpHistogram, flat_histogram
    from tuner.model.tables import column_fractions
    from tuner.model.tiled import resident_share
    p, tiles, plan = spec.params, [], plan_matrix(view)
    cuts = bounds(view, p.tile_width)
    for t in range(cuts.size - 1):
        if spec.family == "tile_coo":
            lengths, counts = ranked_tile_runs(plan, p.tile_width).tile(t)
            parts = [("aligned_coo", "flat", flat_histogram(lengths, "flat", counts))]
            warps = (lengths @ counts) // 32
        else:
            s = packed(plan, p.tile_width, t, p.workloads[t])
            parts = [("tile_composite", kind, WarpHistogram.of_warps(s.length[k], s.size[k], s.rounds[k], count=s.count[k]))
                     for kind, k in (("row", s.row_major), ("col", ~s.row_major))]
            warps = s.count.sum()
        tiles.append((parts, warps))
    # Each tile's gathers hold the share of L1 that its warps leave it beside its neighbours'.
    resident = prof.max_active_warps(table_for(prof, kernel_key(*tiles[0][0][0][:2], p.block_size, view.value_free))[0])
    shares = column_fractions(view, prof, cuts, resident_share(np.array([w for _, w in tiles], float), resident),
                              tiles=True)
    rows = []
    for (parts, _), fractions in zip(tiles, shares):
        for family, part, warps in parts:
            if warps.w.size:
                key, nbytes = table_for(prof, kernel_key(family, part, p.block_size, view.value_free))
                sums = segment_sums(prof, key, warps, fractions)
                rows.append((*sums, -(-warps.warps * 32 // p.block_size), nbytes, prof.max_active_warps(key), key))
    return SegmentSums.of_rows(rows)


def test_tiled_launches_summed_at_once_equal_their_tiles_summed_one_by_one():
    from tuner.families.base import ordered_structure
    from tuner.families.tiles import bounds
    from tuner.model.tables import gather_fractions
    from tuner.model.tiled import TILED_SUMS, tile_fractions
    prof, m, specs = tiled_case()
    assert {s.family for s in specs} == {"tile_coo", "tile_composite"}
    for spec in specs:
        view = ordered_structure(m, spec.params.order)
        if spec.params.tile_width:
            shares = tile_fractions(view, prof, spec.params.tile_width)
            assert shares.sum(axis=1) == pytest.approx(1.0) and (shares[:, 0] < 1).all()  # first touches miss L1
            cuts = bounds(view, spec.params.tile_width)
            assert shares.tolist() == [gather_fractions(view, prof, (int(a), int(b))).tolist()
                                       for a, b in zip(cuts[:-1], cuts[1:])]
        at_once = TILED_SUMS[spec.family](view, spec.params, prof)
        one_by_one = tile_by_tile(view, spec, prof)
        assert at_once.blocks.tolist() == one_by_one.blocks.tolist() and at_once.blocks.size > 2
        assert at_once.max_active == one_by_one.max_active and at_once.keys == one_by_one.keys
        for name in ("work", "profiled_bytes", "alone_sum", "alone_max", "widths"):
            assert getattr(at_once, name) == pytest.approx(getattr(one_by_one, name), rel=1e-12), name


def test_algorithm_2_over_every_tile_at_once_chooses_as_tile_by_tile():
    from tuner.families.tiles import bounds, ranked_tile_runs
    from tuner.model.tables import gather_fractions
    prof, m, specs = tiled_case()
    plan = ordered_matrix(m, "degree")
    keys = tc_model.tile_keys(prof, plan.value_free)
    for spec in (s for s in specs if s.family == "tile_composite"):
        width = spec.params.tile_width
        runs, cuts = ranked_tile_runs(plan, width), bounds(plan, width)
        alone = [tc_model.partition(*runs.tile(t), prof, keys, gather_fractions(plan, prof, (int(a), int(b))))[0]
                 for t, (a, b) in enumerate(zip(cuts[:-1], cuts[1:]))]
        assert tc_model.partition_tiles(plan, width, runs, prof) == spec.params.workloads == tuple(alone)
        assert len(set(alone)) > 1


def test_a_tile_composite_plan_equals_itself_read_back_from_json():
    import json
    from tuner.families.base import params_dict
    p = TileCompositeParams(64, (8, 16, 24))
    d = params_dict(p)
    assert json.loads(json.dumps(d)) == d
    assert families.get("tile_composite").params_from_dict(json.loads(json.dumps(d))) == p


def test_a_tile_of_few_warps_shares_l1_with_the_tiles_resident_beside_it():
    # Two tiles of 64 sectors each, gathered uniformly, and an L1 of 64 sectors: a tile whose warps far
    # outnumber the GPU's resident ones has L1 to itself and hits but for its first touch of each sector;
    # one of as many warps as are resident shares the window with its neighbours two thirds of the time,
    # so an LRU of 2/3 of 64 sectors hits 2/3 of its gathers once warm (after T = 64 ln 3 of them).
    from tuner.families.tiles import bounds
    from tuner.model.tiled import resident_share, shared_fractions
    prof = Profile.from_json(fake_profile_json(l1_sectors=64.0, l2_sectors=1e6))
    rng = np.random.default_rng(3)
    cols = np.concatenate([rng.permutation(512), 512 + rng.permutation(512)] * 40)
    rows = np.repeat(np.arange(cols.size // 64), 64)
    m = canonicalize(sp.csr_matrix((np.ones(cols.size, np.float32), (rows, cols)), shape=(rows[-1] + 1, 1024)))
    assert bounds(m, 512).tolist() == [0, 512, 1024]
    alone = shared_fractions(m, prof, 512, np.array([1e7, 1e7]), 1000)
    beside = shared_fractions(m, prof, 512, np.array([1000.0, 1000.0]), 1000)
    n = 40 * 512 / prof.constants["sm_count"]  # each tile's gathers per SM
    t = 64 * np.log(3)
    assert alone[:, 0] == pytest.approx([1 - 64 * -np.expm1(-n / 64) / n] * 2, rel=1e-4)  # the sweep: ~1
    assert beside[:, 0] == pytest.approx([(t - 64 * 2 / 3 + (n - t) * 2 / 3) / n] * 2, rel=1e-4)
    assert 0.6 < beside[0, 0] < 2 / 3 < 0.95 < alone[0, 0] < 1 and beside[:, 2].tolist() == [0.0, 0.0]
    assert resident_share(np.array([1000.0, 250.0]), 1000).tolist() == pytest.approx([2 / 3, 0.25 * (1 - 0.25 / 3)])


def test_row_major_workloads_of_several_rows_run_at_the_rate_measured_for_as_many_rows():
    # Rows of 64 packed four to a warp: the profile's table of 4-row workloads (twice the one-row rate)
    # sets their rate; a profile without it reads the one-row table for them.
    import json
    from tuner.model.tables import row_heights
    from tuner.profile import synthetic
    raw = json.loads(fake_profile_json(max_active=10 ** 6))
    one = Profile.from_json(json.dumps({**raw, "tables": {k: t for k, t in raw["tables"].items()
                                                          if not k.startswith("tile_composite:row") or
                                                          k.startswith("tile_composite:row:")}}))
    for key in ("tile_composite:row4:256:v", "tile_composite:row4:256:vf"):
        pts = raw["tables"][key]["points"]
        raw["tables"][key]["points"] = {r: {w: 2 * v for w, v in p.items()} for r, p in pts.items()}
    four = Profile.from_json(json.dumps(raw))
    assert row_heights(one, False, 256) == ((1, "tile_composite:row:256:v"),)
    assert [h for h, _ in row_heights(four, False, 256)] == [1, 2, 4, 8, 16, 32]
    from tuner.profile import synthetic
    from tuner.model.tables import row_heights
    m = synthetic(64, 20_000, 4096, False, seed=2)
    spec = Specialization("tile_composite", TileCompositeParams(0, (256,), False, 256, "none"), m.value_dtype,
                          m.index_dtype, False)
    launch = one.constants["launch_overhead_ms"]
    slow, fast = (predict_lookup(m, spec, p) - launch for p in (one, four))
    assert fast == pytest.approx(slow / 2, rel=1e-9)
    # Algorithm 3's time of that tile reads the same rates.
    t = {name: tc_model.tile_time(np.array([64]), np.array([20_000]), 256, p, tc_model.tile_keys(p, False),
                                  np.array([1.0, 0.0, 0.0])) for name, p in (("one", one), ("four", four))}
    assert t["four"] == pytest.approx(t["one"] / 2, rel=1e-9)


def columns_by_degree(seed: int, width: int = 256):
    """A power-law matrix with hub columns (tiles of very different sizes), its columns renumbered by
    decreasing length as tiles are cut; with its column lengths and the tiles' bounds."""
    A = power_law(6000, seed=seed).T.tocsr()
    A.sort_indices()
    lengths = np.bincount(A.indices, minlength=A.shape[1])
    order = np.argsort(-lengths, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    B = sp.csr_matrix((A.data, rank[A.indices], A.indptr), shape=A.shape)
    B.sort_indices()
    lengths = lengths[order]
    return B, lengths, tile_bounds(lengths, width)


@pytest.mark.parametrize("group_entries", [1, 5_000, 40_000, 1 << 40])
@pytest.mark.parametrize("pattern,camping", [(False, False), (True, True)])
def test_a_layout_built_a_group_of_tiles_at_a_time_equals_the_one_build(group_entries, pattern, camping):
    from tuner.formats.tile_composite import build_tile_composite_grouped
    from tuner.formats.tiles import tile_entries, tile_groups
    B, lengths, bounds = columns_by_degree(81)
    rng = np.random.default_rng(5)
    workloads = tuple(int(w) for w in rng.choice([32, 64, 128, 256, 512], bounds.size - 1))
    data = None if pattern else B.data
    one = build_tile_composite(B.indices, data, tile_entries(B.indptr, B.indices, B.shape[1], bounds), workloads,
                               camping)
    grouped = build_tile_composite_grouped(B.indptr, B.indices, data, bounds, lengths, workloads, camping,
                                           group_entries=group_entries)
    groups = tile_groups(lengths, bounds, group_entries)
    assert (len(groups) == 1) == (group_entries == 1 << 40)
    total = np.concatenate([[0], np.cumsum(lengths)])
    for t0, t1 in groups:  # within the budget, or a single tile over it
        assert t1 - t0 == 1 or total[bounds[t1]] - total[bounds[t0]] <= group_entries
    for field in ("cols", "vals", "rows", "wl_slot", "wl_row", "wl_w", "wl_h", "tile_warps"):
        a, b = getattr(one, field), getattr(grouped, field)
        assert (a is None and b is None) or (a.dtype == b.dtype and np.array_equal(a, b)), field
    x = np.random.default_rng(6).uniform(0.5, 1.5, B.shape[1])
    y = evaluate_tile_composite(grouped, x, B.shape[0], pattern_value=1.0)
    assert np.allclose(y, (abs(B) > 0 if pattern else B) @ x, rtol=1e-12)


@pytest.mark.parametrize("group_entries", [1, 5_000, 40_000, 1 << 40])
@pytest.mark.parametrize("pattern", [False, True])
def test_a_tile_coo_layout_built_a_group_of_tiles_at_a_time_equals_the_one_build(group_entries, pattern):
    from tuner.formats.tile_coo import build_tile_coo, build_tile_coo_grouped
    from tuner.formats.tiles import tile_entries
    B, lengths, bounds = columns_by_degree(83)
    assert bounds.size > 3
    data = None if pattern else B.data
    one = build_tile_coo(B.indptr, B.indices, data, tile_entries(B.indptr, B.indices, B.shape[1], bounds))
    grouped = build_tile_coo_grouped(B.indptr, B.indices, data, bounds, lengths, group_entries=group_entries)
    assert grouped.sizes == one.sizes and grouped.layout == one.layout == "flat"
    for field in ("flat_rows", "flat_cols", "flat_vals"):
        a, b = getattr(one, field), getattr(grouped, field)
        assert (a is None and b is None) or (a.dtype == b.dtype and np.array_equal(a, b)), field
    live = grouped.flat_rows >= 0
    y = np.bincount(grouped.flat_rows[live], minlength=B.shape[0],
                    weights=(np.ones(live.sum()) if pattern else grouped.flat_vals[live]) *
                    np.arange(1.0, B.shape[1] + 1)[grouped.flat_cols[live]])
    assert np.allclose(y, (abs(B) > 0 if pattern else B) @ np.arange(1.0, B.shape[1] + 1), rtol=1e-12)


def test_the_tile_order_alone_is_the_tilings_order_and_groups_skip_the_runs_where_asked():
    from tuner.formats.tiles import TiledEntries, grouped_tiles, tile_entries, tile_order
    B, lengths, bounds = columns_by_degree(84)
    full, alone = tile_entries(B.indptr, B.indices, B.shape[1], bounds), tile_order(B.indptr, B.indices, bounds)
    assert not isinstance(alone, TiledEntries)
    assert np.array_equal(alone.order, full.order) and np.array_equal(alone.tile_starts, full.tile_starts)
    assert np.array_equal(alone.bounds, full.bounds) and alone.n_tiles == full.n_tiles == bounds.size - 1
    for runs in (True, False):
        parts = list(grouped_tiles(B.indptr, B.indices, None, bounds, lengths, group_entries=5_000, runs=runs))
        assert len(parts) > 2 and all(isinstance(g.tiled, TiledEntries) == runs for g in parts)
        assert sum(int(g.tiled.tile_starts[-1]) for g in parts) == B.nnz


def test_tile_groups_hold_at_most_their_entries_unless_one_tile_is_larger():
    from tuner.formats.tiles import tile_groups
    lengths = np.array([9, 1, 1, 1, 3, 3, 0, 2])
    bounds = np.array([0, 1, 2, 4, 6, 8])  # tiles of 9, 1, 2, 6 and 2 entries
    assert tile_groups(lengths, bounds, 4) == [(0, 1), (1, 3), (3, 4), (4, 5)]
    assert tile_groups(lengths, bounds, 100) == [(0, 5)]


def test_layout_parts_too_large_to_join_on_the_device_are_joined_through_the_host(monkeypatch):
    from types import SimpleNamespace
    from tuner.formats import device_reorder, tile_composite as tc
    from tuner.formats.tile_composite import build_tile_composite, concatenate_layouts
    from tuner.formats.tiles import grouped_tiles
    A = power_law(6000, seed=84).T.tocsr()
    A.sort_indices()
    lengths = np.bincount(A.indices, minlength=A.shape[1])
    bounds = tile_bounds(lengths, 256)
    parts = [build_tile_composite(g.cols, g.vals, g.tiled, (64,) * (g.end - g.first))
             for g in grouped_tiles(A.indptr, A.indices, A.data, bounds, lengths, group_entries=2000)]
    assert len(parts) > 2
    direct = concatenate_layouts(list(parts))
    uploads = []
    device = SimpleNamespace(concatenate=np.concatenate, asarray=lambda a: uploads.append(a) or np.asarray(a))
    monkeypatch.setattr(tc, "module", lambda a: device)  # every part "on a device" with no room to spare
    monkeypatch.setattr(device_reorder, "free_bytes", lambda: 0)
    held = list(parts)
    joined = concatenate_layouts(held)
    assert all(h is not p for h, p in zip(held, parts))  # the caller's list no longer holds the device parts
    assert len(uploads) == 7 - (direct.vals is None)  # the whole layout uploaded once, array by array
    for field in ("cols", "vals", "rows", "wl_slot", "wl_row", "wl_w", "wl_h", "tile_warps"):
        assert np.array_equal(getattr(joined, field), getattr(direct, field)), field


def test_the_tiled_candidates_kernel_shapes_are_named_without_listing_their_tiles():
    from tuner.model.warps import SEGMENTS, segment_keys
    rng = np.random.default_rng(2)
    n = 3_000
    lengths = np.minimum(rng.zipf(1.7, n), 800)
    a = sp.csr_matrix((np.ones(int(lengths.sum()), np.float32),
                       (np.repeat(np.arange(n), lengths), rng.integers(0, n, int(lengths.sum())))), shape=(n, n))
    view = ordered_structure(canonicalize(a), "degree")
    for width in (64, 500):
        tiles = len(SEGMENTS["tile_coo"](view, TileCooParams(width)))
        assert tiles > 2  # a segment per tile
        for family, params in (("tile_coo", TileCooParams(width)),
                               ("tile_composite", TileCompositeParams(width, (8,) * tiles))):
            listed = SEGMENTS[family](view, params)
            assert segment_keys(view, family, params) == {key for key, _ in listed}
