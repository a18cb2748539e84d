"""Rows of a matrix split among P ranks by bitonic partitioning (paper 003, section 3.4).

Rows are sorted by weight (their length, or the model's predicted time), heaviest first, and dealt to the
ranks P at a time, the direction reversed every round: the rank that got the heaviest row of one round gets
the lightest of the next. Each rank ends with the same number of rows (within one), which balances the
vector each gathers, and about the same weight, which balances its product.

A rank's rows are also its slots of x gathered from every rank. Ordered by decreasing degree (``order_by``),
each rank's part of the gathered x starts with its hot entries, so a rank's kernel reads x as the one-GPU
plan relabelled by degree does: from few cached sectors, with no permutation of x or y per product.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..formats.xp import host


@dataclass(frozen=True)
class RowPartition:
    """Which rank owns which rows.

    Attributes:
        parts: the number of ranks.
        owner: the rank of every row.
        rows: each rank's rows in the order of its slots (int64): ascending, or by decreasing ``order_by``.
        weight: each rank's total weight.
    """

    parts: int
    owner: np.ndarray
    rows: tuple
    weight: np.ndarray

    @property
    def order(self) -> np.ndarray:
        """Every row, rank after rank: the order of a vector gathered from the ranks' parts."""
        return np.concatenate(self.rows) if self.rows else np.zeros(0, np.int64)

    @property
    def width(self) -> int:
        """Rows of the largest part: every rank's slice of a gathered vector is this long (NCCL's all-gather
        moves equal counts), the shorter ones padded at their end."""
        return max((r.size for r in self.rows), default=0)

    def slots(self) -> np.ndarray:
        """Where each row sits in a vector gathered from equal-length (padded) parts: owner x width + its
        place among its rank's rows.

        Example:
            >>> bitonic_partition(np.array([5, 1, 9]), 2).slots().tolist()  # rank 0: row 2; rank 1: rows 0, 1
            [2, 3, 0]
        """
        if self.parts == 1:
            return np.arange(self.owner.size, dtype=np.int64)
        slot = np.empty(self.owner.size, np.int64)
        for r, rows in enumerate(self.rows):
            slot[rows] = r * self.width + np.arange(rows.size, dtype=np.int64)
        return slot

    def position(self) -> np.ndarray:
        """Where each row sits in :attr:`order` (the inverse permutation)."""
        where = np.empty(self.owner.size, np.int64)
        where[self.order] = np.arange(self.owner.size, dtype=np.int64)
        return where


def whole_partition(rows: int, weight: float) -> RowPartition:
    """One rank dealt all ``rows`` in order, of total ``weight``: :func:`bitonic_partition`'s one part, made
    without its per-row weights (a one-GPU product needs none of them counted).

    Example:
        >>> p = whole_partition(3, 7.0)
        >>> p.rows[0].tolist(), p.owner.tolist(), p.weight.tolist()
        ([0, 1, 2], [0, 0, 0], [7.0])
    """
    return RowPartition(parts=1, owner=np.zeros(rows, np.int64), rows=(np.arange(rows, dtype=np.int64),),
                        weight=np.array([weight]))


def bitonic_partition(weights: np.ndarray, parts: int, order_by: np.ndarray | None = None, xp=np) -> RowPartition:
    """Deal the rows to ``parts`` ranks in bitonic order of their ``weights`` (ties by row index); each
    rank's rows ascending, or by decreasing ``order_by`` (ties by row index) where given and ``parts`` > 1.
    ``xp``: the module the sorts, scatters and picks run in (CuPy: on the GPU, seconds sooner for 100M
    rows); the partition, on the host, is the same either way.

    Example:
        >>> p = bitonic_partition(np.array([5, 1, 9, 3, 7, 2]), 2)
        >>> [r.tolist() for r in p.rows], p.weight.tolist()  # 9, 7 | 5, 3 reversed | 2, 1
        ([[2, 3, 5], [0, 1, 4]], [14.0, 13.0])
        >>> p.order.tolist(), p.position().tolist()
        ([2, 3, 5, 0, 1, 4], [3, 4, 0, 1, 5, 2])
        >>> [r.tolist() for r in bitonic_partition(np.array([5, 1, 9, 3, 7, 2]), 2, order_by=np.arange(6)).rows]
        [[5, 3, 2], [4, 1, 0]]
    """
    weights = np.asarray(weights)
    if weights.ndim != 1:
        raise ValueError(f"weights must be one per row (1-D), got shape {weights.shape}")
    if not isinstance(parts, (int, np.integer)) or parts < 1:
        raise ValueError(f"parts must be a positive integer, got {parts!r}")
    if np.any(weights < 0) or not np.all(np.isfinite(weights)):
        raise ValueError("row weights must be finite and non-negative")
    if parts == 1:  # one rank deals itself every row, in order: nothing to sort, pick or count
        return whole_partition(weights.size, float(weights.sum(dtype=np.float64)))
    if order_by is not None:
        order_by = np.asarray(order_by)
        if order_by.shape != weights.shape:
            raise ValueError(f"order_by must be one per row like the weights {weights.shape}, got {order_by.shape}")
    # Every per-row step in xp (on the GPU: seconds of host scatters and gathers for 100M rows), the results
    # brought back once.
    order = _by_decreasing(weights, xp)  # heaviest first, ties by row index
    slot = xp.arange(weights.size, dtype=np.int64)
    rank_in_round, round_ = slot % parts, slot // parts
    owner = xp.empty(weights.size, np.int64)
    owner[order] = xp.where(round_ % 2 == 0, rank_in_round, parts - 1 - rank_in_round)
    del slot, rank_in_round, round_, order
    if order_by is None:
        rows = tuple(host(xp.flatnonzero(owner == r)) for r in range(parts))
    else:
        # One stable sort by decreasing key, then each rank's rows picked from it in that order.
        by_key = _by_decreasing(order_by, xp)
        rank_of = owner[by_key]
        rows = tuple(host(by_key[rank_of == r]) for r in range(parts))
        del by_key, rank_of
    weight = np.bincount(host(owner), weights=weights.astype(np.float64), minlength=parts)
    return RowPartition(parts=int(parts), owner=host(owner), rows=rows, weight=weight)


def square_partition(row_lengths: np.ndarray, col_lengths: np.ndarray, parts: int, xp=np) -> RowPartition:
    """The bitonic partition of a square matrix's rows balanced by their lengths, each rank's rows as the
    one-GPU plan's relabelling by degree orders them (by row + column length), those whose column is empty
    (x that no row reads: a graph's dangling nodes) after every other, where a gather can leave them out.

    Example (row 1's column is empty: last on its rank):
        >>> [r.tolist() for r in square_partition(np.array([1, 1, 1]), np.array([2, 0, 1]), 2).rows]
        [[0], [2, 1]]
    """
    key = np.asarray(row_lengths).astype(np.int64) + col_lengths
    key += (int(key.max(initial=0)) + 1) * (np.asarray(col_lengths) > 0)
    return bitonic_partition(row_lengths, parts, order_by=key, xp=xp)


def _by_decreasing(values: np.ndarray, xp) -> np.ndarray:
    """Indices by decreasing ``values``, ties by index: a stable sort of the negated values (integers stay
    integers, exact; floats as float64)."""
    keys = -(values.astype(np.int64) if np.issubdtype(values.dtype, np.integer) else values.astype(np.float64))
    if xp is np:
        return np.argsort(keys, kind="stable")
    return xp.argsort(xp.asarray(keys))  # CuPy's sort is stable

