"""The compile that tunes in the background: the stand-in's layout, the hand-over, failures, the race figure."""
import ctypes
import sys
import threading
import time

import numpy as np
import pytest
import scipy.sparse as sp

from tuner import bench, compiler, tiered
from tuner.formats.aligned_coo import build_aligned_coo, build_flat, flat_bytes
from tuner.matrix import canonicalize

from .conftest import power_law


@pytest.mark.parametrize("pattern", [False, True])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_the_flat_stand_in_layout_equals_the_host_builders_flat_layout(pattern, index_dtype):
    A = power_law(2000, seed=5)
    A = A[np.r_[0:50, 60:2000]]  # ten fewer rows than columns
    A = sp.vstack([A, sp.csr_matrix((3, A.shape[1]))], format="csr")  # empty rows at the end
    m = canonicalize(abs(A) > 0 if pattern else A, index_dtype=index_dtype)
    data = None if m.value_free else m.data
    expected = build_aligned_coo(m.indptr, m.indices, data, "flat", m.index_dtype)
    got = build_flat(m.indptr, m.indices, data, m.index_dtype)
    assert got.sizes == expected.sizes and got.layout == "flat"
    for (a, b) in zip(got.parts, expected.parts):
        for x, y in zip(a, b):
            assert (x is None) == (y is None)
            if x is not None:
                assert x.dtype == y.dtype and np.array_equal(x, y)
    assert got.flat_rows.size % 32 == 0 and got.flat_rows.size >= m.nnz


def test_the_flat_stand_in_layout_searches_rows_a_piece_at_a_time(monkeypatch):
    m = canonicalize(power_law(1500, seed=6))
    whole = build_flat(m.indptr, m.indices, m.data, m.index_dtype)
    monkeypatch.setattr("tuner.formats.aligned_coo.FLAT_PIECE", 37)
    pieces = build_flat(m.indptr, m.indices, m.data, m.index_dtype)
    assert np.array_equal(whole.flat_rows, pieces.flat_rows)
    ref = m.to_scipy().tocoo()
    assert np.array_equal(pieces.flat_rows[:m.nnz], ref.row) and np.array_equal(pieces.flat_cols[:m.nnz], ref.col)


def test_the_stand_in_is_left_out_where_it_would_crowd_the_tuned_builds_work_arrays():
    m = canonicalize(power_law(3000, seed=7))
    assert m.index_dtype.itemsize == m.value_dtype.itemsize == 4
    own = flat_bytes(m.nnz, 4, 4)
    csr = (m.n_rows + 1 + m.nnz) * 4 + m.nnz * 4
    work = 2 * 64 * m.nnz  # device_reorder.fits
    assert tiered.stand_in_fits(m, own + csr + work)
    assert not tiered.stand_in_fits(m, own + csr + work - 1)


class FakeKernel:
    """A kernel stand-in on the host: records its calls, multiplies by a SciPy matrix."""

    def __init__(self, A, name):
        self.A, self.name = A, name
        self.shape, self.dtype = A.shape, A.dtype
        self.calls = 0
        self.plan = f"plan of {name}"

    def __call__(self, x, out=None):
        self.calls += 1
        y = self.A @ x
        if out is not None:
            out[:] = y
            return out
        return y


def test_calls_run_on_the_stand_in_until_the_tuned_kernel_is_ready_and_then_on_it():
    A = power_law(500, seed=8)
    first, tuned = FakeKernel(A, "stand-in"), FakeKernel(A, "tuned")
    go = threading.Event()

    def tune(hand_over):
        go.wait(10)
        return tuned
    k = tiered.TieredSpMV(first, tune)
    x = np.random.default_rng(1).standard_normal(A.shape[1])
    assert np.allclose(k(x), A @ x) and np.allclose(k(x), A @ x)
    assert (first.calls, tuned.calls, k.stand_in_products) == (2, 0, 2)
    assert not k.ready and not k.tuned and k.switch_s is None and "tuning" in repr(k)
    go.set()
    assert k.plan == "plan of tuned"  # any attribute but a call waits for the tuning
    assert k.wait() is tuned and k.tuned and k.switch_s > 0
    out = np.full(A.shape[0], np.nan)
    assert k(x, out=out) is out and np.allclose(out, A @ x)
    assert (first.calls, tuned.calls, k.stand_in_products) == (2, 1, 2)


