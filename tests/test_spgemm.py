"""SpGEMM, C = A B: the workload table and its expansion checked against SciPy in NumPy (CPU), every
template specialisation compiled by nvcc, and the GPU's products against SciPy in float64."""
import csv
import json

import numpy as np
import pytest
import scipy.sparse as sp

import tuner
from tuner import codegen
from tuner.cache import Cache
from tuner.formats.wlt import expand, merge, pair_products, workload_table
from tuner.matrix import MatrixError, canonicalize
from tuner.operations import REGISTRY
from tuner.spgemm import OuterProductParams, device_bytes, key_bits, operands

from .conftest import fixture_matrices, power_law

FIXTURES = fixture_matrices()


def products_of(A, B):
    """Scalar products of A B counted independently: sum over k of #A[:, k] x #B[k, :]."""
    return int((np.diff(sp.csc_matrix(A).indptr).astype(np.int64) * np.diff(sp.csr_matrix(B).indptr)).sum())


def reached(A, B):
    """The (row, column) pairs some path reaches, as a pattern product of int64 counts: the entries C stores
    (sums that cancel to zero included)."""
    paths = ((abs(sp.csr_matrix(A)) > 0).astype(np.int64) @ (abs(sp.csr_matrix(B)) > 0).astype(np.int64)).tocsr()
    paths.sort_indices()  # SciPy's product leaves each row's columns unsorted
    return paths


def numpy_product(A, B, threads=64, split=16):
    """C = A B from the built arrays exactly as the kernel reads them (expansion) and the merge computes."""
    wide = np.result_type(canonicalize(A).value_dtype, canonicalize(B).value_dtype)  # as compile does
    a, b = canonicalize(A, wide), canonicalize(B, wide)
    o = operands(a, b)
    t = workload_table(o.a_colptr, o.b_rowptr, threads, split)
    rows, cols, vals = expand(t, o.a_rows, a.data[o.a_order], o.b_rowptr, o.b_cols, b.data)
    indptr, indices, data = merge(rows, cols, vals, o.shape)
    return sp.csr_matrix((data, indices, indptr), shape=o.shape), t


@pytest.mark.parametrize("name", ["power_law", "rectangular_wide", "one_dense_row", "empty_rows", "long_rows",
                                  "tiny"])
def test_expanded_and_merged_products_equal_scipy(name):
    A = FIXTURES[name]
    B = sp.random(A.shape[1], 37, density=0.2, format="csr", random_state=3) if A.shape[0] != A.shape[1] else A
    for right in (B, A.T.tocsr()):
        C, table = numpy_product(A, right)
        expected = A.astype(np.float64) @ right.astype(np.float64)
        paths = reached(A, right).tocsr()
        assert table.products == products_of(A, right) == paths.sum()
        assert np.array_equal(C.indptr, paths.indptr) and np.array_equal(C.indices, paths.indices)
        assert abs(C - expected).max() <= 1e-12 * abs(expected).max() if C.nnz else expected.nnz == 0


def test_workload_table_is_heaviest_first_and_splits_long_columns():
    A = FIXTURES["long_rows"].T.tocsr()  # a column of 20,000 entries and one of 5,000 in A
    o = operands(canonicalize(A), canonicalize(A.T.tocsr()))
    t = workload_table(o.a_colptr, o.b_rowptr, threads=128, split=1000)
    assert np.all(np.diff(t.workload) <= 0)
    assert (t.a_stop - t.a_start).max() == 1000
    covered = np.zeros(o.a_rows.size, np.int64)
    np.add.at(covered, np.concatenate([np.arange(s, e) for s, e in zip(t.a_start, t.a_stop)]), 1)
    b_len = np.diff(o.b_rowptr)
    assert np.array_equal(covered > 0, b_len[np.repeat(np.arange(A.shape[1]), np.diff(o.a_colptr))] > 0)
    assert covered.max() == 1  # every entry of A with a row of B to meet is in exactly one block
    assert np.array_equal(t.offset[1:], np.cumsum((t.a_stop - t.a_start) * b_len[t.pair])[:-1])


def test_workload_is_equation_4():
    t = workload_table(np.array([0, 300, 301]), np.array([0, 5, 9]), threads=128, split=4096)
    assert t.pair.tolist() == [0, 1] and t.workload.tolist() == [3 * 5, 1 * 4] and t.products == 1504


def test_inner_dimensions_must_agree():
    with pytest.raises(MatrixError, match="A has 4 columns but B has 3 rows"):
        operands(canonicalize(sp.eye(4, format="csr")), canonicalize(sp.eye(3, format="csr")))
    with pytest.raises(ValueError, match="inner dimensions must agree"):
        pair_products(np.ones(3), np.ones(4))


def test_compile_names_disagreeing_inner_dimensions_before_asking_for_a_gpu(monkeypatch):
    import tuner
    from tuner import gpu

    def no_gpu():
        raise gpu.NoDeviceError("no CUDA GPU present")
    monkeypatch.setattr(gpu, "device_info", no_gpu)
    with pytest.raises(MatrixError, match="A has 5 columns but B has 7 rows"):
        tuner.compile(sp.random(5, 5, density=0.5, format="csr"), sp.random(7, 4, density=0.5, format="csr"))
    with pytest.raises(gpu.NoDeviceError):  # agreeing operands go on to ask for the GPU
        tuner.compile(sp.random(5, 5, density=0.5, format="csr"), sp.random(5, 4, density=0.5, format="csr"))


def test_counts_past_int32_stay_exact():
    t = workload_table(np.array([0, 70_000]), np.array([0, 70_000]), threads=256, split=1 << 20)
    assert t.products == 4_900_000_000 and t.offset.dtype == np.int64
    assert key_bits((3_000_000, 3_000_000)) == 44


