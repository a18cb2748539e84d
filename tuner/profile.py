"""``python -m tuner profile``: offline profiling of this GPU into ``models/<gpu-slug>/profile.json``.

Micro-benchmarks on synthetic matrices whose rows all have the same length w (so every warp's workload has
one shape) measure, for each kernel shape the families realise (lanes per row x block size x value-free;
TILE-Composite's row-major workloads also of h = 1, 2, 4, ... 32 such rows each), the throughput of a full
GPU of such warps - the lookup table Performance(w, h) of paper 003 - in three regimes of where the
gathered x lives (L1, L2, device memory). Beside it: the constants the online model
needs. The file is rewritten after every synthetic matrix, and a rerun skips what it already holds.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from . import __version__, codegen, compiler, families, gpu
from .cache import Cache, atomic_write
from .families.aligned_coo import AlignedCooParams
from .families.base import Specialization
from .families.binned import BinnedParams
from .families.csr_vector import BLOCK_SIZES, THREADS_PER_ROW, CsrVectorParams
from .families.tile_composite import TileCompositeParams
from .formats.reorder import NONE
from .formats.tile_composite import col_shape_height
from .generators import rmat
from .kernel import DeviceArrays, SpMV, copy_bandwidth_gbs, time_spmv
from .matrix import CanonicalMatrix, canonicalize
from .model.chains import ROW_WALKERS, fit_chain_floor, longest_lane
from .model.locality import SECTOR_BYTES, fit_capacity
from .model.profile_data import warp_rows
from .model.warps import warp_segments
from .model.lookup import TAIL_START, predict_many
from .model.occupancy import active_warps_per_sm
from .model.profile_data import FORMAT, REGIMES, ROW_HEIGHTS, Profile, kernel_key, profile_path, row_group

# The chain floor's launches of mixed rows (:func:`measure_chains`): R-MAT graphs ("rmat", scale, edge
# factor), patterns as real power-law graphs come, of 2k to 64k rows and up to 10k entries in a row; and
# banded matrices ("band", rows, mean row length), with values, as the finite-element controls come.
CHAIN_LAUNCHES = (("rmat", 11, 16), ("rmat", 12, 8), ("rmat", 13, 16), ("rmat", 14, 8), ("rmat", 14, 32),
                  ("rmat", 15, 16), ("rmat", 16, 8), ("rmat", 16, 32), ("band", 5000, 60), ("band", 20000, 24),
                  ("band", 50000, 12))
HOPPER_L1_BYTES = 256 * 1024  # unified L1/texture/shared per SM on sm_90 (not exposed as an attribute)
WIDTHS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 512, 1024, 2048, 4096)


@dataclass(frozen=True)
class Grid:
    """What a profiling run measures.

    Attributes:
        widths: row lengths w of the synthetic matrices.
        target_nnz: entries per synthetic matrix (at least enough rows to fill the GPU twice).
        max_nnz: cap on entries per synthetic matrix.
        value_free: which value-free variants to measure (True: pattern kernels, False: with values).
        repeats: timed launches per point.
        alone_widths: row lengths of the lone-row measurements.
        chain_launches: the synthetic launches of mixed rows of the chain floor (``CHAIN_LAUNCHES``).
        chain_rounds: rounds each of their candidates is timed in, each on buffers placed afresh.
    """

    widths: tuple = WIDTHS
    target_nnz: int = 16 << 20
    max_nnz: int = 48 << 20
    value_free: tuple = (True, False)
    repeats: int = 15
    alone_widths: tuple = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536)
    cache_nnz: int = 16 << 20
    # Columns of x, in quarter (L1) and half (L2) octaves: the model reads the hit rate off these curves
    # (:class:`~tuner.model.locality.CacheLevel`), and the real caches' knees are not sharp. Each sweep ends
    # where its cache serves next to nothing (8 MB for L1, 512 MB for L2).
    l1_sweep: tuple = tuple(round(2 ** (k / 4)) for k in range(44, 85))  # 8 KB .. 8 MB of float32
    l2_sweep: tuple = tuple(round(2 ** (k / 2)) for k in range(38, 55))  # 2 MB .. 512 MB
    chain_launches: tuple = CHAIN_LAUNCHES
    chain_rounds: int = compiler.DEFAULT_ROUNDS


REDUCED = Grid(widths=(1, 4, 32, 256), target_nnz=1 << 20, max_nnz=4 << 20, value_free=(True,), repeats=5,
               alone_widths=(1, 64, 4096), cache_nnz=2 << 20, l1_sweep=(2 ** 11, 2 ** 14, 2 ** 17, 2 ** 19),
               l2_sweep=(2 ** 19, 2 ** 22, 2 ** 24, 2 ** 26), chain_launches=(("rmat", 11, 16), ("band", 5000, 60)),
               chain_rounds=2)


@dataclass(frozen=True)
class Variant:
    """One kernel shape of one family: lanes per row (or 'block', or an ALIGNED_COO part), block size,
    value-free."""

    family: str
    group: object
    block: int
    value_free: bool

    @property
    def key(self) -> str:
        return kernel_key(self.family, self.group, self.block, self.value_free)

    @property
    def alone_measured(self) -> bool:
        """Whether its lone-row times are measured: not for row-major TILE-Composite workloads of several
        rows (one lone row is no such workload; the model holds them alone for their rounds of one row)."""
        return not (self.family == "tile_composite" and self.group not in ("row", "col"))

    @property
    def chained(self) -> bool:
        """Whether each of its lanes walks a segment of slots one after another (ALIGNED_COO's seg part):
        its floor is measured at several segment lengths too (``CHAIN_WIDTHS``)."""
        return (self.family, self.group) == ("aligned_coo", "seg")

    def params(self, w: int):
        """Parameters that run every row of length w through this shape; None when it cannot."""
        return SHAPE_PARAMS[self.family](self.group, self.block, w)


def _binned_shape(group, block: int, w: int) -> BinnedParams | None:
    if group == 1:
        return BinnedParams(small_max=w + 1, medium_max=w + 2, block_size=block)
    if group == "block":
        return BinnedParams(1, w, 8, w, block) if w >= 2 else None
    if group == 32:
        return BinnedParams(1, w, 8, None, block) if w >= 2 else None
    return BinnedParams(1, w + 1, 32 // group, None, block)


def _aligned_coo_shape(group: str, block: int, w: int) -> AlignedCooParams | None:
    # Rows of one length w: all-seg gives lanes of w slots, all-flat COO warps over rows of w, and the
    # hybrid (w a warp multiple) warps that each lie in one row.
    if group == "hflat":
        return AlignedCooParams("hybrid", block) if w % 32 == 0 else None
    return AlignedCooParams(group, block)


COL_MAJOR_MAX_W = 64  # column-major workloads are narrower than tall: wider ones would need 2,000-row warps


def _tile_composite_shape(group: str, block: int, w: int) -> TileCompositeParams | None:
    # One tile of rows of length w: workload size w h gives row-major warps of h rows (w >= h); w x h with
    # h the next warp multiple above w gives column-major warps of h rows.
    if group.startswith("row"):
        h = int(group[3:] or 1)
        return TileCompositeParams(0, (w * h,), False, block, NONE) if w >= h else None
    if w > COL_MAJOR_MAX_W:
        return None
    return TileCompositeParams(0, (w * int(col_shape_height(w)),), False, block, NONE)


# family -> (group, block, w) -> parameters that run rows of length w through that kernel shape, or None.
# (tile_coo runs ALIGNED_COO's flat kernel and reads its tables.)
SHAPE_PARAMS = {
    "csr_vector": lambda group, block, w: CsrVectorParams(group, block),
    "binned": _binned_shape,
    "aligned_coo": _aligned_coo_shape,
    "tile_composite": _tile_composite_shape,
}


def variants(value_free: tuple) -> list[Variant]:
    out = []
    for vf in value_free:
        out += [Variant("csr_vector", g, b, vf) for g in THREADS_PER_ROW for b in BLOCK_SIZES]
        out += [Variant("binned", g, 256, vf) for g in (1, 4, 8, 32, "block")]
        out += [Variant("aligned_coo", g, 256, vf) for g in ("seg", "flat", "hflat")]
        out += [Variant("tile_composite", g, 256, vf) for g in ("row", "col")]
        out += [Variant("tile_composite", row_group(h), 256, vf) for h in ROW_HEIGHTS if h > 1]
    return out


def regimes(info: gpu.DeviceInfo) -> dict:
    """Columns of x per regime: a quarter of L1, a quarter of L2, and 8x L2 (uniform gathers)."""
    return {"l1": HOPPER_L1_BYTES // 4 // 4, "l2": info.l2_bytes // 4 // 4, "dram": info.l2_bytes * 8 // 4}


def synthetic(w: int, n_rows: int, n_cols: int, value_free: bool, seed: int) -> CanonicalMatrix:
    """n_rows rows of exactly w entries (distinct random columns when possible), sorted, int32, float32."""
    rng = np.random.default_rng(seed)
    # Sorted draws from [0, n_cols - w] plus 0..w-1: strictly increasing, so a row's columns are distinct.
    cols = rng.integers(0, max(n_cols - w, 0) + 1, size=(n_rows, w), dtype=np.int32)
    cols.sort(axis=1)
    cols += np.arange(w, dtype=np.int32)
    indices = cols.ravel()
    indptr = np.arange(0, n_rows * w + 1, w, dtype=np.int32)
    data = np.ones(indices.size, np.float32) if value_free else rng.uniform(0.5, 1.5, indices.size).astype(np.float32)
    return CanonicalMatrix(indptr=indptr, indices=indices, data=data, shape=(n_rows, n_cols),
                           pattern_value=1.0 if value_free else None)


def rows_for(w: int, grid: Grid, info: gpu.DeviceInfo) -> int:
    fill = 2 * info.sm_count * (info.threads_per_sm // 32)
    return int(max(1, min(max(-(-grid.target_nnz // w), fill), grid.max_nnz // w)))


def median_ms(m: CanonicalMatrix, family: str, params, arch: str, cache: Cache, repeats: int = 20,
              warmup: int = 3) -> float:
    """Median milliseconds of one kernel on ``m`` (its own buffers; compiled through the binary cache)."""
    spec = Specialization(family, params, m.value_dtype, m.index_dtype, m.value_free)
    k = SpMV(m, spec, codegen.compile_source(families.render(spec, m), arch, cache=cache).cubin, None)
    return float(np.median(time_spmv(k, repeats, warmup)))


def measure_launch_overhead(arch: str, cache: Cache) -> float:
    """Median milliseconds of an SpMV launch that does almost nothing (one short row)."""
    return median_ms(synthetic(1, 1, 8, True, 0), "csr_vector", CsrVectorParams(1, 128), arch, cache, 200, 20)


def measure_gather_launch(arch: str, cache: Cache) -> float:
    """Median milliseconds that each of a relabelled plan's two gathers adds to a near-empty launch:
    (relabelled - plain) / 2 over 64 rows of 4 entries. A kernel queued right behind another starts while
    the previous one ends, so it costs far less than a launch on its own (``launch_overhead_ms``)."""
    m = synthetic(4, 64, 64, True, 0)
    plain = median_ms(m, "csr_vector", CsrVectorParams(4, 128), arch, cache, 200, 20)
    relabelled = median_ms(m, "csr_vector", CsrVectorParams(4, 128, "degree"), arch, cache, 200, 20)
    return max(relabelled - plain, 0.0) / 2


def warm_up(seconds: float = 1.0) -> None:
    """Keep the GPU busy for a moment so that it leaves its idle clocks before constants are measured."""
    nbytes = 256 << 20
    src, dst = gpu.alloc(nbytes), gpu.alloc(nbytes)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(20):
            gpu.copy_device(int(dst), int(src), nbytes)
        gpu.synchronize()


def measure_alone(info: gpu.DeviceInfo, grid: Grid, arch: str, cache: Cache, launch_ms: float,
                  skip: frozenset = frozenset(), full_warp: bool = False) -> dict:
    """Milliseconds one row of w entries takes on its own (one warp, or one block), per kernel shape
    (those whose key is in ``skip`` excepted); with ``full_warp``, one warp's worth of such rows
    (:func:`~tuner.model.profile_data.warp_rows`; the shapes of one row per warp are left out).

    A full GPU hides each warp's latency behind the others; a warp left alone with a long row (or a block
    with its reduction) does not, and the model bounds a kernel by these times. A warp whose 32 lanes each
    walk their own row issues 32 times the loads of one row's lane per step, and takes several times
    longer than one such row (H100, one lane per row: 32 rows of 256 entries 21 us, one of them 14 us).
    """
    cols = regimes(info)
    out: dict = {}
    for v in (v for v in variants(grid.value_free) if v.key not in skip and v.alone_measured):
        rows = warp_rows(v.key) if full_warp else 1
        if full_warp and rows == 1:
            continue
        table = out.setdefault(v.key, {r: {} for r in REGIMES})
        for w in grid.alone_widths:
            params = v.params(w)
            if params is None:
                continue
            for regime in REGIMES:
                m = synthetic(w, rows, max(cols[regime], w), v.value_free, seed=w)
                ms = median_ms(m, v.family, params, arch, cache, 15)
                table[regime][str(w)] = max(ms - launch_ms, 1e-6)
    return out


CACHE_WIDTH = 32  # the sweep's rows: one warp per row, 32 uniform gathers each
WARP_PER_ROW = CsrVectorParams(32, 256)  # the kernel of the cache and tail measurements


def measure_caches(info: gpu.DeviceInfo, grid: Grid, arch: str, cache: Cache) -> dict:
    """Effective L1 and L2 capacities for gathers of x, in 32-byte sectors, from sweeps of x's size.

    Rows of 32 uniformly random columns stream through the 32-lane kernel while x grows; the time per
    entry steps from one level's speed to the next's as x outgrows the cache, and
    :func:`~tuner.model.locality.fit_capacity` reads the capacity off that step. What it measures is the
    share of each cache the gathers really get while the matrix streams past, not the nominal size.
    """
    n_rows = max(grid.cache_nnz // CACHE_WIDTH, 1)
    out: dict = {}
    for level, sizes in (("l1", grid.l1_sweep), ("l2", grid.l2_sweep)):
        ms = [median_ms(synthetic(CACHE_WIDTH, n_rows, int(n_cols), True, seed=int(n_cols)), "csr_vector",
                        WARP_PER_ROW, arch, cache) for n_cols in sizes]
        capacity = fit_capacity(np.array(sizes, np.float64), np.array(ms))
        out[level] = {"columns": [int(c) for c in sizes], "ms": ms,
                      "sectors": capacity * np.dtype(np.float32).itemsize / SECTOR_BYTES}
    return out


TAIL_WIDTHS = (16384, 65536, 262144)  # long rows dropped into the middle of a GPU-filling bulk
TAIL_BULK_WIDTH = 16
TAIL_BULK_SHARES = (16, 4, 1)  # the bulks of the tail measurement: cache_nnz over these, largest last


def with_long_row(bulk: CanonicalMatrix, width: int, seed: int) -> CanonicalMatrix:
    """``bulk`` with one row of ``width`` distinct random columns inserted in the middle of its rows.

    Example:
        >>> m = with_long_row(synthetic(2, 4, 8, True, 0), 5, 1)
        >>> m.row_lengths.tolist(), m.shape
        ([2, 2, 5, 2, 2], (5, 8))
    """
    n_rows, n_cols = bulk.shape
    mid = n_rows // 2
    long_cols = np.sort(np.random.default_rng(seed).choice(n_cols, size=min(width, n_cols), replace=False))
    cut = int(bulk.indptr[mid])
    indices = np.concatenate([bulk.indices[:cut], long_cols.astype(bulk.indices.dtype), bulk.indices[cut:]])
    indptr = np.concatenate([bulk.indptr[:mid + 1], bulk.indptr[mid:] + long_cols.size]).astype(bulk.indptr.dtype)
    data = np.ones(indices.size, bulk.value_dtype)
    return CanonicalMatrix(indptr=indptr, indices=indices, data=data, shape=(n_rows + 1, n_cols),
                           pattern_value=bulk.pattern_value)


def measure_tail(info: gpu.DeviceInfo, grid: Grid, arch: str, cache: Cache, launch_ms: float) -> dict:
    """How much slower a long row runs among other warps than alone (the tail factor), against how long
    the other warps run.

    One long row of W entries goes into the middle of a bulk of short rows (32-lane kernel, x in L2), so
    it starts about halfway through the bulk; where the kernel then outlasts the bulk, the row ran for
    (time - bulk / 2) against its time alone. A bulk's factor is the median of that ratio over the rows
    that did outlast it (1 when none did). The bulks hold 1/16, 1/4 and all of ``grid.cache_nnz``
    entries: beside a bulk of a few microseconds a row runs as fast as alone, beside a long one up to
    twice as slow (H100: 1.8 at 0.17 ms), all its life (``curve``: each bulk's work beyond the launch,
    and its factor). ``factor`` and ``points`` are the largest bulk's.
    """
    n_cols = regimes(info)["l2"]

    def ms(m):
        return median_ms(m, "csr_vector", WARP_PER_ROW, arch, cache)

    alone = {w: ms(synthetic(w, 1, n_cols, True, seed=w)) for w in TAIL_WIDTHS}
    curve = []
    for share in TAIL_BULK_SHARES:
        bulk = synthetic(TAIL_BULK_WIDTH, max(grid.cache_nnz // share // TAIL_BULK_WIDTH, 1), n_cols, True, seed=7)
        base = ms(bulk)
        points = {str(w): {"bulk_ms": base, "with_row_ms": ms(with_long_row(bulk, w, seed=w)), "alone_ms": alone[w]}
                  for w in TAIL_WIDTHS}
        factors = [(p["with_row_ms"] - TAIL_START * p["bulk_ms"]) / p["alone_ms"] for p in points.values()
                   if p["with_row_ms"] > 1.05 * p["bulk_ms"]]
        curve.append({"bulk_nnz": int(bulk.nnz), "work_ms": max(base - launch_ms, 1e-6),
                      "factor": float(np.median(factors)) if factors else 1.0, "points": points})
    return {"factor": curve[-1]["factor"], "start": TAIL_START, "points": curve[-1]["points"], "curve": curve}


OCCUPANCY_WIDTH = 4  # the narrowest rows: a launch's least work per warp (wider where a shape needs them)
OCCUPANCY_WARPS = (2, 4, 8, 16, 32, 48)  # warps per SM asked for, then two full waves of the shape
OCCUPANCY_COLUMNS = 8192  # x in L1: the floor is the warps' latency, not the gathers'
# Lane lengths a chained shape's floor is measured at beside its narrowest (the hybrid's seg lanes hold up
# to 31 slots). Only for chains: other shapes' floors at longer rows of uniformly random columns are set by
# those gathers and overshoot real matrices (H100, 32 lanes per row of 64 entries: 1.8 us at 32 warps per
# SM, where bcsstk16's rows of 59 take 1.1 us at 40).
CHAIN_WIDTHS = (8, 16, 32, 64)


def launch_warps(v: Variant, params, w: int, m: CanonicalMatrix) -> int:
    """Warps a launch of ``m``'s rows of ``w`` entries through shape ``v`` has, as the model counts them
    (:func:`~tuner.model.warps.warp_segments`; a TILE-Composite tile: one warp per workload of h rows)."""
    if v.family == "tile_composite":
        return -(-m.n_rows // (int(col_shape_height(w)) if v.group == "col" else int(v.group[3:] or 1)))
    return sum(s.warps.warps for s in warp_segments(m, v.family, params) if s.warps.w.size)


def occupancy_width(v: Variant) -> int | None:
    """The rows a shape's floor is measured with: ``OCCUPANCY_WIDTH`` entries, or the fewest above it that
    the shape runs (the hybrid's flat warps need whole warps of a row: 32); None for none up to 64.

    Example:
        >>> occupancy_width(Variant("csr_vector", 4, 128, True)), occupancy_width(Variant("aligned_coo", "hflat", 256, True))
        (4, 32)
    """
    return next((w for w in (OCCUPANCY_WIDTH, 8, 16, 32, 64) if v.params(w) is not None), None)


def measure_occupancy(info: gpu.DeviceInfo, grid: Grid, arch: str, cache: Cache, tables: dict,
                      have: dict | None = None) -> dict:
    """Beyond the launch, how long each kernel shape's launches of its narrowest rows (:func:`occupancy_width`)
    take with a few warps per SM (``OCCUPANCY_WARPS``, then two full waves of the shape, from ``tables``), x in
    L1: the floor under a small launch (:func:`tuner.model.lookup.occupancy_floor`); for a chained shape
    (:attr:`Variant.chained`) also with lanes of each of ``CHAIN_WIDTHS`` slots (``by_width``). Each point
    records the warps on the busiest SM (whole blocks: a launch of fewer blocks than SMs still has a block's
    warps on some), the larger launch of two with the same count kept. The launch time is measured again
    here, so that the busy times are this run's. ``have``: a profile's ``occupancy`` whose curves are kept
    (what :func:`occupancy_missing` does not list).

    The tables' full GPU hides each warp's latency; a few warps per SM do not (with 8 warps per SM the
    H100 runs 2 lanes per row over rows of 8 entries 3 times slower than their table rate).
    """
    launch = measure_launch_overhead(arch, cache)
    shapes = {k: dict(v) for k, v in (have or {}).get("shapes", {}).items()}
    narrow, chains = occupancy_missing(have, variants(grid.value_free), tables)
    for v in variants(grid.value_free):
        if v.key in narrow:
            shapes[v.key] = _busy_curve(info, v, occupancy_width(v), tables, arch, cache, launch)
        if v.key in chains:
            shapes[v.key]["by_width"] = [_busy_curve(info, v, w, tables, arch, cache, launch) for w in CHAIN_WIDTHS]
    return {"width": OCCUPANCY_WIDTH, "columns": OCCUPANCY_COLUMNS, "chain_widths": list(CHAIN_WIDTHS),
            "launch_ms": launch, "shapes": shapes}


def occupancy_missing(have: dict | None, shapes: list[Variant], tables: dict) -> tuple[set, set]:
    """The floors a profile's ``occupancy`` (``have``; None: none) lacks among ``shapes`` measured in
    ``tables``: the keys whose narrowest curve is missing, and the chained keys without their ``by_width``
    curves at ``CHAIN_WIDTHS``.

    Example:
        >>> v, s = Variant("csr_vector", 4, 128, True), Variant("aligned_coo", "seg", 256, True)
        >>> tables = {v.key: {"max_active_warps": 8448}, s.key: {"max_active_warps": 8448}}
        >>> have = {"shapes": {v.key: {"width": 4}, s.key: {"width": 4}}}
        >>> occupancy_missing(have, [v, s], tables), occupancy_missing(None, [v], tables)
        ((set(), {'aligned_coo:seg:256:vf'}), ({'csr_vector:4:128:vf'}, set()))
    """
    got = (have or {}).get("shapes", {})
    measured = [v for v in shapes if occupancy_width(v) is not None and tables.get(v.key, {}).get("max_active_warps")]
    narrow = {v.key for v in measured if v.key not in got}
    chains = {v.key for v in measured if v.chained
              and [c["width"] for c in got.get(v.key, {}).get("by_width", [])] != list(CHAIN_WIDTHS)}
    return narrow, chains


def _busy_curve(info: gpu.DeviceInfo, v: Variant, w: int, tables: dict, arch: str, cache: Cache,
                launch: float) -> dict:
    """One shape's floor curve on rows of ``w`` entries (:func:`measure_occupancy`)."""
    params = v.params(w)
    per_row = launch_warps(v, params, w, synthetic(w, 4096, OCCUPANCY_COLUMNS, v.value_free, seed=0)) / 4096
    waves = 2 * max(tables[v.key]["max_active_warps"] // info.sm_count, 1)
    busy = {}
    for o in OCCUPANCY_WARPS + (waves,):
        m = synthetic(w, max(1, round(o * info.sm_count / per_row)), OCCUPANCY_COLUMNS, v.value_free, seed=o)
        blocks = -(-launch_warps(v, params, w, m) * 32 // v.block)
        ms = median_ms(m, v.family, params, arch, cache, 30, 5)
        busy[-(-blocks // info.sm_count) * v.block // 32] = max(ms - launch, 0.0)
    per_sm = sorted(busy)
    return {"width": w, "warps_per_sm": per_sm, "busy_ms": [busy[o] for o in per_sm]}


def chain_launch(kind: str, a: int, b: int) -> CanonicalMatrix:
    """One of the chain floor's synthetic launches (``CHAIN_LAUNCHES``): ``("rmat", scale, edge factor)``, a
    pattern R-MAT graph; ``("band", rows, mean length)``, a square matrix whose rows have lengths uniform in
    mean +- mean / 3 and columns around the diagonal, with values spread in [0.5, 1.5) (never all equal).

    Example:
        >>> m = chain_launch("band", 100, 12)
        >>> m.n_rows, m.value_free, int(m.row_lengths.min()) >= 8, int(m.row_lengths.max()) <= 16
        (100, False, True, True)
        >>> chain_launch("rmat", 8, 4).value_free
        True
    """
    if kind == "rmat":
        return canonicalize(rmat(a, edge_factor=b, seed=27 + a))
    if kind != "band":
        raise ValueError(f"chain launches are 'rmat' or 'band', got {kind!r}")
    rng = np.random.default_rng(a + b)
    lengths = np.minimum(rng.integers(b - b // 3, b + b // 3 + 1, a), a)
    rows = np.repeat(np.arange(a), lengths)
    first = np.clip(np.arange(a) - lengths // 2, 0, a - lengths)  # a run of columns around the diagonal
    cols = np.repeat(first, lengths) + np.arange(rows.size) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    values = rng.uniform(0.5, 1.5, rows.size).astype(np.float32)
    return canonicalize(sp.csr_matrix((values, (rows, cols)), shape=(a, a)))


def launch_name(kind: str, a: int, b: int) -> str:
    """How a chain launch is named in the profile (what a resumed run matches its timings by).

    Example:
        >>> launch_name("rmat", 11, 16)
        'rmat:11:16'
    """
    return f"{kind}:{a}:{b}"


def measure_chains(info: gpu.DeviceInfo, grid: Grid, arch: str, cache: Cache, prof: dict,
                   have: dict | None = None, save=None) -> dict:
    """The chain floor (:mod:`tuner.model.chains`): every candidate of the families whose lanes walk whole
    rows, in the caller's order, timed on each of ``grid.chain_launches`` in ``grid.chain_rounds`` rounds
    on buffers placed afresh (:func:`tuner.compiler.measure_each`, as the reports time), beside the model's
    prediction from ``prof`` without a chain floor and its longest lane; then the base and time per round
    that fit them best (:func:`~tuner.model.chains.fit_chain_floor`). ``have``: a profile's ``chains``
    whose launches' timings are kept (their predictions are made again from ``prof``, so a fit after new
    tables or constants follows them); ``save(chains)`` is called after each launch timed (resumable).

    The tables' launches have rows of one length; these have thousands of rows of mixed lengths, whose
    longest lanes' chains, not their work, set the time of a small launch.
    """
    done = {c["launch"]: c for c in (have or {}).get("launches", [])}
    for kind, a, b in grid.chain_launches:
        name = launch_name(kind, a, b)
        if name in done:
            continue
        m = chain_launch(kind, a, b)
        specs = chain_candidates(m)
        binaries = codegen.compile_many([families.render(s, m) for s in specs], arch, cache=cache)
        timed = compiler.measure_each(m, specs, binaries, seed=a + b, rounds=grid.chain_rounds)
        done[name] = {"launch": name, "rows": m.n_rows, "nnz": m.nnz, "candidates": [
            {"label": s.label(), "longest_lane": longest_lane(m, s.family, s.params),
             "measured_ms": float(np.median(t)), "rounds_ms": list(t)}
            for s, t in zip(specs, timed) if np.isfinite(t).all()]}
        if save:
            save({"launches": list(done.values())})
    return fit_chains(prof, [done[launch_name(*c)] for c in grid.chain_launches])


def chain_candidates(m: CanonicalMatrix) -> list[Specialization]:
    """The candidates a chain launch times: every one of the row-walking families in the caller's order."""
    return [s for s in families.specializations(m, list(ROW_WALKERS)) if getattr(s.params, "order", NONE) == NONE]


def fit_chains(prof: dict, launches: list[dict]) -> dict:
    """The chain floor's ``chains`` section fitted to the timings of ``launches`` (as
    :func:`measure_chains` records them), each candidate predicted afresh from ``prof`` without a chain
    floor: so that the fit follows the tables, constants and model it sits beside. Needs no GPU.

    Example: see tests/test_chains.py.
    """
    model = Profile.from_json(json.dumps({k: v for k, v in prof.items() if k != "chains"}))
    fitted = []
    for launch in launches:
        kind, a, b = launch["launch"].split(":")
        m = chain_launch(kind, int(a), int(b))
        specs = chain_candidates(m)
        predicted = dict(zip((s.label() for s in specs), predict_many(m, specs, model)))
        kept = [dict(c, predicted_ms=predicted[c["label"]]) for c in launch["candidates"]
                if predicted.get(c["label"]) is not None]
        fitted.append({**launch, "candidates": kept})
    rows = [c for launch in fitted for c in launch["candidates"]]
    fit = fit_chain_floor([c["predicted_ms"] for c in rows], [c["longest_lane"] for c in rows],
                          [c["measured_ms"] for c in rows], model.constants["launch_overhead_ms"])
    return {"base_ms": fit.base_ms, "round_ms": fit.round_ms, "unroll": fit.unroll, "error": fit.error,
            "error_without": fit.error_without, "launches": fitted}


def refit_chains(path: Path, command: str | None = None) -> dict:
    """Fit the chain floor of the profile at ``path`` again to the timings it holds (:func:`fit_chains`),
    after a change to the model they are judged against, and write it back; ``command`` is recorded after
    those that made the file. Needs no GPU.

    Example: see tests/test_chains.py.
    """
    prof = json.loads(Path(path).read_text())
    launches = (prof.get("chains") or {}).get("launches")
    if not launches:
        raise ValueError(f"{path} holds no chain launches to fit again: run `python -m tuner profile` on its GPU")
    prof["chains"] = fit_chains(prof, launches)
    if command:
        prof["command"] = f"{prof['command']} ; then {command}"
    atomic_write(Path(path), json.dumps(prof, indent=1, sort_keys=True).encode())
    return prof


def chains_missing(have: dict | None, grid: Grid) -> bool:
    """Whether a profile's ``chains`` (``have``) lacks the fit or one of ``grid``'s launches.

    Example:
        >>> chains_missing(None, REDUCED), chains_missing({"base_ms": 0.001, "launches": [
        ...     {"launch": "rmat:11:16"}, {"launch": "band:5000:60"}]}, REDUCED)
        (True, False)
    """
    got = {c["launch"] for c in (have or {}).get("launches", [])}
    return "base_ms" not in (have or {}) or any(launch_name(*c) not in got for c in grid.chain_launches)


def _versions() -> dict:
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        smi = ""
    return {"nvcc": codegen.nvcc_version(), "driver": smi or None}


def run(out: Path | None = None, grid: Grid = Grid(), cache_dir=None, progress=None,
        remeasure_constants: bool = False, remeasure_caches: bool = False, remeasure_tail: bool = False,
        remeasure_occupancy: bool = False, remeasure_chains: bool = False, remeasure_spgemm: bool = False,
        command: str | None = None) -> dict:
    """Measure this GPU and write the profile to ``out`` (default ``models/<gpu-slug>/profile.json``).

    Resumable: points already in ``out`` (same GPU, same format) are kept and not measured again;
    ``remeasure_constants`` measures the constants and the lone-row times again and keeps the tables;
    ``remeasure_caches``, ``remeasure_tail`` and ``remeasure_occupancy`` measure only the cache sweeps (and
    their capacities), the tail factor or the small launches' floors (:func:`measure_occupancy`, measured
    after the tables, which it reads) again; ``remeasure_chains`` the chain floor (:func:`measure_chains`,
    measured last: it reads the rest); ``remeasure_spgemm`` the SpGEMM families' phase rates
    (:func:`tuner.spgemm.measure.measure`, measured when absent). ``command`` (default: this process's) is recorded in the file,
    after those of the runs that made it.
    """
    info = gpu.device_info()
    out = Path(out) if out is not None else profile_path(info.name)
    cache = Cache(cache_dir)
    resumed = out.is_file()
    this = command or " ".join(["python -m tuner"] + sys.argv[1:])
    prof = _start(out, info, grid, cache, remeasure_constants, this)
    if resumed and prof["command"].split(" ; then ")[-1] != this:  # the file says how it came to be
        prof["command"] = f"{prof['command']} ; then {this}"
    if (remeasure_caches or remeasure_tail) and resumed and not remeasure_constants:  # else just measured
        warm_up()
        if remeasure_caches:
            _record_caches(prof, measure_caches(info, grid, info.arch, cache))
        if remeasure_tail:
            _record_tail(prof, measure_tail(info, grid, info.arch, cache, prof["constants"]["launch_overhead_ms"]))
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out, json.dumps(prof, indent=1, sort_keys=True).encode())  # constants first: resumable from here
    todo_variants = variants(grid.value_free)
    sized = set()  # kernels whose occupancy is recorded
    cols = regimes(info)
    pending = [(w, r) for w in grid.widths for r in REGIMES
               if any(str(w) not in prof["tables"][v.key]["points"][r] and v.params(w) is not None
                      for v in todo_variants)]
    started = time.perf_counter()
    bar = progress(total=len(pending)) if progress else None
    for w, regime in pending:
        n_rows = rows_for(w, grid, info)
        for vf in grid.value_free:
            m = synthetic(w, n_rows, cols[regime], vf, seed=w)
            arrays = DeviceArrays()
            for v in (v for v in todo_variants if v.value_free == vf):
                params = v.params(w)
                points = prof["tables"][v.key]["points"][regime]
                if params is None or str(w) in points:
                    continue
                spec = Specialization(v.family, params, m.value_dtype, m.index_dtype, vf)
                binary = codegen.compile_source(families.render(spec, m), info.arch, cache=cache)
                k = SpMV(m, spec, binary.cubin, None, arrays)
                if v.key not in sized:
                    sized.add(v.key)
                    prof["tables"][v.key]["max_active_warps"] = info.sm_count * active_warps_per_sm(
                        k.registers, k.shared_bytes, v.block, info.threads_per_sm, info.registers_per_sm,
                        info.shared_bytes_per_sm, info.blocks_per_sm)
                    prof["tables"][v.key]["registers"] = k.registers
                ms = float(np.median(time_spmv(k, grid.repeats, 3)))
                busy = max(ms - prof["constants"]["launch_overhead_ms"], 0.5 * ms)
                points[str(w)] = n_rows * w / busy
            del arrays
        prof["seconds"] = prof.get("seconds", 0.0) + (time.perf_counter() - started)
        started = time.perf_counter()
        atomic_write(out, json.dumps(prof, indent=1, sort_keys=True).encode())
        if bar:
            bar.update(1)
    if bar:
        bar.close()
    have = None if remeasure_occupancy else prof.get("occupancy")
    floors = any(occupancy_missing(have, todo_variants, prof["tables"]))
    if floors:
        prof["occupancy"] = measure_occupancy(info, grid, info.arch, cache, prof["tables"], have)
        atomic_write(out, json.dumps(prof, indent=1, sort_keys=True).encode())
    have = None if remeasure_chains else prof.get("chains")
    # The fit compares the model with the launches' timings: anything measured above moves the model.
    stale = bool(pending) or floors or remeasure_constants or remeasure_caches or remeasure_tail
    if chains_missing(have, grid) or stale:
        def save(partial):  # the launches measured so far, without a fit: a rerun resumes from them
            atomic_write(out, json.dumps({**prof, "chains": partial}, indent=1, sort_keys=True).encode())
        prof["chains"] = measure_chains(info, grid, info.arch, cache, prof, have, save)
        atomic_write(out, json.dumps(prof, indent=1, sort_keys=True).encode())
    if remeasure_spgemm or not prof.get("spgemm"):
        from .spgemm.measure import measure as measure_spgemm
        prof["spgemm"] = measure_spgemm(cache)
        atomic_write(out, json.dumps(prof, indent=1, sort_keys=True).encode())
    return prof


def remeasure_spgemm(path: Path, cache_dir=None, command: str | None = None) -> dict:
    """Measure only the SpGEMM families' rates again into the profile at ``path`` (this GPU's), keeping
    everything else; returns the profile."""
    from .spgemm.measure import measure as measure_spgemm
    info = gpu.device_info()
    prof = json.loads(Path(path).read_text())
    if prof.get("gpu", {}).get("name") != info.name:
        raise ValueError(f"{path} is the profile of {prof.get('gpu', {}).get('name')}, not of this {info.name}")
    prof["spgemm"] = measure_spgemm(Cache(cache_dir))
    this = command or " ".join(["python -m tuner"] + sys.argv[1:])
    prof["command"] = f"{prof.get('command', '')} ; then {this}".lstrip(" ;")
    atomic_write(Path(path), json.dumps(prof, indent=1, sort_keys=True).encode())
    return prof


def _start(out: Path, info: gpu.DeviceInfo, grid: Grid, cache: Cache, remeasure: bool, command: str) -> dict:
    if out.is_file():
        prof = json.loads(out.read_text())
        if prof.get("format") == FORMAT and prof.get("gpu", {}).get("name") == info.name:
            for v in variants(grid.value_free):
                prof["tables"].setdefault(v.key, {"max_active_warps": 0, "points": {r: {} for r in REGIMES}})
            if remeasure or "alone" not in prof:  # constants only: the tables are kept
                warm_up()
                c = prof["constants"]
                c["copy_bandwidth_gbs"] = copy_bandwidth_gbs()
                c["launch_overhead_ms"] = measure_launch_overhead(info.arch, cache)
                c["gather_launch_ms"] = measure_gather_launch(info.arch, cache)
                c.pop("batch_latency_ms", None)
                _record_caches(prof, measure_caches(info, grid, info.arch, cache))
                _record_tail(prof, measure_tail(info, grid, info.arch, cache, c["launch_overhead_ms"]))
                prof["alone"] = measure_alone(info, grid, info.arch, cache, c["launch_overhead_ms"])
                prof["alone_warp"] = measure_alone(info, grid, info.arch, cache, c["launch_overhead_ms"],
                                                   full_warp=True)
            else:  # kernel shapes (and the full-warp lone times, the gathers' launch) the file lacks
                launch_ms = prof["constants"]["launch_overhead_ms"]
                if "gather_launch_ms" not in prof["constants"]:
                    warm_up()
                    prof["constants"]["gather_launch_ms"] = measure_gather_launch(info.arch, cache)
                prof["alone"].update(measure_alone(info, grid, info.arch, cache, launch_ms, frozenset(prof["alone"])))
                have = prof.setdefault("alone_warp", {})
                have.update(measure_alone(info, grid, info.arch, cache, launch_ms, frozenset(have), full_warp=True))
            return prof
    warm_up()
    launch_ms = measure_launch_overhead(info.arch, cache)
    prof = {
        "format": FORMAT, "tool": f"sparse-tuner {__version__}",
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": command,
        "gpu": {"name": info.name, "capability": list(info.capability), "driver_api": info.driver_version,
                **_versions()},
        "constants": {
            "sm_count": info.sm_count, "max_warps_per_sm": info.threads_per_sm // 32,
            "l1_bytes": HOPPER_L1_BYTES, "l1_source": "sm_90 architecture constant (256 KB L1/tex/shared per SM)",
            "l2_bytes": info.l2_bytes, "shared_bytes_per_sm": info.shared_bytes_per_sm,
            "registers_per_sm": info.registers_per_sm, "blocks_per_sm": info.blocks_per_sm,
            "copy_bandwidth_gbs": copy_bandwidth_gbs(),
            "launch_overhead_ms": launch_ms, "gather_launch_ms": measure_gather_launch(info.arch, cache),
        },
        "alone": measure_alone(info, grid, info.arch, cache, launch_ms),
        "alone_warp": measure_alone(info, grid, info.arch, cache, launch_ms, full_warp=True),
        "caches": {},
        "grid": {"widths": list(grid.widths), "regime_columns": regimes(info), "target_nnz": grid.target_nnz,
                 "max_nnz": grid.max_nnz},
        "tables": {v.key: {"max_active_warps": 0, "points": {r: {} for r in REGIMES}}
                   for v in variants(grid.value_free)},
    }
    _record_caches(prof, measure_caches(info, grid, info.arch, cache))
    _record_tail(prof, measure_tail(info, grid, info.arch, cache, launch_ms))
    return prof


def _record_tail(prof: dict, tail: dict) -> None:
    prof["tail"] = tail
    prof["constants"]["tail_factor"] = tail["factor"]


def _record_caches(prof: dict, caches: dict) -> None:
    prof["caches"] = caches
    for level, sweep in caches.items():
        prof["constants"][f"{level}_sectors"] = sweep["sectors"]
