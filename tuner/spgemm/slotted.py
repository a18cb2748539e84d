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
the partials' keys and C's pattern are the same at every call: the second call keeps them
(:class:`~tuner.spgemm.assemble.Structure`) and later calls move values alone, the pages' partial values
down without waiting for each page, the kept keys with the new values up to the blocks, C's values down.

The page size is the model's: among powers of two whose heaviest page fits the budget (:func:`page_need`),
light slots sharing a page up to what the budget holds (:func:`pages_at`: pages of like work, each about a
budget's worth, so a product a few times its budget takes few pages), the one with the lowest predicted
time, each page predicted by the outer_product model (its fixed cost and rates, :mod:`tuner.model.spgemm`)
plus its copies at the H100's page-locked rates (:data:`H2D_GBS`, :data:`D2H_GBS`; a call's uploads come
from the pages' arrays, page-locked in place at the first call, its partials back into page-locked arrays
from the second call on).
Larger pages pay the per-page fixed cost fewer times and send back fewer partial entries (a page sums its
own duplicates); the budget bounds them. The prediction includes the assembly of C from the partials.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from .. import gpu
from ..cache import Cache
from ..formats.slotted_pages import SlottedPages, page_operands, slotted_pages
from ..matrix import CanonicalMatrix, canonicalize
from ..memory import available_bytes, check_fits
from ..staging import copy_in_parts
from ..model import spgemm as model
from .assemble import Structure, assemble, assemble_values, host_merge
from .base import DeviceMemoryError, Product
from .outer_product import OuterProduct, OuterProductParams, Prepared, operands, prepare

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
        predicted_s: predicted seconds of a call at each page size that fits (page entries -> s).
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
    """Predicted seconds of a repeated call over ``pages`` (the first two also bring the keys and C's
    columns down): each page's outer product by the model (its fixed cost included) with at most min(its
    products, nnz(C)) entries, its operands up and those partial entries' values down; then the assembly of
    C (:mod:`tuner.spgemm.assemble`): the partial entries (8-byte key and value) up again, sorted and summed
    at the outer product's rate per product, in blocks of what ``budget_bytes`` holds (each a fixed cost;
    None: one block), and C's nnz(C) values down.

    Example:
        >>> p = slotted_pages(np.array([0, 2, 4]), np.array([0, 2, 4]), 4)
        >>> s = model.ProductStats(4, 4, 8, 8.0, 0, 0, 4, 4, 4, 0)
        >>> r = model.Rates({"outer:fixed": 0.5}, 0.005, "test")
        >>> round(predict_pages(p, s, r, 1.0, 1.0), 9)   # 3 calls of 0.5 ms; pages 64 B up, 32 down; C 96 up, 32 down
        0.001500224
    """
    entry = stats.col_bytes + stats.value_bytes
    pair = 8 + stats.value_bytes  # a partial entry: its (row, column) key and value
    # outer_product's prediction is linear in a page's products, entries of C and slots: its coefficients
    # from unit pages, then every page at once.
    def at(products=0, nnz=0.0, pairs=0):
        page = model.ProductStats(stats.n_rows, stats.n_cols, products, nnz, 0, 0, stats.value_bytes,
                                  stats.col_bytes, stats.key_bits, 0, pairs=pairs)
        return model.predict("outer_product", page, rates)
    fixed = at()
    per_product, per_entry, per_slot = at(products=1) - fixed, at(nnz=1.0) - fixed, at(pairs=1) - fixed
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


