"""binned: node classes of paper 002 (sections V-B3, V-C, Table IV), each class with its own kernel.

Small rows (fewer than ``small_max`` entries) get one thread each, medium rows (fewer than ``medium_max``)
a fraction 1/``warp_division`` of a warp, large rows a whole warp or a whole block. The three kernels run as
one launch: the block index decides the class, so a matrix of small graphs pays one launch, not three.
The paper's rank cache (precomputed per-source contributions) becomes the value-free specialisation.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..formats.binned import BinnedFormat, build_binned, evaluate_binned
from ..matrix import CanonicalMatrix
from .base import Family, Launch, ceil_div, csr_arrays

SMALL_MAX = (4, 8)
MEDIUM_MAX = (16, 32, 96)
WARP_DIVISION = (4, 8)
LARGE_MODES = ("warp", "block")
BLOCK_SIZE = 256


@dataclass(frozen=True)
class BinnedParams:
    """Parameters of binned (Table IV of paper 002 spans small_max x medium_max x warp_division).

    Attributes:
        small_max: rows shorter than this are small (one thread per row).
        medium_max: rows shorter than this (and not small) are medium; the rest are large.
        warp_division: medium rows share a warp this many ways (32 / warp_division lanes per row).
        large_mode: 'warp' (one warp per large row) or 'block' (one block per large row).
        block_size: threads per block.
    """

    small_max: int = 8
    medium_max: int = 16
    warp_division: int = 8
    large_mode: str = "warp"
    block_size: int = BLOCK_SIZE

    def __post_init__(self):
        if not 1 <= self.small_max < self.medium_max:
            raise ValueError(f"need 1 <= small_max < medium_max, got {self.small_max}, {self.medium_max}")
        if self.warp_division not in (1, 2, 4, 8, 16, 32):
            raise ValueError(f"warp_division must be a power of two up to 32, got {self.warp_division}")
        if self.large_mode not in LARGE_MODES:
            raise ValueError(f"large_mode must be one of {LARGE_MODES}, got {self.large_mode!r}")
        if self.block_size % 32 or not 32 <= self.block_size <= 1024:
            raise ValueError(f"block_size must be a multiple of 32 in [32, 1024], got {self.block_size}")

    @property
    def medium_lanes(self) -> int:
        return 32 // self.warp_division


def space(m: CanonicalMatrix) -> list[BinnedParams]:
    """Table IV's grid plus the large-row mode; thresholds above the longest row add nothing and are cut."""
    longest = int(m.row_lengths.max()) if m.n_rows else 0
    out = []
    for s in SMALL_MAX:
        for md in MEDIUM_MAX:
            if md > s and (md == MEDIUM_MAX[0] or md <= longest):
                for w in WARP_DIVISION:
                    modes = LARGE_MODES if longest >= md else LARGE_MODES[:1]
                    out.extend(BinnedParams(s, md, w, mode) for mode in modes)
    return out


def layout_key(p: BinnedParams) -> tuple:
    return (p.small_max, p.medium_max)


def launch(m: CanonicalMatrix, p: BinnedParams) -> Launch:
    fmt = build_binned(m.row_lengths, p.small_max, p.medium_max, dtype=m.index_dtype)
    n_small, n_medium, n_large = fmt.counts
    small_blocks = ceil_div(n_small, p.block_size)
    medium_blocks = ceil_div(n_medium * p.medium_lanes, p.block_size)
    large_blocks = n_large if p.large_mode == "block" else ceil_div(n_large * 32, p.block_size)
    scalars = (("n_small", n_small), ("n_medium", n_medium), ("n_large", n_large),
               ("medium_block0", small_blocks), ("large_block0", small_blocks + medium_blocks))
    return Launch(arrays=csr_arrays(m) + (("row_ids", fmt.row_ids),), scalars=scalars,
                  grid=small_blocks + medium_blocks + large_blocks, block=p.block_size)


def context(m: CanonicalMatrix, p: BinnedParams) -> dict:
    return {"block_size": p.block_size, "medium_lanes": p.medium_lanes, "large_mode": p.large_mode}


def evaluate(m: CanonicalMatrix, built: Launch, x: np.ndarray) -> np.ndarray:
    arrays, scalars = dict(built.arrays), dict(built.scalars)
    counts = (scalars["n_small"], scalars["n_medium"], scalars["n_large"])
    # Thresholds are not needed to evaluate: the class boundaries are in the counts.
    fmt = BinnedFormat(row_ids=arrays["row_ids"], counts=counts, small_max=0, medium_max=0)
    return evaluate_binned(fmt, arrays["indptr"], arrays["indices"], arrays.get("data"), x, m.n_rows,
                           m.pattern_value if m.value_free else 1.0)


FAMILY = Family(name="binned", template="binned.cu.j2", params_type=BinnedParams, space=space,
                launch=launch, context=context, evaluate=evaluate, layout_key=layout_key)
