"""Equations 1-5 of paper 003 (section 3.3, Algorithm 3): run time of warps executed in waves."""
from __future__ import annotations

import numpy as np


def wave_time(sizes: np.ndarray, perf: np.ndarray, max_active_warps: int, alone: np.ndarray | None = None,
              mean: str = "work") -> float:
    """Predicted time of warps with workloads ``sizes`` and table performances ``perf``, in launch order.

    Eq. 1: the warps run in I = ceil(total warps / max active warps) waves (iterations), in order.
    Eq. 4: Size(i) = sum of the workload sizes of wave i. Eq. 5: P_i = mean table performance of its warps.
    Eq. 3: t_i = Size(i) / P_i. Eq. 2: t = sum of t_i.
    ``mean="plain"`` is eq. 5 as printed. The default ``"work"`` weights the mean by each warp's work
    (P_i = Size(i) / sum of S_j / P_j), which equals eq. 5 when a wave's warps share one shape (the paper's
    balanced tiles) but does not let a wave of many short rows charge one 20,000-entry row at their rate.
    ``perf`` is what the profile measured for a full GPU of warps of that shape (entries per unit time of
    the whole GPU), so Size/P is a time. Given ``alone`` (each warp's time if it ran by itself: its chain
    of dependent loads), the kernel also lasts at least as long as its slowest warp: one warp serialising a
    20,000-entry row is then not predicted to finish in a fraction of a wave. (A per-wave bound would be
    too pessimistic: the hardware does not synchronise waves, so a long warp holds one slot while the other
    slots keep taking new warps.)

    Example:
        >>> float(wave_time(np.array([4.0, 4.0, 4.0]), np.array([2.0, 2.0, 4.0]), max_active_warps=2, mean="plain"))
        5.0
        >>> float(wave_time(np.array([4.0, 4.0, 4.0]), np.array([2.0, 2.0, 4.0]), max_active_warps=2))
        5.0
        >>> float(wave_time(np.array([4.0, 4.0, 4.0]), np.array([2.0, 2.0, 4.0]), 2, alone=np.array([1, 7, 1])))
        7.0
    """
    sizes = np.asarray(sizes, dtype=np.float64)
    perf = np.asarray(perf, dtype=np.float64)
    if sizes.size == 0:
        return 0.0
    per_wave = max(int(max_active_warps), 1)
    n_waves = -(-sizes.size // per_wave)
    # Waves are consecutive runs of warps: pad to whole waves and reduce row-wise (fast on 10^7 warps).
    pad = n_waves * per_wave - sizes.size
    S = np.concatenate([sizes, np.zeros(pad)]).reshape(n_waves, per_wave)
    P = np.concatenate([perf, np.zeros(pad)]).reshape(n_waves, per_wave)
    count_i = np.full(n_waves, per_wave)
    count_i[-1] -= pad
    if mean == "plain":
        t_i = S.sum(axis=1) / (P.sum(axis=1) / count_i)
    else:
        t_i = np.divide(S, P, out=np.zeros_like(S), where=P > 0).sum(axis=1)
    total = float(t_i.sum())
    if alone is not None and len(alone):
        alone = np.asarray(alone, dtype=np.float64)
        # Every warp holds a slot for at least its time alone; the slowest one is the critical path.
        total = max(total, float(alone.sum()) / per_wave, float(alone.max()))
    return total
