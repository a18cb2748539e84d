"""``python -m tuner report``: predicted versus measured time for every candidate plan of every matrix.

Writes ``report.csv`` (one row per matrix and candidate), ``report.png`` (log-log scatter, y = x line and
+-20 % band, one colour per family, one panel per model), ``report.html`` (per-matrix and overall metrics)
and ``report.json`` (the metrics). The metrics are pure functions of the rows, so they are tested on a CPU.
"""
from __future__ import annotations

import csv
import html
import json
import logging
import math
import os
import platform
import re
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import numpy as np
from scipy import stats

from .compiler import DEFAULT_ROUNDS, PLAN_REPEATS, ROUNDS_UNDER_MS

log = logging.getLogger("tuner.report")

MODEL_COLUMNS = {"lookup": "predicted_ms", "baseline": "baseline_ms"}
WITHIN = 1.05  # "the chosen plan is within 5 % of the exhaustive best"


@dataclass(frozen=True)
class Row:
    """One candidate of one matrix: both models' predictions and the measured median (ms).

    ``params`` is the candidate's parameters as JSON (the label abbreviates long tuples), so that a report
    can be predicted again by a changed model without a GPU (:func:`repredict`). ``paper_pick`` marks the
    aligned_coo layout that paper 004's Algorithm 3 (its runtime-cost equations) picks for the candidate's
    ordering, so that the report can set the paper's choice against measurement. ``measured_ms`` is the
    median over ``rounds`` rounds of timing (each the median of its launches, on buffers placed afresh);
    ``min_ms`` and ``max_ms`` are the fastest and slowest round (None where the report predates rounds).
    """

    matrix: str
    nnz: int
    family: str
    candidate: str
    predicted_ms: float
    baseline_ms: float
    measured_ms: float
    paper_pick: bool = False
    params: str = ""
    rounds: int = 1
    min_ms: float | None = None
    max_ms: float | None = None


def _by_matrix(rows: list[Row]) -> dict[str, list[Row]]:
    out: dict[str, list[Row]] = {}
    for r in rows:
        out.setdefault(r.matrix, []).append(r)
    return out


def matrix_metrics(rows: list[Row], column: str, pick: str | None = None) -> dict:
    """Metrics of one matrix's candidates for one model's prediction column. The model's choice is ``pick``
    (the candidate model mode picked when the matrix was planned) where it was measured, else the row of
    least prediction (the same unless some rows are of candidates planning no longer makes).

    Example:
        >>> rs = [Row("m", 1, "f", c, p, 0.0, t) for c, p, t in [("a", 1.0, 1.1), ("b", 2.0, 1.9), ("c", 3.0, 3.3)]]
        >>> m = matrix_metrics(rs, "predicted_ms")
        >>> m["choice"], round(m["regret"], 3), m["top1"], round(m["spearman"], 3), round(m["mdape"], 3)
        ('a', 1.0, True, 1.0, 0.091)
    """
    ok = [r for r in rows if math.isfinite(r.measured_ms)]
    pred = np.array([getattr(r, column) for r in ok])
    meas = np.array([r.measured_ms for r in ok])
    labels = [r.candidate for r in ok]
    choice, best = labels.index(pick) if pick in labels else int(np.argmin(pred)), int(np.argmin(meas))
    rho = float(stats.spearmanr(pred, meas).statistic) if len(ok) > 2 and np.ptp(pred) > 0 else float("nan")
    return {"mdape": float(np.median(np.abs(pred - meas) / meas)), "spearman": rho,
            "top1": choice == best, "regret": float(meas[choice] / meas[best]),
            "regret_range": regret_range(ok[choice], ok[best]),
            "choice": ok[choice].candidate, "choice_ms": float(meas[choice]),
            "best": ok[best].candidate, "best_ms": float(meas[best]), "candidates": len(ok)}


