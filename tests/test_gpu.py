"""GPU tests: every family and parameter set against SciPy in float64, array interop, the plan cache.

Skipped on machines without a CUDA device (see conftest.py).
"""
import numpy as np
import pytest
import scipy.sparse as sp

import tuner
from tuner import codegen, compiler, families, gpu, profile, report
from tuner.kernel import DeviceArrays, SpMV, random_vector
from tuner.matrix import canonicalize

from .conftest import fixture_matrices

pytestmark = pytest.mark.gpu
FIXTURES = fixture_matrices()


def rel_error(y, ref):
    y = np.asarray(y, dtype=np.float64)
    assert np.isfinite(y).all(), "some rows were never written (poison survived) or overflowed"
    denom = np.linalg.norm(ref)
    return np.linalg.norm(y - ref) / denom if denom else np.linalg.norm(y - ref)


def check_every_candidate(m, tol, specs=None):
    """Build every candidate of every family for ``m`` (or ``specs``), run on a random x with poisoned y,
    compare."""
    arch = gpu.device_info().arch
    specs = families.specializations(m) if specs is None else specs
    binaries = codegen.compile_many([families.render(s, m) for s in specs], arch=arch)
    arrays = DeviceArrays()
    x = random_vector(m.n_cols, m.value_dtype, seed=11)
    ref = m.to_scipy().astype(np.float64) @ x.astype(np.float64)
    failures = []
    for spec, binary in zip(specs, binaries):
        k = SpMV(m, spec, binary.cubin, plan=None, arrays=arrays)
        x_ptr, y_ptr = k.buffers
        gpu.copy_to_device(x_ptr, x)
        gpu.memset_bytes(y_ptr, 0xFF, m.n_rows * m.value_dtype.itemsize)  # NaN in every row
        k.launch(x_ptr, y_ptr)
        y = np.empty(m.n_rows, m.value_dtype)
        gpu.copy_to_host(y, y_ptr)
        err = rel_error(y, ref) if np.isfinite(y).all() else np.inf
        if not err <= tol:
            failures.append((spec.label(), err))
    assert not failures, failures
    return len(specs)


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_every_candidate_matches_scipy_on_fixture(name):
    A = FIXTURES[name]
    m = canonicalize(A)
    tol = 1e-12 if m.value_dtype == np.float64 else 1e-5
    assert check_every_candidate(m, tol) >= 2


def tiled_specs(m):
    """tile_coo and tile_composite over many narrow tiles (the fixtures' x fits one L1-sized tile), with
    one-row, small and GPU-filling workloads, with and without the camping pad."""
    from tuner.families.base import Specialization, ordered_matrix
    from tuner.families.tile_composite import TileCompositeParams, fill_workload, tile_extent
    from tuner.families.tiles import ranked_tile_runs
    from tuner.families.tile_coo import TileCooParams
    plan = ordered_matrix(m, "degree")
    out = []
    for width in (16, 256):
        out.append(TileCooParams(width))
        runs = ranked_tile_runs(plan, width)
        n = runs.n_tiles
        for wl in ((1,) * n, (64,) * n, tuple(fill_workload(*tile_extent(*runs.tile(t)), 512) for t in range(n))):
            out += [TileCompositeParams(width, wl, pad) for pad in (False, True)]
    return [Specialization("tile_coo" if isinstance(p, TileCooParams) else "tile_composite", p, m.value_dtype,
                           m.index_dtype, m.value_free) for p in out]


@pytest.mark.parametrize("name", ["power_law", "rectangular_wide", "rectangular_tall", "one_dense_row",
                                  "empty_rows", "pattern", "float64", "long_rows", "tiny", "all_empty"])
def test_tiled_families_match_scipy_across_many_tiles(name):
    m = canonicalize(FIXTURES[name])
    check_every_candidate(m, 1e-12 if m.value_dtype == np.float64 else 1e-5, tiled_specs(m))


