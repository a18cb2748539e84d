"""Products streamed through a device-memory budget: the parts, the budget's refusals, and on the GPU the
results (streamed in many parts equal to one part bit for bit, and to SciPy), PageRank over a streamed graph."""
import numpy as np
import pytest
import scipy.sparse as sp

from tuner import streaming
from tuner.matrix import canonicalize

from .conftest import power_law


def budget_for(m, entries, slots=streaming.SLOTS):
    """A budget whose slots hold ``entries`` entries each."""
    return streaming.resident_bytes(m) + slots * streaming.entry_bytes(m) * entries


@pytest.mark.parametrize("entries", [None, 1, 7, 500])
def test_parts_cover_every_row_once_and_none_overflows_its_slot(entries):
    m = canonicalize(power_law(3000, seed=31))
    longest = int(m.row_lengths.max())
    plan = streaming.stream_plan(m, budget_for(m, longest + (entries or 0)))
    cuts, ends = plan.row_cuts, plan.entry_cuts
    assert cuts[0] == 0 and cuts[-1] == m.n_rows and np.all(np.diff(cuts) > 0)
    assert np.array_equal(ends, m.indptr[cuts])
    sizes = np.diff(ends)
    assert sizes.max() <= plan.slot_entries == longest + (entries or 0)
    # Greedy in row order: every part but the last is full, its next row would overflow the slot.
    nxt = m.row_lengths[cuts[1:-1]]
    assert np.all(sizes[:-1] + nxt > plan.slot_entries)
    assert plan.streamed_bytes == m.nnz * 8 and plan.parts == cuts.size - 1


def test_a_budget_too_small_for_the_longest_row_is_refused_with_the_sizes_it_needs():
    m = canonicalize(power_law(3000, seed=32))
    longest = int(m.row_lengths.max())
    need = budget_for(m, longest)
    streaming.stream_plan(m, need)
    with pytest.raises(streaming.DeviceBudgetError, match=f"longest row \\({longest:,} entries") as e:
        streaming.stream_plan(m, need - 1)
    assert f"needs at least {need:,} bytes" in str(e.value)
    with pytest.raises(MemoryError, match="x, y and the row pointers take"):
        streaming.stream_plan(m, streaming.resident_bytes(m))


def test_a_pattern_matrix_streams_its_indices_only():
    m = canonicalize(abs(power_law(2000, seed=33)) > 0)
    assert m.value_free and streaming.entry_bytes(m) == 4
    assert streaming.stream_plan(m, budget_for(m, 2000)).streamed_bytes == 4 * m.nnz


def test_in_memory_or_streamed_follows_the_budget():
    m = canonicalize(power_law(3000, seed=34))
    csr = m.nnz * 8 + (m.n_rows + 1) * 4
    vectors = 2 * m.n_rows * 4
    at = streaming.IN_MEMORY_FACTOR * csr + vectors
    assert streaming.fits_in_memory(m, at) and not streaming.fits_in_memory(m, at - 1)


@pytest.mark.parametrize("limit", ["0", "-5", 0])
def test_a_device_memory_limit_must_be_positive(limit):
    with pytest.raises(ValueError, match="must be positive|byte figure"):
        streaming.budget_of(limit, 10**9)


# --- on the GPU -------------------------------------------------------------------------------------------

def _streamed(m, entries, tmp_path):
    from tuner import gpu
    from tuner.cache import Cache
    plan = streaming.stream_plan(m, budget_for(m, entries), reason="test")
    return streaming.StreamedSpMV(m, plan, gpu.device_info().arch, Cache(tmp_path))


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["float32", "float64", "pattern", "int64"])
def test_a_product_streamed_in_many_parts_equals_one_part_bit_for_bit_and_scipy(tmp_path, kind):
    from tuner.kernel import random_vector
    A = power_law(20000, seed=35, dtype=np.float64 if kind == "float64" else np.float32)
    A = sp.vstack([A, sp.csr_matrix((5, A.shape[1]), dtype=A.dtype)], format="csr")  # empty rows at the end
    m = canonicalize(abs(A) > 0 if kind == "pattern" else A, index_dtype=np.int64 if kind == "int64" else None)
    longest = int(m.row_lengths.max())
    many, one = _streamed(m, longest + 3, tmp_path), _streamed(m, m.nnz, tmp_path)
    assert many.plan.parts > 10 and one.plan.parts == 1
    x = random_vector(m.n_cols, m.value_dtype, seed=6)
    y_many = many(x, out=np.full(m.n_rows, np.nan, m.value_dtype))
    y_one = one(x, out=np.full(m.n_rows, np.nan, m.value_dtype))
    assert np.array_equal(y_many, y_one)
    ref = m.to_scipy().astype(np.float64) @ x.astype(np.float64)
    tol = 1e-12 if m.value_dtype == np.float64 else 1e-5
    assert np.linalg.norm(y_many - ref) / np.linalg.norm(ref) < tol


