"""What is built on the GPU (CuPy) - orderings, tile-run counts, tiled layouts, transposes - equals the host's
build, array for array."""
import dataclasses

import numpy as np
import pytest
import scipy.sparse as sp

from tuner import families
from tuner.formats import aligned_coo, device_reorder, reorder, tile_composite, tile_coo, tiles, transpose, xp
from tuner.formats.tile_composite import build_tile_composite
from tuner.formats.tile_coo import build_tile_coo
from tuner.formats.tiles import tile_bounds, tile_entries
from tuner.matrix import canonicalize

from .conftest import fixture_matrices, power_law


def _cases():
    cases = dict(fixture_matrices(), big=power_law(6000, seed=90), wide=power_law(500, n_cols=9000, seed=92),
                 empty_rows=sp.csr_matrix(power_law(3000, seed=93).multiply(np.arange(3000)[:, None] % 3 > 0)),
                 pattern=abs(power_law(2000, seed=91)) > 0)
    return {k: v for k, v in cases.items() if v.nnz}


def _widths(m):
    """A tile width that cuts the matrix into several tiles, and a single tile."""
    return [max(8, m.n_cols // 7), 0]


def _host_builds(m, width):
    b = tile_bounds(m.col_lengths, width)
    t = tile_entries(m.indptr, m.indices, m.n_cols, b)
    data = None if m.value_free else m.data
    wls = tuple(int(v) for v in np.random.default_rng(width).choice([1, 7, 32, 96, 700], t.n_tiles))
    return (build_tile_composite(m.indices, data, t, wls, False, m.index_dtype),
            build_tile_coo(m.indptr, m.indices, data, t, m.index_dtype)), wls


def _same(a, b, label):
    for f in dataclasses.fields(a):
        u, v = getattr(a, f.name), getattr(b, f.name)
        if isinstance(u, (np.ndarray,)) or xp.on_device(u):
            u, v = xp.host(u), xp.host(v)
            assert u.dtype == v.dtype and np.array_equal(u, v), (label, f.name)
        else:
            assert u == v, (label, f.name)


@pytest.mark.parametrize("segments", ["search", "scan"])
def test_the_device_formulas_run_on_the_host_give_the_host_layouts(monkeypatch, segments):
    # The searches the GPU does instead of np.repeat, run with NumPy through the same builders.
    built = {}
    for name, A in _cases().items():
        m = canonicalize(A)
        for width in _widths(m):
            built[name, width] = _host_builds(m, width)[0]
    monkeypatch.setattr(tiles, "entry_rows", lambda p, q: tiles.entry_rows_search(p, q).astype(
        np.int32 if p.size - 1 < np.iinfo(np.int32).max else np.int64))
    monkeypatch.setattr(tile_coo, "entry_rows", tiles.entry_rows)
    for module in (tile_composite, tile_coo):
        monkeypatch.setattr(module, "segment_of", getattr(xp, f"segment_of_{segments}"))
    monkeypatch.setattr(tile_composite, "repeat_by", xp.repeat_by_search)
    for name, A in _cases().items():
        m = canonicalize(A)
        for width in _widths(m):
            again = _host_builds(m, width)[0]
            for a, b in zip(built[name, width], again):
                _same(a, b, (name, width))


@pytest.mark.gpu
def test_the_gpu_orders_a_matrix_as_the_host_does(monkeypatch):
    pytest.importorskip("cupy")
    for name, A in _cases().items():
        host_m, dev_m = canonicalize(A), canonicalize(A)
        monkeypatch.setattr(device_reorder, "MIN_NNZ", 1 << 62)
        host = reorder.make_ordering(host_m, "degree")
        monkeypatch.setattr(device_reorder, "MIN_NNZ", 0)
        dev = reorder.make_ordering(dev_m, "degree")
        assert dev.symmetric == host.symmetric, name
        for field in ("row_order", "col_order", "row_rank"):
            a, b = getattr(host, field), getattr(dev, field)
            assert isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b), (name, field)
        assert np.array_equal(dev_m.col_lengths, host_m.col_lengths), name


@pytest.mark.gpu
def test_the_gpu_builds_the_same_tiled_layouts_as_the_host():
    cupy = pytest.importorskip("cupy")
    for name, A in _cases().items():
        for index_dtype in (None, np.int64):
            m = canonicalize(A, index_dtype=index_dtype)
            csr = device_reorder.device_csr(m)
            for width in _widths(m):
                (host_tc, host_coo), wls = _host_builds(m, width)
                t = tile_entries(csr.indptr, csr.indices, m.n_cols, tile_bounds(m.col_lengths, width))
                assert isinstance(t.order, cupy.ndarray)
                dev_tc = build_tile_composite(csr.indices, csr.data, t, wls, False, m.index_dtype)
                dev_coo = build_tile_coo(csr.indptr, csr.indices, csr.data, t, m.index_dtype)
                assert isinstance(dev_tc.cols, cupy.ndarray) and isinstance(dev_coo.flat_cols, cupy.ndarray)
                _same(host_tc, dev_tc, (name, index_dtype, width, "tile_composite"))
                _same(host_coo, dev_coo, (name, index_dtype, width, "tile_coo"))


@pytest.mark.gpu
@pytest.mark.parametrize("family,group_entries", [("tile_composite", None), ("tile_composite", 3000),
                                                  ("tile_coo", None), ("tile_coo", 3000), ("aligned_coo", None),
                                                  ("binned", None), ("csr_vector", None)])
def test_a_family_launch_built_on_the_gpu_equals_the_host_launch(monkeypatch, family, group_entries):
    pytest.importorskip("cupy")
    from tuner.formats import tiles
    monkeypatch.setattr(device_reorder, "MIN_NNZ", 0)
    if group_entries is not None:  # tiles built a group of at most 3,000 entries at a time
        monkeypatch.setattr(tiles, "GROUP_ENTRIES", group_entries)
        monkeypatch.setattr(tiles, "DEVICE_GROUP_SHARE", 0.0)  # however much device memory is free
    fam = families.get(family)
    for name, A in _cases().items():
        m = canonicalize(A)
        for params in fam.candidates(m, None):
            host = fam.launch(canonicalize(A), params)
            dev = fam.device_launch(m, params)
            assert [n for n, _ in host.arrays] == [n for n, _ in dev.arrays], name
            for (label, a), (_, b) in zip(host.arrays, dev.arrays):
                assert xp.on_device(b) and a.dtype == b.dtype and np.array_equal(a, xp.host(b)), (name, label)
            assert (host.scalars, host.grid, host.block, host.zero_y) == (dev.scalars, dev.grid, dev.block, dev.zero_y)
            for g in ("x_gather", "y_gather"):
                assert np.array_equal(getattr(host, g), getattr(dev, g)), (name, g)
            if dev.x_gather is not None:  # copies already on the device, for the kernel to use
                on_device = dict(zip(("x_gather", "y_gather"), dev.gathers_on_device))
                for g, copy in on_device.items():
                    assert xp.on_device(copy) and np.array_equal(xp.host(copy), getattr(dev, g)), (name, g)


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["tile_composite", "aligned_coo", "binned", "csr_vector"])
def test_a_compile_builds_its_layout_on_the_gpu_and_multiplies_right(monkeypatch, tmp_path, family):
    pytest.importorskip("cupy")
    import tuner
    monkeypatch.setattr(device_reorder, "MIN_NNZ", 0)
    A = power_law(20000, seed=95)
    params = families.get(family).candidates(canonicalize(A), None)[0]
    spmv = tuner.compile(A, family=family, params=families.params_dict(params), cache_dir=tmp_path)
    assert spmv.layout_source == "device" and all(xp.on_device(a) for _, a in spmv._launch.arrays)
    x = np.random.default_rng(4).uniform(-1, 1, A.shape[1]).astype(np.float32)
    expected = A.astype(np.float64) @ x.astype(np.float64)
    assert np.abs(spmv(x) - expected).max() <= 1e-4 * np.abs(expected).max()