def test_an_interim_kernel_handed_over_answers_between_the_stand_in_and_the_tuned_kernel():
    A = power_law(400, seed=13)
    first, middle, tuned = FakeKernel(A, "stand-in"), FakeKernel(A, "interim"), FakeKernel(A, "tuned")
    handed, go = threading.Event(), threading.Event()
    late = []

    def tune(hand_over):
        hand_over(middle)
        handed.set()
        go.wait(10)
        late.append(hand_over)
        return tuned
    k = tiered.TieredSpMV(first, tune)
    x = np.random.default_rng(2).standard_normal(A.shape[1])
    assert np.allclose(k(x), A @ x) and handed.wait(10)
    assert np.allclose(k(x), A @ x) and np.allclose(k(x), A @ x)
    assert (first.calls, middle.calls, tuned.calls) == (1, 2, 0)
    assert k.interim_s > 0 and not k.tuned and k.stand_in_products == 3
    go.set()
    assert k.wait() is tuned and k.switch_s >= k.interim_s
    late[0](middle)  # a hand-over after the tuned kernel took over changes nothing
    assert np.allclose(k(x), A @ x) and (first.calls, middle.calls, tuned.calls) == (1, 2, 1)


def test_while_tuning_a_call_returns_once_at_most_three_products_are_queued(monkeypatch):
    class Event:
        made: list = []

        def __init__(self):
            self.waited = False
            Event.made.append(self)

        def synchronize(self):
            self.waited = True
    monkeypatch.setattr(tiered.gpu, "available", lambda: True)
    monkeypatch.setattr(tiered.gpu, "default_event", Event)
    A = power_law(300, seed=5)
    go = threading.Event()
    tuned = FakeKernel(A, "tuned")
    k = tiered.TieredSpMV(FakeKernel(A, "stand-in"), lambda hand_over: go.wait(10) and tuned)
    x = np.random.default_rng(4).standard_normal(A.shape[1])
    for _ in range(5):
        k(x)
    assert tiered.QUEUED_PRODUCTS == 3
    assert [e.waited for e in Event.made] == [True, True, False, False, False]
    go.set()
    assert k.wait() is tuned
    k(x)  # the tuned kernel's calls are not held back
    assert len(Event.made) == 5 and not k._queued


def test_the_tunings_stream_falls_back_to_the_default_priority_where_cupy_has_no_priorities(monkeypatch):
    import contextlib
    import types
    from tuner.formats import device_reorder
    made, entered = [], []

    class OldStream:  # CuPy's Stream before it took a priority
        def __init__(self, non_blocking=False):
            made.append(non_blocking)

        def __enter__(self):
            entered.append(True)

        def __exit__(self, *exc):
            return False
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(Stream=OldStream))
    monkeypatch.setattr(device_reorder, "available", lambda: True)
    monkeypatch.setattr(device_reorder, "on_device", contextlib.contextmanager(lambda: (yield fake)))
    with tiered._side_stream():
        pass
    assert made == [True] and entered == [True]


def test_the_interim_kernel_is_tile_coo_in_degree_order_at_the_middle_l1_width():
    from tuner.families.tiles import widths
    m = canonicalize(sp.random(50, 400_000, density=1e-3, format="csr", dtype=np.float32, random_state=14))
    spec = tiered.interim_spec(m)
    assert spec.family == "tile_coo" and spec.params.order == "degree"
    ws = widths(m)
    assert len(ws) == 3 and spec.params.tile_width == ws[1]


