"""``python -m tuner bench``: our tuned SpMV against cuSPARSE on real and generated matrices.

Per matrix it records the chosen plan, our median time, cuSPARSE's (when CuPy is importable: the best of
CSR and COO through ``cupyx.cusparse.spmv``, which makes its descriptors and work space at every call, and
CSR, analysed once, and COO through descriptors and work space made once, as a careful caller of many
products keeps them: :class:`~tuner.graph.cusparse_products.CachedSpmv`), the ratio, the achieved bandwidth on the compulsory
bytes and its fraction of the device-to-device copy bandwidth measured in the same run, the error against
SciPy in float64, the tuning time and the cache-hit time of a second compile, and the time to a first
product from a host SciPy matrix, ours and cuSPARSE's, with the products it takes ours to catch up.
"""
from __future__ import annotations

import json
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from . import __version__, gpu, layouts, loaders, paths
from .cache import cold_plans
from .compiler import compile as compile_spmv
from .host_products import matvec64
from .kernel import copy_bandwidth_gbs, random_vector, time_spmv
from .matrix import CanonicalMatrix, canonicalize
from .memory import peak_rss
from .stages import Stages

GENERATED = ("rmat:20", "rmat:23", "rmat:25")
# Kronecker-scaled real graphs of 50M+ non-zeros (the default seed about triples nnz per step): 72M-87M
# for the report, plus cnr-2000 at about 260M for the benchmark.
KRONECKER_SCALED = (("cnr-2000.npz", 3), ("ego-Twitter-undirected.npz", 3), ("soc-Slashdot0902.npz", 4))
KRONECKER_BENCH_ONLY = (("cnr-2000.npz", 4),)


@dataclass(frozen=True)
class BenchRow:
    """One matrix's results; times in milliseconds, bandwidths in GB/s (10^9 bytes per second).

    cuSPARSE's product: ``cusparse_csr_ms`` and ``cusparse_coo_ms`` through ``cupyx.cusparse.spmv`` (its
    descriptors and work space made at every call), ``cusparse_kept_ms`` CSR through descriptors made once
    and analysed once (``cusparseSpMV_preprocess``, where cuSPARSE has it: ``cusparse_preprocessed``),
    ``cusparse_kept_coo_ms`` COO through descriptors made once; ``cusparse_ms`` is the least of them, the
    anchor of ``speedup``.

    The time to a first product (``time_to_first_ms``: host SciPy matrix to the first y on the host, a cold
    plan and layout cache but the compiled kernels cached; ``cusparse_time_to_first_ms``: the matrix copied
    into a CuPy CSR, one cuSPARSE product, y back) and the products after which ours is ahead in total
    (``break_even_products``: None where ours is not faster per product; where our compile tunes in the
    background, its first products run on the stand-in, so both sides run products until ours has run 100
    tuned ones and the running totals are compared: :func:`raced_break_even`; ``race_min_lead_ms``: in that
    race, the smallest lead of ours over cuSPARSE in total time after the same number of products, negative
    where ours was behind: :func:`race_min_lead`). ``tune_s``: the first compile
    until the tuned kernel is made; ``cache_hit_ms``: a second compile of the same matrix (plan, kernels and
    layout from the cache), until its tuned kernel is ready. ``tuned_after_ms``: in the race, host matrix to
    the tuned kernel taking over the calls (None where the compile returned it), ``interim_after_ms`` to the
    interim kernel taking over from the stand-in (None where none did), and ``stand_in_products``: the
    products the stand-in and the interim answered before (the first one included); ``stand_in_race``: those
    of the race's products they answered, their times (:func:`stand_in_summary`: what the tuning beside them cost
    the caller, against the stand-in's own pace). ``layout_s``: the chosen layout built
    again as a compile builds it, relabelling included (``layout_where``: 'device' on the GPU, 'built' on
    the host). ``compile_host_peak_bytes``: the most resident host memory the first (cold) compile held at
    once beyond what the process held before it, the caller's matrix included there (``input_csr_bytes``:
    its CSR arrays; :func:`~tuner.memory.peak_rss`). ``seconds``: the row's wall seconds by stage (load,
    compile, cache_hit, layout, reference: SciPy's float64 product; timing: ours timed; cusparse: its
    formats built, checked and timed; race_ours and race_cusparse: the time-to-first races).
    """

    name: str
    n_rows: int
    n_cols: int
    nnz: int
    value_free: bool
    plan: str
    ours_ms: float
    ours_kernel_ms: float
    cusparse_csr_ms: float | None
    cusparse_coo_ms: float | None
    cusparse_ms: float | None
    speedup: float | None
    compulsory_bytes: int
    achieved_gbs: float
    floor_fraction: float
    rel_error: float
    load_s: float
    tune_s: float
    cache_hit_s: float
    layout_s: float = float("nan")
    layout_where: str | None = None
    plan_s: float = float("nan")
    plan_early_s: float | None = None
    time_to_first_ms: float | None = None
    cusparse_time_to_first_ms: float | None = None
    cache_hit_ms: float | None = None
    break_even_products: int | None = None
    race_min_lead_ms: float | None = None
    tuned_after_ms: float | None = None
    interim_after_ms: float | None = None
    stand_in_products: int | None = None
    stand_in_race: dict | None = None
    input_csr_bytes: int | None = None
    compile_host_peak_bytes: int | None = None
    cusparse_kept_ms: float | None = None
    cusparse_kept_coo_ms: float | None = None
    cusparse_preprocessed: bool | None = None
    seconds: dict = field(default_factory=dict)


