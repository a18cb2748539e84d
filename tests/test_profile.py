"""Offline profiling: synthetic matrices and kernel shapes (CPU), and a reduced profile on the GPU."""
import json

import numpy as np
import pytest

from tuner import families, profile
from tuner.formats.aligned_coo import sizes
from tuner.formats.binned import build_binned
from tuner.compiler import ROUNDS_UNDER_MS
from tuner.model import load_profile
from tuner.model.chains import ChainFit
from tuner.model.profile_data import REGIMES, ROW_HEIGHTS, warp_rows


@pytest.mark.parametrize("w", [1, 3, 64, 700])
def test_synthetic_rows_have_exactly_w_distinct_sorted_columns(w):
    m = profile.synthetic(w, n_rows=50, n_cols=1000, value_free=False, seed=1)
    assert m.row_lengths.tolist() == [w] * 50
    rows = m.indices.reshape(50, w)
    assert (np.diff(rows, axis=1) > 0).all() and rows.max() < 1000 and rows.min() >= 0
    assert not m.value_free and 0.5 <= m.data.min() and m.data.max() <= 1.5
    assert profile.synthetic(w, 4, 1000, True, 1).pattern_value == 1.0


@pytest.mark.parametrize("w", [2, 5, 40, 3000])
def test_every_binned_shape_puts_all_rows_in_its_class(w):
    classes = {1: 0, 4: 1, 8: 1, 32: 2, "block": 3}
    for v in profile.variants((True,)):
        params = v.params(w)
        if v.family in ("aligned_coo", "tile_composite"):
            continue
        if v.family != "binned":
            assert params.threads_per_row == v.group and params.block_size == v.block
            continue
        counts = build_binned(np.full(10, w), params.small_max, params.medium_max, params.huge_min).counts
        assert counts[classes[v.group]] == 10, (v, params)
        if v.group in (4, 8):
            assert params.medium_lanes == v.group


