"""``python -m tuner report --spgemm``: the SpGEMM model's predictions against the measured times of every
family, from a bench-spgemm.json (which records both per product): report-spgemm.csv beside it and a summary
(median absolute percentage error per family, how often the model's pick was the fastest or within 10 %, and
the regret of its picks). From a bench-stream-spgemm.json the candidates are the slotted-page products'
page sizes instead (:func:`page_rows`), the report report-stream-spgemm.csv."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

FIELDS = ("product", "family", "page_entries", "predicted_ms", "measured_ms", "ratio", "chosen", "fastest")


def candidate_rows(bench: dict) -> list[dict]:
    """One row per (product, family) measured: prediction, measurement, their ratio, whether the model chose
    it and whether it was the fastest.

    Example:
        >>> b = {"rows": [{"name": "g", "op": "AA", "plan": "row_hash RowHashParams()",
        ...                "predicted_ms": {"outer_product": 2.0, "row_hash": 1.0},
        ...                "family_ms": {"outer_product": 1.0, "row_hash": 2.0}}]}
        >>> [(r["family"], r["ratio"], r["chosen"], r["fastest"]) for r in candidate_rows(b)]
        [('outer_product', 2.0, False, True), ('row_hash', 0.5, True, False)]
    """
    out = []
    for r in bench["rows"]:
        measured = {f: ms for f, ms in r.get("family_ms", {}).items() if ms is not None}
        if not measured:
            continue
        fastest = min(measured, key=measured.get)
        chosen = r["plan"].split(" ")[0]
        for family, ms in measured.items():
            predicted = r["predicted_ms"].get(family)
            out.append({"product": f"{r['name']} {r['op']}", "family": family, "page_entries": None,
                        "predicted_ms": predicted,
                        "measured_ms": ms, "ratio": None if predicted is None else predicted / ms,
                        "chosen": family == chosen, "fastest": family == fastest})
    return out


def page_rows(bench: dict) -> list[dict]:
    """One row per (slotted-page product, page size) measured in a bench-stream-spgemm.json: the model's
    prediction at that page size, the measurement, their ratio, whether it is the model's page size (marked
    ``chosen``; in files without the mark, the largest measured: the bench measures the model's, a half and a
    quarter of it) and whether it was the fastest.

    Example:
        >>> b = {"rows": [{"name": "g AA", "page_sizes": {"64": {"predicted_s": 0.002, "measured_s": 0.004},
        ...                                              "32": {"predicted_s": 0.003, "measured_s": 0.003}}}]}
        >>> [(r["page_entries"], r["ratio"], r["chosen"], r["fastest"]) for r in page_rows(b)]
        [(64, 0.5, True, False), (32, 1.0, False, True)]
    """
    out = []
    for r in bench["rows"]:
        sizes = {int(k): v for k, v in r.get("page_sizes", {}).items() if k.isdigit() and v.get("measured_s")}
        if not sizes:
            continue
        marked = [e for e, v in sizes.items() if v.get("chosen")]
        chosen = marked[0] if marked else max(sizes)
        fastest = min(sizes, key=lambda e: sizes[e]["measured_s"])
        for entries, v in sizes.items():
            predicted, measured = 1e3 * v["predicted_s"], 1e3 * v["measured_s"]
            out.append({"product": r["name"], "family": "slotted_page", "page_entries": entries,
                        "predicted_ms": predicted, "measured_ms": measured, "ratio": predicted / measured,
                        "chosen": entries == chosen, "fastest": entries == fastest})
    return out


def summarise(rows: list[dict]) -> dict:
    """MdAPE of each family's predictions, the picks that were fastest / within 10 %, and the picks' regret
    (chosen over fastest time: median and worst).

    Example:
        >>> summarise(candidate_rows({"rows": [{"name": "g", "op": "AA", "plan": "row_hash x",
        ...     "predicted_ms": {"outer_product": 2.0, "row_hash": 1.0},
        ...     "family_ms": {"outer_product": 1.0, "row_hash": 2.0}}]}))["regret_worst"]
        2.0
    """
    summary: dict = {"mdape": {}}
    for family in sorted({r["family"] for r in rows}):
        errors = [abs(r["ratio"] - 1) for r in rows if r["family"] == family and r["ratio"] is not None]
        summary["mdape"][family] = float(np.median(errors)) if errors else None
    products = sorted({r["product"] for r in rows})
    regrets = []
    for p in products:
        mine = [r for r in rows if r["product"] == p]
        chosen = [r for r in mine if r["chosen"]]
        if chosen:
            regrets.append(chosen[0]["measured_ms"] / min(r["measured_ms"] for r in mine))
    summary["picks"] = len(regrets)
    summary["fastest"] = sum(g <= 1.0 for g in regrets)
    summary["within_10pct"] = sum(g <= 1.1 for g in regrets)
    summary["regret_median"] = float(np.median(regrets)) if regrets else None
    summary["regret_worst"] = float(max(regrets)) if regrets else None
    return summary


def source_of(name: str, data_dir) -> str:
    """The matrix source of a bench row's name: a generator spec as it stands, a Kronecker spec or a graph
    name resolved in ``data_dir``.

    Example:
        >>> source_of("rmat:16", "/data"), source_of("email-Enron", "/data"), source_of("kron:wiki-Vote:2", "/d")
        ('rmat:16', '/data/email-Enron.npz', 'kron:/d/wiki-Vote.npz:2')
    """
    if name.startswith("kron:"):
        graph, k = name[len("kron:"):].rsplit(":", 1)
        return f"kron:{Path(data_dir) / (graph + '.npz')}:{k}"
    return name if name.startswith("rmat:") else str(Path(data_dir) / f"{name}.npz")


def repredict(bench: dict, data_dir, profile) -> dict:
    """The bench with every product's ``predicted_ms`` made again by the current model and ``profile`` (on
    the CPU, operands loaded again), and its ``plan`` the family the model now picks among those measured."""
    from .model import spgemm as model
    from .spgemm import FAMILIES
    from .spgemm.row_hash import profile_shared_limit
    rates = model.rates_from(profile)
    limit = profile_shared_limit(profile)
    rows = []
    for r in bench["rows"]:
        measured = [f for f, ms in r.get("family_ms", {}).items() if ms is not None]
        if not measured:
            rows.append(r)
            continue
        _, _, stats = _operands(r.get("source") or source_of(r["name"], data_dir), r["op"], limit)
        predicted = {f: model.predict(f, stats, rates) for f in FAMILIES}
        pick = min(measured, key=predicted.get)
        rows.append({**r, "predicted_ms": predicted, "plan": f"{pick} (repredicted)"})
    return {**bench, "rows": rows, "repredicted_with": rates.source}


def _operands(source: str, op: str, limit) -> tuple:
    """A product's operands loaded again (A and A for 'AA', A and Aᵀ for 'AAT') and the model's statistics of
    them (``limit``: the profile's shared memory per block)."""
    from . import loaders
    from .matrix import canonicalize
    from .spgemm import RowHashParams, plan_stats
    A = loaders.load(source)
    a = canonicalize(A)
    b = a if op == "AA" else canonicalize(A.T.tocsr())
    return a, b, plan_stats(a, b, RowHashParams(), limit)


def repredict_pages(bench: dict, data_dir, profile) -> dict:
    """A bench-stream-spgemm.json with every measured page size's ``predicted_s`` made again by the current
    model and ``profile`` under the row's budget (on the CPU, operands loaded again; rows named 'GRAPH AA' or
    'GRAPH AAT').

    Example (no rows: nothing to load):
        >>> repredict_pages({"rows": []}, "/data", None)["rows"]
        []
    """
    from .model import spgemm as model
    from .spgemm.row_hash import profile_shared_limit
    from .spgemm.slotted import plan_pages
    rates = model.rates_from(profile)
    limit = profile_shared_limit(profile)
    rows = []
    for r in bench["rows"]:
        name, op = r["name"].rsplit(" ", 1)
        a, b, stats = _operands(r.get("source") or source_of(name, data_dir), op, limit)
        plan, _ = plan_pages(a, b, r["budget_bytes"], stats, rates)
        sizes = {k: ({**v, "predicted_s": plan.predicted_s[int(k)]} if k.isdigit() and int(k) in plan.predicted_s
                     else v) for k, v in r["page_sizes"].items()}
        rows.append({**r, "page_sizes": sizes})
    return {**bench, "rows": rows, "repredicted_with": rates.source}


def run(bench_path: Path, out_dir: Path | None = None, data_dir=None, profile=None,
        again: bool = False) -> tuple[Path, dict]:
    """Write report-spgemm.csv (and report-spgemm.json with the summary) beside ``bench_path`` or in
    ``out_dir``; with ``again``, the predictions are made again by the current model (:func:`repredict`);
    returns the CSV's path and the summary. A bench-stream-spgemm.json (rows with ``page_sizes``) gives
    report-stream-spgemm.csv and .json, its candidates the page sizes (:func:`repredict_pages` with
    ``again``)."""
    bench = json.loads(Path(bench_path).read_text())
    streamed = any("page_sizes" in r for r in bench.get("rows", []))
    if again:
        bench = (repredict_pages if streamed else repredict)(bench, data_dir, profile)
    rows = page_rows(bench) if streamed else candidate_rows(bench)
    out_dir = Path(out_dir) if out_dir else Path(bench_path).parent
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = "report-stream-spgemm" if streamed else "report-spgemm"
    path = out_dir / f"{stem}.csv"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)
    summary = summarise(rows)
    (out_dir / f"{stem}.json").write_text(json.dumps(
        {"bench": str(bench_path), "gpu": bench.get("gpu"), "predictions": bench.get("repredicted_with", "the bench's"),
         "summary": summary, "rows": rows}, indent=1))
    return path, summary
