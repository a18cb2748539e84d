"""The pipeline behind :func:`tuner.compile`: matrix -> fingerprint -> plan (cached or tuned) -> callable."""
from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from . import codegen, families, gpu, layouts, paths, plan_worker, planner, streaming, tiered
from .cache import Cache
from .families.base import (Specialization, drop_device_copies, known_layout, memo_state, ordered_matrix, ordering,
                            restore)
from .families.tiles import TILE_ORDER
from .formats import device_reorder
from .formats.reorder import relabel_bytes
from .kernel import DeviceArrays, SpMV, adaptive_repeats, time_spmv
from .model import Profile, load_profile, predicted_candidates
from .model.lookup import caller_order_predictions
from .search import optuna_search
from .matrix import CanonicalMatrix, canonicalize, fingerprint, structure_digest, structure_features
from .workers import pool as thread_pool

log = logging.getLogger("tuner.compiler")


@dataclass(frozen=True)
class Prepared:
    """Every candidate of a matrix rendered and compiled (no GPU needed).

    Attributes:
        matrix: the canonical matrix.
        fingerprint: its :class:`~tuner.matrix.Fingerprint`.
        specs: candidate specialisations.
        binaries: their compiled modules, same order.
        seconds: wall time of each stage ('canonicalize', 'fingerprint', 'compile').
    """

    matrix: CanonicalMatrix
    fingerprint: object
    specs: list
    binaries: list
    seconds: dict = field(default_factory=dict)


def prepare(A, dtype=None, arch: str = codegen.DEFAULT_ARCH, families_: list[str] | None = None,
            cache: Cache | None = None) -> Prepared:
    """Canonicalise, fingerprint, enumerate, render and compile every candidate for ``arch``.

    This is the whole pipeline up to the GPU; on a machine without one it is what can be done.

    Example:
        >>> import scipy.sparse as sp
        >>> p = prepare(sp.random(100, 100, density=0.05, format="csr", random_state=0))
        >>> len(p.specs) == len(p.binaries) > 0
        True
    """
    cache = cache or Cache()
    t0 = time.perf_counter()
    m = canonicalize(A, dtype)
    t1 = time.perf_counter()
    fp = fingerprint(m)
    t2 = time.perf_counter()
    specs = families.specializations(m, families_)
    binaries = codegen.compile_many([families.render(s, m) for s in specs], arch=arch, cache=cache)
    t3 = time.perf_counter()
    return Prepared(m, fp, specs, binaries,
                    {"canonicalize": t1 - t0, "fingerprint": t2 - t1, "compile": t3 - t2})


def plan_offline(A, profile: Profile, *, dtype=None, index_dtype=None, arch: str = codegen.DEFAULT_ARCH,
                 cache: Cache | None = None) -> tuple[planner.Plan, list]:
    """The plan model mode would make on the profile's GPU, made here without one: every candidate predicted
    and ranked, all of them rendered and compiled for ``arch``; nothing is timed, stored or loaded.

    Returns the plan (its ``ranking`` every candidate by prediction, ``tune`` 'model') and the binaries of
    the ranked candidates, in ranking order.

    Example:
        >>> import scipy.sparse as sp, tempfile
        >>> from tuner.model import load_profile
        >>> A = sp.random(200, 200, density=0.05, format="csr", random_state=0)
        >>> plan, binaries = plan_offline(A, load_profile("NVIDIA H100 80GB HBM3"), cache=Cache(tempfile.mkdtemp()))
        >>> plan.value_dtype, len(binaries) == len(plan.ranking) > 1, plan.ranking[0].predicted_ms > 0
        ('float64', True, True)
    """
    cache = cache or Cache()
    m = canonicalize(A, dtype, index_dtype)
    digest = structure_digest(m)
    specs, predicted, seconds = plan_candidates(m, profile)
    specs, predicted = predictable(specs, predicted, profile.gpu.get("name", "profiled"))
    best, ranking = planner.select("model", specs, predicted, benchmark=None)
    # Keyed as the ranking labels them (parameters as dicts: a long tuple of workloads in full).
    by_label = {planner.Timing(s.family, families.params_dict(s.params), None).label(): s for s in specs}
    ranked = [by_label[t.label()] for t in ranking]
    binaries = codegen.compile_many([families.render(s, m) for s in ranked], arch=arch, cache=cache)
    plan = planner.Plan(family=best.family, params=families.params_dict(best.params),
                        predicted_ms=ranking[0].predicted_ms, measured_ms=None, fingerprint=digest,
                        value_dtype=m.value_dtype.name, index_dtype=m.index_dtype.name, value_free=m.value_free,
                        arch=arch, binary_key=binaries[0].key, tune="model", ranking=ranking,
                        features=structure_features(m), seconds=seconds)
    return plan, binaries


