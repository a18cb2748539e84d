"""aligned_coo: paper 004's ALIGNED_COO (section IV) - equal seg lanes stored column-major plus a flat COO part.

Every layout of section IV-D is a candidate: ``hybrid`` (warp-multiple heads of long rows flat, the
trailing entries seg), all-``seg`` and all-``flat``. The planner ranks them by the lookup model like any
other candidate; Algorithm 3's choice among them (:func:`tuner.model.aligned_coo.choose_hybrid`, in the
paper's abstract cost units) is compared with the measured best in ``report``. The layout is built by
:mod:`tuner.formats.aligned_coo`; y is zeroed before the kernel, which adds into it atomically.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..formats.aligned_coo import (LAYOUTS, AlignedCoo, Sizes, aligned_coo_bytes, build_aligned_coo,
                                   evaluate_aligned_coo)
from ..formats.reorder import NONE, ORDERINGS
from ..matrix import CanonicalMatrix
from .base import (UNROLL, Family, Launch, check_launch, ceil_div, longest_row, ordered_device_launch, ordered_launch,
                   shared_layout)

BLOCK_SIZE = 256


@dataclass(frozen=True)
class AlignedCooParams:
    """Parameters of aligned_coo.

    Attributes:
        layout: 'hybrid' (paper 004's hybrid kernel), 'seg' (every entry in the seg part) or 'flat' (every
            entry in the flat COO part).
        block_size: threads per block.
        order: relabelling of rows and columns the kernel runs in ('none' or 'degree', see
            :mod:`tuner.formats.reorder`).
    """

    layout: str = "hybrid"
    block_size: int = BLOCK_SIZE
    order: str = NONE

    def __post_init__(self):
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")
        check_launch(self.block_size, self.order)


def space(m: CanonicalMatrix) -> list[AlignedCooParams]:
    """The three layouts for every ordering; the hybrid equals all-seg when no row reaches a warp, and is
    then left out."""
    longest = longest_row(m)
    layouts = [lay for lay in LAYOUTS if lay != "hybrid" or longest >= 32]
    return [AlignedCooParams(lay, BLOCK_SIZE, o) for o in ORDERINGS for lay in layouts]


def layout_of(m: CanonicalMatrix, layout: str) -> AlignedCoo:
    """The layout of ``m``, built once per matrix and layout."""
    return shared_layout(m, ("aligned_coo", layout), lambda: build_aligned_coo(
        m.indptr, m.indices, None if m.value_free else m.data, layout, m.index_dtype))


def device_launch(m: CanonicalMatrix, p: AlignedCooParams) -> Launch:
    """:func:`launch` built on the GPU from the relabelled matrix's device arrays
    (:func:`~tuner.formats.aligned_coo.build_aligned_coo_pieces`): the same arrays, as CuPy arrays."""
    def build(m, csr, col_lengths):
        return layout_launch(build_aligned_coo(csr.indptr, csr.indices, csr.data, p.layout, m.index_dtype),
                             p.block_size)
    return ordered_device_launch(m, p.order, build)


def device_bytes(m: CanonicalMatrix) -> int:
    """Device memory :func:`device_launch` needs beyond the relabelled matrix (the layout and a piece's
    work: :func:`~tuner.formats.aligned_coo.aligned_coo_bytes`)."""
    return aligned_coo_bytes(m.n_rows, m.nnz, m.index_dtype.itemsize, 0 if m.value_free else m.value_dtype.itemsize)


def grid(s: Sizes, block: int) -> tuple[int, int]:
    """(seg blocks, all blocks): a thread per lane, then a warp per UNROLL flat chunks."""
    seg_blocks = ceil_div(s.lanes, block)
    return seg_blocks, seg_blocks + ceil_div(ceil_div(s.chunks, UNROLL) * 32, block)


def launch(m: CanonicalMatrix, p: AlignedCooParams) -> Launch:
    return ordered_launch(m, p.order, lambda b: _launch(b, p))


def _launch(m: CanonicalMatrix, p: AlignedCooParams) -> Launch:
    return layout_launch(layout_of(m, p.layout), p.block_size)


def layout_launch(f: AlignedCoo, block: int) -> Launch:
    """The launch of a built layout: seg blocks first, then flat warps; y zeroed before it."""
    seg_blocks, blocks = grid(f.sizes, block)
    arrays = [("seg_rows", f.seg_rows), ("seg_cols", f.seg_cols)]
    if f.seg_vals is not None:
        arrays.append(("seg_vals", f.seg_vals))
    arrays += [("flat_rows", f.flat_rows), ("flat_cols", f.flat_cols)]
    if f.flat_vals is not None:
        arrays.append(("flat_vals", f.flat_vals))
    scalars = (("lanes", f.sizes.lanes), ("seg_len", f.sizes.seg_len), ("chunks", f.sizes.chunks),
               ("seg_blocks", seg_blocks))
    return Launch(arrays=tuple(arrays), scalars=scalars, grid=blocks, block=block, zero_y=True)


def context(m: CanonicalMatrix, p: AlignedCooParams) -> dict:
    return {"block_size": p.block_size, "unroll": UNROLL, "aligned_chunks": p.layout == "hybrid"}


def evaluate(m: CanonicalMatrix, built: Launch, x: np.ndarray) -> np.ndarray:
    a = dict(built.arrays)
    parts = [(a[f"{p}_rows"], a[f"{p}_cols"], a.get(f"{p}_vals")) for p in ("seg", "flat")]
    return evaluate_aligned_coo(parts, x, m.n_rows, m.pattern_value if m.value_free else 1.0)


FAMILY = Family(name="aligned_coo", template="aligned_coo.cu.j2", params_type=AlignedCooParams, space=space,
                launch=launch, context=context, evaluate=evaluate, device_launch=device_launch,
                device_bytes=device_bytes)