LARGE_NNZ = 100_000_000  # generated graphs of this many non-zeros or more are built only where a GPU times them


def large_sources(suite: list[str], threshold: int = LARGE_NNZ) -> list[str]:
    """The suite's generated matrices (specs) of ``threshold`` or more non-zeros by their header-only size
    estimate (R-MAT: the edges drawn, an upper bound): built in minutes and tens of GB of host memory,
    worth it only where a GPU will time them. Files are never skipped.

    Example:
        >>> large_sources(["rmat:20", "rmat:23", "rmat:25", "rmat:22:32"])
        ['rmat:23', 'rmat:25', 'rmat:22:32']
    """
    return [s for s in suite if loaders.is_spec(s) and loaders.estimate(s).nnz >= threshold]


def default_suite(data_dir=None, report: bool = False) -> list[str]:
    """Real matrices of the data directory (``data_dir``, else :func:`~tuner.sources.default_data_dir`, if
    present; the non-power-law ones stay as controls), rmat:20, rmat:23, rmat:25 and Kronecker-scaled real
    graphs of 50M+ non-zeros (the benchmark adds a larger one).

    Example:
        >>> default_suite("/nonexistent")
        ['rmat:20', 'rmat:23', 'rmat:25']
    """
    real = loaders.real_matrices(data_dir)
    by_name = {p.name: p for p in real}
    scaled = KRONECKER_SCALED if report else KRONECKER_SCALED + KRONECKER_BENCH_ONLY
    kron = [f"kron:{by_name[n]}:{k}" for n, k in scaled if n in by_name]
    return [str(p) for p in real] + list(GENERATED) + kron


def compulsory_bytes(m: CanonicalMatrix) -> int:
    """Bytes any CSR SpMV must move at least once: indices, values, row pointers, x and y.

    Example:
        >>> import scipy.sparse as sp
        >>> compulsory_bytes(canonicalize(sp.eye(4, format="csr", dtype="float32")))
        84
    """
    isz, vsz = m.index_dtype.itemsize, m.value_dtype.itemsize
    return m.nnz * (isz + vsz) + (m.n_rows + 1) * isz + m.n_cols * vsz + m.n_rows * vsz


def _cupy():
    try:
        import cupy
        import cupyx.cusparse  # noqa: F401
        return cupy
    except Exception:  # noqa: BLE001 - CuPy missing or without a usable CUDA: no cuSPARSE column
        return None


CALLS_PER_SAMPLE = 10
ROUNDS = 4  # turns in which ours and cuSPARSE's ways take their samples (_event_medians)
SAMPLE_SPAN_MS = 1000.0  # the samples of one measurement take about this long in all, ...
MIN_SAMPLES = 20  # ... but never fewer than this many samples