def regret_range(choice: Row, best: Row) -> tuple[float, float]:
    """How far the rounds of timing let the choice's regret move: its fastest round over the best's slowest,
    and its slowest over the best's fastest ((1, 1) when the choice is the best; NaN without rounds).

    Example:
        >>> a = Row("m", 1, "f", "a", 1, 1, 1.06, rounds=3, min_ms=1.03, max_ms=1.08)
        >>> b = Row("m", 1, "f", "b", 2, 1, 1.00, rounds=3, min_ms=0.99, max_ms=1.02)
        >>> [round(x, 3) for x in regret_range(a, b)]
        [1.01, 1.091]
    """
    if choice is best:
        return (1.0, 1.0)
    if None in (choice.min_ms, choice.max_ms, best.min_ms, best.max_ms):
        return (float("nan"), float("nan"))
    return (choice.min_ms / best.max_ms, choice.max_ms / best.min_ms)


def open_verdict(lo: float, hi: float) -> bool:
    """True when a regret range straddles the 5 % line: the rounds' spread alone could flip the verdict.

    Example:
        >>> open_verdict(1.01, 1.09), open_verdict(1.0, 1.04), open_verdict(float("nan"), float("nan"))
        (True, False, False)
    """
    return bool(lo <= WITHIN < hi)


def summarize(rows: list[Row], picks: dict | None = None) -> dict:
    """Per-matrix and overall metrics for every model; ``picks``: per matrix, the lookup model's pick in
    model mode (see :func:`matrix_metrics`).

    Overall: median absolute percentage error over all candidates of all matrices, mean per-matrix Spearman
    correlation, share of matrices whose model choice is the measured best, share within 5 % of it, and
    the geometric-mean and worst regret.

    Example:
        >>> rs = [Row(m, 1, "f", c, p, b, t) for m in "xy" for c, p, b, t in [("a", 1, 2, 1), ("b", 2, 1, 2)]]
        >>> s = summarize(rs)
        >>> s["overall"]["lookup"]["within_5pct"], s["overall"]["baseline"]["within_5pct"]
        (1.0, 0.0)
    """
    picks = picks or {}
    per_matrix = {name: {model: matrix_metrics(rs, col, picks.get(name) if model == "lookup" else None)
                         for model, col in MODEL_COLUMNS.items()}
                  for name, rs in _by_matrix(rows).items()}
    overall = {}
    for model, col in MODEL_COLUMNS.items():
        ok = [r for r in rows if math.isfinite(r.measured_ms)]
        ape = np.array([abs(getattr(r, col) - r.measured_ms) / r.measured_ms for r in ok])
        mm = [v[model] for v in per_matrix.values()]
        regrets = np.array([x["regret"] for x in mm])
        rhos = [x["spearman"] for x in mm if math.isfinite(x["spearman"])]
        overall[model] = {
            "mdape": float(np.median(ape)) if ape.size else float("nan"),
            "spearman_mean": float(np.mean(rhos)) if rhos else float("nan"),
            "top1": float(np.mean([x["top1"] for x in mm])) if mm else float("nan"),
            "within_5pct": float(np.mean(regrets <= WITHIN)) if mm else float("nan"),
            "regret_geomean": float(np.exp(np.mean(np.log(regrets)))) if mm else float("nan"),
            "regret_max": float(regrets.max()) if mm else float("nan"),
            "open_verdicts": int(sum(open_verdict(*x["regret_range"]) for x in mm)),
        }
    return {"per_matrix": per_matrix, "overall": overall, "aligned_coo_layouts": layout_choices(rows)}


def layout_groups(rows: list[Row]) -> dict[tuple[str, str], list[Row]]:
    """aligned_coo candidates grouped by matrix and everything but the layout (the choice Algorithm 3 makes).

    Example:
        >>> rs = [Row("m", 1, "aligned_coo", f"aligned_coo(layout={l},order=none)", 1, 1, 1) for l in ("seg", "flat")]
        >>> list(layout_groups(rs)) == [("m", "aligned_coo(order=none)")]
        True
    """
    out: dict[tuple[str, str], list[Row]] = {}
    for r in rows:
        if r.family == "aligned_coo" and math.isfinite(r.measured_ms):
            out.setdefault((r.matrix, re.sub(r"layout=\w+,?", "", r.candidate)), []).append(r)
    return out


