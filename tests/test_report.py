"""Report metrics and files from rows with known values (no GPU)."""
import json
import math

import pytest

from tuner.report import Row, matrix_metrics, read_csv, summarize, write_all


def rows_for(name, pred, base, meas, family="csr_vector"):
    return [Row(name, 1000, family if i % 2 else "binned", f"k{i}", p, b, t)
            for i, (p, b, t) in enumerate(zip(pred, base, meas))]


def test_matrix_metrics_by_hand():
    rs = rows_for("m", pred=[1.0, 2.0, 3.0, 4.0], base=[1.0, 1.0, 1.0, 1.0], meas=[2.0, 1.0, 3.0, 8.0])
    lk = matrix_metrics(rs, "predicted_ms")
    assert lk["choice"] == "k0" and lk["best"] == "k1" and lk["regret"] == 2.0 and lk["top1"] is False
    assert lk["mdape"] == pytest.approx(0.5)  # errors 0.5, 1.0, 0.0, 0.5
    assert lk["spearman"] == pytest.approx(0.8)


def test_failed_candidates_are_left_out_of_metrics():
    rs = rows_for("m", pred=[1.0, 2.0, 3.0], base=[1.0, 2.0, 3.0], meas=[math.nan, 2.0, 4.0])
    lk = matrix_metrics(rs, "predicted_ms")
    assert lk["candidates"] == 2 and lk["choice"] == "k1" and lk["regret"] == 1.0


def test_summary_compares_models_over_matrices():
    rs = (rows_for("a", [1, 2, 3], [3, 2, 1], [1.0, 2.0, 3.0])
          + rows_for("b", [1, 2, 3], [2, 1, 3], [1.2, 1.0, 3.0]))
    s = summarize(rs)
    lk, bl = s["overall"]["lookup"], s["overall"]["baseline"]
    assert lk["top1"] == 0.5 and lk["within_5pct"] == 0.5
    assert lk["regret_max"] == pytest.approx(1.2) and lk["regret_geomean"] == pytest.approx(math.sqrt(1.2))
    assert bl["top1"] == 0.5 and bl["regret_max"] == pytest.approx(3.0)
    assert set(s["per_matrix"]) == {"a", "b"}


def test_report_files_are_written_and_read_back(tmp_path):
    rs = rows_for("a", [0.1, 0.2, 0.4], [0.3, 0.3, 0.3], [0.11, 0.25, 0.3]) + rows_for(
        "b", [1.0, 2.0, 3.0], [1.0, 1.0, 1.0], [1.0, 2.2, 2.5])
    summary = write_all(rs, {"gpu": "Fake", "command": "python -m tuner report", "matrices": {"a": {"nnz": 5}}},
                        tmp_path)
    assert read_csv(tmp_path / "report.csv") == rs
    png = (tmp_path / "report.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    page = (tmp_path / "report.html").read_text()
    assert "report.png" in page and "median absolute % error" in page and "<td>a</td>" in page
    saved = json.loads((tmp_path / "report.json").read_text())
    assert saved["overall"] == json.loads(json.dumps(summary["overall"]))