def model_choice(A, profile=None) -> Specialization | None:
    """The candidate model mode picks for ``A`` on this machine's GPU (or ``profile``'s), predicted only:
    nothing is compiled, timed or stored. None where no profile is found.

    Example:
        >>> import scipy.sparse as sp
        >>> from tuner.model import load_profile
        >>> s = model_choice(sp.random(300, 300, density=0.05, format="csr", random_state=0),
        ...                  load_profile("NVIDIA H100 80GB HBM3"))
        >>> s.family in families.REGISTRY
        True
    """
    ranking = model_ranking(A, profile)
    return None if ranking is None else planner.select("model", [s for s, _ in ranking], [p for _, p in ranking],
                                                       benchmark=None)[0]


def model_ranking(A, profile=None) -> list[tuple[Specialization, float]] | None:
    """Every candidate the profile predicts for ``A``, with its predicted ms, fastest first (ties in the
    planner's order): what :func:`model_choice` picks from, for callers that need the best of one family.
    None where no profile is found.

    Example:
        >>> import scipy.sparse as sp
        >>> from tuner.model import load_profile
        >>> r = model_ranking(sp.random(300, 300, density=0.05, format="csr", random_state=0),
        ...                   load_profile("NVIDIA H100 80GB HBM3"))
        >>> r[0][0] == model_choice(sp.random(300, 300, density=0.05, format="csr", random_state=0),
        ...                         load_profile("NVIDIA H100 80GB HBM3")), r[0][1] <= r[-1][1]
        (True, True)
    """
    m = canonicalize(A)
    prof = profile if isinstance(profile, Profile) else _profile(gpu.device_info(), profile)
    if prof is None:
        return None
    specs, predicted = _plan(m, prof)
    specs, predicted = predictable(specs, predicted, prof.gpu.get("name", "profiled"))
    order = sorted(range(len(specs)), key=lambda i: predicted[i])
    return [(specs[i], predicted[i]) for i in order]


PLAN_REPEATS = 3  # the report's plans per matrix: their median is its planning seconds