def layout_choices(rows: list[Row]) -> dict:
    """Algorithm 3 of paper 004 against the lookup model at choosing an aligned_coo layout, both judged by
    measurement: per matrix and ordering the measured best layout and each chooser's pick, and overall how
    often each pick is within 5 % of the best and its geometric-mean regret.

    Example:
        >>> rs = [Row("m", 1, "aligned_coo", f"aligned_coo(layout={l})", p, 0, t, l == "seg")
        ...       for l, p, t in (("seg", 9.0, 10.0), ("hybrid", 1.0, 1.0))]
        >>> c = layout_choices(rs)["overall"]
        >>> c["algorithm3"]["within_5pct"], c["lookup"]["within_5pct"], round(c["algorithm3"]["regret_geomean"], 6)
        (0.0, 1.0, 10.0)
    """
    groups = []
    for (matrix, rest), rs in layout_groups(rows).items():
        best = min(rs, key=lambda r: r.measured_ms)
        paper = next((r for r in rs if r.paper_pick), None)
        if paper is None:  # Algorithm 3 picked a layout that is not a candidate (a hybrid without long rows)
            continue
        lookup = min(rs, key=lambda r: r.predicted_ms)
        groups.append({"matrix": matrix, "candidates": rest, "best": best.candidate, "best_ms": best.measured_ms,
                       "algorithm3": paper.candidate, "algorithm3_ms": paper.measured_ms,
                       "lookup": lookup.candidate, "lookup_ms": lookup.measured_ms})
    overall = {}
    for who in ("algorithm3", "lookup"):
        regrets = np.array([g[f"{who}_ms"] / g["best_ms"] for g in groups])
        overall[who] = {"within_5pct": float(np.mean(regrets <= WITHIN)) if groups else float("nan"),
                        "regret_geomean": float(np.exp(np.mean(np.log(regrets)))) if groups else float("nan")}
    return {"groups": groups, "overall": overall}


def csv_header(f) -> None:
    """The column names of a report CSV into the open file ``f``."""
    csv.writer(f).writerow([fl.name for fl in fields(Row)])


def csv_append(f, rows: list[Row]) -> None:
    """``rows`` as CSV lines into the open file ``f`` (after :func:`csv_header`)."""
    csv.writer(f).writerows(list(asdict(r).values()) for r in rows)


def write_csv(rows: list[Row], path: Path) -> None:
    with path.open("w", newline="") as f:
        csv_header(f)
        csv_append(f, rows)


def read_csv(path: Path) -> list[Row]:
    """Rows back from a report CSV (to re-plot or re-summarise without a GPU)."""
    with path.open() as f:
        return [Row(matrix=d["matrix"], nnz=int(d["nnz"]), family=d["family"], candidate=d["candidate"],
                    predicted_ms=float(d["predicted_ms"]), baseline_ms=float(d["baseline_ms"]),
                    measured_ms=float(d["measured_ms"]), paper_pick=d.get("paper_pick") == "True",
                    params=d.get("params", ""), rounds=int(d.get("rounds") or 1),
                    min_ms=_optional(d.get("min_ms")), max_ms=_optional(d.get("max_ms")))
                for d in csv.DictReader(f)]


def _optional(text: str | None) -> float | None:
    """A CSV cell that may be empty (a report from before rounds)."""
    return float(text) if text else None


