"""The longest lane's chain of loads: a floor under small launches of rows of mixed lengths.

Where every lane walks whole rows (csr_vector; binned's classes, a block per row in its huge class), the
lane with the most entries issues its loads ``UNROLL`` at a time, each round after the last. A full GPU
hides that chain behind other warps; a launch of a few thousand rows of mixed lengths does not. Its time
beyond the launch is then about a base (the first rows' dependent loads, the dispatch of its blocks) plus a
time per round of its longest lane: on the H100, wiki-Vote's is about 1.8 us + 0.15 us a round. The
tables and floors the other terms read are measured on rows of one length, so no other term sees this.

The profile times every candidate of these families on synthetic launches of mixed rows
(:func:`tuner.profile.measure_chains`: R-MAT graphs and banded matrices), and :func:`fit_chain_floor`
finds the base and the time per round that bring ``max(model, launch + base + per round x rounds)``
closest to those timings. The real matrices the reports judge the model on take no part in it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..families.base import UNROLL, shared_layout
from ..matrix import CanonicalMatrix
from .warps import SEGMENTS, row_histogram

# Families whose lanes each walk whole rows (by registry name); the others' lanes walk fixed slots and
# have floors of their own (:func:`tuner.model.lookup.occupancy_floor`).
ROW_WALKERS = ("csr_vector", "binned")

# The grid fit_chain_floor searches, in ms: the base from 0 to 3 us, a round from 0 to 1 us.
BASES_MS = np.round(np.arange(0.0, 3.0001, 0.05), 4) * 1e-3
ROUNDS_MS = np.round(np.arange(0.0, 1.0001, 0.0125), 5) * 1e-3


@dataclass(frozen=True)
class ChainFit:
    """The chain floor of one GPU: a launch whose longest lane takes r rounds of ``unroll`` loads lasts at
    least ``base_ms + round_ms * r`` beyond the launch.

    Attributes:
        base_ms: milliseconds of a launch of mixed rows beyond the launch overhead, before its rounds.
        round_ms: milliseconds each round of the longest lane adds.
        unroll: loads a lane has in flight per round (the templates' unroll).
        error: median absolute log error of the model with this floor over the launches it was fitted to.
        error_without: the same without the floor.
    """

    base_ms: float
    round_ms: float
    unroll: int = UNROLL
    error: float = float("nan")
    error_without: float = float("nan")

    def floor_ms(self, entries: int) -> float:
        """Milliseconds beyond the launch that a launch whose longest lane walks ``entries`` lasts at least.

        Example:
            >>> ChainFit(0.001, 0.0002).floor_ms(9)  # 3 rounds of 4 loads
            0.0016
        """
        return self.base_ms + self.round_ms * chain_rounds(entries, self.unroll)

    @classmethod
    def from_profile(cls, chains: dict | None) -> "ChainFit | None":
        """The fit a profile's ``chains`` section holds (None where it has none)."""
        if not chains or "base_ms" not in chains:
            return None
        return cls(float(chains["base_ms"]), float(chains["round_ms"]), int(chains.get("unroll", UNROLL)),
                   float(chains.get("error", "nan")), float(chains.get("error_without", "nan")))


def chain_rounds(entries, unroll: int = UNROLL):
    """Rounds of ``unroll`` loads a lane of ``entries`` entries issues (the last one short).

    Example:
        >>> chain_rounds(9), chain_rounds(8), chain_rounds(0), chain_rounds(np.array([1, 5])).tolist()
        (3, 2, 0, [1, 2])
    """
    return -(-entries // unroll)


def longest_lane(m: CanonicalMatrix, family: str, params) -> int:
    """Entries that the busiest lane of ``family``'s launch on ``m`` walks: over its classes of rows
    (``lo <= length < hi``, :data:`~tuner.model.warps.SEGMENTS`), the longest row's entries over that
    class's lanes per row, rounded up; 0 for a family whose lanes do not walk whole rows.

    Example:
        >>> import scipy.sparse as sp
        >>> from tuner.families.binned import BinnedParams
        >>> from tuner.families.csr_vector import CsrVectorParams
        >>> from tuner.matrix import canonicalize
        >>> lengths = [1, 3, 20, 40, 300]  # one row each, columns 0..length-1
        >>> ij = (np.repeat(np.arange(5), lengths), np.concatenate([np.arange(n) for n in lengths]))
        >>> m = canonicalize(sp.csr_matrix((np.ones(sum(lengths), np.float32), ij), shape=(5, 300)))
        >>> longest_lane(m, "csr_vector", CsrVectorParams(8, 128))  # 300 entries over 8 lanes
        38
        >>> longest_lane(m, "binned", BinnedParams(4, 32, 4, 64, 256))  # 300 on a block, 40 on a warp, 20 on 8 lanes
        3
        >>> longest_lane(m, "binned", BinnedParams(4, 32, 4, None, 256))  # 300 on a warp
        10
    """
    if family not in ROW_WALKERS:
        return 0
    present = shared_layout(m, ("present_lengths",), lambda: np.flatnonzero(row_histogram(m)[0]))
    longest = 0
    for _, s in SEGMENTS[family](m, params):
        end = present.size if s.hi is None else int(np.searchsorted(present, s.hi, "left"))
        if end == 0 or present[end - 1] < s.lo:
            continue  # no row in this class
        lanes = s.block if s.group == "block" else int(s.group)
        longest = max(longest, -(-int(present[end - 1]) // lanes))
    return longest


def fit_chain_floor(predicted, entries, measured, launch_ms: float, unroll: int = UNROLL) -> ChainFit:
    """The base and time per round (over the grid ``BASES_MS`` x ``ROUNDS_MS``) with which
    ``max(predicted, launch_ms + base + per round x rounds)`` has the least median absolute log error
    against ``measured`` (ties: the least mean), over candidates each with its model prediction, its
    longest lane's entries (:func:`longest_lane`) and its measured time, all in ms.

    Example:
        >>> rounds = np.array([1, 2, 4, 8, 16, 32, 1, 4])
        >>> measured = 0.004 + 0.0012 + 0.0003 * rounds  # a launch of 4 us, a base of 1.2 us, 0.3 us a round
        >>> predicted = np.r_[np.full(6, 0.004), 0.009, 0.009]  # the last two are set by their work
        >>> measured[6:] = 0.009
        >>> fit = fit_chain_floor(predicted, rounds * 4, measured, 0.004)
        >>> round(fit.base_ms * 1e3, 3), round(fit.round_ms * 1e3, 4), fit.error
        (1.2, 0.3, 0.0)
    """
    predicted, measured = np.asarray(predicted, dtype=np.float64), np.asarray(measured, dtype=np.float64)
    rounds = chain_rounds(np.asarray(entries, dtype=np.int64), unroll).astype(np.float64)
    if not (predicted.size == rounds.size == measured.size) or not predicted.size:
        raise ValueError(f"need as many predictions, chains and timings (got {predicted.size}, {rounds.size}, "
                         f"{measured.size}), at least one")
    floor = launch_ms + BASES_MS[:, None, None] + ROUNDS_MS[None, :, None] * rounds
    err = np.abs(np.log(np.maximum(predicted, floor) / measured))
    median, mean = np.median(err, axis=2).ravel(), err.mean(axis=2).ravel()
    best = int(np.lexsort((mean, median))[0])
    b, r = divmod(best, ROUNDS_MS.size)
    return ChainFit(float(BASES_MS[b]), float(ROUNDS_MS[r]), unroll, float(median[best]),
                    float(np.median(np.abs(np.log(predicted / measured)))))


def chain_floor_ms(m: CanonicalMatrix, spec, fit: ChainFit | None) -> float:
    """Milliseconds beyond the launch that ``spec``'s launch on view ``m`` lasts at least by its longest
    lane's chain (0 without a fit, or for a family whose lanes do not walk whole rows).

    Example: see tests/test_chains.py.
    """
    if fit is None or spec.family not in ROW_WALKERS:
        return 0.0
    return fit.floor_ms(longest_lane(m, spec.family, spec.params))
