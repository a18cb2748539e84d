"""ALIGNED_COO's runtime-cost equations and layout choice (paper 004, section IV-D, Algorithm 3).

Pure functions over row lengths. The layout builder (:mod:`tuner.formats.aligned_coo`) holds Algorithm 1;
:func:`choose_hybrid` is Algorithm 3, the paper's way of picking hybrid, all-seg or all-flat. The costs are
in the paper's abstract units (instruction steps), good only for comparing the three layouts with each
other: the planner ranks the ``aligned_coo`` family's layouts by the lookup model like every other
candidate, and ``report`` shows how often Algorithm 3 picks the layout that measures fastest.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..formats.aligned_coo import Segmentation, segment_size  # noqa: F401 (Algorithm 1, re-exported)

WARP_SIZE = 32
WARP_SCHEDULE_TIME = 1.0  # the paper leaves it symbolic; one step per scheduled warp


def cost_coo_flat(nnz: int, max_threads: int, blocksize: int) -> float:
    """T(COO_flat): iterations x log2(warp) + (nnz mod warp) + blocks x log2(blocksize) + warps x schedule.

    Example:
        >>> cost_coo_flat(nnz=64, max_threads=32, blocksize=32)
        22.0
    """
    if nnz <= 0:
        return 0.0
    active = min(max_threads, nnz)
    warps = math.ceil(nnz / WARP_SIZE)
    iterations = math.ceil(nnz / active)
    blocks = math.ceil(nnz / blocksize)
    return float(iterations * math.log2(WARP_SIZE) + nnz % WARP_SIZE + blocks * math.log2(blocksize)
                 + warps * WARP_SCHEDULE_TIME)


def cost_aligned_coo_seg(seg_size: int, segments: int, max_threads: int) -> float:
    """T(Aligned_COO_seg): iterations x segments + warps x schedule, with the paper's max(...) for the
    active threads as printed.

    Example:
        >>> cost_aligned_coo_seg(seg_size=4, segments=3, max_threads=32)
        4.0
    """
    if seg_size <= 0:
        return 0.0
    active = max(seg_size, max_threads)
    warps = math.ceil(active / WARP_SIZE)
    iterations = math.ceil(seg_size / active)
    return float(iterations * segments + warps * WARP_SCHEDULE_TIME)


@dataclass(frozen=True)
class HybridChoice:
    """Output of Algorithm 3: which layout and the three costs it compared."""

    layout: str  # 'hybrid', 'seg' or 'flat'
    hybrid_cost: float
    seg_cost: float
    flat_cost: float


def choose_hybrid(row_lengths: np.ndarray, max_threads: int, blocksize: int = 256) -> HybridChoice:
    """Algorithm 3 of paper 004: hybrid (warp-multiple parts flat, trailing entries seg), all-seg or all-flat.

    The paper keeps the hybrid unless it costs at least as much as both others (then all-seg); its second
    test, as printed, would pick all-flat exactly when flat costs the most, which we read as a slip: the
    cheapest layout is taken, ties going to hybrid, then seg.

    Example (Fig. 2: every row shorter than a warp, so the hybrid's flat part is empty):
        >>> c = choose_hybrid(np.array([3, 1, 2, 2, 1, 1]), max_threads=32)
        >>> c.layout, c.hybrid_cost, c.seg_cost, c.flat_cost
        ('hybrid', 4.0, 4.0, 24.0)
    """
    L = np.asarray(row_lengths, dtype=np.int64)
    trail = L % WARP_SIZE
    flat_nz = int((L - trail).sum())
    seg_part = segment_size(trail)
    whole = segment_size(L)
    hybrid = (cost_aligned_coo_seg(seg_part.seg_size, seg_part.num_segs, max_threads)
              + cost_coo_flat(flat_nz, max_threads, blocksize))
    seg = cost_aligned_coo_seg(whole.seg_size, whole.num_segs, max_threads)
    flat = cost_coo_flat(int(L.sum()), max_threads, blocksize)
    layout = min((hybrid, 0, "hybrid"), (seg, 1, "seg"), (flat, 2, "flat"))[2]
    return HybridChoice(layout, hybrid, seg, flat)
