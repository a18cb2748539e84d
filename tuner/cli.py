"""Command line: ``python -m tuner {tune,bench} ...`` (``--help`` on each)."""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path

from . import __version__, codegen, gpu, loaders
from .bench_multigpu import SUITE as MULTIGPU_SUITE
from .compiler import DEFAULT_ROUNDS, PLAN_REPEATS, ROUNDS_UNDER_MS

NO_GPU_EXIT = 3
OFFLINE_GPU = "NVIDIA H100 80GB HBM3"  # whose shipped profile `tune` ranks for when no GPU is present

MATRIX_HELP = ("a matrix file (.npz, .mtx[.gz], SNAP edge list [.gz]) or a generator spec: rmat:SCALE[:EDGE_FACTOR"
               "[:SEED]] (R-MAT, Graph500 parameters) or kron:FILE:K (FILE scaled K times by a Kronecker seed)")


def _no_gpu_banner() -> str:
    return (f"NO CUDA GPU PRESENT ({gpu.unavailable_reason()}).\n"
            "Planning, rendering and compiling the candidate kernels only; nothing is timed or run.")


def _dry_run(sources: list[str], arch: str, cache_dir, note: str = "") -> int:
    from .cache import Cache
    from .compiler import prepare
    from .loaders import display_name, load
    print(_no_gpu_banner(), flush=True)
    if note:
        print(note, flush=True)
    cache = Cache(cache_dir)
    print(f"{'matrix':<28}{'nnz':>12}{'candidates':>11}{'compiled':>9}{'cached':>7}{'load s':>8}{'compile s':>10}")
    for source in sources:
        t0 = time.perf_counter()
        A = load(source)
        load_s = time.perf_counter() - t0
        p = prepare(A, arch=arch, cache=cache)
        cached = sum(b.cached for b in p.binaries)
        print(f"{display_name(source):<28}{p.matrix.nnz:>12,}{len(p.specs):>11}"
              f"{len(p.binaries):>9}{cached:>7}{load_s:8.2f}{p.seconds['compile']:10.2f}", flush=True)
    print(f"\nAll candidates compiled for {arch}. No CUDA GPU present: run this on a GPU machine to tune and time.")
    return NO_GPU_EXIT


def _offline_tune(args) -> int:
    """``tune`` without a GPU: the model's plan for the profile's GPU, every candidate compiled for --arch."""
    from .cache import Cache
    from .compiler import plan_offline
    from .loaders import load
    from .model import load_profile
    from .planner import explain
    print(_no_gpu_banner(), flush=True)
    prof = load_profile(args.gpu, args.profile)  # --profile, else the GPU's measured or shipped profile
    if args.tune != "model":
        print(f"--tune {args.tune} times candidates on a GPU: without one, this is the model's ranking for "
              f"{prof.gpu.get('name', args.gpu)}; nothing is timed.")
    t0 = time.perf_counter()
    plan, binaries = plan_offline(load(args.matrix), prof, dtype=args.dtype, arch=args.arch,
                                  cache=Cache(args.cache_dir))
    print(explain(plan))
    print(f"\nthe model's choice for {prof.gpu.get('name', args.gpu)}: {plan.ranking[0].label()}, predicted "
          f"{plan.predicted_ms:.4f} ms; {len(binaries)} candidates ({len({b.key for b in binaries})} kernels, "
          f"{len({b.key for b in binaries if b.cached})} from the cache) compiled for {args.arch} in "
          f"{time.perf_counter() - t0:.2f} s")
    print("No CUDA GPU present: run this on a GPU machine to time and use the kernel.")
    return NO_GPU_EXIT


def cmd_tune(args) -> int:
    from .compiler import compile as compile_spmv
    from .loaders import load
    if not gpu.available():
        return _offline_tune(args)
    t0 = time.perf_counter()
    spmv = compile_spmv(load(args.matrix), dtype=args.dtype, tune=args.tune, top_k=args.top_k, trials=args.trials,
                        cache_dir=args.cache_dir, profile=args.profile)
    print(spmv.explain())
    print(f"\nchosen: {spmv.spec.label()}  measured {spmv.plan.measured_ms} ms  "
          f"(compile took {time.perf_counter() - t0:.2f} s)")
    return 0


def cmd_spgemm(args) -> int:
    from scipy import sparse

    from . import spgemm
    from .loaders import load
    from .matrix import canonicalize
    A = load(args.a)
    B = load(args.b) if args.b else A
    B = B.T.tocsr() if args.transpose else B
    if not gpu.available():
        from .model import load_profile
        from .spgemm.row_hash import profile_shared_limit
        print(_no_gpu_banner().splitlines()[0], flush=True)
        prof = load_profile(args.gpu, args.profile)
        a, b = canonicalize(A, args.dtype), canonicalize(B, args.dtype)
        if a.n_cols != b.n_rows:
            raise ValueError(f"A has {a.n_cols} columns but B has {b.n_rows} rows: A B needs them equal")
        plan = spgemm.model_plan(a, b, prof, profile_shared_limit(prof))
        print(f"the model's choice for {prof.gpu.get('name', args.gpu)} (memory not checked):")
        print(spgemm.describe(plan))
        print("No CUDA GPU present: run this on a GPU machine to multiply.")
        return NO_GPU_EXIT
    from .model import load_profile
    prof = load_profile(path=args.profile) if args.profile else None
    t0 = time.perf_counter()
    product = spgemm.compile_spgemm(A, B, dtype=args.dtype, tune=args.tune, profile=prof, cache_dir=args.cache_dir)
    compiled = time.perf_counter() - t0
    product.timed = True
    C = product()
    print(product.explain())
    print(f"\nC: {C.shape[0]:,} x {C.shape[1]:,}, {C.nnz:,} entries; compile {compiled:.2f} s; first call "
          + ", ".join(f"{k} {1e3 * v:.2f} ms" for k, v in product.seconds.items()))
    if args.out:
        sparse.save_npz(args.out, C)
        print(f"wrote {args.out}")
    return 0


def _graph_backend(args, doing: str) -> str | None:
    """The graph command's backend: --backend, else with a GPU the iterations on it ('device', or 'tuned' where
    CuPy is missing) and SciPy without one (said on stderr); None (after saying why) when a GPU backend is
    asked for without a GPU."""
    if getattr(args, "distributed", False):
        return "device"
    from .graph.pagerank import default_backend
    backend = args.backend or (default_backend(None) if gpu.available() else "scipy")
    if backend != "scipy" and not gpu.available():
        print(_no_gpu_banner().splitlines()[0] + f"\n--backend {backend} multiplies on a GPU: use --backend scipy.")
        return None
    if backend == "scipy" and args.backend is None:
        print(f"no CUDA GPU: {doing} on the host with SciPy (--backend scipy)", file=sys.stderr)
    return backend


