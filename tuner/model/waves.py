"""Equations 1-5 of paper 003 (section 3.3, Algorithm 3): run time of warps executed in waves."""
from __future__ import annotations

import numpy as np


def wave_time(sizes: np.ndarray, perf: np.ndarray, max_active_warps: int, single_warp_bound: bool = True) -> float:
    """Predicted time of warps with workloads ``sizes`` and table performances ``perf``, in launch order.

    Eq. 1: the warps run in I = ceil(total warps / max active warps) waves (iterations), in order.
    Eq. 4: Size(i) = sum of the workload sizes of wave i. Eq. 5: P_i = mean table performance of its warps.
    Eq. 3: t_i = Size(i) / P_i. Eq. 2: t = sum of t_i.
    ``perf`` is what the profile measured for a full GPU of warps of that shape (entries per unit time of
    the whole GPU), so Size/P is a time. With ``single_warp_bound`` a wave also lasts at least as long as
    its slowest warp alone, at its per-warp share of that performance (P / max active warps): one warp
    serialising a 20,000-entry row is then not predicted to finish in a fraction of a wave.

    Example:
        >>> float(wave_time(np.array([4.0, 4.0, 4.0]), np.array([2.0, 2.0, 4.0]), max_active_warps=2,
        ...                 single_warp_bound=False))
        5.0
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
    t_i = S.sum(axis=1) / (P.sum(axis=1) / count_i)
    if single_warp_bound:
        alone = np.divide(S * per_wave, P, out=np.zeros_like(S), where=P > 0)
        t_i = np.maximum(t_i, alone.max(axis=1))
    return float(t_i.sum())
