"""SpGEMM, C = A B: the operation's families (one registry row each), its plan and its compile.

``tuner.compile(A, B)`` lands in :func:`compile_spgemm`: the model (:mod:`tuner.model.spgemm`) predicts each
family's time from exact product counts and an estimate of C's size, or ``tune='measure'`` times every
candidate on the product itself; the chosen family's callable is returned with its plan.
"""
from __future__ import annotations

import dataclasses
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .. import codegen, gpu
from ..cache import Cache, make_key
from ..formats.row_bins import dense_from
from ..matrix import CanonicalMatrix, canonicalize, structure_digest
from ..model import spgemm as model
from . import outer_product, row_hash
from .base import DeviceCSR, DeviceMemoryError, Product, check_shapes
from .outer_product import OuterProduct, OuterProductParams, device_bytes, key_bits, operands
from .row_hash import RowHash, RowHashParams, dense_widths, geometry, shared_limit

__all__ = ["FAMILIES", "DeviceCSR", "DeviceMemoryError", "OuterProductParams", "RowHashParams", "SpgemmPlan",
           "compile_spgemm", "describe", "device_bytes", "key_bits", "model_plan", "operands", "plan_stats"]


@dataclass(frozen=True)
class Family:
    """One SpGEMM family.

    Attributes:
        name: as plans and reports name it.
        params: its parameter dataclass (defaults: the model's choice).
        build: (A, B, params, cache) -> its :class:`~tuner.spgemm.base.Product`.
        source: (A, B, params, shared limit) -> the CUDA source ``build`` compiles (rendered without a device).
        candidates: parameter sets ``tune='measure'`` times.
    """

    name: str
    params: type
    build: Callable
    source: Callable
    candidates: tuple


# tune='measure' times each of these: block size and B-row tile, and split (how long an A column one block
# takes) for the outer product; lanes, the largest shared table, the in-shared-memory sort limit and the dense
# rule (none, or rows from half as many entries on) for row_hash.
FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("outer_product", OuterProductParams, OuterProduct, outer_product.kernel_source,
           (OuterProductParams(), OuterProductParams(block_size=128, tile=512),
            OuterProductParams(split=65536))),
    Family("row_hash", RowHashParams, RowHash, row_hash.kernel_source,
           tuple(RowHashParams(lanes=n) for n in (16, 32, 64, 128))
           + (RowHashParams(lanes=64, tables=RowHashParams().tables[:8]), RowHashParams(lanes=64, sort_max=1024),
              RowHashParams(dense_ratio=0), RowHashParams(dense_ratio=128))),
)}
FAMILY_OF = {f.params: f for f in FAMILIES.values()}


def library_sources() -> list[str]:
    """Every CUB library the families may load (each an nvcc build of tens of seconds), for every value
    type and column width.

    Example:
        >>> len(library_sources())
        6
    """
    return outer_product.library_sources() + row_hash.library_sources()


def prebuild(arch: str, cache: Cache | None = None) -> None:
    """Build every library of :func:`library_sources` into the binary cache at once, on parallel nvcc runs
    (the first products of a fresh install otherwise build them one after another); those already cached
    are not built again, and a product asking for one being built waits for it (the cache's lock).

    Example:
        >>> prebuild("sm_90", Cache(tempfile.mkdtemp()))  # doctest: +SKIP
    """
    sources = library_sources()
    with ThreadPoolExecutor(max_workers=len(sources)) as pool:
        list(pool.map(lambda s: codegen.compile_library(s, arch, cache=cache), sources))


def compile_candidates(a: CanonicalMatrix, b: CanonicalMatrix, params: list, arch: str, shared: int,
                       cache: Cache | None = None) -> None:
    """Compile the kernels of A B for every parameter set of ``params`` (any family's) into the binary cache,
    on parallel nvcc runs: the builds that follow find them there instead of running nvcc one after another.

    Example:
        >>> import scipy.sparse as sp
        >>> a = canonicalize(sp.random(30, 30, density=0.1, format="csr", dtype="float32", random_state=0))
        >>> import tempfile
        >>> cache = Cache(tempfile.mkdtemp())
        >>> compile_candidates(a, a, [OuterProductParams(), OuterProductParams(tile=512)], "sm_90", 232448, cache)
    """
    codegen.compile_many([FAMILY_OF[type(p)].source(a, b, p, shared) for p in params], arch, cache=cache)


