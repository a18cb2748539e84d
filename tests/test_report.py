"""Report metrics and files from rows with known values (no GPU)."""
import json
import math
from dataclasses import replace

import numpy as np
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


def test_the_choice_is_model_modes_recorded_pick_where_it_was_measured():
    # k0 is a candidate planning no longer makes (its prediction is the least); model mode picked k1.
    rs = rows_for("m", pred=[1.0, 2.0, 3.0], base=[3.0, 2.0, 1.0], meas=[2.0, 1.0, 3.0])
    assert matrix_metrics(rs, "predicted_ms", pick="k1")["regret"] == 1.0
    assert matrix_metrics(rs, "predicted_ms")["regret"] == 2.0
    assert matrix_metrics(rs, "predicted_ms", pick="gone")["choice"] == "k0"  # never measured: least predicted
    s = summarize(rs, {"m": "k1"})["per_matrix"]["m"]
    assert s["lookup"]["choice"] == "k1" and s["baseline"]["choice"] == "k2"  # the pick is the lookup model's


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


def timed(name, cand, pred, rounds):
    return Row(name, 1000, "csr_vector", cand, pred, 1.0, sorted(rounds)[len(rounds) // 2], rounds=len(rounds),
               min_ms=min(rounds), max_ms=max(rounds))


def test_verdict_is_open_only_where_the_rounds_straddle_the_5pct_line():
    rs = [timed("near", "pick", 1.0, [1.03, 1.04, 1.07]), timed("near", "best", 2.0, [0.99, 1.00, 1.01]),
          timed("clear", "pick", 1.0, [1.10, 1.11, 1.12]), timed("clear", "best", 2.0, [0.99, 1.00, 1.01]),
          timed("hit", "pick", 1.0, [0.90, 1.00, 1.20]), timed("hit", "best", 2.0, [1.10, 1.20, 1.30])]
    s = summarize(rs)
    near = s["per_matrix"]["near"]["lookup"]
    assert near["regret"] == pytest.approx(1.04) and near["regret_range"] == pytest.approx((1.03 / 1.01, 1.07 / 0.99))
    assert s["per_matrix"]["clear"]["lookup"]["regret_range"][0] == pytest.approx(1.10 / 1.01)  # over 5 % in every round
    assert s["per_matrix"]["hit"]["lookup"]["regret_range"] == (1.0, 1.0)  # the choice is the best
    assert s["overall"]["lookup"]["open_verdicts"] == 1 and s["overall"]["lookup"]["within_5pct"] == pytest.approx(2 / 3)


def test_rounds_survive_the_csv_and_old_reports_read_without_them(tmp_path):
    rs = [timed("a", "x", 1.0, [1.02, 1.00, 1.05]), timed("a", "y", 2.0, [2.0])]
    write_all(rs, {"gpu": "Fake"}, tmp_path)
    back = read_csv(tmp_path / "report.csv")
    assert back == rs and back[0].rounds == 3 and (back[0].min_ms, back[0].measured_ms, back[0].max_ms) == (1.0, 1.02, 1.05)
    assert "regret over rounds" in (tmp_path / "report.html").read_text()
    old = tmp_path / "old.csv"  # a report from before rounds: no rounds, min_ms, max_ms columns
    old.write_text("matrix,nnz,family,candidate,predicted_ms,baseline_ms,measured_ms,paper_pick,params\n"
                   "a,5,binned,k,1.0,2.0,1.5,False,{}\n")
    (row,) = read_csv(old)
    assert (row.rounds, row.min_ms, row.max_ms, row.measured_ms) == (1, None, None, 1.5)
    lk = summarize([row, replace(row, candidate="j", predicted_ms=2.0, measured_ms=1.0)])["per_matrix"]["a"]["lookup"]
    assert all(math.isnan(x) for x in lk["regret_range"]) and lk["regret"] == 1.5


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


def aligned_rows(matrix, order, picks):
    """aligned_coo rows of one matrix and ordering: (layout, predicted, measured, Algorithm 3's pick)."""
    return [Row(matrix, 1000, "aligned_coo", f"aligned_coo(layout={lay},block_size=256,order={order})", p, 1.0, t,
                pick) for lay, p, t, pick in picks]


def test_layout_choices_judge_algorithm_3_and_the_model_by_measurement():
    rs = (aligned_rows("a", "none", [("seg", 5.0, 40.0, True), ("hybrid", 1.0, 1.0, False), ("flat", 1.1, 1.2, False)])
          + aligned_rows("a", "degree", [("seg", 5.0, 30.0, False), ("hybrid", 2.0, 1.0, True),
                                         ("flat", 1.0, 1.04, False)])
          + rows_for("a", [0.5], [1.0], [0.9]))
    c = summarize(rs)["aligned_coo_layouts"]
    assert [g["candidates"] for g in c["groups"]] == ["aligned_coo(block_size=256,order=none)",
                                                     "aligned_coo(block_size=256,order=degree)"]
    none, degree = c["groups"]
    assert none["best"].startswith("aligned_coo(layout=hybrid") and none["algorithm3_ms"] == 40.0
    assert degree["lookup"].startswith("aligned_coo(layout=flat") and degree["lookup_ms"] == 1.04
    assert c["overall"]["algorithm3"]["within_5pct"] == 0.5 and c["overall"]["lookup"]["within_5pct"] == 1.0
    assert c["overall"]["algorithm3"]["regret_geomean"] == pytest.approx(math.sqrt(40.0))


def test_layout_section_and_paper_picks_survive_the_csv(tmp_path):
    rs = aligned_rows("a", "none", [("seg", 5.0, 40.0, True), ("flat", 1.1, 1.2, False)])
    write_all(rs, {"gpu": "Fake"}, tmp_path)
    assert read_csv(tmp_path / "report.csv") == rs
    page = (tmp_path / "report.html").read_text()
    assert "Algorithm 3" in page and "<td>seg</td>" in page and "<td>flat</td>" in page


class FakeTimer:
    """Times candidates by a fixed rule (no GPU); stops the run after ``stop_after`` candidates like a killed job."""

    name = "Fake GPU"

    def __init__(self, stop_after=None):
        self.stop_after, self.timed = stop_after, []

    def times(self, m, specs, rounds=1):
        for s in specs:
            if self.stop_after is not None and len(self.timed) == self.stop_after:
                raise KeyboardInterrupt("killed")
            self.timed.append(s.label())
            base = 0.01 + 1e-4 * len(s.label())
            yield tuple(base * (1 + 0.01 * (i % 3)) for i in range(rounds))


@pytest.fixture
def fake_profile():
    from tuner.model import Profile
    from .fake_profile import fake_profile_json
    return Profile.from_json(fake_profile_json())


SUITE = ["rmat:9", "rmat:10"]


def test_interrupted_report_resumes_measuring_only_what_is_missing(tmp_path, fake_profile):
    from tuner.report import PROGRESS, collect
    whole, _ = collect(SUITE, fake_profile, timer=FakeTimer(), command="whole")
    first = FakeTimer(stop_after=len(whole) // 2 + 3)  # dies inside the second matrix
    with pytest.raises(KeyboardInterrupt):
        collect(SUITE, fake_profile, outdir=tmp_path, timer=first, command="first")
    kept = read_csv(tmp_path / "report.csv")
    assert len(kept) == len(first.timed) and json.loads((tmp_path / PROGRESS).read_text())["matrices"]["rmat:9"][
        "complete"]
    second = FakeTimer()
    rows, meta = collect(SUITE, fake_profile, outdir=tmp_path, resume=True, timer=second, command="second")
    # Nothing is timed twice, nothing is missing, and the result equals an uninterrupted run's.
    assert not set(second.timed) & set(first.timed[len([r for r in whole if r.matrix == "rmat:9"]):])
    assert len(first.timed) + len(second.timed) == len(whole)
    key = lambda r: (r.matrix, r.candidate)  # noqa: E731
    assert sorted(rows, key=key) == sorted(whole, key=key) == sorted(read_csv(tmp_path / "report.csv"), key=key)
    assert meta["command"] == "first ; then second" and set(meta["matrices"]) == set(SUITE)
    # Planning (candidates and predictions) is timed apart from the relabelled layout it reads.
    assert all(0 < m["planning_seconds"] < 30 and m["layout_seconds"] >= 0 for m in meta["matrices"].values())
    # With model mode's pick: the candidate of least prediction.
    assert all(m["model_pick"] == min((r for r in rows if r.matrix == name), key=lambda r: r.predicted_ms).candidate
               for name, m in meta["matrices"].items())


def test_collect_keeps_the_median_and_range_of_the_timing_rounds(fake_profile):
    from tuner.report import collect
    rows, _ = collect(SUITE[:1], fake_profile, timer=FakeTimer(), rounds=3)
    assert rows and all(r.rounds == 3 and r.min_ms < r.measured_ms < r.max_ms for r in rows)
    assert all(r.max_ms == pytest.approx(r.min_ms * 1.02) for r in rows)  # the fake's rounds: base, +1 %, +2 %
    with pytest.raises(ValueError, match="rounds"):
        collect(SUITE[:1], fake_profile, timer=FakeTimer(), rounds=0)


def test_resume_refuses_a_report_of_another_gpu_or_profile(tmp_path, fake_profile):
    from tuner.report import collect
    collect(SUITE[:1], fake_profile, outdir=tmp_path, timer=FakeTimer())
    other = FakeTimer()
    other.name = "Other GPU"
    with pytest.raises(ValueError, match="Other GPU"):
        collect(SUITE, fake_profile, outdir=tmp_path, resume=True, timer=other)


def test_repredict_names_a_pick_of_model_mode_that_the_report_never_measured(tmp_path, fake_profile, caplog):
    from tuner.report import collect, repredict
    rows, _ = collect(SUITE, fake_profile, outdir=tmp_path, timer=FakeTimer(), plan_repeats=1)
    name = rows[0].matrix
    pick = min((r for r in rows if r.matrix == name), key=lambda r: r.predicted_ms)
    _, planning = repredict([r for r in rows if r is not pick], SUITE, fake_profile, plan_repeats=1)
    assert planning[name]["unmeasured_pick"] == pick.candidate == planning[name]["model_pick"]
    assert all("unmeasured_pick" not in t for n, t in planning.items() if n != name)
    assert "planning_runs" not in planning[name]  # one plan: nothing to take a median of
    assert f"{name}: model mode now picks {pick.candidate}" in caplog.text


def test_repredict_recomputes_predictions_from_params_and_keeps_measurements(tmp_path, fake_profile):
    from tuner.report import collect, repredict
    rows, _ = collect(SUITE, fake_profile, outdir=tmp_path, timer=FakeTimer())
    stale = [replace(r, predicted_ms=1.0, paper_pick=not r.paper_pick) for r in read_csv(tmp_path / "report.csv")]
    again, planning = repredict(stale, SUITE, fake_profile)
    assert again == rows  # the same model and profile give the same predictions back
    # Each matrix planned again as compile plans it, timed.
    assert set(planning) == {r.matrix for r in rows}
    assert all(t["planning_seconds"] > 0 and t["layout_seconds"] >= 0 for t in planning.values())
    # Three plans each (the default), the median recorded; model mode picks a candidate the report measured.
    assert all(len(t["planning_runs"]) == 3 and t["planning_seconds"] == np.median(t["planning_runs"])
               and "unmeasured_pick" not in t for t in planning.values())
    for name, t in planning.items():  # model mode's pick: the candidate of least prediction
        assert t["model_pick"] == min((r for r in rows if r.matrix == name), key=lambda r: r.predicted_ms).candidate
    # A candidate that planning no longer enumerates is still predicted, apart from the others.
    binned = next(r for r in stale if r.family == "binned")
    moved = replace(binned, params=json.dumps({**json.loads(binned.params), "medium_max": 48, "huge_min": None}))
    (alone,), _ = repredict([moved], SUITE, fake_profile)
    assert json.loads(alone.params)["medium_max"] == 48  # no binned space has 48
    assert math.isfinite(alone.predicted_ms) and alone.predicted_ms > 0
    assert any(r.family == "tile_composite" for r in again)  # params carry the per-tile workload tuples
    with pytest.raises(ValueError, match="rmat:10"):
        repredict(stale, SUITE[:1], fake_profile)
    with pytest.raises(ValueError, match="no params"):
        repredict([replace(r, params="") for r in stale], SUITE, fake_profile)
