"""A profile of an imaginary GPU with known performance curves, for model tests on a CPU."""
import json
from tuner.model.profile_data import FORMAT, REGIMES
from tuner.profile import variants

def fake_profile_json(l1=1.0e6, l2=5.0e5, dram=1.0e5, max_active=1000, **constants):
    """Every table: performance grows with w up to 64 then flat; regimes scale it. ``constants`` override."""
    scale = {"l1": l1, "l2": l2, "dram": dram}
    tables = {}
    for v in variants((True, False)):
        pts = {r: {str(w): scale[r] * min(w, 64) / 64 for w in (1, 2, 4, 8, 16, 32, 64, 128, 4096)} for r in REGIMES}
        tables[v.key] = {"max_active_warps": max_active, "points": pts}
    # A row alone: 4e-4 ms per entry per lane of its group (a block has 256 lanes; an ALIGNED_COO lane is one
    # thread, its flat warps 32; a TILE-Composite row-major warp 32, a column-major lane one).
    width = {"block": 256, "seg": 1, "flat": 32, "hflat": 32, "row": 32, "col": 1}
    lanes = {v.key: width.get(v.group, v.group) for v in variants((True, False)) if v.alone_measured}
    alone = {k: {r: {str(w): 4e-4 * w / lanes[k] for w in (1, 16, 256, 4096, 65536)} for r in REGIMES}
             for k in lanes}
    return json.dumps({"format": FORMAT, "gpu": {"name": "Fake GPU"}, "constants": {
        "sm_count": 10, "max_warps_per_sm": 100, "l1_bytes": 1 << 18, "l2_bytes": 50 << 20,
        "copy_bandwidth_gbs": 3000.0, "launch_overhead_ms": 0.004, **constants}, "tables": tables,
        "alone": alone})