def plan_candidates(m: CanonicalMatrix, profile: Profile | None, repeats: int = 1,
                    known: dict | None = None) -> tuple[list, list, dict]:
    """Every candidate of ``m`` with the model's prediction (None each without a profile), and the host
    seconds of the relabelled matrix the tiled candidates read ('relabel': their layout's first step, built
    before the planning) and of the planning beyond it ('plan'). ``known``: predictions made before, by
    candidate label (:func:`~tuner.model.lookup.caller_order_predictions`, which a compile makes beside the
    relabelling), not made again (the first plan only, where ``repeats`` > 1); or a callable returning them
    once made (:func:`~tuner.model.lookup.predicted_candidates`), whose wait counts in 'plan'.

    With ``repeats`` > 1 the planning is done that many times, each after the first on a new copy of the
    matrix as the relabelling left it (:func:`~tuner.families.base.restore`: nothing the earlier plans
    built is found again), and 'plan' is the median, 'plan_runs' every time: on a shared host one timing
    can be off by half. The candidates and predictions returned are the first plan's (the copies' are
    the same).

    Example:
        >>> import scipy.sparse as sp
        >>> specs, predicted, seconds = plan_candidates(canonicalize(sp.eye(50, format="csr")), None)
        >>> len(specs) == len(predicted) > 0, predicted[0], sorted(seconds)
        (True, None, ['plan', 'relabel'])
        >>> sorted(plan_candidates(canonicalize(sp.eye(50, format="csr")), None, repeats=3)[2])
        ['plan', 'plan_runs', 'relabel']
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    t0 = time.perf_counter()
    ordered_matrix(m, TILE_ORDER)
    t1 = time.perf_counter()
    state = memo_state(m) if repeats > 1 else None
    specs, predicted = _plan(m, profile, known)
    runs = [time.perf_counter() - t1]
    for _ in range(repeats - 1):
        again = restore(state)
        t = time.perf_counter()
        _plan(again, profile)
        runs.append(time.perf_counter() - t)
        del again
    seconds = {"relabel": t1 - t0, "plan": float(np.median(runs))}
    if repeats > 1:
        seconds["plan_runs"] = runs
    return specs, predicted, seconds


def _plan(m: CanonicalMatrix, profile: Profile | None, known: dict | None = None) -> tuple[list, list]:
    """Every candidate and its prediction (None each without a profile; ``known``: those made before, by
    label)."""
    if profile is not None:
        return predicted_candidates(m, profile, known=known)
    specs = families.specializations(m)
    return specs, [None] * len(specs)


def predictable(specs: list[Specialization], predicted: list, gpu_name: str) -> tuple[list, list]:
    """The candidates the profile could predict, with a warning naming the families it could not.

    Example:
        >>> import scipy.sparse as sp
        >>> s = families.specializations(canonicalize(sp.eye(3, format="csr")), ["csr_vector"])[:2]
        >>> [len(v) for v in predictable(s, [0.1, None], "H100")]
        [1, 1]
    """
    keep = [i for i, p in enumerate(predicted) if p is not None]
    if len(keep) < len(specs):
        lacking = sorted({specs[i].family for i in range(len(specs)) if predicted[i] is None})
        log.warning("the %s profile has no tables for %s: those candidates are left out (run `python -m tuner "
                    "profile` on that GPU: it resumes and measures only what is missing)", gpu_name,
                    ", ".join(lacking))
    return [specs[i] for i in keep], [predicted[i] for i in keep]


# Kernels shorter than this get the extra rounds of :func:`measure_each`: on launches of a few microseconds
# where the buffers land moves a candidate by 1-7 %, as much as the 5 % that judges a choice; a kernel of
# 50 us or more streams megabytes over many pages, and re-uploading a large graph's layouts each round
# would cost seconds.
ROUNDS_UNDER_MS = 0.05
DEFAULT_ROUNDS = 5  # the report's rounds of a short candidate: enough for a median and a range


def measure_each(m: CanonicalMatrix, specs: list[Specialization], binaries: list, seed: int = 0,
                 rounds: int = 1):
    """Milliseconds of every candidate on the GPU (CUDA events, warm-up, adaptive repeats), yielded one by
    one as each is timed, so that a long run can record them as they come: per candidate a tuple of
    per-round medians.

    The matrix arrays are uploaded once and shared; a candidate that fails to load or run gets NaN. With
    ``rounds`` > 1, a candidate whose first round is shorter than :data:`ROUNDS_UNDER_MS` is timed again
    ``rounds - 1`` times, each on arrays uploaded afresh behind a pad of random size, so that its median
    covers where its buffers happen to land.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    arrays = DeviceArrays()
    pads = np.random.default_rng(seed)
    for spec, binary in zip(specs, binaries):
        try:
            times = [_median_ms(SpMV(m, spec, binary.cubin, plan=None, arrays=arrays), seed)]
            for _ in range(rounds - 1 if times[0] < ROUNDS_UNDER_MS else 0):
                pad = gpu.alloc(int(pads.integers(1, 64)) << 20)  # moves this round's arrays; held while it runs
                times.append(_median_ms(SpMV(m, spec, binary.cubin, plan=None, arrays=DeviceArrays()), seed))
                del pad
            yield tuple(times)
        except gpu.GpuError as exc:  # e.g. a launch the device refuses: rank it last, keep tuning
            log.warning("candidate %s failed on the GPU: %s", spec.label(), exc)
            yield (float("nan"),)