def _report_scores(args, scores: dict) -> None:
    """Print the --top nodes of each score side by side; write every node's scores to --out (.csv with a node
    column, else .npy: the one score, or a column each)."""
    import numpy as np
    print(f"{'rank':>5}" + "".join(f" {'node':>12} {name:>12}" for name in scores))
    best = [np.argsort(-x, kind="stable")[:args.top] for x in scores.values()]
    for i, nodes in enumerate(zip(*best), 1):
        print(f"{i:>5}" + "".join(f" {node:>12} {x[node]:>12.6g}" for node, x in zip(nodes, scores.values())))
    if args.out:
        columns = list(scores.values())
        if str(args.out).endswith(".csv"):
            np.savetxt(args.out, np.column_stack([np.arange(columns[0].size), *columns]),
                       fmt=["%d"] + ["%.17g"] * len(columns), delimiter=",", header=",".join(["node", *scores]),
                       comments="")
        else:
            np.save(args.out, columns[0] if len(columns) == 1 else np.column_stack(columns))
        print(f"wrote {args.out}")


def _ranks(args):
    """(exit code of the spawned ranks, None) for --gpus N; else (None, this rank's device communicator under
    --distributed, or None)."""
    if args.gpus is not None:
        from .distributed.launch import spawn, without_option
        if not gpu.available():
            print(_no_gpu_banner().splitlines()[0] + "\n--gpus starts one rank per GPU.")
            return NO_GPU_EXIT, None
        return spawn(args.gpus, without_option(args.argv, "--gpus")), None
    if args.distributed:
        from .distributed.launch import rank_comm
        return None, rank_comm()
    return None, None


def _load_graph(source, comm):
    """The graph: loaded here, or with several ranks loaded by rank 0 and handed to the others."""
    if comm is None:
        from .loaders import load
        return load(source)
    from .distributed.share import load_once
    return load_once(source, comm)


def _sharded_walk(args, comm, weighted: bool, **walk):
    """PageRank's iterations (``walk``: :func:`~tuner.distributed.pagerank.pagerank_on_devices`' arguments)
    with each rank holding only its rows (rank 0 loads the graph, or for kron:PATH:K each rank generates its
    own), so a graph larger than one GPU runs across the GPUs: (ranks, info, nodes, edges, setup seconds)."""
    import numpy as np

    from .distributed import generated_product, pagerank_on_devices, sharded_product
    from .distributed.generated import generated
    from .distributed.share import load_on_root
    dtype = np.dtype(args.dtype)
    if generated(args.graph):  # a pattern: every edge weighs 1 either way
        product, weighted = generated_product(args.graph, comm, dtype=dtype), True
    else:
        product = sharded_product(load_on_root(args.graph, comm), comm, dtype=dtype, weighted=weighted)
    nodes = product.partition.owner.size
    edges = sum(int(e[0]) for e in comm.allgather(np.array([product.local_nnz])))
    walk = {k: (v(nodes) if callable(v) else v) for k, v in walk.items()}  # vectors needing the node count
    x, info = pagerank_on_devices(None, comm, weighted=weighted, dtype=dtype, return_info=True, product=product,
                                  **walk)
    return x, info, nodes, edges, sum(product.setup_seconds.values())


def _check_sharded(args) -> None:
    if args.sharded and args.gpus is None and not args.distributed:
        raise ValueError("--sharded splits the graph among several GPUs: give --gpus N (or run under mpirun with "
                         "--distributed)")


def cmd_pagerank(args) -> int:
    from .graph import pagerank
    _check_sharded(args)
    spawned, comm = _ranks(args)
    if spawned is not None:
        return spawned
    if args.sharded:
        x, info, nodes, edges, setup = _sharded_walk(args, comm, not args.unweighted, alpha=args.alpha,
                                                     max_iter=args.max_iter, tol=args.tol, tol_rule=args.tol_rule)
        if comm.rank == 0:
            print(f"PageRank of {loaders.display_name(args.graph)} ({nodes:,} nodes, {edges:,} edges, each of "
                  f"{comm.size} GPUs holding its rows): {info.iterations} iterations, last change {info.error:.3g} "
                  f"({args.tol_rule} rule), setup {setup:.2f} s, iterations {info.seconds['iterations']:.2f} s")
            _report_scores(args, {"pagerank": x})
        return 0
    backend = _graph_backend(args, "iterating")
    if backend is None:
        return NO_GPU_EXIT
    A = _load_graph(args.graph, comm)
    x, info = pagerank(A, alpha=args.alpha, max_iter=args.max_iter, tol=args.tol, tol_rule=args.tol_rule,
                       weighted=not args.unweighted, backend=backend, dtype=args.dtype, return_info=True, comm=comm,
                       device_memory_limit=args.device_memory_limit, tune=args.tune)
    if comm is None or comm.rank == 0:
        print(f"PageRank of {loaders.display_name(args.graph)} ({A.shape[0]:,} nodes, {A.nnz:,} edges): "
              f"{info.iterations} iterations, last change {info.error:.3g} ({args.tol_rule} rule), setup "
              f"{info.seconds['setup']:.2f} s, iterations {info.seconds['iterations']:.2f} s, {info.backend}")
        _report_scores(args, {"pagerank": x})
    return 0


def cmd_rwr(args) -> int:
    from .graph import rwr
    from .graph.rwr import seed_vector
    sets = []
    for each in args.seeds:
        try:
            sets.append([int(s) for s in each.split(",") if s.strip()])
        except ValueError:
            raise ValueError(f"--seeds takes node numbers separated by commas, got {each!r}") from None
    seeds = sets[0]
    if args.sharded and len(sets) > 1:
        raise ValueError("--sharded walks one seed set: give --seeds once")
    _check_sharded(args)
    spawned, comm = _ranks(args)
    if spawned is not None:
        return spawned
    if args.sharded:
        x, info, _, _, _ = _sharded_walk(args, comm, True, alpha=1 - args.restart, max_iter=args.max_iter,
                                         tol=args.tol, tol_rule=args.tol_rule,
                                         personalization=lambda n: seed_vector(seeds, n))
        if comm.rank == 0:
            print(f"random walk with restart {args.restart} from {len(seeds)} seed(s) on "
                  f"{loaders.display_name(args.graph)}, each of {comm.size} GPUs holding its rows: "
                  f"{info.iterations} iterations, last change {info.error:.3g} ({args.tol_rule} rule)")
            _report_scores(args, {"probability": x})
        return 0
    backend = _graph_backend(args, "iterating")
    if backend is None:
        return NO_GPU_EXIT
    A = _load_graph(args.graph, comm)
    x, infos = rwr(A, sets if len(sets) > 1 else seeds, restart=args.restart, max_iter=args.max_iter, tol=args.tol,
                   tol_rule=args.tol_rule, backend=backend, return_info=True, comm=comm,
                   device_memory_limit=args.device_memory_limit, tune=args.tune)
    if comm is None or comm.rank == 0:
        if len(sets) == 1:
            print(f"random walk with restart {args.restart} from {len(seeds)} seed(s) on "
                  f"{loaders.display_name(args.graph)}: {infos.iterations} iterations, last change "
                  f"{infos.error:.3g} ({args.tol_rule} rule), {infos.backend}")
            _report_scores(args, {"probability": x})
        else:
            print(f"random walks with restart {args.restart} from {len(sets)} seed sets on "
                  f"{loaders.display_name(args.graph)}: {', '.join(str(i.iterations) for i in infos)} iterations "
                  f"({args.tol_rule} rule), {infos[0].backend}")
            _report_scores(args, {f"set {j + 1}": x[:, j] for j in range(len(sets))})
    return 0