def test_tiled_families_match_scipy_on_rmat_with_int64_indices():
    for m in (canonicalize(tuner.load("rmat:16")), canonicalize(FIXTURES["power_law"], index_dtype=np.int64)):
        check_every_candidate(m, 1e-5, tiled_specs(m))


@pytest.mark.parametrize("name", ["power_law", "one_dense_row", "pattern", "rectangular_tall"])
def test_every_candidate_matches_scipy_with_int64_indices(name):
    m = canonicalize(FIXTURES[name], index_dtype=np.int64)
    assert m.index_dtype == np.int64
    check_every_candidate(m, 1e-5)


@pytest.mark.parametrize("name", ["power_law", "pattern"])
def test_every_candidate_matches_scipy_in_float64(name):
    m = canonicalize(FIXTURES[name], dtype=np.float64)
    check_every_candidate(m, 1e-12)


def test_every_candidate_matches_scipy_on_real_matrices(real_paths):
    for path in real_paths:
        m = canonicalize(sp.load_npz(path))
        check_every_candidate(m, 1e-5)


def test_every_candidate_matches_scipy_on_rmat():
    m = canonicalize(tuner.load("rmat:16"))
    assert m.value_free
    check_every_candidate(m, 1e-5)


def test_exhaustive_compile_returns_fastest_candidate_and_numpy_result():
    A = FIXTURES["power_law"]
    spmv = tuner.compile(A, tune="exhaustive")
    timed = [t.measured_ms for t in spmv.plan.ranking if t.measured_ms is not None]
    assert spmv.plan.measured_ms == min(timed)
    assert len(spmv.plan.ranking) == len(families.specializations(canonicalize(A)))
    x = random_vector(A.shape[1], np.float32, seed=3)
    y = spmv(x)
    assert isinstance(y, np.ndarray) and y.dtype == np.float32
    assert rel_error(y, A.astype(np.float64) @ x.astype(np.float64)) < 1e-5
    assert "rank" in spmv.explain() and spmv.spec.label() in spmv.explain()


def test_second_compile_hits_cache_without_timing_or_nvcc(monkeypatch):
    A = FIXTURES["one_dense_row"]
    first = tuner.compile(A)

    def forbidden(*args, **kwargs):
        raise AssertionError("cache hit must not time or compile")

    monkeypatch.setattr(compiler, "measure", forbidden)
    monkeypatch.setattr(codegen, "compile_source", forbidden)
    monkeypatch.setattr(codegen, "compile_many", forbidden)
    again = tuner.compile(A * 3.0)  # same structure, other values: same plan
    assert again.plan == first.plan
    x = random_vector(A.shape[1], np.float32, seed=4)
    assert rel_error(again(x), (A * 3.0).astype(np.float64) @ x.astype(np.float64)) < 1e-5


def test_numpy_out_is_filled_and_returned():
    A = FIXTURES["float64"]
    spmv = tuner.compile(A, family="csr_vector", params={"threads_per_row": 4, "block_size": 128})
    out = np.full(A.shape[0], np.nan)
    x = random_vector(A.shape[1], np.float64, seed=5)
    assert spmv(x, out=out) is out
    assert rel_error(out, A @ x) < 1e-12


def test_numpy_x_of_wrong_length_or_dtype_is_refused():
    spmv = tuner.compile(FIXTURES["tiny"], family="csr_vector", params={})
    with pytest.raises(tuner.MatrixError, match="length 3"):
        spmv(np.ones(3, np.float32))
    with pytest.raises(tuner.MatrixError, match="float64"):
        spmv(np.array([1.0, 2.0]))
    assert np.allclose(spmv(np.array([1, 2], dtype=np.int16)), [5.0, 1.5])