def host_bytes(pages: SlottedPages, nnz_c: float, value_bytes: int) -> int:
    """Host bytes a call holds at once: every page's partial product (at most min(its products, nnz(C))
    entries of an 8-byte key and a value), C (a 32-bit column and a value an entry) with one block's
    download (nnz(C) entries at most), and the columns of C that later calls keep (:class:`Structure`).

    Example (two pages of 4 products, 6 entries in C, float64):
        >>> host_bytes(slotted_pages(np.array([0, 2, 4]), np.array([0, 2, 4]), 4), 6.0, 8)  # 128 + 144 + 24
        296
    """
    partials = float(np.minimum(pages.products, nnz_c).sum())
    return int(partials * (8 + value_bytes) + 2 * nnz_c * (4 + value_bytes) + 4 * nnz_c)


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
    fits, smallest = {}, None
    size = SMALLEST_PAGE
    while True:
        pages, heaviest = pages_at(a_colptr, b_rowptr, size, budget_bytes, a.n_rows, vb, ib)
        smallest = heaviest if smallest is None else min(smallest, heaviest)
        if heaviest <= budget_bytes:
            fits[size] = (pages, heaviest, predict_pages(pages, stats, rates, budget_bytes=budget_bytes))
        if size >= total:
            break
        size *= 2
    if not fits:
        raise DeviceMemoryError(f"C = A B in slotted pages: the smallest pages ({SMALLEST_PAGE:,} entries) need "
                                f"{smallest:,} bytes of device memory, the budget is {budget_bytes:,}")
    best = min(fits, key=lambda e: fits[e][2])
    pages, heaviest, _ = fits[best]
    plan = SlottedPlan(best, pages.pages, int(budget_bytes), heaviest, {e: round(v[2], 6) for e, v in fits.items()},
                       reason or f"{pages.pages} pages of up to {best:,} entries, the lowest predicted time")
    return plan, pages