def _median_ms(k: SpMV, seed: int) -> float:
    """One round: a short run to size the repeats, then the median of as many as fit the time budget."""
    first = float(np.median(time_spmv(k, repeats=3, warmup=1, seed=seed)))
    return float(np.median(time_spmv(k, adaptive_repeats(first), warmup=2, seed=seed)))


def measure(m: CanonicalMatrix, specs: list[Specialization], binaries: list, seed: int = 0) -> list[float]:
    """:func:`measure_each` in one round, as a list of medians."""
    return [t[0] for t in measure_each(m, specs, binaries, seed)]


NO_TUNING = "none"
COMPILE_TUNE_MODES = planner.TUNE_MODES + (NO_TUNING,)


def check_tune(tune: str) -> str:
    """``tune`` if :func:`compile` takes it (its modes, 'none' included); else ValueError naming them.

    Example:
        >>> check_tune("none")
        'none'
    """
    if tune not in COMPILE_TUNE_MODES:
        raise ValueError(f"tune must be one of {COMPILE_TUNE_MODES}, got {tune!r}")
    return tune


def compile(A, *, dtype=None, index_dtype=None, tune: str = "model", top_k: int = 3, trials: int = 24,
            family: str | None = None, params: dict | None = None, cache_dir=None, profile=None,
            background: bool | None = None, device_memory_limit=None) -> SpMV:
    """Plan, render, compile and load an SpMV kernel for ``A`` on this GPU.

    Args:
        A: any SciPy sparse matrix (or array).
        dtype: float32 or float64 values (default: those of ``A``; integers and booleans become float32).
        index_dtype: force int64 indices (default: int32 when the matrix fits).
        tune: 'model' (default) takes the model's first choice and times nothing; 'measure' times the
            model's ``top_k``; 'exhaustive' times every candidate; 'optuna' runs an Optuna study of
            ``trials`` trials per fingerprint, seeded with the model's ``top_k`` and resumable; 'none'
            plans nothing: the generic kernel of :mod:`tuner.tiered` in the caller's order, ready in
            milliseconds (for a few hundred products or fewer, which a tuning never pays back).
        family, params: skip tuning and build exactly this family with these parameters.
        cache_dir: plan, binary and study cache (default ``$TUNER_CACHE_DIR``, ``cache/`` of a checkout, or
            ``~/.cache/sparse-tuner``). A second compile of the same structure times nothing, runs no nvcc.
        profile: a :class:`~tuner.model.Profile` or a path to one (default: the shipped profile of this GPU).
            Without any, the model modes fall back to 'exhaustive' with a warning.
        background: tune on a thread while a stand-in kernel answers the first calls
            (:mod:`tuner.tiered`). Default (None): where it pays, in model mode, for matrices of a million
            entries or more that leave the device room; True: wherever CuPy and the room are there; False:
            never (the call returns the tuned kernel).
        device_memory_limit: device memory the product may hold (bytes or a figure such as '4G'; default:
            what is free). A matrix that does not fit it is streamed from host memory every product
            (:mod:`tuner.streaming`; ``spmv.explain()`` says so and why).

    Returns:
        an :class:`~tuner.kernel.SpMV`, a :class:`~tuner.streaming.StreamedSpMV` for a matrix over the
        device-memory budget, or with ``background`` a :class:`~tuner.tiered.TieredSpMV`:
        ``spmv(x)`` computes ``A @ x``, ``spmv.plan`` holds the decision (and waits for it), ``spmv.wait()``
        returns the tuned kernel.

    Raises:
        MatrixError: for input the tuner cannot accept (the message names the problem).
        NoDeviceError: when no CUDA GPU is present (use :func:`prepare` to plan and compile without one).

    Example (on a GPU machine):
        >>> import numpy as np, scipy.sparse as sp, tuner  # doctest: +SKIP
        >>> spmv = tuner.compile(sp.random(500, 500, density=0.02, format="csr", dtype=np.float32))  # doctest: +SKIP
        >>> spmv.plan.family in ("csr_vector", "binned")  # doctest: +SKIP
        True
    """
    check_tune(tune)
    if params is not None and family is None:
        raise ValueError("params= needs family=")
    if tune == NO_TUNING and family is not None:
        raise ValueError("tune='none' builds the generic kernel: family= names another")
    if background and (tune != "model" or family is not None):
        raise ValueError("background= tunes in model mode: the other modes time candidates on the GPU, and "
                         "family= needs no tuning")
    if device_memory_limit is not None:
        streaming.budget_of(device_memory_limit, 0)  # a limit it cannot read is named before the GPU is asked for
    cache = Cache(cache_dir)
    m = canonicalize(A, dtype, index_dtype)
    info = gpu.device_info()  # raises NoDeviceError before any work that needs the GPU
    if family is not None:
        return _fixed(m, structure_digest(m), info, family, params or {}, cache)
    streamed = streaming.compile_streamed(m, device_memory_limit, info.arch, cache)
    if streamed is not None:
        return streamed
    if tune == NO_TUNING:
        return tiered.stand_in(m, info.arch, cache, force=True) or _fixed(
            m, structure_digest(m), info, tiered.STAND_IN_FAMILY, families.params_dict(tiered.STAND_IN_PARAMS), cache)
    if background is not False and tune == "model":
        first = tiered.stand_in(m, info.arch, cache, force=bool(background))
        if first is not None:
            if device_reorder.usable(m.n_rows, m.n_cols, m.nnz, relabel_bytes(m)):
                plan_worker.start()  # it loads its modules while the first products run and the GPU relabels
            return tiered.TieredSpMV(first, lambda hand_over: _tuned(m, info, cache, tune, top_k, trials, profile,
                                                                     hand_over))
    return _tuned(m, info, cache, tune, top_k, trials, profile)