def cmd_simrank(args) -> int:
    import numpy as np
    from scipy import sparse

    from .graph import simrank
    from .loaders import load
    backend = args.backend or "scipy"
    if backend == "tuned" and not gpu.available():
        print(_no_gpu_banner().splitlines()[0] + "\n--backend tuned multiplies on a GPU: use --backend scipy.")
        return NO_GPU_EXIT
    A = load(args.graph)
    S, info = simrank(A, importance_factor=args.importance_factor, max_iterations=args.max_iterations,
                      tolerance=args.tolerance, threshold=args.threshold, backend=backend, return_info=True)
    print(f"SimRank of {loaders.display_name(args.graph)} ({A.shape[0]:,} nodes, {A.nnz:,} edges): "
          f"{info.iterations} iterations, {S.nnz:,} similarities, {info.seconds['iterations']:.2f} s, {backend}")
    C = sparse.triu(S, k=1).tocoo()  # each pair once, without the unit diagonal
    best = np.argsort(-C.data, kind="stable")[:args.top]
    print(f"{'rank':>5} {'node':>10} {'node':>10} {'simrank':>10}")
    for i, e in enumerate(best, 1):
        print(f"{i:>5} {C.row[e]:>10} {C.col[e]:>10} {C.data[e]:>10.6g}")
    if args.out:
        sparse.save_npz(args.out, S)
        print(f"wrote {args.out}")
    return 0


def cmd_betweenness(args) -> int:
    from tqdm import tqdm

    from .graph import betweenness
    from .loaders import load
    A = load(args.graph)
    bar = lambda items: tqdm(items, desc="source batches", unit="batch", file=sys.stderr)  # noqa: E731
    b, info = betweenness(A, k=args.k, normalized=not args.unnormalized, endpoints=args.endpoints, seed=args.seed,
                          progress=bar, return_info=True, backend=args.backend)
    print(f"betweenness of {loaders.display_name(args.graph)} ({A.shape[0]:,} nodes, {A.nnz:,} edges) from "
          f"{args.k or A.shape[0]:,} sources: deepest BFS level {info.iterations}, "
          f"{info.seconds['iterations']:.2f} s, {info.backend}")
    _report_scores(args, {"betweenness": b})
    return 0


def cmd_hits(args) -> int:
    from .graph import hits
    spawned, comm = _ranks(args)
    if spawned is not None:
        return spawned
    backend = "tuned" if comm is not None else _graph_backend(args, "multiplying")
    if backend is None:
        return NO_GPU_EXIT
    if args.backend is None and comm is None and backend != "scipy":
        backend = None  # tuner.hits picks the GPU's solver by the graph's size
    A = _load_graph(args.graph, comm)
    (h, a), info = hits(A, max_iter=args.max_iter, tol=args.tol, backend=backend, return_info=True,
                        device_memory_limit=args.device_memory_limit, comm=comm, tune=args.tune)
    if comm is None or comm.rank == 0:
        print(f"HITS of {loaders.display_name(args.graph)} ({A.shape[0]:,} nodes, {A.nnz:,} edges): "
              f"{info.iterations} products, setup {info.seconds['setup']:.2f} s, iterations "
              f"{info.seconds['iterations']:.2f} s, {info.backend}" + ("" if comm is None else f", {comm.size} GPUs"))
        _report_scores(args, {"hub": h, "authority": a})
    return 0


def cmd_bench(args) -> int:
    from tqdm import tqdm

    from . import bench
    from .operations import REGISTRY
    ops = [REGISTRY[name] for name in (REGISTRY if args.op == "all" else [args.op])]
    if not gpu.available():
        offline = [op for op in ops if op.bench_without_gpu]
        names = [op.name for op in ops if not op.bench_without_gpu]
        one = len(names) == 1
        later = " and ".join(names) + (" suite" if one else " suites")
        if not offline:
            print(_no_gpu_banner().splitlines()[0] + f"\nThe {later} {'times' if one else 'time'} products on the "
                  "GPU: there is nothing to do without one.")
            return NO_GPU_EXIT
        suite = args.suite or _default_suite(args.data_dir)
        skipped = [] if args.suite else bench.large_sources(suite)
        note = (f"Skipping the generated matrices of {bench.LARGE_NNZ / 1e6:.0f}M+ non-zeros, built only where a "
                f"GPU times them: {', '.join(loaders.display_name(s) for s in skipped)}." if skipped else "")
        if names:
            note = (note + "\n" if note else "") + f"The {later} {'needs' if one else 'need'} a GPU: not run."
        return _dry_run([s for s in suite if s not in skipped], args.arch, args.cache_dir, note)
    progress = lambda items, desc, unit: tqdm(items, desc=desc, unit=unit, file=sys.stderr)  # noqa: E731
    suite = args.suite or (_default_suite(args.data_dir) if any(op.name == "spmv" for op in ops) else [])
    builders = _prebuild([op for op in ops if op.prebuild], args.cache_dir)
    for op in ops:
        op.bench(args, suite, progress)
    for b in builders:
        b.join()
    return 0


def _prebuild(ops, cache_dir) -> list[threading.Thread]:
    """Start each operation's long builds (CUB libraries) in the background, so that they overlap the suites
    before it; a failure is logged and left to the call that needs the binary."""
    from .cache import Cache
    arch, cache = gpu.device_info().arch, Cache(cache_dir)

    def build(op):
        try:
            op.prebuild(arch, cache)
        except Exception as e:  # noqa: BLE001 - the product that needs it builds it again and reports
            logging.getLogger("tuner.cli").warning("building %s's libraries ahead failed: %s", op.name, e)
    threads = [threading.Thread(target=build, args=(op,), name=f"prebuild-{op.name}", daemon=True) for op in ops]
    for t in threads:
        t.start()
    return threads


def cmd_bench_multigpu(args) -> int:
    from . import bench_multigpu, paths
    if not args.distributed and args.gpus is None:
        if not gpu.available():
            print(_no_gpu_banner().splitlines()[0] + "\nbench-multigpu times products on several GPUs.")
            return NO_GPU_EXIT
        args.gpus = gpu.device_count()
    spawned, comm = _ranks(args)
    if spawned is not None:
        return spawned
    out = args.out or paths.gpu_results_dir(gpu.device_info().name) / "bench-multigpu.json"
    return bench_multigpu.run_ranks(args.suite or list(bench_multigpu.SUITE), Path(out), comm, args.command_line,
                                    sharded=args.sharded)


def cmd_bench_graph(args) -> int:
    from tqdm import tqdm

    from . import bench_graph, paths
    if not gpu.available():
        print(_no_gpu_banner().splitlines()[0] + "\nbench-graph times the algorithms on the GPU.")
        return NO_GPU_EXIT
    out = Path(args.out) if args.out else paths.gpu_results_dir(gpu.device_info().name) / "bench-graph.json"
    suite = args.suite or bench_graph.default_suite(args.data_dir)
    bar = lambda jobs: tqdm(jobs, desc="bench graph", unit="row", file=sys.stderr)  # noqa: E731
    rows = bench_graph.run(suite, out, args.command_line, progress=bar, algorithms=tuple(args.algorithms))
    print(bench_graph.format_table(rows))
    print(f"wrote {out}")
    return 0