def _pattern_copies(structure: Structure, threads: int = 8):
    """Start copying C's row pointer and columns from ``structure`` on host threads (beside the call's device
    work; C's new arrays are faulted in on many cores, not one); the returned function waits for them and
    returns (indptr, indices)."""
    from concurrent.futures import ThreadPoolExecutor
    copies = [(np.empty_like(x), x) for x in (structure.indptr, structure.indices)]
    part = max(1 << 20, -(-structure.indices.size // threads))
    pool = ThreadPoolExecutor(threads)
    futures = [done for dst, src in copies for done in copy_in_parts(pool, dst, src, part)]
    pool.shutdown(wait=False)

    def wait() -> tuple[np.ndarray, np.ndarray]:
        for f in futures:
            f.result()
        return copies[0][0], copies[1][0]
    return wait


class SlottedProduct(Product):
    """C = A B streamed page by page through a device-memory budget (see the module docstring); a call
    returns C as a SciPy CSR matrix (it is not kept on the GPU: ``out='device'`` is refused). ``seconds``
    after a timed call: 'pages' (each page's copies and kernels and its partial product back) and 'assemble'
    (the partials summed on the device in blocks of rows, C assembled); ``peak_bytes``: the most device
    memory a page or a block held; ``up_bytes``, ``down_bytes``: what the last call copied to the GPU (the
    pages' operands, then the partials) and back (the partials, then C); ``blocks``: the row blocks the last
    call summed on the device. ``budget_bytes``: what a block of the assembly may hold (default: what the
    heaviest page needs).

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
        self._pins = None  # every page's uploads page-locked in place, at the first call
        self._partials = None  # every page's partial product, page-locked, from the second call on
        self._ring = None  # the assembly's page-locked download buffers (gpu.DownloadRing), with the partials
        self._page = None  # the outer product's kernels, loaded at the first call, rebound to each page
        self._structure = None  # C's pattern and row blocks, found by the first call over page-locked partials

    def _pin(self, index_dtype) -> None:
        """Page-lock every page's uploads in place, once (copies from locked memory run at PCIe's rate,
        from pageable memory at a tenth of it); they stay pageable where they would take over a quarter of
        the free host memory or the system refuses to lock them."""
        if self._pins is not None:
            return
        arrays = [x for _, _, prepared in self._operands
                  for x in prepared.uploads(index_dtype, self.dtype).values() if x is not None]
        self._pins = []
        if sum(x.nbytes for x in arrays) > available_bytes() // PIN_SHARE:
            return
        try:
            self._pins = [gpu.Pinned(x) for x in arrays]
        except gpu.GpuError:  # a memlock limit, say: the copies run from pageable memory
            self._pins = []

    def _block_capacity(self) -> int:
        """Partial entries one assembly block holds: their pairs, sorted and reduced, as a page's take room."""
        return max(int(self.budget_bytes // (SORT_COPIES * (8 + self.dtype.itemsize))), 1)

    def _partial_buffers(self, sizes: list[int]) -> None:
        """Page-locked host arrays for every page's partial product (keys and values; their sizes are the
        structures', known after the first call), once: the pages' partials come down into them and go back
        up, block by block, at PCIe's rate instead of a tenth of it; and the assembly's two download buffers
        of a block's columns and values each (:class:`~tuner.gpu.DownloadRing`), through which a block's
        part of C arrives while the next block is summed. Neither where together they would take over a
        quarter of the free host memory or the system refuses to lock them."""
        self._partials, self._ring = [], None
        slot = self._block_capacity() * (8 + self.dtype.itemsize)  # C's column (at most 8 bytes) and value
        if sum(sizes) * (8 + self.dtype.itemsize) + 2 * slot > available_bytes() // PIN_SHARE:
            return
        try:
            self._partials = [(gpu.Pinned(np.empty(n, np.uint64)), gpu.Pinned(np.empty(n, self.dtype)))
                              for n in sizes]
            self._ring = gpu.DownloadRing(slot)
        except gpu.GpuError:  # a memlock limit, say: the partials stay in pageable memory
            self._partials, self._ring = [], None

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
        self._pins = None

    def __call__(self, A=None, B=None, out: str = "scipy"):
        if out != "scipy":
            raise ValueError("a slotted-page product assembles C in host memory: it has no out='device' "
                             "(its working set is over the device-memory budget)")
        if A is not None or B is not None:
            self._new_values(A, B)
        self.seconds = {}
        t = time.perf_counter()
        self.up_bytes = self.down_bytes = 0
        # From the second call on the pages' partials come into page-locked arrays; once a call has found C's
        # structure there, later calls move and sum values alone (the keys and C's pattern stay the same).
        structure = self._structure if self._partials else None
        pattern = _pattern_copies(structure) if structure is not None else None
        keys, values = [], []
        page = self._page
        for i, (a, b, prepared) in enumerate(self._operands):  # one set of kernels, loaded once, for every page
            if page is None:
                page = self._page = OuterProduct(a, b, self.params, self.cache, prepared)
            else:
                page.rebind(a, b, prepared, pinned=bool(self._pins))
            if i == 0:
                self._pin(page.index_dtype)  # once, and again after new values
            if structure is not None:
                k, v = self._partials[i][0].array, self._partials[i][1].array
                page.pair_values(v)  # queued: the host goes on to the next page
                self.down_bytes += v.nbytes
            else:
                k, v = page.pairs((self._partials[i][0].array, self._partials[i][1].array) if self._partials else None)
                self.down_bytes += k.nbytes + v.nbytes
            keys.append(k)
            values.append(v)
            self.up_bytes += sum(x.nbytes for m in (a, b)
                                 for x in (m.indptr, m.indices) + (() if m.value_free else (m.data,)))
            self.peak_bytes = max(self.peak_bytes, page.peak_bytes)
        if self.timed:
            gpu.synchronize()
        t2 = time.perf_counter()
        capacity = self._block_capacity()
        ring = self._ring if page is not None else None
        device_merge = page.merge_block if page is not None else host_merge(self.shape[1])  # no pages: no entries
        self.blocks = 0

        def merge(*block):
            self.blocks += 1
            if ring is None:
                return device_merge(*block)
            return device_merge(*block, ring=ring, pinned=True)  # the ring comes with page-locked partials

        def merge_values(*block):
            self.blocks += 1
            page.merge_values(*block, ring=ring)
        finish = ring.finish if ring is not None else None
        if structure is not None:
            c = assemble_values(structure, keys, values, self.shape, self.dtype, capacity, merge_values, finish,
                                gpu.synchronize, pattern())
            self.down_bytes += c.nnz * self.dtype.itemsize
        else:
            record = [] if self._partials else None
            c = assemble(keys, values, self.shape, self.dtype, capacity, merge, finish, record)
            if record is not None:  # found over page-locked partials: later calls keep these keys
                self._structure = Structure(c.indptr.copy(), c.indices.copy(), tuple(record))
            self.down_bytes += c.nnz * (8 + self.dtype.itemsize)
        partials = sum(k.size for k in keys)
        self.up_bytes += partials * (8 + self.dtype.itemsize)
        self.peak_bytes = max(self.peak_bytes, int(min(partials, capacity) * SORT_COPIES * (8 + self.dtype.itemsize)))
        if page is not None:
            page.release()  # its last operands' device copies; the kernels stay for the next call
        if self._partials is None:  # once the first call's partials are let go: never both at once
            sizes = [k.size for k in keys]
            del keys, values
            self._partial_buffers(sizes)
        if self.value_free and self.pattern_value != 1:  # the pages counted ones (a pass over C saved at 1)
            c.data *= self.dtype.type(self.pattern_value)
        if self.timed:
            self.seconds["pages"] = t2 - t
            self.seconds["assemble"] = time.perf_counter() - t2
        return c

