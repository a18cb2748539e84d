"""Slotted pages of outer-product SpGEMM (tuner.formats.slotted_pages): every page within its size, every
scalar product in exactly one page, and the pages' partial products summing to C."""
import numpy as np
import pytest
import scipy.sparse as sp

from .conftest import fixture_matrices, power_law
from tuner.formats.slotted_pages import page_operands, product_by_pages, slotted_pages

FIXTURES = fixture_matrices()


def operands(A, B):
    a = sp.csc_matrix(A, dtype=np.float64)
    a.sort_indices()
    b = sp.csr_matrix(B, dtype=np.float64)
    b.sort_indices()
    return a, b


def pairs():
    for name in ("power_law", "one_dense_row", "empty_rows", "long_rows", "rectangular_wide", "tiny"):
        A = FIXTURES[name]
        yield name, A, A.T.tocsr()
        if A.shape[0] == A.shape[1]:
            yield name, A, A


@pytest.mark.parametrize("page", [2, 7, 64, 1000])
def test_every_page_fits_its_size_and_every_product_is_in_one_page(page):
    for name, A, B in pairs():
        a, b = operands(A, B)
        pages = slotted_pages(a.indptr, b.indptr, page)
        assert np.all(pages.entries <= page), name
        total = int((np.diff(a.indptr).astype(np.int64) * np.diff(b.indptr)).sum())
        assert int(pages.products.sum()) == total and np.all(pages.products > 0), name
        assert np.all(np.diff(pages.slot_begin) >= 0)  # slot order
        small = ~pages.large
        assert np.array_equal(pages.a_begin[small], a.indptr[pages.slot_begin[small]])
        assert np.array_equal(pages.b_end[small], b.indptr[pages.slot_end[small]])
        assert np.all(pages.slot_end[pages.large] - pages.slot_begin[pages.large] == 1)


@pytest.mark.parametrize("page", [33, 257, 4096])
def test_partial_products_of_the_pages_sum_to_the_product(page):
    for name, A, B in pairs():
        a, b = operands(A, B)
        pages = slotted_pages(a.indptr, b.indptr, page)
        C = product_by_pages(pages, a.indptr, a.indices, a.data, b.indptr, b.indices, b.data,
                             (a.shape[0], b.shape[1]))
        expected = (A.astype(np.float64) @ B.astype(np.float64)).tocsr()
        assert C.shape == expected.shape
        assert abs(C - expected).max() <= 1e-12 * max(abs(expected).max(), 1.0) if expected.nnz else C.nnz == 0, name


def test_a_heavy_slot_is_cut_along_its_longer_side_or_both():
    colptr, rowptr = np.array([0, 30, 31]), np.array([0, 3, 43])  # slot 0: 30 x 3; slot 1: 1 x 40
    pages = slotted_pages(colptr, rowptr, 16)
    first = pages.slot_begin == 0
    assert np.all(pages.b_end[first] - pages.b_begin[first] == 3)  # the row whole beside 13-entry pieces
    assert (pages.a_end[first] - pages.a_begin[first]).tolist() == [13, 13, 4]
    second = pages.slot_begin == 1
    assert (pages.b_end[second] - pages.b_begin[second]).tolist() == [15, 15, 10]
    both = slotted_pages(np.array([0, 40]), np.array([0, 50]), 20)  # 40 x 50: halves of 10 each way
    assert both.pages == 4 * 5 and np.all(both.entries <= 20) and both.products.sum() == 2000
    assert both.large.all()


def test_light_slots_share_pages_and_a_fitting_heavy_slot_gets_one_page():
    pages = slotted_pages(np.arange(0, 101), np.arange(0, 101), 40)  # 100 slots of 1 x 1: windows of 38
    assert pages.entries.tolist() == [38] * 5 + [10] and not pages.large.any()
    one = slotted_pages(np.array([0, 1, 13, 14]), np.array([0, 1, 5, 6]), 20)  # slot 1: 12 + 4 entries
    assert one.products.tolist() == [1, 48, 1] and not one.large.any()


