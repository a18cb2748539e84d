"""Gathers a block repeats (tuner.model.reuse): counted on the blocks each kernel shape launches, sampled
on large matrices, read through relabelled views, and served by L1 in the lookup model."""
import numpy as np
import pytest
import scipy.sparse as sp

from tuner.families.aligned_coo import AlignedCooParams
from tuner.families.base import Specialization, ordered_matrix, ordered_structure
from tuner.families.binned import BinnedParams
from tuner.families.csr_vector import CsrVectorParams
from tuner.formats.reorder import Structure
from tuner.matrix import canonicalize
from tuner.model import predict_lookup
from tuner.model import lookup, reuse
from tuner.model.locality import CacheLevel, sector_counts, sector_hits
from tuner.model.reuse import block_fractions, run_fractions, segment_fractions, touch_fractions
from tuner.model.warps import SEGMENTS, histogram


def band(n, half, dtype=np.float32, seed=0):
    """A band of 2 * half + 1 diagonals with distinct values."""
    rng = np.random.default_rng(seed)
    offsets = list(range(-half, half + 1))
    return canonicalize(sp.diags([rng.uniform(0.5, 1.5, n - abs(k)) for k in offsets], offsets, shape=(n, n),
                                 format="csr", dtype=dtype))


def scattered(n, per_row, seed=0):
    """Rows of ``per_row`` columns drawn uniformly: no two neighbouring rows share much."""
    rng = np.random.default_rng(seed)
    cols = rng.integers(0, n, (n, per_row))
    a = sp.csr_matrix((rng.uniform(0.5, 1.5, n * per_row).astype(np.float32), (np.repeat(np.arange(n), per_row),
                                                                               cols.ravel())), shape=(n, n))
    a.sum_duplicates()
    return canonicalize(a)


def cold(m):
    """Per-sector hit rates of caches of no capacity: only a block's repeats hit."""
    return sector_hits(sector_counts(m.col_lengths, m.value_dtype.itemsize), [CacheLevel(0.0), CacheLevel(0.0)]) + (
        np.array([0.0, 0.0, 1.0]),)


