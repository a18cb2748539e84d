"""Slotted-page SpGEMM (paper 001, MStream, outer-product variant): C = A B through a device-memory budget
smaller than the product's working set.

The inner dimension is cut into slotted pages (:mod:`tuner.formats.slotted_pages`): each page is a
contiguous range of A's CSC entries and of B's CSR entries, whose outer products are a partial C. Page by
page, the page's operands go to the GPU, the outer_product family expands, sorts and sums them there
(:class:`~tuner.spgemm.outer_product.OuterProduct` on the page), and the partial C comes back to host
memory as sorted (row, column) keys and their sums. C is the sum of the partials: cut into blocks of rows
whose partial entries fit the budget, each block's slices of every partial go back to the GPU to be sorted
and summed there by the same merge (:mod:`tuner.spgemm.assemble`). The page's operands are cut when the
product is compiled, so a call copies, multiplies and downloads, then assembles. The structures are fixed, so
the partials' keys and C's pattern are the same at every call: the first call keeps them
(:class:`~tuner.spgemm.assemble.Structure`, :class:`PartialStore`) and later calls move values alone: a
page's operands up in one copy, its sums down into their row blocks' places in a page-locked, block-major
store, each block's run of kept keys and new values up in one copy each, its sums down into C's
page-locked values. That sequence of a few hundred copies, kernels and CUB calls is the same at every
call too, over memory held for it: the second call captures it as a CUDA graph, and later calls launch
the graph with one host call while the host copies each block's part of C out as the GPU passes it.

The page size is the model's: among powers of two whose heaviest page fits the budget (:func:`page_need`),
light slots sharing a page up to what the budget holds (:func:`pages_at`: pages of like work, each about a
budget's worth, so a product a few times its budget takes few pages), the one with the lowest predicted time,
each page predicted by the outer_product model's rates (:mod:`tuner.model.spgemm`; a replayed step's launches
in place of a standalone product's fixed cost) plus its copies at the H100's page-locked rates
(:data:`H2D_GBS`, :data:`D2H_GBS`; a call's uploads come from the pages' packed arrays, page-locked in place
at the first call, its partials back into the page-locked store from the second call on).
Larger pages pay the per-page launches fewer times and send back fewer partial entries (a page sums its own
duplicates); the budget bounds them. The prediction includes the assembly of C from the partials.
"""
from __future__ import annotations

import ctypes
import dataclasses
import time
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from .. import gpu
from ..cache import Cache
from ..formats.slotted_pages import SlottedPages, page_count_floor, page_operands, slotted_pages
from ..matrix import CanonicalMatrix, canonicalize
from ..memory import available_bytes, check_fits
from ..staging import STAGE_THREADS, copy_in_parts, shared_pool
from ..model import spgemm as model
from .assemble import Structure, assemble, assemble_values, block_layout, block_rows, host_merge
from .base import DeviceMemoryError, Product
from .outer_product import (Arena, OuterProduct, OuterProductParams, Prepared, index_dtype, key_bits, operands,
                            prepare)

PIN_SHARE = 4  # the pages' uploads are page-locked where they take at most 1/PIN_SHARE of the free host memory
# The expansion's keys and values held twice at the sort (CUB's DoubleBuffer: input and output), and CUB's own
# storage: counters per tile of items, 1.5 % of a copy from a million pairs on, 16 % at ten thousand.
SORT_COPIES = 2.25
SMALLEST_PAGE = 64  # entries
H2D_GBS = 48.0  # pinned host-to-device and device-to-host rates (GB/s) where none is measured: the H100's
D2H_GBS = 54.0


@dataclass(frozen=True)
class SlottedPlan:
    """The slotted-page decision.

    Attributes:
        page_entries: the most entries (A's and B's) a page holds.
        pages: pages of C = A B at that size.
        budget_bytes: the device memory a page may hold.
        heaviest_need_bytes: what the heaviest page needs (:func:`page_need`).
        predicted_s: predicted seconds of a call at each page size that fits (page entries -> s), but those
            whose launches alone outlast a better size's prediction (:func:`predicted_floor`).
        reason: why streamed, in words.
        stats: the model's view of the whole product (:class:`~tuner.model.spgemm.ProductStats`), where known.
    """

    page_entries: int
    pages: int
    budget_bytes: int
    heaviest_need_bytes: int
    predicted_s: dict = field(default_factory=dict)
    reason: str = ""
    family: str = "slotted_page"
    stats: model.ProductStats | None = None