@dataclass(frozen=True)
class SpgemmPlan:
    """How a product was chosen.

    Attributes:
        family: the family that runs.
        params: its parameters.
        predicted_ms: family -> the model's prediction of a whole product (symbolic and numeric phases).
        measured_ms: candidate (family and parameters) -> median measured ms, with ``tune='measure'``.
        stats: what the model knew (products, estimated nnz(C), ...).
        rates: where the model's rates came from.
        reason: one line on why this family.
    """

    family: str
    params: object
    predicted_ms: dict
    measured_ms: dict = field(default_factory=dict)
    stats: model.ProductStats | None = None
    rates: str = ""
    reason: str = ""


def describe(plan: SpgemmPlan) -> str:
    """Why this family: the choice and its reason, what the model knew, each family's prediction and, after
    ``tune='measure'``, the fastest measured candidates.

    Example:
        >>> print(describe(SpgemmPlan("row_hash", RowHashParams(lanes=64), {"outer_product": 2.0, "row_hash": 1.5},
        ...                           rates="measured", reason="lowest predicted time")).splitlines()[2])
          row_hash            1.500 ms predicted
    """
    lines = [f"{plan.family} {plan.params}: {plan.reason}"]
    s = plan.stats
    if s is not None:
        lines.append(f"C = A B: {s.n_rows:,} x {s.n_cols:,}, {s.products:,} products, nnz(C) "
                     f"{'' if s.exact else 'about '}{s.nnz_c:,.0f}; rates {plan.rates}")
    else:
        lines.append(f"rates {plan.rates}" if plan.rates else "no model statistics (parameters given)")
    for family, ms in sorted(plan.predicted_ms.items(), key=lambda kv: kv[1]):
        lines.append(f"  {family:<16} {ms:8.3f} ms predicted")
    for candidate, ms in sorted(plan.measured_ms.items(), key=lambda kv: kv[1])[:5]:
        lines.append(f"  {ms:8.3f} ms measured  {candidate}")
    return "\n".join(lines)


def plan_stats(a, b, params: RowHashParams, shared_limit: int) -> model.ProductStats:
    """The model's view of C = A B for row_hash's bins at ``params`` (and outer_product's keys).

    Example:
        >>> import scipy.sparse as sp
        >>> a = canonicalize(sp.identity(3, format="csr"))
        >>> plan_stats(a, a, RowHashParams(), 232448).products
        3
    """
    vs = a.value_dtype.itemsize
    ks = 4 if b.n_cols <= np.iinfo(np.int32).max else 8
    sym = tuple(g.table for g in geometry(params, ks, shared_limit))
    num = tuple(g.table for g in geometry(params, ks + vs, shared_limit))
    return model.product_stats(a, b, sym, num, params.symbolic_load, params.numeric_load, vs,
                               dense=dense_from(b.n_cols, params.dense_ratio, params.dense_min),
                               dense_width=dense_widths(params, vs, shared_limit)["numeric"])


def measured_plan_key(a: CanonicalMatrix, b: CanonicalMatrix, device: str, capability: tuple[int, int]) -> str:
    """Cache key of a ``tune='measure'`` choice: both structures, the value and index types, the GPU.

    Example:
        >>> import scipy.sparse as sp
        >>> a = canonicalize(sp.identity(3, format="csr"))
        >>> measured_plan_key(a, a, "H100", (9, 0)) != measured_plan_key(a, a, "H200", (9, 0))
        True
    """
    return make_key("spgemm-plan", structure_digest(a), structure_digest(b), a.value_dtype.name,
                    a.index_dtype.name, device, f"{capability[0]}.{capability[1]}")


def params_from_json(family: str, fields: dict):
    """A family's parameters from their JSON form (lists back to tuples).

    Example:
        >>> params_from_json("row_hash", {"lanes": 16, "tables": [32, 64]}).tables
        (32, 64)
    """
    cls = FAMILIES[family].params
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})