def test_cupy_arrays_in_and_out_without_copy():
    cp = pytest.importorskip("cupy")
    A = FIXTURES["pattern"]
    spmv = tuner.compile(A)
    x = random_vector(A.shape[1], np.float32, seed=6)
    xd = cp.asarray(x)
    yd = spmv(xd)
    assert isinstance(yd, cp.ndarray) and yd.dtype == cp.float32
    assert rel_error(cp.asnumpy(yd), A.astype(np.float64) @ x.astype(np.float64)) < 1e-5
    out = cp.full(A.shape[0], cp.nan, dtype=cp.float32)
    assert spmv(xd, out=out) is out
    assert rel_error(cp.asnumpy(out), A.astype(np.float64) @ x.astype(np.float64)) < 1e-5
    with pytest.raises(tuner.MatrixError, match="float64"):
        spmv(cp.asarray(x, dtype=cp.float64))
    with pytest.raises(tuner.MatrixError, match="overlaps"):
        square = tuner.compile(FIXTURES["power_law"], family="csr_vector", params={})
        v = cp.asarray(random_vector(square.shape[1], np.float32))
        square(v, out=v)


def test_cupy_array_on_a_nonblocking_stream_is_ordered():
    cp = pytest.importorskip("cupy")
    A = FIXTURES["long_rows"]
    spmv = tuner.compile(A, family="binned", params={})
    x = random_vector(A.shape[1], np.float32, seed=8)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        xd = cp.asarray(x) * 2
        yd = spmv(xd)
        result = cp.asnumpy(yd * 1)
    assert rel_error(result, A.astype(np.float64) @ (2 * x.astype(np.float64))) < 1e-5


def _interface_view(a):
    """What ``__cuda_array_interface__`` says of ``a``, as gpu.view gives it for other libraries."""
    cai = a.__cuda_array_interface__
    return (cai["data"][0], tuple(cai["shape"]), np.dtype(cai["typestr"]), cai["data"][1], cai.get("stream"))


def test_a_cupy_arrays_view_is_what_its_interface_says_on_either_stream():
    cp = pytest.importorskip("cupy")
    a = cp.arange(12, dtype=cp.float64)[2:9]  # a pointer past the allocation's start
    ptr, shape, dtype, readonly, stream = _interface_view(a)
    v = gpu.view(a)
    assert (v.ptr, v.shape, v.dtype, v.readonly) == (ptr, shape, dtype, readonly) == (a.data.ptr, (7,),
                                                                                     np.dtype(np.float64), False)
    assert stream in (1, 2) and v.stream is None  # the default stream, either way not waited for
    assert not gpu.wait_for_stream(v.stream)
    side = cp.cuda.Stream(non_blocking=True)
    with side:
        assert gpu.view(a).stream == _interface_view(a)[4] == side.ptr
    with pytest.raises(ValueError, match="not contiguous"):
        gpu.view(cp.arange(10, dtype=cp.float32)[::2])
    assert gpu.is_device_array(a) and not gpu.is_device_array(cp.asnumpy(a))


def test_torch_tensors_in_and_out():
    torch = pytest.importorskip("torch")
    A = FIXTURES["rectangular_wide"]
    spmv = tuner.compile(A)
    x = random_vector(A.shape[1], np.float32, seed=9)
    y = spmv(torch.from_numpy(x).cuda())
    assert isinstance(y, torch.Tensor) and y.is_cuda and y.dtype == torch.float32
    assert rel_error(y.cpu().numpy(), A.astype(np.float64) @ x.astype(np.float64)) < 1e-5


def test_pycuda_gpuarray_in_and_out():
    import pycuda.gpuarray as gpuarray
    A = FIXTURES["rectangular_tall"]
    spmv = tuner.compile(A)
    x = random_vector(A.shape[1], np.float32, seed=10)
    y = spmv(gpuarray.to_gpu(x))
    assert isinstance(y, gpuarray.GPUArray)
    assert rel_error(y.get(), A.astype(np.float64) @ x.astype(np.float64)) < 1e-5


SHARED_SOURCE = r"""
extern "C" __global__ void fill_shared(float* out, int n) {
    extern __shared__ float buf[];  // n floats of dynamic shared memory, written then summed by thread 0
    for (int i = threadIdx.x; i < n; i += blockDim.x) buf[i] = (float)(i & 7);  // exact sums
    __syncthreads();
    if (threadIdx.x == 0) { float s = 0.f; for (int i = 0; i < n; ++i) s += buf[i]; out[0] = s; }
}
"""