def cmd_bench_stream(args) -> int:
    from tqdm import tqdm

    from . import bench_stream, paths
    suite = bench_stream.parse_suite(args.suite) if args.suite else bench_stream.default_suite(args.data_dir)
    if not gpu.available():
        print(_no_gpu_banner().splitlines()[0] + "\nbench-stream streams products through the GPU.")
        return NO_GPU_EXIT
    out = Path(args.out) if args.out else paths.gpu_results_dir(gpu.device_info().name) / "bench-stream.json"
    bar = lambda jobs: tqdm(jobs, desc="bench stream", unit="row", file=sys.stderr)  # noqa: E731
    rows = bench_stream.run(suite, out, args.command_line, ops=tuple(args.op), progress=bar,
                            products=bench_stream.spgemm_suite(args.data_dir))
    print(bench_stream.format_table(rows))
    print(f"wrote {out}")
    return 0


def _default_suite(data_dir, report: bool = False) -> list[str]:
    """The default suite, after checking that a data folder given (--data-dir, $TUNER_DATA_DIR) exists; with
    none at all, says that only generated graphs run."""
    from . import bench
    folder = loaders.data_dir_or_error(data_dir)
    if folder is None or not folder.is_dir():
        print("no data folder (set --data-dir or TUNER_DATA_DIR to a folder of .npz graphs): the suite is the "
              "generated graphs only", file=sys.stderr)
    return bench.default_suite(folder, report=report)


def cmd_profile(args) -> int:
    from tqdm import tqdm

    from . import profile
    if args.refit_chains:  # timings already held, fitted again: no GPU needed where --out names the file
        if not args.out and not gpu.available():
            print("--refit-chains without a GPU needs --out: the profile file to fit again", file=sys.stderr)
            return 2
        from .model.profile_data import profile_path
        path = Path(args.out) if args.out else profile_path(gpu.device_info().name)
        try:
            chains = profile.refit_chains(path, args.command_line)["chains"]
        except (OSError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"{path}: chain floor {1000 * chains['base_ms']:.2f} us + {1000 * chains['round_ms']:.4f} us a round; "
              f"median log error {chains['error_without']:.3f} -> {chains['error']:.3f} over "
              f"{sum(len(c['candidates']) for c in chains['launches'])} timings")
        return 0
    if not gpu.available():
        print(_no_gpu_banner().splitlines()[0] + "\nProfiling measures this GPU: there is nothing to do without one.")
        return NO_GPU_EXIT
    if args.remeasure_spgemm:
        from .model.profile_data import find_profile
        path = Path(args.out) if args.out else find_profile(gpu.device_info().name)
        if path.is_file():
            rates = profile.remeasure_spgemm(path, args.cache_dir, args.command_line)["spgemm"]["rates"]
            print(f"{path}: SpGEMM rates " + ", ".join(f"{k} {v:.3g} ms" for k, v in sorted(rates.items())))
            return 0
    grid = profile.REDUCED if args.reduced else profile.Grid()
    prof = profile.run(Path(args.out) if args.out else None, grid, cache_dir=args.cache_dir,
                       remeasure_constants=args.remeasure_constants, remeasure_caches=args.remeasure_caches,
                       remeasure_tail=args.remeasure_tail, remeasure_occupancy=args.remeasure_occupancy,
                       remeasure_chains=args.remeasure_chains, remeasure_spgemm=args.remeasure_spgemm,
                       command=args.command_line,
                       progress=lambda total: tqdm(total=total, desc="profile", unit="shape", file=sys.stderr))
    c = prof["constants"]
    print(f"{prof['gpu']['name']}: {c['sm_count']} SMs, {c['max_warps_per_sm']} warps/SM, L2 {c['l2_bytes'] >> 20} MB, "
          f"copy {c['copy_bandwidth_gbs']:.0f} GB/s, launch {1000 * c['launch_overhead_ms']:.1f} us "
          f"(a gather adds {1000 * c.get('gather_launch_ms', float('nan')):.1f}); "
          f"{len(prof['tables'])} kernel shapes in {prof.get('seconds', 0):.0f} s")
    return 0


def cmd_report(args) -> int:
    from tqdm import tqdm

    from . import report
    from .model import load_profile
    command = args.command_line
    if args.rounds < 1:
        raise ValueError(f"--rounds must be at least 1, got {args.rounds}")
    if args.plan_repeats < 1:
        raise ValueError(f"--plan-repeats must be at least 1, got {args.plan_repeats}")
    bar = lambda s: tqdm(s, desc="report", unit="matrix", file=sys.stderr)  # noqa: E731
    if args.spgemm:
        from . import report_spgemm
        prof = None
        if args.repredict:
            bench_gpu = json.loads(Path(args.spgemm).read_text()).get("gpu", {}).get("name", "")
            prof = load_profile(bench_gpu, args.profile or Path(args.spgemm).parent / "profile.json")
        path, summary = report_spgemm.run(Path(args.spgemm), Path(args.out) if args.out else None,
                                          loaders.data_dir_or_error(args.data_dir), prof, args.repredict)
        mdape = ", ".join(f"{f} {100 * e:.0f} %" for f, e in summary["mdape"].items() if e is not None)
        print(f"SpGEMM model: MdAPE {mdape}; its pick the fastest on {summary['fastest']} of {summary['picks']} "
              f"products, within 10 % on {summary['within_10pct']}; regret median {summary['regret_median']:.2f}x, "
              f"worst {summary['regret_worst']:.2f}x\nwrote {path}")
        return 0
    if args.from_csv:
        rows = report.read_csv(Path(args.from_csv))
        # The measured report's record (GPU, matrices, when, how) stays, with this command after its own.
        prior = Path(args.from_csv).parent / "report.json"
        meta = {k: v for k, v in (json.loads(prior.read_text()) if prior.is_file() else {}).items()
                if k in ("gpu", "matrices", "created", "command", "profile_digest", "planning_host")}
        meta["command"] = f"{meta['command']} ; then {command}" if meta.get("command") else command
        if args.repredict:  # default profile: the one beside the CSV, as under models/<gpu-slug>/
            prof = load_profile("", args.profile or Path(args.from_csv).parent / "profile.json")
            suite = args.suite or _default_suite(args.data_dir, report=True)
            rows, planning = report.repredict(rows, suite, prof, progress=bar, plan_repeats=args.plan_repeats)
            # The planning seconds are now this model's, timed here; the rest of each record stays.
            meta["matrices"] = {name: report.replanned(meta.get("matrices", {}).get(name, {}), planning.get(name, {}))
                                for name in dict.fromkeys([*meta.get("matrices", {}), *planning])}
            meta.update(profile_digest=prof.digest, planning_host=report.planning_host())
    else:
        suite = args.suite or _default_suite(args.data_dir, report=True)
        if not gpu.available():
            return _dry_run(suite, args.arch, args.cache_dir)
        prof = load_profile(gpu.device_info().name, args.profile)
        outdir = Path(args.out) if args.out else report_dir()
        rows, meta = report.collect(suite, prof, cache_dir=args.cache_dir, outdir=outdir, resume=args.resume,
                                    progress=bar, command=command, rounds=args.rounds,
                                    plan_repeats=args.plan_repeats)
        meta.update(created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), profile_digest=prof.digest)
    if args.out:
        outdir = Path(args.out)
    elif args.from_csv:  # re-summarised beside the CSV it came from: no GPU to name the folder
        outdir = Path(args.from_csv).parent
    else:
        outdir = report_dir()
    summary = report.write_all(rows, meta, outdir)
    print(f"{'model':<10}{'MdAPE':>8}{'Spearman':>10}{'top-1':>8}{'within 5%':>11}{'regret gm':>11}{'worst':>8}"
          f"{'open':>6}")
    for model, o in summary["overall"].items():
        print(f"{model:<10}{o['mdape']:8.1%}{o['spearman_mean']:10.3f}{o['top1']:8.1%}{o['within_5pct']:11.1%}"
              f"{o['regret_geomean']:11.3f}{o['regret_max']:8.3f}{o['open_verdicts']:6d}")
    print("open: within-5 % verdicts the timing rounds' spread could flip")
    print(f"\nwrote {outdir}/report.{{csv,png,html,json}}")
    return 0