def _tuned(m: CanonicalMatrix, info, cache: Cache, tune: str, top_k: int, trials: int, profile,
           hand_over=None) -> SpMV:
    """The tuned kernel of :func:`compile`: the plan from the cache or made now, its binary and layout.
    ``hand_over``: where a background tuning relabels the matrix on the device, it is given the interim
    kernel (:func:`tiered.interim`) as soon as the relabelled matrix is there (before the plan cache is read:
    the digest that keys it may still be hashing) to answer the calls until the tuned kernel does, unless the
    caller waits for that; a plan made anew there is made in a process of its own
    (:mod:`tuner.plan_worker`) unless the caller waits for the tuned kernel."""
    prof = _profile(info, profile)
    interim = None
    plans: dict = {}  # plan key -> the cached plan or None, read once (by early() or this thread, the first)
    reading = threading.Lock()

    def cached_plan(key):
        with reading:
            if key not in plans:
                plans[key] = planner.load_plan(cache, key)
            return plans[key]

    def relabelled():  # the interim kernel as soon as the relabelled matrix is there, the digest perhaps not
        nonlocal interim
        if hand_over is not None and not hand_over.caller_waits:
            interim = _interim(m, info, cache, prof)
            if interim is not None:
                hand_over(interim)

    def early(digest):  # the caller-order predictions, on the digest's thread (the planner takes them last)
        key = planner.plan_key(digest, m.value_dtype, info.name, info.capability, tune, prof.digest)
        if cached_plan(key) is not None:
            return None
        ordering(m, TILE_ORDER)  # the relabelling's first step: m's column lengths (counted on the GPU) with it
        t0 = time.perf_counter()
        try:
            known = caller_order_predictions(m, prof)
        except MemoryError as e:  # CuPy's OutOfMemoryError is one: beside the relabelling's sorts, room was short
            log.warning("no caller-order predictions beside the relabelling (%s): they are made after it", e)
            return None
        return known, time.perf_counter() - t0

    in_process = prof is not None and (hand_over is None or hand_over.caller_waits)
    digest, relabel_s, early_result = _digest_beside_relabelling(m, relabelled, early if in_process else None)
    if prof is None and tune != "exhaustive":
        log.warning("no GPU profile for %s (run `python -m tuner profile`): tune=%r falls back to 'exhaustive'",
                    info.name, tune)
        tune = "exhaustive"
    key = planner.plan_key(digest, m.value_dtype, info.name, info.capability, tune, prof.digest if prof else "")
    plan = cached_plan(key)
    if plan is not None:
        binary = codegen.load_binary(plan.binary_key, plan.arch, cache)
        spec = plan.specialization()
        if binary is None:  # binary evicted or corrupt: rebuild it, keep the plan
            binary = codegen.compile_source(families.render(spec, m), plan.arch, cache=cache)
        return _spmv(m, spec, binary.cubin, plan, cache, digest, _interim_layout(interim, spec))
    apart = hand_over is not None and relabel_s > 0 and prof is not None and not hand_over.caller_waits
    planned = _plan_apart(m, prof) if apart else None
    early_s = []

    def known():  # the caller-order predictions, waited for only once the planner has made the others
        made = early_result()
        if made is None:
            return None
        early_s.append(made[1])
        return made[0]
    specs, predicted, seconds = planned if planned is not None else plan_candidates(
        m, prof, known=known if early_result is not None else None)
    seconds["relabel"] += relabel_s  # made beside the digest, before the planner asked for it
    if early_s:
        seconds["plan_early"] = early_s[0]
    if prof and tune != "exhaustive":
        specs, predicted = predictable(specs, predicted, info.name)
    binaries: dict[int, codegen.Binary] = {}

    def build(subset):  # compile only what is timed (all of it in parallel) or finally chosen
        missing = [s for s in subset if id(s) not in binaries]
        for s, b in zip(missing, codegen.compile_many([families.render(s, m) for s in missing], info.arch,
                                                      cache=cache)):
            binaries[id(s)] = b
        return [binaries[id(s)] for s in subset]

    def timer(subset):
        return measure(m, list(subset), build(subset))

    def search():
        return optuna_search([s.label() for s in specs], predicted, lambda i: timer([specs[i]])[0],
                             study_name=f"{digest}-{m.value_dtype.name}-{paths.gpu_slug(info.name)}",
                             storage_dir=cache.root, trials=trials, seed_top=top_k)

    t0 = time.perf_counter()
    best, ranking = planner.select(tune, specs, predicted, timer, top_k=top_k, search=search)
    if any(t.measured_ms is not None for t in ranking):
        seconds["select"] = time.perf_counter() - t0
    chosen = next(t for t in ranking if t.family == best.family and t.params == families.params_dict(best.params))
    binary_key = build([best])[0].key
    # The plan's summary statistics (host passes over the rows and columns) are counted while the layout is
    # built, mostly on the GPU.
    with thread_pool(1) as pool:
        features = pool.submit(structure_features, m)
        launch, how = _interim_layout(interim, best) or layouts.launch_for(m, best, cache, digest)
        plan = planner.Plan(family=best.family, params=families.params_dict(best.params),
                            predicted_ms=chosen.predicted_ms, measured_ms=chosen.measured_ms, fingerprint=digest,
                            value_dtype=m.value_dtype.name, index_dtype=m.index_dtype.name,
                            value_free=m.value_free, arch=info.arch, binary_key=binary_key, tune=tune,
                            ranking=ranking, features=features.result(), seconds=seconds)
    planner.store_plan(cache, key, plan)
    return _spmv(m, best, binaries[id(best)].cubin, plan, cache, digest, (launch, how))