@pytest.mark.parametrize("layout", aligned_coo.LAYOUTS)
def test_the_aligned_coo_built_piece_by_piece_as_on_the_gpu_equals_the_host_build(layout):
    for name, A in _cases().items():
        for index_dtype in (None, np.int64):
            m = canonicalize(A, index_dtype=index_dtype)
            data = None if m.value_free else m.data
            whole = aligned_coo.build_aligned_coo(m.indptr, m.indices, data, layout, m.index_dtype)
            for piece in (7, 1000, aligned_coo.PIECE):
                _same(whole, aligned_coo.build_aligned_coo_pieces(m.indptr, m.indices, data, layout, m.index_dtype,
                                                                   piece), (name, index_dtype, layout, piece))


def _tilings(m):
    w = max(8, m.n_cols // 9)
    return [tile_bounds(m.col_lengths, k) for k in (w, 2 * w, 4 * w, 3 * w + 1, 0)]


def _same_runs(a, b, label):
    for field in ("lengths", "counts", "offsets"):
        u, v = getattr(a, field), getattr(b, field)
        assert u.dtype == v.dtype and np.array_equal(u, v), (label, field)


@pytest.mark.parametrize("piece", [None, 1, 97, 5000])
def test_runs_counted_by_sorting_equal_the_exact_count(piece):
    for name, A in _cases().items():
        m = canonicalize(A)
        b = _tilings(m)
        exact = tiles.ranked_runs_many(m.indptr, m.indices, b, sample=tiles.EXACT)
        for k, (u, v) in enumerate(zip(exact, tiles.ranked_runs_sorted(m.indptr, m.indices, b, piece))):
            _same_runs(u, v, (name, k, piece))


@pytest.mark.gpu
@pytest.mark.parametrize("piece", [None, 997])
def test_the_gpu_counts_tile_runs_as_the_host_does(piece):
    pytest.importorskip("cupy")
    for name, A in _cases().items():
        m = canonicalize(A)
        csr = device_reorder.device_csr(m)
        b = _tilings(m)
        exact = tiles.ranked_runs_many(m.indptr, m.indices, b, sample=tiles.EXACT)
        for k, (u, v) in enumerate(zip(exact, tiles.ranked_runs_sorted(csr.indptr, csr.indices, b, piece))):
            _same_runs(u, v, (name, k, piece))


@pytest.mark.parametrize("entries", [1, 3, 32, 256])
def test_row_tasks_cover_each_row_in_order_and_the_devices_search_gives_the_hosts_rows(entries):
    m = canonicalize(_cases()["empty_rows"])
    lengths = np.diff(m.indptr)
    rows, first, tasks = xp.row_tasks(m.indptr, entries, np.int32)
    assert rows.dtype == first.dtype == np.int32 and tasks == int(np.sum(-(-lengths // entries)))
    assert np.array_equal(np.diff(first), -(-lengths // entries)) and np.all(np.diff(rows) >= 0)
    assert np.array_equal(np.bincount(rows, minlength=m.n_rows), np.diff(first))
    # the device's rows: one search per task over the first tasks
    assert np.array_equal(xp.segment_of_search(first[:-1], tasks).astype(np.int32), rows)


@pytest.mark.gpu
def test_row_tasks_on_the_device_equal_the_hosts():
    cupy = pytest.importorskip("cupy")
    m = canonicalize(_cases()["big"])
    for entries in (1, 32, 256):
        host = xp.row_tasks(m.indptr, entries, np.int64)
        device = xp.row_tasks(cupy.asarray(m.indptr), entries, np.int64)
        assert device[2] == host[2] and all(np.array_equal(cupy.asnumpy(d), h) for d, h in zip(device[:2], host[:2]))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.uint8, np.int32, np.int64, np.bool_])
def test_the_devices_own_largest_and_tally_equal_numpys_max_and_bincount(dtype):
    cupy = pytest.importorskip("cupy")
    rng = np.random.default_rng(3)
    values = (rng.zipf(1.6, 300_000) % 200).astype(dtype)  # hot low values: the atomic adds contend
    weights = rng.random(values.size)
    d = cupy.asarray(values)
    assert xp.largest(d) == int(values.max()) and xp.largest(d[:0]) == 0
    assert xp.largest(d[1::2]) == int(values[1::2].max())  # strided: a contiguous copy is searched
    if dtype is not np.bool_:
        n = int(values.max()) + 3
        assert cupy.asnumpy(xp.tally(d, n)).tolist() == np.bincount(values, minlength=n).astype(float).tolist()
        assert np.allclose(cupy.asnumpy(xp.tally(d, n, cupy.asarray(weights))),
                           np.bincount(values, weights=weights, minlength=n), rtol=1e-12)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.uint16, np.int32, np.int64])
def test_the_devices_tally_counts_sorted_runs_and_values_past_its_shared_bins_exactly(dtype):
    cupy = pytest.importorskip("cupy")
    rng = np.random.default_rng(5)
    # Row lengths of a power-law graph, sorted (long runs of one value) and not, with long rows past the
    # kernel's shared bins, and integer weights (entries) whose sums need 64 bits.
    values = (rng.zipf(1.4, 1_000_003) % 60_000).astype(dtype)
    weights = rng.integers(-3, 1 << 20, values.size).astype(np.int64) * (1 << 12)  # sums past 2**32, exact in float64
    n = int(values.max()) + 1
    for v in (values, np.sort(values)[::-1].copy()):
        d = cupy.asarray(v)
        assert cupy.asnumpy(xp.tally(d, n)).tolist() == np.bincount(v, minlength=n).astype(float).tolist()
        got = cupy.asnumpy(xp.tally(d, n, cupy.asarray(weights)))
        assert got.tolist() == np.bincount(v, weights=weights.astype(float), minlength=n).tolist()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_devices_own_float64_sum_equals_numpys_and_repeats_bit_for_bit(dtype):
    cupy = pytest.importorskip("cupy")
    rng = np.random.default_rng(4)
    a, b = rng.random(1_000_003).astype(dtype), rng.random(1_000_003).astype(dtype)
    da, db = cupy.asarray(a), cupy.asarray(b)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    assert abs(float(xp.sum64(da, db).get()[0]) - exact) <= 1e-12 * exact
    assert abs(float(xp.sum64(da).get()[0]) - a.astype(np.float64).sum()) <= 1e-12 * a.sum()
    assert float(xp.sum64(da[:0]).get()[0]) == 0.0
    assert xp.sum64(da, db).get()[0] == xp.sum64(da, db).get()[0]


def test_a_small_matrix_is_transposed_on_the_host_like_scipy():
    A = power_law(300, n_cols=500, seed=96).tocsr()
    assert not transpose.on_device(A)
    T = transpose.transpose(A)
    assert T.shape == (500, 300) and (T != A.T).nnz == 0 and T.has_sorted_indices
    wide = transpose.transpose(A, np.float64)
    assert wide.dtype == np.float64 and (wide != A.T.astype(np.float64)).nnz == 0 and wide.has_canonical_format


@pytest.mark.gpu
def test_the_gpu_transposes_to_the_same_arrays_as_scipy(monkeypatch):
    pytest.importorskip("cupy")
    monkeypatch.setattr(device_reorder, "MIN_NNZ", 0)
    for name, A in _cases().items():
        for dtype in (np.float32, np.float64):
            B = sp.csr_matrix(A, dtype=dtype)
            assert transpose.on_device(B), name
            got, expected = transpose.transpose(B), B.T.tocsr()
            expected.sort_indices()
            assert got.shape == expected.shape and got.has_sorted_indices, name
            for field in ("indptr", "indices", "data"):
                u, v = getattr(expected, field), getattr(got, field)
                assert np.array_equal(u.astype(v.dtype), v), (name, dtype, field)
            narrow = transpose.transpose(B, np.float32)
            assert narrow.dtype == np.float32 and np.array_equal(narrow.data, expected.data.astype(np.float32))
    assert not transpose.on_device(sp.csr_matrix(power_law(300, seed=97), dtype=np.int64))  # cuSPARSE: floats


@pytest.mark.gpu
@pytest.mark.parametrize("bought", [True, False])
def test_pinned_transfers_round_trip_arrays_larger_than_their_staging_buffers(bought, monkeypatch):
    cupy = pytest.importorskip("cupy")
    from tuner.staging import StagingRental
    rental = StagingRental(bought)
    monkeypatch.setattr(device_reorder, "RENTAL", rental)
    a = np.random.default_rng(7).integers(-2**29, 2**29, size=3 * device_reorder.STAGE_BYTES // 4 + 12345,
                                          dtype=np.int32)
    cupy.cuda.Device().synchronize()
    poison = cupy.full(a.size, -7, np.int32)  # memory the upload may be handed once it is freed
    del poison
    on_gpu = device_reorder.upload(a)
    assert np.array_equal(on_gpu.get(), a)
    out = np.full(a.size, -1, np.int32)
    back = device_reorder.download(on_gpu * 2 + 1, out=out)  # a kernel still queued when the copy starts
    assert back is out and np.array_equal(back, a * 2 + 1)
    # Unbought, both copies went pageable (twice the array's bytes, within the rent); bought, none did.
    assert rental.rented == (0 if bought else 2 * a.nbytes) and rental.bought == bought
    with cupy.cuda.Stream(non_blocking=True):  # a background tuning's copies are staged, whatever was rented
        again = device_reorder.upload(a)
        assert np.array_equal(again.get(), a)
    assert rental.bought and rental.rented == (0 if bought else 2 * a.nbytes)


@pytest.mark.gpu
@pytest.mark.parametrize("bought", [True, False])
def test_a_download_into_a_given_array_fills_it_on_every_path(bought, tmp_path, monkeypatch):
    cupy = pytest.importorskip("cupy")
    from tuner.staging import StagingRental
    monkeypatch.setattr(device_reorder, "RENTAL", StagingRental(bought))  # the largest staged, or pageable
    rng = np.random.default_rng(10)
    for n in (5, device_reorder.PAGEABLE_MAX_BYTES // 4 + 3, device_reorder.DIRECT_MAX_BYTES // 4 + 11):
        a = rng.integers(-2**31, 2**31 - 1, n, dtype=np.int32)
        out = np.memmap(tmp_path / f"a{n}", dtype=np.int32, mode="w+", shape=(n,))  # as the planner process's files
        assert device_reorder.download(cupy.asarray(a), out=out) is out and np.array_equal(out, a)
        mirror = device_reorder.HostMirror(cupy.asarray(a))
        into = np.full(n, -1, np.int32)
        mirror.read_into(into)
        assert np.array_equal(into, a) and not mirror.copied  # straight from the device, no host copy kept
    with pytest.raises(ValueError, match="destination"):
        device_reorder.download(cupy.arange(4), out=np.empty(5, np.int64))


@pytest.mark.gpu
def test_copies_through_page_locked_blocks_keep_every_value_dtype_and_shape_on_a_side_stream():
    cupy = pytest.importorskip("cupy")
    rng = np.random.default_rng(9)
    sizes = [0, 3, device_reorder.PAGEABLE_MAX_BYTES // 8 + 1, (1 << 21) + 5, device_reorder.DIRECT_MAX_BYTES // 8 + 7]
    with cupy.cuda.Stream(non_blocking=True):  # as the background tuning copies
        for n in sizes:
            for dtype in (np.int32, np.float64):
                a = rng.uniform(-1e6, 1e6, n).astype(dtype)
                d = xp.like(cupy.zeros(1), a)
                assert isinstance(d, cupy.ndarray) and d.dtype == dtype and np.array_equal(d.get(), a), (n, dtype)
                d = d * 3 + 1  # made on the stream the copy back must wait for
                back = xp.host(d)
                assert isinstance(back, np.ndarray) and back.dtype == dtype and np.array_equal(back, a * 3 + 1)
        m = cupy.arange(2 * 300_000, dtype=cupy.float32).reshape(300_000, 2)
        assert np.array_equal(xp.host(m[:, 1]), np.arange(1, 600_000, 2, dtype=np.float32))  # a strided view
        assert xp.host(m).shape == (300_000, 2)


def test_copies_go_pageable_until_their_bytes_would_pay_for_locking_the_staging_buffers():
    from tuner import staging
    rent = staging.RENT_FACTOR * 2 * staging.STAGE_BYTES
    rental = staging.StagingRental()
    assert not rental.locked(rent // 2) and not rental.locked(rent // 2)  # exactly the rent: still pageable
    assert rental.rented == rent and not rental.bought
    assert rental.locked(1) and rental.bought  # the next byte locks them, and every later copy uses them
    assert rental.locked(rent) and rental.rented == rent
    at_once = staging.StagingRental()
    assert at_once.locked(rent + 1) and at_once.rented == 0  # one copy past the rent locks them at once
    beside = staging.StagingRental()
    assert beside.locked(1 << 20, may_rent=False) and beside.bought and beside.locked(1 << 20)
    ahead = staging.StagingRental()
    ahead.expect(rent)  # a matrix whose arrays fit in the rent together: each still goes pageable
    assert not ahead.bought and not ahead.locked(rent // 2) and not ahead.locked(rent // 2)
    ahead = staging.StagingRental()
    ahead.expect(rent + 1)  # together past it: locked before the first, none of them rented
    assert ahead.bought and ahead.locked(rent // 2) and ahead.rented == 0


@pytest.mark.parametrize("pieces", [0.01, 0.1, 0.3, 1, 2, 4.7])
def test_a_staged_drain_fills_the_result_whatever_the_pieces_and_order_of_arrival(pieces):
    from tuner import staging
    src = np.random.default_rng(8).integers(0, 256, int(pieces * staging.STAGE_BYTES), dtype=np.uint8)
    dst = np.zeros_like(src)
    stages = [np.zeros(staging.STAGE_BYTES, np.uint8) for _ in range(2)]
    queued = {}

    def fetch(k, start, size):  # the copy lands only when waited for, as an asynchronous one may
        assert k not in queued, "a stage fetched into again before it was emptied"
        queued[k] = (start, size)

    def wait(k):
        start, size = queued.pop(k)
        np.copyto(stages[k][:size], src[start:start + size])
    staging.drain(dst, stages, fetch, wait)
    assert np.array_equal(dst, src) and not queued


@pytest.mark.parametrize("pieces", [0.01, 1, 2, 4.7])
def test_a_staged_feed_sends_every_piece_and_never_refills_a_stage_still_on_its_way(pieces):
    from tuner import staging
    src = np.random.default_rng(9).integers(0, 256, int(pieces * staging.STAGE_BYTES), dtype=np.uint8)
    dst = np.zeros_like(src)
    stages = [np.zeros(staging.STAGE_BYTES, np.uint8) for _ in range(2)]
    queued = {}

    def put(k, start, size):  # the copy reads the stage only when waited for, as an asynchronous one may
        assert k not in queued, "a stage filled again before its copy had left it"
        queued[k] = (start, size, stages[k][:size].copy())

    def wait(k):
        start, size, sent = queued.pop(k)
        assert np.array_equal(stages[k][:size], sent), "a stage changed while its copy was on its way"
        np.copyto(dst[start:start + size], stages[k][:size])
    staging.feed(src, stages, put, wait)
    assert np.array_equal(dst, src) and not queued


def test_a_deferred_release_frees_cupys_blocks_only_when_the_device_runs_short_and_once_at_the_end(monkeypatch):
    import contextlib
    import sys
    import types
    freed, info = [], {"free": 60, "total": 80}
    pool = types.SimpleNamespace(free_all_blocks=lambda: freed.append(True))
    fake = types.SimpleNamespace(get_default_memory_pool=lambda: pool,
                                 cuda=types.SimpleNamespace(Device=lambda _: contextlib.nullcontext(),
                                                            runtime=types.SimpleNamespace(
                                                                memGetInfo=lambda: (info["free"], info["total"]))))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    device_reorder.release()
    assert len(freed) == 1  # outside: at once
    with device_reorder.releases_deferred():
        device_reorder.release()
        assert len(freed) == 1  # 60 of 80 free: kept
        info["free"] = 9  # under an eighth free: freed after all
        device_reorder.release()
        assert len(freed) == 2
        with device_reorder.releases_deferred():  # nested: the outer block's end releases
            info["free"] = 60
            device_reorder.release()
        assert len(freed) == 2
    assert len(freed) == 3


def test_a_device_allocation_short_of_memory_takes_back_cupys_unused_blocks_and_tries_once_more(monkeypatch):
    import sys
    import types
    from tuner import gpu

    class OutOfMemory(Exception):
        pass
    tries, freed = [], []

    def mem_alloc(n):
        tries.append(n)
        if not freed:
            raise OutOfMemory(f"out of memory for {n} bytes")
        return f"block of {n}"
    pool = types.SimpleNamespace(free_bytes=lambda: 0 if freed else 1 << 30,
                                 free_all_blocks=lambda: freed.append(True))
    monkeypatch.setattr(gpu, "drv", types.SimpleNamespace(mem_alloc=mem_alloc, MemoryError=OutOfMemory))
    monkeypatch.setattr(gpu, "_context", lambda: None)
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(get_default_memory_pool=lambda: pool))
    assert gpu.alloc(4096) == "block of 4096" and tries == [4096, 4096] and freed == [True]
    with pytest.raises(OutOfMemory):  # nothing CuPy could give back: the error stands, no second try
        mem_alloc_fails = types.SimpleNamespace(mem_alloc=lambda n: (_ for _ in ()).throw(OutOfMemory("short")),
                                                MemoryError=OutOfMemory)
        monkeypatch.setattr(gpu, "drv", mem_alloc_fails)
        gpu.alloc(4096)
    assert freed == [True]


def test_host_arrays_already_page_locked_are_copied_directly_not_through_the_staging_buffers(monkeypatch):
    import types
    from tuner import gpu
    big = np.zeros(gpu.STAGED_MIN_BYTES // 8 + 10)
    other = np.zeros_like(big)
    monkeypatch.setitem(gpu._locked, big.ctypes.data, big.ctypes.data + big.nbytes)  # as a Pinned records it
    assert gpu.page_locked(big) and gpu.page_locked(big[5:]) and not gpu.page_locked(other)
    way = []
    monkeypatch.setattr(gpu, "drv", types.SimpleNamespace(memcpy_htod=lambda ptr, a: way.append("direct up"),
                                                          memcpy_dtoh=lambda a, ptr: way.append("direct down")))
    monkeypatch.setattr(gpu, "_staged_htod", lambda ptr, a: way.append("staged up"))
    monkeypatch.setattr(gpu, "_staged_dtoh", lambda a, ptr: way.append("staged down"))
    for a in (big, other):
        gpu.copy_to_device(0, a)
        gpu.copy_to_host(a, 0)
    assert way == ["direct up", "direct down", "staged up", "staged down"]