def exact_l1(m, rows, rows_per_block, hits=None, held=np.inf):
    lengths, cols = m.row_entries(rows)
    return touch_fractions(np.repeat(np.arange(rows.size) // rows_per_block, lengths), cols, m.value_dtype.itemsize,
                           cold(m) if hits is None else hits, held)[0]


def test_a_bands_blocks_repeat_the_sectors_counted_by_hand():
    # Tridiagonal, 64 rows, float32 (8 columns a sector): a block of 8 rows reads 3 sectors (2 at either
    # end) for 24 entries (23 at either end): 1 - 22 / 190 of its gathers repeat one.
    m = band(64, 1)
    assert block_fractions(m, 0, None, 8, cold(m))[0] == pytest.approx(1 - 22 / 190)
    # A row alone repeats a sector unless it straddles two: rows 8k - 1 and 8k do (14 of them).
    assert block_fractions(m, 0, None, 1, cold(m))[0] == pytest.approx(1 - (64 + 14) / 190)
    # Float64 values: 4 columns a sector, more sectors per block.
    m64 = band(64, 1, np.float64)
    assert block_fractions(m64, 0, None, 8, cold(m64))[0] < block_fractions(m, 0, None, 8, cold(m))[0]


def test_a_block_whose_sectors_outgrow_its_share_of_l1_keeps_only_that_share():
    m = band(64, 1)
    full = block_fractions(m, 0, None, 8, cold(m))[0]
    # Each block reads 3 sectors (2 at the ends); holding 1.5 of them, a middle block's repeats hit half
    # the time, an end block's 3/4 of it.
    half = block_fractions(m, 0, None, 8, cold(m), block_sectors=1.5)[0]
    assert half == pytest.approx((6 * 21 * 0.5 + 2 * 21 * 0.75) / 190)
    assert half < full
    assert block_fractions(m, 0, None, 8, cold(m), block_sectors=0.0)[0] == 0.0


def test_without_repeats_the_shares_are_the_cache_models():
    # One entry per row and a row per block: nothing repeats, so the shares are the whole matrix's, hot
    # columns (a Zipf law over 40,000 columns, 5,000 sectors) hitting as Che's approximation says.
    from tuner.model.locality import sector_fractions
    rng = np.random.default_rng(4)
    n, n_cols = 20_000, 40_000
    cols = np.minimum(rng.zipf(1.3, n), n_cols) - 1
    m = canonicalize(sp.csr_matrix((rng.uniform(0.5, 1.5, n).astype(np.float32), (np.arange(n), cols)), shape=(n, n_cols)))
    levels = [CacheLevel(30.0), CacheLevel(120.0)]
    counts = sector_counts(m.col_lengths, 4)
    want = sector_fractions(counts, *levels)
    assert 0.3 < want[0] < 0.95 and want[2] > 0.01  # all three levels serve some
    assert block_fractions(m, 0, None, 1, sector_hits(counts, levels) + (want,)) == pytest.approx(want)


def test_a_class_of_rows_is_blocked_in_its_own_order():
    # Rows alternate 2 and 6 entries; the class of long rows puts rows 1, 3, 5, 7 in one block, and the
    # j-th long row reads columns 4j to 4j + 5, so that neighbouring long rows share a sector of 8.
    lengths = np.tile([2, 6], 32)
    ij = (np.repeat(np.arange(64), lengths), np.concatenate([np.arange(k) + 4 * (i // 2) for i, k in enumerate(lengths)]))
    m = canonicalize(sp.csr_matrix((np.linspace(0.5, 1.5, lengths.sum()).astype(np.float32), ij), shape=(64, 300)))
    rows = np.flatnonzero(m.row_lengths >= 4)
    assert block_fractions(m, 4, None, 4, cold(m))[0] == pytest.approx(exact_l1(m, rows, 4))
    assert block_fractions(m, 4, None, 4, cold(m))[0] == pytest.approx(1 - 3 / 24)  # {0}, {0, 1}, {1}, {1, 2} ...
    assert block_fractions(m, 4, None, 1, cold(m))[0] == pytest.approx(1 - 6 / 24)  # ... each row alone: 1, 2, 1, 2


def test_a_block_of_more_entries_than_the_bound_is_served_as_the_whole_matrix(monkeypatch):
    m = band(64, 1)
    hits = cold(m)[:2] + (np.array([0.3, 0.5, 0.2]),)
    monkeypatch.setattr(reuse, "BLOCK_ENTRIES", 23)  # the 8-row blocks at either end (23 entries) are counted
    got = block_fractions(m, 0, None, 8, hits)
    ends = 2 * (23 - 2)  # their repeats: 2 sectors for 23 entries each
    assert got == pytest.approx([(ends + 6 * 24 * 0.3) / 190, 6 * 24 * 0.5 / 190, (4 + 6 * 24 * 0.2) / 190])


def test_large_classes_are_sampled_close_to_the_exact_share():
    m = band(200_000, 4)  # 1.8M entries: about 28 times the sample
    exact = exact_l1(m, np.arange(m.n_rows), 32)
    assert m.nnz > 20 * reuse.SAMPLE_ENTRIES
    assert block_fractions(m, 0, None, 32, cold(m))[0] == pytest.approx(exact, abs=0.01)
    assert 0.5 < exact < 1.0
    s = scattered(100_000, 16)
    assert block_fractions(s, 0, None, 32, cold(s))[0] < 0.05  # uniform columns over 12,500 sectors: few repeats


def test_runs_of_entries_are_counted_across_row_boundaries():
    m = band(64, 1)
    run = np.arange(m.nnz) // 24
    assert run_fractions(m, 24, cold(m))[0] == pytest.approx(touch_fractions(run, m.indices, 4, cold(m))[0])
    assert run_fractions(m, 1, cold(m)).tolist() == [0.0, 0.0, 1.0]


def test_a_relabelled_view_reads_its_rows_from_the_matrix_it_relabels():
    m = scattered(5_000, 6, seed=3)
    view = ordered_structure(m, "degree")
    assert isinstance(view, Structure)
    built = ordered_matrix(m, "degree")
    rows = np.array([0, 17, 4_999, 250])
    got, want = view.row_entries(rows), built.row_entries(rows)
    assert got[0].tolist() == want[0].tolist()
    assert [sorted(c) for c in np.split(got[1], np.cumsum(got[0])[:-1])] == \
        [sorted(c) for c in np.split(want[1], np.cumsum(want[0])[:-1])]
    assert block_fractions(view, 0, 4, 64, cold(built)) == pytest.approx(block_fractions(built, 0, 4, 64, cold(built)))
    with pytest.raises(ValueError, match="lengths only"):
        Structure(m.shape, m.nnz, m.index_dtype, m.value_dtype, False, m.row_lengths, m.col_lengths).row_entries(rows)


def test_each_kernel_shape_blocks_its_own_rows():
    m = band(4_096, 3)
    h = cold(m)
    segs = dict((s.group, s) for _, s in SEGMENTS["binned"](m, BinnedParams(5, 7, 8, 7, 256)))
    # binned's medium class (rows of 5 and 6 at the band's ends): 4 lanes a row, 64 rows a block; its huge
    # class (rows of 7): a block per row.
    assert (segment_fractions(m, segs[4], histogram(m, segs[4]), h) == block_fractions(m, 5, 7, 64, h)).all()
    assert (segment_fractions(m, segs["block"], histogram(m, segs["block"]), h) == block_fractions(m, 7, None, 1, h)).all()
    (_, csr), = SEGMENTS["csr_vector"](m, CsrVectorParams(16, 128))
    assert (segment_fractions(m, csr, histogram(m, csr), h, 40.0) == block_fractions(m, 0, None, 8, h, 40.0)).all()
    parts = dict((s.group, s) for _, s in SEGMENTS["aligned_coo"](m, AlignedCooParams("flat", 256)))
    assert (segment_fractions(m, parts["flat"], histogram(m, parts["flat"]), h) == run_fractions(m, 256 * 4, h)).all()


def test_a_band_whose_x_outgrows_l1_is_predicted_faster_for_its_repeats(monkeypatch):
    # The shipped H100 profile: x of 400,000 floats is 50,000 sectors, 9 times its L1, so the cache model
    # alone sends most gathers to L2; a band's blocks repeat theirs. Scattered columns repeat nothing.
    from tuner.model import load_profile
    profile = load_profile("NVIDIA H100 80GB HBM3")

    def predict(n):
        spec = Specialization("csr_vector", CsrVectorParams(4, 256), n.value_dtype, n.index_dtype, n.value_free)
        return predict_lookup(n, spec, profile)
    with_r = predict(band(400_000, 3)), predict(scattered(400_000, 7))
    monkeypatch.setattr(lookup, "segment_fractions", lambda *a: None)  # fresh matrices: nothing memoised
    without = predict(band(400_000, 3)), predict(scattered(400_000, 7))
    assert with_r[0] < 0.8 * without[0]
    assert with_r[1] == pytest.approx(without[1], rel=0.03)


def test_a_classs_sampled_rows_are_found_without_listing_the_class():
    # Power-law lengths over rows that are not a whole number of chunks, bounds below and above the uint8
    # lengths: the k-th row of each class is the k-th row of its mask.
    rng = np.random.default_rng(7)
    lengths = np.minimum(rng.zipf(1.6, 5_003), 3_000)
    view = Structure((lengths.size, 4_000), int(lengths.sum()), np.dtype(np.int32), np.dtype(np.float32), False,
                     lengths.astype(np.int64), np.ones(4_000, np.int64))
    for lo, hi in ((0, 4), (4, 96), (8, None), (96, 1024), (300, None), (1024, None)):
        mask = (lengths >= lo) & ((lengths < hi) if hi is not None else True)
        members = np.flatnonzero(mask)
        at = np.unique(np.concatenate([[0, members.size - 1], rng.integers(0, members.size, 50)]))
        assert reuse.class_rows_at(view, lo, hi, at).tolist() == members[at].tolist()
        chunks = -(-lengths.size // reuse.CHUNK_ROWS)
        assert reuse.rows_at_least(view, lo).tolist() == [
            int((lengths[c * reuse.CHUNK_ROWS:(c + 1) * reuse.CHUNK_ROWS] >= lo).sum()) for c in range(chunks)]
    assert reuse.row_ends(view).tolist() == np.cumsum(lengths).tolist()
    for lo, hi in ((0, 4), (4, 96), (8, None), (1024, None), (0, None), (5_000, None), (7, 7), (9, 3)):
        mask = (lengths >= lo) & ((lengths < hi) if hi is not None else True)
        assert reuse.class_size(view, lo, hi) == (int(mask.sum()), int(lengths[mask].sum()))


def test_a_sample_is_counted_once_whatever_share_of_l1_its_blocks_hold(monkeypatch):
    m = band(64, 1)
    calls = []
    counted = reuse._sampled_blocks
    monkeypatch.setattr(reuse, "_sampled_blocks", lambda *a: calls.append(a[1:4]) or counted(*a))
    shares = [block_fractions(m, 0, None, 8, cold(m), held)[0] for held in (np.inf, 1.5, 0.0)]
    assert calls == [(0, None, 8)]
    assert shares == pytest.approx([1 - 22 / 190, (6 * 21 * 0.5 + 2 * 21 * 0.75) / 190, 0.0])


def test_distinct_keys_are_counted_as_numpy_counts_them():
    from tuner.model.locality import distinct_counts
    rng = np.random.default_rng(2)
    for keys in (rng.integers(0, 50, 1_000), rng.integers(0, 1 << 40, 1_000), np.array([7, 7, 7]), np.zeros(0, np.int64)):
        want = np.unique(keys, return_counts=True)
        got = distinct_counts(keys)
        assert got[0].tolist() == want[0].tolist() and got[1].tolist() == want[1].tolist()
