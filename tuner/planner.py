"""Candidates -> timings -> Plan (v0: every candidate is timed and the fastest kept).

The selection logic is pure: it takes a benchmark function, so it is tested with a fake one on a CPU.
Plans persist in the cache under a key of fingerprint, value dtype, GPU, compute capability and package
version, so compiling the same matrix again times nothing and runs no nvcc.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

import numpy as np

from . import __version__, families
from .cache import Cache, make_key
from .families.base import Specialization, params_dict

TUNE_MODES = ("exhaustive",)


@dataclass(frozen=True)
class Timing:
    """One candidate's outcome: its label and measured median milliseconds (None when it failed)."""

    family: str
    params: dict
    measured_ms: float | None
    predicted_ms: float | None = None

    def label(self) -> str:
        return f"{self.family}(" + ",".join(f"{k}={v}" for k, v in self.params.items()) + ")"


@dataclass(frozen=True)
class Plan:
    """The tuner's decision for one matrix structure on one GPU.

    Attributes:
        family: chosen kernel family.
        params: its parameters.
        predicted_ms: the model's prediction (None until the model arrives: v0 measures).
        measured_ms: median time of the chosen kernel when it was timed.
        fingerprint: sha256 of the matrix structure.
        value_dtype, index_dtype: the kernel's types; value_free: pattern-matrix kernel.
        arch: the cubin's target, e.g. 'sm_90'.
        binary_key: cache key of the compiled kernel.
        tune: how it was chosen ('exhaustive', or 'fixed' for a family and parameters given by the caller).
        ranking: every candidate's timing, fastest first.
        features: the matrix's structure summary when the plan was made (for reports and plan reuse).
    """

    family: str
    params: dict
    predicted_ms: float | None
    measured_ms: float | None
    fingerprint: str
    value_dtype: str
    index_dtype: str
    value_free: bool
    arch: str
    binary_key: str
    tune: str
    ranking: tuple[Timing, ...] = field(default=())
    features: dict = field(default_factory=dict)

    def specialization(self) -> Specialization:
        fam = families.get(self.family)
        return Specialization(self.family, fam.params_from_dict(self.params), np.dtype(self.value_dtype),
                              np.dtype(self.index_dtype), self.value_free)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        raw = json.loads(text)
        raw["ranking"] = tuple(Timing(**t) for t in raw.get("ranking", ()))
        return cls(**raw)


def choose(specs: Sequence[Specialization], benchmark: Callable[[Sequence[Specialization]], Sequence[float]]
           ) -> tuple[Specialization, tuple[Timing, ...]]:
    """Time every candidate with ``benchmark`` and return the fastest with the ranking, fastest first.

    A candidate the benchmark reports as NaN or infinite (it failed) is ranked last and never chosen.

    Example:
        >>> from tuner.families.csr_vector import CsrVectorParams
        >>> s = [Specialization("csr_vector", CsrVectorParams(t), np.dtype("float32"), np.dtype("int32"), True)
        ...      for t in (1, 2)]
        >>> best, ranking = choose(s, lambda specs: [2.0, 1.0])
        >>> best.params.threads_per_row, [t.measured_ms for t in ranking]
        (2, [1.0, 2.0])
    """
    if not specs:
        raise ValueError("no candidate kernels to choose from")
    times = list(benchmark(specs))
    if len(times) != len(specs):
        raise ValueError(f"benchmark returned {len(times)} timings for {len(specs)} candidates")
    ok = [math.isfinite(t) for t in times]
    if not any(ok):
        raise RuntimeError("every candidate kernel failed to run")
    order = sorted(range(len(specs)), key=lambda i: (not ok[i], times[i] if ok[i] else 0.0))
    ranking = tuple(Timing(specs[i].family, params_dict(specs[i].params), float(times[i]) if ok[i] else None)
                    for i in order)
    return specs[order[0]], ranking


def plan_key(fingerprint: str, value_dtype, device_name: str, capability: tuple[int, int], tune: str) -> str:
    """Cache key of a plan: structure, value type, GPU, compute capability, package version, tuning mode.

    Example:
        >>> plan_key("ab", "float32", "H100", (9, 0), "exhaustive") != plan_key("ab", "float32", "H200", (9, 0),
        ...                                                                     "exhaustive")
        True
    """
    return make_key("plan", fingerprint, np.dtype(value_dtype).name, device_name, f"{capability[0]}.{capability[1]}",
                    __version__, tune)


def load_plan(cache: Cache, key: str) -> Plan | None:
    body = cache.get("plan", key)
    if body is None:
        return None
    try:
        return Plan.from_json(body.decode())
    except (ValueError, TypeError, KeyError):
        return None


def store_plan(cache: Cache, key: str, plan: Plan) -> None:
    cache.put("plan", key, plan.to_json().encode(), meta={"family": plan.family})


def explain(plan: Plan) -> str:
    """The ranking behind a plan as a table, fastest first.

    Example:
        >>> p = Plan("csr_vector", {"threads_per_row": 4, "block_size": 128}, None, 0.5, "f" * 64, "float32",
        ...          "int32", True, "sm_90", "k", "exhaustive",
        ...          (Timing("csr_vector", {"threads_per_row": 4, "block_size": 128}, 0.5),))
        >>> "0.5000" in explain(p)
        True
    """
    head = (f"plan for {plan.fingerprint[:12]} ({plan.value_dtype}, {plan.index_dtype} indices"
            f"{', value-free' if plan.value_free else ''}) on {plan.arch}, tune={plan.tune}: "
            f"{plan.family} {plan.params}")
    if not plan.ranking:
        return head + "\n(no candidates were timed)"
    best = plan.ranking[0].measured_ms
    lines = [head, f"{'rank':>4}  {'measured ms':>11}  {'vs best':>7}  candidate"]
    for i, t in enumerate(plan.ranking, 1):
        ms = f"{t.measured_ms:11.4f}" if t.measured_ms is not None else f"{'failed':>11}"
        rel = f"{t.measured_ms / best:7.2f}" if t.measured_ms is not None and best else f"{'':>7}"
        lines.append(f"{i:>4}  {ms}  {rel}  {t.label()}")
    return "\n".join(lines)
