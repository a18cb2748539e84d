"""Relabelling by degree (tuner.formats.reorder) and relabelled plans, checked against SciPy on the CPU."""
import contextlib

import numpy as np
import pytest
import scipy.sparse as sp

from tuner import families
from tuner.families.base import ordered_launch, ordered_matrix, ordered_structure, ordering
from tuner.families.csr_vector import CsrVectorParams
from tuner.formats.reorder import by_decreasing, col_ranks, degree_ordering, inverse, make_ordering, permute
from tuner.matrix import canonicalize

from .conftest import fixture_matrices, power_law

FIXTURES = fixture_matrices()


def scipy_permuted(m, o):
    return m.to_scipy()[o.row_order][:, o.col_order]


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_permuted_matrix_equals_scipy_selection_and_stays_canonical(name):
    m = canonicalize(FIXTURES[name])
    o = make_ordering(m, "degree")
    b = permute(m, o)
    assert b.shape == m.shape and b.nnz == m.nnz and b.index_dtype == m.index_dtype
    assert b.pattern_value == m.pattern_value
    assert (b.to_scipy() != scipy_permuted(m, o)).nnz == 0
    assert b.to_scipy().has_sorted_indices
    rows = np.repeat(np.arange(b.n_rows), b.row_lengths)
    assert np.all((np.diff(b.indices) > 0) | (np.diff(rows) > 0)), "columns must ascend inside each row"


def test_square_matrix_gets_one_permutation_by_total_degree():
    m = canonicalize(power_law(500, seed=3))
    o = make_ordering(m, "degree")
    assert o.symmetric and o.row_order is o.col_order
    total = (m.row_lengths + m.col_lengths)[o.row_order]
    assert np.all(np.diff(total) <= 0)
    assert o.row_order.dtype == m.index_dtype


def test_rectangular_matrix_orders_rows_and_columns_by_their_own_lengths():
    m = canonicalize(FIXTURES["rectangular_wide"])
    o = make_ordering(m, "degree")
    assert not o.symmetric
    assert o.row_order.size == m.n_rows and o.col_order.size == m.n_cols
    assert np.all(np.diff(m.row_lengths[o.row_order]) <= 0)
    assert np.all(np.diff(m.col_lengths[o.col_order]) <= 0)


def test_sort_is_stable_and_inverse_undoes_it():
    lengths = np.array([2, 5, 2, 0, 5, 1])
    order = by_decreasing(lengths)
    assert order.tolist() == [1, 4, 0, 2, 5, 3]
    assert inverse(order)[order].tolist() == list(range(6))


def test_model_structure_matches_the_permuted_matrix_without_building_it():
    m = canonicalize(power_law(2000, 1500, seed=4))
    s = ordered_structure(m, "degree")
    b = ordered_matrix(m, "degree")
    np.testing.assert_array_equal(s.row_lengths, b.row_lengths)
    np.testing.assert_array_equal(s.col_lengths, b.col_lengths)
    assert (s.shape, s.nnz, s.value_free, s.n_rows, s.n_cols) == (b.shape, b.nnz, b.value_free, 2000, 1500)


def test_orderings_and_permuted_matrices_are_built_once_per_matrix():
    m = canonicalize(power_law(300, seed=5))
    assert ordering(m, "degree") is ordering(m, "degree")
    assert ordered_matrix(m, "degree") is ordered_matrix(m, "degree")
    assert ordered_matrix(m, "none") is m and ordering(m, "none") is None


def test_relabelled_launch_carries_both_gathers_and_computes_caller_order_result():
    A = power_law(800, 600, seed=6)
    m = canonicalize(A)
    fam = families.get("csr_vector")
    built = fam.launch(m, CsrVectorParams(4, 128, "degree"))
    o = ordering(m, "degree")
    assert built.x_gather is o.col_order and built.y_gather is o.row_rank
    plain = fam.launch(m, CsrVectorParams(4, 128))
    assert plain.x_gather is None and plain.y_gather is None
    x = np.random.default_rng(1).uniform(-1, 1, 600)
    np.testing.assert_allclose(fam.apply(m, built, x), A.astype(np.float64) @ x, rtol=1e-6, atol=1e-6)
    # In the plan's order the same arrays give the permuted product.
    y_plan = fam.evaluate(m, built, x[o.col_order])
    np.testing.assert_allclose(y_plan, (A.astype(np.float64) @ x)[o.row_order], rtol=1e-6, atol=1e-6)


