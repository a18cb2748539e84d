import numpy as np
import pytest
import scipy.sparse as sp

from tuner.matrix import MatrixError, canonicalize, check_vector_dtype, check_vector_shape, fingerprint


def test_duplicates_are_summed_and_indices_sorted_without_touching_the_input():
    A = sp.csr_matrix((np.array([1.0, 2.0, 4.0, 3.0]), np.array([3, 1, 3, 0]), np.array([0, 3, 4])), shape=(2, 4))
    before = A.indices.copy()
    m = canonicalize(A)
    assert m.indptr.tolist() == [0, 2, 3]
    assert m.indices.tolist() == [1, 3, 0]
    assert m.data.tolist() == [2.0, 5.0, 3.0]
    assert np.array_equal(A.indices, before)


@pytest.mark.parametrize("fmt", ["csr", "csc", "coo", "lil", "dok", "bsr", "dia"])
def test_every_scipy_format_gives_the_same_canonical_csr(fmt):
    A = sp.random(30, 20, density=0.2, format="csr", random_state=0, dtype=np.float64)
    m = canonicalize(A.asformat(fmt))
    assert (m.to_scipy() != A).nnz == 0
    assert m.value_dtype == np.float64 and m.index_dtype == np.int32


def test_sparse_arrays_are_accepted():
    A = sp.csr_array(np.array([[0, 1.5], [2.0, 0]], dtype=np.float32))
    m = canonicalize(A)
    assert m.data.tolist() == [1.5, 2.0] and m.shape == (2, 2)


@pytest.mark.parametrize("dtype", [np.int8, np.int64, np.bool_, np.uint32])
def test_integer_boolean_and_half_values_become_float32(dtype):
    A = sp.csr_matrix(np.array([[0, 1], [1, 1]], dtype=dtype))
    m = canonicalize(A)
    assert m.value_dtype == np.float32 and m.data.tolist() == [1.0, 1.0, 1.0]


def test_requested_dtype_is_applied():
    A = sp.csr_matrix(np.array([[0, 1.25]], dtype=np.float32))
    assert canonicalize(A, dtype=np.float64).value_dtype == np.float64
    with pytest.raises(MatrixError, match="float32 or float64"):
        canonicalize(A, dtype=np.int32)


def test_complex_matrices_are_refused():
    with pytest.raises(MatrixError, match="complex"):
        canonicalize(sp.csr_matrix(np.array([[1 + 2j]])))


def test_dense_input_is_refused_with_a_hint():
    with pytest.raises(MatrixError, match="dense ndarray.*csr_matrix"):
        canonicalize(np.eye(3))
    with pytest.raises(MatrixError, match="got list"):
        canonicalize([[1, 0], [0, 1]])


@pytest.mark.parametrize("bad, word", [(np.nan, "NaN"), (np.inf, "infinite")])
def test_non_finite_values_are_refused(bad, word):
    A = sp.csr_matrix(np.array([[0, 1.0], [bad, 2.0]]))
    with pytest.raises(MatrixError, match=word):
        canonicalize(A)


def test_float64_values_overflowing_float32_are_refused():
    A = sp.csr_matrix(np.array([[1e300, 1.0]]))
    with pytest.raises(MatrixError, match="overflow float32"):
        canonicalize(A, dtype=np.float32)


def test_int32_indices_when_they_fit_int64_on_request():
    A = sp.random(10, 10, density=0.3, format="csr", random_state=1)
    A.indices, A.indptr = A.indices.astype(np.int64), A.indptr.astype(np.int64)
    assert canonicalize(A).index_dtype == np.int32
    m = canonicalize(A, index_dtype=np.int64)
    assert m.index_dtype == np.int64 and m.indptr.dtype == np.int64


def test_int32_is_refused_when_the_shape_overflows_it():
    A = sp.csr_matrix((np.ones(1, np.float32), (np.array([0]), np.array([2**31 + 5]))), shape=(1, 2**31 + 10))
    assert canonicalize(A).index_dtype == np.int64
    with pytest.raises(MatrixError, match="int32 indices overflow"):
        canonicalize(A, index_dtype=np.int32)