def report_dir() -> Path:
    from . import paths
    return paths.gpu_results_dir(gpu.device_info().name)


def _iteration_options(p) -> None:
    """Where an iterative graph command multiplies: backend, precision, several GPUs."""
    from .compiler import COMPILE_TUNE_MODES
    p.add_argument("--backend", choices=["tuned", "device", "scipy"], default=None,
                   help="device: the iterations stay on the GPU (default with a GPU and CuPy); tuned: the host "
                        "drives the loop, the product on the GPU (default with a GPU but no CuPy); scipy: on the host")
    p.add_argument("--tune", choices=COMPILE_TUNE_MODES, default="none",
                   help="how the product by A^T is compiled: none (default): the generic kernel, ready in "
                        "milliseconds, since a tuned kernel takes seconds of planning and layout to make; "
                        "model: the model's tuned kernel (for long runs); measure, exhaustive, optuna: as compile")
    p.add_argument("--dtype", choices=["float32", "float64"], default="float64",
                   help="precision of the matrix and vectors on the GPU (default %(default)s; float32 moves half "
                        "the bytes)")
    _ranks_options(p)


def _ranks_options(p) -> None:
    """Several GPUs, one MPI rank each."""
    p.add_argument("--distributed", action="store_true",
                   help="this process is one rank of an MPI job, one GPU each (mpirun -n 4 python -m tuner ... "
                        "--distributed): the graph's rows are split among the GPUs, vectors exchanged with NCCL; "
                        "rank 0 prints and writes")
    p.add_argument("--gpus", type=int, default=None,
                   help="start this many ranks, one per GPU, through mpiexec (the same as mpirun -n N ... "
                        "--distributed)")


def _sharded_option(p) -> None:
    """A walk's ``--sharded``: several GPUs, each holding only its rows."""
    p.add_argument("--sharded", action="store_true",
                   help="with --gpus or --distributed: each GPU holds only its rows, rank 0 alone loads the graph "
                        "(a kron:PATH:K graph: no rank builds it, each generates its rows), so a graph larger "
                        "than one GPU runs; the product by A^T is the one-GPU plan's tiles, whatever --tune says")


def _memory_option(p) -> None:
    """A graph command's device-memory budget (its products streamed from host memory beyond it)."""
    p.add_argument("--device-memory-limit", default=None,
                   help="device memory each GPU's product may hold (e.g. 2G; default: what is free): a graph over "
                        "it is streamed from host memory every iteration (on the GPU backends)")


def output_file(text: str) -> str:
    """An --out file whose folder exists and may be written, checked as the command starts: a result is not
    computed only to be refused at the end.

    Example:
        >>> output_file("/no/such/folder/x.npy")
        Traceback (most recent call last):
        ...
        argparse.ArgumentTypeError: /no/such/folder/x.npy: the folder /no/such/folder does not exist
    """
    path = Path(text).expanduser()
    folder = path.absolute().parent
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: is a folder, not a file to write")
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise argparse.ArgumentTypeError(f"{text}: the folder {folder} cannot be written")
    return str(path)