def test_the_tuning_starts_once_the_first_product_has_returned(monkeypatch):
    monkeypatch.setattr(tiered, "FIRST_CALL_WAIT_S", 30.0)
    A = power_law(300, seed=10)
    started = threading.Event()

    def tune(hand_over):
        started.set()
        return FakeKernel(A, "tuned")
    k = tiered.TieredSpMV(FakeKernel(A, "stand-in"), tune)
    assert not started.wait(0.2)  # no product asked for yet: the tuning waits
    x = np.ones(A.shape[1])
    assert np.allclose(k(x), A @ x)
    assert started.wait(10) and k.wait().plan == "plan of tuned"


def test_a_caller_waiting_for_the_tuned_kernel_starts_the_tuning_at_once(monkeypatch):
    monkeypatch.setattr(tiered, "FIRST_CALL_WAIT_S", 30.0)
    A = power_law(300, seed=12)
    k = tiered.TieredSpMV(FakeKernel(A, "stand-in"), lambda hand_over: FakeKernel(A, "tuned"))
    assert k.wait(10).plan == "plan of tuned"


def test_without_a_first_product_the_tuning_starts_after_a_short_wait(monkeypatch):
    monkeypatch.setattr(tiered, "FIRST_CALL_WAIT_S", 0.05)
    A = power_law(300, seed=11)
    k = tiered.TieredSpMV(FakeKernel(A, "stand-in"), lambda hand_over: FakeKernel(A, "tuned"))
    assert k.wait(10).plan == "plan of tuned" and k.stand_in_products == 0


def test_a_failed_tuning_leaves_the_stand_in_answering_and_wait_raises_it(caplog):
    A = power_law(300, seed=9)
    first = FakeKernel(A, "stand-in")

    def tune(hand_over):
        raise RuntimeError("nvcc exploded")
    k = tiered.TieredSpMV(first, tune)
    with pytest.raises(RuntimeError, match="nvcc exploded"):
        k.wait()
    assert "nvcc exploded" in caplog.text and "failed" in repr(k)
    x = np.arange(A.shape[1], dtype=float) - 7.5
    assert np.allclose(k(x), A @ x) and first.calls == 1
    with pytest.raises(RuntimeError, match="nvcc exploded"):
        k.plan


def test_the_tuning_learns_when_the_caller_starts_waiting_for_it():
    A = power_law(300, seed=13)
    seen, started, release = [], threading.Event(), threading.Event()

    def tune(hand_over):
        seen.append(hand_over.caller_waits)
        started.set()
        release.wait(10)
        seen.append(hand_over.caller_waits)
        return FakeKernel(A, "tuned")
    k = tiered.TieredSpMV(FakeKernel(A, "stand-in"), tune)
    x = np.linspace(-1.0, 2.0, A.shape[1])
    assert np.allclose(k(x), A @ x)  # a product: the tuning starts beside the caller's products
    assert started.wait(10)
    with pytest.raises(TimeoutError):
        k.wait(timeout=0.01)  # the caller now waits for the tuned kernel
    release.set()
    assert k.wait(10).name == "tuned" and seen == [False, True]


def test_wait_with_a_timeout_says_the_tuning_is_not_done():
    release = threading.Event()
    k = tiered.TieredSpMV(FakeKernel(sp.eye(3, format="csr"), "s"), lambda hand_over: release.wait(10))
    with pytest.raises(TimeoutError, match="did not finish"):
        k.wait(timeout=0.01)
    release.set()
    k.wait()


def test_the_gil_is_handed_over_faster_only_while_a_tuning_runs():
    before = sys.getswitchinterval()
    seen = []
    release = threading.Event()

    def tune(hand_over):
        seen.append(sys.getswitchinterval())
        release.wait(10)
        return FakeKernel(sp.eye(2, format="csr"), "t")
    ks = [tiered.TieredSpMV(FakeKernel(sp.eye(2, format="csr"), "s"), tune) for _ in range(2)]
    release.set()
    for k in ks:
        k.wait()
    assert seen == pytest.approx([tiered.SWITCH_S, tiered.SWITCH_S])
    assert sys.getswitchinterval() == pytest.approx(before)


