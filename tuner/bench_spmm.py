"""``python -m tuner bench``'s SpMM suite: Y = A X for blocks of a few dense columns, ours (row-major blocks)
against cuSPARSE's SpMM in the faster of its two layouts (row-major or column-major blocks; its descriptors
and work space made once, :class:`~tuner.graph.cusparse_products.CachedSpmm`, where ``cupyx.cusparse.spmm`` makes
them at every call and takes column-major blocks only), on the data folder's graphs and rmat:20.

Per graph and block width it records our tuned kernel's time and parameters (each candidate timed once per
structure), cuSPARSE's time on the same device operands, and our result's largest error against SciPy's
float64 product relative to its largest entry.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from . import __version__, gpu, loaders

WIDTHS = (4, 16)  # seed sets of a batched random walk: a few, and half a warp of them
GENERATED = ("rmat:20",)
REPEATS = 20


@dataclass(frozen=True)
class SpmmRow:
    """One (graph, block width); times in milliseconds, medians of CUDA-event timings after a warm-up.

    Attributes:
        name, nnz, k: the graph, its entries, the block's columns.
        ours_ms, cusparse_ms, speedup: the products and cusparse_ms / ours_ms.
        params: our kernel's family and parameters; rel_error: max |ours - SciPy float64| / max |SciPy|.
        candidate_ms: every candidate's ms as the tuning timed it (the plan's record), by label.
        cusparse_layout_ms: cuSPARSE's ms in each layout ('row-major', 'column-major'); cusparse_ms is the
            faster.
    """

    name: str
    nnz: int
    k: int
    ours_ms: float
    cusparse_ms: float
    speedup: float
    params: str
    rel_error: float
    candidate_ms: dict = field(default_factory=dict)
    cusparse_layout_ms: dict = field(default_factory=dict)


def default_suite(data_dir=None) -> list[str]:
    """The data folder's graphs and rmat:20.

    Example:
        >>> default_suite("/nonexistent")
        ['rmat:20']
    """
    return [str(p) for p in loaders.real_matrices(data_dir)] + list(GENERATED)


def bench_one(source: str, k: int, cache_dir=None) -> SpmmRow:
    """Ours and cuSPARSE for one graph and block width, float32 values."""
    import cupy
    import cupyx.scipy.sparse as cpsp

    from .graph.cusparse_products import CachedSpmm
    from .spmm import SpmmParams, compile_spmm, label
    A = loaders.load(source).astype(np.float32)
    X = np.random.default_rng(k).uniform(-1, 1, (A.shape[1], k)).astype(np.float32)
    spmm = compile_spmm(A, X, cache_dir=cache_dir)
    ours = spmm()
    expected = A.astype(np.float64) @ X.astype(np.float64)
    err = float(np.abs(ours - expected).max() / max(np.abs(expected).max(), 1e-300))
    ours_ms = spmm.time(REPEATS)
    # cuSPARSE's SpMM on the same device operands in each layout, its descriptors and work space made once
    A.sum_duplicates()  # canonical on the host (a no-op for the loaders' matrices): CuPy's check builds kernels
    a = cpsp.csr_matrix(A)
    a.has_canonical_format = True
    library = CachedSpmm(a)
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    layouts = {}
    for layout, order in (("row-major", "C"), ("column-major", "F")):
        x = cupy.asarray(X, order=order)
        y = cupy.full((A.shape[0], k), np.nan, np.float32, order=order)
        times = []
        for i in range(REPEATS + 3):
            start.record()
            library(x, y)
            end.record()
            end.synchronize()
            if i >= 3:
                times.append(cupy.cuda.get_elapsed_time(start, end))
        cu_err = float(np.abs(y.get() - expected).max() / max(np.abs(expected).max(), 1e-300))
        if not cu_err < 1e-3:  # the two products must agree before their times compare
            raise RuntimeError(f"cuSPARSE's {layout} SpMM of {source} differs from SciPy's by {cu_err:.2e} "
                               "(relative)")
        layouts[layout] = float(np.median(times))
    cu_ms = min(layouts.values())
    timed = {label(SpmmParams(**p)): round(ms, 5) for p, ms in spmm.plan.get("measured_ms", [])}
    return SpmmRow(loaders.display_name(source), int(A.nnz), k, ours_ms, cu_ms, cu_ms / ours_ms,
                   label(spmm.params), err, timed, layouts)


def format_table(rows: list[SpmmRow]) -> str:
    """The rows as a fixed-width table.

    Example:
        >>> row = SpmmRow("g", 10, 4, 0.5, 1.0, 2.0, "row_groups(lanes=4,block_size=128)", 1e-7)
        >>> format_table([row]).splitlines()[1].split()
        ['g', '10', '4', '0.5000', '1.0000', '2.00x', '1.0e-07', 'row_groups(lanes=4,block_size=128)']
    """
    lines = [f"{'graph':<26}{'nnz':>12}{'k':>4}{'ours ms':>10}{'cuSPARSE':>10}{'x':>8}{'error':>9}  params"]
    for r in rows:
        lines.append(f"{r.name[:25]:<26}{r.nnz:>12}{r.k:>4}{r.ours_ms:>10.4f}{r.cusparse_ms:>10.4f}"
                     f"{r.speedup:>7.2f}x{r.rel_error:>9.1e}  {r.params}")
    return "\n".join(lines)


def cli_run(args, suite: list[str], progress) -> None:
    """``python -m tuner bench``'s SpMM suite on this GPU (the graphs named, else :func:`default_suite`):
    run, print the table, write bench-spmm.json after each row."""
    from .bench import default_out
    sources = list(args.suite) if args.suite else default_suite(loaders.data_dir_or_error(args.data_dir))
    out = Path(args.spmm_out) if args.spmm_out else default_out().with_name("bench-spmm.json")
    info = gpu.device_info()
    report = {"tool": f"sparse-tuner {__version__}", "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "command": " ".join(["python -m tuner"] + sys.argv[1:]) if sys.argv else "",
              "gpu": {"name": info.name, "memory_bytes": info.memory_bytes},
              "timing": f"CUDA events around one product, median of {REPEATS} after a warm-up; X and Y on the "
                        "device for both, ours row-major, cuSPARSE the faster of row-major and column-major "
                        "(descriptors and work space made once)",
              "rows": []}
    rows = []
    for source, k in progress([(s, k) for s in sources for k in WIDTHS], "bench spmm", "product"):
        rows.append(bench_one(source, k, args.cache_dir))
        report["rows"] = [asdict(r) for r in rows]
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1))
    print("\nSpMM, Y = A X for a block of k columns (ours tuned per graph; cuSPARSE's faster layout)")
    print(format_table(rows))
    print(f"\nwrote {out}")
