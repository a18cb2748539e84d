"""The chain floor: the longest lane of a launch whose lanes walk whole rows, and its fit to timings."""
import json

import numpy as np
import pytest
import scipy.sparse as sp

from tuner.families.aligned_coo import AlignedCooParams
from tuner.families.base import Specialization, ordered_structure
from tuner.families.binned import BinnedParams
from tuner.families.csr_vector import CsrVectorParams
from tuner.matrix import canonicalize
from tuner.model import Profile, predict_lookup
from tuner.model.chains import ChainFit, chain_floor_ms, fit_chain_floor, longest_lane
from tuner.profile import REDUCED, chains_missing

from .fake_profile import fake_profile_json


def rows_of(lengths, n_cols=None):
    """A matrix with one row of each of ``lengths``, its columns from 0 (distinct values)."""
    lengths = np.asarray(lengths)
    ij = (np.repeat(np.arange(lengths.size), lengths), np.concatenate([np.arange(n) for n in lengths]))
    values = np.linspace(0.5, 1.5, lengths.sum()).astype(np.float32)
    return canonicalize(sp.csr_matrix((values, ij), shape=(lengths.size, n_cols or int(lengths.max()))))


def spec(m, family, params):
    return Specialization(family, params, m.value_dtype, m.index_dtype, m.value_free)


def test_the_longest_lane_is_the_longest_row_over_its_classes_lanes():
    m = rows_of([1, 3, 7, 20, 31, 40, 95, 300, 1000])
    # csr_vector: every row on the same lanes; the 1,000-entry row sets it.
    assert [longest_lane(m, "csr_vector", CsrVectorParams(t, 128)) for t in (1, 4, 32)] == [1000, 250, 32]
    # binned(4, 32, 4 ways, huge from 96): 1..3 on one lane (3), 7..31 on 8 lanes (4), 40..95 on a warp
    # (3), 300 and 1,000 on a block of 256 (4).
    assert longest_lane(m, "binned", BinnedParams(4, 32, 4, 96, 256)) == 4
    # Without a huge class the 1,000-entry row is a warp's: 32 entries a lane.
    assert longest_lane(m, "binned", BinnedParams(4, 32, 4, None, 256)) == 32
    # Medium rows of up to 95 on 4 lanes (8 ways): 24 entries a lane beat the block's 4.
    assert longest_lane(m, "binned", BinnedParams(4, 96, 8, 96, 256)) == 24
    # Lanes that walk slots, not rows, have no such chain here.
    assert longest_lane(m, "aligned_coo", AlignedCooParams("flat", 256, "none")) == 0


def test_a_relabelled_view_has_the_same_longest_lane():
    m = rows_of([5, 300, 2, 64, 17, 1000, 3], n_cols=1000)
    p = BinnedParams(8, 32, 8, 256, 256)  # 5 on a lane, 17 on 4 lanes, 64 on 32, 1,000 on 256: 5, 5, 2, 4
    assert longest_lane(ordered_structure(m, "degree"), "binned", p) == longest_lane(m, "binned", p) == 5