@pytest.mark.parametrize("options", [dict(tune="measure"), dict(family="csr_vector")])
def test_background_tuning_is_refused_where_it_cannot_apply(options):
    with pytest.raises(ValueError, match="background= tunes in model mode"):
        compiler.compile(sp.eye(4, format="csr"), background=True, **options)


def test_the_raced_break_even_is_the_first_product_from_which_ours_stays_ahead():
    # Ahead from the first product, and staying ahead.
    assert bench.raced_break_even(5.0, [6.0, 7.0], 1.0, 10.0, [12.0, 14.0], 2.0) == 1
    # Behind while the stand-in runs, ahead after the third product.
    assert bench.raced_break_even(5.0, [9.0, 11.0, 12.0], 1.0, 4.0, [8.0, 12.0, 16.0], 4.0) == 3
    # Still behind when the race ends: carried on at the per-product times (3 ms behind, 1 ms a product).
    assert bench.raced_break_even(5.0, [15.0], 1.0, 4.0, [12.0], 2.0) == 1 + 4
    # No race (the compile returned the tuned kernel): the closed form.
    assert bench.raced_break_even(100.0, [], 1.0, 10.0, [], 2.0) == bench.break_even(100.0, 1.0, 10.0, 2.0) == 91
    assert bench.raced_break_even(5.0, [15.0], 2.0, None, [], None) is None


def _rel_error(y, ref):
    y = np.asarray(y, dtype=np.float64)
    assert np.isfinite(y).all(), "a row was never written"
    return np.linalg.norm(y - ref) / np.linalg.norm(ref)


@pytest.mark.gpu
@pytest.mark.parametrize("pattern", [False, True])
def test_the_stand_in_kernel_matches_scipy(tmp_path, pattern):
    from tuner import gpu
    from tuner.cache import Cache
    from tuner.kernel import random_vector
    A = power_law(20000, seed=12)
    m = canonicalize(abs(A) > 0 if pattern else A)
    k = tiered.stand_in(m, gpu.device_info().arch, Cache(tmp_path), force=True)
    assert k is not None and k.plan.tune == "stand-in" and k.spec == tiered.stand_in_spec(m)
    x = random_vector(m.n_cols, m.value_dtype, seed=3)
    ref = m.to_scipy().astype(np.float64) @ x.astype(np.float64)
    out = np.full(m.n_rows, np.nan, m.value_dtype)
    assert _rel_error(k(x, out=out), ref) < 1e-5


@pytest.mark.gpu
def test_compile_without_tuning_returns_the_generic_kernel_and_plans_nothing(tmp_path):
    import tuner
    from tuner.cache import Cache
    from tuner.kernel import random_vector
    A = power_law(5000, seed=14)  # small: below the size a background tuning starts at
    k = tuner.compile(A, tune="none", cache_dir=tmp_path)
    assert k.plan.tune == "stand-in" and k.spec == tiered.stand_in_spec(canonicalize(A))
    assert not list(Cache(tmp_path).root.glob("plan/**/*.entry"))  # no plan made, none stored
    x = random_vector(A.shape[1], np.float32, seed=5)
    assert _rel_error(k(x, out=np.full(A.shape[0], np.nan, np.float32)), A.astype(np.float64) @ x) < 1e-5


def test_compile_without_tuning_refuses_a_named_family():
    with pytest.raises(ValueError, match="tune='none' builds the generic kernel"):
        compiler.compile(power_law(100, seed=1), tune="none", family="csr_vector")


@pytest.mark.gpu
def test_a_background_compile_answers_at_once_and_hands_over_to_the_tuned_kernel(tmp_path):
    import cupy
    import tuner
    from tuner.kernel import random_vector
    A = power_law(30000, seed=13)
    k = tuner.compile(A, background=True, cache_dir=tmp_path)
    assert isinstance(k, tiered.TieredSpMV)
    x = random_vector(A.shape[1], np.float32, seed=4)
    ref = A.astype(np.float64) @ x.astype(np.float64)
    assert _rel_error(k(x), ref) < 1e-5  # most likely on the stand-in: the plan takes longer than a call
    tuned = k.wait()
    assert k.tuned and tuned.plan.tune == "model" and k.plan is tuned.plan and k.switch_s > 0
    xd, yd = cupy.asarray(x), cupy.full(A.shape[0], cupy.nan, dtype=np.float32)
    assert k(xd, out=yd) is yd and _rel_error(yd.get(), ref) < 1e-5
    again = tuner.compile(A, background=True, cache_dir=tmp_path)  # a plan-cache hit hands over too
    assert _rel_error(again(x), ref) < 1e-5 and again.wait().plan.family == tuned.plan.family