def _results_options(p, printed: str, written: str, func) -> None:
    """What every graph command ends with: how many of its ``printed`` results to show, the file its whole
    result is ``written`` to, and its handler."""
    p.add_argument("--top", type=int, default=10, help=f"{printed} printed (default %(default)s)")
    p.add_argument("--out", default=None, type=output_file, help=written)
    p.set_defaults(func=func)


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
                       description="Tune SpMV for one matrix on this GPU: rank every candidate kernel of "
                                   "every family by the model (and, per --tune, by measurement), keep the chosen "
                                   "plan in the cache under the matrix fingerprint and print the ranking.")
    p.add_argument("matrix", help=MATRIX_HELP)
    p.add_argument("--dtype", choices=["float32", "float64"], default=None,
                   help="value type of the kernel (default: the matrix's; integers become float32)")
    tuning(p)
    p.add_argument("--top-k", type=int, default=3, help="candidates timed by --tune measure (default %(default)s)")
    p.add_argument("--trials", type=int, default=24, help="trial budget of --tune optuna (default %(default)s)")
    p.add_argument("--gpu", default=OFFLINE_GPU,
                   help="without a GPU: the GPU whose profile (--profile, else the one measured here or shipped "
                        "under models/) the model predicts for (default %(default)r)")
    common(p)
    p.set_defaults(func=cmd_tune)

    p = sub.add_parser("spgemm", help="C = A B on this GPU: the family the model picks, the product, C to .npz",
                       description="Multiply two sparse matrices on this GPU (B defaults to A; --transpose "
                                   "multiplies by B's transpose: A·Aᵀ with one matrix). Prints why the family "
                                   "was chosen (each family's predicted time, and the measured ones with --tune "
                                   "measure), C's size and the first call's phases, and writes C with --out. "
                                   "Without a GPU: the model's choice for --gpu's profile.")
    p.add_argument("a", help=MATRIX_HELP)
    p.add_argument("b", nargs="?", default=None, help="the right operand (default: A)")
    p.add_argument("--transpose", action="store_true", help="multiply by the right operand's transpose")
    p.add_argument("--dtype", choices=["float32", "float64"], default=None,
                   help="value type (default: the wider of the operands'; integers become float32)")
    p.add_argument("--tune", choices=["model", "measure"], default="model",
                   help="model: the model's family (default); measure: time every candidate, keep (and cache) "
                        "the fastest")
    p.add_argument("--profile", default=None, help="GPU profile (default: models/<gpu-slug>/profile.json)")
    p.add_argument("--gpu", default=OFFLINE_GPU, help="without a GPU: whose profile the model predicts for "
                                                       "(default %(default)r)")
    p.add_argument("--out", default=None, type=output_file, help="write C here (SciPy .npz)")
    p.add_argument("--cache-dir", default=None,
                   help="binary and plan cache (default: $TUNER_CACHE_DIR, cache/ of a checkout, or "
                        "~/.cache/sparse-tuner)")
    p.set_defaults(func=cmd_spgemm)

    p = sub.add_parser("pagerank", help="PageRank of a graph (NetworkX's semantics); top nodes, full result to a file",
                       description="PageRank of the graph whose edge u -> v is A[u, v], as networkx.pagerank "
                                   "defines it, on this GPU (the iterations stay there; --tune model tunes the "
                                   "product; --gpus N splits the graph over N GPUs), or with SciPy on the "
                                   "host (--backend scipy; the default without a GPU). Prints the iterations, times and the top nodes; --out writes every "
                                   "node's rank (.npy, or .csv with node,pagerank).")
    p.add_argument("graph", help=MATRIX_HELP)
    p.add_argument("--alpha", type=float, default=0.85, help="damping factor (default %(default)s)")
    p.add_argument("--max-iter", type=int, default=100, help="most iterations (default %(default)s)")
    p.add_argument("--tol", type=float, default=1e-6, help="tolerance (default %(default)s)")
    p.add_argument("--tol-rule", choices=["networkx", "per_node"], default="networkx",
                   help="networkx: stop when the L1 change < N x tol (true after one iteration once N x tol >= 2); "
                        "per_node: when every node's change < tol (default %(default)s)")
    p.add_argument("--unweighted", action="store_true", help="every edge weighs 1 (default: A's values)")
    _iteration_options(p)
    _sharded_option(p)
    _memory_option(p)
    _results_options(p, "top nodes", "every node's rank: .npy, or .csv", cmd_pagerank)

    p = sub.add_parser("rwr", help="random walk with restart from seed nodes; top nodes, all to a file",
                       description="Visiting probabilities of a walk on the graph whose edge u -> v is A[u, v] "
                                   "that returns to the seeds with probability --restart at every step (PageRank "
                                   "personalised on the seeds), through the tuned SpMV on this GPU or SciPy on the "
                                   "host (--backend scipy; the default without a GPU).")
    p.add_argument("graph", help=MATRIX_HELP)
    p.add_argument("--seeds", required=True, action="append",
                   help="seed nodes, e.g. 0,17,42 (a node twice: twice the weight); given again, another seed set: "
                        "the sets walk together on the GPU, a column each in --out")
    p.add_argument("--restart", type=float, default=0.15, help="restart probability (default %(default)s)")
    p.add_argument("--max-iter", type=int, default=100, help="most iterations (default %(default)s)")
    p.add_argument("--tol", type=float, default=1e-6, help="tolerance (default %(default)s)")
    p.add_argument("--tol-rule", choices=["networkx", "per_node"], default="per_node",
                   help="per_node: stop when every node's change < tol (default); networkx: the L1 change < N x tol")
    _iteration_options(p)
    _sharded_option(p)
    _memory_option(p)
    _results_options(p, "top nodes", "every node's probability: .npy, or .csv", cmd_rwr)

    p = sub.add_parser("hits", help="HITS hubs and authorities (NetworkX's semantics); top nodes, all to a file",
                       description="Hubs and authorities of the graph whose edge u -> v is A[u, v], as networkx.hits "
                                   "computes them (A's leading singular vectors by Lanczos iterations), the products "
                                   "by A and Aᵀ through the tuned SpMV on this GPU (or split over several: --gpus) "
                                   "or SciPy on the host (--backend scipy; the default without a GPU). --out writes "
                                   "both (.npy: two columns, or .csv).")
    p.add_argument("graph", help=MATRIX_HELP)
    p.add_argument("--max-iter", type=int, default=100,
                   help="restarts of the Lanczos basis, as ARPACK's maxiter (default %(default)s)")
    p.add_argument("--tol", type=float, default=1e-8,
                   help="residual relative to the eigenvalue, as ARPACK's tol (default %(default)s)")
    from .graph.hits import DEVICE_MIN_NODES
    p.add_argument("--backend", choices=["device", "tuned", "scipy"], default=None,
                   help=f"device: Lanczos on the GPU (default with a GPU, for graphs of {DEVICE_MIN_NODES:,} "
                        "nodes or more); tuned: ARPACK on the host, products on the GPU (the default below that "
                        "size); scipy: all on the host")
    from .compiler import COMPILE_TUNE_MODES
    p.add_argument("--tune", choices=COMPILE_TUNE_MODES, default="none",
                   help="how the products by A and A^T are compiled: none (default): the generic kernel, ready "
                        "in milliseconds (ARPACK's tens of products never repay a tuning); model, measure, "
                        "exhaustive, optuna: as compile")
    _memory_option(p)
    _ranks_options(p)
    _results_options(p, "top nodes", "hub and authority of every node: .npy, or .csv", cmd_hits)

    p = sub.add_parser("simrank", help="SimRank similarities (NetworkX's semantics) by two SpGEMMs an iteration",
                       description="SimRank of every pair of nodes of the graph whose edge u -> v is A[u, v], as "
                                   "networkx.simrank_similarity computes it, kept sparse: each iteration is "
                                   "Wᵀ S then (Wᵀ S) W (paper 000) with SciPy on the host (default) or the tuned "
                                   "SpGEMM on this GPU (--backend tuned), then the unit diagonal. --threshold "
                                   "drops similarities below it each iteration (error at most threshold / "
                                   "(1 - importance factor)). Prints the most similar pairs; --out writes S (.npz).")
    p.add_argument("graph", help=MATRIX_HELP)
    p.add_argument("--importance-factor", type=float, default=0.9, help="decay c (default %(default)s)")
    p.add_argument("--max-iterations", type=int, default=1000, help="most iterations (default %(default)s)")
    p.add_argument("--tolerance", type=float, default=1e-4,
                   help="stop when every similarity changes by at most this (numpy.allclose; default %(default)s)")
    p.add_argument("--threshold", type=float, default=None, help="prune similarities below this (default: exact)")
    p.add_argument("--backend", choices=["scipy", "tuned"], default=None,
                   help="scipy: products on the host (default); tuned: the tuned SpGEMM on the GPU")
    _results_options(p, "most similar pairs", "the similarity matrix (SciPy .npz)", cmd_simrank)

    p = sub.add_parser("betweenness", help="betweenness centrality (NetworkX's semantics), Brandes on source batches",
                       description="Betweenness centrality of every node of the graph whose edge u -> v is A[u, v] "
                                   "(unweighted shortest paths), as networkx.betweenness_centrality computes it: "
                                   "Brandes' algorithm with a batch of sources per breadth-first search, each "
                                   "level one sparse product on the host or one kernel launch on the GPU. --k "
                                   "samples sources "
                                   "as NetworkX does (with --seed). Prints the top nodes; --out writes every "
                                   "node's value.")
    p.add_argument("graph", help=MATRIX_HELP)
    p.add_argument("--k", type=int, default=None, help="sampled sources (default: every node)")
    p.add_argument("--seed", type=int, default=None, help="seed of the sample (default: random)")
    p.add_argument("--unnormalized", action="store_true", help="path counts, not divided by the node pairs")
    p.add_argument("--endpoints", action="store_true", help="count a path's end nodes too")
    p.add_argument("--backend", choices=["device", "scipy"], default=None,
                   help="device: a kernel launch per level on the GPU (default where CuPy reaches one); scipy: "
                        "on the host (default otherwise)")
    _results_options(p, "top nodes", "every node's value: .npy, or .csv", cmd_betweenness)

    p = sub.add_parser("bench", help="time tuned kernels against cuSPARSE on a suite; print a table, write JSON",
                       description="Benchmark tuned SpMV against cuSPARSE (best of CSR and COO through "
                                   "cupyx.cusparse.spmv) on real and generated matrices. Per matrix: nnz, "
                                   "chosen plan, our median ms, cuSPARSE median ms, speedup, achieved GB/s, "
                                   "its fraction of the copy bandwidth measured in the same run, and the "
                                   "host time to build the chosen layout. Then SpGEMM (C = A·A and A·Aᵀ) against "
                                   "cuSPARSE through CuPy: per product the model's family and predictions, each "
                                   "family's time, cuSPARSE's time and status, and a correctness check of ours "
                                   "(bench-spgemm.json).")
    p.add_argument("suite", nargs="*", help=f"matrices ({MATRIX_HELP}); default: every .npz of the data "
                                            "directory, rmat:20, rmat:23, rmat:25 and Kronecker-scaled real "
                                            "graphs of 72M-260M non-zeros (without a GPU the generated ones of "
                                            "100M+ are skipped)")
    p.add_argument("--data-dir", default=None,
                   help="folder of real .npz matrices (default: $TUNER_DATA_DIR or ../shared/data)")
    p.add_argument("--out", default=None, help="JSON report (default: models/<gpu-slug>/bench-spmv.json)")
    p.add_argument("--repeats", type=int, default=100, help="timed runs per measurement (default %(default)s)")
    p.add_argument("--resume", action="store_true",
                   help="keep the rows an interrupted run wrote to --out (same GPU, tune mode and repeats) and "
                        "measure only the matrices it did not reach")
    from .operations import REGISTRY
    p.add_argument("--op", choices=(*REGISTRY, "all"), default="all",
                   help="which suites: SpMV (y = A x), SpGEMM (C = A·A and A·Aᵀ of each graph, with rmat:16/18/20 "
                        "and Kronecker-scaled graphs by default), SpMM (Y = A X for blocks of 4 and 16 columns) "
                        "or all of them (default %(default)s)")
    p.add_argument("--spmm-out", default=None,
                   help="SpMM's JSON report (default: models/<gpu-slug>/bench-spmm.json)")
    p.add_argument("--spgemm-out", default=None,
                   help="SpGEMM's JSON report (default: models/<gpu-slug>/bench-spgemm.json)")
    p.add_argument("--spgemm-repeats", type=int, default=5,
                   help="timed runs per SpGEMM measurement (default %(default)s)")
    tuning(p)
    common(p)
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("bench-graph", help="PageRank, RWR, HITS, betweenness and SimRank end to end against "
                                           "cuSPARSE loops and NetworkX",
                       description="Run PageRank and random walk with restart (iterations on the GPU, the tuned "
                                   "SpMV), HITS (ARPACK, products on the GPU), betweenness (batched Brandes on the "
                                   "GPU) and SimRank (the tuned SpGEMM) from a host SciPy matrix to a NumPy "
                                   "result, and the same algorithms on cuSPARSE through CuPy for the same "
                                   "iterations; compare both with NetworkX where it runs in reasonable time. "
                                   "Writes bench-graph.json after each row, keeping the rows of (algorithm, "
                                   "graph) pairs this run does not redo.")
    p.add_argument("suite", nargs="*", help=f"graphs for PageRank and RWR ({MATRIX_HELP}); default: the data "
                                            "folder's graphs, rmat:20, rmat:23, rmat:25 and cnr-2000 "
                                            "Kronecker-scaled 4 times (HITS: the files, rmat:20 and rmat:23; "
                                            "betweenness: the files and rmat:20; SimRank: rmat:10, rmat:12)")
    p.add_argument("--data-dir", default=None, help="folder of real matrices (default $TUNER_DATA_DIR or ../shared/data)")
    p.add_argument("--out", default=None, help="JSON file (default models/<gpu-slug>/bench-graph.json)")
    graph_algorithms = ["pagerank", "rwr", "rwr_many", "hits", "betweenness", "simrank"]
    p.add_argument("--algorithms", nargs="+", choices=graph_algorithms, default=graph_algorithms,
                   help="the algorithms to run (default: all six; rwr_many: eight seed sets walking at once "
                        "against a cuSPARSE block of eight)")
    p.set_defaults(func=cmd_bench_graph)

    p = sub.add_parser("bench-stream", help="SpMV, PageRank and SpGEMM streamed through a device-memory budget",
                       description="Multiply graphs larger than a device-memory budget by streaming their rows from "
                                   "page-locked host memory every product (and PageRank with Aᵀ streamed every "
                                   "iteration); time them against the host-to-device bandwidth measured in the same "
                                   "run and the same product in memory; check against SciPy and PageRank in memory. "
                                   "With --op spgemm: A·A and A·Aᵀ of the data folder's wiki-Vote, cit-HepPh and "
                                   "cnr-2000 in slotted pages under an eighth of their outer-product working set, each "
                                   "at the model's page size and at a half and a quarter of it. "
                                   "Writes bench-stream.json after each row.")
    p.add_argument("suite", nargs="*", help=f"GRAPH@BUDGET items, e.g. rmat:25@512M (GRAPH: {MATRIX_HELP}; "
                                            "BUDGET: bytes or 512M, 2G, ...); default: rmat:23@128M, "
                                            "rmat:25@512M, rmat:23:64@224M and cnr-2000 Kronecker-scaled "
                                            "twice@256M")
    p.add_argument("--op", nargs="+", choices=("spmv", "pagerank", "spgemm"), default=["spmv", "pagerank", "spgemm"],
                   help="what to stream (default all three)")
    p.add_argument("--data-dir", default=None, help="folder of real matrices (default $TUNER_DATA_DIR or ../shared/data)")
    p.add_argument("--out", default=None, help="JSON file (default models/<gpu-slug>/bench-stream.json)")
    p.set_defaults(func=cmd_bench_stream)

    p = sub.add_parser("bench-multigpu", help="SpMV and PageRank across this machine's GPUs (MPI + NCCL) against one",
                       description="Split each graph's rows among the GPUs (one MPI rank each, bitonic partition, each "
                                   "rank's rows in the one-GPU plan's tiles, x gathered with NCCL) and time SpMV by "
                                   "Aᵀ and PageRank iterations against the same code on one GPU (in its plan's "
                                   "order): speedup, parallel efficiency, the "
                                   "all-gather and local product apart, results checked against one GPU and SciPy. "
                                   "Starts one rank per GPU through mpiexec (--gpus, default all); writes "
                                   "bench-multigpu.json after each graph.")
    p.add_argument("suite", nargs="*", help=f"graphs ({MATRIX_HELP}); default: {' '.join(MULTIGPU_SUITE)}")
    p.add_argument("--gpus", type=int, default=None, help="ranks to start, one per GPU (default: every GPU)")
    p.add_argument("--distributed", action="store_true",
                   help="this process is already one rank of an MPI job (what --gpus starts)")
    p.add_argument("--sharded", action="store_true",
                   help="only rank 0 loads each graph (a kron:PATH:K graph: none, each rank generates its "
                        "part); every rank holds just its rows of Aᵀ and plans from the ranks' statistics "
                        "added up, so a graph larger than one GPU runs (its one-GPU side is then skipped and "
                        "the SpMV checked on sampled nodes)")
    p.add_argument("--out", default=None, help="JSON file (default models/<gpu-slug>/bench-multigpu.json)")
    p.set_defaults(func=cmd_bench_multigpu)

    p = sub.add_parser("profile", help="measure this GPU's lookup table and constants -> models/<gpu-slug>/profile.json",
                       description="Offline profiling of this GPU: micro-benchmarks on synthetic matrices whose rows "
                                   "all have one length measure each kernel shape's throughput (paper 003's "
                                   "Performance(w, h)) with x in L1, in L2 and in memory, plus SM count, warps per "
                                   "SM, cache sizes, copy bandwidth and launch overhead. Resumable: a rerun keeps "
                                   "what the file already holds.")
    p.add_argument("--out", default=None, help="profile file (default: models/<gpu-slug>/profile.json)")
    p.add_argument("--reduced", action="store_true", help="a small grid (seconds; for tests)")
    p.add_argument("--remeasure-constants", action="store_true",
                   help="measure the constants (bandwidth, launch overhead and what a gather adds to it, cache "
                        "capacities, tail factor) and "
                        "lone-row times again, keeping the measured tables")
    p.add_argument("--remeasure-caches", action="store_true",
                   help="measure only the cache sweeps again (the hit-rate curves and capacities the model reads), "
                        "keeping everything else")
    p.add_argument("--remeasure-tail", action="store_true",
                   help="measure only the tail factor again (how much slower a long row runs beside bulks of "
                        "other warps of three sizes than alone), keeping everything else")
    p.add_argument("--remeasure-occupancy", action="store_true",
                   help="measure only the small launches' floors again (each kernel shape's time with 2 to 48 "
                        "warps per SM; the seg lanes' also at 8 to 64 slots), keeping everything else; a profile "
                        "without them gets them on any run")
    p.add_argument("--remeasure-chains", action="store_true",
                   help="measure only the chain floor again (every csr_vector and binned candidate timed on "
                        "synthetic launches of mixed rows, and the base and time per round of the longest lane "
                        "fitted to them), keeping everything else; a profile without it gets it on any run")
    p.add_argument("--remeasure-spgemm", action="store_true",
                   help="measure only the SpGEMM families' phase rates again (both families on ten generated "
                        "products, the model's ms per product, per byte and per row fitted to them), keeping "
                        "everything else; a profile without them gets them on any run")
    p.add_argument("--refit-chains", action="store_true",
                   help="only fit the chain floor again to the timings the profile already holds, each predicted "
                        "afresh by the current model (after a change to the model); measures nothing and needs no "
                        "GPU when --out names the profile file")
    common(p)
    p.set_defaults(func=cmd_profile)

    p = sub.add_parser("report", help="predicted vs measured for every candidate: CSV, PNG, HTML",
                       description="For every matrix and every candidate plan, the lookup model's and the "
                                   "bytes-over-bandwidth baseline's predictions beside the measured time; writes "
                                   "report.csv, report.png (log-log scatter, y = x, +-20 % band), report.html and "
                                   "report.json with MdAPE, Spearman correlation, top-1 rate and regret.")
    p.add_argument("suite", nargs="*", help=f"matrices ({MATRIX_HELP}); default: the data directory's .npz, "
                                            "rmat:20, rmat:23, rmat:25 and Kronecker-scaled real graphs of 50M+ "
                                            "non-zeros")
    p.add_argument("--data-dir", default=None, help="folder of real .npz matrices")
    p.add_argument("--out", default=None, help="output folder (default: the GPU's folder of models/, or with "
                                               "--from-csv the CSV's folder)")
    p.add_argument("--profile", default=None, help="profile file (default: the one of this GPU under models/)")
    p.add_argument("--from-csv", default=None, help="re-summarise and re-plot an existing report.csv (no GPU)")
    p.add_argument("--spgemm", default=None, metavar="BENCH_JSON",
                   help="the SpGEMM model instead: each family's prediction against its measured time in a "
                        "bench-spgemm.json (written by `bench`); writes report-spgemm.csv and .json beside it or in "
                        "--out (no GPU). With --repredict, the current model predicts again (the graphs loaded "
                        "from --data-dir, --profile or the profile.json beside the file). Given a "
                        "bench-stream-spgemm.json (`bench-stream --op spgemm`), each slotted-page product's page "
                        "sizes instead: report-stream-spgemm.csv and .json (--repredict: under each row's budget)")
    p.add_argument("--repredict", action="store_true",
                   help="with --from-csv: predict every candidate again with the current model and --profile "
                        "(default: profile.json beside the CSV) and time each matrix's planning again, here; no "
                        "GPU; the suite, or the default one, gives the matrices' sources")
    p.add_argument("--resume", action="store_true",
                   help="keep the candidates an interrupted report already measured in --out and time only the "
                        "rest (refused if it ran on another GPU or read another profile)")
    p.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS,
                   help=f"timing rounds of each candidate shorter than {ROUNDS_UNDER_MS * 1e3:g} us, each on "
                        "buffers placed afresh; the report keeps their median and range "
                        f"(default {DEFAULT_ROUNDS}; 1: one timing each)")
    p.add_argument("--plan-repeats", type=int, default=PLAN_REPEATS,
                   help="times each matrix is planned in model mode, each from the relabelled matrix afresh; the "
                        f"report's planning seconds are their median (default {PLAN_REPEATS})")
    common(p)
    p.set_defaults(func=cmd_report)
    return parser