def test_device_bytes_count_both_sort_buffers():
    a = canonicalize(sp.random(50, 50, density=0.1, format="csr", random_state=1, dtype=np.float32))
    o = operands(a, a)
    t = workload_table(o.a_colptr, o.b_rowptr, 256, 4096)
    assert device_bytes(t, o, np.dtype(np.float32), 1000) - device_bytes(t, o, np.dtype(np.float32)) == 1000
    assert device_bytes(t, o, np.dtype(np.float32)) >= 2 * t.products * 12


@pytest.mark.parametrize("val", ["float", "double"])
@pytest.mark.parametrize("idx", ["int", "long long"])
@pytest.mark.parametrize("value_free", [False, True])
def test_every_outer_product_specialisation_compiles(val, idx, value_free, tmp_path):
    source = codegen.render("outer_product.cu.j2", dict(VAL=val, IDX=idx, value_free=value_free, kernel_name="k",
                                                        block_size=256, tile=1024))
    assert len(codegen.compile_source(source, cache=Cache(tmp_path)).cubin) > 0


def test_candidates_compiled_ahead_are_what_each_family_builds(tmp_path, monkeypatch):
    from tuner import spgemm
    from tuner.spgemm import outer_product
    a = canonicalize(sp.random(40, 40, density=0.1, format="csr", random_state=2, dtype=np.float64))
    params = [OuterProductParams(), OuterProductParams(block_size=128, tile=512)]
    ran = []
    real_run = codegen.subprocess.run
    monkeypatch.setattr(codegen.subprocess, "run",
                        lambda cmd, **k: ran.append(any(c.startswith("-arch=") for c in cmd)) or real_run(cmd, **k))
    cache = Cache(tmp_path)
    spgemm.compile_candidates(a, a, params, codegen.DEFAULT_ARCH, 232448, cache)
    assert sum(ran) == 2  # one nvcc build per distinct source
    monkeypatch.setattr(codegen.subprocess, "run", lambda *a, **k: pytest.fail("nvcc ran again"))
    for p in params:  # the source a build renders is the one compiled ahead: a cache hit
        source = spgemm.FAMILY_OF[type(p)].source(a, a, p, 232448)
        assert "outer_float64_int32" in source and f"{p.block_size}" in source
        assert codegen.compile_source(source, codegen.DEFAULT_ARCH, cache=cache).cached
    assert outer_product.kernel_source(a, a, params[0]) != outer_product.kernel_source(a, a, params[1])


def test_prebuild_builds_every_library_the_families_load_under_its_own_name(tmp_path, monkeypatch):
    import ctypes
    from tuner import spgemm
    from tuner.spgemm import outer_product, row_hash
    cache = Cache(tmp_path)
    spgemm.prebuild(codegen.DEFAULT_ARCH, cache)
    exports = {outer_product.merge_name(v): ("sort", "reduce", "synchronize")
               for v in (np.float32, np.float64)}
    exports.update({row_hash.helpers_name(v, k): ("scan", "sort_rows")
                    for v in (np.float32, np.float64) for k in (np.int32, np.int64)})
    # Built now, the products' own requests are cache hits: no nvcc runs (there is none).
    monkeypatch.setattr(codegen.subprocess, "run", lambda *a, **k: pytest.fail("nvcc ran again"))
    found = set()
    for source in spgemm.library_sources():
        lib = ctypes.CDLL(str(codegen.compile_library(source, codegen.DEFAULT_ARCH, cache)))
        name = next(n for n in exports if f"generated library: {n}\n" in source)
        assert all(hasattr(lib, f"{name}_{f}") for f in exports[name]), name
        found.add(name)
    assert found == set(exports)


def test_a_result_too_large_for_host_memory_is_refused_before_the_copy(monkeypatch):
    from tuner.memory import InsufficientMemoryError
    from tuner.spgemm import DeviceCSR

    class Untouchable:  # a device array that must not be copied
        def __init__(self, n, dtype):
            self.shape, self.dtype = (n,), np.dtype(dtype)

        def get(self):
            raise AssertionError("copied to the host")

    monkeypatch.setenv("TUNER_HOST_MEMORY_LIMIT", "1G")
    c = DeviceCSR(Untouchable(10**6 + 1, np.int64), Untouchable(10**9, np.int64), Untouchable(10**9, np.float32),
                  (10**6, 10**6))
    with pytest.raises(InsufficientMemoryError, match="1,000,000,000 entries.*keep it on the GPU with out='device'"):
        c.to_scipy()


# --- on the GPU ---------------------------------------------------------------------------------------


def check(A, B, **options):
    C = tuner.compile(A, B, **options)()
    expected = REGISTRY["spgemm"].oracle(A, B)  # the float64 SciPy product the operation is held to
    expected.sum_duplicates()
    paths = reached(A, B).tocsr()
    assert isinstance(C, sp.csr_matrix) and C.shape == expected.shape and C.has_sorted_indices
    assert np.array_equal(C.indptr, paths.indptr) and np.array_equal(C.indices, paths.indices)
    scale = max(abs(expected).max(), 1.0) if expected.nnz else 1.0
    assert (abs(C - expected).max() if expected.nnz or C.nnz else 0.0) <= 1e-5 * scale
    return C


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["power_law", "one_dense_row", "empty_rows", "all_empty", "tiny", "float64",
                                  "long_rows"])
def test_products_match_scipy_for_a_times_its_transpose_and_itself(name):
    A = FIXTURES[name]
    check(A, A.T.tocsr())
    if A.shape[0] == A.shape[1]:
        check(A, A)


@pytest.mark.gpu
def test_rectangular_product_matches_scipy():
    A = power_law(700, 400, seed=11)
    check(A, power_law(400, 900, seed=12))


@pytest.mark.gpu
def test_pattern_product_counts_paths():
    A = FIXTURES["pattern"]
    C = check(A, A)
    assert tuner.compile(A, A).value_free
    assert np.array_equal(C.data, reached(A, A).data.astype(C.dtype))  # entries count the paths of length 2


@pytest.mark.gpu
def test_int64_indices_and_split_columns_match_scipy():
    A = power_law(2000, seed=13)
    check(sp.csr_matrix((A.data, A.indices.astype(np.int64), A.indptr.astype(np.int64)), shape=A.shape), A,
          params=OuterProductParams(block_size=128, tile=64, split=100))


