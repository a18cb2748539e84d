"""Planner logic with a fake benchmarker: no GPU needed."""
import json
import math

import numpy as np
import pytest

from tuner import families, planner
from tuner.cache import Cache
from tuner.families.base import Specialization
from tuner.families.csr_vector import CsrVectorParams
from tuner.matrix import canonicalize

from .conftest import power_law


def specs_for(widths):
    return [Specialization("csr_vector", CsrVectorParams(t), np.dtype("float32"), np.dtype("int32"), False)
            for t in widths]


def test_exhaustive_picks_the_fastest_and_ranks_all():
    specs = specs_for([1, 2, 4, 8])
    best, ranking = planner.select("exhaustive", specs, [None] * 4, lambda ss: [3.0, 1.5, 0.7, 2.0])
    assert best.params.threads_per_row == 4
    assert [t.measured_ms for t in ranking] == [0.7, 1.5, 2.0, 3.0]
    assert [t.params["threads_per_row"] for t in ranking] == [4, 2, 8, 1]


def test_model_mode_times_nothing_and_follows_the_prediction():
    def no_timing(ss):
        raise AssertionError("model mode must not time")

    best, ranking = planner.select("model", specs_for([1, 2, 4, 8]), [3.0, 1.0, 2.0, 4.0], no_timing)
    assert best.params.threads_per_row == 2
    assert [t.predicted_ms for t in ranking] == [1.0, 2.0, 3.0, 4.0]
    assert all(t.measured_ms is None for t in ranking)


def test_measure_mode_times_only_the_model_top_k():
    timed = []

    def bench(ss):
        timed.extend(s.params.threads_per_row for s in ss)
        return [{1: 9.0, 2: 5.0, 4: 4.0, 8: 1.0}[s.params.threads_per_row] for s in ss]

    best, ranking = planner.select("measure", specs_for([1, 2, 4, 8]), [3.0, 1.0, 2.0, 4.0], bench, top_k=2)
    assert sorted(timed) == [2, 4]  # not 8, although it would have been fastest
    assert best.params.threads_per_row == 4
    assert [(t.params["threads_per_row"], t.measured_ms) for t in ranking[:2]] == [(4, 4.0), (2, 5.0)]
    assert [t.params["threads_per_row"] for t in ranking[2:]] == [1, 8]


def test_optuna_mode_takes_the_best_the_search_measured():
    best, ranking = planner.select("optuna", specs_for([1, 2, 4]), [1.0, 2.0, 3.0], None,
                                   search=lambda: {0: 2.0, 2: 0.5})
    assert best.params.threads_per_row == 4 and ranking[0].measured_ms == 0.5 and ranking[2].measured_ms is None


def test_failed_candidates_rank_last_and_are_never_chosen():
    best, ranking = planner.select("exhaustive", specs_for([1, 2, 4]), [None] * 3,
                                   lambda ss: [math.nan, 5.0, math.inf])
    assert best.params.threads_per_row == 2
    assert ranking[0].measured_ms == 5.0 and ranking[1].measured_ms is None and ranking[2].measured_ms is None


def test_all_failed_no_candidates_or_missing_predictions_are_errors():
    with pytest.raises(RuntimeError, match="every candidate"):
        planner.select("exhaustive", specs_for([1]), [None], lambda ss: [math.nan])
    with pytest.raises(ValueError, match="no candidate"):
        planner.select("exhaustive", [], [], lambda ss: [])
    with pytest.raises(ValueError, match="needs predictions"):
        planner.select("model", specs_for([1]), [None], None)


def test_fake_benchmark_over_real_candidates_of_every_family():
    m = canonicalize(power_law())
    specs = families.specializations(m)
    assert {s.family for s in specs} == {"csr_vector", "binned", "aligned_coo", "tile_coo", "tile_composite"}
    target = families.get("binned").params_type(small_max=8, medium_max=32, warp_division=4, huge_min=32)
    best, ranking = planner.select("exhaustive", specs, [None] * len(specs),
                                   lambda ss: [1.0 if s.params == target else 2.0 + 0.01 * i
                                               for i, s in enumerate(ss)])
    assert best.family == "binned" and best.params == target
    assert ranking[0].measured_ms == 1.0 and ranking[1].measured_ms == 2.0
    assert len(ranking) == len(specs)


def make_plan(**kw):
    base = dict(family="csr_vector", params={"threads_per_row": 8, "block_size": 128}, predicted_ms=None,
                measured_ms=0.25, fingerprint="ab" * 32, value_dtype="float32", index_dtype="int32",
                value_free=False, arch="sm_90", binary_key="cd" * 32, tune="exhaustive",
                ranking=(planner.Timing("csr_vector", {"threads_per_row": 8, "block_size": 128}, 0.25),
                         planner.Timing("csr_vector", {"threads_per_row": 1, "block_size": 128}, 0.5)))
    base.update(kw)
    return planner.Plan(**base)