def test_every_row_family_offers_each_ordering_and_the_tiled_ones_degree():
    m = canonicalize(power_law(400, seed=7))
    for name in families.REGISTRY:
        orders = {s.params.order for s in families.specializations(m, [name])}
        # Tiles are cut from columns by decreasing length (paper 003, Solution 2).
        assert orders == ({"degree"} if name.startswith("tile_") else {"none", "degree"}), name


def test_unknown_ordering_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match="known: none, degree"):
        CsrVectorParams(order="random")


def test_ordered_launch_passes_the_caller_matrix_through_for_none():
    m = canonicalize(power_law(100, seed=8))
    seen = []
    ordered_launch(m, "none", lambda b: seen.append(b) or families.get("csr_vector").launch(b, CsrVectorParams()))
    assert seen == [m]


def test_degree_ordering_of_empty_matrix_is_empty():
    m = canonicalize(sp.csr_matrix((0, 0), dtype=np.float32))
    o = degree_ordering(m.row_lengths, m.col_lengths, m.index_dtype)
    assert o.row_order.size == 0 and permute(m, o).nnz == 0


def test_a_relabelled_matrix_knows_its_lengths_without_counting_them_again():
    m = canonicalize(power_law(2000, n_cols=3000, seed=8))
    b = permute(m, degree_ordering(m.row_lengths, m.col_lengths, m.index_dtype))
    assert np.array_equal(b.col_lengths, np.bincount(b.indices, minlength=b.n_cols))
    assert np.array_equal(b.row_lengths, np.diff(b.indptr))
    assert b.col_lengths[0] == m.col_lengths.max() and np.all(np.diff(b.col_lengths) <= 0)


@pytest.mark.gpu
@pytest.mark.parametrize("chunk", [None, 777])
def test_the_gpu_permutes_to_the_same_arrays_as_the_host(monkeypatch, chunk):
    pytest.importorskip("cupy")
    from tuner.formats import device_reorder, reorder
    if chunk is not None:  # in pieces of 777 entries
        monkeypatch.setattr(device_reorder, "CHUNK_ENTRIES", chunk)
    cases = dict(fixture_matrices(), big=power_law(20000, seed=90), pattern=abs(power_law(5000, seed=91)) > 0)
    for name, A in cases.items():
        for index_dtype in (None, np.int64):
            m = canonicalize(A, index_dtype=index_dtype)
            if m.nnz == 0:
                continue
            o = reorder.degree_ordering(m.row_lengths, m.col_lengths, m.index_dtype)
            monkeypatch.setattr(device_reorder, "MIN_NNZ", 1 << 62)
            host = reorder.permute(m, o)
            monkeypatch.setattr(device_reorder, "MIN_NNZ", 0)
            assert device_reorder.usable(m.n_rows, m.n_cols, m.nnz), name
            device = reorder.permute(m, o)
            for field in ("indptr", "indices", "data"):
                a, b = getattr(host, field), getattr(device, field)
                assert a.dtype == b.dtype and np.array_equal(a, b), (name, index_dtype, field)


def test_a_gpu_out_of_memory_relabels_on_the_host_with_a_warning(monkeypatch, caplog):
    from tuner.formats import device_reorder, reorder
    m = canonicalize(power_law(2000, seed=12))
    o = reorder.degree_ordering(m.row_lengths, m.col_lengths, m.index_dtype)
    expected = reorder.permute(m, o)

    def out_of_memory(*args):
        raise MemoryError("out of memory allocating 4,000,000,000 bytes")
    monkeypatch.setattr(device_reorder, "usable", lambda *a: True)
    monkeypatch.setattr(device_reorder, "device_csr", lambda m: None)
    monkeypatch.setattr(device_reorder, "permute_device", out_of_memory)
    monkeypatch.setattr(reorder, "_ordering_on_device", out_of_memory)
    with caplog.at_level("WARNING", logger="tuner.reorder"):
        again = canonicalize(power_law(2000, seed=12))
        got = reorder.permute(again, reorder.make_ordering(again, "degree"))
    assert "ran out of memory" in caplog.text and "ordering on the host" in caplog.text
    assert "relabelling on the host" in caplog.text
    for field in ("indptr", "indices", "data"):
        assert np.array_equal(getattr(expected, field), getattr(got, field)), field
    assert device_reorder.known_copy(got) is None