def _plan_apart(m: CanonicalMatrix, profile: Profile) -> tuple[list, list, dict] | None:
    """:func:`plan_candidates` made in the planner process (:func:`tuner.plan_worker.plan_apart`) from the
    matrix relabelled on the GPU, as (specs, predictions, seconds: 'relabel' 0, 'plan' the wall from the
    copies to the answer, 'plan_share' the copies, 'plan_child' the child's part); None where it cannot
    (the caller's process plans)."""
    view, ordering = known_layout(m, ("permuted", TILE_ORDER)), known_layout(m, ("ordering", TILE_ORDER))
    if view is None or ordering is None:
        return None
    planned = plan_worker.plan_apart(m, view, ordering, profile)
    if planned is None:
        return None
    specs, predicted, seconds = planned
    return specs, predicted, {"relabel": 0.0, "plan": seconds["plan"], "plan_share": seconds["share"],
                              "plan_child": seconds["child"]}


def _interim_layout(interim, spec: Specialization):
    """``(layout, 'device')`` of the interim kernel where ``spec`` is its own specialisation: a plan that chose
    it, made now or read from the cache, runs on the layout already built for it; else None.

    Example:
        >>> _interim_layout(None, None) is None
        True
    """
    return (interim.layout, "device") if interim is not None and interim.spec == spec else None