def plot(rows: list[Row], path: Path) -> None:
    """Log-log predicted versus measured, y = x and a +-20 % band, one colour per family, a panel per model."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fams = sorted({r.family for r in rows})
    colours = dict(zip(fams, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    fig, axes = plt.subplots(1, len(MODEL_COLUMNS), figsize=(6 * len(MODEL_COLUMNS), 5.5), squeeze=False)
    ok = [r for r in rows if math.isfinite(r.measured_ms)]
    values = [r.measured_ms for r in ok] + [getattr(r, c) for r in ok for c in MODEL_COLUMNS.values()]
    lo, hi = min(values) / 1.5, max(values) * 1.5
    line = np.geomspace(lo, hi, 50)
    for ax, (model, col) in zip(axes[0], MODEL_COLUMNS.items()):
        ax.fill_between(line, line * 0.8, line * 1.2, color="0.85", label="±20 %")
        ax.plot(line, line, color="0.3", lw=1, label="y = x")
        for fam in fams:
            fr = [r for r in ok if r.family == fam]
            ax.scatter([r.measured_ms for r in fr], [getattr(r, col) for r in fr], s=9, alpha=0.6,
                       color=colours[fam], label=fam)
        ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="measured ms",
               ylabel=f"predicted ms ({model})", title=f"{model} model")
        ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _fmt(x, pct=False) -> str:
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        return "-" if not math.isfinite(x) else (f"{100 * x:.1f} %" if pct else f"{x:.4g}")
    return html.escape(str(x))


def write_html(summary: dict, meta: dict, path: Path, png_name: str) -> None:
    """One page: the overall metrics of both models, the targets, and a table per matrix."""
    o = summary["overall"]
    head = ["metric", *MODEL_COLUMNS]
    items = [("median absolute % error (all candidates)", "mdape", True),
             ("mean Spearman rank correlation", "spearman_mean", False),
             ("model's first choice is the measured best", "top1", True),
             ("model's choice within 5 % of the best", "within_5pct", True),
             ("regret, geometric mean", "regret_geomean", False), ("regret, worst", "regret_max", False),
             ("within-5 % verdicts the rounds' spread leaves open", "open_verdicts", False)]
    rows = "".join(f"<tr><td>{html.escape(label)}</td>" + "".join(f"<td>{_fmt(o[m][k], pct)}</td>"
                                                                    for m in MODEL_COLUMNS) + "</tr>"
                   for label, k, pct in items)
    mcols = ["matrix", "nnz", "candidates", "best (measured)", "best ms", "lookup choice", "its ms", "regret",
             "regret over rounds", "MdAPE", "Spearman", "baseline regret", "baseline MdAPE", "planning s"]
    mrows = []
    for name, mm in summary["per_matrix"].items():
        lk, bl = mm["lookup"], mm["baseline"]
        info = meta.get("matrices", {}).get(name, {})
        cells = [name, f"{info.get('nnz', 0):,}", lk["candidates"], lk["best"], lk["best_ms"], lk["choice"],
                 lk["choice_ms"], lk["regret"], _range(*lk["regret_range"]), (lk["mdape"], True), lk["spearman"],
                 bl["regret"],
                 (bl["mdape"], True), info.get("planning_seconds", float("nan"))]
        mrows.append("<tr>" + "".join(f"<td>{_fmt(*c) if isinstance(c, tuple) else _fmt(c)}</td>" for c in cells)
                     + "</tr>")
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>sparse-tuner report</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;
padding:3px 8px;text-align:right}}td:first-child{{text-align:left}}</style></head><body>
<h1>Predicted versus measured SpMV time</h1>
<p>{html.escape(meta.get('gpu', ''))} &middot; {html.escape(meta.get('created', ''))} &middot;
command: <code>{html.escape(meta.get('command', ''))}</code></p>
<h2>Overall</h2><table><tr>{''.join(f'<th>{h}</th>' for h in head)}</tr>{rows}</table>
<p>Measured times are medians over rounds of timing, each on buffers placed afresh (launches under
{ROUNDS_UNDER_MS * 1e3:g} us; one round for longer ones). <i>regret over rounds</i>: the choice's fastest round over the best's
slowest, and its slowest over the best's fastest; a range across 1.05 is a verdict the rounds' spread leaves
open.</p>
<p>Targets: model choice within 5 % of the exhaustive best on at least 90 % of the matrices; median absolute
error at most 15 %; the lookup model better than the bytes-over-bandwidth baseline on both. <i>planning s</i>:
model-mode planning (every candidate and its prediction) beyond the relabelled matrix the tiled families cut;
target under a second for 100M entries{_host(meta.get("planning_host"))}.</p>
<img src="{html.escape(png_name)}" alt="predicted versus measured" style="max-width:100%">
<h2>Per matrix</h2><table><tr>{''.join(f'<th>{h}</th>' for h in mcols)}</tr>{''.join(mrows)}</table>
{_layout_section(summary.get("aligned_coo_layouts"))}
</body></html>"""
    path.write_text(page)