@pytest.mark.parametrize("page", [16, 256, 4096])
def test_the_page_size_bounds_every_pages_work(page):
    A = power_law(3000, seed=3)
    a, b = operands(A, A.T.tocsr())
    pages = slotted_pages(a.indptr, b.indptr, page)
    assert pages.products.max() <= (page // 2) ** 2  # a + b entries hold at most a x b products
    assert pages.skew() == pytest.approx(pages.products.max() / pages.products.mean())


def test_page_operands_hold_only_the_page_entries():
    A = power_law(200, seed=9)
    a, b = operands(A, A)
    pages = slotted_pages(a.indptr, b.indptr, 16)
    p = int(np.flatnonzero(pages.large)[0]) if pages.large.any() else 0
    pa, pb = page_operands(pages, p, a.indptr, a.indices, a.data, b.indptr, b.indices, b.data, A.shape)
    assert pa.nnz == pages.a_end[p] - pages.a_begin[p] and pb.nnz == pages.b_end[p] - pages.b_begin[p]
    assert (pa @ pb).sum() == pytest.approx(float(np.dot(np.asarray(pa.sum(axis=0)).ravel(),
                                                         np.asarray(pb.sum(axis=1)).ravel())))


def test_bad_page_sizes_and_mismatched_operands_are_refused_by_name():
    with pytest.raises(ValueError, match="at least 2 entries"):
        slotted_pages(np.array([0, 1]), np.array([0, 1]), 1)
    with pytest.raises(ValueError, match="must agree"):
        slotted_pages(np.array([0, 1, 2]), np.array([0, 1]), 8)


# --- the slotted-page product (tuner.spgemm.slotted) ---------------------------------------------------------

from tuner.cache import Cache  # noqa: E402
from tuner.matrix import canonicalize  # noqa: E402
from tuner.model import spgemm as spgemm_model  # noqa: E402
from tuner.spgemm.base import DeviceMemoryError  # noqa: E402
from tuner.spgemm.outer_product import operands as outer_operands  # noqa: E402
from tuner.spgemm.slotted import SlottedProduct, page_need, plan_pages  # noqa: E402


def slotted(A, B, budget):
    a, b = canonicalize(A, np.float64), canonicalize(B, np.float64)
    stats = spgemm_model.ProductStats(a.n_rows, b.n_cols, int((A @ B).nnz), float((A @ B).nnz), 0, 0, 8, 4, 32, 0)
    plan, pages = plan_pages(a, b, budget, stats, spgemm_model.rates_from(None))
    return plan, pages, SlottedProduct(a, b, pages, Cache(None))


@pytest.mark.parametrize("budget", [60_000, 400_000])
def test_slotted_product_pages_sum_to_the_product_and_each_fits_the_budget(budget):
    A = power_law(600, seed=21)
    plan, pages, product = slotted(A, A.T.tocsr(), budget)
    assert pages.pages > 1 and plan.heaviest_need_bytes <= budget
    need = page_need(pages.products, pages.entries, pages.slot_end - pages.slot_begin, 600, 8, 4)
    assert need.max() == plan.heaviest_need_bytes
    for a, b, prepared in product._operands:  # each page's host work done once, on its own operands
        ops = outer_operands(a, b)
        assert np.array_equal(prepared.ops.a_colptr, ops.a_colptr) and np.array_equal(prepared.ops.a_rows, ops.a_rows)
        assert prepared.table.products == int(np.sum(np.diff(ops.a_colptr) * np.diff(ops.b_rowptr)))
    C = sum(a.to_scipy() @ b.to_scipy() for a, b, _ in product._operands)
    ref = A.astype(np.float64) @ A.T.astype(np.float64)
    assert abs(C - ref).max() < 1e-12 * abs(ref).max()


@pytest.mark.parametrize("budget", [200_000, 400_000])
def test_pages_fill_the_budget_so_a_product_takes_about_its_working_set_over_the_budget(budget):
    from tuner.spgemm.slotted import SORT_COPIES
    A = power_law(600, seed=21)
    plan, pages, _ = slotted(A, A.T.tocsr(), budget)
    fewest = int(np.ceil(pages.products.sum() * SORT_COPIES * 16 / budget))  # float64 pairs, all in use
    assert fewest <= pages.pages <= 1.25 * fewest + 1
    assert plan.heaviest_need_bytes <= budget


def test_a_larger_budget_takes_fewer_larger_pages():
    A = power_law(600, seed=22)
    small, _, _ = slotted(A, A, 60_000)
    large, _, _ = slotted(A, A, 600_000)
    assert large.page_entries > small.page_entries and large.pages < small.pages
    assert min(large.predicted_s.values()) < min(small.predicted_s.values())


def test_a_budget_too_small_for_one_page_is_refused_with_both_figures():
    A = power_law(600, seed=23)
    with pytest.raises(DeviceMemoryError, match=r"smallest pages .* need [\d,]+ bytes .* the budget is 1,000"):
        slotted(A, A, 1_000)


@pytest.mark.parametrize("seed", [26, 27])
def test_the_page_count_floor_and_its_predicted_floor_bound_every_paging(seed):
    from tuner.formats.slotted_pages import page_count_floor
    from tuner.spgemm.slotted import predict_pages, predicted_floor
    A = power_law(600, seed=seed)
    colptr, rowptr = A.tocsc().indptr, A.indptr
    stats = spgemm_model.ProductStats(600, 600, int(np.sum(np.diff(colptr) * np.diff(rowptr))),
                                      float((A @ A).nnz), 0, 0, 8, 4, 32, 0)
    rates = spgemm_model.rates_from(None)
    for size in (64, 128, 512, 4096, 1 << 16):
        floor = page_count_floor(colptr, rowptr, size)
        assert floor == slotted_pages(colptr, rowptr, size).pages  # no bound on products: exactly its pages
        for bound in (50, 1_000, 100_000):
            pages = slotted_pages(colptr, rowptr, size, bound)
            assert floor <= pages.pages
            floor_s = predicted_floor(floor, int(pages.products.sum()), stats, rates)
            assert 0 < floor_s <= predict_pages(pages, stats, rates, budget_bytes=400_000)


def test_pages_planned_largest_first_choose_what_weighing_every_size_chooses():
    from tuner.spgemm.slotted import SMALLEST_PAGE, pages_at, predict_pages
    rates = spgemm_model.rates_from(None)
    skipped = 0
    for seed, budget in ((28, 60_000), (29, 400_000), (30, 4_000_000)):
        A = power_law(600, seed=seed)
        a = canonicalize(A, np.float64)
        stats = spgemm_model.ProductStats(600, 600, int(np.sum(np.diff(A.tocsc().indptr) * np.diff(A.indptr))),
                                          float((A @ A).nnz), 0, 0, 8, 4, 32, 0)
        plan, pages = plan_pages(a, a, budget, stats, rates)
        every = {}
        size = SMALLEST_PAGE
        while True:  # every size weighed, smallest first
            p, heaviest = pages_at(A.tocsc().indptr, A.indptr, size, budget, 600, 8, 4)
            if heaviest <= budget:
                every[size] = predict_pages(p, stats, rates, budget_bytes=budget)
            if size >= 2 * a.nnz:
                break
            size *= 2
        assert plan.page_entries == min(every, key=every.get)
        assert set(plan.predicted_s) <= set(every) and plan.page_entries in plan.predicted_s
        assert all(plan.predicted_s[e] == round(every[e], 6) for e in plan.predicted_s)
        skipped += len(every) - len(plan.predicted_s)
    assert skipped > 0  # sizes were left unpaged, yet nothing chosen changed


def test_the_host_floor_is_at_most_what_any_paging_of_the_product_needs():
    from tuner.spgemm.slotted import host_bytes, host_bytes_floor
    A = power_law(600, seed=24)
    a = canonicalize(A, np.float64)
    a_colptr = np.zeros(a.n_cols + 1, np.int64)
    np.cumsum(a.col_lengths, out=a_colptr[1:])
    products = int(np.sum(np.diff(a_colptr) * np.diff(A.indptr)))
    nnz_c = float((A @ A).nnz)
    floor = host_bytes_floor(products, nnz_c, 8)
    assert floor == int(nnz_c * 16 + 2 * nnz_c * 12 + 4 * nnz_c)  # nnz(C) < products: one partial an entry
    for size in (64, 256, 4096, 1 << 20):
        assert floor <= host_bytes(slotted_pages(a_colptr, A.indptr, size), nnz_c, 8)


def test_a_product_no_paging_fits_in_host_memory_is_refused_before_pages_are_planned(monkeypatch):
    import tuner
    from tuner import gpu
    from tuner.memory import InsufficientMemoryError
    from tuner.spgemm import slotted as slotted_module
    monkeypatch.setattr(gpu, "device_info", lambda: gpu.DeviceInfo("fake", (9, 0), 132, 50 << 20, 1 << 30, 13000,
                                                                   shared_bytes_per_sm=233472,
                                                                   shared_bytes_per_block=232448))
    monkeypatch.setattr(gpu, "free_memory", lambda release_pool=False: 100_000)  # no family fits the device

    def planned(*args, **kwargs):
        raise AssertionError("pages planned for a product host memory cannot hold")
    monkeypatch.setattr(slotted_module, "plan_pages", planned)
    monkeypatch.setenv("TUNER_HOST_MEMORY_LIMIT", "100K")
    A = power_law(600, seed=25)
    with pytest.raises(InsufficientMemoryError, match=r"C = A B \(600 x 600\) assembled from slotted pages would "
                                                      r"need about .* host memory .*at least"):
        tuner.compile(A, A)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["power_law", "long_rows", "pattern", "pattern_of_threes", "float64"])
