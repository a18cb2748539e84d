"""Every format builder checked against SciPy through a NumPy evaluation of the built layout."""
import numpy as np
import pytest
import scipy.sparse as sp

from tuner import families
from tuner.formats.binned import build_binned, evaluate_binned
from tuner.formats.csr import row_sums
from tuner.matrix import canonicalize

from .conftest import REAL, fixture_matrices

FIXTURES = fixture_matrices()


def reference(m, x):
    return m.to_scipy().astype(np.float64) @ x.astype(np.float64)


def assert_every_candidate_matches(m):
    x = np.random.default_rng(5).uniform(-1, 1, m.n_cols).astype(m.value_dtype)
    ref = reference(m, x)
    for spec in families.specializations(m):
        fam = families.get(spec.family)
        built = fam.launch(m, spec.params)
        y = fam.apply(m, built, x)
        assert np.isfinite(y).all(), f"{spec.label()} leaves rows unwritten"
        np.testing.assert_allclose(y, ref, rtol=1e-9, atol=1e-9, err_msg=spec.label())


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_every_family_layout_computes_scipy_result_on_fixture(name):
    assert_every_candidate_matches(canonicalize(FIXTURES[name]))


@pytest.mark.parametrize("path", REAL[:4], ids=lambda p: p.stem)
def test_every_family_layout_computes_scipy_result_on_real_matrix(path):
    assert_every_candidate_matches(canonicalize(sp.load_npz(path)))


def test_row_sums_handles_selected_and_empty_rows():
    indptr, indices = np.array([0, 2, 2, 5]), np.array([0, 2, 0, 1, 2])
    data = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    x = np.array([1.0, 10.0, 100.0])
    assert row_sums(indptr, indices, data, x, np.array([2, 1, 0])).tolist() == [543.0, 0.0, 201.0]
    assert row_sums(indptr, indices, None, x, np.array([0]), pattern_value=2.0).tolist() == [202.0]


def test_binned_classes_follow_thresholds_and_keep_order_inside_a_class():
    lengths = np.array([0, 7, 8, 15, 16, 100, 3, 9])
    f = build_binned(lengths, small_max=8, medium_max=16)
    assert f.counts == (3, 3, 2, 0)
    assert f.row_ids.tolist() == [0, 1, 6, 2, 3, 7, 4, 5]
    assert f.row_ids.dtype == np.int32
    h = build_binned(lengths, 8, 16, huge_min=100, dtype=np.int64)
    assert h.counts == (3, 3, 1, 1) and h.row_ids.tolist()[-2:] == [4, 5] and h.row_ids.dtype == np.int64


def test_binned_rejects_inverted_thresholds():
    with pytest.raises(ValueError, match="small_max"):
        build_binned(np.array([1, 2]), small_max=16, medium_max=8)
    with pytest.raises(ValueError, match="huge_min"):
        build_binned(np.array([1, 2]), small_max=4, medium_max=8, huge_min=6)


def test_binned_evaluation_writes_each_row_exactly_through_its_class():
    m = canonicalize(FIXTURES["power_law"])
    f = build_binned(m.row_lengths, 4, 32)
    x = np.random.default_rng(1).standard_normal(m.n_cols)
    y = evaluate_binned(f, m.indptr, m.indices, m.data, x, m.n_rows)
    np.testing.assert_allclose(y, reference(m, x), rtol=1e-12, atol=1e-12)
    assert sorted(f.row_ids.tolist()) == list(range(m.n_rows))


def test_binned_launch_geometry_covers_every_class():
    m = canonicalize(FIXTURES["one_dense_row"])
    fam = families.get("binned")
    p = fam.params_type(small_max=4, medium_max=16, warp_division=4, huge_min=300, block_size=256)
    built = fam.launch(m, p)
    s = dict(built.scalars)
    n_small, n_medium, n_large, n_huge = s["n_small"], s["n_medium"], s["n_large"], s["n_huge"]
    assert n_small + n_medium + n_large + n_huge == m.n_rows and n_huge == 1  # the dense row
    assert s["medium_block0"] == -(-n_small // 256)
    assert s["large_block0"] == s["medium_block0"] + -(-n_medium * 8 // 256)
    assert s["huge_block0"] == s["large_block0"] + -(-n_large * 32 // 256)
    assert built.grid == s["huge_block0"] + n_huge


def test_binned_space_offers_huge_class_only_where_rows_reach_it():
    m = canonicalize(FIXTURES["one_dense_row"])  # longest row 400
    huge = {s.params.huge_min for s in families.specializations(m, ["binned"])}
    assert huge == {None, 16, 32, 96}
    longest = canonicalize(FIXTURES["long_rows"]).row_lengths.max()
    assert longest >= 1024
    assert 1024 in {s.params.huge_min for s in families.specializations(canonicalize(FIXTURES["long_rows"]),
                                                                         ["binned"])}


def test_shared_layout_is_built_once_per_matrix_and_key():
    m = canonicalize(FIXTURES["power_law"])
    fam = families.get("binned")
    a = fam.launch(m, fam.params_type(small_max=4, medium_max=16, warp_division=4))
    b = fam.launch(m, fam.params_type(small_max=4, medium_max=16, warp_division=8))
    c = fam.launch(m, fam.params_type(small_max=8, medium_max=16, warp_division=8))
    assert dict(a.arrays)["row_ids"] is dict(b.arrays)["row_ids"]
    assert dict(a.arrays)["row_ids"] is not dict(c.arrays)["row_ids"]


def test_csr_vector_space_drops_groups_wider_than_the_longest_row():
    m = canonicalize(sp.csr_matrix(np.array([[1.0, 2, 3], [0, 0, 4]])))
    widths = {s.params.threads_per_row for s in families.specializations(m, ["csr_vector"])}
    assert widths == {1, 2, 4}


def test_value_free_layouts_never_carry_values():
    m = canonicalize(FIXTURES["pattern"])
    assert m.value_free
    for spec in families.specializations(m):
        names = [n for n, _ in families.get(spec.family).launch(m, spec.params).arrays]
        assert not [n for n in names if n == "data" or n.endswith("_vals")], spec.label()


@pytest.mark.parametrize("bad", [dict(threads_per_row=3), dict(block_size=100)])
def test_csr_vector_parameters_are_validated(bad):
    with pytest.raises(ValueError):
        families.get("csr_vector").params_type(**bad)


@pytest.mark.parametrize("bad", [dict(small_max=16, medium_max=8), dict(warp_division=3),
                                 dict(medium_max=32, huge_min=16)])
def test_binned_parameters_are_validated(bad):
    with pytest.raises(ValueError):
        families.get("binned").params_type(**bad)


def test_unknown_family_names_the_known_ones():
    with pytest.raises(KeyError, match="csr_vector"):
        families.get("tile_ell")
