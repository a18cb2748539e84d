"""SpMM (Y = A X for a block of dense columns): the kernel's arithmetic in NumPy and every specialisation
through nvcc on the CPU; the compiled product against SciPy on the GPU."""
import numpy as np
import pytest
import scipy.sparse as sp

import tuner
from tuner import codegen, gpu, spmm
from tuner.cache import Cache
from tuner.matrix import MatrixError, canonicalize
from tuner.operations import REGISTRY, operation_of
from tuner.spmm import candidates, column_pass, compile_spmm, evaluate

from .conftest import fixture_matrices, power_law

FIXTURES = fixture_matrices()
WIDTHS = (1, 3, 8, 33)


def block(n, k, seed=0, dtype=np.float64):
    return np.random.default_rng(seed).uniform(-1, 1, (n, k)).astype(dtype)


def test_candidates_cover_every_lane_count_from_one_column_pass_to_a_warp():
    for k in (1, 2, 3, 5, 16, 31, 32, 33, 100):
        kp = column_pass(k)
        assert kp >= min(k, 32) and kp & (kp - 1) == 0 and kp <= 32
        lanes = sorted({p.lanes for p in candidates(k)})
        assert lanes[0] == kp and lanes[-1] == 32 and all(b == 2 * a for a, b in zip(lanes, lanes[1:]))
        assert {p.block_size for p in candidates(k)} == {128, 256}


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_the_kernels_arithmetic_equals_scipy_for_every_stream_count(name):
    m = canonicalize(FIXTURES[name])
    for k in WIDTHS:
        X = block(m.n_cols, k, seed=k)
        expected = m.to_scipy().astype(np.float64) @ X
        for p in candidates(k)[::2]:
            got = evaluate(m, X, p)
            assert got.shape == (m.n_rows, k)
            assert np.allclose(got, expected, rtol=1e-12, atol=1e-12 * max(1.0, np.abs(expected).max())), (name, k, p)


@pytest.mark.parametrize("k, val, idx", [(1, "float", "int"), (4, "float", "int"), (4, "double", "long long"),
                                         (33, "float", "long long"), (16, "double", "int"),
                                         (4096, "double", "int")])
def test_every_spmm_specialisation_compiles(k, val, idx, tmp_path):
    sources = [codegen.render("spmm.cu.j2", dict(VAL=val, IDX=idx, K=spmm.compiled_width(k), KP=column_pass(k),
                                                 LANES=p.lanes,
                                                 block_size=p.block_size, kernel_name=spmm.KERNEL))
               for p in candidates(k)]
    binaries = codegen.compile_many(sources, cache=Cache(tmp_path))
    assert len(binaries) == len(sources) and all(spmm.KERNEL.encode() in b.cubin for b in binaries)


def test_a_dense_second_operand_selects_the_multi_vector_product():
    A = sp.eye(4, format="csr")
    assert operation_of(A, np.ones((4, 2))).name == "spmm" and operation_of(A, A).name == "spgemm"
    X = block(4, 2)
    assert np.array_equal(REGISTRY["spmm"].oracle(A, X), X)


def test_bad_blocks_are_refused_with_the_reason():
    A = power_law(50, seed=3)
    for X, reason in ((np.ones(50), "2-D block"), (np.ones((49, 2)), "49 rows, but A has 50 columns"),
                      (np.ones((50, 0)), "no columns"), (np.ones((50, 2), np.complex64), "real values")):
        with pytest.raises(MatrixError, match=reason):
            spmm.check_block(X, 50, np.float32)
    if not gpu.available():
        with pytest.raises(gpu.NoDeviceError):
            compile_spmm(A, np.ones((50, 2)))


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_spmm_equals_scipy_on_every_fixture_width_and_candidate(name):
    A = FIXTURES[name]
    for k in WIDTHS:
        X = block(A.shape[1], k, seed=k)
        expected = A.astype(np.float64) @ X
        scale = max(1.0, np.abs(expected).max())
        tuned = tuner.compile(A, X)
        assert isinstance(tuned, spmm.SpMM) and tuned.plan["tune"] == "measure"
        got = tuned()
        assert got.dtype == A.dtype and np.abs(got - expected).max() <= 1e-5 * scale, (name, k)
        for p in candidates(k):
            fixed = compile_spmm(A, X, params={"lanes": p.lanes, "block_size": p.block_size})
            out = np.full((A.shape[0], k), np.nan, A.dtype)  # poisoned: every entry must be written
            fixed(X, out=out)
            assert np.abs(out - expected).max() <= 1e-5 * scale, (name, k, p)


@pytest.mark.gpu
def test_spmm_in_float64_with_int64_indices_is_exact_to_rounding():
    A = power_law(3000, seed=9, dtype=np.float64)
    X = block(3000, 5, seed=1)
    got = compile_spmm(A, X, index_dtype=np.int64)()
    assert np.abs(got - A @ X).max() <= 1e-12 * np.abs(A @ X).max()


@pytest.mark.gpu
def test_spmm_takes_device_blocks_and_new_blocks_without_recompiling(monkeypatch):
    cupy = pytest.importorskip("cupy")
    A = power_law(2000, seed=10)
    X = block(2000, 8, dtype=np.float32)
    product = compile_spmm(A, X)
    monkeypatch.setattr(spmm, "_tuned", lambda *a: pytest.fail("a plan-cache hit times nothing"))
    again = compile_spmm(A, X)
    assert again.params == product.params
    X2 = block(2000, 8, seed=2, dtype=np.float32)
    y = again(cupy.asarray(X2))
    assert isinstance(y, cupy.ndarray) and y.shape == (2000, 8)
    assert np.abs(y.get() - A.astype(np.float64) @ X2).max() <= 1e-4 * np.abs(A @ X2).max()
    with pytest.raises(MatrixError, match="compiled for 8"):
        again(block(2000, 4, dtype=np.float32))
    x_dev = cupy.asarray(X2)
    with pytest.raises(MatrixError, match="overlaps"):
        again(x_dev, out=x_dev)