@pytest.mark.gpu
def test_a_large_matrix_tunes_in_the_background_by_default_and_a_small_one_does_not(tmp_path):
    import cupy
    import tuner
    from tuner.generators import rmat
    from tuner.kernel import random_vector
    big = rmat(16, edge_factor=20)  # over a million entries: worth tuning in the background
    assert big.nnz >= 1 << 20
    k = tuner.compile(big, cache_dir=tmp_path)
    assert isinstance(k, tiered.TieredSpMV)
    x = random_vector(big.shape[1], np.float32, seed=5)
    ref = big.astype(np.float64) @ x.astype(np.float64)
    assert _rel_error(k(x), ref) < 1e-5
    xd, yd = cupy.asarray(x), cupy.empty(big.shape[0], np.float32)
    t0 = time.perf_counter()
    while not k.ready and time.perf_counter() - t0 < 60:  # a caller's products, not a wait
        k(xd, out=yd)
        cupy.cuda.get_current_stream().synchronize()
    assert _rel_error(k.wait()(x), ref) < 1e-5
    # Relabelled on the device and planned anew: the interim kernel answered while the planner ran.
    assert k.interim_s is not None and 0 < k.interim_s <= k.switch_s
    assert not isinstance(tuner.compile(power_law(2000, seed=14), cache_dir=tmp_path), tiered.TieredSpMV)
    assert not isinstance(tuner.compile(big, cache_dir=tmp_path, background=False), tiered.TieredSpMV)


@pytest.mark.gpu
def test_a_tuning_beside_products_plans_in_the_planner_process_and_one_waited_for_plans_here(tmp_path):
    import tuner
    from tuner.generators import rmat
    from tuner.kernel import random_vector
    big = rmat(16, edge_factor=20)
    x = random_vector(big.shape[1], np.float32, seed=7)
    ref = big.astype(np.float64) @ x.astype(np.float64)
    k = tuner.compile(big, cache_dir=tmp_path / "a")
    assert _rel_error(k(x), ref) < 1e-5
    while not k.ready:  # products beside the tuning, as a caller makes them
        assert _rel_error(k(x), ref) < 1e-5
    assert "plan_share" in k.plan.seconds and k.plan.seconds["plan"] > k.plan.seconds["plan_share"] >= 0
    assert _rel_error(k(x), ref) < 1e-5
    waited = tuner.compile(big, cache_dir=tmp_path / "b").wait()  # nothing to protect: planned here
    assert "plan_share" not in waited.plan.seconds
    assert waited.plan.family == k.plan.family and waited.plan.params == k.plan.params


@pytest.mark.gpu
@pytest.mark.parametrize("pattern", [False, True])
def test_the_interim_kernel_over_the_device_relabelled_matrix_matches_scipy(tmp_path, pattern):
    from tuner import gpu
    from tuner.cache import Cache
    from tuner.families.base import ordered_matrix
    from tuner.generators import rmat
    from tuner.kernel import random_vector
    A = rmat(16, edge_factor=20)
    m = canonicalize(abs(A) > 0 if pattern else A)
    ordered_matrix(m, "degree")  # the tuning's first step, on the device for a matrix this large
    k = tiered.interim(m, gpu.device_info().arch, Cache(tmp_path))
    assert k is not None and k.plan.tune == "interim" and k.spec == tiered.interim_spec(m)
    x = random_vector(m.n_cols, m.value_dtype, seed=6)
    ref = m.to_scipy().astype(np.float64) @ x.astype(np.float64)
    assert _rel_error(k(x), ref) < 1e-5