def tuning(p) -> None:
    from .planner import TUNE_MODES
    p.add_argument("--tune", choices=TUNE_MODES, default="model",
                   help="model: the model's choice, nothing timed (default); measure: time the model's top k; "
                        "exhaustive: time every candidate; optuna: an Optuna study seeded by the model")
    p.add_argument("--profile", default=None, help="GPU profile (default: models/<gpu-slug>/profile.json)")


def describe(exc: BaseException) -> str:
    """One line for a user: the error's own message, with the path an OS error names.

    Example:
        >>> describe(IsADirectoryError(21, "Is a directory", "/tmp/x"))
        'Is a directory: /tmp/x'
        >>> describe(MemoryError())
        'out of host memory'
    """
    if isinstance(exc, OSError) and exc.strerror and exc.filename is not None:
        return f"{exc.strerror}: {exc.filename}"
    if isinstance(exc, MemoryError) and not str(exc):
        return "out of host memory"
    return str(exc) or type(exc).__name__


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m tuner`` and the ``sparse-tuner`` script.

    Errors the user can act on (bad input, files, the cache, memory, the toolchain, no GPU) end in one line
    on stderr and exit status 2 (3 for a missing GPU); anything else is a bug and keeps its traceback.

    Example:
        >>> main(["bench", "--data-dir", "/no/such/folder"])
        2
    """
    args = build_parser().parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else list(argv)
    args.command_line = " ".join(["python -m tuner"] + args.argv)
    try:
        return args.func(args)
    except gpu.NoDeviceError as exc:
        print(f"error: no CUDA GPU: {describe(exc)}", file=sys.stderr)
        return NO_GPU_EXIT
    except MemoryError as exc:
        print(f"error: {describe(exc)}", file=sys.stderr)
        return 2
    except (ValueError, OSError, codegen.CompileError, codegen.ToolchainError) as exc:
        print(f"error: {describe(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
