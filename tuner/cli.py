"""Command line: ``python -m tuner {tune,bench} ...`` (``--help`` on each)."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from . import __version__, codegen, gpu

NO_GPU_EXIT = 3

MATRIX_HELP = ("a matrix file (.npz, .mtx[.gz], SNAP edge list [.gz]) or a generator spec: rmat:SCALE[:EDGE_FACTOR"
               "[:SEED]] (R-MAT, Graph500 parameters) or kron:FILE:K (FILE scaled K times by a Kronecker seed)")


def _no_gpu_banner() -> str:
    return (f"NO CUDA GPU PRESENT ({gpu.unavailable_reason()}).\n"
            "Planning, rendering and compiling the candidate kernels only; nothing is timed or run.")


def _dry_run(sources: list[str], arch: str, cache_dir) -> int:
    from .cache import Cache
    from .compiler import prepare
    from .loaders import load
    print(_no_gpu_banner(), flush=True)
    cache = Cache(cache_dir)
    print(f"{'matrix':<28}{'nnz':>12}{'candidates':>11}{'compiled':>9}{'cached':>7}{'load s':>8}{'compile s':>10}")
    for source in sources:
        t0 = time.perf_counter()
        A = load(source)
        load_s = time.perf_counter() - t0
        p = prepare(A, arch=arch, cache=cache)
        cached = sum(b.cached for b in p.binaries)
        print(f"{Path(source).stem if Path(source).suffix else source:<28}{p.matrix.nnz:>12,}{len(p.specs):>11}"
              f"{len(p.binaries):>9}{cached:>7}{load_s:8.2f}{p.seconds['compile']:10.2f}", flush=True)
    print(f"\nAll candidates compiled for {arch}. No CUDA GPU present: run this on a GPU machine to tune and time.")
    return NO_GPU_EXIT


def cmd_tune(args) -> int:
    from .compiler import compile as compile_spmv
    from .loaders import load
    if not gpu.available():
        return _dry_run([args.matrix], args.arch, args.cache_dir)
    t0 = time.perf_counter()
    spmv = compile_spmv(load(args.matrix), dtype=args.dtype, cache_dir=args.cache_dir)
    print(spmv.explain())
    print(f"\nchosen: {spmv.spec.label()}  measured {spmv.plan.measured_ms} ms  "
          f"(compile took {time.perf_counter() - t0:.2f} s)")
    return 0


def cmd_bench(args) -> int:
    from tqdm import tqdm

    from . import bench
    suite = args.suite or bench.default_suite(args.data_dir)
    if not gpu.available():
        return _dry_run(suite, args.arch, args.cache_dir)
    out = Path(args.out) if args.out else bench.default_out()
    report = bench.run(suite, out, repeats=args.repeats, cache_dir=args.cache_dir,
                       progress=lambda s: tqdm(s, desc="bench", unit="matrix", file=sys.stderr))
    rows = [bench.BenchRow(**r) for r in report["rows"]]
    print(f"\n{report['gpu']['name']}: copy bandwidth {report['copy_bandwidth_gbs']:.0f} GB/s; "
          f"cuSPARSE via {report['cusparse']}")
    print(bench.format_table(rows))
    print(f"\nwrote {out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tuner",
        description="sparse-tuner: autotuned SpMV kernels for power-law sparse matrices on NVIDIA GPUs. "
                    f"Without a GPU, every command plans and compiles for --arch and exits {NO_GPU_EXIT}.")
    parser.add_argument("--version", action="version", version=f"sparse-tuner {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p):
        p.add_argument("--cache-dir", default=None,
                       help="plan and binary cache (default: $TUNER_CACHE_DIR, cache/ of a checkout, "
                            "or ~/.cache/sparse-tuner)")
        p.add_argument("--arch", default=codegen.DEFAULT_ARCH,
                       help="target when no GPU is present (default %(default)s); with a GPU, its own")

    p = sub.add_parser("tune", help="plan and compile one matrix; print the plan and every candidate's time",
                       description="Tune SpMV for one matrix: time every candidate kernel of every family on "
                                   "this GPU, keep the fastest (cached by the matrix fingerprint) and print "
                                   "the ranking.")
    p.add_argument("matrix", help=MATRIX_HELP)
    p.add_argument("--dtype", choices=["float32", "float64"], default=None,
                   help="value type of the kernel (default: the matrix's; integers become float32)")
    common(p)
    p.set_defaults(func=cmd_tune)

    p = sub.add_parser("bench", help="time tuned kernels against cuSPARSE on a suite; print a table, write JSON",
                       description="Benchmark tuned SpMV against cuSPARSE (best of CSR and COO through "
                                   "cupyx.cusparse.spmv) on real and generated matrices. Per matrix: nnz, "
                                   "chosen plan, our median ms, cuSPARSE median ms, speedup, achieved GB/s "
                                   "and the fraction of the copy bandwidth measured in the same run.")
    p.add_argument("suite", nargs="*", help=f"matrices ({MATRIX_HELP}); default: every .npz of the data "
                                            "directory plus rmat:20 and rmat:23")
    p.add_argument("--data-dir", default=None,
                   help="folder of real .npz matrices (default: $TUNER_DATA_DIR or ../shared/data)")
    p.add_argument("--out", default=None, help="JSON report (default: models/<gpu-slug>/bench-spmv.json)")
    p.add_argument("--repeats", type=int, default=100, help="timed runs per measurement (default %(default)s)")
    common(p)
    p.set_defaults(func=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m tuner`` and the ``sparse-tuner`` script."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError, codegen.CompileError, codegen.ToolchainError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