def page_need(products: np.ndarray, entries: np.ndarray, slots: np.ndarray, n_rows: int, value_bytes: int,
              index_bytes: int, split: int = OuterProductParams().split) -> np.ndarray:
    """Device bytes each page's outer product holds at its peak: the expansion's 8-byte keys and values
    :data:`SORT_COPIES` times, the page's operands, its workload table (a block per slot and per ``split``
    entries) and C's row pointer.

    Example (a page of 1,000 products from 100 entries over 10 slots, 1,000 rows, float32):
        >>> int(page_need(np.array([1000]), np.array([100]), np.array([10]), 1000, 4, 4)[0])
        36248
    """
    products, entries, slots = (np.asarray(x, np.int64) for x in (products, entries, slots))
    blocks = slots + entries // max(split, 1) + 1
    return (np.ceil(SORT_COPIES * products * (8 + value_bytes)).astype(np.int64)
            + entries * (index_bytes + value_bytes) + 8 * (slots + 1)
            + 32 * blocks + 8 * (n_rows + 1))


def predict_pages(pages: SlottedPages, stats: model.ProductStats, rates: model.Rates, h2d_gbs: float = H2D_GBS,
                  d2h_gbs: float = D2H_GBS, budget_bytes: int | None = None) -> float:
    """Predicted seconds of a repeated call over ``pages`` (the first also brings the keys and C's columns
    down, the second captures the graph): each page's outer product by the model's rates with at most
    min(its products, nnz(C)) entries, its operands up and those partial entries' values down; then the
    assembly of C (:mod:`tuner.spgemm.assemble`): the partial entries (8-byte key and value) up again, sorted
    and summed at the outer product's rate per product, in blocks of what ``budget_bytes`` holds (None: one
    block), and C's nnz(C) values down. A repeated call replays its pages and blocks as one CUDA graph, so
    each of them costs its launches on the GPU (``model.LAUNCHES`` times the launch cost), not a standalone
    product's fixed cost, most of which is the host's.

    Example:
        >>> p = slotted_pages(np.array([0, 2, 4]), np.array([0, 2, 4]), 4)
        >>> s = model.ProductStats(4, 4, 8, 8.0, 0, 0, 4, 4, 4, 0)
        >>> r = model.Rates({"outer:fixed": 0.5}, 0.005, "test")
        >>> round(predict_pages(p, s, r, 1.0, 1.0), 9)  # 3 steps of 6 launches of 5 us; 64 B up, 32 down; 96, 32
        9.0224e-05
    """
    entry = stats.col_bytes + stats.value_bytes
    pair = 8 + stats.value_bytes  # a partial entry: its (row, column) key and value
    fixed, per_product, per_entry, per_slot = _page_costs(stats, rates)
    products = pages.products.astype(np.float64)
    nnz = np.minimum(products, stats.nnz_c)
    partials = float(nnz.sum())
    slots = (pages.slot_end - pages.slot_begin).astype(np.float64)
    kernels_ms = pages.pages * fixed + per_product * products.sum() + per_entry * nnz.sum() + per_slot * slots.sum()
    copies_s = (pages.entries.sum() * entry / h2d_gbs + partials * stats.value_bytes / d2h_gbs) / 1e9
    blocks = 1 if budget_bytes is None else max(1, int(np.ceil(partials * SORT_COPIES * pair / budget_bytes)))
    assembly_ms = blocks * fixed + per_product * partials + per_entry * min(partials, stats.nnz_c)
    assembly_s = (partials * pair / h2d_gbs + min(partials, stats.nnz_c) * stats.value_bytes / d2h_gbs) / 1e9
    return float(1e-3 * (kernels_ms + assembly_ms) + copies_s + assembly_s)


def _page_costs(stats: model.ProductStats, rates: model.Rates) -> tuple[float, float, float, float]:
    """(fixed, per_product, per_entry, per_slot) ms of a page's step in a repeated call. outer_product's
    prediction is linear in a page's products, entries of C and slots: its coefficients from unit pages. A
    repeated call replays its pages' and blocks' work as one CUDA graph: a step pays its launches on the GPU
    (``fixed``), not a standalone product's fixed cost (mostly the host's launches and its waits for the GPU)."""
    def at(products=0, nnz=0.0, pairs=0):
        page = model.ProductStats(stats.n_rows, stats.n_cols, products, nnz, 0, 0, stats.value_bytes,
                                  stats.col_bytes, stats.key_bits, 0, pairs=pairs)
        return model.predict("outer_product", page, rates)
    alone = at()
    return (model.LAUNCHES["outer_product"](stats) * rates.launch_ms, at(products=1) - alone, at(nnz=1.0) - alone,
            at(pairs=1) - alone)


