"""``python -m tuner bench``'s SpGEMM suite: C = A·A and A·Aᵀ, ours against cuSPARSE (CuPy's ``@``).

Per product it records the model's plan and its predictions, the whole-product time of each family (the
symbolic phase included, C left on the device), the chosen family's time, a numeric-only call on the same
structures, cuSPARSE's time and whether its result is right, and whether ours is: against SciPy's product
where that is affordable, else through C v = A (B v) for a random v and the exact columns of sampled rows.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from . import __version__, gpu, loaders
from .cache import Cache
from .formats.row_bins import row_products
from .host_products import matmul64, matvec64
from .spgemm import (FAMILIES, MAX_REPEATS, ROUNDS, SPAN_MS, compile_candidates, compile_spgemm, interleaved_ms,
                     planned_params, timed_ms, whole)
from .spgemm.base import DeviceMemoryError
from .spgemm.row_hash import shared_limit
from .stages import Stages

GENERATED = ("rmat:16", "rmat:18", "rmat:20")
KRONECKER = (("email-Enron.npz", 1), ("wiki-Vote.npz", 2))  # products of a few hundred million
NOT_POWER_LAW = ("bayer10", "bcsstk16", "copter2", "mdual")  # finite-element and circuit controls
SCIPY_PRODUCTS = 60_000_000  # above this many products SciPy's product takes too long: checksums instead
SAMPLED_ROWS = 400


@dataclass(frozen=True)
class SpgemmRow:
    """One product's results; times in milliseconds.

    Attributes:
        name, op: the graph and the product ('AA' or 'AAT').
        nnz, products, nnz_c: A's entries, scalar products, C's entries (None where ours did not run).
        ours_ms: our whole product (symbolic and numeric phases), C on the device; ours_numeric_ms: a call on
            the same structures (numeric phase only).
        cusparse_ms, speedup: cuSPARSE's time (None when it failed) and cusparse_ms / ours_ms.
        cusparse_status: 'ok', 'error: ...' or 'wrong: ...' (its result differs from the checked one).
        ours_correct: our result checked (None where ours refused, for device or host memory: ``error`` says
            why); check: how.
        gflops: 2 x products / ours_ms.
        plan: the family and parameters the model chose; predicted_ms: its prediction per family;
            family_ms: each family's measured time at the model's parameters; candidates_ms: every candidate
            ``tune='measure'`` times (family and parameters, None where it does not fit); pick_within_10pct:
            whether the model's pick is within 10 % of the fastest of all these. All of them are timed in
            turns (:func:`~tuner.spgemm.interleaved_ms`), one median of each configuration.
        peak_device_bytes: the most device memory our call needed (operands, tables, output, CUB's storage).
        power_law: False for the finite-element and circuit controls.
        source: the matrix source (file or generator spec) A came from.
        seconds: the row's wall seconds by stage (load: the matrix made or read; compile: ours planned and
            built; run: its first product, C to the host; check: C checked; sweep_compile and sweep_time: the
            configurations compared built and timed; numeric: the numeric phase timed; cusparse: cuSPARSE run,
            checked and timed).
    """

    name: str
    op: str
    nnz: int
    products: int
    nnz_c: int | None
    ours_ms: float | None
    ours_numeric_ms: float | None
    cusparse_ms: float | None
    speedup: float | None
    cusparse_status: str
    ours_correct: bool | None
    check: str
    gflops: float | None
    plan: str
    predicted_ms: dict
    family_ms: dict
    pick_within_10pct: bool | None
    peak_device_bytes: int | None
    power_law: bool
    error: str | None = None
    source: str = ""
    candidates_ms: dict = field(default_factory=dict)
    seconds: dict = field(default_factory=dict)


def default_suite(data_dir=None) -> list[tuple[str, str]]:
    """(source, op) pairs: A·A and A·Aᵀ of every graph of the data folder, then rmat:16/18/20 and
    Kronecker-scaled graphs, A·A.

    Example:
        >>> default_suite("/nonexistent")[:2]
        [('rmat:16', 'AA'), ('rmat:18', 'AA')]
    """
    real = loaders.real_matrices(data_dir)
    by_name = {p.name: p for p in real}
    pairs = [(str(p), op) for p in real for op in ("AA", "AAT")]
    pairs += [(g, "AA") for g in GENERATED]
    pairs += [(f"kron:{by_name[n]}:{k}", "AA") for n, k in KRONECKER if n in by_name]
    return pairs


def _structure(M: sp.csr_matrix) -> sp.csr_matrix:
    """M with 1 in every stored entry, explicit zeros included: products of these reach every entry C stores."""
    return sp.csr_matrix((np.ones(M.nnz), M.indices, M.indptr), shape=M.shape)


def check_product(C: sp.csr_matrix, A: sp.csr_matrix, B: sp.csr_matrix, products: int, seed: int = 0):
    """(correct, how): C against SciPy's float64 product when ``products`` is small enough, else C v against
    A (B v) for a random v (relative 1e-4 of |A| (|B| |v|)) and the exact columns of sampled rows (the
    heaviest ones and random ones), computed by SciPy from those rows alone. C's entries are those some
    pair of stored entries reaches, explicit zeros of A or B included (as cuSPARSE stores them too).

    Example:
        >>> A = sp.random(50, 50, density=0.1, format="csr", random_state=0)
        >>> check_product((A @ A).tocsr(), A, A, 10)
        (True, 'scipy')
    """
    if products <= SCIPY_PRODUCTS:
        ref = matmul64(A, B)
        ref.sum_duplicates()
        pattern = matmul64(_structure(A), _structure(B))  # every reached entry, cancelled sums included
        same = C.shape == ref.shape and np.array_equal(np.diff(C.indptr), np.diff(pattern.indptr))
        scale = max(abs(ref).max(), 1.0) if ref.nnz else 1.0
        return bool(same and (abs(C.astype(np.float64) - ref).max() if C.nnz else 0.0) <= 1e-5 * scale), "scipy"
    rng = np.random.default_rng(seed)
    v = rng.uniform(0.5, 1.5, C.shape[1])
    bound = matvec64(A, matvec64(B, v, absolute=True), absolute=True) + 1e-30
    sums_ok = bool(np.all(np.abs(matvec64(C, v) - matvec64(A, matvec64(B, v))) <= 1e-4 * bound))
    lengths = np.diff(C.indptr)
    rows = np.unique(np.concatenate([np.argsort(lengths)[-SAMPLED_ROWS // 10:],
                                     rng.integers(0, C.shape[0], SAMPLED_ROWS)]))
    expected = (_structure(A)[rows] @ _structure(B)).tocsr()
    expected.sort_indices()
    got = C[rows]
    cols_ok = (np.array_equal(np.diff(got.indptr), np.diff(expected.indptr))
               and np.array_equal(got.indices, expected.indices))
    return sums_ok and cols_ok, f"C v = A (B v) on every row; columns of {rows.size} sampled rows"


def _cusparse(A, B, C_checked, checked: bool, repeats: int):
    """(ms, status) of cuSPARSE through CuPy; its result compared with our checked C."""
    try:
        import cupy as cp
        import cupyx.scipy.sparse as csp
    except Exception as e:  # noqa: BLE001 - no CuPy: no baseline
        return None, f"error: CuPy unavailable ({type(e).__name__})"
    try:
        dA, dB = csp.csr_matrix(A), csp.csr_matrix(B)
        for host_m, dev_m in ((A, dA), (B, dB)):
            if host_m.has_canonical_format:  # SciPy's check on the host: CuPy's would build CUB kernels
                dev_m.has_canonical_format = True
        dC = dA @ dB
        cp.cuda.Device().synchronize()
    except Exception as e:  # noqa: BLE001 - cuSPARSE's failures are the result
        return None, f"error: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    if C_checked is None or not checked:
        status = (f"unverified: {int(dC.nnz):,} entries, ours did not run" if C_checked is None
                  else "unverified: our result failed its check")
    elif dC.nnz != C_checked.nnz:
        status = f"wrong: {dC.nnz:,} entries, the product has {C_checked.nnz:,}"
    else:
        diff = _max_difference(cp, dC, C_checked)
        scale = max(float(abs(C_checked.data).max()), 1.0) if C_checked.nnz else 1.0
        status = "ok" if diff <= 1e-4 * scale else f"wrong: values differ by {diff:.3g}"
    del dC
    ms = timed_ms(lambda: dA @ dB, repeats)
    return ms, status


def _max_difference(cp, dC, C: sp.csr_matrix) -> float:
    """Largest |cuSPARSE's entry - ours| over C's entries (an entry one side lacks counts as 0): on the device
    where both hold the same entries in sorted rows (C uploaded, nothing of cuSPARSE's copied back), else
    through SciPy on the host."""
    if not C.nnz:
        return float(abs(dC.data).max()) if dC.nnz else 0.0
    C.sort_indices()
    dC.sort_indices()
    if (dC.indptr.size == C.indptr.size and bool((dC.indptr == cp.asarray(C.indptr)).all())
            and bool((dC.indices == cp.asarray(C.indices)).all())):
        return float(cp.abs(dC.data.astype(cp.float64) - cp.asarray(C.data).astype(cp.float64)).max())
    got = dC.get().tocsr()
    return float(abs(got.astype(np.float64) - C.astype(np.float64)).max())


def bench_product(source: str, op: str, repeats: int = 5, cache_dir=None) -> SpgemmRow:
    """Benchmark one product (see :class:`SpgemmRow`)."""
    clock = Stages()
    A = loaders.load(source).tocsr()
    B = A if op == "AA" else A.T.tocsr()
    products = int(row_products(A.indptr, A.indices, B.indptr).sum())
    clock.stage("load")
    name = loaders.display_name(source)
    base = dict(name=name, op=op, nnz=int(A.nnz), products=products, source=str(source),
                power_law=not any(name.startswith(n) for n in NOT_POWER_LAW))
    try:
        f = compile_spgemm(A, B, cache_dir=cache_dir)
        clock.stage("compile")
        if f.family not in FAMILIES:  # over the device's memory: slotted pages, which bench-stream times
            raise DeviceMemoryError(f"streamed in {f.plan.pages:,} slotted pages ({f.plan.reason}); "
                                    "python -m tuner bench-stream --op spgemm times such products")
        C = f()
        clock.stage("run")
    except (DeviceMemoryError, MemoryError) as e:  # C too large for the GPU, or to check in host memory
        clock.stage("compile")
        ms, status = _cusparse(A, B, None, False, repeats)
        clock.stage("cusparse")
        return SpgemmRow(**base, nnz_c=None, ours_ms=None, ours_numeric_ms=None, cusparse_ms=ms, speedup=None,
                         cusparse_status=status, ours_correct=None,
                         check="ours refused", gflops=None, plan="", predicted_ms={}, family_ms={},
                         pick_within_10pct=None, peak_device_bytes=None, error=str(e), seconds=clock.rounded())
    correct, how = check_product(C, A, B, products)
    clock.stage("check")
    # Every configuration compared is compiled first and all are timed in turns (interleaved_ms): the
    # model's, the other family's at the parameters the model would run it with, and every candidate.
    mine = f"{f.family} {f.params}"
    family_keys = {name_f: mine if name_f == f.family else
                   f"{name_f} {planned_params(name_f, f.plan.stats)}" for name_f in FAMILIES}
    configs = {mine: (f.family, f.params)}
    for name_f in FAMILIES:
        configs.setdefault(family_keys[name_f], (name_f, planned_params(name_f, f.plan.stats)))
        for params in FAMILIES[name_f].candidates:
            configs.setdefault(f"{name_f} {params}", (name_f, params))
    compiled = {mine: f}
    info = gpu.device_info()
    compile_candidates(f.a, f.b, [params for _, params in configs.values()], info.arch,
                       shared_limit(info.shared_bytes_per_block, info.shared_bytes_per_sm), Cache(cache_dir))
    for key, (_, params) in configs.items():
        if key not in compiled:
            try:
                compiled[key] = compile_spgemm(A, B, params=params, cache_dir=cache_dir)
                whole(compiled[key])()  # a call may find its working memory too large only when it runs
            except DeviceMemoryError:
                compiled[key] = None
    clock.stage("sweep_compile")
    times = interleaved_ms({k: whole(p) for k, p in compiled.items() if p is not None}, repeats)
    del compiled
    clock.stage("sweep_time")
    family_ms = {name_f: times.get(key) for name_f, key in family_keys.items()}
    candidates_ms = {f"{name_f} {params}": times.get(f"{name_f} {params}")
                     for name_f, family in FAMILIES.items() for params in family.candidates}
    ours = family_ms[f.family]
    numeric = timed_ms(lambda: f(out="device"), repeats)
    clock.stage("numeric")
    measured = [v for v in times.values() if v is not None]
    ms, status = _cusparse(A, B, C, correct, repeats)
    clock.stage("cusparse")
    return SpgemmRow(**base, nnz_c=int(C.nnz), ours_ms=ours, ours_numeric_ms=numeric, cusparse_ms=ms,
                     speedup=None if ms is None or not status.startswith("ok") else ms / ours,
                     cusparse_status=status, ours_correct=correct, check=how, gflops=2 * products / ours / 1e6,
                     plan=f"{f.family} {f.params}", predicted_ms={k: round(v, 4) for k, v in f.plan.predicted_ms.items()},
                     family_ms=family_ms, candidates_ms=candidates_ms, pick_within_10pct=ours <= 1.1 * min(measured),
                     peak_device_bytes=f.peak_bytes, seconds=clock.rounded())


def summary(rows: list[SpgemmRow]) -> dict:
    """The targets' figures: geometric-mean speedup over the power-law products where cuSPARSE is right, the
    lowest such speedup, products checked correct, model picks within 10 %.

    Example:
        >>> r = SpgemmRow("g", "AA", 1, 1, 1, 1.0, 1.0, 4.0, 4.0, "ok", True, "scipy", 1.0, "", {}, {}, True, 1, True)
        >>> summary([r])["geomean_speedup"]
        4.0
    """
    fair = [r.speedup for r in rows if r.speedup is not None and r.power_law]
    ran = [r for r in rows if r.ours_correct is not None]
    picks = [r.pick_within_10pct for r in rows if r.pick_within_10pct is not None]
    return {"geomean_speedup": float(np.exp(np.mean(np.log(fair)))) if fair else None,
            "min_speedup": min(fair) if fair else None, "speedups": len(fair),
            "correct": sum(bool(r.ours_correct) for r in ran), "ran": len(ran),
            "cusparse_failed_or_wrong": sum(r.cusparse_status.startswith(("error", "wrong")) for r in rows),
            "model_picks_within_10pct": f"{sum(picks)}/{len(picks)}"}


def run(suite: list[tuple[str, str]], out: Path, repeats: int = 5, cache_dir=None, progress=None) -> dict:
    """Benchmark every product of ``suite``; write the JSON report to ``out`` after each product (``wall_s``:
    the suite's wall seconds so far)."""
    started = time.perf_counter()
    info = gpu.device_info()
    report = {"tool": f"sparse-tuner {__version__}", "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "command": " ".join(["python -m tuner"] + sys.argv[1:]) if sys.argv else "",
              "gpu": {"name": info.name, "memory_bytes": info.memory_bytes},
              "timing": f"wall ms between device synchronisations, median of {repeats} calls or as many as take "
                        f"{SPAN_MS:.0f} ms (at most {MAX_REPEATS}) after a warm-up; ours and the other "
                        f"configurations of a product compiled first and timed in {ROUNDS} turns; ours: "
                        "a whole product (symbolic phase rerun), C left on the device; cuSPARSE: CuPy's csr "
                        "@ csr on device operands (its symbolic and numeric phases), C on the device",
              "rows": []}
    rows = []
    for source, op in (progress(suite) if progress else suite):
        rows.append(bench_product(source, op, repeats, cache_dir))
        report["rows"] = [asdict(r) for r in rows]
        report["summary"] = summary(rows)
        report["wall_s"] = round(time.perf_counter() - started, 1)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1))
    return report