def model_plan(a: CanonicalMatrix, b: CanonicalMatrix, profile, shared_bytes: int,
               free_bytes: int | None = None) -> SpgemmPlan:
    """The model's choice for C = A B (no GPU needed): each family predicted from :func:`plan_stats` and the
    profile's rates; among the families whose working memory fits ``free_bytes`` (all, when None) the
    fastest predicted, row_hash with the lanes :func:`~tuner.model.spgemm.lanes_for` gives, outer_product with
    the block :func:`~tuner.model.spgemm.outer_block_for` gives (:func:`planned_params`).

    Example:
        >>> import scipy.sparse as sp
        >>> a = canonicalize(sp.random(200, 200, density=0.05, format="csr", random_state=0))
        >>> p = model_plan(a, a, None, 116736)
        >>> sorted(p.predicted_ms) == sorted(FAMILIES), p.family in FAMILIES
        (True, True)
    """
    stats = plan_stats(a, b, RowHashParams(), shared_bytes)
    rates = model.rates_from(profile)
    predicted = {name: model.predict(name, stats, rates) for name in FAMILIES}
    fits = [f for f in predicted if free_bytes is None or model.working_bytes(f, stats) <= free_bytes] or [
        min(predicted, key=lambda f: model.working_bytes(f, stats))]  # none fits: the smallest says why
    best = min(fits, key=predicted.get)
    params = planned_params(best, stats)
    where = "" if free_bytes is None else " of the families whose working memory fits"
    return SpgemmPlan(best, params, predicted, stats=stats, rates=rates.source,
                      reason=f"lowest predicted time ({predicted[best]:.3f} ms){where}")


def planned_params(family: str, stats: model.ProductStats):
    """The parameters the model runs ``family`` with on a product of ``stats``: row_hash with the lanes
    :func:`~tuner.model.spgemm.lanes_for` gives, outer_product with the block
    :func:`~tuner.model.spgemm.outer_block_for` gives (a tile of B's row four times as long). The profile
    times each family so, and the model predicts what runs.

    Example:
        >>> s = model.ProductStats(10, 10, 16_000, 1.0, 0, 0, 4, 4, 7, 4, pairs=1000, a_entries=1000,
        ...                        hashed_entries=1000)
        >>> planned_params("outer_product", s).block_size, planned_params("row_hash", s).lanes
        (128, 16)
    """
    if family == "row_hash":
        return RowHashParams(lanes=model.lanes_for(stats))
    block = model.outer_block_for(stats)
    return OuterProductParams(block_size=block, tile=4 * block)


def whole(product: Product) -> Callable[[], None]:
    """A whole product as a fresh pair of structures takes it: the symbolic phase rerun first where the family
    has one, then a call, C left on the device."""
    def run():
        if hasattr(product, "symbolic"):
            product.symbolic()
        product(out="device")
    return run


def wall_ms(fn: Callable[[], object], repeats: int, warmup: int = 0) -> float:
    """Median wall ms of ``fn`` between device synchronisations, over ``repeats`` calls after ``warmup``."""
    for _ in range(warmup):
        fn()
    return float(np.median(_call_ms(fn, repeats)))


def _call_ms(fn: Callable[[], object], calls: int) -> list[float]:
    """Wall ms of each of ``calls`` calls of ``fn``, between device synchronisations."""
    times = []
    for _ in range(calls):
        gpu.synchronize()
        t = time.perf_counter()
        fn()
        gpu.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    return times


SPAN_MS = 200.0  # a product is timed over at least this much in all (up to MAX_REPEATS calls)
MAX_REPEATS = 100


def repeats_for(first_ms: float, repeats: int) -> int:
    """Calls to time a product that took ``first_ms`` once: ``repeats``, or more where they take under
    :data:`SPAN_MS` in all (at most :data:`MAX_REPEATS`): a sub-millisecond product varies by tens of percent
    from one call to the next, and the median of five is left to chance.

    Example:
        >>> repeats_for(50.0, 5), repeats_for(10.0, 5), repeats_for(0.4, 5)
        (5, 20, 100)
    """
    return int(min(MAX_REPEATS, max(repeats, SPAN_MS / max(first_ms, 1e-3))))