def test_kernels_of_one_binary_share_their_module_and_its_larger_shared_opt_in():
    cubin = codegen.compile_source(SHARED_SOURCE, gpu.device_info().arch).cubin
    big, small = (gpu.Kernel(cubin, "fill_shared", "Pi") for _ in range(2))
    assert big.module is small.module is gpu.loaded_module(cubin)
    out = gpu.alloc(4)
    y = np.empty(1, np.float32)
    # 100 KB through one kernel object, then 60 KB through the other, then 100 KB again: the second opt-in
    # must not shrink the function's limit under the first one's launches.
    for kernel, n in ((big, 25_600), (small, 15_360), (big, 25_600)):
        gpu.memset_bytes(int(out), 0xFF, 4)
        kernel.launch(1, 256, out, np.int32(n), shared=4 * n)
        gpu.copy_to_host(y, int(out))
        assert y[0] == (np.arange(n) & 7).sum()


def test_matrix_without_rows_or_entries_runs():
    empty = tuner.compile(FIXTURES["all_empty"])
    assert np.array_equal(empty(random_vector(30, np.float32)), np.zeros(40, np.float32))
    no_rows = tuner.compile(sp.csr_matrix((0, 5), dtype=np.float32), family="csr_vector", params={})
    assert no_rows(random_vector(5, np.float32)).shape == (0,)


def test_candidate_failing_on_the_gpu_is_ranked_last_and_tuning_goes_on(monkeypatch, caplog):
    real = compiler.SpMV

    def refuse_binned(m, spec, cubin, plan=None, arrays=None, **built):  # built: the chosen one's layout
        if spec.family == "binned":
            raise gpu.GpuError("launch refused (test)")
        return real(m, spec, cubin, plan, arrays, **built)

    monkeypatch.setattr(compiler, "SpMV", refuse_binned)
    spmv = tuner.compile(FIXTURES["power_law"], tune="exhaustive")
    assert spmv.plan.family != "binned"
    failed = [t for t in spmv.plan.ranking if t.measured_ms is None]
    assert failed and all(t.family == "binned" for t in failed)
    assert spmv.plan.ranking[-1].measured_ms is None
    assert "launch refused (test)" in caplog.text


@pytest.fixture(scope="session")
def reduced_profile(tmp_path_factory):
    path = tmp_path_factory.mktemp("profile") / "profile.json"
    profile.run(path, profile.REDUCED)
    return tuner.model.load_profile(path=path)


def test_model_mode_times_nothing_and_is_correct(reduced_profile, monkeypatch):
    monkeypatch.setattr(compiler, "measure", lambda *a, **k: (_ for _ in ()).throw(AssertionError("timed")))
    A = FIXTURES["power_law"]
    spmv = tuner.compile(A, tune="model", profile=reduced_profile)
    assert spmv.plan.tune == "model" and spmv.plan.measured_ms is None and spmv.plan.predicted_ms > 0
    assert spmv.plan.predicted_ms == min(t.predicted_ms for t in spmv.plan.ranking)
    x = random_vector(A.shape[1], np.float32, seed=12)
    assert rel_error(spmv(x), A.astype(np.float64) @ x.astype(np.float64)) < 1e-5
    assert "predicted ms" in spmv.explain()
    # The plan records its stages' host time: the relabelling and the planning beyond it, nothing timed.
    assert set(spmv.plan.seconds) == {"relabel", "plan"} and 0 < spmv.plan.seconds["plan"] < 5
    assert "planning took relabel" in spmv.explain()


def test_measure_mode_times_the_model_top_k(reduced_profile):
    spmv = tuner.compile(FIXTURES["long_rows"], tune="measure", top_k=4, profile=reduced_profile)
    timed = [t for t in spmv.plan.ranking if t.measured_ms is not None]
    assert len(timed) == 4 and spmv.plan.measured_ms == min(t.measured_ms for t in timed)
    assert spmv.plan.seconds["select"] > 0  # timing the four (and their nvcc) is recorded apart
    top4 = sorted(spmv.plan.ranking, key=lambda t: t.predicted_ms)[:4]
    assert {t.label() for t in timed} == {t.label() for t in top4}