@pytest.mark.gpu
def test_new_values_on_the_same_structures_are_multiplied():
    A = power_law(1500, seed=14)
    spgemm = tuner.compile(A, A.T.tocsr())
    A2 = A.copy()
    A2.data = np.random.default_rng(0).uniform(-3, 3, A.nnz).astype(A.dtype)
    C = spgemm(A2, A2.T.tocsr())
    expected = A2.astype(np.float64) @ A2.T.astype(np.float64)
    assert abs(C - expected).max() <= 1e-5 * abs(expected).max()
    assert abs(spgemm() - expected).max() <= 1e-5 * abs(expected).max()  # the new values stay
    with pytest.raises(MatrixError, match="another structure"):
        spgemm(power_law(1500, seed=15), None)


@pytest.mark.gpu
def test_device_output_is_taken_by_cupy_without_a_copy():
    cupy = pytest.importorskip("cupy")
    import cupyx.scipy.sparse as csp
    A = power_law(1200, seed=16)
    c = tuner.compile(A, A)(out="device")
    data = cupy.asarray(c.data)
    assert data.data.ptr == int(c.data.gpudata)  # the same memory
    C = csp.csr_matrix((data, cupy.asarray(c.indices), cupy.asarray(c.indptr)), shape=c.shape).get()
    expected = A.astype(np.float64) @ A.astype(np.float64)
    assert c.nnz == reached(A, A).nnz and abs(C - expected).max() <= 1e-5 * abs(expected).max()


# --- row_hash -------------------------------------------------------------------------------------------

from tuner.formats.row_bins import bin_rows, dense_from, product_by_bins, row_products, table_size  # noqa: E402
from tuner.model import spgemm as spgemm_model  # noqa: E402
from tuner.spgemm import FAMILIES, RowHashParams, plan_stats  # noqa: E402
from tuner.spgemm.row_hash import HOPPER_SHARED_BYTES, dense_widths, geometry, shared_limit  # noqa: E402


def test_row_products_count_every_scalar_product_of_each_row():
    A = FIXTURES["power_law"]
    for B in (A, A.T.tocsr()):
        expected = np.asarray(reached(A, B).sum(axis=1)).ravel()  # paths of length 2 leaving each row
        assert np.array_equal(row_products(A.indptr, A.indices, B.indptr), expected)


@pytest.mark.parametrize("name", ["power_law", "one_dense_row", "empty_rows", "long_rows", "tiny"])
def test_bins_hold_every_row_with_products_once_in_a_table_large_enough(name):
    A = FIXTURES[name]
    counts = row_products(A.indptr, A.indices, A.T.tocsr().indptr)
    tables = (32, 64, 256)
    bins = bin_rows(counts, tables, 0.5, A.shape[0])
    assert np.array_equal(np.sort(bins.rows), np.flatnonzero(counts))
    for b, t in enumerate(tables):
        rows = bins.bin(b)
        assert np.all(counts[rows] <= t * 0.5) and np.all(np.diff(rows) > 0)
        if b:
            assert np.all(counts[rows] > tables[b - 1] * 0.5)  # the smallest table that holds them
    big = bins.global_rows
    assert np.all(counts[big] > 128)
    assert np.all(bins.global_tables >= np.minimum(counts[big] / 0.5, A.shape[0]))
    assert np.array_equal(np.diff(bins.global_offsets), bins.global_tables)
    assert bins.dense_rows.size == 0  # no dense rule given


@pytest.mark.parametrize("name", ["power_law", "one_dense_row", "long_rows"])
def test_rows_from_the_dense_count_on_take_the_dense_bin_heaviest_first(name):
    A = FIXTURES[name]
    counts = row_products(A.indptr, A.indices, A.T.tocsr().indptr)
    dense = dense_from(A.shape[0], 64.0, int(np.quantile(counts[counts > 0], 0.9)))
    bins = bin_rows(counts, (32, 64, 256), 0.5, A.shape[0], dense)
    assert np.array_equal(np.sort(bins.rows), np.flatnonzero(counts))
    assert np.array_equal(np.sort(bins.dense_rows), np.flatnonzero(counts >= dense)) and bins.dense_rows.size
    assert np.all(np.diff(counts[bins.dense_rows]) <= 0)
    assert np.all(counts[bins.global_rows] < dense) and np.all(counts[bins.bin(0)] < dense)


def test_dense_rule_bounds_the_bitmap_words_per_entry():
    assert dense_from(64 * 5000, 64.0, 1024) == 5000  # 10,000 bitmap words for at least 5,000 entries
    assert dense_from(1000, 64.0, 1024) == 1024 and dense_from(1000, 0.0, 1) == np.iinfo(np.int64).max


def test_global_tables_stop_at_the_columns_power_of_two():
    assert table_size(np.array([10**9]), 0.5, 3000).tolist() == [4096]  # the hash is then the identity


@pytest.mark.parametrize("name", ["power_law", "rectangular_wide", "one_dense_row", "empty_rows", "float64"])
def test_product_bin_by_bin_equals_scipy(name):
    A = FIXTURES[name]
    B = A.T.tocsr()
    a, b = canonicalize(A, np.float64), canonicalize(B, np.float64)
    counts = row_products(a.indptr, a.indices, b.indptr)
    bins = bin_rows(counts, (32, 128), 1.0, b.n_cols, dense=int(np.quantile(counts, 0.95)) + 1)
    indptr, indices, data = product_by_bins(bins, a.indptr, a.indices, a.data, b.indptr, b.indices, b.data,
                                            (a.n_rows, b.n_cols))
    paths = reached(A, B)
    assert np.array_equal(indptr, paths.indptr) and np.array_equal(indices, paths.indices)
    expected = (A.astype(np.float64) @ B.astype(np.float64)).toarray()
    assert np.allclose(sp.csr_matrix((data, indices, indptr), shape=paths.shape).toarray(), expected, rtol=1e-12)