def _numpy_device(monkeypatch):
    """The device relabelling run with NumPy standing in for CuPy (same calls): what the GPU path does on
    the host, mirrors included."""
    from tuner.formats import device_reorder
    monkeypatch.setattr(device_reorder, "usable", lambda *a: True)
    monkeypatch.setattr(device_reorder, "device_csr", lambda m: device_reorder.DeviceCsr(
        m.indptr.copy(), m.indices.copy(), None if m.value_free else m.data.copy()))
    monkeypatch.setattr(device_reorder, "permute_device", lambda csr, rows, ranks: device_reorder._permute(
        np, csr, rows, ranks))
    monkeypatch.setattr(device_reorder, "_fetch", np.copy)
    monkeypatch.setattr(device_reorder, "_gather", lambda a, key: a[key].copy())
    monkeypatch.setattr(device_reorder, "release", lambda: None)

    @contextlib.contextmanager
    def on_device():
        yield np
    monkeypatch.setattr(device_reorder, "on_device", on_device)
    return device_reorder


@pytest.mark.parametrize("pattern", [False, True])
def test_a_matrix_relabelled_on_the_device_copies_its_entries_to_the_host_only_when_read(monkeypatch, pattern):
    A = power_law(3000, seed=21)
    m = canonicalize(abs(A) > 0 if pattern else A)
    o = degree_ordering(m.row_lengths, m.col_lengths, m.index_dtype)
    expected = permute(m, o)
    device_reorder = _numpy_device(monkeypatch)
    b = permute(m, o)
    assert isinstance(b.indices, device_reorder.HostMirror) and not b.indices.copied
    assert b.nnz == m.nnz and b.index_dtype == m.index_dtype and b.value_dtype == m.value_dtype
    assert np.array_equal(b.indptr, expected.indptr)
    assert np.array_equal(b.indices, expected.indices) and b.indices.copied
    assert np.array_equal(np.asarray(b.data), expected.data)
    assert (b.to_scipy() != expected.to_scipy()).nnz == 0


def test_a_mirror_whose_device_copy_was_freed_relabels_on_the_host(monkeypatch):
    m = canonicalize(power_law(3000, seed=22))
    o = degree_ordering(m.row_lengths, m.col_lengths, m.index_dtype)
    expected = permute(m, o)
    device_reorder = _numpy_device(monkeypatch)
    b = permute(m, o)
    device_reorder.forget(b)
    assert device_reorder.known_copy(b) is None and not b.indices.copied
    assert np.array_equal(b.indices, expected.indices) and np.array_equal(b.data, expected.data)


def test_planning_a_matrix_relabelled_on_the_device_reads_none_of_its_entries_on_the_host(monkeypatch):
    from tuner.compiler import plan_candidates
    from tuner.families.tiles import TILE_ORDER
    from tuner.model import load_profile
    device_reorder = _numpy_device(monkeypatch)
    m = canonicalize(power_law(20000, seed=23))
    specs, predicted, _ = plan_candidates(m, load_profile("NVIDIA H100 80GB HBM3"))
    b = ordered_matrix(m, TILE_ORDER)
    assert isinstance(b.indices, device_reorder.HostMirror)
    assert {s.family for s in specs} >= {"tile_composite", "tile_coo"} and all(p is not None for p in predicted)
    assert not b.indices.copied


def test_a_matrix_relabelled_on_the_device_has_the_host_relabellings_lengths(monkeypatch):
    m = canonicalize(power_law(3000, n_cols=2500, seed=24))
    o = degree_ordering(m.row_lengths, m.col_lengths, m.index_dtype)
    expected = permute(m, o)
    _numpy_device(monkeypatch)
    b = permute(m, o)
    for field in ("row_lengths", "col_lengths"):
        u, v = getattr(expected, field), getattr(b, field)
        assert u.dtype == v.dtype == np.int64 and np.array_equal(u, v), field


