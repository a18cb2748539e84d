"""The model's view of a kernel: its warps in launch order, each with a workload and a table to look up.

Paper 003 models a kernel as rectangular workloads (w columns x h rows), one per warp. Our kernels give
each row a group of G lanes, so a warp holds 32/G rows: it is looked up in the table by its longest row
(its groups run in lockstep, so that sets its shape) and charged the entries it really streams (lanes of
shorter rows idle and load nothing); a row handled by a whole block is split over the block's warps.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..families.base import shared_layout
from ..families.binned import BinnedParams
from ..families.csr_vector import CsrVectorParams
from ..matrix import CanonicalMatrix
from .profile_data import kernel_key

WARP = 32


@dataclass(frozen=True)
class WarpSegment:
    """Consecutive warps of one launch that share a table.

    Attributes:
        key: profile table of their kernel shape.
        w: row length each warp is looked up with (its longest row; a block row's full length).
        size: entries each warp streams.
    """

    key: str
    w: np.ndarray
    size: np.ndarray
    ident: tuple = ()
    lanes: int = WARP  # lanes cooperating on one row (a whole block for block rows)


def group_warps(lengths: np.ndarray, group: int, key: str) -> WarpSegment:
    """Warps of G-lane groups over rows of ``lengths`` in order: 32/G rows per warp, shaped by the longest.

    Example:
        >>> s = group_warps(np.array([1, 5, 2, 2, 7]), group=16, key="k")
        >>> s.w.tolist(), s.size.tolist()
        ([5.0, 2.0, 7.0], [6.0, 4.0, 7.0])
    """
    rows_per_warp = WARP // group
    n = lengths.size
    padded = np.zeros(-(-n // rows_per_warp) * rows_per_warp, dtype=np.int64)
    padded[:n] = lengths
    rows = padded.reshape(-1, rows_per_warp)
    return WarpSegment(key, rows.max(axis=1).astype(np.float64), rows.sum(axis=1).astype(np.float64))


def block_warps(lengths: np.ndarray, block: int, key: str) -> WarpSegment:
    """Warps of rows handled by a whole block each: block/32 warps per row sharing its entries.

    Example:
        >>> s = block_warps(np.array([640]), block=64, key="k")
        >>> s.w.tolist(), s.size.tolist()
        ([640.0, 640.0], [320.0, 320.0])
    """
    per_row = block // WARP
    w = np.repeat(lengths.astype(np.float64), per_row)
    return WarpSegment(key, w, np.ceil(w / per_row))


def class_lengths(m: CanonicalMatrix, lo: int, hi: int | None) -> np.ndarray:
    """Lengths of the rows with lo <= length < hi, in row order (the order the kernels visit them)."""
    L = m.row_lengths
    if lo <= 0 and hi is None:
        return L
    keep = L >= lo if hi is None else (L >= lo) & (L < hi)
    return L[keep]


def _segment(m: CanonicalMatrix, lo: int, hi: int | None, group, block: int, family: str) -> WarpSegment:
    # Candidates share classes and lane counts: each (class, lanes) is built once per matrix.
    key = kernel_key(family, group, block, m.value_free)
    ident = (lo, hi, group, block if group == "block" else 0)
    base = shared_layout(m, ("warps",) + ident, lambda: (
        block_warps(class_lengths(m, lo, hi), block, "") if group == "block"
        else group_warps(class_lengths(m, lo, hi), group, "")))
    return WarpSegment(key, base.w, base.size, ident, block if group == "block" else group)


def csr_vector_warps(m: CanonicalMatrix, p: CsrVectorParams) -> list[WarpSegment]:
    return [_segment(m, 0, None, p.threads_per_row, p.block_size, "csr_vector")]


def binned_warps(m: CanonicalMatrix, p: BinnedParams) -> list[WarpSegment]:
    # The binned layout keeps row order inside a class, so a class's warps are those of its rows in order.
    huge = p.huge_min
    return [_segment(m, 0, p.small_max, 1, p.block_size, "binned"),
            _segment(m, p.small_max, p.medium_max, p.medium_lanes, p.block_size, "binned"),
            _segment(m, p.medium_max, huge, WARP, p.block_size, "binned"),
            _segment(m, huge if huge is not None else np.iinfo(np.int64).max, None, "block", p.block_size, "binned")]


WARP_MODELS = {"csr_vector": csr_vector_warps, "binned": binned_warps}