def test_bins_that_exceed_shared_memory_are_dropped():
    g = geometry(RowHashParams(tables=(32, 1024, 16384)), 12, 100 * 1024)
    assert [(x.table, x.group, x.rows_per_block) for x in g] == [(32, 8, 32), (1024, 256, 1)]


@pytest.mark.parametrize("val", ["float", "double"])
@pytest.mark.parametrize("key", ["int", "long long"])
@pytest.mark.parametrize("value_free", [False, True])
def test_every_row_hash_specialisation_compiles(val, key, value_free, tmp_path):
    p = RowHashParams()
    bins = geometry(p, 4, 232448)  # every table: the compile does not depend on the slot size
    widths = dense_widths(p, 8 if val == "double" else 4, shared_limit(*HOPPER_SHARED_BYTES))
    source = codegen.render("row_hash.cu.j2", dict(VAL=val, KEY=key, value_free=value_free, kernel_name="k",
                                                    lanes=8, symbolic_bins=bins, numeric_bins=bins,
                                                    global_block=1024, sort_max=2048, dense_block=p.dense_block,
                                                    dense_widths=widths,
                                                    dense_lanes=p.dense_lanes, dense_entries=p.dense_entries))
    cubin = codegen.compile_source(source, cache=Cache(tmp_path)).cubin
    for t in (32, 16384):
        assert f"k_numeric{t}".encode() in cubin and f"k_symbolic{t}".encode() in cubin
    assert b"k_numeric_dense" in cubin and b"k_symbolic_dense" in cubin


def test_sampled_estimate_of_nnz_c_is_close_on_a_power_law_product():
    A = power_law(6000, seed=21)
    a = canonicalize(A)
    products = row_products(a.indptr, a.indices, a.indptr)
    estimate, _, exact = spgemm_model.estimate_nnz(a, a, products, sample=400)
    truth = reached(A, A).nnz
    assert not exact and abs(estimate - truth) <= 0.15 * truth


def test_model_charges_each_family_for_the_work_that_bounds_it_and_fits_rates_from_runs():
    import dataclasses
    s = spgemm_model.ProductStats(10**5, 10**5, 10**8, 1e6, 0, 0, 8, 4, 32, 20)
    r = spgemm_model.rates_from(None)
    more_bits = dataclasses.replace(s, key_bits=33)  # one more 8-bit radix pass for the outer product's sort
    sort_pass = 10**8 * 16 * r.per_unit["outer.sort"]
    assert spgemm_model.predict("outer_product", more_bits, r) == pytest.approx(
        spgemm_model.predict("outer_product", s, r) + sort_pass)
    assert spgemm_model.predict("row_hash", more_bits, r) == spgemm_model.predict("row_hash", s, r)
    wider = dataclasses.replace(s, nnz_c=2e6)  # row_hash writes and sorts C's entries
    assert spgemm_model.predict("row_hash", wider, r) == pytest.approx(
        spgemm_model.predict("row_hash", s, r) + 1e6 * 12 * r.per_unit["hash.sort"])
    assert spgemm_model.working_bytes("outer_product", s) == 2 * 10**8 * 16  # the sort's two buffers
    runs = [{"work": spgemm_model.work("row_hash", s), "ms": {"hash.sort": 2.0}}]
    assert spgemm_model.fit_rates(runs)["hash.sort"] == pytest.approx(2.0 / (1e6 * 12))


def test_whole_product_timings_replace_the_phases_fixed_costs_and_the_launches():
    runs = [{"family": "row_hash", "work": {"hash.x": w}, "ms": {"hash.x": 0.5 + w * 1e-3},
             "whole_ms": 0.1 + w * 1e-3} for w in (100.0, 500.0, 900.0)]
    phases_only = spgemm_model.fit_rates([{k: v for k, v in r.items() if k != "whole_ms"} for r in runs])
    assert phases_only == pytest.approx({"hash.x": 1e-3, "hash.x:fixed": 0.5})
    rates = spgemm_model.fit_rates(runs)
    assert rates == pytest.approx({"hash.x": 1e-3, "hash:fixed": 0.1})
    s = spgemm_model.ProductStats(10, 10, 100, 50.0, 0, 0, 8, 4, 7, 4)  # 100 shared products: hash.x is not a unit
    with_whole = spgemm_model.predict("row_hash", s, spgemm_model.Rates(rates, 0.005, "test"))
    assert with_whole == pytest.approx(0.1)
    launches = spgemm_model.LAUNCHES["row_hash"](s) * 0.005
    without = spgemm_model.predict("row_hash", s, spgemm_model.Rates({"hash.symbolic_shared:fixed": 0.5}, 0.005, "t"))
    assert without == pytest.approx(0.5 + launches)


def test_plan_stats_count_products_beyond_shared_tables_and_in_dense_rows():
    A = FIXTURES["long_rows"]
    a = canonicalize(A)
    b = canonicalize(A.T.tocsr())
    products = row_products(a.indptr, a.indices, b.indptr)
    s = plan_stats(a, b, RowHashParams(tables=(32, 64), dense_ratio=0), 232448)
    assert s.products == products.sum() and s.symbolic_global == products[products > 64].sum()
    assert s.symbolic_dense == 0
    d = plan_stats(a, b, RowHashParams(tables=(32, 64), dense_min=1024), 232448)  # 200 columns: from 1024 on
    assert d.symbolic_dense == products[products >= 1024].sum() > 0
    assert d.symbolic_global == products[(products > 64) & (products < 1024)].sum()




def test_whole_product_fixed_cost_is_decided_by_the_small_products():
    # Two small products pay 0.2 ms beyond their work, two large ones 3 ms that their units miss: a median
    # would say 1.6 ms and overstate every small product eightfold; relative errors keep it near 0.2 ms.
    runs = [{"family": "outer_product", "work": {"outer.x": w}, "ms": {"outer.x": w * 1e-3},
             "whole_ms": w * 1e-3 + extra} for w, extra in ((100.0, 0.2), (120.0, 0.2), (9e4, 3.0), (1e5, 3.0))]
    fixed = spgemm_model.fit_rates(runs)["outer:fixed"]
    assert 0.2 < fixed < 0.21