def _range(lo: float, hi: float) -> str:
    """A regret range for the page ('-' where the report has no rounds)."""
    return "-" if not (math.isfinite(lo) and math.isfinite(hi)) else f"{lo:.3f} to {hi:.3f}"


def _host(where: dict | None) -> str:
    """Where the planning seconds were timed, for the page."""
    return f"; timed on {html.escape(str(where['node']))} ({where['cpus']} CPUs)" if where else ""


def _layout_section(choices: dict | None) -> str:
    """The aligned_coo layout table: paper 004's Algorithm 3 and the lookup model against measurement."""
    if not choices or not choices["groups"]:
        return ""
    o = choices["overall"]
    head = ["matrix", "candidates", "best layout (measured)", "best ms", "Algorithm 3", "its ms", "lookup",
            "its ms"]
    short = lambda c: re.search(r"layout=(\w+)", c).group(1)  # noqa: E731
    body = "".join("<tr>" + "".join(f"<td>{_fmt(c)}</td>" for c in (
        g["matrix"], g["candidates"], short(g["best"]), g["best_ms"], short(g["algorithm3"]), g["algorithm3_ms"],
        short(g["lookup"]), g["lookup_ms"])) + "</tr>" for g in choices["groups"])
    return f"""<h2>aligned_coo layout: paper 004's Algorithm 3 against measurement</h2>
<p>Within 5 % of the measured best layout: Algorithm 3 {_fmt(o['algorithm3']['within_5pct'], True)}
(regret {_fmt(o['algorithm3']['regret_geomean'])}), lookup model {_fmt(o['lookup']['within_5pct'], True)}
(regret {_fmt(o['lookup']['regret_geomean'])}).</p>
<table><tr>{''.join(f'<th>{h}</th>' for h in head)}</tr>{body}</table>"""


def write_all(rows: list[Row], meta: dict, outdir: Path) -> dict:
    """CSV, PNG, HTML and JSON of a report into ``outdir``; returns the summary."""
    outdir.mkdir(parents=True, exist_ok=True)
    summary = summarize(rows, {name: info.get("model_pick") for name, info in meta.get("matrices", {}).items()})
    write_csv(rows, outdir / "report.csv")
    plot(rows, outdir / "report.png")
    write_html(summary, meta, outdir / "report.html", "report.png")
    (outdir / "report.json").write_text(json.dumps({**meta, **summary}, indent=1, default=str))
    return summary