def test_optuna_mode_stores_a_resumable_study(reduced_profile, isolated_cache):
    A = FIXTURES["pattern"]
    spmv = tuner.compile(A, tune="optuna", trials=6, profile=reduced_profile)
    assert spmv.plan.tune == "optuna" and spmv.plan.measured_ms is not None
    assert (isolated_cache / "optuna.sqlite3").is_file()
    x = random_vector(A.shape[1], np.float32, seed=13)
    assert rel_error(spmv(x), A.astype(np.float64) @ x.astype(np.float64)) < 1e-5


def test_report_metrics_come_from_real_timings(reduced_profile, tmp_path):
    sources = []
    for name in ("power_law", "one_dense_row"):
        sp.save_npz(tmp_path / f"{name}.npz", FIXTURES[name])
        sources.append(str(tmp_path / f"{name}.npz"))
    rows, meta = report.collect(sources, reduced_profile, rounds=3)
    assert {r.matrix for r in rows} == {"power_law", "one_dense_row"}
    assert all(np.isfinite(r.measured_ms) and r.measured_ms > 0 and r.predicted_ms > 0 for r in rows)
    # Three rounds, on buffers placed afresh, for a candidate whose first round is under the threshold; the
    # median lies between the extremes.
    assert all(r.min_ms <= r.measured_ms <= r.max_ms for r in rows)
    short = [r for r in rows if r.max_ms < compiler.ROUNDS_UNDER_MS]
    assert short and all(r.rounds == 3 for r in short)
    assert all(r.min_ms >= compiler.ROUNDS_UNDER_MS for r in rows if r.rounds == 1)
    assert {r.rounds for r in rows} <= {1, 3}
    summary = report.write_all(rows, meta, tmp_path / "out")
    for model in ("lookup", "baseline"):
        o = summary["overall"][model]
        assert 0 <= o["top1"] <= 1 and o["regret_geomean"] >= 1 and np.isfinite(o["mdape"])
    assert meta["matrices"]["power_law"]["planning_seconds"] < 5


def test_queued_timing_measures_the_gpu_not_the_launch_rate():
    # A kernel of a few microseconds: issued one by one, the event pairs measure Python's launch rate;
    # queued behind the hold kernel they measure the GPU. Both see the same kernel, so queued is no slower.
    m = canonicalize(FIXTURES["power_law"])
    spec = families.specializations(m, ["csr_vector"])[0]
    k = SpMV(m, spec, codegen.compile_source(families.render(spec, m), gpu.device_info().arch).cubin, None)
    x_ptr, y_ptr = k.buffers
    gpu.copy_to_device(x_ptr, random_vector(m.n_cols, m.value_dtype, seed=2))
    run = lambda: k.launch(x_ptr, y_ptr)  # noqa: E731
    queued = np.median(gpu.time_launches(run, 100, 5, queued=True))
    issued = np.median(gpu.time_launches(run, 100, 5, queued=False))
    assert 0 < queued <= issued * 1.1
    # The hold is released: a later synchronous call returns and the result is written.
    y = np.empty(m.n_rows, m.value_dtype)
    gpu.synchronize()
    gpu.copy_to_host(y, y_ptr)
    assert np.isfinite(y).all()