def test_plan_stats_count_the_bins_row_hash_launches_in_both_phases():
    # Rows of 2, 1, 40 and no products: tables of 32 and 64 at load 0.5 hold 16 and 32 keys, so the first two
    # rows share a shared bin and the third goes to the global bin, in both phases: 2 + 2 bins.
    A = sp.csr_matrix(np.array([[0, 1.0, 0], [1.0, 0, 0], [0, 0, 1.0], [0, 0, 0]]))
    B = sp.csr_matrix(np.vstack([np.eye(1, 40), np.r_[1.0, 1.0, np.zeros(38)], np.ones(40)]))
    a, b = canonicalize(A), canonicalize(B)
    s = plan_stats(a, b, RowHashParams(tables=(32, 64), dense_ratio=0), 232448)
    assert row_products(a.indptr, a.indices, b.indptr).tolist() == [2, 1, 40, 0]
    assert s.bins_used == 4
    assert spgemm_model.work("row_hash", s)["hash.bins"] == 4.0


def test_whole_product_times_fit_the_per_bin_launch_cost_beside_the_fixed_part():
    runs = [{"family": "row_hash", "work": {"hash.x": w, "hash.bins": n}, "ms": {"hash.x": w * 1e-3},
             "whole_ms": 0.05 + 0.03 * n + w * 1e-3} for w, n in ((100.0, 2), (200.0, 10), (400.0, 6), (50.0, 15))]
    rates = spgemm_model.fit_rates(runs)
    assert rates["hash.bins"] == pytest.approx(0.03, rel=1e-6)
    assert rates["hash:fixed"] == pytest.approx(0.05, rel=1e-6)


def test_outer_product_blocks_narrow_where_a_pair_carries_fewer_products_than_a_wide_block_has_threads():
    mesh = canonicalize(sp.diags([1.0, 2.0, 1.0], [-1, 0, 1], shape=(3000, 3000), format="csr"))  # 9 a pair
    hubs = canonicalize(sp.random(300, 300, density=0.3, format="csr", random_state=25))  # 90 x 90 a pair
    thin, wide = (plan_stats(m, m, RowHashParams(), 232448) for m in (mesh, hubs))
    assert thin.products < 256 * thin.pairs and spgemm_model.outer_block_for(thin) == 128
    assert wide.products >= 256 * wide.pairs and spgemm_model.outer_block_for(wide) == 256
    from tuner.spgemm import model_plan
    plan = model_plan(mesh, mesh, None, 232448)
    if plan.family == "outer_product":
        assert plan.params == OuterProductParams(block_size=128, tile=512)

def test_plan_stats_count_outer_product_pairs_of_a_nonempty_column_and_row():
    # A's column 1 and B's row 2 are empty: of the four indices only 0 and 3 pair a column with a row.
    A = sp.csr_matrix(np.array([[1.0, 0, 2, 0], [0, 0, 3, 4], [5, 0, 0, 0], [0, 0, 0, 6]]))
    B = sp.csr_matrix(np.array([[1.0, 2, 0], [0, 3, 0], [0, 0, 0], [4, 0, 5]]))
    s = plan_stats(canonicalize(A), canonicalize(B), RowHashParams(), 232448)
    assert s.pairs == 2
    assert spgemm_model.work("outer_product", s)["outer.expand/pairs"] == 2.0

# --- row_hash on the GPU ---------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["power_law", "one_dense_row", "empty_rows", "all_empty", "tiny", "float64",
                                  "long_rows", "pattern"])
def test_row_hash_matches_scipy_with_tiny_tables_global_and_dense_rows(name):
    A = FIXTURES[name]
    small = RowHashParams(tables=(32, 64, 128), lanes=4)  # most rows in global tables
    dense = RowHashParams(dense_min=1, lanes=8)  # rows of n_cols / 64 entries and more: dense accumulators
    spans = RowHashParams(dense_min=1, dense_bytes=1024, dense_block=256)  # spans of 1024 columns
    resume = RowHashParams(dense_min=1, dense_bytes=1024, dense_entries=2)  # most resume points in global memory
    for params in (small, RowHashParams(), dense, spans, resume):
        check(A, A.T.tocsr(), params=params)
        if A.shape[0] == A.shape[1]:
            check(A, A, params=params)


@pytest.mark.gpu
def test_row_hash_rectangular_int64_and_new_values():
    A = power_law(700, 400, seed=11)
    check(A, power_law(400, 900, seed=12), params=RowHashParams(lanes=32))
    B = power_law(1500, seed=13)
    wide = sp.csr_matrix((B.data, B.indices.astype(np.int64), B.indptr.astype(np.int64)), shape=B.shape)
    check(wide, B, params=RowHashParams(lanes=16))
    check(wide, B, params=RowHashParams(lanes=16, dense_min=1, dense_bytes=1024))  # int64 columns, two spans
    f = tuner.compile(B, B.T.tocsr(), params=RowHashParams())
    f.timed = True
    f()  # the first call sizes C (the symbolic phase); later ones run the numeric phase only
    B2 = B.copy()
    B2.data = np.random.default_rng(1).uniform(-2, 2, B.nnz).astype(B.dtype)
    expected = B2.astype(np.float64) @ B2.T.astype(np.float64)
    assert abs(f(B2, B2.T.tocsr()) - expected).max() <= 1e-5 * abs(expected).max()
    assert set(f.seconds) >= {"numeric_shared", "numeric_global", "sort"} and "symbolic_shared" not in f.seconds