def test_plan_round_trips_through_json_and_the_cache(tmp_path):
    plan = make_plan(seconds={"relabel": 0.5, "plan": 0.25, "select": 1.5})
    assert planner.Plan.from_json(plan.to_json()) == plan
    # A plan cached before stage times were recorded still loads, with none.
    old = json.loads(plan.to_json())
    del old["seconds"]
    assert planner.Plan.from_json(json.dumps(old)).seconds == {}
    cache = Cache(tmp_path)
    key = planner.plan_key(plan.fingerprint, "float32", "NVIDIA H100 80GB HBM3", (9, 0), "exhaustive")
    assert planner.load_plan(cache, key) is None
    planner.store_plan(cache, key, plan)
    assert planner.load_plan(cache, key) == plan
    spec = planner.load_plan(cache, key).specialization()
    assert spec.params == CsrVectorParams(8, 128) and spec.value_dtype == np.float32


def test_plan_key_covers_fingerprint_dtype_gpu_capability_mode_profile_and_version(monkeypatch):
    args = ("ab", "float32", "H100", (9, 0), "exhaustive")
    base = planner.plan_key(*args)
    variants = [("ac", "float32", "H100", (9, 0), "exhaustive"), ("ab", "float64", "H100", (9, 0), "exhaustive"),
                ("ab", "float32", "H200", (9, 0), "exhaustive"), ("ab", "float32", "H100", (8, 0), "exhaustive"),
                ("ab", "float32", "H100", (9, 0), "model"), ("ab", "float32", "H100", (9, 0), "exhaustive", "p")]
    assert all(planner.plan_key(*v) != base for v in variants)
    monkeypatch.setattr(planner, "__version__", "9.9.9")
    assert planner.plan_key(*args) != base


def test_explain_lists_candidates_fastest_first_with_ratios():
    text = planner.explain(make_plan())
    lines = text.splitlines()
    assert "csr_vector" in lines[0] and "tune=exhaustive" in lines[0]
    assert "predicted ms" in lines[1]
    assert "0.2500" in lines[2] and "1.00" in lines[2] and "threads_per_row=8" in lines[2]
    assert "0.5000" in lines[3] and "2.00" in lines[3]


def test_unknown_tune_mode_is_refused():
    import tuner
    with pytest.raises(ValueError, match="tune must be one of"):
        tuner.compile(power_law(50), tune="guess")


def test_repeated_planning_starts_each_plan_afresh_from_the_relabelled_matrix(monkeypatch):
    # The report's planning seconds are a median of plans; each must redo everything but the relabelling.
    from tuner import compiler
    from tuner.families import tiles as family_tiles
    from tuner.model import Profile
    from .fake_profile import fake_profile_json
    prof = Profile.from_json(fake_profile_json())
    counted, real = [], family_tiles.ranked_runs_many
    monkeypatch.setattr(family_tiles, "ranked_runs_many", lambda *a, **k: counted.append(1) or real(*a, **k))
    specs, predicted, seconds = compiler.plan_candidates(canonicalize(power_law(3000, seed=11)), prof, repeats=3)
    assert len(counted) == 3  # every plan counted the tiles itself: nothing found from the plan before
    assert len(seconds["plan_runs"]) == 3 and seconds["plan"] == np.median(seconds["plan_runs"])
    once, once_predicted, once_seconds = compiler.plan_candidates(canonicalize(power_law(3000, seed=11)), prof)
    assert [s.label() for s in once] == [s.label() for s in specs] and once_predicted == predicted
    assert "plan_runs" not in once_seconds and len(counted) == 4
    with pytest.raises(ValueError, match="repeats must be at least 1"):
        compiler.plan_candidates(canonicalize(power_law(300, seed=1)), prof, repeats=0)


def test_planning_calls_no_blas_routine(monkeypatch):
    # OpenBLAS wakes a thread per core for a dot product of over 10,000 elements, and they spin for a while
    # after it, taking the cores planning's own threads work on (H100 host: 2-3 s more CPU per plan of rmat:23).
    from tuner import compiler
    from tuner.model import Profile
    from .fake_profile import fake_profile_json
    called = []
    for name in ("dot", "vdot", "inner", "matmul", "tensordot", "einsum"):
        real = getattr(np, name)
        monkeypatch.setattr(np, name, lambda *a, _name=name, _real=real, **k: called.append(_name) or _real(*a, **k))
    m = canonicalize(power_law(3000, n_cols=120_000, seed=5))  # x of 15,000 sectors
    specs, predicted, _ = compiler.plan_candidates(m, Profile.from_json(fake_profile_json()))
    assert called == []
    assert len(specs) > 20 and all(p is not None and p > 0 for p in predicted)


def test_an_offline_plan_lists_the_binary_of_every_ranked_candidate_tiled_ones_included(monkeypatch):
    from tuner import compiler
    from tuner.generators import rmat
    from tuner.model import load_profile
    made = []

    def fake_compile_many(sources, arch, cache):  # no nvcc: one stand-in binary per source, in order
        made.extend(sources)
        return [type("Binary", (), {"key": f"k{i}"})() for i in range(len(sources))]
    monkeypatch.setattr(compiler.codegen, "compile_many", fake_compile_many)
    plan, binaries = compiler.plan_offline(rmat(16), load_profile("NVIDIA H100 80GB HBM3"), cache=Cache(None))
    families_ranked = {t.family for t in plan.ranking}
    assert "tile_composite" in families_ranked  # a tuple of workloads in its parameters
    assert len(binaries) == len(made) == len(plan.ranking) and plan.binary_key == "k0"
    assert plan.family == plan.ranking[0].family