@pytest.mark.parametrize("w", [1, 5, 31, 32, 64, 96, 4096])
def test_tile_composite_shapes_pack_rows_of_one_length_into_their_kind(w):
    from tuner.formats.tile_composite import pack
    for v in (v for v in profile.variants((True,)) if v.family == "tile_composite"):
        params = v.params(w)
        if v.group == "col" and w > profile.COL_MAJOR_MAX_W:
            assert params is None
            continue
        rows = int(v.group[3:]) if v.group.startswith("row") and v.group != "row" else 1
        if rows > w:  # a row-major workload of h rows needs rows of at least h entries
            assert params is None
            continue
        p = pack(np.full(1024, w), params.workloads[0])
        assert params.tile_width == 0 and params.order == "none"
        if v.group.startswith("row"):  # warps of `rows` rows of w each, in turn
            assert p.row_major.all() and (p.h == rows).all() and (p.w == -(-w // 32) * 32).all()
        else:  # column-major warps of a warp multiple of rows, taller than wide
            assert not p.row_major[:-1].any() and (p.h % 32 == 0).all() and (p.h[:-1] > w).all()


@pytest.mark.parametrize("w", [1, 5, 32, 96, 4096])
def test_aligned_coo_shapes_give_one_warp_shape_per_width(w):
    rows = np.full(100, w)
    for v in (v for v in profile.variants((True,)) if v.family == "aligned_coo"):
        params = v.params(w)
        if v.group == "hflat" and w % 32:
            assert params is None
            continue
        g = sizes(rows, params.layout)
        if v.group == "seg":  # a lane per row, w slots each
            assert (g.seg_len, g.lanes, g.n_flat) == (w, 100, 0)
        else:  # every entry flat
            assert (g.n_seg, g.n_flat) == (0, 100 * w)


def test_shapes_cover_every_kernel_the_families_generate():
    keys = {v.key for v in profile.variants((True, False))}
    assert len(keys) == 2 * (12 + 5 + 3 + 2 + len(ROW_HEIGHTS) - 1)
    from tuner.matrix import canonicalize
    from tuner.families.base import ordered_structure
    from tuner.model.warps import SEGMENTS
    from .conftest import fixture_matrices
    for A in fixture_matrices().values():
        m = canonicalize(A)
        for s in families.specializations(m):
            for key, _ in SEGMENTS[s.family](ordered_structure(m, s.params.order), s.params):
                assert key in keys


def test_long_row_goes_into_the_middle_with_distinct_sorted_columns():
    bulk = profile.synthetic(4, 101, 5000, True, seed=3)
    m = profile.with_long_row(bulk, 300, seed=4)
    assert m.shape == (102, 5000) and m.nnz == bulk.nnz + 300
    assert m.row_lengths[50] == 300 and (np.delete(m.row_lengths, 50) == 4).all()
    row = m.indices[m.indptr[50]:m.indptr[51]]
    assert (np.diff(row) > 0).all()
    # The rows around it are the bulk's, unchanged.
    assert (m.indices[:m.indptr[50]] == bulk.indices[:bulk.indptr[50]]).all()
    assert (m.indices[m.indptr[51]:] == bulk.indices[bulk.indptr[50]:]).all()


def test_rows_fill_the_gpu_twice_within_the_cap():
    info = type("Info", (), {"sm_count": 132, "threads_per_sm": 2048})()
    grid = profile.Grid()
    assert profile.rows_for(1, grid, info) == grid.target_nnz
    assert profile.rows_for(4096, grid, info) == grid.max_nnz // 4096
    assert profile.rows_for(64, grid, info) * 64 >= grid.target_nnz


@pytest.mark.gpu
def test_reduced_profile_is_written_loadable_and_resumable(tmp_path):
    out = tmp_path / "profile.json"
    prof = profile.run(out, profile.REDUCED)
    loaded = load_profile(path=out)
    c = loaded.constants
    assert c["sm_count"] > 0 and c["copy_bandwidth_gbs"] > 100 and 0 < c["launch_overhead_ms"] < 0.1
    # A gather queued beside the product adds less than a launch on its own.
    assert 0 < c["gather_launch_ms"] < c["launch_overhead_ms"]
    assert loaded.gpu["name"] and loaded.gpu["nvcc"].startswith("V")
    # Effective capacities: L1 holds fewer sectors than L2, and neither more than its nominal size.
    assert 0 < c["l1_sectors"] < c["l2_sectors"] <= c["l2_bytes"] / 32
    assert c["l1_sectors"] <= c["l1_bytes"] / 32
    # Gathers over an x far larger than L2 are slower than over one inside L1.
    assert prof["caches"]["l2"]["ms"][-1] > prof["caches"]["l1"]["ms"][0]
    assert 0 <= c["tail_factor"] < 10 and len(prof["tail"]["points"]) == len(profile.TAIL_WIDTHS)
    # The tail factor against the bulk's work: bulks growing fourfold, the largest one's factor the constant.
    curve = prof["tail"]["curve"]
    assert [b["bulk_nnz"] for b in curve] == sorted(b["bulk_nnz"] for b in curve)
    assert curve[0]["work_ms"] < curve[-1]["work_ms"] and curve[-1]["factor"] == c["tail_factor"]
    # A warp's worth of rows alone, for the kernels whose warps hold several: 32 one-lane rows of 4096
    # entries take longer than one.
    assert set(prof["alone_warp"]) == {v.key for v in profile.variants((True,)) if warp_rows(v.key) > 1}
    assert prof["alone_warp"]["csr_vector:1:256:vf"]["l2"]["4096"] > prof["alone"]["csr_vector:1:256:vf"]["l2"]["4096"]
    for key, table in loaded.tables.items():
        assert table["max_active_warps"] >= c["sm_count"]
        for r in REGIMES:
            widths = [w for w in profile.REDUCED.widths if w >= 2 or ("binned:32" not in key and "block" not in key)]
            widths = [w for w in widths if w % 32 == 0 or ":hflat:" not in key]
            widths = [w for w in widths if w <= profile.COL_MAJOR_MAX_W or ":col:" not in key]
            rows = int(key.split(":")[1][3:] or 1) if key.startswith("tile_composite:row") else 1
            widths = [w for w in widths if w >= rows]  # workloads of h rows of w need w >= h
            assert sorted(map(int, table["points"][r])) == sorted(widths), (key, r)
            assert all(v > 0 for v in table["points"][r].values())
    # Gathers from x in L1 beat gathers from memory for short rows of a warp-per-row kernel.
    t = loaded.tables["csr_vector:32:256:vf"]["points"]
    assert t["l1"]["32"] > t["dram"]["32"]
    # The small launches' floors, measured after the tables: every shape (the hybrid's flat warps on rows
    # of 32), its warps per SM increasing; two full waves take longer than 2 warps per SM.
    occ = prof["occupancy"]["shapes"]
    assert set(occ) == {v.key for v in profile.variants((True,))}
    assert occ["aligned_coo:hflat:256:vf"]["width"] == 32 and occ["csr_vector:1:256:vf"]["width"] == 4
    for shape in occ.values():
        assert shape["warps_per_sm"] == sorted(set(shape["warps_per_sm"])) and min(shape["busy_ms"]) >= 0
    assert occ["csr_vector:1:256:vf"]["busy_ms"][-1] > occ["csr_vector:1:256:vf"]["busy_ms"][0]
    assert loaded.occupancy_floor("csr_vector:1:256:vf", 1000) == occ["csr_vector:1:256:vf"]["busy_ms"][-1]
    # The seg part's lanes walk their slots in turn: its floor also at lanes of CHAIN_WIDTHS slots, two full
    # waves of 64-slot lanes taking longer than of 4; no other shape has them.
    seg = occ["aligned_coo:seg:256:vf"]
    assert [c["width"] for c in seg["by_width"]] == list(profile.CHAIN_WIDTHS)
    assert seg["by_width"][-1]["busy_ms"][-1] > seg["busy_ms"][-1]
    assert [k for k, s in occ.items() if "by_width" in s] == ["aligned_coo:seg:256:vf"]
    assert loaded.occupancy_floor("aligned_coo:seg:256:vf", 1000, width=64) == seg["by_width"][-1]["busy_ms"][-1]
    # The chain floor: every row-walking candidate of the reduced launches of mixed rows timed in its rounds
    # (those under the rounds' threshold), and a fit no worse than no floor (the grid holds a zero floor).
    ch = prof["chains"]
    assert [c["launch"] for c in ch["launches"]] == [f"{k}:{a}:{b}" for k, a, b in profile.REDUCED.chain_launches]
    assert all(len(launch["candidates"]) >= 18 for launch in ch["launches"])
    for c in (c for launch in ch["launches"] for c in launch["candidates"]):
        assert len(c["rounds_ms"]) == (profile.REDUCED.chain_rounds if c["rounds_ms"][0] < ROUNDS_UNDER_MS else 1)
        assert c["measured_ms"] > prof["constants"]["launch_overhead_ms"] / 2 and c["predicted_ms"] > 0
    assert 0 <= ch["error"] <= ch["error_without"]
    assert ChainFit.from_profile(loaded.chains) == ChainFit(ch["base_ms"], ch["round_ms"], 4, ch["error"],
                                                            ch["error_without"])
    before = out.read_text()
    again = profile.run(out, profile.REDUCED)  # resumed: nothing left to measure
    assert json.loads(before)["tables"] == again["tables"]
    assert prof["constants"] == again["constants"] and prof["chains"] == again["chains"]
    # Only the cache sweeps and the tail measured again; the file records the run that changed it.
    remeasured = profile.run(out, profile.REDUCED, remeasure_caches=True, remeasure_tail=True,
                             command="python -m tuner profile --remeasure-caches --remeasure-tail")
    assert remeasured["tables"] == again["tables"] and remeasured["alone"] == again["alone"]
    assert remeasured["occupancy"] == again["occupancy"] == json.loads(before)["occupancy"]
    assert remeasured["caches"]["l1"]["columns"] == list(profile.REDUCED.l1_sweep)
    assert min(remeasured["caches"]["l1"]["ms"]) < remeasured["caches"]["l2"]["ms"][-1]
    assert len(remeasured["tail"]["curve"]) == len(profile.TAIL_BULK_SHARES)
    assert remeasured["command"].endswith(" ; then python -m tuner profile --remeasure-caches --remeasure-tail")
    # A profile made before the chains were measured gains them on its next run, its other floors kept.
    older = json.loads(out.read_text())
    del older["occupancy"]["shapes"]["aligned_coo:seg:256:vf"]["by_width"]
    out.write_text(json.dumps(older))
    grown = profile.run(out, profile.REDUCED)["occupancy"]["shapes"]
    assert [c["width"] for c in grown["aligned_coo:seg:256:vf"]["by_width"]] == list(profile.CHAIN_WIDTHS)
    assert {k: s for k, s in grown.items() if k != "aligned_coo:seg:256:vf"} == {
        k: s for k, s in older["occupancy"]["shapes"].items() if k != "aligned_coo:seg:256:vf"}


# Both shipped profiles hold every kernel shape's table (tile_coo reads aligned_coo's flat one).
@pytest.mark.parametrize("gpu_name", ["NVIDIA H100 80GB HBM3", "NVIDIA H200"])
def test_shipped_profiles_load_with_measured_constants(gpu_name):
    loaded = load_profile(gpu_name)
    c = loaded.constants
    assert loaded.gpu["name"] == gpu_name
    assert 0 < c["l1_sectors"] < c["l1_bytes"] / 32 and 0 < c["l2_sectors"] < c["l2_bytes"] / 32
    assert 1.0 < c["tail_factor"] < 4.0 and 0 < c["launch_overhead_ms"] < 0.02
    shapes = profile.variants((True, False))
    assert set(loaded.tables) == {v.key for v in shapes}
    # Every shape's table, and the lone-row times of those that have them.
    assert all(loaded.has(v.key) if v.alone_measured else loaded.has_table(v.key) for v in shapes)
    # The chain floor fitted to every launch of mixed rows: a base of a microsecond or two and a fraction of
    # one a round, which brings the model closer to those launches than it was without.
    fit = ChainFit.from_profile(loaded.chains)
    assert 0.0005 < fit.base_ms < 0.003 and 0 < fit.round_ms < 0.001 and fit.error < fit.error_without
    assert [c["launch"] for c in loaded.chains["launches"]] == [f"{k}:{a}:{b}" for k, a, b in profile.CHAIN_LAUNCHES]


def test_profile_of_an_older_format_is_refused_with_advice():
    with pytest.raises(ValueError, match="measure again"):
        from tuner.model import Profile
        Profile.from_json(json.dumps({"format": 1, "gpu": {}, "constants": {}, "tables": {}}))