def test_relabelled_plan_speaks_the_callers_order_and_iterates_in_its_own():
    A = FIXTURES["power_law"]
    spmv = tuner.compile(A, family="binned", params={"small_max": 4, "medium_max": 32, "warp_division": 4,
                                                      "huge_min": None, "order": "degree"})
    x = random_vector(A.shape[1], np.float32, seed=21)
    A64 = A.astype(np.float64)
    assert rel_error(spmv(x), A64 @ x.astype(np.float64)) < 1e-5
    assert spmv.col_order is not None and not np.array_equal(spmv.col_order, np.arange(A.shape[1]))
    # Two products in the plan's order, converted once on each side (rows and columns share one order).
    inner = spmv.in_plan_order()
    assert inner.in_plan_order() is inner and "plan order" in repr(inner)
    y_plan = inner(inner(spmv.to_plan_order(x)))
    assert rel_error(spmv.from_plan_order(y_plan), A64 @ (A64 @ x.astype(np.float64))) < 1e-5
    cp = pytest.importorskip("cupy")  # device arrays take the same path, gathers on the GPU
    yd = cp.full(A.shape[0], np.nan, dtype=cp.float32)
    spmv(cp.asarray(x), out=yd)
    assert rel_error(cp.asnumpy(yd), A64 @ x.astype(np.float64)) < 1e-5


def test_relabelled_rectangular_plan_is_correct_in_both_orders():
    A = FIXTURES["rectangular_wide"]
    spmv = tuner.compile(A, family="csr_vector", params={"threads_per_row": 8, "order": "degree"})
    x = random_vector(A.shape[1], np.float32, seed=22)
    ref = A.astype(np.float64) @ x.astype(np.float64)
    assert rel_error(spmv(x), ref) < 1e-5
    y_plan = spmv.in_plan_order()(spmv.to_plan_order(x))
    assert rel_error(y_plan, ref[np.argsort(spmv.row_rank)]) < 1e-5


@pytest.mark.parametrize("stages", [0.5, 1, 3.3])
def test_a_download_through_the_staging_buffers_equals_the_device_array(stages):
    n = int(stages * gpu.STAGE_BYTES) // 4
    host = np.random.default_rng(11).uniform(-1, 1, n).astype(np.float32)
    device = gpu.device_vector(n, np.float32, gpu.upload(host))
    got = gpu.download(device)
    assert got.dtype == np.float32 and got.shape == (n,) and np.array_equal(got, host)


def test_queued_downloads_put_each_piece_of_device_memory_at_its_host_address():
    vals = np.random.default_rng(16).uniform(-1, 1, 10_000).astype(np.float32)
    dv = gpu.upload_pooled(vals)
    locked = gpu.Pinned(np.full(vals.size, np.nan, np.float32))
    host = locked.array.ctypes.data
    # three pieces out of order, one empty: entries 5000.. to the front, 0..2999 after them, 9000.. at the end
    gpu.queue_downloads(int(dv), [(host, 4 * 5000, 4 * 4000), (host + 4 * 4000, 0, 4 * 3000), (host, 0, 0),
                                  (host + 4 * 9000, 4 * 9000, 4 * 1000)])
    gpu.synchronize()
    got = locked.array
    assert np.array_equal(got[:4000], vals[5000:9000]) and np.array_equal(got[4000:7000], vals[:3000])
    assert np.isnan(got[7000:9000]).all() and np.array_equal(got[9000:], vals[9000:])


@pytest.mark.parametrize("stages", [0.5, 2.6])
def test_host_vectors_of_several_staging_buffers_cross_through_them_both_ways_unchanged(stages):
    n = int(stages * gpu.STAGE_BYTES) // 8
    host = np.random.default_rng(12).uniform(-1, 1, n)
    buf = gpu.alloc(host.nbytes)
    gpu.memset_bytes(int(buf), 0xFF, host.nbytes)  # NaN poison
    gpu.copy_to_device(int(buf), host)
    back = np.full(n, np.nan)
    gpu.copy_to_host(back, int(buf))
    assert np.array_equal(back, host)
    # a product of a matrix whose vectors take the staged path answers as SciPy does
    A = sp.random(n, 40, density=2.0 / 40, format="csr", dtype=np.float64, random_state=3)
    spmv = tuner.compile(A, family="csr_vector", params={"threads_per_row": 1})
    x = np.random.default_rng(13).uniform(-1, 1, 40)
    assert rel_error(spmv(x), A @ x) < 1e-12