def test_a_product_over_the_device_budget_streams_slotted_pages_and_matches_scipy(name):
    import tuner
    A = FIXTURES[name] if name in FIXTURES else FIXTURES["pattern"] * 3  # equal values other than one
    B = A.T.tocsr()
    f = tuner.compile(A, B, device_memory_limit=200_000)
    assert isinstance(f, SlottedProduct) and f.plan.pages > 1, f.explain()
    ref = (A.astype(np.float64) @ B.astype(np.float64)).tocsr()
    ref.sort_indices()
    # The first call copies C's blocks straight into its arrays and keeps C's pattern and the partials' keys
    # (a block-major, page-locked store); later ones move values alone, the pages' sums into the store, each
    # block's sums into C's page-locked values, replayed as one CUDA graph from the second call on (queued
    # call by call where graphs are off), the host copying a block out once its event has passed.
    for call in range(6):
        f.graphed = call < 4
        if call == 4:
            f._graph = None
        C = f()
        assert C.shape == ref.shape and C.nnz == ref.nnz and C.has_sorted_indices, call
        assert np.array_equal(C.indptr, ref.indptr) and np.array_equal(C.indices, ref.indices), call
        assert abs(C - ref).max() <= 1e-5 * max(abs(ref).max(), 1.0), call
        assert f._structure is not None and f._store is not None and f._pins, call
        assert (f._graph is not None) == (1 <= call < 4), call
        C.indices[:] = 0  # the caller's C is its own: the next call's pattern is untouched
        C.data[:] = np.nan
    assert f.down_bytes == f._store.values.nbytes + ref.nnz * f.dtype.itemsize
    f.graphed = True
    if not f.value_free:  # new values of the same structures: values only, still right
        rng = np.random.default_rng(5)
        A2, B2 = A.copy(), B.copy()
        A2.data = rng.uniform(0.5, 2.0, A2.nnz).astype(A.dtype)
        B2.data = rng.uniform(0.5, 2.0, B2.nnz).astype(B.dtype)
        ref2 = (A2.astype(np.float64) @ B2.astype(np.float64)).tocsr()
        for _ in range(2):  # the graph named the old values' arrays: captured again
            C = f(A2, B2)
            assert np.array_equal(C.indices, ref.indices) and abs(C - ref2).max() <= 1e-5 * abs(ref2).max()
            assert f._graph is not None
    assert 0 < f.peak_bytes <= 200_000 and f.blocks >= 1  # the partials summed on the device in row blocks
    assert f.blocks > 1 or name == "long_rows"  # its partials fit one block
    with pytest.raises(ValueError, match="out='device'"):
        f(out="device")


