"""The workload table (WLT) of outer-product SpGEMM, C = A B (paper 000, lbGEMM, section 4, eq. 4).

The outer-product scheme multiplies column i of A by row i of B: every pair (i, i) whose column and row are
both non-empty is one thread block's work. Its workload is eq. 4,

    Workload_i = ceil(#A[:, i] / threads) x #B[i, :],

the rounds of the block's threads over A's column times the length of B's row each round walks. The table
lists the blocks sorted by decreasing workload, so that the heaviest start first and the light ones fill in
behind them (the paper's greedy balance over SMs). A column longer than ``split`` entries is cut into
blocks of at most ``split`` of its entries, each paired with the whole row of B, so that no block's work
exceeds what the others can balance.

Every count that can pass 2^31 (products, offsets into the expanded products) is int64.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class WorkloadTable:
    """Blocks of an outer-product SpGEMM in launch order (heaviest first).

    Attributes:
        pair: the k of each block: column k of A times row k of B (int64).
        a_start, a_stop: the block's slice of column k, as positions into A's CSC arrays (int64).
        workload: eq. 4 of each block, non-increasing (int64).
        offset: where the block's expanded products start in the product array: block b writes
            (a_stop - a_start) x #B[k, :] products from there (int64, an exclusive sum in launch order).
        products: the total number of expanded products (scalar products a_ik * b_kj), int64.
    """

    pair: np.ndarray
    a_start: np.ndarray
    a_stop: np.ndarray
    workload: np.ndarray
    offset: np.ndarray
    products: int

    @property
    def blocks(self) -> int:
        return int(self.pair.size)


def pair_products(a_col_lengths: np.ndarray, b_row_lengths: np.ndarray) -> np.ndarray:
    """Scalar products of each outer product: #A[:, k] x #B[k, :] (int64).

    Example:
        >>> pair_products(np.array([2, 0, 3]), np.array([4, 5, 1])).tolist()
        [8, 0, 3]
    """
    a = np.asarray(a_col_lengths, dtype=np.int64)
    b = np.asarray(b_row_lengths, dtype=np.int64)
    if a.shape != b.shape:
        raise ValueError(f"A has {a.size} columns but B has {b.size} rows: the inner dimensions must agree")
    return a * b


def workload_table(a_colptr: np.ndarray, b_rowptr: np.ndarray, threads: int, split: int) -> WorkloadTable:
    """The WLT of A B from A's CSC column pointer and B's CSR row pointer (O(inner dimension)).

    ``threads`` is the block size eq. 4 divides by; ``split`` the most entries of A's column one block
    takes. Blocks of equal workload keep the order of k (a stable sort), so the table is deterministic.

    Example:
        >>> t = workload_table(np.array([0, 2, 2, 7]), np.array([0, 3, 4, 5]), threads=2, split=4)
        >>> t.pair.tolist(), t.a_start.tolist(), t.a_stop.tolist(), t.workload.tolist()
        ([0, 2, 2], [0, 2, 6], [2, 6, 7], [3, 2, 1])
        >>> t.offset.tolist(), t.products
        ([0, 6, 10], 11)
    """
    if threads < 1 or split < 1:
        raise ValueError(f"threads and split must be at least 1, got {threads} and {split}")
    a_colptr = np.asarray(a_colptr, dtype=np.int64)
    b_rowptr = np.asarray(b_rowptr, dtype=np.int64)
    a_len = np.diff(a_colptr)
    b_len = np.diff(b_rowptr)
    live = np.flatnonzero(pair_products(a_len, b_len) > 0)
    pieces = -(-a_len[live] // split)  # blocks per live pair
    pair = np.repeat(live, pieces)
    first = np.cumsum(pieces) - pieces
    piece = np.arange(pair.size, dtype=np.int64) - np.repeat(first, pieces)
    a_start = a_colptr[pair] + piece * split
    a_stop = np.minimum(a_start + split, a_colptr[pair + 1])
    workload = -(-(a_stop - a_start) // threads) * b_len[pair]
    order = np.argsort(-workload, kind="stable")
    pair, a_start, a_stop, workload = pair[order], a_start[order], a_stop[order], workload[order]
    products = (a_stop - a_start) * b_len[pair]
    offset = np.cumsum(products) - products
    return WorkloadTable(pair=pair, a_start=a_start, a_stop=a_stop, workload=workload, offset=offset,
                         products=int(products.sum()))


def expand(table: WorkloadTable, a_rows: np.ndarray, a_values: np.ndarray | None, b_rowptr: np.ndarray,
           b_cols: np.ndarray, b_values: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every expanded product (row, column, value) at the position the kernel writes it, in NumPy.

    ``a_rows``/``a_values`` are A's CSC row indices and values, ``b_cols``/``b_values`` B's CSR column
    indices and values (None: a pattern operand, every value 1). Block b writes its products from
    ``table.offset[b]``, B's row outer and A's slice inner: a thread per entry of A's slice (the paper's
    mapping) then writes consecutive addresses with its neighbours for each entry of B's row. The CPU tests
    reduce this by (row, column) and compare with SciPy; the GPU expands the same arrays.

    Example:
        >>> t = workload_table(np.array([0, 1, 2]), np.array([0, 2, 3]), threads=32, split=32)
        >>> rows, cols, vals = expand(t, np.array([1, 0]), np.array([2., 3.]), np.array([0, 2, 3]),
        ...                           np.array([0, 1, 1]), np.array([5., 7., 11.]))
        >>> rows.tolist(), cols.tolist(), vals.tolist()
        ([1, 1, 0], [0, 1, 1], [10.0, 14.0, 33.0])
    """
    b_rowptr = np.asarray(b_rowptr, dtype=np.int64)
    b_len = np.diff(b_rowptr)[table.pair]
    a_len = table.a_stop - table.a_start
    per_block = a_len * b_len
    total = int(per_block.sum())
    block = np.repeat(np.arange(table.blocks), per_block)
    local = np.arange(total, dtype=np.int64) - np.repeat(table.offset, per_block)
    a_pos = table.a_start[block] + local % a_len[block]
    b_pos = b_rowptr[table.pair[block]] + local // a_len[block]
    values = np.ones(total) if a_values is None else np.asarray(a_values, dtype=np.float64)[a_pos]
    if b_values is not None:
        values = values * np.asarray(b_values, dtype=np.float64)[b_pos]
    return np.asarray(a_rows)[a_pos].astype(np.int64), np.asarray(b_cols)[b_pos].astype(np.int64), values


def merge(rows: np.ndarray, cols: np.ndarray, values: np.ndarray, shape: tuple[int, int]
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CSR (indptr, indices, data) of the expanded products summed by (row, column), in NumPy: what the
    device's sort on (row, column) keys and reduction by key compute.

    Example:
        >>> merge(np.array([1, 0, 1]), np.array([2, 1, 2]), np.array([1., 2., 3.]), (2, 3))
        (array([0, 1, 2]), array([1, 2]), array([2., 4.]))
    """
    keys = np.asarray(rows, dtype=np.int64) * shape[1] + np.asarray(cols, dtype=np.int64)
    unique, inverse = np.unique(keys, return_inverse=True)
    sums = np.bincount(inverse, weights=values, minlength=unique.size)
    indptr = np.searchsorted(unique, np.arange(shape[0] + 1, dtype=np.int64) * shape[1])
    return indptr.astype(np.int64), unique % shape[1], sums
