"""Slotted pages of an outer-product SpGEMM, C = A B, for streaming through a device-memory budget (paper
001, MStream, sections 2.3 and 3).

A slot is an index k of the inner dimension: column k of A and row k of B, whose outer product is C's
share from k. In A's CSC arrays and B's CSR arrays consecutive slots are consecutive entries, so a page of
consecutive slots is one contiguous range of each: one copy per operand. A page holds at most
``page_entries`` entries (A's plus B's), so at most a quarter of a page squared scalar products: the page
size bounds each page's work. Light slots (at most half a page) are packed in order: a page takes the slots
that start within a window of a page less the largest light slot, so it holds at most a page.
A heavy slot gets pages of its own: one when it fits a page, else it is cut into large pages, A's column
into pieces with B's whole row when the row takes at most half a page (the other way round when the column
does), else both into halves of a page, every pair of pieces a page (paper 001's large pages: a crossbar
too large for one page spans several). Each page's outer products are a partial C; their sum is C.

Example (4 slots, the third of 8 x 2 entries; pages of at most 6 entries):
    >>> p = slotted_pages(np.array([0, 1, 2, 10, 11]), np.array([0, 1, 2, 4, 5]), 6)
    >>> p.slot_begin.tolist(), p.slot_end.tolist(), p.large.tolist(), p.products.tolist()
    ([0, 2, 2, 3], [2, 3, 3, 4], [False, True, True, False], [2, 8, 8, 1])
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp


@dataclass(frozen=True)
class SlottedPages:
    """Pages in slot order, each a contiguous range of A's CSC entries and of B's CSR entries.

    Attributes:
        slot_begin, slot_end: the slots [begin, end) a page covers (one slot for a large page).
        a_begin, a_end: its range of A's CSC entries (a piece of the slot's column for a large page).
        b_begin, b_end: its range of B's CSR entries (a piece of the slot's row for a large page).
        large: whether the page holds part of one heavy slot.
        products: the page's scalar products (int64): the work of its partial C.
        page_entries: the most entries a page holds.
        max_products: the most products a page of several light slots holds (None: entries alone).
    """

    slot_begin: np.ndarray
    slot_end: np.ndarray
    a_begin: np.ndarray
    a_end: np.ndarray
    b_begin: np.ndarray
    b_end: np.ndarray
    large: np.ndarray
    products: np.ndarray
    page_entries: int
    max_products: int | None = None

    @property
    def pages(self) -> int:
        return int(self.slot_begin.size)

    @property
    def entries(self) -> np.ndarray:
        """Entries each page copies (A's and B's)."""
        return (self.a_end - self.a_begin) + (self.b_end - self.b_begin)

    def skew(self) -> float:
        """The heaviest page's products over the mean page's: how unevenly the pages load the GPU (paper
        001's Observation 2: the page size sets it).

        Example:
            >>> slotted_pages(np.array([0, 1, 2, 10, 11]), np.array([0, 1, 2, 4, 5]), 6).skew()
            1.6842105263157894
        """
        return float(self.products.max() / self.products.mean()) if self.pages and self.products.any() else 1.0


def _pieces(length: np.ndarray, size: np.ndarray) -> np.ndarray:
    """How many pieces of at most ``size`` cut each ``length`` (at least one)."""
    return np.maximum(-(-length // np.maximum(size, 1)), 1)


def _fill_by_products(new: np.ndarray, before: np.ndarray, max_products: int) -> np.ndarray:
    """``new`` (where a page must start) with more starts, so that each page of several slots holds at most
    ``max_products`` products (``before``: the products of the slots before each slot, and of all of them
    last): from each start, a page takes slots while their products stay within the bound (a slot over it
    alone gets a page of its own). Every page between two given starts is filled in turn, all such stretches
    at once (a pass a page, not a slot).

    Example (slots of 3, 3, 3, 5, 1 products, bound 6; one stretch):
        >>> _fill_by_products(np.array([1, 0, 0, 0, 0], bool), np.array([0, 3, 6, 9, 14, 15]), 6).astype(int).tolist()
        [1, 0, 1, 1, 0]
    """
    at = np.flatnonzero(new)
    stop = np.append(at[1:], new.size)  # each stretch ends where the next given start is
    out = new.copy()
    bound = max(int(max_products), 1)
    while at.size:
        # the page from slot `at` ends before the first slot that would take it over the bound (at least one slot)
        end = np.maximum(np.searchsorted(before, before[at] + bound, side="right") - 1, at + 1)
        more = end < stop
        at, stop = end[more], stop[more]
        out[at] = True
    return out


def _light_starts(a_len: np.ndarray, b_len: np.ndarray, page: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(heavy, new, per_slot): which slots are heavy (over half a page), where a page starts before any bound
    on its products (where a heavy slot ends or begins, or where a slot starts in a new window), and the
    products of the slots before each slot (and of all of them last)."""
    entries = a_len + b_len
    heavy = entries > page // 2
    start = np.zeros(a_len.size, np.int64)
    np.cumsum(entries[:-1], out=start[1:])
    largest = int(entries[~heavy].max(initial=0))
    window = start // max(page - largest, 1)
    new = np.ones(a_len.size, dtype=bool)
    new[1:] = heavy[1:] | heavy[:-1] | (window[1:] != window[:-1])
    per_slot = np.zeros(a_len.size + 1, np.int64)
    np.cumsum(a_len * b_len, out=per_slot[1:])
    return heavy, new, per_slot


def _light_ranges(new: np.ndarray, heavy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The slots [begin, end) of each page of light slots, from where pages start (``new``)."""
    first = np.flatnonzero(new)
    last = np.append(first[1:], new.size)
    keep = ~heavy[first]
    return first[keep], last[keep]


def _heavy_cuts(ka: np.ndarray, kb: np.ndarray, page: int):
    """(fits, a_size, b_size, na, nb) of heavy slots of ``ka`` entries of A and ``kb`` of B: whether each fits
    a page, the pieces' sizes and counts (every pair of pieces a page)."""
    fits = ka + kb <= page
    half = max(page // 2, 1)
    a_size = np.where(fits, np.maximum(ka, 1), np.where(kb <= half, page - kb, np.where(ka <= half, ka, half)))
    b_size = np.where(fits, np.maximum(kb, 1), np.where(kb <= half, kb, np.where(ka <= half, page - ka, half)))
    return fits, a_size, b_size, _pieces(ka, a_size), _pieces(kb, b_size)


def page_count_floor(a_colptr: np.ndarray, b_rowptr: np.ndarray, page_entries: int) -> int:
    """The fewest pages :func:`slotted_pages` makes at ``page_entries`` whatever its ``max_products``,
    counted without making them: the light pages before any bound on their products (a bound only cuts
    them further) and every piece of a heavy slot, those with products alone. A heavy slot's pieces grow as
    the square of its length over the page: at the smallest pages of a power-law graph they are millions.

    Example (the module's example: pages of at most 6 entries):
        >>> page_count_floor(np.array([0, 1, 2, 10, 11]), np.array([0, 1, 2, 4, 5]), 6)
        4
    """
    a_colptr, b_rowptr = np.asarray(a_colptr, np.int64), np.asarray(b_rowptr, np.int64)
    a_len, b_len = np.diff(a_colptr), np.diff(b_rowptr)
    heavy, new, per_slot = _light_starts(a_len, b_len, int(page_entries))
    begin, end = _light_ranges(new, heavy)
    light = int(np.count_nonzero(per_slot[end] > per_slot[begin]))
    k = np.flatnonzero(heavy)
    ka, kb = a_len[k], b_len[k]
    *_, na, nb = _heavy_cuts(ka, kb, int(page_entries))
    return light + int((na * nb)[(ka > 0) & (kb > 0)].sum())


def slotted_pages(a_colptr: np.ndarray, b_rowptr: np.ndarray, page_entries: int,
                  max_products: int | None = None) -> SlottedPages:
    """The pages of C = A B for A's column pointer and B's row pointer (see the module docstring); pages
    without products are left out. ``page_entries`` must be at least 2 (a page holds an entry of each).
    ``max_products``: a page of several light slots also holds at most this many products (pages filled in
    order), so that pages of a device-memory budget carry like work (a light slot of more products still
    gets a page to itself, bounded by its entries).

    Example (one slot of 10 x 2: a column cut in pieces of 4 beside the whole row):
        >>> p = slotted_pages(np.array([0, 10]), np.array([0, 2]), 6)
        >>> p.a_begin.tolist(), p.a_end.tolist(), p.products.tolist()
        ([0, 4, 8], [4, 8, 10], [8, 8, 4])
    """
    page = int(page_entries)
    if page < 2:
        raise ValueError(f"a page must hold at least 2 entries (one of A and one of B), got {page}")
    a_colptr, b_rowptr = np.asarray(a_colptr, np.int64), np.asarray(b_rowptr, np.int64)
    if a_colptr.size != b_rowptr.size:
        raise ValueError(f"A has {a_colptr.size - 1} columns but B has {b_rowptr.size - 1} rows: they must agree")
    a_len, b_len = np.diff(a_colptr), np.diff(b_rowptr)
    heavy, new, per_slot = _light_starts(a_len, b_len, page)
    if max_products:
        new = _fill_by_products(new, per_slot, int(max_products))
    light_begin, light_end = _light_ranges(new, heavy)
    light_products = per_slot[light_end] - per_slot[light_begin]
    # Heavy slots: one page when they fit, else pieces of A's column and of B's row, every pair a page.
    k = np.flatnonzero(heavy)
    ka, kb = a_len[k], b_len[k]
    fits, a_size, b_size, na, nb = _heavy_cuts(ka, kb, page)
    count = na * nb
    slot = np.repeat(k, count)
    j = np.arange(int(count.sum()), dtype=np.int64) - np.repeat(np.cumsum(count) - count, count)
    ia, ib = j // np.repeat(nb, count), j % np.repeat(nb, count)
    sa, sb = np.repeat(a_size, count), np.repeat(b_size, count)
    a_lo = a_colptr[slot] + ia * sa
    a_hi = np.minimum(a_lo + sa, a_colptr[slot + 1])
    b_lo = b_rowptr[slot] + ib * sb
    b_hi = np.minimum(b_lo + sb, b_rowptr[slot + 1])
    begin = np.concatenate([light_begin, slot])
    order = np.argsort(begin, kind="stable")  # slot order: a heavy slot's pages in their cut order
    out = dict(
        slot_begin=begin, slot_end=np.concatenate([light_end, slot + 1]),
        a_begin=np.concatenate([a_colptr[light_begin], a_lo]), a_end=np.concatenate([a_colptr[light_end], a_hi]),
        b_begin=np.concatenate([b_rowptr[light_begin], b_lo]), b_end=np.concatenate([b_rowptr[light_end], b_hi]),
        large=np.concatenate([np.zeros(light_begin.size, bool), ~np.repeat(fits, count)]),
        products=np.concatenate([light_products, (a_hi - a_lo) * (b_hi - b_lo)]))
    out = {name: x[order] for name, x in out.items()}
    has = out["products"] > 0
    return SlottedPages(**{name: x[has] for name, x in out.items()}, page_entries=page, max_products=max_products)


def page_operands(pages: SlottedPages, p: int, a_colptr, a_rows, a_values, b_rowptr, b_cols, b_values,
                  shape: tuple[int, int]) -> tuple[sp.csc_matrix, sp.csr_matrix]:
    """Page ``p``'s share of A and of B over its own slots, as the page's copies hold them: A's columns of
    the page's slots and B's rows of them, each slot's entries clipped to the page's ranges, built from those
    ranges alone (``shape``: C's).

    Example:
        >>> cp, r, v = np.array([0, 2]), np.array([0, 1]), np.array([1.0, 2.0])
        >>> pages = slotted_pages(cp, np.array([0, 1]), 2)
        >>> [m.toarray().tolist() for m in page_operands(pages, 1, cp, r, v, np.array([0, 1]), np.array([0]),
        ...                                                    np.array([3.0]), (2, 1))]
        [[[0.0], [2.0]], [[3.0]]]
    """
    n_rows, n_cols = shape
    k0, k1 = int(pages.slot_begin[p]), int(pages.slot_end[p])
    a0, a1, b0, b1 = (int(x[p]) for x in (pages.a_begin, pages.a_end, pages.b_begin, pages.b_end))
    colptr = np.clip(np.asarray(a_colptr[k0:k1 + 1], np.int64), a0, a1) - a0
    rowptr = np.clip(np.asarray(b_rowptr[k0:k1 + 1], np.int64), b0, b1) - b0
    a = sp.csc_matrix((a_values[a0:a1], a_rows[a0:a1], colptr), shape=(n_rows, k1 - k0))
    b = sp.csr_matrix((b_values[b0:b1], b_cols[b0:b1], rowptr), shape=(k1 - k0, n_cols))
    return a, b


def product_by_pages(pages: SlottedPages, a_colptr, a_rows, a_values, b_rowptr, b_cols, b_values,
                     shape: tuple[int, int]) -> sp.csr_matrix:
    """C = A B as the sum of every page's partial product, each computed from the page's ranges alone: the
    NumPy (SciPy) evaluation the tests hold the pages to.

    Example:
        >>> A = sp.random(30, 20, density=0.3, format="csc", random_state=1)
        >>> B = sp.random(20, 25, density=0.3, format="csr", random_state=2)
        >>> pages = slotted_pages(A.indptr, B.indptr, 8)
        >>> C = product_by_pages(pages, A.indptr, A.indices, A.data, B.indptr, B.indices, B.data, (30, 25))
        >>> bool(abs(C - A @ B).max() < 1e-12), pages.pages > 10
        (True, True)
    """
    parts = []
    for p in range(pages.pages):
        a, b = page_operands(pages, p, a_colptr, a_rows, a_values, b_rowptr, b_cols, b_values, shape)
        parts.append((a @ b).tocoo())
    dtype = np.result_type(a_values, b_values)
    if not parts:
        return sp.csr_matrix(shape, dtype=dtype)
    rows, cols, vals = (np.concatenate([getattr(c, f) for c in parts]) for f in ("row", "col", "data"))
    return sp.coo_matrix((vals.astype(dtype), (rows, cols)), shape=shape).tocsr()  # duplicates summed