def format_table(rows: list[SpgemmRow]) -> str:
    """The rows as a fixed-width table."""
    head = f"{'product':<28}{'products':>12}{'nnz(C)':>12}{'ours ms':>10}{'cuSPARSE':>10}{'x':>7}  {'family':<14}check"
    lines = [head]
    for r in rows:
        fmt = lambda v, w, p=2: f"{v:>{w}.{p}f}" if v is not None else f"{'-':>{w}}"  # noqa: E731
        lines.append(f"{r.name + ' ' + r.op:<28}{r.products:>12.3g}{(r.nnz_c or 0):>12.3g}{fmt(r.ours_ms, 10)}"
                     f"{fmt(r.cusparse_ms, 10)}{fmt(r.speedup, 7)}  {r.plan.split(' ')[0]:<14}"
                     f"{'ok' if r.ours_correct else ('REFUSED' if r.ours_correct is None else 'WRONG')}"
                     f"{'' if r.cusparse_status.startswith('ok') else '; cuSPARSE ' + r.cusparse_status[:40]}")
    return "\n".join(lines)


def cli_run(args, suite: list[str], progress) -> None:
    """``python -m tuner bench``'s SpGEMM suite on this GPU (A·A and A·Aᵀ of the matrices named, else
    :func:`default_suite`): run, print the table and summary, write bench-spgemm.json."""
    from .bench import default_out
    pairs = ([(s, op) for s in args.suite for op in ("AA", "AAT")] if args.suite
             else default_suite(loaders.data_dir_or_error(args.data_dir)))
    out = Path(args.spgemm_out) if args.spgemm_out else default_out().with_name("bench-spgemm.json")
    report = run(pairs, out, repeats=args.spgemm_repeats, cache_dir=args.cache_dir,
                 progress=lambda s: progress(s, "bench spgemm", "product"))
    print("\nSpGEMM, C on the device (ours: symbolic and numeric phases; cuSPARSE through CuPy)")
    print(format_table([SpgemmRow(**r) for r in report["rows"]]))
    print(json.dumps(report["summary"]))
    print(f"\nwrote {out}")