def _interim(m: CanonicalMatrix, info, cache: Cache, profile):
    """:func:`tiered.interim`, or None with a warning where making it failed: it only speeds up the products
    made during the planning, so its failure must not fail the tuning."""
    try:
        return tiered.interim(m, info.arch, cache, profile)
    except Exception as e:  # noqa: BLE001 - the stand-in answers on; the tuning goes on
        log.warning("no interim kernel (%s: %s): the stand-in answers until the tuned kernel is ready",
                    type(e).__name__, e)
        return None


def _digest_beside_relabelling(m: CanonicalMatrix, relabelled=None, after_digest=None) -> tuple[str, float, object]:
    """``m``'s structure digest (the plan cache's key; a hash of every index, on the host's cores) while
    this thread relabels ``m`` for the tiled candidates where that runs on the GPU (the planner starts with
    it, and the plans of large power-law graphs use it, so on a plan-cache hit it is seldom wasted; a plan
    in the caller's order drops it with the other device copies), then calls ``relabelled`` (if given) before
    it waits for the digest; with the relabelling's seconds (0.0 where it was not made here, and
    ``relabelled`` not called) and a callable that waits for and returns what ``after_digest(digest)``
    returned (None where not given or nothing was relabelled here): called on the digest's thread once the
    digest is made, beside the relabelling, it may go on after this returns.
    """
    if not device_reorder.usable(m.n_rows, m.n_cols, m.nnz, relabel_bytes(m)):
        return structure_digest(m), 0.0, None
    hashed: Future = Future()

    def digest_then():
        try:
            digest = structure_digest(m)
        except BaseException as e:
            hashed.set_exception(e)
            raise
        hashed.set_result(digest)
        return after_digest(digest) if after_digest is not None else None
    pool = thread_pool(1)
    done = pool.submit(digest_then)
    pool.shutdown(wait=False)  # its one thread ends with digest_then
    t0 = time.perf_counter()
    ordered_matrix(m, TILE_ORDER)
    relabel_s = time.perf_counter() - t0
    if relabelled is not None:
        relabelled()
    return hashed.result(), relabel_s, done.result if after_digest is not None else None


def _spmv(m: CanonicalMatrix, spec, cubin: bytes, plan, cache: Cache, digest: str, layout=None) -> SpMV:
    """The callable, its layout (``layout``: (launch, how) already made) loaded from the layout cache or
    built (and kept there when that pays)."""
    launch, how = layout if layout is not None else layouts.launch_for(m, spec, cache, digest)
    spmv = SpMV(m, spec, cubin, plan, launch=launch, layout_source=how)
    drop_device_copies(m)
    return spmv


def _profile(info, profile) -> Profile | None:
    if isinstance(profile, Profile):
        return profile
    try:
        return load_profile(info.name, profile)
    except FileNotFoundError:
        if profile is not None:
            raise
        return None


def _fixed(m, digest: str, info, family: str, params: dict, cache: Cache) -> SpMV:
    fam = families.get(family)
    spec = Specialization(family, fam.params_from_dict(params), m.value_dtype, m.index_dtype, m.value_free)
    binary = codegen.compile_source(families.render(spec, m), info.arch, cache=cache)
    plan = planner.Plan(family=family, params=families.params_dict(spec.params), predicted_ms=None,
                        measured_ms=None, fingerprint=digest, value_dtype=m.value_dtype.name,
                        index_dtype=m.index_dtype.name, value_free=m.value_free, arch=info.arch,
                        binary_key=binary.key, tune="fixed")
    return _spmv(m, spec, binary.cubin, plan, cache, digest)