def paper_pick(m, spec, max_threads: int) -> bool:
    """True when ``spec`` is an aligned_coo candidate whose layout Algorithm 3 of paper 004 picks for its
    ordering (MAX_THREADS: the GPU's resident threads).

    Example:
        >>> import numpy as np, scipy.sparse as sp
        >>> from tuner.families import specializations
        >>> from tuner.matrix import canonicalize
        >>> m = canonicalize(sp.random(300, 300, density=0.02, format="csr", random_state=1, dtype=np.float32))
        >>> sorted(s.params.layout for s in specializations(m, ["aligned_coo"]) if paper_pick(m, s, 132 * 2048))
        ['flat', 'flat']
    """
    from .families.base import ordered_structure, shared_layout
    from .model.aligned_coo import choose_hybrid

    if spec.family != "aligned_coo":
        return False
    p = spec.params
    # One choice per ordering, shared by its three layout candidates.
    choice = shared_layout(m, ("algorithm3", p.order, max_threads, p.block_size), lambda: choose_hybrid(
        ordered_structure(m, p.order).row_lengths, max_threads, p.block_size).layout)
    return choice == p.layout


PROGRESS = "report-progress.json"  # beside report.csv while a report runs: its GPU, profile and matrices


class GpuTimer:
    """Times candidates on this process's GPU: compiles them (through the cache), then yields each median."""

    def __init__(self, cache_dir=None):
        from . import gpu
        from .cache import Cache
        info = gpu.device_info()
        self.name, self.arch, self.cache = info.name, info.arch, Cache(cache_dir)

    def times(self, m, specs, rounds: int = 1):
        from . import codegen, families
        from .compiler import measure_each
        binaries = codegen.compile_many([families.render(s, m) for s in specs], self.arch, cache=self.cache)
        yield from measure_each(m, specs, binaries, rounds=rounds)


def resume_state(outdir: Path, gpu_name: str, profile_digest: str) -> tuple[list[Row], dict, list[str]]:
    """The rows, per-matrix records and commands of an interrupted report in ``outdir``; refused when it ran
    on another GPU or read another profile (its rows would not compare).

    Example:
        >>> resume_state(Path("/nonexistent"), "H100", "abc")
        ([], {}, [])
    """
    progress, table = outdir / PROGRESS, outdir / "report.csv"
    if not progress.is_file():
        return [], {}, []
    old = json.loads(progress.read_text())
    theirs = (old.get("gpu"), old.get("profile_digest"))
    if theirs != (gpu_name, profile_digest):
        raise ValueError(f"cannot resume the report in {outdir}: it was measured with (GPU, profile) = {theirs}, "
                         f"this run has {(gpu_name, profile_digest)}; pass another --out or drop --resume")
    rows = read_csv(table) if table.is_file() else []
    return rows, old.get("matrices", {}), old.get("commands", [])