def timed_ms(fn, repeats: int) -> float:
    """:func:`wall_ms` of ``fn`` (after a warm-up call) over :func:`repeats_for` calls."""
    return wall_ms(fn, repeats_for(wall_ms(fn, 1, warmup=1), repeats))


ROUNDS = 4  # turns in which configurations compared with each other are timed


def interleaved_ms(runs: dict, repeats: int, rounds: int = ROUNDS) -> dict:
    """Median wall ms of each callable of ``runs`` (name -> callable), timed in turns: after a warm-up call
    and a first timed one each, ``rounds`` rounds in which every callable makes its share of the
    :func:`repeats_for` calls it needs (their total is that number), the median taken over all its calls.
    A spell in which the host or the device runs slow (sub-millisecond products vary by tens of percent for
    seconds at a time) then falls on every configuration alike, not on whichever was being timed: what a
    comparison of them needs.

    Example (on a GPU machine):
        >>> interleaved_ms({"a": whole(f), "b": whole(g)}, 5)      # doctest: +SKIP
        {'a': 0.41, 'b': 0.57}
    """
    calls = {k: repeats_for(wall_ms(fn, 1, warmup=1), repeats) for k, fn in runs.items()}
    times = {k: [] for k in runs}
    for r in range(rounds):
        for k, fn in runs.items():
            times[k] += _call_ms(fn, calls[k] // rounds + (r < calls[k] % rounds))
    return {k: float(np.median(v)) for k, v in times.items()}


def operand_bytes(a: CanonicalMatrix, b: CanonicalMatrix) -> int:
    """Device bytes both operands hold (indices, values, row pointers), beyond a family's working set.

    Example:
        >>> import scipy.sparse as sp
        >>> a = canonicalize(sp.eye(3, format="csr", dtype="float32"))
        >>> operand_bytes(a, a)   # 2 x (3 x (4 + 4) + 4 x 8)
        112
    """
    return sum(m.nnz * (m.index_dtype.itemsize + m.value_dtype.itemsize) + 8 * (m.n_rows + 1) for m in (a, b))


def compile_spgemm(A, B, *, dtype=None, tune: str = "model", params=None, profile=None, cache_dir=None,
                   repeats: int = 5, device_memory_limit=None) -> Product:
    """A callable computing C = A B on this GPU (B may be A, A.T or any matrix with A's column count as rows).

    Values are float32 or float64 (the wider of the operands', or ``dtype``); a pattern A times a pattern B
    runs value-free kernels whose entries count paths (times the product of the common values). With
    ``tune='model'`` the model picks the family (``plan.predicted_ms`` holds its predictions); with
    ``tune='measure'`` every candidate of every family runs ``repeats`` times and the fastest is kept (and
    cached under both structures and this GPU: the next compile of the same pair reuses it);
    ``params`` (an :class:`OuterProductParams` or :class:`RowHashParams`) forces a family and geometry.
    ``profile``: a :class:`~tuner.model.profile_data.Profile` (default: this GPU's).
    ``device_memory_limit``: the device memory the product may hold (bytes or a figure such as '4G'; default
    what is free). Where neither family's working set fits it (model mode), the product streams slotted pages
    through it and assembles C in host memory (:class:`~tuner.spgemm.slotted.SlottedProduct`; its ``plan``
    says how many pages and why).

    Example (on a GPU machine):
        >>> import scipy.sparse as sp, tuner                            # doctest: +SKIP
        >>> A = sp.random(300, 300, density=0.02, format="csr")         # doctest: +SKIP
        >>> f = tuner.compile(A, A.T)                                   # doctest: +SKIP
        >>> abs(f() - A @ A.T).max() < 1e-12, f.plan.family             # doctest: +SKIP
        (True, 'row_hash')
    """
    if tune not in ("model", "measure"):
        raise ValueError(f"tune must be 'model' or 'measure', got {tune!r}")
    if params is not None and type(params) not in FAMILY_OF:
        raise ValueError(f"params must be one of {[p.__name__ for p in FAMILY_OF]}, got {type(params).__name__}")
    a = canonicalize(A, dtype)
    b = canonicalize(B, dtype)
    wide = np.result_type(a.value_dtype, b.value_dtype) if dtype is None else np.dtype(dtype)
    index = np.result_type(a.index_dtype, b.index_dtype)
    a, b = canonicalize(a, wide, index), canonicalize(b, wide, index)
    check_shapes(a, b)  # a problem with the operands or the limit is named before the GPU is asked for
    if device_memory_limit is not None:
        from ..streaming import budget_of
        budget_of(device_memory_limit, 0)
    info = gpu.device_info()  # raises NoDeviceError before any work that needs the GPU
    cache = Cache(cache_dir)
    if params is not None:
        product = FAMILY_OF[type(params)].build(a, b, params, cache)
        product.plan = SpgemmPlan(FAMILY_OF[type(params)].name, params, {}, reason="parameters given")
        return product
    if profile is None:
        from ..model.profile_data import load_profile
        try:
            profile = load_profile(info.name)
        except (FileNotFoundError, ValueError):
            profile = None
    from ..streaming import budget_of
    budget = budget_of(device_memory_limit, gpu.free_memory())
    shared = shared_limit(info.shared_bytes_per_block, info.shared_bytes_per_sm)
    plan = model_plan(a, b, profile, shared, budget)
    need = model.working_bytes(plan.family, plan.stats) + operand_bytes(a, b)
    if need > budget and device_memory_limit is None:  # the pools' idle blocks are free for this product too
        budget = gpu.free_memory(release_pool=True)
        plan = model_plan(a, b, profile, shared, budget)
        need = model.working_bytes(plan.family, plan.stats) + operand_bytes(a, b)
    stats, predicted = plan.stats, plan.predicted_ms
    if tune == "model" and need > budget:
        from .slotted import SlottedProduct, check_host_fits, plan_pages
        check_host_fits(a, b, stats, a.value_dtype.itemsize)
        where = "free device memory" if device_memory_limit is None else "device-memory limit"
        splan, pages = plan_pages(a, b, budget, stats, model.rates_from(profile))
        splan = dataclasses.replace(splan, stats=stats,
                                    reason=f"{plan.family}'s working set of {int(need):,} bytes exceeds the "
                                           f"{where} of {budget:,} bytes: {splan.reason}")
        product = SlottedProduct(a, b, pages, cache, nnz_c=stats.nnz_c, budget_bytes=splan.budget_bytes)
        product.plan = splan
        return product
    if tune == "model":
        product = FAMILIES[plan.family].build(a, b, plan.params, cache)
        product.plan = plan
        return product
    key = measured_plan_key(a, b, info.name, info.capability)
    cached = cache.get_json("plan", key)
    if cached is not None and cached.get("family") in FAMILIES:
        product = FAMILIES[cached["family"]].build(a, b, params_from_json(cached["family"], cached["params"]), cache)
        product.plan = SpgemmPlan(product.family, product.params, predicted, cached.get("measured_ms", {}), stats,
                                  plan.rates, "fastest measured earlier (plan cache)")
        return product
    measured, best_product, best_ms = {}, None, float("inf")
    compile_candidates(a, b, [p for family in FAMILIES.values() for p in family.candidates], info.arch, shared, cache)
    for family in FAMILIES.values():
        for p in family.candidates:
            candidate = family.build(a, b, p, cache)
            ms = timed_ms(whole(candidate), repeats)
            measured[f"{family.name} {p}"] = ms
            if ms < best_ms:
                best_product, best_ms = candidate, ms
    best_product.plan = SpgemmPlan(best_product.family, best_product.params, predicted, measured, stats,
                                   plan.rates, f"fastest measured ({best_ms:.3f} ms)")
    cache.put_json("plan", key, {"family": best_product.family, "params": dataclasses.asdict(best_product.params),
                                 "measured_ms": measured})
    return best_product