@pytest.mark.gpu
def test_the_tunings_device_work_goes_on_a_non_blocking_stream_of_the_highest_priority():
    import cupy
    from tuner import gpu
    with tiered._side_stream():
        stream = cupy.cuda.get_current_stream()
        least, greatest, priority, flags = ctypes.c_int(), ctypes.c_int(), ctypes.c_int(), ctypes.c_uint()
        assert gpu._libcuda().cuCtxGetStreamPriorityRange(ctypes.byref(least), ctypes.byref(greatest)) == 0
        assert gpu._libcuda().cuStreamGetPriority(ctypes.c_void_p(stream.ptr), ctypes.byref(priority)) == 0
        assert gpu._libcuda().cuStreamGetFlags(ctypes.c_void_p(stream.ptr), ctypes.byref(flags)) == 0
    assert priority.value == greatest.value < least.value and flags.value == 1  # CU_STREAM_NON_BLOCKING
    assert cupy.cuda.get_current_stream() is not stream


def _fake_device(monkeypatch, free_bytes):
    """compile's decisions on a CPU: a device of ``free_bytes`` free, kernels recorded rather than built."""
    from tuner import gpu, streaming
    info = gpu.DeviceInfo(name="NVIDIA H100 80GB HBM3", capability=(9, 0), sm_count=132, l2_bytes=50 << 20,
                          memory_bytes=80 << 30, driver_version=13000)
    monkeypatch.setattr(gpu, "device_info", lambda: info)
    monkeypatch.setattr(gpu, "free_memory", lambda release_pool=False: free_bytes)
    made = []

    class Streamed:
        def __init__(self, m, plan, arch, cache=None):
            made.append(("streamed", plan))

    monkeypatch.setattr(streaming, "StreamedSpMV", Streamed)
    monkeypatch.setattr(compiler, "_tuned", lambda m, *a: made.append(("tuned", m)) or FakeKernel(m.to_scipy(), "t"))
    return made


@pytest.mark.parametrize("background", [None, False])
def test_compile_streams_what_exceeds_the_budget_and_multiplies_the_rest_in_memory(monkeypatch, background):
    from tuner import streaming
    A = power_law(3000, seed=41)
    m = canonicalize(A)
    made = _fake_device(monkeypatch, 10**12)
    monkeypatch.setattr(tiered, "stand_in", lambda *a, **k: None)  # no CuPy here
    small = streaming.resident_bytes(m) + streaming.SLOTS * 8 * (int(m.row_lengths.max()) + 10)
    assert not streaming.fits_in_memory(m, small)
    compiler.compile(A, device_memory_limit=small, background=background)
    assert made[-1][0] == "streamed" and made[-1][1].budget_bytes == small and "device-memory limit" in made[-1][1].reason
    compiler.compile(A, background=background)  # a terabyte free: in memory
    assert made[-1][0] == "tuned"


def test_compile_hands_a_stand_in_over_to_the_tuned_kernel_where_it_has_one(monkeypatch):
    A = power_law(3000, seed=42)
    _fake_device(monkeypatch, 10**12)
    first = FakeKernel(A, "stand-in")
    asked = []
    monkeypatch.setattr(tiered, "stand_in", lambda m, arch, cache, force=False: asked.append(force) or first)
    k = compiler.compile(A)
    assert isinstance(k, tiered.TieredSpMV) and asked == [False]
    assert k.wait().name == "t"
    assert compiler.compile(A, background=True).wait().name == "t" and asked == [False, True]
    assert not isinstance(compiler.compile(A, background=False), tiered.TieredSpMV) and len(asked) == 2


def test_a_plan_of_the_interim_kernels_own_specialisation_runs_on_its_layout():
    # Made now or read from the plan cache: the layout built for the interim kernel is not built again.
    m = canonicalize(power_law(300, seed=3))
    spec = tiered.interim_spec(m)

    class Interim:
        layout = object()
    Interim.spec = spec
    assert compiler._interim_layout(Interim, spec) == (Interim.layout, "device")
    assert compiler._interim_layout(Interim, tiered.stand_in_spec(m)) is None
    assert compiler._interim_layout(None, spec) is None