@pytest.mark.gpu
def test_streamed_products_order_with_the_callers_work_before_and_after_them(tmp_path, monkeypatch):
    import cupy
    from tuner import gpu, staging
    from tuner.generators import rmat
    from tuner.kernel import random_vector
    # Pieces of 64 KiB: NumPy vectors cross through the staging buffers on blocking streams of their own.
    monkeypatch.setattr(gpu, "STAGED_MIN_BYTES", 1 << 16)
    monkeypatch.setattr(staging, "STAGE_BYTES", 1 << 16)
    m = canonicalize(rmat(16, edge_factor=20))
    k = _streamed(m, max(int(m.row_lengths.max()), m.nnz // 40), tmp_path)
    assert k.plan.parts > 4 * k.plan.slots
    A = m.to_scipy().astype(np.float64)
    xd, yd = cupy.empty(m.n_cols, m.value_dtype), cupy.empty(m.n_rows, m.value_dtype)
    for seed in range(6):  # each product's x differs, so a product that reads or is read too early shows
        x = random_vector(m.n_cols, m.value_dtype, seed=200 + seed)
        ref = A @ x.astype(np.float64)
        xd.set(x)
        yd.fill(cupy.nan)  # queued on the default stream just before the product: its kernels must follow
        k(xd, out=yd)
        xd.fill(cupy.nan)  # and just after: the kernels must be done with x
        assert _rel(yd.copy().get(), ref) < 1e-5
        y = k(x, out=np.full(m.n_rows, np.nan, m.value_dtype))  # y read back on a staging stream at once
        assert _rel(y, ref) < 1e-5


def _rel(y, ref):
    assert np.isfinite(y).all(), "a row was read before it was written"
    return np.linalg.norm(y - ref) / np.linalg.norm(ref)


@pytest.mark.gpu
def test_compile_streams_a_matrix_over_its_device_memory_limit_and_takes_device_vectors(tmp_path):
    import cupy
    import tuner
    from tuner.kernel import random_vector
    A = power_law(30000, seed=36)
    m = canonicalize(A)
    limit = budget_for(m, 4 * int(m.row_lengths.max()))
    k = tuner.compile(A, device_memory_limit=limit, cache_dir=tmp_path)
    assert isinstance(k, streaming.StreamedSpMV) and k.plan.parts > 3
    assert "device-memory limit" in k.explain() and "part(s)" in k.explain()
    x = random_vector(A.shape[1], np.float32, seed=7)
    ref = A.astype(np.float64) @ x.astype(np.float64)
    xd, yd = cupy.asarray(x), cupy.full(A.shape[0], cupy.nan, dtype=np.float32)
    for _ in range(3):  # the slots are reused product after product
        assert k(xd, out=yd) is yd
    assert np.linalg.norm(yd.get() - ref) / np.linalg.norm(ref) < 1e-5
    assert k.time(repeats=3) > 0
    in_memory = tuner.compile(A, cache_dir=tmp_path, background=False)
    assert not isinstance(in_memory, streaming.StreamedSpMV)
    with pytest.raises(streaming.DeviceBudgetError):
        tuner.compile(A, device_memory_limit=streaming.resident_bytes(m), cache_dir=tmp_path)


@pytest.mark.gpu
def test_pagerank_over_a_streamed_graph_equals_pagerank_in_memory(tmp_path, monkeypatch):
    import tuner
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path))
    A = abs(power_law(20000, seed=37))
    At = canonicalize(A.T.tocsr())
    limit = budget_for(At, 3 * int(At.row_lengths.max()))
    ranks, info = tuner.pagerank(A, backend="device", dtype=np.float32, tol=1e-7, tol_rule="per_node",
                                 device_memory_limit=limit, return_info=True)
    ref = tuner.pagerank(A, backend="device", dtype=np.float32, tol=1e-7, tol_rule="per_node")
    assert info.iterations > 5 and abs(ranks.sum() - 1) < 1e-5
    assert np.abs(ranks - ref).max() < 1e-6


@pytest.mark.gpu
def test_hits_and_rwr_over_a_streamed_graph_equal_them_on_the_host(tmp_path, monkeypatch):
    import tuner
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path))
    A = abs(power_law(20000, seed=38))
    m = canonicalize(A)
    limit = budget_for(m, 3 * int(max(m.row_lengths.max(), m.col_lengths.max())))
    h, a = tuner.hits(A, device_memory_limit=limit)
    h_ref, a_ref = tuner.hits(A, backend="scipy")
    assert np.abs(h - h_ref).max() < 1e-9 and np.abs(a - a_ref).max() < 1e-9
    seeds = [[0, 1], [5]]
    x = tuner.rwr(A, seeds, tol=1e-10, device_memory_limit=limit)
    ref = tuner.rwr(A, seeds, tol=1e-10, backend="scipy")
    assert x.shape == (A.shape[0], 2) and np.abs(x - ref).max() < 1e-8
