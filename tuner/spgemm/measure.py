"""SpGEMM's part of ``python -m tuner profile``: every family's phases timed on generated products (A·A and
A·Aᵀ of power-law graphs of several sizes and densities, and of uniform ones), and the model's rates fitted to
them (:func:`tuner.model.spgemm.fit_rates`)."""
from __future__ import annotations

import dataclasses

import numpy as np

from .. import gpu
from ..cache import Cache
from ..generators import rmat
from ..matrix import canonicalize
from ..model import spgemm as model
from . import FAMILIES, plan_stats, planned_params, timed_ms, whole
from .row_hash import RowHashParams, profile_shared_limit, shared_limit

# "kind:scale:edge factor operation": graphs whose products run from about 1M to 150M scalar products. The
# R-MAT graphs first; the sparse ones after them leave a third to a half of their products to hashed rows (the
# dense ones send nearly all to dense accumulators), so that the hash phases' rates rest on real work, not
# only their fixed costs; the uniform graphs (R-MAT with equal quadrants: no hubs, rows of even length) stand
# for the regular matrices (meshes, finite elements) whose short rows all hash.
PRODUCTS = ("rmat:12:8 AA", "rmat:13:16 AAT", "rmat:14:8 AA", "rmat:14:16 AAT", "rmat:15:8 AA", "rmat:15:16 AA",
            "rmat:17:2 AA", "rmat:18:2 AAT", "uniform:16:16 AA", "uniform:18:4 AA")

# Each family's timed phases (the names in a product's ``seconds``) -> the model's phase they measure.
PHASES = {
    "outer_product": {"expand": "outer.expand", "sort": "outer.sort", "reduce": "outer.reduce",
                      "csr": "outer.csr"},
    "row_hash": {"symbolic_shared": "hash.symbolic_shared", "symbolic_global": "hash.symbolic_global",
                 "symbolic_dense": "hash.symbolic_dense", "numeric_shared": "hash.numeric_shared",
                 "numeric_global": "hash.numeric_global", "numeric_dense": "hash.numeric_dense",
                 "sort": "hash.sort", "symbolic_rest": "hash.rows", "csr": "hash.rows"},
}


def phase_ms(product, repeats: int) -> dict[str, float]:
    """Median ms of each model phase over ``repeats`` whole products (symbolic phase included), timed phase by
    phase (``product.timed`` is set for these calls only)."""
    was, product.timed = product.timed, True
    try:
        runs = [_phases_once(product) for _ in range(repeats)]
    finally:
        product.timed = was
    return {k: float(np.median([r[k] for r in runs])) for k in runs[0]}


def _phases_once(product) -> dict[str, float]:
    """One whole product's ms per model phase."""
    seconds = {}
    if hasattr(product, "symbolic"):
        product.symbolic()
        seconds.update({k: v for k, v in product.seconds.items() if k.startswith("symbolic")})
    product(out="device")  # a call starts its own ``seconds``
    for name, s in product.seconds.items():
        seconds[name] = seconds.get(name, 0.0) + s
    ms: dict[str, float] = {}
    for name, phase in PHASES[product.family].items():
        if name in seconds:
            ms[phase] = ms.get(phase, 0.0) + seconds[name] * 1e3
    return ms


def operands_of(name: str):
    """The canonical operands of a measured product named like 'rmat:14:8 AA' or 'uniform:17:8 AA'
    (regenerated: same seed)."""
    spec, op = name.split()
    kind, scale, factor = spec.split(":")
    quadrants = dict(a=0.25, b=0.25, c=0.25) if kind == "uniform" else {}
    A = rmat(int(scale), int(factor), seed=int(scale) * 100 + int(factor), **quadrants)
    a = canonicalize(A)
    return a, (a if op == "AA" else canonicalize(A.T.tocsr()))


def refit(section: dict, limit: int | None = None) -> dict:
    """The SpGEMM section with every run's work recomputed by the current model (operands regenerated, nnz(C)
    as recorded) and the rates fitted again to the recorded times: no GPU needed. ``limit``: the measuring
    GPU's :func:`~tuner.spgemm.row_hash.shared_limit` (default: sm_90's).

    Example (slow: regenerates the R-MAT graphs):
        >>> refit({"runs": [], "rates": {}})
        {'runs': [], 'rates': {}}
    """
    runs = []
    for run in section["runs"]:
        a, b = operands_of(run["name"])
        stats = plan_stats(a, b, RowHashParams(), limit or profile_shared_limit(None))
        nnz_c = run.get("nnz_c")
        if nnz_c is None:  # runs recorded before nnz(C) was: recovered from the sort's bytes
            entry = stats.col_bytes + stats.value_bytes
            nnz_c = (run["work"].get("hash.sort", 0.0) / entry if run["family"] == "row_hash"
                     else run["work"]["outer.csr"] / (model.KEY_BYTES + stats.value_bytes))
        exact = dataclasses.replace(stats, nnz_c=float(round(nnz_c)), exact=True)
        runs.append({**run, "nnz_c": int(round(nnz_c)), "work": model.work(run["family"], exact)})
    return {"runs": runs, "rates": model.fit_rates(runs)}


def measure(cache: Cache, repeats: int = 5, progress=None) -> dict:
    """Time every family on :data:`PRODUCTS` with the parameters the model plans for each
    (:func:`~tuner.spgemm.planned_params`); returns {"runs": [...], "rates": {phase: ms per unit}}.

    Example (on a GPU machine):
        >>> sorted(measure(Cache())["rates"])[:2]  # doctest: +SKIP
        ['hash.numeric_global', 'hash.numeric_shared']
    """
    info = gpu.device_info()
    runs = []
    for name in PRODUCTS:
        a, b = operands_of(name)
        stats = plan_stats(a, b, RowHashParams(), shared_limit(info.shared_bytes_per_block, info.shared_bytes_per_sm))
        for family in FAMILIES.values():
            # At the parameters the model plans, so that the rates predict what runs.
            product = family.build(a, b, planned_params(family.name, stats), cache)
            ms = phase_ms(product, repeats)
            whole_ms = timed_ms(whole(product), repeats)  # as a product runs: no waits between phases
            nnz_c = int(product(out="device").nnz)
            exact = dataclasses.replace(stats, nnz_c=float(nnz_c), exact=True)
            runs.append({"name": name, "family": family.name, "nnz_c": nnz_c, "whole_ms": whole_ms,
                         "work": model.work(family.name, exact), "ms": ms})
            del product
        if progress:
            progress(1)
    return {"runs": runs, "rates": model.fit_rates(runs)}