def test_the_interim_kernel_is_made_once_relabelled_before_the_digest_is_waited_for(monkeypatch):
    # The digest (a hash of every index on the host) may outlast the relabelling on the GPU: the interim
    # kernel is made in between, so products run faster while the hash ends.
    steps, made = [], threading.Event()

    def digest(m):
        assert made.wait(10), "the digest was waited for before the interim kernel was made"
        steps.append("digest")
        return "d1g"
    monkeypatch.setattr(compiler.device_reorder, "usable", lambda *a: True)
    monkeypatch.setattr(compiler, "relabel_bytes", lambda m: 0)
    monkeypatch.setattr(compiler, "structure_digest", digest)
    monkeypatch.setattr(compiler, "ordered_matrix", lambda m, order: steps.append("relabel"))
    digest_value, relabel_s, after = compiler._digest_beside_relabelling(
        canonicalize(power_law(300, seed=3)), lambda: (steps.append("interim"), made.set()))
    assert digest_value == "d1g" and relabel_s >= 0 and steps == ["relabel", "interim", "digest"] and after is None


def test_what_follows_the_digest_runs_on_its_thread_beside_the_relabelling(monkeypatch):
    # The caller-order predictions start once the digest is made (a plan-cache hit needs none) and run
    # while this thread relabels; the relabelling does not wait for them.
    relabelling, seen = threading.Event(), []

    def relabel(m, order):
        relabelling.set()
        seen.append("relabel")

    def after(digest):
        assert relabelling.wait(10), "the relabelling waited for what follows the digest"
        seen.append(("after", digest, threading.current_thread() is not threading.main_thread()))
        return "known"
    monkeypatch.setattr(compiler.device_reorder, "usable", lambda *a: True)
    monkeypatch.setattr(compiler, "relabel_bytes", lambda m: 0)
    monkeypatch.setattr(compiler, "structure_digest", lambda m: "d1g")
    monkeypatch.setattr(compiler, "ordered_matrix", relabel)
    digest, relabel_s, after_value = compiler._digest_beside_relabelling(
        canonicalize(power_law(300, seed=3)), after_digest=after)
    assert (digest, after_value()) == ("d1g", "known") and seen == ["relabel", ("after", "d1g", True)]
    monkeypatch.setattr(compiler.device_reorder, "usable", lambda *a: False)  # nothing relabelled here
    assert compiler._digest_beside_relabelling(canonicalize(power_law(300, seed=3)), after_digest=after) == (
        "d1g", 0.0, None)


def test_a_digest_that_fails_beside_the_relabelling_raises_in_the_compile(monkeypatch):
    # The digest's thread hands the digest over before it goes on with what follows it: where hashing fails,
    # the compile gets that error rather than waiting for a digest that never comes.
    def digest(m):
        raise OSError("read error")
    monkeypatch.setattr(compiler.device_reorder, "usable", lambda *a: True)
    monkeypatch.setattr(compiler, "relabel_bytes", lambda m: 0)
    monkeypatch.setattr(compiler, "structure_digest", digest)
    monkeypatch.setattr(compiler, "ordered_matrix", lambda m, order: None)
    with pytest.raises(OSError, match="read error"):
        compiler._digest_beside_relabelling(canonicalize(power_law(300, seed=3)), after_digest=lambda d: "known")