def test_pattern_matrices_are_recognised():
    A = sp.csr_matrix(np.array([[0, 3.0], [3.0, 3.0]]))
    m = canonicalize(A)
    assert m.value_free and m.pattern_value == 3.0
    assert not canonicalize(sp.csr_matrix(np.array([[0, 3.0], [1.0, 3.0]]))).value_free


def test_empty_matrices_and_empty_rows_work():
    m = canonicalize(sp.csr_matrix((5, 7), dtype=np.float32))
    assert m.nnz == 0 and m.shape == (5, 7) and not m.value_free and m.row_lengths.tolist() == [0] * 5
    m0 = canonicalize(sp.csr_matrix((0, 3), dtype=np.float32))
    assert m0.shape == (0, 3) and m0.indptr.tolist() == [0]
    assert fingerprint(m0).features["row_max"] == 0


def test_fingerprint_ignores_values_but_not_structure_shape_or_index_type():
    A = sp.random(40, 40, density=0.1, format="csr", random_state=2, dtype=np.float32)
    base = fingerprint(canonicalize(A)).digest
    assert fingerprint(canonicalize(A * 2.5)).digest == base
    B = A.tolil(); B[0, 0] = 7.0 if A[0, 0] == 0 else 0.0
    assert fingerprint(canonicalize(B.tocsr())).digest != base
    C = sp.csr_matrix((A.data, A.indices, A.indptr), shape=(40, 41))
    assert fingerprint(canonicalize(C)).digest != base
    assert fingerprint(canonicalize(A, index_dtype=np.int64)).digest != base


def test_fingerprint_separates_pattern_from_valued_matrices_of_one_structure():
    A = sp.random(30, 30, density=0.2, format="csr", random_state=3, dtype=np.float32)
    P = A.copy(); P.data[:] = 1.0
    assert fingerprint(canonicalize(P)).digest != fingerprint(canonicalize(A)).digest


def test_fingerprint_features_summarise_rows_and_columns():
    A = sp.csr_matrix((np.ones(6, np.float32), ([0, 0, 0, 0, 1, 3], [0, 1, 2, 3, 1, 1])), shape=(4, 4))
    f = fingerprint(canonicalize(A)).features
    assert (f["n_rows"], f["nnz"], f["row_max"], f["empty_rows"], f["col_max"]) == (4, 6, 4, 1, 3)
    assert f["row_mean"] == 1.5 and f["value_free"] is True


def test_vector_checks_name_the_problem():
    with pytest.raises(MatrixError, match="length 4, but the matrix needs 5"):
        check_vector_shape((4,), 5)
    with pytest.raises(MatrixError, match="1-D"):
        check_vector_shape((5, 1), 5)
    with pytest.raises(MatrixError, match="float64.*float32"):
        check_vector_dtype(np.float64, np.dtype(np.float32))
    check_vector_dtype(np.int16, np.dtype(np.float32), allow_safe_cast=True)
    with pytest.raises(MatrixError, match="int64"):
        check_vector_dtype(np.int64, np.dtype(np.float32), allow_safe_cast=True)