def predicted_floor(page_count: int, products: int, stats: model.ProductStats, rates: model.Rates) -> float:
    """The least :func:`predict_pages` of any paging of ``products`` scalar products into ``page_count`` pages
    or more: their steps' launches and the work of every product, the other terms (entries, slots, copies,
    assembly) taken as none; 0 where a coefficient of the rates is negative (no term can then be left out).

    Example (a million pages of 6 launches of 5 us: 30 s before any work):
        >>> s = model.ProductStats(4, 4, 8, 8.0, 0, 0, 4, 4, 4, 0)
        >>> r = model.Rates({"outer:fixed": 0.5}, 0.005, "test")
        >>> round(predicted_floor(1_000_000, 0, s, r), 6)
        30.0
    """
    fixed, per_product, per_entry, per_slot = _page_costs(stats, rates)
    if min(fixed, per_product, per_entry, per_slot) < 0:
        return 0.0
    return 1e-3 * (page_count * fixed + per_product * products)


def host_bytes(pages: SlottedPages, nnz_c: float, value_bytes: int) -> int:
    """Host bytes a call holds at once: every page's partial product (at most min(its products, nnz(C))
    entries of an 8-byte key and a value; later calls keep them, block by block: :class:`PartialStore`), C
    (a 32-bit column and a value an entry) with as much again for its page-locked values (later calls) or a
    block's download (the first), and the columns of C that later calls keep (:class:`Structure`).

    Example (two pages of 4 products, 6 entries in C, float64):
        >>> host_bytes(slotted_pages(np.array([0, 2, 4]), np.array([0, 2, 4]), 4), 6.0, 8)  # 128 + 144 + 24
        296
    """
    return _host_bytes(float(np.minimum(pages.products, nnz_c).sum()), nnz_c, value_bytes)


def host_bytes_floor(products: int, nnz_c: float, value_bytes: int) -> int:
    """The least :func:`host_bytes` any paging of a product of ``products`` scalar products can need: the
    pages' partial entries, each page's min(its products, nnz(C)), add up to at least min(products, nnz(C)).
    It lets a product that no paging fits be refused before any page is planned.

    Example (the pages of host_bytes' example hold 4 + 4 products):
        >>> host_bytes_floor(8, 6.0, 8) <= host_bytes(slotted_pages(np.array([0, 2, 4]), np.array([0, 2, 4]), 4), 6.0, 8)
        True
    """
    return _host_bytes(min(float(products), float(nnz_c)), nnz_c, value_bytes)


def _host_bytes(partials: float, nnz_c: float, value_bytes: int) -> int:
    return int(partials * (8 + value_bytes) + 2 * nnz_c * (4 + value_bytes) + 4 * nnz_c)


def check_host_fits(a: CanonicalMatrix, b: CanonicalMatrix, stats: model.ProductStats, value_bytes: int) -> None:
    """Refuse (:class:`~tuner.memory.InsufficientMemoryError`) a slotted product whose partial products and C
    outgrow host memory however it is paged (:func:`host_bytes_floor`): before :func:`plan_pages`, which walks
    every slot a few dozen times, plans pages no call could hold. :class:`SlottedProduct` checks its pages'
    own figure (:func:`host_bytes`) again."""
    check_fits(host_bytes_floor(stats.products, stats.nnz_c, value_bytes),
               f"C = A B ({a.n_rows:,} x {b.n_cols:,}) assembled from slotted pages",
               "at least: the partial products, as many as the products or the estimated nnz(C) whichever is "
               "fewer, and C")