def _waited_tuning(monkeypatch, tmp_path, early_fails=False):
    """compiler._tuned of a compile the caller waits for, relabelled on a NumPy stand-in for the GPU, with the
    fake profile; nothing compiled or launched: (the plan it made, the labels of the early predictions)."""
    from tuner import codegen, gpu, layouts
    from tuner.cache import Cache
    from tuner.model import Profile
    from tuner.model import lookup
    from .fake_profile import fake_profile_json
    from .test_reorder import _numpy_device
    _numpy_device(monkeypatch)
    monkeypatch.setattr(compiler, "relabel_bytes", lambda m: 0)
    early = []

    def caller_order(m, profile):
        if early_fails:
            raise MemoryError("out of memory allocating 1,024 bytes")
        known = lookup.caller_order_predictions(m, profile)
        early.extend(known)
        return known
    monkeypatch.setattr(compiler, "caller_order_predictions", caller_order)
    monkeypatch.setattr(codegen, "compile_many", lambda sources, arch, cache=None: [
        codegen.Binary(f"k{i}", b"", arch, True) for i in range(len(sources))])
    monkeypatch.setattr(layouts, "launch_for", lambda m, spec, cache, digest=None: (None, "built"))
    monkeypatch.setattr(compiler, "_spmv", lambda m, spec, cubin, plan, *a: plan)
    info = gpu.DeviceInfo(name="NVIDIA H100 80GB HBM3", capability=(9, 0), sm_count=132, l2_bytes=50 << 20,
                          memory_bytes=80 << 30, driver_version=13000)
    m = canonicalize(power_law(4000, seed=44))
    plan = compiler._tuned(m, info, Cache(tmp_path), "model", 3, 10, Profile.from_json(fake_profile_json()))
    return plan, early


def test_a_waited_tuning_predicts_the_caller_order_candidates_beside_the_relabelling_and_plans_the_same(
        monkeypatch, tmp_path, caplog):
    from tuner.model import Profile
    from .fake_profile import fake_profile_json
    plan, early = _waited_tuning(monkeypatch, tmp_path / "a")
    assert early and all(label.endswith("order=none)") for label in early)
    assert plan.seconds["plan_early"] > 0 and plan.seconds["plan"] > 0 and plan.seconds["relabel"] > 0
    m = canonicalize(power_law(4000, seed=44))
    specs, predicted, _ = compiler.plan_candidates(m, Profile.from_json(fake_profile_json()))
    best = min(range(len(specs)), key=lambda i: predicted[i])
    assert (plan.family, plan.predicted_ms) == (specs[best].family, predicted[best])
    assert len(plan.ranking) == len(specs)
    # Out of device memory beside the relabelling: the same plan, the predictions made after it
    failed, early = _waited_tuning(monkeypatch, tmp_path / "b", early_fails=True)
    assert not early and "plan_early" not in failed.seconds and "no caller-order predictions" in caplog.text
    assert (failed.family, failed.params, failed.predicted_ms) == (plan.family, plan.params, plan.predicted_ms)


def test_an_interim_kernel_that_fails_to_build_leaves_the_tuning_going(monkeypatch, caplog):
    from tuner import gpu

    def broken(*a, **k):
        raise RuntimeError("nvcc exploded")
    monkeypatch.setattr(tiered, "interim", broken)
    info = gpu.DeviceInfo(name="NVIDIA H100 80GB HBM3", capability=(9, 0), sm_count=132, l2_bytes=50 << 20,
                          memory_bytes=80 << 30, driver_version=13000)
    m = canonicalize(power_law(300, seed=43))
    assert compiler._interim(m, info, None, None) is None
    assert "no interim kernel (RuntimeError: nvcc exploded)" in caplog.text


def test_a_waited_tuning_reads_a_cached_plan_once(monkeypatch, tmp_path):
    # The early predictions look for the plan first (a plan-cache hit needs none); the compile then uses
    # what they read rather than reading the plan file again.
    from tuner import codegen, planner
    plan, _ = _waited_tuning(monkeypatch, tmp_path)
    reads, real = [], planner.load_plan
    monkeypatch.setattr(planner, "load_plan", lambda cache, key: reads.append(key) or real(cache, key))
    monkeypatch.setattr(codegen, "load_binary", lambda key, arch, cache: codegen.Binary(key, b"", arch, True))
    again, early = _waited_tuning(monkeypatch, tmp_path)
    assert len(reads) == 1 and not early
    assert (again.family, again.params, again.predicted_ms) == (plan.family, plan.params, plan.predicted_ms)