@pytest.mark.parametrize("chunk", [1, 7, 500, 1 << 30])
def test_the_device_relabelling_in_pieces_gives_the_host_relabellings_arrays(chunk):
    from tuner.formats import device_reorder
    A = power_law(3000, n_cols=3000, seed=25)
    A[5] = 0  # an empty row among the others
    A.eliminate_zeros()
    m = canonicalize(A)
    o = degree_ordering(m.row_lengths, m.col_lengths, m.index_dtype)
    expected = permute(m, o)
    csr = device_reorder.DeviceCsr(m.indptr.copy(), m.indices.copy(), m.data.copy())
    got = device_reorder._permute(np, csr, o.row_order, col_ranks(o), chunk_entries=chunk)
    assert np.array_equal(got.indptr, expected.indptr)
    assert np.array_equal(got.indices, expected.indices) and got.indices.dtype == expected.indices.dtype
    assert np.array_equal(got.data, expected.data)


@pytest.mark.parametrize("family", ["tile_composite", "tile_coo"])
def test_a_tiled_layout_built_on_the_device_a_group_of_tiles_at_a_time_equals_the_host_launch(monkeypatch, family):
    from tuner.formats import tiles
    fam = families.get(family)
    A = power_law(60000, seed=26).T.tocsr()  # wider than a tile
    params = [p for p in fam.candidates(canonicalize(A), None) if p.tile_width]
    assert params
    expected = [fam.launch(canonicalize(A), p) for p in params]
    from tuner.families import base
    device_reorder = _numpy_device(monkeypatch)
    for name in ("device_csr", "permute_device"):  # the names the device layouts call
        monkeypatch.setattr(base, name, getattr(device_reorder, name))
    monkeypatch.setattr(tiles, "GROUP_ENTRIES", 20000)
    assert len(tiles.tile_groups(canonicalize(A).col_lengths[np.argsort(-canonicalize(A).col_lengths)],
                                 tiles.tile_bounds(np.sort(canonicalize(A).col_lengths)[::-1], params[0].tile_width),
                                 20000)) > 1  # several groups
    for p, host in zip(params, expected):
        dev = fam.device_launch(canonicalize(A), p)
        assert [n for n, _ in host.arrays] == [n for n, _ in dev.arrays]
        for (label, a), (_, b) in zip(host.arrays, dev.arrays):
            assert a.dtype == b.dtype and np.array_equal(a, b), label
        assert (host.scalars, host.grid) == (dev.scalars, dev.grid)


@pytest.mark.parametrize("n_cols", [3000, 4000])
def test_an_ordering_made_on_the_device_carries_the_relabelled_column_lengths(monkeypatch, n_cols):
    m = canonicalize(power_law(3000, n_cols=n_cols, seed=23))
    on_host = make_ordering(canonicalize(power_law(3000, n_cols=n_cols, seed=23)), "degree")
    device_reorder = _numpy_device(monkeypatch)
    counted = []
    monkeypatch.setattr(device_reorder, "col_lengths", lambda *a: counted.append(a) or pytest.fail("recounted"))
    o = make_ordering(m, "degree")
    assert on_host.col_lengths is None and np.array_equal(o.row_order, on_host.row_order)
    assert np.array_equal(o.col_lengths, m.col_lengths[o.col_order])
    b = permute(m, o)
    assert np.array_equal(b.col_lengths, np.bincount(np.asarray(b.indices), minlength=b.n_cols)) and not counted


def test_the_plan_key_digest_is_taken_while_the_gpu_relabels_the_matrix(monkeypatch):
    from tuner import compiler
    from tuner.families.base import known_layout
    from tuner.matrix import structure_digest
    m = canonicalize(power_law(3000, seed=24))
    expected = structure_digest(canonicalize(power_law(3000, seed=24)))
    _numpy_device(monkeypatch)
    digest, seconds, after = compiler._digest_beside_relabelling(m)
    assert digest == expected and seconds > 0 and after is None
    assert known_layout(m, ("permuted", "degree")) is not None
