"""SpMM (Y = A X for a block of dense columns): the kernel's arithmetic in NumPy and every specialisation
through nvcc on the CPU; the compiled product against SciPy on the GPU."""
from dataclasses import asdict

import numpy as np
import pytest
import scipy.sparse as sp

import tuner
from tuner import codegen, gpu, spmm
from tuner.cache import Cache
from tuner.matrix import MatrixError, canonicalize
from tuner.operations import REGISTRY, operation_of
from tuner.spmm import SpmmParams, candidates, column_pass, compile_spmm, evaluate, label, task_entries

from .conftest import fixture_matrices, power_law

FIXTURES = fixture_matrices()
WIDTHS = (1, 3, 8, 33)


def block(n, k, seed=0, dtype=np.float64):
    return np.random.default_rng(seed).uniform(-1, 1, (n, k)).astype(dtype)


def test_candidates_cover_every_lane_count_from_one_column_pass_to_a_warp():
    for k in (1, 2, 3, 5, 16, 31, 32, 33, 100):
        kp = column_pass(k)
        assert kp >= min(k, 32) and kp & (kp - 1) == 0 and kp <= 32
        for family in spmm.FAMILIES.values():
            lanes = sorted({p.lanes for p in family(k)})
            assert lanes[0] == kp and lanes[-1] == 32 and all(b == 2 * a for a, b in zip(lanes, lanes[1:]))
        assert {p.block_size for p in candidates(k)} == {128, 256}
        assert {p.family for p in candidates(k)} == set(spmm.FAMILIES) == {"row_groups", "row_tasks"}
        # a task is the same steps along each entry stream whatever the lanes: entries grow with the streams
        assert {task_entries(k, p) // (p.lanes // kp) for p in candidates(k) if p.task_steps} == {spmm.TASK_STEPS}


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_the_kernels_arithmetic_equals_scipy_for_every_stream_count(name):
    m = canonicalize(FIXTURES[name])
    for k in WIDTHS:
        X = block(m.n_cols, k, seed=k)
        expected = m.to_scipy().astype(np.float64) @ X
        for p in candidates(k):
            got = evaluate(m, X, p)
            assert got.shape == (m.n_rows, k)
            assert np.allclose(got, expected, rtol=1e-12, atol=1e-12 * max(1.0, np.abs(expected).max())), (name, k, p)


def test_a_hubs_row_cut_into_tasks_and_rows_without_tasks_sum_as_scipy():
    A = power_law(500, seed=11, dtype=np.float64).tolil()
    A[7, :] = 1.5  # a hub: 500 entries, many tasks at every task size
    A[8, :] = 0.0  # an empty row: no task, its sums the zeros the launch starts from
    m = canonicalize(sp.csr_matrix(A))
    X = block(500, 5, seed=3)
    expected = m.to_scipy() @ X
    for steps in (1, 3, spmm.TASK_STEPS):  # tasks of 1, 3 and 32 entries per stream
        for lanes in (8, 32):
            got = evaluate(m, X, SpmmParams(lanes, 256, steps))
            assert np.abs(got - expected).max() <= 1e-12 * np.abs(expected).max(), (steps, lanes)
            assert not got[8].any()


def test_a_work_item_arithmetic_that_misses_entries_is_caught(monkeypatch):
    m = canonicalize(power_law(300, seed=2, dtype=np.float64))
    monkeypatch.setattr(spmm, "task_entries", lambda k, p: 4)
    real = spmm.row_tasks
    monkeypatch.setattr(spmm, "row_tasks", lambda indptr, entries, dtype: real(indptr, 2 * entries, dtype))
    with pytest.raises(RuntimeError, match="do not cover every entry exactly once"):
        evaluate(m, block(300, 2), SpmmParams(4, 256, 1))


@pytest.mark.parametrize("k, val, idx", [(1, np.float32, np.int32), (4, np.float32, np.int32),
                                         (4, np.float64, np.int64), (33, np.float32, np.int64),
                                         (16, np.float64, np.int32), (4096, np.float64, np.int32)])
def test_every_spmm_specialisation_compiles(k, val, idx, tmp_path):
    sources = [spmm.render(k, p, val, idx) for p in candidates(k)]
    assert sum("#define TASK " in src for src in sources) == len(spmm.row_tasks_candidates(k))
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
            fixed = compile_spmm(A, X, params=asdict(p))
            out = np.full((A.shape[0], k), np.nan, A.dtype)  # poisoned: every entry must be written
            fixed(X, out=out)
            assert np.abs(out - expected).max() <= 1e-5 * scale, (name, k, label(p))


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


@pytest.mark.gpu
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_row_tasks_spread_a_hubs_row_leave_empty_rows_zero_and_repeat_without_accumulating(index_dtype):
    cupy = pytest.importorskip("cupy")
    A = power_law(4000, seed=12, dtype=np.float64).tolil()
    A[7, :] = 1.5  # a hub: 4,000 entries, dozens of tasks
    A[8, :] = 0.0
    A = sp.csr_matrix(A)
    X = block(4000, 6, seed=4)
    expected = A @ X
    for p in spmm.row_tasks_candidates(6):
        product = compile_spmm(A, X, index_dtype=index_dtype, params=asdict(p))
        out = np.full((4000, 6), np.nan)  # poisoned: rows without a task must come back zero
        for _ in range(2):  # the second product into the same buffer: the tasks' sums are not added twice
            product(X, out=out)
            assert np.abs(out - expected).max() <= 1e-12 * np.abs(expected).max(), label(p)
        assert not out[8].any()
        y = cupy.full((4000, 6), cupy.nan)
        product(cupy.asarray(X), out=y)
        product(cupy.asarray(X), out=y)
        assert np.abs(y.get() - expected).max() <= 1e-12 * np.abs(expected).max(), label(p)


@pytest.mark.gpu
def test_the_tuning_times_both_families_and_keeps_the_fastest():
    A = power_law(20000, seed=13)
    X = block(20000, 4, dtype=np.float32)
    product = compile_spmm(A, X)
    timed = {label(SpmmParams(**p)): ms for p, ms in product.plan["measured_ms"]}
    assert set(timed) == {label(p) for p in candidates(4)}
    assert label(product.params) == min(timed, key=timed.get)
    assert np.abs(product() - A.astype(np.float64) @ X).max() <= 1e-4 * np.abs(A @ X).max()