@pytest.mark.gpu
def test_device_bins_equal_the_numpy_bins_of_the_exact_row_sizes():
    A = power_law(3000, seed=17)
    f = tuner.compile(A, A, params=RowHashParams(tables=(32, 64, 256), dense_min=200))
    f.symbolic()
    s = f._structure
    sizes = np.diff(reached(A, A).indptr)
    expected = bin_rows(sizes, (32, 64, 256), f.params.numeric_load, A.shape[1], f.dense_from)
    assert expected.dense_rows.size and expected.global_rows.size
    got = np.zeros(int(s["starts"][-1]), np.int64)
    from tuner import gpu
    gpu.copy_to_host(got, int(s["rows"]))
    assert np.array_equal(s["starts"], expected.starts)
    for b in range(len(expected.starts) - 1):
        assert np.array_equal(np.sort(got[s["starts"][b]:s["starts"][b + 1]]), np.sort(expected.bin(b)))


@pytest.mark.gpu
def test_measured_tuning_keeps_the_fastest_candidate_and_the_model_plans():
    A = power_law(4000, seed=18)
    f = tuner.compile(A, A, tune="measure", repeats=2)
    assert f.plan.measured_ms and f.plan.reason.startswith("fastest measured")
    fastest = min(f.plan.measured_ms, key=f.plan.measured_ms.get)
    assert fastest == f"{f.family} {f.params}"
    g = tuner.compile(A, A)
    assert g.plan.family in FAMILIES and set(g.plan.predicted_ms) == set(FAMILIES)
    assert g.explain().count("ms predicted") == len(FAMILIES) and "ms measured" in f.explain()
    expected = A.astype(np.float64) @ A.astype(np.float64)
    assert abs(f() - expected).max() <= 1e-5 * abs(expected).max()