def test_filling_by_products_takes_slots_until_the_next_would_pass_the_bound():
    from tuner.formats.slotted_pages import _fill_by_products
    rng = np.random.default_rng(3)
    products = rng.integers(0, 40, 2000)
    given = rng.random(2000) < 0.02
    given[0] = True
    new = _fill_by_products(given, np.concatenate(([0], np.cumsum(products))), 100)
    assert np.all(new[given])
    starts = np.flatnonzero(new)
    ends = np.append(starts[1:], products.size)
    sums = np.add.reduceat(products, starts)
    assert np.all((sums <= 100) | (ends - starts == 1))  # over the bound only as a slot alone
    added = ~given[starts[1:]]  # pages that end where filling, not a given start, cut them
    assert np.all(sums[:-1][added] + products[ends[:-1][added]] > 100)


@pytest.mark.parametrize("max_products", [50, 400])
def test_a_products_bound_packs_light_slots_into_pages_of_like_work(max_products):
    A = power_law(500, seed=24)
    a, b = operands(A, A.T)
    pages = slotted_pages(a.indptr, b.indptr, 64, max_products)
    shared = ~pages.large & (pages.slot_end - pages.slot_begin > 1)
    assert shared.any()
    assert np.all(pages.products[shared] <= max_products)  # a shared page holds at most the bound
    plain = slotted_pages(a.indptr, b.indptr, 64)
    over = (~plain.large & (plain.slot_end - plain.slot_begin > 1) & (plain.products > max_products)).any()
    assert pages.pages > plain.pages if over else pages.pages == plain.pages
    C = product_by_pages(pages, a.indptr, a.indices, a.data, b.indptr, b.indices, b.data, A.shape)
    assert abs(C - a @ b).max() < 1e-12 * abs(a @ b).max()


