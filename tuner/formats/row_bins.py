"""Rows of C = A B grouped by how large a hash table each needs (the row_hash family's layout).

Gustavson's algorithm builds row i of C from the rows of B that row i of A names. The symbolic phase counts
each row's distinct columns in a hash table sized by its products (an upper bound on them), the numeric phase
accumulates values in one sized by that exact count. Rows are binned by table size so that each bin runs
with its own geometry: small tables several rows to a block in shared memory, large ones a block each, and
rows beyond the largest shared table in tables of their own in global memory. Rows whose entries fill a fair
share of C's columns take a dense accumulator instead (a bitmap over a span of columns, with a value per column
in the numeric phase): it costs a bit set per product and a pass over the span's bitmap words, with no probing,
no table to clear and no sort, so it is cheaper than a hash table as soon as the bitmap has no more words than
the table would have slots. The same binning runs on the GPU for the numeric phase (``bin`` in
``templates/row_hash.cu.j2``); this is its NumPy reference.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def row_products(a_indptr: np.ndarray, a_indices: np.ndarray, b_rowptr: np.ndarray) -> np.ndarray:
    """Scalar products of each row of C = A B: the sum of B's row lengths over the columns of A's row (int64).

    Example:
        >>> row_products(np.array([0, 2, 2, 3]), np.array([0, 1, 1]), np.array([0, 3, 5])).tolist()
        [5, 0, 2]
    """
    per_entry = np.diff(np.asarray(b_rowptr, np.int64))[a_indices]
    ends = np.zeros(per_entry.size + 1, np.int64)
    np.cumsum(per_entry, out=ends[1:])
    return np.diff(ends[np.asarray(a_indptr, np.int64)])


def table_size(counts: np.ndarray, load: float, n_cols: int) -> np.ndarray:
    """Slots of each row's hash table: the power of two holding ``counts / load`` keys, at least 32 and at
    most the power of two covering every column (there the hash is the identity: no collisions, no probing).

    Example:
        >>> table_size(np.array([1, 40, 100, 10**6]), 0.5, 5000).tolist()
        [32, 128, 256, 8192]
    """
    need = np.maximum(np.ceil(np.asarray(counts, np.float64) / load), 32).astype(np.int64)
    cap = 1 << max(int(n_cols) - 1, 1).bit_length()
    return np.minimum(1 << np.ceil(np.log2(need)).astype(np.int64), max(cap, 32))


NEVER_DENSE = np.iinfo(np.int64).max


def dense_from(n_cols: int, ratio: float, minimum: int) -> int:
    """The smallest count (distinct columns, or products bounding them) from which a row of C takes a dense
    accumulator: ``minimum``, and at least ``n_cols / ratio`` so that the span's bitmap holds at most
    ``ratio / 32`` words per entry; ``ratio`` 0 turns the dense accumulator off.

    Example:
        >>> dense_from(81306, 64.0, 1024), dense_from(10**7, 64.0, 1024), dense_from(100, 0.0, 1) == NEVER_DENSE
        (1271, 156250, True)
    """
    if ratio <= 0:
        return int(NEVER_DENSE)
    return int(max(minimum, 1, -(-int(n_cols) // ratio)))


@dataclass(frozen=True)
class RowBins:
    """Non-empty rows grouped by how they are accumulated.

    Attributes:
        rows: row indices, bin after bin (int64); within a shared or global bin in ascending order here, in any
            order on the GPU; the dense bin heaviest first (its rows are a block each: the heavy ones start
            first so that none is left running alone at the end).
        starts: bin b holds ``rows[starts[b]:starts[b + 1]]``: the shared-table bins, then the global-memory
            bin, then the dense bin.
        tables: shared-memory table slots of each shared bin.
        global_tables: slots of each global-bin row's own table.
        global_offsets: where each global-bin row's table starts in the pool (slots; one past the end last).
    """

    rows: np.ndarray
    starts: np.ndarray
    tables: tuple[int, ...]
    global_tables: np.ndarray
    global_offsets: np.ndarray

    def bin(self, b: int) -> np.ndarray:
        return self.rows[self.starts[b]:self.starts[b + 1]]

    @property
    def global_rows(self) -> np.ndarray:
        return self.bin(len(self.tables))

    @property
    def dense_rows(self) -> np.ndarray:
        return self.bin(len(self.tables) + 1)


def caps(tables: tuple[int, ...], load: float) -> np.ndarray:
    """The largest count each shared table takes at load factor ``load``.

    Example:
        >>> caps((32, 64), 0.5).tolist()
        [16, 32]
    """
    return np.floor(np.asarray(tables, np.float64) * load).astype(np.int64)


def bin_rows(counts: np.ndarray, tables: tuple[int, ...], load: float, n_cols: int,
             dense: int = NEVER_DENSE) -> RowBins:
    """Bin each row with a positive count: from ``dense`` on (see :func:`dense_from`) into the dense bin, else
    into the smallest shared table that holds it at ``load``, or into the global bin, whose rows get tables of
    :func:`table_size`.

    Example:
        >>> b = bin_rows(np.array([3, 0, 20, 5000, 9, 900]), (32, 64), 0.5, 10**6, dense=800)
        >>> b.rows.tolist(), b.starts.tolist(), b.global_tables.tolist(), b.global_offsets.tolist()
        ([0, 4, 2, 3, 5], [0, 2, 3, 3, 5], [], [0])
    """
    counts = np.asarray(counts, np.int64)
    limits = caps(tables, load)
    which = np.searchsorted(limits, counts, side="left")  # first table whose cap >= count; len(tables): global
    which[counts >= dense] = len(tables) + 1
    which[counts == 0] = len(tables) + 2  # empty rows: no bin
    # Heaviest first within the dense bin (bins ascend, rows too, but for the dense bin's descending counts).
    order = np.lexsort((np.where(which == len(tables) + 1, -counts, 0), which))
    starts = np.searchsorted(which[order], np.arange(len(tables) + 3)).astype(np.int64)
    rows = order[:starts[-1]].astype(np.int64)
    glob = rows[starts[-3]:starts[-2]]
    sizes = table_size(counts[glob], load, n_cols)
    offsets = np.zeros(sizes.size + 1, np.int64)
    np.cumsum(sizes, out=offsets[1:])
    return RowBins(rows=rows, starts=starts, tables=tuple(tables), global_tables=sizes, global_offsets=offsets)


def product_by_bins(bins: RowBins, a_indptr, a_indices, a_values, b_rowptr, b_cols, b_values, shape):
    """C = A B computed bin by bin from the built arrays, rows gathered exactly as the kernels take them:
    the NumPy evaluation the tests hold the layout to (CSR arrays, columns ascending in each row).

    Example:
        >>> ip, ix, v = np.array([0, 1, 2]), np.array([1, 0]), np.array([2.0, 3.0])
        >>> b = bin_rows(row_products(ip, ix, ip), (32,), 1.0, 2)
        >>> [x.tolist() for x in product_by_bins(b, ip, ix, v, ip, ix, v, (2, 2))]
        [[0, 1, 2], [0, 1], [6.0, 6.0]]
    """
    n_rows, n_cols = shape
    parts = []
    for b in range(len(bins.starts) - 1):
        rows = bins.bin(b)
        lengths = np.diff(np.asarray(a_indptr, np.int64))[rows]
        entries = np.repeat(np.asarray(a_indptr, np.int64)[rows], lengths) + (
            np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths))
        k = a_indices[entries]
        b_len = np.diff(np.asarray(b_rowptr, np.int64))[k]
        at = np.repeat(np.asarray(b_rowptr, np.int64)[k], b_len) + (
            np.arange(b_len.sum()) - np.repeat(np.cumsum(b_len) - b_len, b_len))
        row = np.repeat(np.repeat(rows, lengths), b_len)
        value = np.repeat(a_values[entries], b_len) * b_values[at]
        parts.append((row * n_cols + b_cols[at], value))
    keys = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, np.int64)
    values = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0)
    unique, inverse = np.unique(keys, return_inverse=True)
    sums = np.zeros(unique.size, values.dtype)
    np.add.at(sums, inverse, values)
    indptr = np.zeros(n_rows + 1, np.int64)
    np.cumsum(np.bincount(unique // n_cols, minlength=n_rows), out=indptr[1:])
    return indptr, unique % n_cols, sums


def split_rows(rows: np.ndarray, a_indptr: np.ndarray, products: np.ndarray, per_item: int):
    """Cut each row of ``rows`` (global-bin rows, by position) into items of about ``per_item`` products,
    A's entries shared evenly among a row's items (at least one entry each); returns (slot, begin, end) of
    every item: its row's position in ``rows`` and its range of A's entries.

    Example:
        >>> s, b, e = split_rows(np.array([7, 2]), np.array([0, 0, 0, 10, 10, 10, 10, 10, 16]),
        ...                      np.array([0, 0, 50, 0, 0, 0, 0, 600]), 200)
        >>> s.tolist(), b.tolist(), e.tolist()
        ([0, 0, 0, 1], [10, 12, 14, 0], [12, 14, 16, 10])
    """
    indptr = np.asarray(a_indptr, np.int64)
    begin, end = indptr[rows], indptr[np.asarray(rows) + 1]
    parts = np.minimum(np.maximum(-(-np.asarray(products)[rows] // per_item), 1), np.maximum(end - begin, 1))
    slot = np.repeat(np.arange(len(rows), dtype=np.int64), parts)
    j = np.arange(parts.sum(), dtype=np.int64) - np.repeat(np.cumsum(parts) - parts, parts)
    length, k = (end - begin)[slot], parts[slot]
    return slot, begin[slot] + j * length // k, begin[slot] + (j + 1) * length // k
