"""ALIGNED_COO (paper 004): Algorithm 1, the layout's invariants, its geometry and its NumPy evaluation."""
import numpy as np
import pytest
import scipy.sparse as sp

from tuner import families
from tuner.families.aligned_coo import AlignedCooParams, grid
from tuner.formats.aligned_coo import (LAYOUTS, Segmentation, build_aligned_coo, evaluate_aligned_coo, segment_size, sizes,
                                       split_lengths)
from tuner.matrix import canonicalize

from .conftest import fixture_matrices, power_law

FIXTURES = fixture_matrices()
FIG2 = sp.csr_matrix(np.array([[0, 2, 0, 4, 5], [1, 0, 0, 0, 0], [0, 3, 6, 0, 0], [0, 7, 0, 8, 0],
                               [0, 0, 0, 9, 0], [10, 0, 0, 0, 0]], dtype=np.float32))


def literal_algorithm_1(L):
    """Algorithm 1 exactly as printed (a Python loop), to check the vectorised one against."""
    nr, nnz = len(L), int(np.sum(L))
    num = int(max(L))
    size = max(nnz // num, sum(1 for v in L if v >= nnz / nr))
    while size + 1 < nr and L[size] + L[size + 1] >= num:
        size += 1
    return min(size, nr), num


def test_fig2_matrix_gives_the_papers_vectors():
    f = build_aligned_coo(FIG2.indptr, FIG2.indices, FIG2.data, "hybrid")
    # Fig. 2(b), padding 'p' as row -1 / column -1 / value 0.
    assert f.seg_rows.tolist() == [0, 1, 3, 5, 0, 2, 3, -1, 0, 2, 4, -1]
    assert f.seg_cols.tolist() == [1, 0, 1, 0, 3, 1, 3, -1, 4, 2, 3, -1]
    assert f.seg_vals.tolist() == [2, 1, 7, 10, 4, 3, 8, 0, 5, 6, 9, 0]
    assert (f.sizes.lanes, f.sizes.seg_len) == (4, 3)
    assert f.flat_rows.size == 0


@pytest.mark.parametrize("seed", range(6))
def test_vectorised_algorithm_1_matches_the_printed_loop(seed):
    rng = np.random.default_rng(seed)
    L = np.sort(rng.zipf(1.6, 400).clip(max=300))[::-1] if seed % 2 else rng.integers(1, 9, 300)
    assert tuple(segment_size(L).__dict__.values()) == literal_algorithm_1(list(L))


def test_algorithm_1_on_equal_rows_gives_one_lane_per_row():
    assert segment_size(np.full(1000, 7)) == Segmentation(1000, 7)
    assert literal_algorithm_1([7] * 1000) == (1000, 7)
    assert segment_size(np.zeros(5, np.int64)).num_segs == 0


def test_hybrid_splits_warp_multiples_from_trailing_entries():
    flat, seg = split_lengths(np.array([0, 31, 32, 33, 100]), "hybrid")
    assert flat.tolist() == [0, 0, 32, 32, 96]
    assert seg.tolist() == [0, 31, 0, 1, 4]
    with pytest.raises(ValueError, match="unknown ALIGNED_COO layout 'ell'"):
        split_lengths(np.array([1]), "ell")


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", ["power_law", "long_rows", "one_dense_row", "empty_rows", "rectangular_tall"])
def test_every_segment_holds_at_most_one_entry_of_each_row(name, layout):
    m = canonicalize(FIXTURES[name])
    f = build_aligned_coo(m.indptr, m.indices, m.data, layout, m.index_dtype)
    g = f.sizes
    grid_rows = f.seg_rows.reshape(g.seg_len, g.lanes) if g.lanes else np.zeros((0, 0))
    for segment in grid_rows:
        live = segment[segment >= 0]
        assert np.unique(live).size == live.size
    # Every lane is full but the last: padding only at the end of the entry order.
    lane_major = grid_rows.T.ravel()
    assert (lane_major[:g.n_seg] >= 0).all() and (lane_major[g.n_seg:] == -1).all()
    assert g.lanes == -(-g.n_seg // g.seg_len) if g.seg_len else g.lanes == 0


@pytest.mark.parametrize("name", ["power_law", "long_rows", "one_dense_row"])
def test_hybrid_flat_warps_each_lie_in_one_row_and_seg_rows_stay_below_a_warp(name):
    m = canonicalize(FIXTURES[name])
    f = build_aligned_coo(m.indptr, m.indices, m.data, "hybrid", m.index_dtype)
    chunks = f.flat_rows.reshape(-1, 32)
    assert (chunks == chunks[:, :1]).all() and (chunks >= 0).all()
    seg_counts = np.bincount(f.seg_rows[f.seg_rows >= 0], minlength=m.n_rows)
    assert seg_counts.max() < 32
    np.testing.assert_array_equal(seg_counts + np.bincount(f.flat_rows, minlength=m.n_rows), m.row_lengths)


def test_padding_fetches_nothing_and_adds_nothing():
    m = canonicalize(power_law(700, seed=3))
    f = build_aligned_coo(m.indptr, m.indices, m.data, "flat", m.index_dtype)
    pad = f.flat_cols < 0
    assert pad.any() and (f.flat_rows[pad] == -1).all() and (f.flat_vals[pad] == 0).all()
    assert f.flat_cols.size % 32 == 0


@pytest.mark.parametrize("layout", LAYOUTS)
def test_sizes_from_lengths_match_the_built_layout(layout):
    m = canonicalize(FIXTURES["long_rows"])
    f = build_aligned_coo(m.indptr, m.indices, m.data, layout, m.index_dtype)
    assert sizes(m.row_lengths, layout) == f.sizes
    assert f.seg_rows.size == f.sizes.lanes * f.sizes.seg_len
    assert f.flat_rows.size == f.sizes.chunks * 32


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_evaluation_matches_scipy_in_float64(layout, index_dtype):
    A = power_law(2500, seed=9, dtype=np.float64)
    m = canonicalize(A, index_dtype=index_dtype)
    f = build_aligned_coo(m.indptr, m.indices, m.data, layout, m.index_dtype)
    assert f.seg_rows.dtype == f.flat_cols.dtype == np.dtype(index_dtype)
    x = np.random.default_rng(1).uniform(-1, 1, m.n_cols)
    np.testing.assert_allclose(evaluate_aligned_coo(f.parts, x, m.n_rows), A @ x, rtol=1e-12, atol=1e-12)


def test_empty_matrix_builds_an_empty_layout_and_yields_zeros():
    m = canonicalize(FIXTURES["all_empty"])
    f = build_aligned_coo(m.indptr, m.indices, m.data, "hybrid", m.index_dtype)
    assert f.sizes.lanes == f.sizes.chunks == 0 and f.seg_rows.size == 0
    assert grid(f.sizes, 256) == (0, 0)
    assert evaluate_aligned_coo(f.parts, np.arange(30.0), 40).tolist() == [0.0] * 40


def test_space_drops_the_hybrid_when_no_row_reaches_a_warp():
    short = canonicalize(FIXTURES["tiny"])
    assert {s.params.layout for s in families.specializations(short, ["aligned_coo"])} == {"seg", "flat"}
    long = canonicalize(FIXTURES["long_rows"])
    assert {s.params.layout for s in families.specializations(long, ["aligned_coo"])} == set(LAYOUTS)


def test_launch_zeroes_y_and_covers_both_parts():
    m = canonicalize(FIXTURES["long_rows"])
    built = families.get("aligned_coo").launch(m, AlignedCooParams("hybrid"))
    s = dict(built.scalars)
    assert built.zero_y
    assert s["seg_blocks"] * 256 >= s["lanes"] > (s["seg_blocks"] - 1) * 256
    flat_warps = (built.grid - s["seg_blocks"]) * 256 // 32
    assert flat_warps * 4 >= s["chunks"] > (flat_warps - 8) * 4


@pytest.mark.parametrize("bad", [dict(layout="ell"), dict(block_size=96 + 1), dict(order="random")])
def test_parameters_are_validated(bad):
    with pytest.raises(ValueError):
        AlignedCooParams(**bad)
