"""C from the partial products of slotted pages, summed on the device in blocks of rows.

Each page of an outer-product SpGEMM leaves its partial C as sorted, distinct (row, column) keys
(row * n_cols + column) and their sums; pages overlap in C, so C is their sum. Summing them as CSR matrices
in host memory merges every entry about log2(pages) times on one core, which takes most of a call. Here C's
rows are cut into blocks whose partial entries, over all pages, fit the device-memory budget
(:func:`row_blocks`); each block's slices of the pages' keys and values (:func:`block_slices`) go to the
GPU, where CUB's radix sort and reduction by key sum them (the outer product's own merge: ``merge_block``),
and the block's CSR comes back. A row whose partial entries alone exceed the budget is summed in host memory
(:func:`sum_pairs`). Everything here but ``merge_block`` is host code on NumPy arrays.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from ..matrix import csr_on

# Candidate boundaries of a first cut of C's rows; cells over the capacity are cut again. Joining cells into
# blocks leaves at most one cell's entries (1/GRID of them all) unused in a block: blocks/GRID of a block's
# room, 2 % where a budget cuts ten blocks; each boundary costs a binary search in every page's keys.
GRID = 512


def _counts(page_keys: list[np.ndarray], bounds: np.ndarray, n_cols: int) -> np.ndarray:
    """Partial entries, over all pages, of each row range between consecutive ``bounds``."""
    keys = bounds.astype(np.uint64) * np.uint64(n_cols)
    total = np.zeros(bounds.size - 1, np.int64)
    for k in page_keys:
        total += np.diff(np.searchsorted(k, keys))
    return total


def row_blocks(page_keys: list[np.ndarray], n_rows: int, n_cols: int, capacity: int,
               grid: int = GRID) -> list[tuple[int, int, int]]:
    """(first row, end row, partial entries) of consecutive row blocks covering C's rows, each holding at most
    ``capacity`` partial entries over all pages (``page_keys``: each page's sorted keys), or one row alone
    where that row holds more.

    Example (two pages' keys of a 4 x 10 C: rows 0, 0, 1, 3 and 0, 2, 3, 3):
        >>> pages = [np.array([1, 5, 12, 31], np.uint64), np.array([2, 25, 30, 33], np.uint64)]
        >>> row_blocks(pages, 4, 10, capacity=3)
        [(0, 1, 3), (1, 3, 2), (3, 4, 3)]
    """
    if capacity < 1:
        raise ValueError(f"capacity must be at least one entry, got {capacity}")
    bounds = _grid(0, n_rows, grid)
    while True:  # cut every cell over the capacity finer, down to single rows
        counts = _counts(page_keys, bounds, n_cols)
        over = np.flatnonzero((counts > capacity) & (np.diff(bounds) > 1))
        if over.size == 0:
            break
        bounds = np.unique(np.concatenate([bounds] + [_grid(bounds[i], bounds[i + 1], grid) for i in over]))
    # Consecutive cells joined while they fit together: from each block's first cell, the last cell whose
    # running total stays within the capacity (a single row over it stands alone).
    total = np.concatenate(([0], np.cumsum(counts)))
    blocks: list[tuple[int, int, int]] = []
    i, cells = 0, counts.size
    while i < cells:
        j = i + 1 if counts[i] > capacity else int(np.searchsorted(total, total[i] + capacity, side="right")) - 1
        blocks.append((int(bounds[i]), int(bounds[j]), int(total[j] - total[i])))
        i = j
    return blocks


def _grid(r0: int, r1: int, grid: int) -> np.ndarray:
    """Up to ``grid`` + 1 evenly spaced row boundaries from ``r0`` to ``r1``, both included."""
    return np.unique(np.linspace(r0, r1, min(r1 - r0, grid) + 1).astype(np.int64))


def block_slices(page_keys: list[np.ndarray], page_values: list[np.ndarray], rows: np.ndarray,
                 n_cols: int) -> list[tuple[list[np.ndarray], list[np.ndarray]]]:
    """Each page's keys and values (views, no copies) of each block of rows ``rows[b]`` to ``rows[b + 1]``:
    one binary search per page for every block's bounds at once.

    Example:
        >>> [(k[0].tolist(), v[0].tolist()) for k, v in
        ...  block_slices([np.array([1, 5, 12, 31], np.uint64)], [np.arange(4.0)], np.array([0, 1, 3, 4]), 10)]
        [([1, 5], [0.0, 1.0]), ([12], [2.0]), ([31], [3.0])]
    """
    bounds = np.asarray(rows, np.int64).astype(np.uint64) * np.uint64(n_cols)
    cuts = [np.searchsorted(k, bounds) for k in page_keys]
    return [([k[c[b]:c[b + 1]] for k, c in zip(page_keys, cuts)],
             [v[c[b]:c[b + 1]] for v, c in zip(page_values, cuts)]) for b in range(bounds.size - 1)]


@dataclass(frozen=True)
class BlockLayout:
    """Where every page's partial entries go in a block-major store of them all: row block by row block
    (:func:`row_blocks`), and within a block page by page, each page's slice in its key order (the order in
    which :func:`block_slices` lists a block's slices, so a block's merge sums the same sequence).

    Attributes:
        starts: the store's first entry of each block, and its size last (blocks + 1 entries).
        pieces: per page, (store entry, page entry, entries) of each of its non-empty block slices.
    """

    starts: np.ndarray
    pieces: tuple


def block_layout(page_keys: list[np.ndarray], rows: np.ndarray, n_cols: int) -> BlockLayout:
    """The :class:`BlockLayout` of the pages' sorted keys ``page_keys`` cut into blocks of rows ``rows[b]``
    to ``rows[b + 1]``: one binary search per page for every block's bounds at once.

    Example (two pages' keys of a 4 x 10 C, blocks of rows 0-1 and 2-3):
        >>> layout = block_layout([np.array([1, 5, 31], np.uint64), np.array([2, 25, 30], np.uint64)],
        ...                       np.array([0, 2, 4]), 10)
        >>> layout.starts.tolist(), layout.pieces
        ([0, 3, 6], (((0, 0, 2), (3, 2, 1)), ((2, 0, 1), (4, 1, 2))))
    """
    bounds = np.asarray(rows, np.int64).astype(np.uint64) * np.uint64(n_cols)
    cuts = np.array([np.searchsorted(k, bounds) for k in page_keys], np.int64).reshape(len(page_keys), bounds.size)
    counts = np.diff(cuts, axis=1)
    starts = np.concatenate(([0], np.cumsum(counts.sum(axis=0)))).astype(np.int64)
    store = starts[:-1] + np.cumsum(counts, axis=0) - counts  # each block's pages one after another
    return BlockLayout(starts, tuple(tuple((int(store[i, b]), int(cuts[i, b]), int(counts[i, b]))
                                           for b in np.flatnonzero(counts[i])) for i in range(len(page_keys))))


def sum_pairs(keys: list[np.ndarray], values: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The distinct keys of all ``keys`` arrays, ascending, and the sums of their values, in host memory.

    Example:
        >>> k, v = sum_pairs([np.array([3, 7], np.uint64), np.array([3, 4], np.uint64)], [np.ones(2), np.ones(2)])
        >>> k.tolist(), v.tolist()
        ([3, 4, 7], [2.0, 1.0, 1.0])
    """
    k = np.concatenate(keys) if keys else np.zeros(0, np.uint64)
    v = np.concatenate(values) if values else np.zeros(0)
    order = np.argsort(k, kind="stable")
    k, v = k[order], v[order]
    if k.size == 0:
        return k, v
    starts = np.flatnonzero(np.concatenate(([True], k[1:] != k[:-1])))
    return k[starts], np.add.reduceat(v, starts)


def csr_of_pairs(keys: np.ndarray, values: np.ndarray, r0: int, r1: int, n_cols: int) -> tuple[np.ndarray, ...]:
    """(row starts of rows [r0, r1) relative to the block's first entry, columns, values) of a block's
    distinct sorted keys (the host's counterpart of the device's CSR kernels).

    Example:
        >>> [a.tolist() for a in csr_of_pairs(np.array([12, 15, 27], np.uint64), np.arange(3.0), 1, 3, 10)]
        [[0, 2], [2, 5, 7], [0.0, 1.0, 2.0]]
    """
    rows = np.arange(r0, r1, dtype=np.uint64) * np.uint64(n_cols)
    return np.searchsorted(keys, rows), (keys % np.uint64(n_cols)).astype(np.int64), values


@dataclass(frozen=True)
class Structure:
    """C's pattern and its row blocks as an assembly found them. The pages' partials of a product have the
    same keys at every call (its structures are fixed), so C's pattern and the blocks are too: a later call
    sums and moves values alone (:func:`assemble_values`).

    Attributes:
        indptr, indices: C's row pointer and columns (copies of their own: a caller may change its C).
        blocks: per row block (first row, end row, partial entries, C's first entry of it, its entries).
    """

    indptr: np.ndarray
    indices: np.ndarray
    blocks: tuple


def assemble(page_keys: list[np.ndarray], page_values: list[np.ndarray], shape: tuple[int, int], dtype,
             capacity: int, merge_block, finish=None, record: list | None = None) -> sp.csr_matrix:
    """C = the sum of the pages' partial products (each page: sorted distinct keys and their values) as a
    SciPy CSR matrix. ``merge_block(keys, values, r0, r1, cols, vals)`` sums one block's slices (lists of
    arrays, at most ``capacity`` entries in all), writes the result's columns and values to the front of
    ``cols`` and ``vals`` (C's arrays from the block's first entry on: no copy of C at the end) and returns
    its row starts relative to the block (:func:`host_merge` on the host); rows over the capacity alone, and
    rows without entries, are summed here. ``finish()``, where given, is called once every block has been
    merged, before C is made: a merge that leaves a block's columns and values to arrive in the background
    (the device's, while it sums the next block) returns once they all have. ``record``, where given, gets
    every block's tuple of :attr:`Structure.blocks`.

    Example (the host's merge):
        >>> pages = [np.array([1, 5, 12], np.uint64), np.array([5, 31], np.uint64)]
        >>> assemble(pages, [np.ones(3), np.ones(2)], (4, 10), np.float64, 2, host_merge(10)).toarray()[0].tolist()
        [0.0, 1.0, 0.0, 0.0, 0.0, 2.0, 0.0, 0.0, 0.0, 0.0]
    """
    n_rows, n_cols = shape
    partials = sum(int(k.size) for k in page_keys)
    index = np.int32 if max(partials, n_cols) <= np.iinfo(np.int32).max else np.int64
    # At most every partial entry: the pages the sums leave untouched are never mapped in.
    cols, vals = np.empty(partials, index), np.empty(partials, dtype)
    host = host_merge(n_cols)
    indptr = np.empty(n_rows + 1, index)
    nnz = 0
    blocks = row_blocks(page_keys, n_rows, n_cols, capacity)
    rows = np.array([r0 for r0, _, _ in blocks] + [n_rows], np.int64)
    try:
        for (r0, r1, count), (keys, values) in zip(blocks, block_slices(page_keys, page_values, rows, n_cols)):
            merge = host if count > capacity or count == 0 else merge_block  # one row over what the device holds
            starts, added = merge(keys, values, r0, r1, cols[nnz:], vals[nnz:])
            indptr[r0:r1] = np.asarray(starts) + nnz
            if record is not None:
                record.append((r0, r1, count, nnz, int(added)))
            nnz += added
    finally:  # no copy into C's arrays outlives the call, whether it returns C or raises
        if finish is not None:
            finish()
    indptr[-1] = nnz
    # C's arrays have room for every partial entry (mapped in only where written): kept as they are.
    c = csr_on(vals[:nnz], cols[:nnz], indptr, shape)
    c.has_sorted_indices = True
    return c


def host_merge(n_cols: int):
    """``merge_block`` of :func:`assemble` in host memory (:func:`sum_pairs`, :func:`csr_of_pairs`).

    Example:
        >>> cols, vals = np.empty(3, np.int32), np.empty(3)
        >>> starts, nnz = host_merge(10)([np.array([12, 15], np.uint64)], [np.ones(2)], 1, 3, cols, vals)
        >>> starts.tolist(), nnz, cols[:nnz].tolist()
        ([0, 2], 2, [2, 5])
    """
    def merge(keys, values, r0, r1, cols, vals):
        starts, c, v = csr_of_pairs(*sum_pairs(keys, values), r0, r1, n_cols)
        cols[:c.size], vals[:v.size] = c, v
        return starts, int(c.size)
    return merge


def block_rows(structure: Structure, n_rows: int) -> np.ndarray:
    """The first row of each of the structure's blocks, and ``n_rows`` last (:func:`block_slices`' ``rows``).

    Example:
        >>> block_rows(Structure(np.zeros(5), np.zeros(0), ((0, 2, 3, 0, 2), (2, 4, 1, 2, 1))), 4).tolist()
        [0, 2, 4]
    """
    return np.array([b[0] for b in structure.blocks] + [n_rows], np.int64)


def assemble_values(structure: Structure, slices: list, shape: tuple[int, int], dtype, capacity: int,
                    device_block, finish=None, before_host=None, pattern=None) -> sp.csr_matrix:
    """:func:`assemble` of partials whose keys are those ``structure`` was found from (the same product
    called again): ``slices`` holds each block's (keys, values) lists as :func:`block_slices` cuts them, or
    a block's whole run of a block-major store (:class:`BlockLayout`); each block's sums only:
    ``device_block(keys, values, at, added, vals)`` fills ``vals[at:at + added]`` with the sums of a block
    the device sums (or leaves them to arrive by ``finish()``), called in block order; blocks
    :func:`assemble` summed on the host (a row over the capacity) are summed here again, after
    ``before_host()`` (the partials' values may still be on their way; called once, at the first such
    block). ``pattern``: a function returning (indptr, indices) for C, called after the blocks, where a
    caller makes them beside them (default: copies of the structure's). ``finish`` as in :func:`assemble`.

    Example (the host's sums: pages' keys as :func:`assemble`'s example, new values):
        >>> pages = [np.array([1, 5, 12], np.uint64), np.array([5, 31], np.uint64)]
        >>> record = []
        >>> C = assemble(pages, [np.ones(3), np.ones(2)], (4, 10), np.float64, 2, host_merge(10), record=record)
        >>> s = Structure(C.indptr.copy(), C.indices.copy(), tuple(record))
        >>> def sums(keys, values, at, added, vals): vals[at:at + added] = sum_pairs(keys, values)[1]
        >>> cut = block_slices(pages, [np.full(3, 2.0), np.full(2, 3.0)], block_rows(s, 4), 10)
        >>> assemble_values(s, cut, (4, 10), np.float64, 2, sums).data.tolist()
        [2.0, 5.0, 2.0, 3.0]
    """
    nnz = int(structure.indptr[-1]) if structure.indptr.size else 0
    vals = np.empty(nnz, dtype)
    waited = False
    try:
        for (r0, r1, count, at, added), (keys, values) in zip(structure.blocks, slices):
            if count == 0 or added == 0:
                continue
            if count > capacity:  # one row over what the device holds: summed on the host, as the first time
                if before_host is not None and not waited:
                    before_host()
                    waited = True
                vals[at:at + added] = sum_pairs(keys, values)[1]
            else:
                device_block(keys, values, at, added, vals)
    finally:
        if finish is not None:
            finish()
    indptr, indices = pattern() if pattern is not None else (structure.indptr.copy(), structure.indices.copy())
    c = csr_on(vals, indices, indptr, shape)
    c.has_sorted_indices = True
    return c
