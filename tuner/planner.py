"""Candidates -> predictions (model) -> timings (optional) -> Plan.

Tuning modes: ``model`` takes the model's first choice and times nothing (the papers' mode); ``measure``
times the model's top k; ``exhaustive`` times every candidate; ``optuna`` runs an Optuna study seeded with
the model's best (see :mod:`tuner.search`). The selection logic is pure: it takes prediction lists and a
benchmark function, so it is tested with a fake one on a CPU. Plans persist in the cache under a key of
fingerprint, value dtype, GPU, compute capability, package version, mode and profile, so compiling the
same matrix again times nothing and runs no nvcc.
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

TUNE_MODES = ("model", "measure", "exhaustive", "optuna")


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
        predicted_ms: the model's prediction (None when no profile predicted it).
        measured_ms: median time of the chosen kernel when it was timed.
        fingerprint: sha256 of the matrix structure.
        value_dtype, index_dtype: the kernel's types; value_free: pattern-matrix kernel.
        arch: the cubin's target, e.g. 'sm_90'.
        binary_key: cache key of the compiled kernel.
        tune: how it was chosen ('exhaustive', or 'fixed' for a family and parameters given by the caller).
        ranking: every candidate's timing, fastest first.
        features: the matrix's structure summary when the plan was made (for reports and plan reuse).
        seconds: host seconds of planning's stages when the plan was made: 'relabel' (the relabelled matrix
            the tiled candidates read, the first step of their layout), 'plan' (every candidate and its
            prediction: what model mode spends beyond the layout), 'select' (timing candidates, their nvcc
            included, where any were timed).
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
    seconds: dict = field(default_factory=dict)

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


def plan_key(fingerprint: str, value_dtype, device_name: str, capability: tuple[int, int], tune: str,
             profile_digest: str = "") -> str:
    """Cache key of a plan: structure, value type, GPU, compute capability, package version, tuning mode and
    the profile the model read.

    Example:
        >>> plan_key("ab", "float32", "H100", (9, 0), "model") != plan_key("ab", "float32", "H200", (9, 0), "model")
        True
    """
    return make_key("plan", fingerprint, np.dtype(value_dtype).name, device_name, f"{capability[0]}.{capability[1]}",
                    __version__, tune, profile_digest)


def select(mode: str, specs: Sequence[Specialization], predicted: Sequence[float | None],
           benchmark: Callable[[Sequence[Specialization]], Sequence[float]], top_k: int = 3,
           search: Callable[[], dict] | None = None) -> tuple[Specialization, tuple[Timing, ...]]:
    """Choose a candidate by ``mode``; the ranking lists timed candidates by measured time, then the rest by
    prediction.

    ``search`` (optuna mode) returns {candidate index: measured ms} for the candidates it tried.

    Example:
        >>> from tuner.families.csr_vector import CsrVectorParams
        >>> s = [Specialization("csr_vector", CsrVectorParams(t), np.dtype("float32"), np.dtype("int32"), True)
        ...      for t in (1, 2, 4)]
        >>> best, _ = select("model", s, [3.0, 1.0, 2.0], benchmark=None)
        >>> best.params.threads_per_row
        2
        >>> best, _ = select("measure", s, [3.0, 1.0, 2.0], lambda ss: [5.0 if x.params.threads_per_row == 2
        ...                  else 4.0 for x in ss], top_k=2)
        >>> best.params.threads_per_row
        4
    """
    if not specs:
        raise ValueError("no candidate kernels to choose from")
    if mode not in TUNE_MODES:
        raise ValueError(f"tune must be one of {TUNE_MODES}, got {mode!r}")
    n = len(specs)
    if mode != "exhaustive" and any(p is None for p in predicted):
        raise ValueError(f"tune={mode!r} needs predictions for every candidate")
    by_prediction = sorted(range(n), key=lambda i: predicted[i] if predicted[i] is not None else 0.0)
    measured: dict[int, float] = {}
    if mode == "measure":
        chosen = by_prediction[:max(1, top_k)]
        measured = dict(zip(chosen, benchmark([specs[i] for i in chosen])))
    elif mode == "exhaustive":
        measured = dict(enumerate(benchmark(list(specs))))
    elif mode == "optuna":
        measured = dict(search())
    ok = {i: t for i, t in measured.items() if math.isfinite(t)}
    if mode != "model" and not ok:
        raise RuntimeError("every candidate kernel failed to run")
    best = min(ok, key=ok.get) if mode != "model" else by_prediction[0]
    timed = sorted(ok, key=ok.get)
    failed = [i for i in measured if i not in ok]
    rest = [i for i in by_prediction if i not in measured]
    ranking = tuple(Timing(specs[i].family, params_dict(specs[i].params), ok.get(i),
                           None if predicted[i] is None else float(predicted[i]))
                    for i in timed + rest + failed)
    return specs[best], ranking


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
    """The ranking behind a plan as a table: timed candidates by measured time, then the rest by prediction.

    Example:
        >>> p = Plan("csr_vector", {"threads_per_row": 4, "block_size": 128}, 0.45, 0.5, "f" * 64, "float32",
        ...          "int32", True, "sm_90", "k", "measure",
        ...          (Timing("csr_vector", {"threads_per_row": 4, "block_size": 128}, 0.5, 0.45),),
        ...          seconds={"plan": 0.0123})
        >>> "0.5000" in explain(p) and "0.4500" in explain(p) and "plan 0.012 s" in explain(p)
        True
    """
    head = (f"plan for {plan.fingerprint[:12]} ({plan.value_dtype}, {plan.index_dtype} indices"
            f"{', value-free' if plan.value_free else ''}) on {plan.arch}, tune={plan.tune}: "
            f"{plan.family} {plan.params}")
    if plan.seconds:
        head += "\nplanning took " + ", ".join(f"{k} {v:.3f} s" for k, v in plan.seconds.items())
    if not plan.ranking:
        return head + "\n(no candidates were ranked)"
    timed = [t.measured_ms for t in plan.ranking if t.measured_ms is not None]
    best = min(timed) if timed else None
    lines = [head, f"{'rank':>4}  {'predicted ms':>12}  {'measured ms':>11}  {'vs best':>7}  candidate"]
    for i, t in enumerate(plan.ranking, 1):
        pred = f"{t.predicted_ms:12.4f}" if t.predicted_ms is not None else f"{'-':>12}"
        ms = f"{t.measured_ms:11.4f}" if t.measured_ms is not None else f"{'-':>11}"
        rel = f"{t.measured_ms / best:7.2f}" if t.measured_ms is not None and best else f"{'':>7}"
        lines.append(f"{i:>4}  {pred}  {ms}  {rel}  {t.label()}")
    return "\n".join(lines)
