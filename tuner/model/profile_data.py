"""The offline lookup table and hardware constants of one GPU (``models/<gpu-slug>/profile.json``)."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import paths
from .locality import cache_sectors

FORMAT = 2  # 2: GPU-side (queued) timings, measured cache capacities
REGIMES = ("l1", "l2", "dram")  # where the gathered x mostly hits: L1/tex, L2, or device memory


def warp_rows(key: str) -> int:
    """Rows one warp of kernel ``key`` holds: 32 over its lanes per row where the key names them
    (csr_vector, binned's lane groups), else 1 (a warp or a block per row, and ALIGNED_COO's and
    TILE-Composite's shapes, whose lone-row times are their own).

    Example:
        >>> warp_rows("csr_vector:4:256:v"), warp_rows("binned:block:256:v"), warp_rows("tile_composite:col:256:v")
        (8, 1, 1)
    """
    family, group = key.split(":")[:2]
    if family in ("csr_vector", "binned") and group.isdigit():
        return max(32 // int(group), 1)
    return 1


# Rows per row-major TILE-Composite workload the profile times beside one (paper 003's table is indexed by
# the workload's w and h): a warp that walks several rows in turn spreads its start-up over all of them.
ROW_HEIGHTS = (1, 2, 4, 8, 16, 32)


def row_group(h: int) -> str:
    """Table group of row-major TILE-Composite workloads of ``h`` rows ('row' for one row, the base table).

    Example:
        >>> row_group(1), row_group(8)
        ('row', 'row8')
    """
    return "row" if h == 1 else f"row{h}"


def kernel_key(family: str, group, block: int, value_free: bool) -> str:
    """Table key of one kernel shape: family, lanes per row (or 'block'), block size, value-free or not.

    Example:
        >>> kernel_key("csr_vector", 8, 128, True)
        'csr_vector:8:128:vf'
    """
    return f"{family}:{group}:{block}:{'vf' if value_free else 'v'}"


@dataclass(frozen=True)
class Profile:
    """A GPU's measured constants and per-warp performance tables.

    Attributes:
        gpu: name, capability, driver and CUDA versions of the GPU it was measured on.
        constants: sm_count, max_warps_per_sm, l1_bytes, l2_bytes, copy_bandwidth_gbs, launch_overhead_ms, and
            the measured l1_sectors and l2_sectors (effective cache capacities for gathers), tail_factor
            (how much slower a long row runs among other warps than alone) and gather_launch_ms (what a
            relabelled plan's gather adds to a launch, where measured).
        tables: kernel key -> {"max_active_warps": int, "points": {regime: {w: entries per ms}}}: the
            throughput of a full GPU of warps whose rows all have w entries (paper 003's
            Performance(w, h), h fixed by the kernel's lanes per row).
        alone: kernel key -> {regime: {w: ms}}: the time one row of w entries takes on its own (one warp,
            or one block): the latency a full GPU hides and a lone long row does not.
        digest: sha256 of the file, part of plan cache keys.
        caches: {"l1"|"l2": {"columns": [...], "ms": [...], "sectors": K}}: the sweeps of uniform gathers
            over a growing x that measured the effective capacities (absent in hand-made profiles).
        regime_columns: {regime: columns of x} the tables were measured with.
        tail: the tail-factor measurement (``curve``: the factor against the bulk's work, where measured).
        alone_warp: kernel key -> {regime: {w: ms}}: the time a warp's worth of such rows takes on its own,
            for the kernels whose warps hold several rows (csr_vector and binned with fewer than 32 lanes
            per row), where measured.
        occupancy: {"launch_ms": ..., "shapes": {kernel key: {"width": w, "warps_per_sm": [...],
            "busy_ms": [...]}}}: beyond the launch, how long launches of the shape's narrowest rows (w
            entries) take with that many warps on their busiest SM (:func:`tuner.profile.measure_occupancy`),
            where measured; a shape whose lanes walk their slots one after another also has ``by_width``, a
            list of such curves ({"width", "warps_per_sm", "busy_ms"}) at longer lanes.
        chains: the chain floor's fit ({"base_ms", "round_ms", "unroll", ...}, read by
            :class:`~tuner.model.chains.ChainFit`) and the synthetic launches of mixed rows it was fitted to
            (:func:`tuner.profile.measure_chains`), where measured.
        spgemm: the SpGEMM families' phase rates ({"rates": {phase: ms per unit}, "runs": [...]}, read by
            :func:`tuner.model.spgemm.rates_from`), where measured.
    """

    gpu: dict
    constants: dict
    tables: dict
    digest: str
    alone: dict = None
    caches: dict = None
    regime_columns: dict = None
    tail: dict = None
    alone_warp: dict = None
    occupancy: dict = None
    chains: dict = None
    spgemm: dict = None

    @classmethod
    def from_json(cls, text: str) -> "Profile":
        raw = json.loads(text)
        if raw.get("format") != FORMAT:
            raise ValueError(f"profile format {raw.get('format')!r} is not this tool's {FORMAT} (timings and "
                             f"constants changed): measure again with `python -m tuner profile`")
        return cls(gpu=raw["gpu"], constants=raw["constants"], tables=raw["tables"],
                   digest=hashlib.sha256(text.encode()).hexdigest(), alone=raw.get("alone", {}),
                   caches=raw.get("caches", {}), regime_columns=raw.get("grid", {}).get("regime_columns", {}),
                   tail=raw.get("tail", {}), alone_warp=raw.get("alone_warp", {}),
                   occupancy=raw.get("occupancy", {}), chains=raw.get("chains", {}),
                   spgemm=raw.get("spgemm", {}))

    def cache_sectors(self, level: str) -> float:
        """Effective capacity of cache ``level`` ('l1' or 'l2') for gathers, in sectors: the measured one,
        else half the nominal size (:func:`~tuner.model.locality.cache_sectors`). The tiled families size
        their tiles by the L1's: they read it here, from the profile they are given, as they do not import
        the model.

        Example:
            >>> Profile({}, {"l1_bytes": 262144, "l1_sectors": 1000.0}, {}, "").cache_sectors("l1")
            1000.0
        """
        return cache_sectors(self.constants, level)

    def max_active_warps(self, key: str) -> int:
        """Warps resident on the whole GPU at once for that kernel (eq. 1's MAX_ACT_WARP/SM x NUM_SM)."""
        return int(self.tables[key]["max_active_warps"])

    def has(self, key: str) -> bool:
        """True when the kernel shape ``key`` was measured: its table in every regime and its lone-row times."""
        return self.has_table(key) and key in (self.alone or {})

    def has_table(self, key: str) -> bool:
        """True when the table of ``key`` was measured in every regime (its lone-row times aside: the
        tables of several rows per workload have none of their own)."""
        return key in self.tables and all(self.tables[key]["points"].get(r) for r in REGIMES)

    def performance(self, key: str, regime: str, w: np.ndarray) -> np.ndarray:
        """Table performance at row lengths ``w``: log-log interpolation, clamped to the measured range."""
        xs, ys = _curve(key, regime, self.tables[key]["points"][regime])
        lw = np.log2(np.maximum(np.asarray(w, dtype=np.float64), 1.0))
        return np.exp2(np.interp(lw, xs, ys))

    def alone_time(self, key: str, regime: str, w: np.ndarray, fill: np.ndarray | None = None) -> np.ndarray:
        """Milliseconds one row of w entries takes by itself: log-log interpolation; beyond the longest
        measured row it grows in proportion to w (its rounds of loads).

        ``fill``: for a warp of several rows whose longest has w entries, its entries over those of a warp
        full of such rows. Where the full warp was measured (``alone_warp``), the time blends linearly
        from one row's (a long row among short ones) to the full warp's (rows of one length).
        """
        one = self._lone(self.alone[key][regime], "alone:" + key, regime, w)
        if fill is None or key not in (self.alone_warp or {}):
            return one
        full = self._lone(self.alone_warp[key][regime], "alone_warp:" + key, regime, w)
        return one + np.maximum(full - one, 0.0) * np.clip(np.asarray(fill, dtype=np.float64), 0.0, 1.0)

    def occupancy_floor(self, key: str, warps_per_sm: float, width: float | None = None) -> float:
        """Milliseconds beyond the launch that a launch of ``key``'s shape lasts at least with this many
        warps on its busiest SM: the measured launches of the narrowest rows (``occupancy``), linear in
        log2 warps per SM, held beyond the measured range; 0 where the profile did not measure it. With
        ``width`` (entries per lane), a shape measured at several lane lengths (:meth:`has_chain`) is read
        between them, linear in log2 width and held beyond.

        The tables measure a full GPU; a launch of a few warps per SM runs far below their rate (its
        warps' latency is not hidden), however little work it has.

        Example:
            >>> p = Profile({}, {}, {}, "", occupancy={"shapes": {"k": {"width": 4, "warps_per_sm": [8, 32],
            ...     "busy_ms": [0.001, 0.003], "by_width": [{"width": 16, "warps_per_sm": [8, 32],
            ...                                              "busy_ms": [0.005, 0.007]}]}}})
            >>> p.occupancy_floor("k", 4), p.occupancy_floor("k", 16), p.occupancy_floor("k", 64), p.occupancy_floor("x", 8)
            (0.001, 0.002, 0.003, 0.0)
            >>> p.occupancy_floor("k", 16, width=8), p.occupancy_floor("k", 16, width=64), p.has_chain("k")
            (0.004, 0.006, True)
        """
        shape = (self.occupancy or {}).get("shapes", {}).get(key)
        if not shape:
            return 0.0
        curves = [shape] + (shape.get("by_width", []) if width is not None else [])
        o = np.log2(max(warps_per_sm, 1.0))
        at = [float(np.interp(o, np.log2(c["warps_per_sm"]), c["busy_ms"])) for c in curves]
        if len(at) == 1:
            return at[0]
        return float(np.interp(np.log2(max(width, 1.0)), np.log2([c["width"] for c in curves]), at))

    def has_chain(self, key: str) -> bool:
        """True when the floor of ``key``'s shape was measured at several lengths of its lanes' chains
        (``by_width``: the shapes whose lanes walk their slots one after another)."""
        return bool((self.occupancy or {}).get("shapes", {}).get(key, {}).get("by_width"))

    def _lone(self, points: dict, name: str, regime: str, w: np.ndarray) -> np.ndarray:
        xs, ys = _curve(name, regime, points)
        w = np.maximum(np.asarray(w, dtype=np.float64), 1.0)
        t = np.exp2(np.interp(np.log2(w), xs, ys))
        top = np.exp2(xs[-1])
        return np.where(w > top, t * w / top, t)


_curves: dict[tuple, tuple] = {}  # (id of a table's points, name, regime) -> (points, log2 w, log2 value)


def _curve(key: str, regime: str, points: dict) -> tuple[np.ndarray, np.ndarray]:
    # Read once per table, not once per tile: the planner looks tables up thousands of times. The points
    # themselves are kept beside their curve, so that their id stays theirs.
    hit = _curves.get((id(points), key, regime))
    if hit is None or hit[0] is not points:
        if len(_curves) > 4096:
            _curves.clear()
        items = sorted((float(k), float(v)) for k, v in points.items())
        w = np.array([k for k, _ in items], dtype=np.float64)
        p = np.array([v for _, v in items], dtype=np.float64)
        hit = _curves[(id(points), key, regime)] = (points, np.log2(w), np.log2(p))
    return hit[1], hit[2]


def profile_path(gpu_name: str) -> Path:
    """Where ``python -m tuner profile`` writes (and resumes) a GPU's profile: ``profile.json`` in
    :func:`~tuner.paths.gpu_results_dir`.

    Example:
        >>> profile_path("NVIDIA H200").parent.name
        'nvidia-h200'
    """
    return paths.gpu_results_dir(gpu_name) / "profile.json"


def find_profile(gpu_name: str) -> Path:
    """The profile the model reads for a GPU: the one measured here (:func:`profile_path`) when present,
    else the one shipped with the package under ``models/<gpu-slug>/``.

    Example:
        >>> find_profile("NVIDIA H100 80GB HBM3").name
        'profile.json'
    """
    measured = profile_path(gpu_name)
    return measured if measured.is_file() else paths.models_dir() / paths.gpu_slug(gpu_name) / "profile.json"


_loaded: dict[str, tuple[tuple, Profile]] = {}  # resolved path -> (its (mtime, size) when read, the profile)


def load_profile(gpu_name: str | None = None, path: str | Path | None = None) -> Profile:
    """The profile of a GPU by name, or from a file: parsed once per version of the file in a process (every
    compile asks for it, and parsing a measured profile of 350 KB takes about 4 ms), again once the file
    changes (``python -m tuner profile`` resuming). The profile is shared: read it, never change it.

    Raises FileNotFoundError naming the expected path and the command that makes it.

    Example:
        >>> load_profile("NVIDIA H200") is load_profile("NVIDIA H200")   # read once
        True
    """
    p = Path(path) if path is not None else find_profile(gpu_name)
    if not p.is_file():
        raise FileNotFoundError(f"no GPU profile at {p}: run `python -m tuner profile` on that GPU")
    where, stat = str(p.resolve()), p.stat()
    version = (stat.st_mtime_ns, stat.st_size)
    hit = _loaded.get(where)
    if hit is not None and hit[0] == version:
        return hit[1]
    try:
        profile = Profile.from_json(p.read_text())
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as exc:
        detail = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
        raise ValueError(f"{p}: not a usable GPU profile ({detail})") from exc
    _loaded[where] = (version, profile)
    return profile