def collect(suite: list[str], profile, cache_dir=None, progress=None, outdir: Path | None = None,
            resume: bool = False, timer=None, command: str = "", rounds: int = DEFAULT_ROUNDS,
            plan_repeats: int = PLAN_REPEATS) -> tuple[list[Row], dict]:
    """Predict (both models) and time (exhaustively, on the GPU) every candidate of every matrix.

    With ``outdir``, every measured candidate is appended to ``outdir/report.csv`` at once and the matrices'
    records go to ``report-progress.json``, so an interrupted run keeps what it measured: with ``resume``
    it measures only what is missing (a matrix's candidates are enumerated again and those already in the
    CSV skipped). ``timer`` (default :class:`GpuTimer`) has a ``name`` and ``times(m, specs, rounds)``
    yielding each candidate's per-round median milliseconds in order (see
    :func:`~tuner.compiler.measure_each`); tests pass a fake one. A row keeps the median over the rounds
    and the fastest and slowest. The returned record's ``command`` joins the commands of every run that
    contributed. Each matrix is planned ``plan_repeats`` times (:func:`planning_record`).
    """
    from . import families
    from .compiler import plan_candidates, predictable
    from .loaders import display_name, load
    from .matrix import canonicalize
    from .model import predict_baseline

    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    timer = timer or GpuTimer(cache_dir)
    max_threads = profile.constants["sm_count"] * profile.constants["max_warps_per_sm"] * 32
    rows, per, commands = (resume_state(outdir, timer.name, profile.digest) if outdir is not None and resume
                           else ([], {}, []))
    commands = commands + [command]
    table = None
    if outdir is not None:
        outdir.mkdir(parents=True, exist_ok=True)
        table = (outdir / "report.csv").open("a" if rows else "w", newline="")
        if not rows:
            csv_header(table)

    def save_progress():
        if outdir is not None:
            (outdir / PROGRESS).write_text(json.dumps(
                {"gpu": timer.name, "profile_digest": profile.digest, "commands": commands, "matrices": per},
                indent=1))

    try:
        for source in (progress(suite) if progress else suite):
            name = display_name(source)
            if per.get(name, {}).get("complete"):
                continue
            m = canonicalize(load(source))
            # Planning as tuner.compile does it in model mode, timed apart from the relabelled matrix.
            specs, predicted, seconds = plan_candidates(m, profile, plan_repeats)
            specs, predicted = predictable(specs, predicted, timer.name)
            done = {r.candidate for r in rows if r.matrix == name}
            todo = [(s, p) for s, p in zip(specs, predicted) if s.label() not in done]
            per[name] = {"source": str(source), "nnz": m.nnz, "n_rows": m.n_rows, **planning_record(seconds),
                         "model_pick": model_pick(specs, predicted), "complete": False}
            save_progress()
            for (s, p), t in zip(todo, timer.times(m, [s for s, _ in todo], rounds)):
                row = Row(name, m.nnz, s.family, s.label(), p, predict_baseline(m, s, profile),
                          float(np.median(t)), paper_pick(m, s, max_threads),
                          json.dumps(families.params_dict(s.params)), len(t), float(np.min(t)), float(np.max(t)))
                rows.append(row)
                if table is not None:
                    csv_append(table, [row])
                    table.flush()
            per[name]["complete"] = True
            save_progress()
            del m
    finally:
        if table is not None:
            table.close()
    return rows, {"gpu": timer.name, "matrices": per, "command": " ; then ".join(c for c in commands if c),
                  "planning_host": planning_host()}


def planning_host() -> dict:
    """Where a report's planning seconds were timed: the host's name and CPU count (planning is host
    work, and the tiled families' builds use every core).

    Example:
        >>> sorted(planning_host())
        ['cpus', 'node']
    """
    return {"node": platform.node(), "cpus": os.cpu_count() or 1}


def model_pick(specs: list, predicted: list) -> str | None:
    """The label of the candidate model mode picks (:func:`~tuner.planner.select`) among those predicted.

    Example:
        >>> from tuner.families.base import Specialization
        >>> from tuner.families.csr_vector import CsrVectorParams
        >>> s = [Specialization("csr_vector", CsrVectorParams(t), np.dtype("float32"), np.dtype("int32"), True)
        ...      for t in (1, 2, 4)]
        >>> model_pick(s, [3.0, None, 2.0]).startswith("csr_vector(threads_per_row=4")
        True
    """
    from .planner import select
    kept = [(s, p) for s, p in zip(specs, predicted) if p is not None]
    if not kept:
        return None
    return select("model", [s for s, _ in kept], [p for _, p in kept], benchmark=None)[0].label()


def planning_record(seconds: dict) -> dict:
    """A matrix's planning times as the report records them (from
    :func:`~tuner.compiler.plan_candidates`): ``planning_seconds``, the median of its plans,
    ``planning_runs``, each plan's time (when there were several), and ``layout_seconds``, the relabelled
    matrix built before them.

    Example:
        >>> planning_record({"relabel": 2.0, "plan": 0.5, "plan_runs": [0.7, 0.5, 0.4]})
        {'planning_seconds': 0.5, 'layout_seconds': 2.0, 'planning_runs': [0.7, 0.5, 0.4]}
    """
    out = {"planning_seconds": seconds["plan"], "layout_seconds": seconds["relabel"]}
    if "plan_runs" in seconds:
        out["planning_runs"] = list(seconds["plan_runs"])
    return out