def test_the_fit_finds_the_base_and_round_that_generated_the_timings():
    rng = np.random.default_rng(0)
    entries = rng.integers(1, 400, 60)
    rounds = -(-entries // 4)
    launch = 0.004
    measured = launch + 0.0015 + 0.000225 * rounds
    predicted = measured * rng.uniform(0.3, 0.9, 60)  # the model below every timing: the floor sets them
    work_set = rng.random(60) < 0.3  # some set by their work instead: the model right, far above the floor
    measured[work_set] = predicted[work_set] = 0.05
    fit = fit_chain_floor(predicted, entries, measured, launch)
    assert (fit.base_ms, fit.round_ms) == pytest.approx((0.0015, 0.000225))
    assert fit.error == pytest.approx(0.0, abs=1e-12) and fit.error_without > 0.1
    assert fit.floor_ms(8) == pytest.approx(0.0015 + 2 * 0.000225)


def test_the_fit_refuses_mismatched_inputs():
    with pytest.raises(ValueError, match="as many predictions, chains and timings"):
        fit_chain_floor([0.01, 0.02], [4], [0.01, 0.02], 0.004)
    with pytest.raises(ValueError, match="at least one"):
        fit_chain_floor([], [], [], 0.004)


def test_a_row_walking_launch_lasts_at_least_its_profiles_chain_floor():
    m = rows_of([2] * 500 + [2000], n_cols=2000)
    raw = json.loads(fake_profile_json())
    plain = Profile.from_json(json.dumps(raw))
    raw["chains"] = {"base_ms": 0.002, "round_ms": 0.004, "unroll": 4, "launches": []}
    chained = Profile.from_json(json.dumps(raw))
    fit = ChainFit.from_profile(chained.chains)
    # csr_vector with 4 lanes a row: 500 entries a lane, 125 rounds: 0.002 + 0.5 ms beyond the launch, more
    # than the fake GPU's other terms give it.
    s = spec(m, "csr_vector", CsrVectorParams(4, 128))
    assert chain_floor_ms(m, s, fit) == pytest.approx(0.502)
    assert predict_lookup(m, s, plain) < 0.004 + 0.502
    assert predict_lookup(m, s, chained) == pytest.approx(0.004 + 0.502)
    # binned with a block for the long row: 8 entries a lane, 2 rounds; its floor, 10 us, is below its terms.
    b = spec(m, "binned", BinnedParams(4, 32, 4, 32, 256))
    assert chain_floor_ms(m, b, fit) == pytest.approx(0.010)
    assert predict_lookup(m, b, chained) == predict_lookup(m, b, plain) > 0.004 + 0.010
    # A family whose lanes walk slots is predicted as before; a profile without the fit floors nothing.
    a = spec(m, "aligned_coo", AlignedCooParams("flat", 256, "none"))
    assert predict_lookup(m, a, chained) == predict_lookup(m, a, plain)
    assert ChainFit.from_profile(plain.chains) is None and chain_floor_ms(m, s, None) == 0.0


def test_a_profile_lacking_a_chain_launch_or_the_fit_measures_them():
    names = [{"launch": f"{k}:{a}:{b}"} for k, a, b in REDUCED.chain_launches]
    assert chains_missing(None, REDUCED) and chains_missing({"launches": names}, REDUCED)
    assert chains_missing({"base_ms": 0.001, "launches": names[:1]}, REDUCED)
    assert not chains_missing({"base_ms": 0.001, "launches": names}, REDUCED)


def test_kept_chain_timings_are_fitted_again_against_the_profiles_current_model():
    # Every reduced launch is already timed, so no GPU is needed: the stale predictions kept beside the
    # timings give way to the current profile's, and the fit is made from those.
    from tuner import families
    from tuner.model import predict_many
    from tuner.model.chains import ROW_WALKERS
    from tuner.profile import chain_launch, measure_chains
    raw = json.loads(fake_profile_json())
    model = Profile.from_json(json.dumps(raw))
    rng = np.random.default_rng(1)
    kept, fresh = [], {}
    for kind, a, b in REDUCED.chain_launches:
        m = chain_launch(kind, a, b)
        specs = [s for s in families.specializations(m, list(ROW_WALKERS)) if s.params.order == "none"]
        fresh.update(zip(((f"{kind}:{a}:{b}", s.label()) for s in specs), predict_many(m, specs, model)))
        kept.append({"launch": f"{kind}:{a}:{b}", "rows": m.n_rows, "nnz": m.nnz, "candidates": [
            {"label": s.label(), "longest_lane": longest_lane(m, s.family, s.params), "predicted_ms": 1.0,
             "measured_ms": float(t), "rounds_ms": [float(t)]} for s, t in zip(specs, rng.uniform(0.01, 0.3, len(specs)))]})
    chains = measure_chains(None, REDUCED, None, None, raw, {"launches": kept})
    rows = [c for launch in chains["launches"] for c in launch["candidates"]]
    assert len(rows) == sum(len(k["candidates"]) for k in kept) == len(fresh) > 50
    assert all(c["predicted_ms"] == fresh[launch["launch"], c["label"]] != 1.0
               for launch in chains["launches"] for c in launch["candidates"])
    assert [c["measured_ms"] for c in rows] == [c["measured_ms"] for k in kept for c in k["candidates"]]
    fit = fit_chain_floor([c["predicted_ms"] for c in rows], [c["longest_lane"] for c in rows],
                          [c["measured_ms"] for c in rows], raw["constants"]["launch_overhead_ms"])
    assert (chains["base_ms"], chains["round_ms"], chains["error"]) == (fit.base_ms, fit.round_ms, fit.error)


def test_refit_chains_fits_a_profile_file_again_without_a_gpu(tmp_path):
    # A profile whose chain fit was made against another model: `profile --refit-chains --out` keeps its
    # timings, predicts them afresh, writes the new fit and records the command; nothing is measured.
    from tuner.cli import main
    from tuner.profile import chain_launch, fit_chains
    raw = json.loads(fake_profile_json())
    rng = np.random.default_rng(2)
    kind, a, b = REDUCED.chain_launches[0]
    m = chain_launch(kind, a, b)
    from tuner import families
    specs = [s for s in families.specializations(m, ["csr_vector", "binned"]) if s.params.order == "none"]
    launch = {"launch": f"{kind}:{a}:{b}", "rows": m.n_rows, "nnz": m.nnz, "candidates": [
        {"label": s.label(), "longest_lane": longest_lane(m, s.family, s.params), "predicted_ms": 1.0,
         "measured_ms": float(t), "rounds_ms": [float(t)]} for s, t in zip(specs, rng.uniform(0.005, 0.05, len(specs)))]}
    raw["chains"] = {"base_ms": 0.5, "round_ms": 0.5, "unroll": 4, "launches": [launch]}
    raw["command"] = "python -m tuner profile"
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(raw))
    assert main(["profile", "--refit-chains", "--out", str(path)]) == 0
    got = json.loads(path.read_text())
    want = fit_chains(raw, [launch])
    assert (got["chains"]["base_ms"], got["chains"]["round_ms"]) == (want["base_ms"], want["round_ms"]) != (0.5, 0.5)
    assert [c["measured_ms"] for c in got["chains"]["launches"][0]["candidates"]] == \
        [c["measured_ms"] for c in launch["candidates"]]
    assert got["command"] == f"python -m tuner profile ; then python -m tuner profile --refit-chains --out {path}"
    assert got["tables"] == raw["tables"]


def test_refit_chains_refuses_a_profile_without_chain_timings(tmp_path, capsys):
    from tuner.cli import main
    path = tmp_path / "profile.json"
    path.write_text(fake_profile_json())
    assert main(["profile", "--refit-chains", "--out", str(path)]) == 2
    assert "holds no chain launches" in capsys.readouterr().err