def pages_at(a_colptr: np.ndarray, b_rowptr: np.ndarray, size: int, budget_bytes: int, n_rows: int,
             value_bytes: int, index_bytes: int) -> tuple[SlottedPages, int]:
    """The pages :func:`plan_pages` weighs at ``size`` entries a page, and what the heaviest of them needs
    (:func:`page_need`). Light slots fill pages up to a bound on their products (:func:`slotted_pages`'
    ``max_products``): first what the budget holds beside C's row pointer; where the pages' operands then
    take the heaviest over the budget, that bound less the excess (up to three tries); else half the
    budget's worth, which leaves room for the operands of any page that fits at all.

    Example (a 200 x 200 matrix of 2,000 entries times itself):
        >>> A = sp.random(200, 200, density=0.05, format="csr", random_state=0)
        >>> p, need = pages_at(A.tocsc().indptr, A.indptr, 4096, 200_000, 200, 8, 4)
        >>> p.pages, need <= 200_000   # 20,093 products, 5,555 in the budget's worth
        (4, True)
    """
    pair_bytes = SORT_COPIES * (8 + value_bytes)
    half = max(int(budget_bytes // 2 // pair_bytes), 1)

    def packed(bound: int) -> tuple[SlottedPages, int]:
        pages = slotted_pages(a_colptr, b_rowptr, size, bound)
        need = page_need(pages.products, pages.entries, pages.slot_end - pages.slot_begin, n_rows, value_bytes,
                         index_bytes)
        return pages, int(need.max(initial=0))
    bound = int((budget_bytes - 8 * (n_rows + 2)) // pair_bytes)
    for _ in range(3):
        if bound <= half:
            break
        pages, heaviest = packed(bound)
        if heaviest <= budget_bytes:
            return pages, heaviest
        bound -= int(np.ceil((heaviest - budget_bytes) / pair_bytes))
    return packed(half)


def plan_pages(a: CanonicalMatrix, b: CanonicalMatrix, budget_bytes: int, stats: model.ProductStats,
               rates: model.Rates, reason: str = "") -> tuple[SlottedPlan, SlottedPages]:
    """The page size of C = A B under ``budget_bytes`` (see the module docstring) and its pages, light slots
    packed as fully as the budget allows (:func:`pages_at`).

    Raises :class:`~tuner.spgemm.base.DeviceMemoryError` when even the smallest page does not fit, naming
    what it needs and the budget.

    Example:
        >>> A = canonicalize(sp.random(200, 200, density=0.05, format="csr", random_state=0))
        >>> s = model.ProductStats(200, 200, 4000, 3000.0, 0, 0, 8, 4, 16, 0)
        >>> plan, pages = plan_pages(A, A, 200_000, s, model.rates_from(None))
        >>> plan.heaviest_need_bytes <= 200_000, plan.page_entries, pages.pages
        (True, 2048, 4)
    """
    a_colptr = np.zeros(a.n_cols + 1, np.int64)  # A by columns needs only its column pointer here
    np.cumsum(a.col_lengths, out=a_colptr[1:])
    b_rowptr = np.asarray(b.indptr, np.int64)
    total = a.nnz + b.nnz
    vb, ib = a.value_dtype.itemsize, a.index_dtype.itemsize
    fits, smallest, lowest = {}, None, np.inf
    products = int(np.dot(np.diff(a_colptr), np.diff(b_rowptr)))  # every paging's pages hold them all
    sizes = [SMALLEST_PAGE]
    while sizes[-1] < total:
        sizes.append(2 * sizes[-1])
    # Largest pages first (the fewest, soonest made): a smaller size whose pages' launches and products alone
    # take longer than the best prediction so far cannot win, and is not paged (at the smallest sizes a
    # power-law graph's heavy slots are cut into millions of pages).
    for size in reversed(sizes):
        if predicted_floor(page_count_floor(a_colptr, b_rowptr, size), products, stats, rates) > lowest:
            continue
        pages, heaviest = pages_at(a_colptr, b_rowptr, size, budget_bytes, a.n_rows, vb, ib)
        smallest = heaviest if smallest is None else min(smallest, heaviest)
        if heaviest <= budget_bytes:
            fits[size] = (pages, heaviest, predict_pages(pages, stats, rates, budget_bytes=budget_bytes))
            lowest = min(lowest, fits[size][2])
    if not fits:
        raise DeviceMemoryError(f"C = A B in slotted pages: the smallest pages ({SMALLEST_PAGE:,} entries) need "
                                f"{smallest:,} bytes of device memory, the budget is {budget_bytes:,}")
    best = min(fits, key=lambda e: (fits[e][2], e))  # the smallest of equal predictions
    pages, heaviest, _ = fits[best]
    plan = SlottedPlan(best, pages.pages, int(budget_bytes), heaviest,
                       {e: round(v[2], 6) for e, v in sorted(fits.items())},
                       reason or f"{pages.pages} pages of up to {best:,} entries, the lowest predicted time")
    return plan, pages


def _on_device(block: tuple, capacity: int) -> bool:
    """Whether a later call sums the block (a :attr:`Structure.blocks` tuple) on the device: it has partial
    entries, at most ``capacity`` of them (a row over it is summed on the host), and entries of C."""
    _, _, count, _, added = block
    return 0 < count <= capacity and added > 0


def _pattern_copies(structure: Structure):
    """Start copying C's row pointer and columns from ``structure`` on the process's copy threads (beside
    the call's device work; C's new arrays are faulted in on many cores, not one); the returned function
    waits for them and returns (indptr, indices)."""
    copies = [(np.empty_like(x), x) for x in (structure.indptr, structure.indices)]
    part = max(1 << 20, -(-structure.indices.size // STAGE_THREADS))
    pool = shared_pool()
    futures = [done for dst, src in copies for done in copy_in_parts(pool, dst, src, part)]

    def wait() -> tuple[np.ndarray, np.ndarray]:
        for f in futures:
            f.result()
        return copies[0][0], copies[1][0]
    return wait


class PartialStore:
    """Every page's partial product in page-locked host memory, row block by row block
    (:class:`~tuner.spgemm.assemble.BlockLayout`): the pages' values come down into their blocks' places and
    each block goes back up in one run of keys and one of values, instead of a slice from every page. The
    keys are the first call's, which stay the same at every call (the structures are fixed).

    Attributes:
        keys, values: the store (page-locked while this object lives).
        starts: each block's first entry in the store, and the store's size last.
        pieces: per page, (host address in ``values``, the page's first entry there, entries) of each block
            it reaches, as :meth:`~tuner.spgemm.outer_product.OuterProduct.pair_values` takes them.
        slices: per block, ([its keys], [its values]) as :func:`~tuner.spgemm.assemble.assemble_values`
            takes them.
    """

    def __init__(self, page_keys: list[np.ndarray], rows: np.ndarray, n_cols: int, dtype):
        layout = block_layout(page_keys, rows, n_cols)
        n = int(layout.starts[-1])
        keys, values = np.empty(n, np.uint64), np.empty(n, dtype)
        for i, pieces in enumerate(layout.pieces):
            for at, first, count in pieces:
                keys[at:at + count] = page_keys[i][first:first + count]
            page_keys[i] = None  # let go of as they are copied: the partials are not held twice
        self._locked = (gpu.Pinned(keys), gpu.Pinned(values))
        self.keys, self.values, self.starts = keys, values, layout.starts
        host, vs = values.ctypes.data, values.itemsize
        self.pieces = [[(host + vs * at, first, count) for at, first, count in p] for p in layout.pieces]
        self.slices = [([keys[a:b]], [values[a:b]]) for a, b in zip(layout.starts[:-1], layout.starts[1:])]


@dataclass(frozen=True)
class _Steady:
    """What a slotted product's calls after the first hold beside the :class:`PartialStore`.

    Attributes:
        arena: device memory for one page's or one block's sums at a time (the heaviest's).
        operands: device memory for one page's packed operands (the largest's).
        c_values: C's values, page-locked: each block's sums come down here, the host copies them out.
        stream: the non-blocking stream the work (or its CUDA graph) is queued on.
        events: the host's :class:`~tuner.gpu.GraphEvent` after the pages, then after each device-summed
            block.
    """

    arena: Arena
    operands: object
    c_values: object
    stream: object
    events: list


class SlottedProduct(Product):
    """C = A B streamed page by page through a device-memory budget (see the module docstring); a call
    returns C as a SciPy CSR matrix (it is not kept on the GPU: ``out='device'`` is refused). ``seconds``
    after a timed call: 'pages' (each page's copies and kernels and its partial product back) and 'assemble'
    (the partials summed on the device in blocks of rows, C assembled); ``peak_bytes``: the most device
    memory a page or a block held; ``up_bytes``, ``down_bytes``: what the last call copied to the GPU (the
    pages' operands, then the partials) and back (the partials, then C); ``blocks``: the row blocks the last
    call summed on the device. ``budget_bytes``: what a page or a block of the assembly may hold (default:
    what the heaviest page needs). ``graphed``: whether calls after the first replay their device work as
    one CUDA graph (on by default; off, the same work is queued call by call).

    Example (on a GPU machine):
        >>> f = tuner.compile(A, A, device_memory_limit="64M")   # doctest: +SKIP
        >>> C = f(); f.plan.pages, f.peak_bytes <= 64 * 2**20   # doctest: +SKIP
        (12, True)
    """

    family = "slotted_page"

    def __init__(self, a: CanonicalMatrix, b: CanonicalMatrix, pages: SlottedPages, cache: Cache,
                 params: OuterProductParams = OuterProductParams(), nnz_c: float | None = None,
                 budget_bytes: int | None = None):
        super().__init__(a, b, params)
        bound = float(pages.products.sum()) if nnz_c is None else float(nnz_c)
        self.nnz_c = bound  # C's entries as the compile estimated them (at most the products)
        check_fits(host_bytes(pages, bound, self.dtype.itemsize),
                   f"C = A B ({self.shape[0]:,} x {self.shape[1]:,}) assembled from {pages.pages:,} slotted pages",
                   "the partial products and C, from the estimated nnz(C)")
        self.pages, self.cache = pages, cache
        if budget_bytes is None:
            budget_bytes = int(page_need(pages.products, pages.entries, pages.slot_end - pages.slot_begin,
                                         a.n_rows, self.dtype.itemsize, a.index_dtype.itemsize).max(initial=0))
        self.budget_bytes = int(budget_bytes)
        self.blocks = 0
        self.up_bytes = self.down_bytes = 0
        self.ops = operands(a, b)
        self._operands = self._pages()
        self._size_operands()
        self._pins = None  # every page's packed uploads page-locked in place, at the first call
        self._page = None  # the outer product's kernels, loaded at the first call, rebound to each page
        self._structure = None  # C's pattern and row blocks, found by the first call
        self._stored = False  # whether the first call has tried to make the steady state's memory (_make_store)
        self._store = None  # the partials, block-major and page-locked (PartialStore), after the first call
        self._steady = None  # what later calls hold beside the store (_Steady)
        self._graph = None  # a later call's device work as a CUDA graph (gpu.Graph), captured at the second call
        self.graphed = True  # whether later calls replay their work as a CUDA graph (else queue it call by call)

    def _size_operands(self) -> None:
        """The pages' index type (``_index``), each page's packed uploads' bytes (``_packed_bytes``) and the
        largest (``_operand_bytes``)."""
        self._index = index_dtype(self.a, self.b)  # every page's too: they are cut from A and B in their types
        self._packed_bytes = [p.packed_offsets(self._index, self.dtype)[1] for _, _, p in self._operands]
        self._operand_bytes = max(self._packed_bytes, default=0)

    def _pin(self) -> None:
        """Page-lock every page's packed uploads (:meth:`~tuner.spgemm.outer_product.Prepared.packed`) in
        place, once: a page's operands then go up in one copy at PCIe's rate (from pageable memory, one copy
        an array at a tenth of it). They stay pageable where they would take over a quarter of the free
        host memory or the system refuses to lock them."""
        if self._pins is not None:
            return
        self._pins = []
        if sum(self._packed_bytes) > available_bytes() // PIN_SHARE:
            return
        try:
            self._pins = [gpu.Pinned(p.packed(self._index, self.dtype)[0]) for _, _, p in self._operands]
        except gpu.GpuError:  # a memlock limit, say: the copies run from pageable memory
            self._pins = []

    def _block_capacity(self) -> int:
        """Partial entries one assembly block holds: their pairs, sorted and reduced, as a page's take room,
        in what the budget leaves beside the largest page's operands (a block's memory is held, as the
        call's :class:`~tuner.spgemm.outer_product.Arena`, while each page's operands are)."""
        room = self.budget_bytes - self._operand_bytes
        return max(int(room // (SORT_COPIES * (8 + self.dtype.itemsize))), 1)

    def _make_store(self, keys: list[np.ndarray]) -> None:
        """After the first call, what later calls move values alone with (:class:`_Steady`): the pages'
        partials block-major in page-locked memory (:class:`PartialStore`, from the first call's keys, which
        it lets go of as it copies them) and C's values page-locked, device memory for one page's operands
        and for one step's sums (:class:`~tuner.spgemm.outer_product.Arena`, the heaviest page's or
        block's), a stream and the host's events. None where the pages' uploads are not page-locked, where
        the locked arrays would take over a quarter of the free host memory or the system refuses to lock
        them: every call then runs as the first."""
        self._stored = True
        vs, nnz = self.dtype.itemsize, int(self._structure.indptr[-1])
        if not self._pins or sum(k.size for k in keys) * (8 + vs) + nnz * vs > available_bytes() // PIN_SHARE:
            return
        try:
            self._store = PartialStore(keys, block_rows(self._structure, self.shape[0]), self.shape[1], self.dtype)
            c_values = gpu.Pinned(np.empty(nnz, self.dtype))
        except gpu.GpuError:  # a memlock limit, say: the partials stay in pageable memory
            self._store = None
            return
        bits, capacity = key_bits(self.shape), self._block_capacity()
        steps = [p.table.products for _, _, p in self._operands]
        steps += [int(n) for n in np.diff(self._store.starts) if n <= capacity]
        arena = Arena(max((Arena.need(n, vs, self._page._temp_bytes(ctypes.c_longlong(n), bits)) for n in steps if n),
                          default=1))
        device_blocks = sum(1 for block in self._structure.blocks if _on_device(block, capacity))
        self._steady = _Steady(arena, gpu.alloc_pooled(max(self._operand_bytes, 1)), c_values,
                               gpu.Stream(blocking=False), [gpu.GraphEvent() for _ in range(device_blocks + 1)])
        self.peak_bytes = max(self.peak_bytes, arena.nbytes + self._operand_bytes)

    def _record(self, capturing: bool) -> None:
        """Queue a later call's device work on the steady state's stream (into the CUDA graph being captured
        there, where ``capturing``): each page's packed operands up into the held operand memory, its
        expansion sorted and summed in the arena and its sums down into their blocks' places in the store;
        the first event; then each device-summed block's run of keys and values up, summed in the arena and
        its sums down into C's page-locked values, an event after each."""
        steady, page, vs = self._steady, self._page, self.dtype.itemsize
        for i, (a, b, prepared) in enumerate(self._operands):
            page.rebind(a, b, prepared, pinned=True, into=int(steady.operands), stream=steady.stream)
            page.pair_values(self._store.pieces[i], steady.arena, steady.stream)
        steady.events[0].record(steady.stream, capturing)
        host, capacity, k = steady.c_values.array.ctypes.data, self._block_capacity(), 1
        for block, (keys, values) in zip(self._structure.blocks, self._store.slices):
            if _on_device(block, capacity):
                at, added = block[3], block[4]
                sums = page.merge_values(keys, values, steady.arena, steady.stream)
                gpu.queue_downloads(sums, [(host + vs * at, 0, vs * added)], steady.stream)
                steady.events[k].record(steady.stream, capturing)
                k += 1

    def _values_call(self) -> sp.csr_matrix:
        """A call after the first: the device work (:meth:`_record`) replayed as one CUDA graph (captured at
        the first such call; queued call by call where :attr:`graphed` is off or the capture fails), while
        the host copies C's pattern, then each block's values out of the page-locked C as its event passes."""
        steady, vs = self._steady, self.dtype.itemsize
        t = time.perf_counter()
        steady.stream.wait(gpu.default_event())  # after what the caller queued on the default stream
        if self.graphed and self._graph is None:
            try:
                self._graph = gpu.Graph(steady.stream, lambda: self._record(capturing=True))
            except gpu.GpuError:  # a driver without capture of this work: queued call by call from now on
                self.graphed = False
        if self._graph is not None:
            self._graph.launch(steady.stream)
        else:
            self._record(capturing=False)
        pattern = _pattern_copies(self._structure)
        events, pool, copies = iter(steady.events[1:]), shared_pool(), []
        self.blocks = 0

        def device_block(keys, values, at, added, vals):
            self.blocks += 1
            next(events).synchronize()
            part = max(1 << 18, -(-added // STAGE_THREADS))
            copies.extend(copy_in_parts(pool, vals[at:at + added], steady.c_values.array[at:at + added], part))

        def finish():
            for done in copies:
                done.result()

        if self.timed:
            steady.events[0].synchronize()
            self.seconds["pages"] = time.perf_counter() - t
        c = assemble_values(self._structure, self._store.slices, self.shape, self.dtype, self._block_capacity(),
                            device_block, finish, steady.events[0].synchronize, pattern)
        if self.timed:
            self.seconds["assemble"] = time.perf_counter() - t - self.seconds["pages"]
        partials = self._store.keys.size
        self.up_bytes = sum(self._packed_bytes) + partials * (8 + vs)
        self.down_bytes = partials * vs + c.nnz * vs
        return c

    def explain(self) -> str:
        """Why slotted pages, how many, and each page size's predicted seconds."""
        plan = getattr(self, "plan", None)
        if plan is None:
            return f"slotted_page: {self.pages.pages} pages of up to {self.pages.page_entries:,} entries"
        sizes = ", ".join(f"{e:,}: {t * 1e3:.2f} ms" for e, t in sorted(plan.predicted_s.items()))
        return (f"slotted_page: {plan.reason}\nheaviest page needs {plan.heaviest_need_bytes:,} bytes of "
                f"{plan.budget_bytes:,}; predicted by page size (entries): {sizes}")

    def _pages(self) -> list[tuple[CanonicalMatrix, CanonicalMatrix, Prepared]]:
        """Every page's operands over its own slots (:func:`~tuner.formats.slotted_pages.page_operands`), in
        the product's types, with the outer product's host work on them done once (:func:`prepare`)."""
        o = self.ops
        # A pattern's values are counted as ones and scaled after.
        a_values = o.a_values if o.a_values is not None else np.ones(o.a_rows.size, self.dtype)
        b_values = o.b_values if o.b_values is not None else np.ones(o.b_cols.size, self.dtype)
        out = []
        for p in range(self.pages.pages):
            a, b = page_operands(self.pages, p, o.a_colptr, o.a_rows, a_values, o.b_rowptr, o.b_cols, b_values,
                                 self.shape)
            a = canonicalize(a.tocsr(), self.dtype, self.a.index_dtype)
            b = canonicalize(b, self.dtype, self.b.index_dtype)
            if not self.value_free:  # a page whose values happen to be equal still runs the valued kernels
                a, b = (dataclasses.replace(m, pattern_value=None) for m in (a, b))
            out.append((a, b, prepare(a, b, self.params)))
        return out

    def _set_values(self, a: CanonicalMatrix, b: CanonicalMatrix) -> None:
        self.a, self.b = a, b
        self.ops = operands(a, b)
        self._operands = self._pages()
        self._size_operands()
        self._pins = self._graph = None  # the graph names the old operands' page-locked arrays

    def __call__(self, A=None, B=None, out: str = "scipy"):
        if out != "scipy":
            raise ValueError("a slotted-page product assembles C in host memory: it has no out='device' "
                             "(its working set is over the device-memory budget)")
        if A is not None or B is not None:
            self._new_values(A, B)
        self.seconds = {}
        if self._operands:
            self._pin()  # once, and again after new values
        # Once the first call has found C's structure and made the steady state, calls move and sum values
        # alone (the keys and C's pattern stay the same).
        c = self._values_call() if self._steady is not None and self._pins else self._first_call()
        if self.value_free and self.pattern_value != 1:  # the pages counted ones (a pass over C saved at 1)
            c.data *= self.dtype.type(self.pattern_value)
        return c

    def _first_call(self) -> sp.csr_matrix:
        """Every page's partial product down (keys and values), C assembled from them in row blocks on the
        device, C's structure kept and the steady state made for later calls (:meth:`_make_store`)."""
        t = time.perf_counter()
        vs = self.dtype.itemsize
        self.up_bytes = self.down_bytes = 0
        keys, values = [], []
        page = self._page
        for a, b, prepared in self._operands:  # one set of kernels, loaded once, for every page
            if page is None:
                page = self._page = OuterProduct(a, b, self.params, self.cache, prepared, pinned=bool(self._pins))
            else:
                page.rebind(a, b, prepared, pinned=bool(self._pins))
            k, v = page.pairs()
            keys.append(k)
            values.append(v)
            self.down_bytes += k.nbytes + v.nbytes
            self.up_bytes += sum(x.nbytes for m in (a, b)
                                 for x in (m.indptr, m.indices) + (() if m.value_free else (m.data,)))
            self.peak_bytes = max(self.peak_bytes, page.peak_bytes)
        if page is not None:
            page.release()  # the last page's operands: the blocks need the kernels alone
        if self.timed:
            gpu.synchronize()
        t2 = time.perf_counter()
        capacity = self._block_capacity()
        device_merge = page.merge_block if page is not None else host_merge(self.shape[1])  # no pages: no entries
        self.blocks = 0

        def merge(*block):
            self.blocks += 1
            return device_merge(*block)
        partials = sum(k.size for k in keys)
        record = []
        c = assemble(keys, values, self.shape, self.dtype, capacity, merge, None, record)
        self.down_bytes += c.nnz * (8 + vs)
        self.up_bytes += partials * (8 + vs)
        self.peak_bytes = max(self.peak_bytes, int(min(partials, capacity) * SORT_COPIES * (8 + vs)))
        if not self._stored:  # the keys and C's pattern are the same at every call: kept for the next
            self._structure = Structure(c.indptr.copy(), c.indices.copy(), tuple(record))
            del values
            self._make_store(keys)
        if self.timed:
            self.seconds["pages"] = t2 - t
            self.seconds["assemble"] = time.perf_counter() - t2
        return c
