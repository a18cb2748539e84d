"""binned: node classes of paper 002 (sections V-B3, V-C, Table IV), each class with its own kernel.

Small rows (fewer than ``small_max`` entries) get one thread each, medium rows (fewer than ``medium_max``)
a 1/``warp_division`` share of a warp, large rows a whole warp (paper 002's Algorithm 3) and huge rows (at
least ``huge_min``) a whole block. The kernels run as one launch: the block index decides the class, so a
small graph pays one launch, not four. The paper's rank cache (precomputed per-source contributions)
becomes the value-free specialisation: pattern matrices never read values.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..formats.binned import BinnedFormat, build_binned, evaluate_binned
from ..formats.reorder import NONE, ORDERINGS
from ..matrix import CanonicalMatrix
from .base import (UNROLL, Family, Launch, check_launch, ceil_div, csr_arrays, device_csr_arrays, longest_row,
                   ordered_device_launch, ordered_launch, shared_layout)

SMALL_MAX = (4, 8)
MEDIUM_MAX = (16, 32, 96)
WARP_DIVISION = (4, 8)
HUGE_MIN = (1024, None)  # plus medium_max itself: every long row gets a block
BLOCK_SIZE = 256


@dataclass(frozen=True)
class BinnedParams:
    """Parameters of binned (Table IV of paper 002 spans small_max x medium_max x warp_division).

    Attributes:
        small_max: rows shorter than this are small (one thread per row).
        medium_max: rows shorter than this (and not small) are medium; longer ones are large or huge.
        warp_division: medium rows share a warp this many ways (32 / warp_division lanes per row).
        huge_min: rows at least this long get a whole block; None: no huge class (a warp per long row).
        block_size: threads per block.
        order: relabelling of rows and columns the kernel runs in ('none' or 'degree', see
            :mod:`tuner.formats.reorder`).
    """

    small_max: int = 8
    medium_max: int = 16
    warp_division: int = 8
    huge_min: int | None = None
    block_size: int = BLOCK_SIZE
    order: str = NONE

    def __post_init__(self):
        if not 1 <= self.small_max < self.medium_max:
            raise ValueError(f"need 1 <= small_max < medium_max, got {self.small_max}, {self.medium_max}")
        if self.huge_min is not None and self.huge_min < self.medium_max:
            raise ValueError(f"huge_min must be None or >= medium_max, got {self.huge_min}")
        if self.warp_division not in (1, 2, 4, 8, 16, 32):
            raise ValueError(f"warp_division must be a power of two up to 32, got {self.warp_division}")
        check_launch(self.block_size, self.order)

    @property
    def medium_lanes(self) -> int:
        return 32 // self.warp_division


def space(m: CanonicalMatrix) -> list[BinnedParams]:
    """Table IV's grid times the huge threshold, for every ordering; thresholds above the longest row add
    nothing and are cut."""
    longest = longest_row(m)
    out = []
    for s in SMALL_MAX:
        for md in MEDIUM_MAX:
            if md == MEDIUM_MAX[0] or md <= longest:
                huge = [h for h in (md, *HUGE_MIN) if h is None or (h >= md and h <= longest)]
                for w in WARP_DIVISION:
                    out.extend(BinnedParams(s, md, w, h) for h in dict.fromkeys(huge))
    return [BinnedParams(p.small_max, p.medium_max, p.warp_division, p.huge_min, p.block_size, o)
            for o in ORDERINGS for p in out]


def launch(m: CanonicalMatrix, p: BinnedParams) -> Launch:
    return ordered_launch(m, p.order, lambda b: _launch(b, p))


def _launch(m: CanonicalMatrix, p: BinnedParams) -> Launch:
    fmt = shared_layout(m, ("binned", p.small_max, p.medium_max, p.huge_min),
                        lambda: build_binned(m.row_lengths, p.small_max, p.medium_max, p.huge_min, m.index_dtype))
    return _classes_launch(csr_arrays(m), fmt, p)


def device_launch(m: CanonicalMatrix, p: BinnedParams) -> Launch:
    """:func:`launch` built on the GPU from the relabelled matrix's device arrays (its row lengths read
    from its row pointers there): the same arrays, as CuPy arrays."""
    def build(m, csr, col_lengths):
        fmt = build_binned(csr.indptr[1:] - csr.indptr[:-1], p.small_max, p.medium_max, p.huge_min, m.index_dtype)
        return _classes_launch(device_csr_arrays(csr), fmt, p)
    return ordered_device_launch(m, p.order, build)


def device_bytes(m: CanonicalMatrix) -> int:
    """Device memory :func:`device_launch` needs beyond the relabelled matrix: per row its length, its class,
    its place in the class's list (int64 each) and its id in the layout."""
    return (3 * 8 + 1 + m.index_dtype.itemsize) * (m.n_rows + 1)


def _classes_launch(arrays: tuple, fmt: BinnedFormat, p: BinnedParams) -> Launch:
    """The launch of the CSR ``arrays`` read through the class lists ``fmt``: a block index range per class."""
    n_small, n_medium, n_large, n_huge = fmt.counts
    medium0 = ceil_div(n_small, p.block_size)
    large0 = medium0 + ceil_div(n_medium * p.medium_lanes, p.block_size)
    huge0 = large0 + ceil_div(n_large * 32, p.block_size)
    scalars = (("n_small", n_small), ("n_medium", n_medium), ("n_large", n_large), ("n_huge", n_huge),
               ("medium_block0", medium0), ("large_block0", large0), ("huge_block0", huge0))
    return Launch(arrays=tuple(arrays) + (("row_ids", fmt.row_ids),), scalars=scalars, grid=huge0 + n_huge,
                  block=p.block_size)


def context(m: CanonicalMatrix, p: BinnedParams) -> dict:
    return {"block_size": p.block_size, "medium_lanes": p.medium_lanes, "unroll": UNROLL}


def evaluate(m: CanonicalMatrix, built: Launch, x: np.ndarray) -> np.ndarray:
    arrays, scalars = dict(built.arrays), dict(built.scalars)
    counts = tuple(scalars[f"n_{c}"] for c in ("small", "medium", "large", "huge"))
    fmt = BinnedFormat(row_ids=arrays["row_ids"], counts=counts)
    return evaluate_binned(fmt, arrays["indptr"], arrays["indices"], arrays.get("data"), x, m.n_rows,
                           m.pattern_value if m.value_free else 1.0)


FAMILY = Family(name="binned", template="binned.cu.j2", params_type=BinnedParams, space=space,
                launch=launch, context=context, evaluate=evaluate, device_launch=device_launch,
                device_bytes=device_bytes)