def test_digest_sees_a_change_in_any_slice_of_the_structure(monkeypatch):
    import tuner.matrix as matrix
    monkeypatch.setattr(matrix, "HASH_CHUNK", 64)  # many slices even for a small matrix
    A = sp.random(200, 200, density=0.05, format="csr", random_state=4, dtype=np.float32)
    m = canonicalize(A)
    base = matrix.structure_digest(m)
    assert matrix.structure_digest(canonicalize(A.copy())) == base
    for pos in (0, m.nnz // 2, m.nnz - 1):
        B = A.copy()
        row = np.searchsorted(B.indptr, pos, side="right") - 1
        free = np.setdiff1d(np.arange(200), B.indices[B.indptr[row]:B.indptr[row + 1]])[0]
        B.indices[pos] = free
        B.has_sorted_indices = False
        assert matrix.structure_digest(canonicalize(B)) != base


def _csr(indptr, indices, shape=(3, 4)):
    """A CSR matrix whose arrays are set after construction, as a caller can (SciPy checks none of this)."""
    A = sp.csr_matrix((np.ones(3, np.float32), np.array([0, 1, 2]), np.array([0, 1, 2, 3])), shape=shape)
    A.indptr, A.indices, A.data = np.asarray(indptr), np.asarray(indices), np.ones(len(indices), np.float32)
    return A


@pytest.mark.parametrize("indptr, indices, words", [
    ([0, 1, 2, 3], [0, 4, 2], r"column index 4 \(first out of range at position 1\) is out of range for 4 columns"),
    ([0, 1, 2, 3], [0, -1, 2], r"negative column index -1 \(first at position 1\)"),
    ([0, 2, 1, 3], [0, 1, 2], r"indptr is not monotonic: indptr\[2\] = 1 < indptr\[1\] = 2"),
    ([0, 1, 2, 2], [0, 1, 2], r"indptr\[-1\] = 2 does not match the 3 stored entries"),
    ([0, 1, 2, 4], [0, 1, 2], r"indptr\[-1\] = 4 does not match the 3 stored entries"),
    ([1, 1, 2, 3], [0, 1, 2], r"indptr\[0\] is 1, but it must be 0"),
    ([0, 1, 3], [0, 1, 2], r"indptr has 3 entries, but 3 rows need 4"),
])
def test_structural_defects_of_csr_are_refused_by_name(indptr, indices, words):
    with pytest.raises(MatrixError, match=words):
        canonicalize(_csr(indptr, indices))


def test_out_of_range_rows_of_csc_and_coo_are_refused():
    csc = sp.csc_matrix(np.eye(3, dtype=np.float32))
    csc.indices[2] = 3
    with pytest.raises(MatrixError, match="row index 3 .* out of range for 3 rows"):
        canonicalize(csc)
    coo = sp.coo_matrix(np.eye(3, dtype=np.float32))
    coo.col[0] = 9
    with pytest.raises(MatrixError, match="column index 9 .* out of range for 3 columns"):
        canonicalize(coo)
    coo = sp.coo_matrix(np.eye(3, dtype=np.float32))
    coo.row[1] = -2
    with pytest.raises(MatrixError, match="negative row index -2"):
        canonicalize(coo)


def test_a_valid_matrix_with_the_largest_index_in_range_is_accepted():
    m = canonicalize(_csr([0, 1, 2, 3], [3, 0, 3]))
    assert m.indices.tolist() == [3, 0, 3]


def test_integers_beyond_float32_precision_become_float64_unless_float32_is_asked():
    big = (1 << 24) + 1
    A = sp.csr_matrix(np.array([[0, big], [3, 0]], dtype=np.int64))
    m = canonicalize(A)
    assert m.value_dtype == np.float64 and m.data.tolist() == [float(big), 3.0]
    with pytest.warns(RuntimeWarning, match=f"integer values up to {big} do not fit float32 exactly"):
        assert canonicalize(A, dtype=np.float32).value_dtype == np.float32
    assert canonicalize(sp.csr_matrix(np.array([[0, 1 << 24]], dtype=np.int64))).value_dtype == np.float32


def test_summed_duplicates_of_narrow_integers_do_not_wrap():
    A = sp.coo_matrix((np.array([100, 100], dtype=np.int8), ([0, 0], [1, 1])), shape=(1, 2))
    assert canonicalize(A).data.tolist() == [200.0]


def test_length_quantiles_equal_numpys_higher_quantiles():
    from tuner.matrix import length_quantiles
    rng = np.random.default_rng(5)
    qs = (0.0, 0.5, 0.9, 0.99, 1.0)
    for trial in range(300):
        n = int(rng.integers(1, 2000))
        v = (rng.pareto(1.2, n) * 20).astype(np.int64) if trial % 2 else rng.integers(0, 1 + trial, n)
        assert length_quantiles(v, qs) == [int(x) for x in np.quantile(v, qs, method="higher")], trial
    assert length_quantiles(np.zeros(0, np.int64), qs) == [0] * 5