def _partials(shape, count, seed, dtype=np.float64):
    """``count`` random partial products of ``shape`` as a page leaves them: sorted distinct keys, values."""
    parts = [sp.random(*shape, density=0.15, format="coo", random_state=seed + k, dtype=dtype) for k in range(count)]
    keys = [np.sort((p.row.astype(np.uint64) * np.uint64(shape[1]) + p.col.astype(np.uint64))) for p in parts]
    values = []
    for p, k in zip(parts, keys):
        order = np.argsort(p.row.astype(np.uint64) * np.uint64(shape[1]) + p.col.astype(np.uint64), kind="stable")
        values.append(p.data[order])
    return parts, keys, values


@pytest.mark.parametrize("capacity", [1, 7, 50, 10**6])
def test_row_blocks_cover_the_rows_in_order_and_hold_at_most_the_capacity_unless_one_row(capacity):
    from tuner.spgemm.assemble import row_blocks
    _, keys, _ = _partials((60, 30), 9, 3)
    blocks = row_blocks(keys, 60, 30, capacity, grid=8)
    assert blocks[0][0] == 0 and blocks[-1][1] == 60 and all(a[1] == b[0] for a, b in zip(blocks, blocks[1:]))
    rows = np.concatenate([k // np.uint64(30) for k in keys]).astype(np.int64)
    for r0, r1, count in blocks:
        assert count == np.count_nonzero((rows >= r0) & (rows < r1))
        assert count <= capacity or r1 - r0 == 1
    if capacity == 10**6:
        assert len(blocks) == 1


@pytest.mark.parametrize("capacity", [1, 40, 10**6])
def test_partials_assembled_in_row_blocks_equal_their_sum(capacity):
    from tuner.spgemm.assemble import assemble, host_merge
    parts, keys, values = _partials((70, 40), 13, 11)
    calls = []

    def merge(k, v, *block):  # the host's sort and sum, as the device's merge_block leaves it
        calls.append(sum(x.size for x in k))
        return host_merge(40)(k, v, *block)
    got = assemble(keys, values, (70, 40), np.float64, capacity, merge)
    want = sum(p.tocsr() for p in parts)
    assert got.has_sorted_indices and got.dtype == np.float64 and got.indices.dtype == np.int32
    assert np.array_equal(got.indptr, want.indptr) and np.array_equal(got.indices, want.indices)
    assert np.abs(got.data - want.data).max() < 1e-12
    assert all(c <= capacity for c in calls) and (len(calls) == 1) == (capacity == 10**6)


def test_assembly_waits_for_the_merges_copies_whether_it_returns_or_raises():
    from tuner.spgemm.assemble import assemble, host_merge
    _, keys, values = _partials((30, 20), 4, 31)
    finished = []
    got = assemble(keys, values, (30, 20), np.float64, 40, host_merge(20), lambda: finished.append("ok"))
    assert finished == ["ok"] and got.nnz > 0

    def failing(*block):
        raise RuntimeError("out of device memory")
    with pytest.raises(RuntimeError, match="out of device memory"):
        assemble(keys, values, (30, 20), np.float64, 40, failing, lambda: finished.append("after the error"))
    assert finished == ["ok", "after the error"]


@pytest.mark.parametrize("capacity", [1, 40, 10**6])
def test_a_block_major_store_holds_each_block_as_the_slices_of_every_page_in_order(capacity):
    from tuner.spgemm.assemble import block_layout, block_slices, row_blocks
    _, keys, values = _partials((70, 40), 13, 12)
    rows = np.array([r0 for r0, _, _ in row_blocks(keys, 70, 40, capacity, grid=8)] + [70])
    layout = block_layout(keys, rows, 40)
    store_keys, store_values = np.full(layout.starts[-1], 7, np.uint64), np.full(layout.starts[-1], np.nan)
    for k, v, pieces in zip(keys, values, layout.pieces):  # as a page's sums come down into their places
        for at, first, count in pieces:
            store_keys[at:at + count], store_values[at:at + count] = k[first:first + count], v[first:first + count]
    assert layout.starts[-1] == sum(k.size for k in keys)
    for b, (k, v) in enumerate(block_slices(keys, values, rows, 40)):
        a, e = layout.starts[b], layout.starts[b + 1]
        assert np.array_equal(store_keys[a:e], np.concatenate(k))
        assert np.array_equal(store_values[a:e], np.concatenate(v))


def test_partials_of_a_product_without_rows_or_entries_assemble_to_an_empty_matrix():
    from tuner.spgemm.assemble import assemble
    empty = [np.zeros(0, np.uint64)]
    for shape in ((0, 5), (4, 5)):
        got = assemble(empty, [np.zeros(0, np.float32)], shape, np.float32, 10, lambda *a: pytest.fail("merged"))
        assert got.shape == shape and got.nnz == 0 and got.dtype == np.float32 and got.indptr.size == shape[0] + 1