def samples_for(sample_ms: float, repeats: int) -> int:
    """How many samples, of ``sample_ms`` each, one measurement takes: ``repeats``, or fewer where they would
    take over :data:`SAMPLE_SPAN_MS` in all (at least :data:`MIN_SAMPLES`): a product of milliseconds varies
    by a percent or less from one sample to the next, and its median settles long before a hundred samples.

    Example:
        >>> samples_for(0.5, 100), samples_for(20.0, 100), samples_for(95.0, 100), samples_for(95.0, 10)
        (100, 50, 20, 10)
    """
    return int(min(repeats, max(MIN_SAMPLES, -(-SAMPLE_SPAN_MS // max(sample_ms, 1e-6)))))


def _event_medians(cp, calls: dict, repeats: int, rounds: int = ROUNDS, warmup: int = 5) -> dict:
    """Median per-call ms of each of ``calls`` (name -> callable), over :func:`samples_for` ``repeats`` samples
    of ``CALLS_PER_SAMPLE`` back-to-back calls each, taken in ``rounds`` turns: after a warm-up and a first
    sample each, every callable takes its share of its samples in every round. A small graph's calls are
    the host's (tens of microseconds, both ours and cuSPARSE's), and the host runs slower or faster for
    seconds at a time: in turns such a spell falls on every way alike, not on whichever was being timed.

    Back-to-back calls between two events measure what an iterative caller sees: where the GPU work is
    longer than the Python call it hides the call, and where it is shorter the call rate is the limit.

    Example (on a GPU machine):
        >>> _event_medians(cupy, {"ours": lambda: spmv(x, out=y), "kept": lambda: kept(x, y)}, 100)  # doctest: +SKIP
        {'ours': 0.0131, 'kept': 0.0137}
    """
    for fn in calls.values():
        for _ in range(warmup):
            fn()

    def sample(fn) -> float:
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        for _ in range(CALLS_PER_SAMPLE):
            fn()
        end.record()
        end.synchronize()
        return cp.cuda.get_elapsed_time(start, end)

    times = {name: [sample(fn)] for name, fn in calls.items()}
    left = {name: samples_for(times[name][0], repeats) - 1 for name in calls}
    for r in range(rounds):
        for name, fn in calls.items():
            times[name] += [sample(fn) for _ in range(left[name] // rounds + (r < left[name] % rounds))]
    return {name: float(np.median(t)) / CALLS_PER_SAMPLE for name, t in times.items()}


CUSPARSE_WAYS = ("cusparse_csr_ms", "cusparse_coo_ms", "cusparse_kept_ms", "cusparse_kept_coo_ms")


def _cusparse_calls(cp, m: CanonicalMatrix, x_host: np.ndarray, ref: np.ndarray) -> tuple[dict, bool | None]:
    """cuSPARSE's SpMV of the matrix as given, by the :data:`CUSPARSE_WAYS` it is timed in (CSR and COO
    through ``cupyx.cusparse.spmv``, CSR and COO through descriptors made once,
    :class:`~tuner.graph.cusparse_products.CachedSpmv`, the CSR one analysed once), each result checked
    against SciPy's; with whether that analysis ran. None each where not supported."""
    import cupyx.cusparse as cusparse
    import cupyx.scipy.sparse as cpsp
    from .graph.cusparse_products import CachedSpmv
    if m.index_dtype != np.int32:
        return {}, None  # CuPy's sparse matrices hold int32 indices only
    a_csr = cpsp.csr_matrix((cp.asarray(m.data), cp.asarray(m.indices), cp.asarray(m.indptr)), shape=m.shape)
    # A canonical matrix's rows are sorted and free of duplicates, and so is the COO made from them (as
    # cuSPARSE's COO path requires): said, not checked on the GPU, where CuPy's checks are reductions it
    # builds as CUB kernels on first use, seconds each on a fresh install.
    a_csr.has_canonical_format = True
    x = cp.asarray(x_host)
    y = cp.empty(m.n_rows, dtype=m.value_dtype)
    a_coo = a_csr.tocoo()
    a_coo.has_canonical_format = True
    kept, kept_coo = CachedSpmv(a_csr), CachedSpmv(a_coo)
    calls = dict(zip(CUSPARSE_WAYS, (lambda: cusparse.spmv(a_csr, x, y=y), lambda: cusparse.spmv(a_coo, x, y=y),
                                     lambda: kept(x, y), lambda: kept_coo(x, y))))
    for call in calls.values():
        y.fill(np.nan)
        call()
        err = _rel_error(cp.asnumpy(y), ref)
        if not err < 1e-4:
            raise RuntimeError(f"cuSPARSE result disagrees with SciPy (relative error {err:.2e})")
    return calls, kept.preprocessed


def _rel_error(y: np.ndarray, ref: np.ndarray) -> float:
    denom = np.linalg.norm(ref)
    diff = np.linalg.norm(y.astype(np.float64) - ref)
    return float(diff / denom) if denom else float(diff)


def bench_one(source: str, repeats: int = 100, cp=None, copy_gbs: float = 0.0, cache_dir=None,
              tune: str = "model") -> BenchRow:
    """Tune, verify and time one matrix against cuSPARSE (see the module docstring)."""
    clock = Stages()
    A = loaders.load(source)
    m = canonicalize(A)
    clock.stage("load")
    # Until the tuned kernel is made: a compile that tunes in the background returns before it.
    spmv, compile_peak = peak_rss(lambda: compile_spmv(A, cache_dir=cache_dir, tune=tune).wait())
    clock.stage("compile")
    layouts.wait()  # the layout the first compile keeps is on disk before the second looks for it
    t0 = time.perf_counter()
    spmv = compile_spmv(A, cache_dir=cache_dir, tune=tune).wait()  # second compile: plan, binary, layout cached
    cache_hit_s = time.perf_counter() - t0
    clock.stage("cache_hit")
    # The chosen layout built again from a fresh canonical matrix (relabelling included), where compile
    # builds it (on the GPU where it can): its cost on a plan-cache hit.
    fresh = canonicalize(A)
    t0 = time.perf_counter()
    built, layout_where = layouts.build(fresh, spmv.spec)
    layout_s = time.perf_counter() - t0
    del fresh, built
    clock.stage("layout")
    x = random_vector(m.n_cols, m.value_dtype, seed=1)
    ref = matvec64(m.to_scipy(), x)
    clock.stage("reference")
    y = spmv(x)
    err = _rel_error(y, ref)
    kernel_ms = float(np.median(time_spmv(spmv, repeats, warmup=5)))
    clock.stage("timing")
    csr_ms = coo_ms = kept_ms = kept_coo_ms = preprocessed = None
    ours_ms = kernel_ms
    if cp is not None:
        xd = cp.asarray(x)
        yd = cp.full(m.n_rows, np.nan, dtype=m.value_dtype)
        spmv(xd, out=yd)
        err = max(err, _rel_error(cp.asnumpy(yd), ref))
        cusparse_calls, preprocessed = _cusparse_calls(cp, m, x, ref)
        # ours and cuSPARSE's ways timed in turns: the stage 'cusparse' holds our calls' samples too
        medians = _event_medians(cp, {"ours": lambda: spmv(xd, out=yd), **cusparse_calls}, repeats)
        ours_ms = medians["ours"]
        csr_ms, coo_ms, kept_ms, kept_coo_ms = (medians.get(way) for way in CUSPARSE_WAYS)
        clock.stage("cusparse")
    timed = [t for t in (csr_ms, coo_ms, kept_ms, kept_coo_ms) if t is not None]
    best_cusparse = min(timed) if timed else None
    first_ms, ours_totals, tuned_after_ms, interim_after_ms, stand_in_products, stand_in_ms = _ours_race(
        cp, A, x, cache_dir, tune)
    clock.stage("race_ours")
    cu_first_ms, cu_totals = (_cusparse_race(cp, m, x, len(ours_totals), coo=kept_coo_ms < kept_ms)
                              if best_cusparse is not None else (None, []))
    clock.stage("race_cusparse")
    nbytes = compulsory_bytes(m)
    achieved = nbytes / (ours_ms * 1e-3) / 1e9
    return BenchRow(name=loaders.display_name(source), n_rows=m.n_rows,
                    n_cols=m.n_cols, nnz=m.nnz, value_free=m.value_free, plan=spmv.spec.label(),
                    ours_ms=ours_ms, ours_kernel_ms=kernel_ms, cusparse_csr_ms=csr_ms, cusparse_coo_ms=coo_ms,
                    cusparse_kept_ms=kept_ms, cusparse_kept_coo_ms=kept_coo_ms,
                    cusparse_preprocessed=preprocessed, cusparse_ms=best_cusparse,
                    speedup=(best_cusparse / ours_ms) if best_cusparse else None,
                    compulsory_bytes=nbytes, achieved_gbs=achieved,
                    floor_fraction=achieved / copy_gbs if copy_gbs else float("nan"), rel_error=err,
                    load_s=clock.seconds["load"], tune_s=clock.seconds["compile"], cache_hit_s=cache_hit_s,
                    layout_s=layout_s, layout_where=layout_where,
                    plan_s=spmv.plan.seconds.get("plan", float("nan")),
                    plan_early_s=spmv.plan.seconds.get("plan_early"), time_to_first_ms=first_ms,
                    cusparse_time_to_first_ms=cu_first_ms, cache_hit_ms=1e3 * cache_hit_s,
                    input_csr_bytes=int(sum(a.nbytes for a in (A.indptr, A.indices, A.data))),
                    compile_host_peak_bytes=int(compile_peak),
                    tuned_after_ms=tuned_after_ms, interim_after_ms=interim_after_ms,
                    stand_in_products=stand_in_products,
                    stand_in_race=stand_in_summary(stand_in_ms),
                    break_even_products=raced_break_even(first_ms, ours_totals, ours_ms, cu_first_ms, cu_totals,
                                                         best_cusparse),
                    race_min_lead_ms=race_min_lead(first_ms, ours_totals, cu_first_ms, cu_totals),
                    seconds=clock.rounded())


def break_even(first_ms: float, per_ms: float, other_first_ms: float | None, other_per_ms: float | None) -> int | None:
    """The fewest products after which ours (``first_ms`` to the first, then ``per_ms`` each) has taken no longer
    in total than the other; None where ours is not faster per product.

    Example:
        >>> break_even(1000.0, 1.0, 100.0, 2.0), break_even(50.0, 1.0, 100.0, 2.0), break_even(9.0, 2.0, 1.0, 1.0)
        (901, 1, None)
    """
    if other_first_ms is None or other_per_ms is None or per_ms >= other_per_ms:
        return None
    return max(1, int(np.ceil(1 + (first_ms - other_first_ms) / (other_per_ms - per_ms))))


def raced_break_even(first_ms: float, totals: list[float], per_ms: float, other_first_ms: float | None,
                     other_totals: list[float], other_per_ms: float | None) -> int | None:
    """:func:`break_even` from measured running totals: ``totals[i]`` is ours' time from the host matrix to
    the end of product i + 2 (the first one took ``first_ms``), ``other_totals`` the other's. The answer is
    the first product from which ours is never behind in what was measured; where ours is still behind at
    the end, the rest is carried on at the per-product times ``per_ms`` and ``other_per_ms``. Without
    totals (a compile that does not tune in the background runs at ``per_ms`` from the first product) it
    is :func:`break_even`.

    Example (ours starts 1 ms later, is 2 ms slower a product twice, then 4 ms faster):
        >>> raced_break_even(11.0, [23.0, 35.0, 41.0, 47.0], 6.0, 10.0, [20.0, 30.0, 40.0, 50.0], 10.0)
        5
        >>> raced_break_even(11.0, [23.0], 8.0, 10.0, [20.0], 10.0)   # 3 ms behind after 2: 2 more products
        4
    """
    if other_first_ms is None or other_per_ms is None:
        return None
    k = min(len(totals), len(other_totals))
    if k == 0:
        return break_even(first_ms, per_ms, other_first_ms, other_per_ms)
    ours = np.array([first_ms, *totals[:k]])
    other = np.array([other_first_ms, *other_totals[:k]])
    behind = np.flatnonzero(ours > other)
    if behind.size == 0:
        return 1
    if behind[-1] < k:
        return int(behind[-1]) + 2
    rest = break_even(float(ours[-1]), per_ms, float(other[-1]), other_per_ms)
    return None if rest is None else k + rest


def race_min_lead(first_ms: float, totals: list[float], other_first_ms: float | None,
                  other_totals: list[float]) -> float | None:
    """The smallest lead of ours over the other in a race (:func:`raced_break_even`'s arguments): the other's
    total time minus ours after the same number of products, the first one included, over the products both
    ran; negative where ours was behind. None without the other's times.

    Example (ahead by 9 ms after the first product, 7 after the second, 1 after the third):
        >>> race_min_lead(11.0, [23.0, 39.0], 20.0, [30.0, 40.0])
        1.0
    """
    if other_first_ms is None:
        return None
    k = min(len(totals), len(other_totals))
    return float(np.min(np.array([other_first_ms, *other_totals[:k]]) - np.array([first_ms, *totals[:k]])))


RACE_AFTER = 100  # products of the tuned kernel a race runs on for
RACE_LIMIT_S = 30.0  # and no longer than this in all


def stand_in_summary(times_ms) -> dict | None:
    """The stand-in's products in a race (ms each): how many, their 10th, 50th and 90th percentiles and
    longest, and ``excess_ms``, their time beyond the 10th percentile summed: what the tuning beside them
    (its sorts, frees and host passes) cost the caller, against the stand-in's own pace. None without any.

    Example (one product held up 8 ms):
        >>> stand_in_summary([1.0, 1.0, 1.1, 9.0, 1.0])
        {'products': 5, 'p10_ms': 1.0, 'p50_ms': 1.0, 'p90_ms': 5.84, 'max_ms': 9.0, 'excess_ms': 8.1}
    """
    t = np.asarray(times_ms, dtype=np.float64)
    if t.size == 0:
        return None
    p10, p50, p90 = (float(v) for v in np.percentile(t, [10, 50, 90]))
    return {"products": int(t.size), "p10_ms": round(p10, 3), "p50_ms": round(p50, 3), "p90_ms": round(p90, 3),
            "max_ms": round(float(t.max()), 3), "excess_ms": round(float((t - p10).clip(min=0).sum()), 3)}


def _ours_race(cp, A, x: np.ndarray, cache_dir, tune: str
               ) -> tuple[float, list[float], float | None, float | None, int | None, list[float]]:
    """Host matrix to the first y on the host (ms) through a cache that has the compiled kernels but no plan
    or layout of this matrix (a new matrix on a machine that has compiled before); then, where the compile
    tunes in the background, the running total (ms) after each further product on device vectors (each
    waited for on the caller's stream, as an iterative caller reading a norm does) until the tuned kernel
    has made ``RACE_AFTER``;
    and when the tuned kernel and the interim one took over (ms from the host matrix) after how many
    products before the tuned kernel (None where the compile returned the tuned kernel or no interim
    took over); and the times (ms) of the race's products answered before the tuned kernel."""
    with cold_plans(cache_dir) as cold:
        t0 = time.perf_counter()
        spmv = compile_spmv(A, cache_dir=cold, tune=tune)
        spmv(x)
        first = 1e3 * (time.perf_counter() - t0)
        totals: list[float] = []
        stand_in: list[float] = []
        if cp is not None and not _tuned_now(spmv):
            xd, yd = cp.asarray(x), cp.empty(A.shape[0], x.dtype)
            after = 0
            while after < RACE_AFTER and time.perf_counter() - t0 < RACE_LIMIT_S:
                tuned = _tuned_now(spmv)
                spmv(xd, out=yd)
                # The caller's stream, as reading a norm waits for it (not the device: the tuning's own
                # stream is no part of the caller's product).
                cp.cuda.get_current_stream().synchronize()
                totals.append(1e3 * (time.perf_counter() - t0))
                if not tuned:
                    stand_in.append(totals[-1] - (totals[-2] if len(totals) > 1 else first))
                after += tuned
        spmv.wait()
        switch_s, interim_s = getattr(spmv, "switch_s", None), getattr(spmv, "interim_s", None)
        layouts.wait()
    return (first, totals, None if switch_s is None else 1e3 * switch_s, None if interim_s is None else 1e3 * interim_s,
            getattr(spmv, "stand_in_products", None), stand_in)


def _tuned_now(spmv) -> bool:
    """Whether the tuned kernel answers ``spmv``'s calls now (a plain kernel is the tuned one)."""
    return bool(getattr(spmv, "tuned", True))


def _cusparse_race(cp, m: CanonicalMatrix, x: np.ndarray, products: int, coo: bool = False
                   ) -> tuple[float, list[float]]:
    """Host matrix to the first y on the host through cuSPARSE (a CuPy CSR of it, one product, y copied back;
    ms), then the running total after each of ``products`` further products as :func:`_ours_race` runs them,
    through descriptors made once (:class:`~tuner.graph.cusparse_products.CachedSpmv`), as a caller of many
    products keeps them: of the CSR matrix, analysed once, or with ``coo`` (where that was the faster) of
    its COO form, made from it; the analysis or the conversion is part of the race."""
    import cupyx.cusparse as cusparse
    import cupyx.scipy.sparse as cpsp
    from .graph.cusparse_products import CachedSpmv
    host = m.to_scipy()
    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    a = cpsp.csr_matrix(host)
    cusparse.spmv(a, cp.asarray(x)).get()
    first = 1e3 * (time.perf_counter() - t0)
    totals = []
    if products:
        a.has_canonical_format = True  # a canonical matrix's rows: sorted, no duplicates
        if coo:
            a = a.tocoo()
            a.has_canonical_format = True
        spmv, xd, yd = CachedSpmv(a), cp.asarray(x), cp.empty(m.n_rows, x.dtype)
        for _ in range(products):
            spmv(xd, yd)
            cp.cuda.get_current_stream().synchronize()
            totals.append(1e3 * (time.perf_counter() - t0))
    return first, totals


def format_table(rows: list[BenchRow]) -> str:
    """The bench table as text, one line per matrix.

    Example:
        >>> format_table([]).split()
        ['matrix', 'nnz', 'ours', 'ms', 'cuSPARSE', 'ms', 'speedup', 'GB/s', 'floor', 'layout', 's', 'plan']
    """
    head = (f"{'matrix':<24}{'nnz':>11}{'ours ms':>10}{'cuSPARSE ms':>13}{'speedup':>9}{'GB/s':>7}{'floor':>7}"
            f"{'layout s':>9}  plan")
    lines = [head]
    for r in rows:
        cus = f"{r.cusparse_ms:13.4f}" if r.cusparse_ms is not None else f"{'-':>13}"
        spd = f"{r.speedup:8.2f}x" if r.speedup is not None else f"{'-':>9}"
        lines.append(f"{r.name[:23]:<24}{r.nnz:>11,}{r.ours_ms:10.4f}{cus}{spd}{r.achieved_gbs:7.0f}"
                     f"{r.floor_fraction:7.1%}{r.layout_s:9.2f}  {r.plan}")
    return "\n".join(lines)


def resumed_rows(out: Path | None, gpu_name: str, tune: str, repeats: int) -> tuple[dict, str]:
    """Rows an interrupted run left in ``out`` by matrix name, and its command; refused when that run used
    another GPU, tune mode or repeat count (its rows would not compare).

    Example:
        >>> resumed_rows(None, "H100", "model", 100)
        ({}, '')
    """
    if out is None or not Path(out).is_file():
        return {}, ""
    old = json.loads(Path(out).read_text())
    theirs = (old.get("gpu", {}).get("name"), old.get("tune"), old.get("repeats"))
    if theirs != (gpu_name, tune, repeats):
        raise ValueError(f"cannot resume {out}: it was measured with (GPU, tune, repeats) = {theirs}, this run "
                         f"uses {(gpu_name, tune, repeats)}; pass another --out or drop --resume")
    return {r["name"]: r for r in old.get("rows", [])}, old.get("command", "")


def run(suite: list[str], out: Path | None, repeats: int = 100, cache_dir=None, progress=None,
        tune: str = "model", resume: bool = False) -> dict:
    """Benchmark every matrix of ``suite`` on the GPU and write the JSON report to ``out``; with
    ``resume``, the matrices an interrupted run already wrote to ``out`` keep their rows. ``wall_s``: the
    suite's wall seconds so far (CuPy's import and the copy bandwidth's measurement included)."""
    started = time.perf_counter()
    cp = _cupy()
    info = gpu.device_info()
    copy_gbs = copy_bandwidth_gbs()
    rows: list[BenchRow] = []
    report = {
        "tool": f"sparse-tuner {__version__}", "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join(["python -m tuner"] + sys.argv[1:]) if sys.argv else "",
        "gpu": {"name": info.name, "capability": list(info.capability), "sm_count": info.sm_count,
                "l2_bytes": info.l2_bytes, "memory_bytes": info.memory_bytes,
                "driver_version": info.driver_version},
        "host": platform.node(), "python": platform.python_version(),
        "cusparse": ("cupyx.cusparse.spmv (CuPy %s; CSR and COO) and cuSPARSE's SpMV through descriptors made once "
                     "(CSR analysed once by cusparseSpMV_preprocess where cuSPARSE has it, cusparse_kept_ms; COO, "
                     "cusparse_kept_coo_ms)" % cp.__version__) if cp else None,
        "copy_bandwidth_gbs": copy_gbs, "repeats": repeats, "tune": tune,
        "timing": f"medians of CUDA-event times after warm-up; ours_ms and cusparse_*_ms: whole calls from "
                  f"Python on CuPy arrays, {CALLS_PER_SAMPLE} back to back per sample, {repeats} samples (fewer "
                  f"where they take over {SAMPLE_SPAN_MS / 1e3:.0f} s, at least {MIN_SAMPLES}), ours and "
                  f"cuSPARSE's ways taking their samples in {ROUNDS} turns; "
                  "ours_kernel_ms: the kernel alone on the GPU (launches queued behind a hold kernel, so the "
                  "host's issue rate does not count); a relabelled plan's times include its gathers of x "
                  "and y; layout_s: time to build the chosen layout as a compile does (relabelling included; "
                  "layout_where 'device' on the GPU, 'built' on the host); compile_host_peak_bytes: the resident "
                  "set's high-water mark during the first compile beyond the process's before it; plan_s: "
                  "the planner's wall time for every candidate and its prediction once the relabelled matrix "
                  "is there (Plan.seconds['plan']); plan_early_s: the predictions of the candidates in the "
                  "caller's order, made on another thread from the digest on, beside the relabelling and "
                  "then the rest of the planning, which takes them last (Plan.seconds['plan_early'], null "
                  "where none were)",
        "suite": list(suite), "rows": [],
    }
    done, before = resumed_rows(out, info.name, tune, repeats) if resume else ({}, "")
    if done:
        report["command"] = f"{before} (interrupted); resumed by: {report['command']}"
    for source in (progress(suite) if progress else suite):
        kept = done.get(loaders.display_name(source))
        if kept is not None:
            rows.append(BenchRow(**kept))
        else:
            rows.append(bench_one(source, repeats=repeats, cp=cp, copy_gbs=copy_gbs, cache_dir=cache_dir,
                                  tune=tune))
        report["rows"] = [asdict(r) for r in rows]
        report["wall_s"] = round(time.perf_counter() - started, 1)
        if out is not None:  # after every matrix: an interrupted run keeps what it measured
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(report, indent=1))
    return report


def default_out() -> Path:
    """bench-spmv.json in the present GPU's folder of :func:`~tuner.paths.results_dir`."""
    return paths.gpu_results_dir(gpu.device_info().name) / "bench-spmv.json"


def cli_run(args, suite: list[str], progress) -> None:
    """``python -m tuner bench``'s SpMV suite on this GPU: run, print the table, write bench-spmv.json."""
    out = Path(args.out) if args.out else default_out()
    report = run(suite, out, repeats=args.repeats, cache_dir=args.cache_dir, tune=args.tune,
                 progress=lambda s: progress(s, "bench", "matrix"), resume=args.resume)
    rows = [BenchRow(**r) for r in report["rows"]]
    print(f"\n{report['gpu']['name']}: copy bandwidth {report['copy_bandwidth_gbs']:.0f} GB/s; "
          f"cuSPARSE via {report['cusparse']}")
    print(format_table(rows))
    print(f"\nwrote {out}")