def test_heavy_global_rows_are_cut_into_items_that_partition_their_entries():
    from tuner.formats.row_bins import split_rows
    A = FIXTURES["long_rows"]
    products = row_products(A.indptr, A.indices, A.T.tocsr().indptr)
    rows = np.flatnonzero(products > 1000)
    slot, begin, end = split_rows(rows, A.indptr, products, 5000)
    for s, r in enumerate(rows):
        mine = slot == s
        assert begin[mine][0] == A.indptr[r] and end[mine][-1] == A.indptr[r + 1]
        assert np.array_equal(begin[mine][1:], end[mine][:-1]) and np.all(end[mine] > begin[mine])
        assert mine.sum() == min(-(-products[r] // 5000), A.indptr[r + 1] - A.indptr[r])


# --- the SpGEMM bench's checks and the shipped rates -----------------------------------------------------

def test_bench_check_accepts_structural_zeros_and_catches_wrong_products(monkeypatch):
    from tuner import bench_spgemm
    A = power_law(800, seed=31).astype(np.float64)
    r = int(np.argmax(np.diff(A.indptr)))
    A.data[A.indptr[r]:A.indptr[r + 1]] = 0.0  # a row of explicit zeros: C stores what it reaches, as cuSPARSE does
    S = bench_spgemm._structure(A)
    C = (S @ S).tocsr()  # every structural entry, with the product's values
    C.sort_indices()
    C.data = (A @ A).toarray()[np.repeat(np.arange(800), np.diff(C.indptr)), C.indices]
    assert C[r].nnz > 0 and abs(C[r]).sum() == 0  # the zero row reaches entries, all of them zero
    assert bench_spgemm.check_product(C, A, A, 10) == (True, "scipy")
    monkeypatch.setattr(bench_spgemm, "SCIPY_PRODUCTS", 0)  # the checksum path of products too big for SciPy
    assert bench_spgemm.check_product(C, A, A, 10)[0]
    wrong = C.copy()
    wrong.data[wrong.nnz // 2] += 1.0
    assert not bench_spgemm.check_product(wrong, A, A, 10)[0]
    lost = C.copy()
    heavy = int(np.argmax(np.diff(C.indptr)))
    lost.data[lost.indptr[heavy]] = 0.0
    lost.eliminate_zeros()  # a reached entry missing from the heaviest row
    assert not bench_spgemm.check_product(lost, A, A, 10)[0]


def test_bench_summary_counts_only_power_law_products_where_cusparse_is_right():
    from tuner.bench_spgemm import SpgemmRow, summary
    row = lambda name, speedup, status, power_law=True: SpgemmRow(  # noqa: E731
        name, "AA", 1, 1, 1, 1.0, 1.0, 1.0, speedup, status, True, "scipy", 1.0, "", {}, {}, True, 1, power_law)
    s = summary([row("a", 2.0, "ok"), row("b", 0.5, "ok"), row("c", None, "wrong: 0 entries"),
                 row("mdual", 0.4, "ok", power_law=False)])
    assert s["geomean_speedup"] == pytest.approx(1.0) and s["min_speedup"] == 0.5
    assert s["cusparse_failed_or_wrong"] == 1 and s["correct"] == 4


def test_shipped_spgemm_rates_are_the_model_fitted_to_the_shipped_timings():
    import json
    from tuner import paths
    from tuner.spgemm.measure import refit
    prof = json.loads((paths.models_dir() / "nvidia-h100-80gb-hbm3" / "profile.json").read_text())
    again = refit(prof["spgemm"])
    assert set(again["rates"]) == set(prof["spgemm"]["rates"])
    for k, v in prof["spgemm"]["rates"].items():
        assert again["rates"][k] == pytest.approx(v, rel=1e-9)
        assert spgemm_model.REFERENCE_RATES[k] == pytest.approx(v, rel=5e-3)


def test_report_sets_each_family_prediction_beside_its_measurement(tmp_path):
    import json
    import subprocess
    import sys
    bench = {"gpu": {"name": "test"}, "rows": [
        {"name": "g", "op": "AA", "plan": "outer_product P()", "predicted_ms": {"outer_product": 1.0, "row_hash": 4.0},
         "family_ms": {"outer_product": 2.0, "row_hash": 1.0}},
        {"name": "h", "op": "AAT", "plan": "row_hash R()", "predicted_ms": {"outer_product": 9.0, "row_hash": 3.0},
         "family_ms": {"outer_product": None, "row_hash": 3.0}}]}
    path = tmp_path / "bench-spgemm.json"
    path.write_text(json.dumps(bench))
    done = subprocess.run([sys.executable, "-m", "tuner", "report", "--spgemm", str(path)], capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr
    assert "pick the fastest on 1 of 2 products" in done.stdout and "worst 2.00x" in done.stdout
    rows = (tmp_path / "report-spgemm.csv").read_text().splitlines()
    assert rows[1:] == ["g AA,outer_product,,1.0,2.0,0.5,True,False", "g AA,row_hash,,4.0,1.0,4.0,False,True",
                        "h AAT,row_hash,,3.0,3.0,1.0,True,True"]


def test_a_measured_choice_is_keyed_by_both_structures_and_the_gpu_and_round_trips():
    from tuner.spgemm import measured_plan_key, params_from_json
    import dataclasses
    a = canonicalize(power_law(300, seed=41))
    b = canonicalize(power_law(300, seed=42))
    keys = {measured_plan_key(a, b, "H100", (9, 0)), measured_plan_key(b, a, "H100", (9, 0)),
            measured_plan_key(a, a, "H100", (9, 0)), measured_plan_key(a, b, "H200", (9, 0)),
            measured_plan_key(canonicalize(power_law(300, seed=41), np.float64), b, "H100", (9, 0))}
    assert len(keys) == 5
    assert measured_plan_key(canonicalize(power_law(300, seed=41) * 2.0), b, "H100", (9, 0)) in keys  # values aside
    for family in FAMILIES.values():
        for p in family.candidates:
            assert params_from_json(family.name, json.loads(json.dumps(dataclasses.asdict(p)))) == p


@pytest.mark.gpu
def test_a_second_measured_compile_of_the_same_pair_reuses_the_choice():
    A = power_law(2500, seed=43)
    first = tuner.compile(A, A, tune="measure", repeats=2)
    again = tuner.compile(A, A, tune="measure", repeats=2)
    assert again.plan.reason == "fastest measured earlier (plan cache)"
    assert (again.family, again.params) == (first.family, first.params)
    assert again.plan.measured_ms == first.plan.measured_ms
    expected = A.astype(np.float64) @ A.astype(np.float64)
    assert abs(again() - expected).max() <= 1e-5 * abs(expected).max()


def test_phase_times_are_each_repeat_s_own_not_running_sums():
    from tuner.spgemm import measure

    class Fake:  # a call starts its own `seconds`; this symbolic() adds to those of the last call
        family = "row_hash"
        timed = False

        def __init__(self):
            self.seconds = {}

        def symbolic(self):
            self.seconds["symbolic_shared"] = self.seconds.get("symbolic_shared", 0.0) + 0.001

        def __call__(self, out):
            self.seconds = {"numeric_shared": 0.002, "csr": 0.0005}

    fake = Fake()
    ms = measure.phase_ms(fake, 5)
    assert ms == {"hash.symbolic_shared": pytest.approx(1.0), "hash.numeric_shared": pytest.approx(2.0),
                  "hash.rows": pytest.approx(0.5)}
    assert fake.timed is False  # timed for those calls only


def test_report_predicts_again_with_the_current_model_on_the_cpu(tmp_path):
    from tuner import report_spgemm
    bench = {"gpu": {"name": "NVIDIA H100 80GB HBM3"}, "rows": [
        {"name": "rmat:8", "op": "AA", "plan": "outer_product P()", "predicted_ms": {"outer_product": 99.0},
         "family_ms": {"outer_product": 0.2, "row_hash": 0.3}},
        {"name": "rmat:9", "op": "AA", "plan": "", "predicted_ms": {}, "family_ms": {}}]}
    again = report_spgemm.repredict(bench, tmp_path, None)
    first = again["rows"][0]
    assert set(first["predicted_ms"]) == set(FAMILIES) and first["predicted_ms"]["outer_product"] != 99.0
    assert first["plan"] == f"{min(first['predicted_ms'], key=first['predicted_ms'].get)} (repredicted)"
    assert again["rows"][1] == bench["rows"][1] and again["repredicted_with"].startswith("reference rates")


def test_bench_records_a_product_too_large_for_host_memory_and_goes_on(monkeypatch):
    from tuner import bench_spgemm
    from tuner.memory import InsufficientMemoryError

    def refuse(*args, **kwargs):
        raise InsufficientMemoryError("C = A B in host memory", 9 * 10**9, 10**9)

    monkeypatch.setattr(bench_spgemm, "compile_spgemm", refuse)
    monkeypatch.setattr(bench_spgemm, "_cusparse", lambda *a: (None, "error: no CuPy here"))
    row = bench_spgemm.bench_product("rmat:8", "AA")
    assert row.ours_correct is None and "C = A B in host memory" in row.error
    assert row.products > 0 and row.source == "rmat:8"


def test_cusparse_result_is_compared_entry_by_entry_whatever_its_row_order():
    from tuner import bench_spgemm

    class Held(sp.csr_matrix):  # a SciPy matrix standing in for CuPy's, NumPy for CuPy
        def get(self):
            return sp.csr_matrix(self)

    A = power_law(300, seed=8, dtype=np.float64)
    C = (A @ A).tocsr()
    C.sort_indices()
    theirs = Held(C.copy())
    theirs.data[theirs.indptr[5]:] *= 1 + 1e-9  # within rounding of ours
    want = 1e-9 * abs(C.data[C.indptr[5]:]).max()
    assert bench_spgemm._max_difference(np, theirs, C.copy()) == pytest.approx(want)
    unsorted = Held(C.copy())
    unsorted.has_sorted_indices = False
    row = np.flatnonzero(np.diff(C.indptr) > 2)[0]
    lo, hi = C.indptr[row], C.indptr[row + 1]
    unsorted.indices[lo:hi] = unsorted.indices[lo:hi][::-1].copy()
    unsorted.data[lo:hi] = unsorted.data[lo:hi][::-1].copy()
    assert bench_spgemm._max_difference(np, unsorted, C.copy()) == 0.0  # sorted before comparing
    moved = Held(C.copy())
    moved.indices[lo] = next(c for c in range(C.shape[1]) if c not in set(C.indices[lo:hi].tolist()))
    moved.has_sorted_indices = False
    assert bench_spgemm._max_difference(np, moved, C.copy()) >= abs(C.data[lo])  # another entry: counted as missing


def test_configurations_timed_in_turns_keep_their_own_times_through_a_slow_spell(monkeypatch):
    import types

    import tuner.spgemm as spgemm
    clock = {"now": 0.0, "calls": 0}

    def costing(ms):
        def call():
            clock["calls"] += 1
            slow = 10 <= clock["calls"] < 60  # a spell of 50 calls at twice the cost
            clock["now"] += (2 if slow else 1) * ms / 1e3
        return call

    monkeypatch.setattr(spgemm, "time", types.SimpleNamespace(perf_counter=lambda: clock["now"]))
    monkeypatch.setattr(spgemm.gpu, "synchronize", lambda: None)
    times = spgemm.interleaved_ms({"a": costing(1.0), "b": costing(1.1)}, repeats=5)
    assert times == pytest.approx({"a": 1.0, "b": 1.1})
    # Timed one after the other, the spell lands on one configuration and reverses the order.
    clock.update(now=0.0, calls=0)
    apart = {k: spgemm.wall_ms(fn, 50, warmup=1) for k, fn in {"a": costing(1.0), "b": costing(1.1)}.items()}
    assert apart["a"] > apart["b"]


def test_configurations_timed_in_turns_make_the_calls_their_time_needs_and_no_more(monkeypatch):
    import types

    import tuner.spgemm as spgemm
    clock = {"now": 0.0}
    made = {"long": 0, "short": 0}

    def costing(name, ms):
        def call():
            made[name] += 1
            clock["now"] += ms / 1e3
        return call

    monkeypatch.setattr(spgemm, "time", types.SimpleNamespace(perf_counter=lambda: clock["now"]))
    monkeypatch.setattr(spgemm.gpu, "synchronize", lambda: None)
    spgemm.interleaved_ms({"long": costing("long", 60.0), "short": costing("short", 0.5)}, repeats=5)
    # a warm-up and a first timed call each, then repeats_for's calls shared out among the rounds
    assert made == {"long": 2 + spgemm.repeats_for(60.0, 5), "short": 2 + spgemm.repeats_for(0.5, 5)}
    assert made == {"long": 7, "short": 102}


def test_the_model_plans_each_family_with_the_parameters_its_profile_is_measured_at():
    import tuner.spgemm as spgemm
    a = canonicalize(sp.random(300, 300, density=0.03, format="csr", random_state=3, dtype=np.float32))
    plan = spgemm.model_plan(a, a, None, 116736)
    assert plan.params == spgemm.planned_params(plan.family, plan.stats)


def test_report_of_a_stream_bench_compares_each_products_page_sizes_and_scores_the_models_pick(tmp_path):
    from tuner import report_spgemm
    bench = {"gpu": {"name": "H"}, "rows": [
        {"name": "g AA", "page_sizes": {"256": {"predicted_s": 0.010, "measured_s": 0.020, "chosen": True},
                                        "128": {"predicted_s": 0.011, "measured_s": 0.019},
                                        "64": {"predicted_s": 0.012, "measured_s": 0.030},
                                        "phases_s": {"pages": 0.01}}},
        {"name": "h AAT", "page_sizes": {"512": {"predicted_s": 0.004, "measured_s": 0.004},
                                         "256": {"predicted_s": 0.005, "measured_s": 0.008}}}]}
    path = tmp_path / "bench-stream-spgemm.json"
    path.write_text(json.dumps(bench))
    csv_path, summary = report_spgemm.run(path)
    assert csv_path.name == "report-stream-spgemm.csv" and (tmp_path / "report-stream-spgemm.json").is_file()
    assert not (tmp_path / "report-spgemm.csv").exists()
    rows = list(csv.DictReader(csv_path.open()))
    assert [(r["product"], r["page_entries"], r["chosen"], r["fastest"]) for r in rows] == [
        ("g AA", "256", "True", "False"), ("g AA", "128", "False", "True"), ("g AA", "64", "False", "False"),
        ("h AAT", "512", "True", "True"), ("h AAT", "256", "False", "False")]
    # g's pick is 20/19 of its fastest (within 10 %), h's the fastest; errors 0.5, 8/19, 0.6, 0, 0.375
    assert summary["picks"] == 2 and summary["fastest"] == 1 and summary["within_10pct"] == 2
    assert abs(summary["regret_worst"] - 20 / 19) < 1e-12 and abs(summary["mdape"]["slotted_page"] - 8 / 19) < 1e-12


def test_a_stream_benchs_page_sizes_are_predicted_again_by_the_current_model(tmp_path):
    from tuner import report_spgemm
    from tuner.matrix import canonicalize
    from tuner.model import spgemm as model
    from tuner.spgemm import RowHashParams, plan_stats
    from tuner.spgemm.row_hash import profile_shared_limit
    from tuner.spgemm.slotted import plan_pages
    A = power_law(400, seed=47)
    path = tmp_path / "g.npz"
    sp.save_npz(path, A)
    a = canonicalize(A)
    stats = plan_stats(a, a, RowHashParams(), profile_shared_limit(None))
    plan, _ = plan_pages(a, a, 200_000, stats, model.rates_from(None))
    sizes = sorted(plan.predicted_s)[-2:]
    bench = {"rows": [{"name": "g AA", "source": str(path), "budget_bytes": 200_000,
                       "page_sizes": {**{str(e): {"predicted_s": 1.0, "measured_s": 0.01} for e in sizes},
                                      "phases_s": {"pages": 0.01}}}]}
    again = report_spgemm.repredict_pages(bench, tmp_path, None)["rows"][0]["page_sizes"]
    assert [again[str(e)]["predicted_s"] for e in sizes] == [plan.predicted_s[e] for e in sizes]
    assert again["phases_s"] == {"pages": 0.01} and all(again[str(e)]["measured_s"] == 0.01 for e in sizes)