# What planning a matrix records (collect, repredict): replaced as a whole when a matrix is planned again.
PLANNING_KEYS = ("planning_seconds", "planning_runs", "layout_seconds", "model_pick", "unmeasured_pick")


def replanned(record: dict, planning: dict) -> dict:
    """A matrix's report record with a new planning's keys (from :func:`repredict`) in place of the old
    ones, none of those left over; the record as it was when the matrix was not planned again.

    Example:
        >>> old = {"nnz": 9, "planning_seconds": 2.0, "planning_runs": [2.0], "unmeasured_pick": "a"}
        >>> replanned(old, {"planning_seconds": 1.0, "model_pick": "b"})
        {'nnz': 9, 'planning_seconds': 1.0, 'model_pick': 'b'}
        >>> replanned(old, {}) == old
        True
    """
    if not planning:
        return dict(record)
    return {**{k: v for k, v in record.items() if k not in PLANNING_KEYS}, **planning}


def repredict(rows: list[Row], suite: list[str], profile, progress=None, plan_repeats: int = PLAN_REPEATS
              ) -> tuple[list[Row], dict]:
    """``rows`` with the lookup model's predictions (and Algorithm 3's picks) made again from each
    candidate's parameters by the current model and ``profile``; the measured times stay, and so does the
    baseline, which reads only each layout's bytes (building every layout again would cost minutes on the
    largest graphs). No GPU: this is how a model change is judged against a committed report. ``suite``
    names the matrices' sources.

    Each matrix is planned as ``tuner.compile`` plans it in model mode, timed (the second value: per matrix
    :func:`planning_record`, as :func:`collect` records it), so that a report
    predicted again also says how long the current model takes to plan; candidates that planning no
    longer enumerates are predicted apart. Where model mode would now pick a candidate the report never
    measured, the matrix's record names it (``unmeasured_pick``) and a warning says so: its regret is
    then unknown.

    Example: see tests/test_report.py.
    """
    from . import families
    from .compiler import plan_candidates
    from .families.base import Specialization
    from .loaders import display_name, load
    from .matrix import canonicalize
    from .model import predict_many

    by_name = {display_name(s): s for s in suite}
    groups = _by_matrix(rows)
    unknown = sorted(set(groups) - set(by_name))
    if unknown:
        raise ValueError(f"repredict needs the sources of {', '.join(unknown)}: name them in the suite")
    if any(not r.params for r in rows):
        raise ValueError("this report.csv has no params column (it predates it): measure it again to repredict")
    max_threads = profile.constants["sm_count"] * profile.constants["max_warps_per_sm"] * 32
    out, seconds = [], {}
    for name in (progress(list(groups)) if progress else groups):
        rs = groups[name]
        m = canonicalize(load(by_name[name]))
        planned, predictions, took = plan_candidates(m, profile, plan_repeats)
        seconds[name] = planning_record(took)
        by_label = {s.label(): p for s, p in zip(planned, predictions)}
        specs = [Specialization(r.family, families.get(r.family).params_from_dict(json.loads(r.params)),
                                m.value_dtype, m.index_dtype, m.value_free) for r in rs]
        apart = [s for s in specs if s.label() not in by_label]
        # Model mode's pick among what planning now enumerates: the report judges it where it was measured.
        pick = model_pick(planned, predictions)
        seconds[name]["model_pick"] = pick
        if pick is not None and pick not in {s.label() for s in specs}:
            seconds[name]["unmeasured_pick"] = pick
            log.warning("%s: model mode now picks %s, which this report did not measure", name, pick)
        by_label.update(zip((s.label() for s in apart), predict_many(m, apart, profile)))
        for r, s in zip(rs, specs):
            p = by_label[s.label()]
            out.append(replace(r, predicted_ms=float("nan") if p is None else p,
                               paper_pick=paper_pick(m, s, max_threads)))
        del m
    return out, seconds
