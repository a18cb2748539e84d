"""SpGEMM, C = A B: the workload table and its expansion checked against SciPy in NumPy (CPU), every
template specialisation compiled by nvcc, and the GPU's products against SciPy in float64."""
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


@pytest.mark.parametrize("val", ["float", "double"])
def test_cub_merge_library_compiles_and_exports_its_functions(val, tmp_path):
    import ctypes
    path = codegen.compile_library(codegen.render("cub_merge.cu.j2", dict(VAL=val, kernel_name="m")),
                                   cache=Cache(tmp_path))
    lib = ctypes.CDLL(str(path))
    assert all(hasattr(lib, f"m_{name}") for name in ("sort", "reduce", "synchronize"))


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
