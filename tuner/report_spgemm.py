"""``python -m tuner report --spgemm``: the SpGEMM model's predictions against the measured times of every
family, from a bench-spgemm.json (which records both per product): report-spgemm.csv beside it and a summary
(median absolute percentage error per family, how often the model's pick was the fastest or within 10 %, and
the regret of its picks)."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

FIELDS = ("product", "family", "predicted_ms", "measured_ms", "ratio", "chosen", "fastest")


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
            out.append({"product": f"{r['name']} {r['op']}", "family": family, "predicted_ms": predicted,
                        "measured_ms": ms, "ratio": None if predicted is None else predicted / ms,
                        "chosen": family == chosen, "fastest": family == fastest})
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


def run(bench_path: Path, out_dir: Path | None = None) -> tuple[Path, dict]:
    """Write report-spgemm.csv (and report-spgemm.json with the summary) beside ``bench_path`` or in
    ``out_dir``; returns the CSV's path and the summary."""
    bench = json.loads(Path(bench_path).read_text())
    rows = candidate_rows(bench)
    out_dir = Path(out_dir) if out_dir else Path(bench_path).parent
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "report-spgemm.csv"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)
    summary = summarise(rows)
    (out_dir / "report-spgemm.json").write_text(json.dumps({"bench": str(bench_path), "gpu": bench.get("gpu"),
                                                            "summary": summary, "rows": rows}, indent=1))
    return path, summary
