"""csr_vector: a group of ``threads_per_row`` lanes per row with a shuffle reduction (Bell and Garland).

The general-purpose baseline: one CSR, every row handled alike. One lane per row is CSR-scalar.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..formats.csr import row_sums
from ..formats.reorder import NONE, ORDERINGS
from ..matrix import CanonicalMatrix
from .base import (UNROLL, Family, Launch, check_launch, ceil_div, csr_arrays, device_csr_arrays, longest_row,
                   ordered_device_launch, ordered_launch)

THREADS_PER_ROW = (1, 2, 4, 8, 16, 32)
BLOCK_SIZES = (128, 256)


@dataclass(frozen=True)
class CsrVectorParams:
    """Parameters of csr_vector.

    Attributes:
        threads_per_row: lanes cooperating on one row (a power of two dividing the warp).
        block_size: threads per block (a multiple of 32).
        order: relabelling of rows and columns the kernel runs in ('none' or 'degree', see
            :mod:`tuner.formats.reorder`).
    """

    threads_per_row: int = 32
    block_size: int = 256
    order: str = NONE

    def __post_init__(self):
        if self.threads_per_row not in THREADS_PER_ROW:
            raise ValueError(f"threads_per_row must be one of {THREADS_PER_ROW}, got {self.threads_per_row}")
        check_launch(self.block_size, self.order)


def space(m: CanonicalMatrix) -> list[CsrVectorParams]:
    """Every lane count, block size and ordering (groups wider than the longest row only waste lanes)."""
    longest = longest_row(m)
    widths = [t for t in THREADS_PER_ROW if t == 1 or t // 2 < longest]
    return [CsrVectorParams(t, b, o) for o in ORDERINGS for t in widths for b in BLOCK_SIZES]


def launch(m: CanonicalMatrix, p: CsrVectorParams) -> Launch:
    return ordered_launch(m, p.order, lambda b: _launch(csr_arrays(b), b.n_rows, p))


def device_launch(m: CanonicalMatrix, p: CsrVectorParams) -> Launch:
    """:func:`launch` on the relabelled matrix's device arrays (relabelled there: no layout beyond them)."""
    return ordered_device_launch(m, p.order, lambda m, csr, col_lengths: _launch(device_csr_arrays(csr), m.n_rows, p))


def _launch(arrays: tuple, n_rows: int, p: CsrVectorParams) -> Launch:
    return Launch(arrays=arrays, scalars=(("n_rows", n_rows),), grid=ceil_div(n_rows * p.threads_per_row, p.block_size),
                  block=p.block_size)


def context(m: CanonicalMatrix, p: CsrVectorParams) -> dict:
    return {"threads_per_row": p.threads_per_row, "block_size": p.block_size, "unroll": UNROLL}


def evaluate(m: CanonicalMatrix, built: Launch, x: np.ndarray) -> np.ndarray:
    arrays = dict(built.arrays)
    return row_sums(arrays["indptr"], arrays["indices"], arrays.get("data"), x, np.arange(m.n_rows),
                    m.pattern_value if m.value_free else 1.0)


FAMILY = Family(name="csr_vector", template="csr_vector.cu.j2", params_type=CsrVectorParams, space=space,
                launch=launch, context=context, evaluate=evaluate, device_launch=device_launch,
                device_bytes=lambda m: 0)  # the kernel reads the (relabelled) CSR itself
