"""The float64 reference products on threads equal SciPy's serial ones to the bit."""
import numpy as np
import pytest
import scipy.sparse as sp

from tuner import host_products
from tuner.host_products import matmul64, matvec64
from tuner.matrix import row_blocks

from .conftest import fixture_matrices, power_law


@pytest.fixture
def many_blocks(monkeypatch):
    monkeypatch.setattr(host_products, "BLOCK_ENTRIES", 100)  # small matrices still split among threads


def test_row_blocks_cover_every_row_once_balanced_by_entries():
    A = power_law(5000, seed=4)
    blocks = row_blocks(A.indptr, 16)
    assert blocks[0][0] == 0 and blocks[-1][1] == A.shape[0]
    assert all(b[1] == c[0] and b[1] > b[0] for b, c in zip(blocks, blocks[1:]))
    entries = [int(A.indptr[e] - A.indptr[s]) for s, e in blocks]
    assert len(blocks) <= 16 and max(entries) <= A.nnz / 16 + np.diff(A.indptr).max()


def test_a_row_block_reads_the_matrix_indices_in_place_not_a_copy():
    A = power_law(5000, seed=4)
    first, end = row_blocks(A.indptr, 16)[3]
    block = host_products._rows(A, first, end, absolute=False)
    assert np.shares_memory(block.indices, A.indices) and block.indices.size < A.nnz // 2
    assert block.data.dtype == np.float64 and (block != A[first:end]).nnz == 0


@pytest.mark.parametrize("name", sorted(fixture_matrices()))
def test_threaded_matvec_equals_scipys_serial_float64_product(name, many_blocks):
    A = sp.csr_matrix(fixture_matrices()[name])
    x = np.random.default_rng(1).uniform(-1, 1, A.shape[1])
    want = A.astype(np.float64) @ x
    assert np.array_equal(matvec64(A, x, threads=3), want)
    assert np.array_equal(matvec64(A, np.abs(x), absolute=True, threads=3), abs(A.astype(np.float64)) @ np.abs(x))


def test_threaded_matmul_equals_scipys_serial_float64_product(many_blocks):
    A = power_law(800, seed=5)
    B = power_law(800, seed=6, dtype=np.float64)
    got, want = matmul64(A, B, threads=3), (A.astype(np.float64) @ B).tocsr()
    assert got.dtype == np.float64 and len(row_blocks(A.indptr, 12)) > 3
    assert np.array_equal(got.indptr, want.indptr) and np.array_equal(got.indices, want.indices)
    assert np.array_equal(got.data, want.data)


def test_empty_matrices_give_zero_products():
    A = sp.csr_matrix((4, 3), dtype=np.float32)
    assert matvec64(A, np.ones(3)).tolist() == [0.0] * 4
    assert matmul64(A, sp.csr_matrix((3, 2))).shape == (4, 2)
    assert matvec64(sp.csr_matrix((0, 3)), np.ones(3)).shape == (0,)
