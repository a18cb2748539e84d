"""``python -m tuner bench-graph``: the graph algorithms end to end, ours against the same algorithm on
cuSPARSE through CuPy, with the same iterations, and against NetworkX where it runs in reasonable time.

Rows (models/<gpu-slug>/bench-graph.json), host SciPy matrix in, NumPy result out:

* ``pagerank``: ours is one call of :func:`tuner.pagerank` as a user makes it (host matrix in, ranks out; the
  defaults: set up on this GPU, every iteration in one launch of the resident kernel
  (:mod:`tuner.graph.resident`), no tuning) to a per-node change below ``TOL``; then the same iterations on the
  tuned product, driven from the host
  (:func:`~tuner.distributed.pagerank.pull_product`, planned from a cold plan cache) give the tuned columns.
  cuSPARSE's is the same pull iteration in CuPy (cuSPARSE's SpMV on Aᵀ transposed on the GPU through
  descriptors kept, device-side dangling sum, one fused update kernel, the change left on the device), run
  for exactly our number of iterations with each of two ways of reducing, the faster kept.
* ``rwr``: the same with the walk restarting at the three nodes of largest out-degree.
* ``simrank``: :func:`tuner.simrank` through our SpGEMM against the same two products an iteration through
  CuPy's ``csr @ csr`` (cuSPARSE SpGEMM), for our number of iterations, on small generated graphs and the
  suite's files of at most ``SIMRANK_NODES`` nodes, each compared with NetworkX's SimRank.
* ``hits``: :func:`tuner.hits` as a user calls it (its default solver: thick-restart Lanczos on the GPU
  (:mod:`tuner.graph.lanczos`), or on graphs of fewer than ``DEVICE_MIN_NODES`` nodes ARPACK on the host, the
  products by A and Aᵀ on this GPU) against the same algorithm as CuPy offers it (its thick-restart Lanczos,
  ``eigsh``, on the GPU; ARPACK where ours ran ARPACK) with cuSPARSE's products, both from the same start.
* ``betweenness``: :func:`tuner.betweenness` on the GPU from ``BETWEENNESS_SOURCES`` sampled sources against
  a separately written batched Brandes on CuPy (cuSPARSE SpMM per BFS level, the levels kept as Brandes'
  stack), the same sources, each side in batches of as many as 1 GiB of its n x batch arrays holds. NetworkX's
  Brandes runs from the same sources up to ``NETWORKX_BETWEENNESS_NNZ`` edges; on a larger file ours runs
  again from ``NETWORKX_CHECK_SOURCES`` sources sampled the same way, and NetworkX from those (not on the
  generated graphs: NetworkX would take minutes to hold one).

Rows of (algorithm, graph) pairs a run does not redo are kept from the file it writes over (same GPU), so
that the algorithms, or some of the graphs, can be benched in separate runs.

Every time is wall seconds between device synchronisations; ``setup_s`` covers the host-to-device copies and
(ours) the plan, layout and compile.
"""
from __future__ import annotations

import contextlib
import functools
import itertools
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from unittest import mock

import numpy as np
import scipy.sparse as sp

from . import __version__, gpu, layouts, loaders
from .cache import cold_plans
from .graph.pagerank import ConvergenceError
from .graph.simrank import column_normalised

ALGORITHMS = ("pagerank", "rwr", "rwr_many", "hits", "betweenness", "simrank")
TOL = 1e-7  # per node: float32 ranks change by a few ulps of the largest rank (1e-8 at 0.1) at their fixed point
ALPHA = 0.85
NETWORKX_NNZ = 5_000_000  # NetworkX's PageRank takes seconds per million edges: compared up to here
SIMRANK_SUITE = ("rmat:10", "rmat:12")  # the generated SimRank rows; the suite's files of few nodes join them
# SimRank rows, and their comparison with NetworkX, on graphs of at most this many nodes (issue 36's bound):
# NetworkX iterates a dense n x n S, two products of n^3 an iteration (a minute on 16 cores at 8k nodes).
SIMRANK_NODES = 10_000
DEFAULT_GENERATED = ("rmat:20", "rmat:23", "rmat:25")
# The generated graphs of the HITS and betweenness rows (the suite's files all run): HITS stops at rmat:23
# (rmat:25 would add its generation and float64 copies of A and Aᵀ, 12.7 GB a side, to the bench's run); the
# CuPy Brandes's batch holds seven n x batch arrays, so its batches of rmat:23 would be of two sources
HITS_GENERATED = ("rmat:20", "rmat:23")
BETWEENNESS_GENERATED = ("rmat:20",)
BETWEENNESS_SOURCES = 64  # sampled sources (seed 0) of each betweenness row
RWR_SETS = 8  # the seed sets of an rwr_many row: one node each, drawn (seed 0) from the nodes with out-edges
REDUCE_ROWS = 1024  # rows of each block of cuSPARSE rwr_many's first reduction of the per-column changes
NETWORKX_BETWEENNESS_NNZ = 150_000  # NetworkX's Brandes in Python: about 0.1 s per source at 100k edges
# Beyond it, the sources of the check against NetworkX (ours run again from these alone): 0.4-1.9 s a source
# on the data folder's graphs of 0.4M to 3.2M edges
NETWORKX_CHECK_SOURCES = 4
KRONECKER = (("cnr-2000.npz", 4),)  # 260M entries: the Kronecker-scaled web graph the targets name
TARGET_ITERATIONS = 50  # the end-to-end run the targets are stated for
# A PageRank row's first runs (each side's a process's first at this size: pools emptied before each): the
# median of this many on graphs of up to FIRST_RUNS_NNZ edges, whose runs of a few milliseconds a single
# hiccup of the host doubles; one above, where a run takes long enough to be timed once
FIRST_RUNS = 5
FIRST_RUNS_NNZ = 5_000_000
# 1.2M edges (large enough for the device set-up paths of both sides) and 50k (the host paths of small graphs)
WARM_UP = ("rmat:16:20", "rmat:12")
SIMRANK_WARM_UP = "rmat:8"  # cuSPARSE's SimRank loops (ours warms up on the suite, plans thrown away)


@dataclass(frozen=True)
class GraphRow:
    """One (algorithm, graph); seconds unless named otherwise.

    Attributes:
        algorithm, name, nnz: what ran on which graph of how many edges.
        iterations: ours to the tolerance; cuSPARSE's loop ran as many.
        ours_s, cusparse_s: host matrix in to result out; speedup: cusparse_s / ours_s.
        ours_iter_ms, cusparse_iter_ms: per iteration, setup excluded.
        spmv_ms: our tuned SpMV of Aᵀ alone (PageRank, RWR), median of CUDA events.
        tuned_iter_ms, tuned_setup_s: the same iterations on the tuned product, and its setup (plan,
            relabelling, layout, compile and upload from a plan cache that has never seen the graph); None
            for SimRank. tuned_max_abs_diff: the largest difference between the two runs' results.
        setup_s, cusparse_setup_s: each side's setup (ours: upload, checks, transpose, out-weights and the
            resident kernel's chunks; cuSPARSE: upload, out-weights, transpose).
        ours_50_s, cusparse_50_s, speedup_50: each side's setup plus ``TARGET_ITERATIONS`` (50) of its
            measured iterations, the run issue 36's target names (computed from the two measured parts;
            None for SimRank).
        ours_repeat_s, cusparse_repeat_s: each side's end-to-end seconds when run again at once on the same
            graph (pools as the first runs left them; the median of as many runs as first runs; None for
            SimRank). ``ours_s`` and ``cusparse_s`` are a process's first run at this size (PageRank, RWR and HITS:
            the median of ``FIRST_RUNS`` such runs on graphs of up to ``FIRST_RUNS_NNZ`` edges, CuPy's pools
            emptied before each): CuPy copies a host array to the device through pinned memory of the
            array's size, allocated from its pinned pool (which keeps it for the next upload); ours copies
            through memory it locks once locking pays (:class:`~tuner.staging.StagingRental`).
        max_abs_diff_vs_networkx: against NetworkX in float64 (None where not run); max_abs_diff_vs_cusparse:
            against the cuSPARSE loop's result. networkx_how: what was compared with NetworkX where it is
            not the row's own result (betweenness: ours again from fewer of the same sources).
        cusparse_how: SimRank's cuSPARSE loop timed (the faster of its sparse S through SpGEMM and its dense
            S through SpMM, both run; then either that failed, and how), rwr_many's block, PageRank's and
            RWR's reductions (the faster of ``CUSPARSE_REDUCTIONS``, both run), HITS's solver.
        ours_how: what ours ran (SimRank: sparse, or dense from which iteration; rwr_many: the product kept,
            each walk's iterations and the same walks one call each); None for the others.
    """

    algorithm: str
    name: str
    nnz: int
    iterations: int
    ours_s: float
    cusparse_s: float
    speedup: float
    ours_iter_ms: float
    cusparse_iter_ms: float
    spmv_ms: float | None
    tuned_iter_ms: float | None
    tuned_setup_s: float | None
    tuned_max_abs_diff: float | None
    setup_s: float
    cusparse_setup_s: float
    ours_50_s: float | None
    cusparse_50_s: float | None
    speedup_50: float | None
    ours_repeat_s: float | None
    cusparse_repeat_s: float | None
    max_abs_diff_vs_networkx: float | None
    max_abs_diff_vs_cusparse: float
    cusparse_how: str | None = None
    ours_how: str | None = None
    networkx_how: str | None = None


def _sync():
    import cupy
    cupy.cuda.Device().synchronize()


def _empty_pool():
    """CuPy's pool handed back to the device before each side's run, so that each allocates as a fresh
    process would, not from blocks the other side's run left."""
    import cupy
    _sync()
    cupy.get_default_memory_pool().free_all_blocks()


def _empty_pinned_pool() -> None:
    """CuPy's pinned host memory handed back: CuPy's next copy of a large host array locks memory anew."""
    import cupy
    _sync()
    cupy.get_default_pinned_memory_pool().free_all_blocks()


def _fresh_staging() -> None:
    """CuPy's pinned host memory handed back and the staging rental started anew
    (:class:`~tuner.staging.StagingRental`): each row's first runs, ours and cuSPARSE's (CuPy locks host
    memory the size of a large array it copies), lock their buffers as a process's first call of that size
    does, whatever rows ran before."""
    from .formats import device_reorder
    from .staging import StagingRental
    _empty_pinned_pool()
    device_reorder.RENTAL = StagingRental()


def _as_a_first_run() -> None:
    """Before a first run, ours or cuSPARSE's: the device pool, CuPy's pinned host memory and our staging
    rental handed back (:func:`_fresh_staging`, :func:`_empty_pool`), so that the run allocates and locks
    memory as a process's first call of its size does."""
    _fresh_staging()
    _empty_pool()


@functools.cache
def _cusparse_update(cupy):
    """cuSPARSE PageRank's fused update: x_new, the next rank cache and each node's change in one kernel."""
    return cupy.ElementwiseKernel(
        "T pulled, T p, T inv, T x, T dangling_sum, float64 alpha", "T x_new, T cache, T change",
        "x_new = (T)(alpha * ((double)pulled + (double)dangling_sum * (double)p) + (1.0 - alpha) * (double)p);"
        "cache = x_new * inv; change = fabs(x_new - x)", "bench_cusparse_pagerank_update")


def _cusparse_pull(A, dtype):
    """(Aᵀ, 1 / out-weight with 0 where dangling, 1 where dangling else 0) on the GPU in ``dtype``, as a careful
    CuPy user makes them for a pull iteration: the graph uploaded as it is (no checks), out-weights summed and
    Aᵀ transposed there by cuSPARSE."""
    import cupy
    import cupyx.scipy.sparse as cpsp
    W = cpsp.csr_matrix(sp.csr_matrix(A).astype(dtype, copy=False))
    out = W.sum(axis=1).ravel()
    is_dangling = out == 0
    inv = cupy.where(is_dangling, 0, 1 / cupy.where(is_dangling, 1, out)).astype(dtype, copy=False)
    return W.T.tocsr(), inv, is_dangling.astype(dtype)


@functools.cache
def _cusparse_reductions(cupy):
    """(dangling sum, largest change) as CuPy reduction kernels into arrays kept: a launch with less host time
    than cuBLAS's dot and CuPy's ``max`` (its CUB reduction), but reduced in a few blocks, slow on large
    graphs (``CUSPARSE_REDUCTIONS``)."""
    dangling_sum = cupy.ReductionKernel("T x, T d", "T y", "x * d", "a + b", "y = (T)a", "0",
                                        "bench_cusparse_dangling_sum", reduce_type="double")
    largest = cupy.ReductionKernel("T x", "T y", "x", "max(a, b)", "y = a", "0", "bench_cusparse_largest")
    return dangling_sum, largest


# How cuSPARSE PageRank's loop reduces the dangling sum and the largest change: cuBLAS's dot and CuPy's max
# ('library'), or CuPy reduction kernels into arrays kept ('kernels'). Neither is faster on every graph (the
# host's time per call on small graphs, the reductions' blocks on large ones): a row times both, keeps the
# faster.
CUSPARSE_REDUCTIONS = ("library", "kernels")


def _median_run(runs: list, seconds) -> tuple:
    """The run of median ``seconds(run)`` (the later of the two middle ones of an even count).

    Example:
        >>> _median_run([("a", 3.0), ("b", 1.0), ("c", 2.0)], lambda run: run[1])
        ('c', 2.0)
    """
    return sorted(runs, key=seconds)[len(runs) // 2]


def cusparse_pagerank(A, iterations: int, p: np.ndarray, dtype=np.float32, reductions: str = "library"
                      ) -> tuple[np.ndarray, float, float]:
    """The pull iteration on cuSPARSE through CuPy for exactly ``iterations`` steps: (ranks, setup s,
    iterations s). ``p``: teleport and dangling distribution; ``reductions``: one of ``CUSPARSE_REDUCTIONS``.
    As a careful CuPy user writes it: the graph uploaded as it is (no checks), out-weights summed and Aᵀ
    transposed on the GPU by cuSPARSE; an iteration is cuSPARSE's SpMV of the rank cache through descriptors
    and work space made once (:class:`~tuner.graph.cusparse_products.CachedSpmv`; CuPy's ``@`` makes them
    at every call), the dangling sum, one fused kernel for the update, the next rank cache and each node's
    change into buffers kept, and the largest change, which stays on the device (the loop runs a known
    number of iterations: the host never waits inside it). CuPy refuses cuSPARSE calls in a stream capture,
    so the loop cannot be a CUDA graph."""
    import cupy

    from .graph.cusparse_products import CachedSpmv
    if reductions not in CUSPARSE_REDUCTIONS:
        raise ValueError(f"reductions must be one of {CUSPARSE_REDUCTIONS}, got {reductions!r}")
    t0 = time.perf_counter()
    At, inv, dangling = _cusparse_pull(A, dtype)
    At.has_canonical_format = True  # cuSPARSE's transpose of a canonical matrix (CuPy's check builds kernels)
    product = CachedSpmv(At)
    pv = cupy.asarray(p.astype(dtype))
    x = cupy.full(At.shape[0], 1.0 / At.shape[0], dtype)
    x_new, cache, pulled, change = (cupy.empty_like(x) for _ in range(4))
    dangling_sum, largest = cupy.empty((), dtype), cupy.empty((), dtype)
    update = _cusparse_update(cupy)
    sum_kernel, max_kernel = _cusparse_reductions(cupy)
    _sync()
    t1 = time.perf_counter()
    cupy.multiply(x, inv, out=cache)
    for _ in range(iterations):
        product(cache, pulled)
        if reductions == "kernels":
            sum_kernel(x, dangling, dangling_sum)
        else:
            dangling_sum = cupy.dot(x, dangling)
        update(pulled, pv, inv, x, dangling_sum, ALPHA, x_new, cache, change)
        x, x_new = x_new, x
        if reductions == "kernels":  # the stopping test's figure, left on the device
            max_kernel(change, largest)
        else:
            largest = change.max()
    float(largest)
    t2 = time.perf_counter()
    return cupy.asnumpy(x).astype(np.float64), t1 - t0, t2 - t1


def _networkx_graph(A):
    """(NetworkX, A as its DiGraph with float64 weights): the reference every row compares with."""
    import networkx as nx
    return nx, nx.from_scipy_sparse_array(sp.csr_matrix(A, dtype=np.float64), create_using=nx.DiGraph)


def _by_node(d: dict, n: int) -> np.ndarray:
    """A NetworkX result keyed by node 0 .. n - 1 as an array."""
    return np.array([d[i] for i in range(n)])


def _networkx_pagerank(A, p: np.ndarray | None) -> np.ndarray:
    nx, G = _networkx_graph(A)
    pers = None if p is None else {i: float(v) for i, v in enumerate(p) if v}
    return _by_node(nx.pagerank(G, alpha=ALPHA, personalization=pers, tol=1e-13, max_iter=10_000), A.shape[0])


def bench_pagerank(source: str, algorithm: str, dtype=np.float32) -> GraphRow:
    """One PageRank ('pagerank') or random walk with restart ('rwr') row."""
    from .distributed.nccl import SoloDevice
    from .distributed.pagerank import pagerank_on_devices, pull_product
    from .graph import pagerank
    A = abs(loaders.load(source))  # edge weights are magnitudes (the finite-element controls have signs)
    n = A.shape[0]
    p = np.full(n, 1.0 / n)
    if algorithm == "rwr":
        seeds = np.argsort(-np.diff(A.indptr), kind="stable")[:3]
        p = np.zeros(n)
        p[seeds] = 1.0 / 3
    repeats = FIRST_RUNS if A.nnz <= FIRST_RUNS_NNZ else 1

    def ours_first():
        _as_a_first_run()
        t0 = time.perf_counter()
        x, info = pagerank(A, alpha=ALPHA, personalization=p, tol=TOL, tol_rule="per_node", max_iter=1000,
                           backend="device", dtype=dtype, return_info=True)
        return x, info, time.perf_counter() - t0

    x, info, ours = _median_run([ours_first() for _ in range(repeats)], lambda run: run[2])

    # Each side again at once on the same graph (as many runs as first runs, the median), its pools (device and
    # pinned host memory) as its first runs left them: a repeated call in one process, where a first run is a
    # process's first call of this size.
    def ours_again():
        t0 = time.perf_counter()
        pagerank(A, alpha=ALPHA, personalization=p, tol=TOL, tol_rule="per_node", max_iter=1000, backend="device",
                 dtype=dtype)
        return time.perf_counter() - t0

    ours_repeat = float(np.median([ours_again() for _ in range(repeats)]))
    solo = SoloDevice()
    with cold_plans() as cold:  # a graph new to this machine: planned and laid out from scratch
        t0 = time.perf_counter()
        product = pull_product(A, solo, dtype=dtype, cache_dir=cold)
        tuned_setup = time.perf_counter() - t0
        x_tuned, tuned = pagerank_on_devices(A, solo, alpha=ALPHA, personalization=p, tol=TOL, tol_rule="per_node",
                                             max_iter=1000, product=product, return_info=True)
        layouts.wait()
    spmv_ms = product.local.time() if product.local is not None else None
    del product

    def cusparse_first(reductions):  # a process's first run at this size, as ours were
        _as_a_first_run()
        return cusparse_pagerank(A, info.iterations, p, dtype, reductions)

    timed = {r: _median_run([cusparse_first(r) for _ in range(repeats)], lambda run: run[1] + run[2])
             for r in CUSPARSE_REDUCTIONS}
    fastest = min(timed, key=lambda r: timed[r][2])  # the same setup's code: the faster loop
    ref_cu, cu_setup, cu_iter = timed[fastest]
    cu_again = float(np.median([sum(cusparse_pagerank(A, info.iterations, p, dtype, fastest)[1:])
                                for _ in range(repeats)]))
    ref_nx = _networkx_pagerank(A, None if algorithm == "pagerank" else p) if A.nnz <= NETWORKX_NNZ else None
    setup, per_iter = info.seconds["setup"], info.seconds["iterations"] / info.iterations
    ours_n, cu_n = setup + TARGET_ITERATIONS * per_iter, cu_setup + TARGET_ITERATIONS * cu_iter / info.iterations
    return GraphRow(
        algorithm=algorithm, name=loaders.display_name(source), nnz=int(A.nnz), iterations=info.iterations,
        ours_s=ours, cusparse_s=cu_setup + cu_iter, speedup=(cu_setup + cu_iter) / ours,
        ours_iter_ms=1e3 * per_iter, cusparse_iter_ms=1e3 * cu_iter / info.iterations, spmv_ms=spmv_ms,
        tuned_iter_ms=1e3 * tuned.seconds["iterations"] / tuned.iterations,
        tuned_setup_s=tuned_setup + tuned.seconds["setup"], tuned_max_abs_diff=float(np.abs(x_tuned - x).max()),
        setup_s=setup, cusparse_setup_s=cu_setup, ours_50_s=ours_n, cusparse_50_s=cu_n, speedup_50=cu_n / ours_n,
        ours_repeat_s=ours_repeat, cusparse_repeat_s=cu_again,
        max_abs_diff_vs_networkx=None if ref_nx is None else float(np.abs(x - ref_nx).max()),
        max_abs_diff_vs_cusparse=float(np.abs(x - ref_cu).max()),
        cusparse_how=f"SpMV with descriptors kept, reductions by {fastest} (the faster; "
                     + ", ".join(f"{r}: {1e3 * timed[r][2] / info.iterations:.4f} ms an iteration after "
                                 f"{timed[r][1]:.4f} s of setup" for r in CUSPARSE_REDUCTIONS) + ")")


def cusparse_rwr_many(A, P: np.ndarray, iterations: int) -> tuple[np.ndarray, float, float]:
    """Random walks with restart for every column of ``P`` on cuSPARSE through CuPy, float64, the whole block
    for exactly ``iterations`` steps: (probabilities, setup s, iterations s). As a careful CuPy user writes it:
    the graph uploaded as it is, out-weights summed and Aᵀ transposed on the GPU; every block row-major (the
    order in which cuSPARSE's SpMM reads a block's row contiguously for each entry of Aᵀ), an iteration is
    cuSPARSE's SpMM of the block of rank caches through descriptors made once
    (:class:`~tuner.graph.cusparse_products.CachedSpmm`: CuPy's ``@`` would convert the block to column-major
    and make them at every call), cuBLAS's product for the columns' dangling sums, one fused kernel for the
    update, the next caches and each entry's change into buffers kept, and the largest change per column,
    which stays on the device, in two reductions over blocks of ``REDUCE_ROWS`` rows (CuPy reduces a column
    of a few outputs in a block each: a few blocks for millions of rows)."""
    import cupy

    from .graph.cusparse_products import CachedSpmm
    t0 = time.perf_counter()
    At, inv, dangling = _cusparse_pull(A, np.float64)
    At.has_canonical_format = True  # cuSPARSE's transpose of a canonical matrix (CuPy's check builds kernels)
    product = CachedSpmm(At)
    inv = inv[:, None]
    pv = cupy.asarray(P, dtype=np.float64)
    x = cupy.full(P.shape, 1.0 / P.shape[0])
    x_new, cache, pulled = (cupy.empty_like(x) for _ in range(3))
    n, k = P.shape
    changes = cupy.zeros((-(-n // REDUCE_ROWS) * REDUCE_ROWS, k))  # rows past n stay 0: no change's maximum
    change = changes[:n]
    update = _cusparse_update(cupy)
    _sync()
    t1 = time.perf_counter()
    cupy.multiply(x, inv, out=cache)
    for _ in range(iterations):
        product(cache, pulled)
        update(pulled, pv, inv, x, (dangling @ x)[None, :], ALPHA, x_new, cache, change)
        x, x_new = x_new, x
        largest = changes.reshape(-1, REDUCE_ROWS, k).max(axis=1).max(axis=0)  # the stopping test's figures
    largest.get()
    t2 = time.perf_counter()
    return cupy.asnumpy(x), t1 - t0, t2 - t1


def bench_rwr_many(source: str) -> GraphRow:
    """One row of ``RWR_SETS`` random walks with restart at once (float64, per-node tolerance): ours walk
    together (:func:`tuner.graph.rwr_block`), cuSPARSE's block runs our longest walk's iterations; ``ours_how``
    also gives the same walks run one by one."""
    from .graph import rwr
    A = abs(loaders.load(source))
    n = A.shape[0]
    sets = [[int(v)] for v in np.random.default_rng(0).choice(np.flatnonzero(np.diff(A.indptr)), RWR_SETS,
                                                              replace=False)]
    P = np.zeros((n, RWR_SETS))
    P[[s[0] for s in sets], np.arange(RWR_SETS)] = 1.0

    def ours_run():
        t0 = time.perf_counter()
        x, infos = rwr(A, sets, restart=1 - ALPHA, tol=TOL, tol_rule="per_node", max_iter=1000, backend="device",
                       return_info=True)
        return x, infos, time.perf_counter() - t0
    _empty_pool()
    x, infos, ours = ours_run()
    iterations = max(i.iterations for i in infos)
    _empty_pool()
    ref_cu, cu_setup, cu_iter = cusparse_rwr_many(A, P, iterations)
    _, _, ours_repeat = ours_run()
    _, cu_setup_again, cu_iter_again = cusparse_rwr_many(A, P, iterations)
    t0 = time.perf_counter()
    for s in sets:
        rwr(A, s, restart=1 - ALPHA, tol=TOL, tol_rule="per_node", max_iter=1000, backend="device")
    one_by_one = time.perf_counter() - t0
    ref_nx = _networkx_pagerank(A, P[:, 0]) if A.nnz <= NETWORKX_NNZ else None
    setup = infos[0].seconds["setup"]
    return GraphRow(
        algorithm="rwr_many", name=loaders.display_name(source), nnz=int(A.nnz), iterations=iterations,
        ours_s=ours, cusparse_s=cu_setup + cu_iter, speedup=(cu_setup + cu_iter) / ours,
        ours_iter_ms=1e3 * infos[0].seconds["iterations"] / iterations, cusparse_iter_ms=1e3 * cu_iter / iterations,
        spmv_ms=None, tuned_iter_ms=None, tuned_setup_s=None, tuned_max_abs_diff=None, setup_s=setup,
        cusparse_setup_s=cu_setup, ours_50_s=None, cusparse_50_s=None, speedup_50=None, ours_repeat_s=ours_repeat,
        cusparse_repeat_s=cu_setup_again + cu_iter_again,
        max_abs_diff_vs_networkx=None if ref_nx is None else float(np.abs(x[:, 0] - ref_nx).max()),
        max_abs_diff_vs_cusparse=float(np.abs(x - ref_cu).max()),
        cusparse_how=f"{RWR_SETS} columns, cuSPARSE SpMM, {iterations} iterations for all",
        ours_how=(f"{infos[0].backend}; iterations per walk {sorted(i.iterations for i in infos)}; "
                  f"the same walks one by one: {one_by_one:.4f} s"))


def _warm_up(algorithms=ALGORITHMS, dtype=np.float32, simrank_graphs=SIMRANK_SUITE) -> None:
    """Every path a row of ``algorithms`` times, once on each warm-up graph (SimRank: each of
    ``simrank_graphs``, then one small graph for cuSPARSE's loops), unrecorded (no NetworkX)."""
    import cupy

    from .distributed.nccl import SoloDevice
    from .distributed.pagerank import pagerank_on_devices, pull_product
    from .graph import betweenness, hits, pagerank, resident, simrank
    if "simrank" in algorithms:
        # Each SimRank graph once, its plans thrown away (a cold plan cache over the compiled binaries): the
        # SpGEMM variants its products choose, the dense iterations' kernels, built and cached as on a machine
        # that has run SimRank before; its rows then plan from a cold plan cache.
        with cold_plans() as cold, mock.patch.dict(os.environ, {"TUNER_CACHE_DIR": str(cold)}):
            for source in simrank_graphs:
                simrank(abs(loaders.load(source)), backend="tuned")
        A = abs(loaders.load(SIMRANK_WARM_UP))
        cusparse_simrank(A, 2)
        cusparse_simrank_dense(A, 2)
    for source in WARM_UP if {"hits", "betweenness"} & set(algorithms) else ():
        A = abs(loaders.load(source))
        if "hits" in algorithms:
            weighted = A.copy()
            weighted.data = np.random.default_rng(0).uniform(0.5, 2.0, A.nnz)
            # both solvers' kernels built (CuPy's on a machine's first use), for pattern and weighted graphs
            for graph, on_device in itertools.product((A, weighted), (True, False)):
                hits(graph, nstart=np.ones(A.shape[0]), backend="device" if on_device else "tuned")
                cusparse_hits(graph, np.ones(A.shape[0]), on_device)
            # The restarts of a basis, which a graph of close singular values needs (the warm-up graph
            # converges in one basis of 20 to the last bit, so CuPy's restart, whose update builds kernels of
            # its own, runs with a basis of 3), and the cuSPARSE side's flip of a Ritz vector that came out
            # negative (numpy's eigh sets its sign).
            with contextlib.suppress(ConvergenceError):
                hits(A, nstart=np.ones(A.shape[0]), backend="device", tol=1e-30, max_iter=3)
            with contextlib.suppress(ConvergenceError):
                cusparse_hits(A, np.ones(A.shape[0]), True, max_iter=3, tol=1e-30, vectors=3)
            cupy.negative(cupy.ones(A.shape[0]))
        if "betweenness" in algorithms:
            betweenness(A, k=4, seed=0, backend="device")
            cusparse_betweenness(A, np.arange(4), 4)
    if "rwr_many" in algorithms:
        from .graph import rwr
        A = abs(loaders.load(WARM_UP[1]))
        P = np.zeros((A.shape[0], RWR_SETS))
        P[np.arange(RWR_SETS), np.arange(RWR_SETS)] = 1.0
        weighted = A.copy()
        weighted.data = np.random.default_rng(0).uniform(0.5, 2.0, A.nnz)
        # every product candidate, a narrowed block, a weighted graph's device checks and out-weights, and the
        # float64 resident kernel of the walks one by one
        for graph in (A, weighted, abs(loaders.load(WARM_UP[0]))):
            rwr(graph, [[i] for i in range(RWR_SETS)], backend="device", tol=TOL)
            rwr(graph, 0, backend="device", tol=TOL)
        cusparse_rwr_many(A, P, 3)
    for source in WARM_UP if {"pagerank", "rwr"} & set(algorithms) else ():
        A = abs(loaders.load(source))
        weighted = A.copy()
        weighted.data = np.random.default_rng(0).uniform(0.5, 2.0, A.nnz).astype(A.dtype)
        for graph, relabel in itertools.product((A, weighted), (False, True)):
            # the resident kernel of a pattern and of a weighted graph, in the caller's numbering and in the
            # large graphs' out-degree order (its permutations' CuPy kernels built on a machine's first use)
            with mock.patch.object(resident, "relabel_pays", return_value=relabel):
                pagerank(graph, backend="device", dtype=dtype, personalization=np.full(A.shape[0], 1.0 / A.shape[0]))
        solo = SoloDevice()
        with cold_plans() as cold:
            pagerank_on_devices(A, solo, dtype=dtype, product=pull_product(A, solo, dtype=dtype, cache_dir=cold))
        for reductions in CUSPARSE_REDUCTIONS:
            cusparse_pagerank(A, 3, np.full(A.shape[0], 1.0 / A.shape[0]), dtype, reductions)


def cusparse_simrank(A, iterations: int, c: float = 0.9) -> tuple[sp.csr_matrix, float, float]:
    """SimRank's two products an iteration through CuPy's ``csr @ csr`` (cuSPARSE SpGEMM), float64, S copied to
    the host at the end: (S, setup s, iterations s)."""
    import cupyx.scipy.sparse as cpsp
    t0 = time.perf_counter()
    W = cpsp.csr_matrix(column_normalised(A))
    Wt = W.T.tocsr()
    n = W.shape[0]
    eye = cpsp.identity(n, format="csr", dtype=np.float64)
    S = eye
    _sync()
    t1 = time.perf_counter()
    for _ in range(iterations):
        S = c * ((Wt @ S) @ W)
        S = (S - cpsp.diags(S.diagonal()) + eye).tocsr()
    result = S.get()  # the result out, as ours
    t2 = time.perf_counter()
    return result, t1 - t0, t2 - t1


def cusparse_simrank_dense(A, iterations: int, c: float = 0.9) -> tuple[sp.csr_matrix, float, float]:
    """SimRank on a dense S through CuPy's ``csr @ dense`` (cuSPARSE SpMM), float64: T = Wᵀ S, then
    S = c Wᵀ Tᵀ with the unit diagonal, as :mod:`tuner.graph.dense_simrank` iterates; S out as the SciPy CSR
    matrix ours returns (cuSPARSE's dense-to-CSR on the device, then the copy), so both sides time the same
    result."""
    import cupy
    import cupyx.cusparse
    import cupyx.scipy.sparse as cpsp
    t0 = time.perf_counter()
    Wt = cpsp.csr_matrix(column_normalised(A).T.tocsr())
    S = cupy.eye(Wt.shape[0], dtype=np.float64)
    _sync()
    t1 = time.perf_counter()
    for _ in range(iterations):
        T = Wt @ S
        S = Wt @ cupy.ascontiguousarray(T.T)
        S *= c
        cupy.fill_diagonal(S, 1.0)
    result = cupyx.cusparse.denseToSparse(S, format="csr").get()
    t2 = time.perf_counter()
    return result, t1 - t0, t2 - t1


def networkx_simrank(A) -> np.ndarray:
    """NetworkX's SimRank of every pair of A's nodes (its defaults), as the dense array it iterates: the NumPy
    iteration ``networkx.simrank_similarity`` runs before it turns the array into a dict of dicts (n² Python
    floats, gigabytes at 8k nodes); that dict where a NetworkX lacks the iteration by its name.

    Example:
        >>> A = sp.csr_matrix(np.array([[0, 1, 1], [0, 0, 0], [0, 0, 0]], dtype=float))  # 0 -> 1, 0 -> 2
        >>> networkx_simrank(A).round(2).tolist()
        [[1.0, 0.0, 0.0], [0.0, 1.0, 0.9], [0.0, 0.9, 1.0]]
    """
    nx, G = _networkx_graph(A)
    try:
        from networkx.algorithms.similarity import _simrank_similarity_numpy
    except ImportError:
        d = nx.simrank_similarity(G)
        return np.array([_by_node(d[i], A.shape[0]) for i in range(A.shape[0])])
    return np.asarray(_simrank_similarity_numpy(G))


def simrank_suite(suite: list[str]) -> list[str]:
    """The SimRank rows' graphs: ``SIMRANK_SUITE`` and the files of ``suite`` of at most ``SIMRANK_NODES``
    nodes (its generated graphs are far larger).

    Example:
        >>> simrank_suite(["rmat:20"])
        ['rmat:10', 'rmat:12']
    """
    files = [s for s in suite if not s.startswith(("rmat:", "kron:"))]
    return list(SIMRANK_SUITE) + [s for s in files if _nodes(s) <= SIMRANK_NODES]


def _nodes(source: str) -> int:
    """A graph's node count from its file's header (:func:`~tuner.loaders.estimate`), or from the graph where
    the header does not say (an edge list).

    Example:
        >>> _nodes("rmat:9")
        512
    """
    n = loaders.estimate(source).n_rows
    return loaders.load(source).shape[0] if n is None else n


def bench_simrank(source: str) -> GraphRow:
    from .graph import simrank
    A = abs(loaders.load(source))
    _empty_pool()
    t0 = time.perf_counter()
    S, info = simrank(A, backend="tuned", return_info=True)
    ours = time.perf_counter() - t0
    # The careful cuSPARSE SimRank is the faster of its two formulations (both run the same iterations), of
    # those that run: cuSPARSE's SpGEMM refuses the products of an S that has filled in on a mesh
    # (CUSPARSE_STATUS_INSUFFICIENT_RESOURCES on bcsstk16), which the row says.
    from cupy.cuda.memory import OutOfMemoryError
    from cupy_backends.cuda.libs.cusparse import CuSparseError
    loops, failed = {}, []
    for name, fn in (("SpGEMM, sparse S", cusparse_simrank), ("SpMM, dense S", cusparse_simrank_dense)):
        _empty_pool()
        try:
            loops[name] = fn(A, info.iterations)
        except (CuSparseError, OutOfMemoryError) as e:
            failed.append(f"{name} failed: {e}")
    if not loops:
        raise RuntimeError(f"no cuSPARSE SimRank ran on {source}: {'; '.join(failed)}")
    how = min(loops, key=lambda k: loops[k][1] + loops[k][2])
    ref_cu, cu_setup, cu_iter = loops[how]
    nx_diff = float(np.abs(S.toarray() - networkx_simrank(A)).max()) if A.shape[0] <= SIMRANK_NODES else None
    return GraphRow(
        algorithm="simrank", name=loaders.display_name(source), nnz=int(A.nnz), iterations=info.iterations,
        ours_s=ours, cusparse_s=cu_setup + cu_iter, speedup=(cu_setup + cu_iter) / ours,
        ours_iter_ms=1e3 * ours / info.iterations, cusparse_iter_ms=1e3 * cu_iter / info.iterations, spmv_ms=None,
        tuned_iter_ms=None, tuned_setup_s=None, tuned_max_abs_diff=None, setup_s=0.0, cusparse_setup_s=cu_setup,
        ours_50_s=None, cusparse_50_s=None, speedup_50=None,
        ours_repeat_s=None, cusparse_repeat_s=None, max_abs_diff_vs_networkx=nx_diff,
        max_abs_diff_vs_cusparse=float(abs(S - ref_cu).max()), cusparse_how="; ".join([how] + failed),
        ours_how=info.backend)


def cusparse_hits(A, start: np.ndarray, on_device: bool, max_iter: int = 100, tol: float = 1e-8,
                  vectors: int | None = None):
    """NetworkX's HITS with every product by A and Aᵀ on cuSPARSE through CuPy, float64, by the solver
    :func:`tuner.hits` ran (``on_device``: Lanczos on the device, CuPy's own (:func:`cupy_authorities`) with a
    basis of ``vectors``, default ``LANCZOS_VECTORS``; else ARPACK on the host): ((hubs, authorities),
    products, setup s, iterations s)."""
    import cupy
    import cupyx.scipy.sparse as cpsp
    from scipy.sparse.linalg import LinearOperator, svds

    from .graph.cusparse_products import CachedSpmv
    from .graph.hits import LANCZOS_VECTORS
    t0 = time.perf_counter()
    forward = cpsp.csr_matrix(sp.csr_matrix(A, dtype=np.float64))
    backward = forward.T.tocsr()
    backward.has_canonical_format = True  # cuSPARSE's transpose of a canonical matrix
    # Each product through descriptors kept, from a vector kept where the solver hands over new arrays (the
    # forward products' inputs); cupy_authorities hands the backward product its own fixed y alone.
    by_forward, by_backward = CachedSpmv(forward), CachedSpmv(backward)
    given = cupy.empty(A.shape[0])
    _sync()
    t1 = time.perf_counter()

    def product(spmv):
        def run(v, out):
            given[...] = v
            spmv(given, out)
        return run

    if on_device:
        a, products = cupy_authorities(product(by_forward), by_backward, A.shape[0], start, max_iter, tol,
                                       np.float64, vectors or LANCZOS_VECTORS)
        h = cupy.empty_like(a)
        by_forward(a, h)
        h, a = (h / h.sum()).get(), (a / a.sum()).get()
        _sync()
        return (h, a), products + 1, t1 - t0, time.perf_counter() - t1
    calls = [0]
    result = cupy.empty(A.shape[0])

    def through(spmv):
        def run(v):
            calls[0] += 1
            given.set(np.ascontiguousarray(np.ravel(v), dtype=np.float64))
            spmv(given, result)
            return result.get()
        return run
    n = A.shape[0]
    op = LinearOperator((n, n), matvec=through(by_forward), rmatvec=through(by_backward), dtype=np.float64)
    _, _, vt = svds(op, k=1, v0=start, maxiter=max_iter, tol=tol)
    a = vt.ravel().real
    h = through(by_forward)(a)
    t2 = time.perf_counter()
    return (h / h.sum(), a / a.sum()), calls[0], t1 - t0, t2 - t1


def cupy_authorities(forward, backward, n: int, start, max_iter: int, tol: float, dtype, vectors: int):
    """:func:`~tuner.graph.hits.device_authorities` as a careful CuPy user writes it: CuPy's thick-restart
    Lanczos (``cupyx.scipy.sparse.linalg.eigsh``, ``vectors`` of basis, ``max_iter`` restarts of it) on a
    LinearOperator of Aᵀ A, the same start, stopping rule and ConvergenceError: (authorities, products)."""
    import cupy
    from cupyx.scipy.sparse.linalg import LinearOperator, eigsh

    from .graph.hits import _total
    dtype = np.dtype(dtype)
    y, u = cupy.empty(n, dtype), cupy.empty(n, dtype)
    calls = [0]

    def normal(v):  # Aᵀ A v: eigsh copies the result out of u before the next call; backward gets y alone
        calls[0] += 1
        forward(cupy.ascontiguousarray(v), y)
        backward(y, u)
        return u
    v0 = cupy.ones(n, dtype) if start is None else cupy.asarray(start, dtype=dtype)
    forward(v0, y)
    limit = tol * _total(y, y) / _total(v0, v0)  # relative to the start's Rayleigh quotient
    most = max_iter * vectors  # CuPy counts products, ARPACK restarts
    w, x = eigsh(LinearOperator((n, n), matvec=normal, dtype=dtype), k=1, which="LA", v0=v0, ncv=vectors,
                 maxiter=most, tol=limit)
    a, lam = cupy.ascontiguousarray(x[:, 0]), float(w[0])
    if calls[0] >= most:  # stopped by the limit: converged only if the residual says so
        r = normal(a) - lam * a
        residual = _total(r, r) ** 0.5
        if residual > max(limit, 64 * np.finfo(dtype).eps * abs(lam)):
            raise ConvergenceError(f"HITS: CuPy's Lanczos did not converge in {max_iter} restarts (tol {tol})")
    if _total(a) < 0:
        a = -a
    return a, 2 * calls[0] + 1


def bench_hits(source: str) -> GraphRow:
    """One HITS row: both sides from ARPACK's start of all ones (its own start is random); each side's time
    the median of ``FIRST_RUNS`` first runs on graphs of up to ``FIRST_RUNS_NNZ`` edges, as PageRank's."""
    from .graph import hits
    A = abs(loaders.load(source))
    n = A.shape[0]
    start = np.ones(n)
    repeats = FIRST_RUNS if A.nnz <= FIRST_RUNS_NNZ else 1

    def ours_first():
        _as_a_first_run()
        t0 = time.perf_counter()
        (h, a), info = hits(A, nstart=start, return_info=True)
        return h, a, info, time.perf_counter() - t0

    h, a, info, ours = _median_run([ours_first() for _ in range(repeats)], lambda run: run[3])
    on_device = info.backend.startswith("device")

    def cusparse_first():  # a process's first run at this size, as ours were
        _as_a_first_run()
        return cusparse_hits(A, start, on_device)

    (h_cu, a_cu), cu_products, cu_setup, cu_iter = _median_run([cusparse_first() for _ in range(repeats)],
                                                               lambda run: run[2] + run[3])
    nx_diff = None
    if A.nnz <= NETWORKX_NNZ:
        nx, G = _networkx_graph(A)
        hubs, authorities = nx.hits(G)
        nx_diff = max(float(np.abs(h - _by_node(hubs, n)).max()), float(np.abs(a - _by_node(authorities, n)).max()))
    setup = info.seconds["setup"]
    return GraphRow(
        algorithm="hits", name=loaders.display_name(source), nnz=int(A.nnz), iterations=info.iterations,
        ours_s=ours, cusparse_s=cu_setup + cu_iter, speedup=(cu_setup + cu_iter) / ours,
        ours_iter_ms=1e3 * info.seconds["iterations"] / info.iterations, cusparse_iter_ms=1e3 * cu_iter / cu_products,
        spmv_ms=None, tuned_iter_ms=None, tuned_setup_s=None, tuned_max_abs_diff=None, setup_s=setup,
        cusparse_setup_s=cu_setup, ours_50_s=None, cusparse_50_s=None, speedup_50=None, ours_repeat_s=None,
        cusparse_repeat_s=None, max_abs_diff_vs_networkx=nx_diff,
        max_abs_diff_vs_cusparse=max(float(np.abs(h - h_cu).max()), float(np.abs(a - a_cu).max())),
        cusparse_how=(f"{'Lanczos on the GPU (CuPy eigsh)' if on_device else 'ARPACK on the host'}, cuSPARSE "
                      f"products ({cu_products})"), ours_how=info.backend)


def cusparse_betweenness(A, sources: np.ndarray, batch: int) -> tuple[np.ndarray, float, float]:
    """Brandes' betweenness from ``sources`` (NetworkX's scaling for sampled sources, endpoints left out),
    ``batch`` sources per level-synchronous BFS on CuPy: each level one cuSPARSE SpMM of the graph by the
    n x batch frontier, the levels' frontiers kept as Brandes' stack for the backward sweep: (centrality,
    setup s, run s)."""
    import cupy
    import cupyx.scipy.sparse as cpsp

    from .graph.betweenness import _rescale
    t0 = time.perf_counter()
    P = sp.csr_matrix(A, dtype=np.float64)
    P.sum_duplicates()
    P.data[:] = 1.0
    forward = cpsp.csr_matrix(P)
    backward = forward.T.tocsr()
    _sync()
    t1 = time.perf_counter()
    n = A.shape[0]
    bc = cupy.zeros(n)
    for lo in range(0, sources.size, batch):
        src = cupy.asarray(sources[lo:lo + batch])
        cols = cupy.arange(src.size)
        sigma = cupy.zeros((n, src.size))
        sigma[src, cols] = 1.0
        seen = sigma > 0
        stack = [seen.copy()]
        frontier = sigma.copy()
        while True:
            reached = backward @ frontier
            reached *= ~seen
            new = reached > 0
            if not bool(new.any()):
                break
            seen |= new
            sigma += reached
            stack.append(new)
            frontier = reached
        delta = cupy.zeros((n, src.size))
        safe = cupy.where(sigma > 0, sigma, 1.0)
        for d in range(len(stack) - 1, 0, -1):
            coef = cupy.where(stack[d], (1.0 + delta) / safe, 0.0)
            delta += stack[d - 1] * sigma * (forward @ coef)
        bc += (delta * (seen & ~stack[0])).sum(axis=1)
    out = _rescale(bc.get(), n, True, False, sources)
    t2 = time.perf_counter()
    return out, t1 - t0, t2 - t1


def bench_betweenness(source: str) -> GraphRow:
    """One betweenness row: ``BETWEENNESS_SOURCES`` sources sampled as NetworkX samples them (seed 0)."""
    from .graph import betweenness
    from .graph.betweenness import BATCH_BYTES, NODE_SOURCE_BYTES, _sources
    A = abs(loaders.load(source))
    n = A.shape[0]
    k = min(BETWEENNESS_SOURCES, n)
    _empty_pool()
    t0 = time.perf_counter()
    bc, info = betweenness(A, k=k, seed=0, backend="device", return_info=True)
    ours = time.perf_counter() - t0
    sources, _ = _sources(n, k, 0)
    _empty_pool()
    batch = max(1, min(k, BATCH_BYTES // (NODE_SOURCE_BYTES * n)))  # its seven n x batch arrays, as the host's
    ref_cu, cu_setup, cu_run = cusparse_betweenness(A, sources, batch)
    nx_diff = nx_how = None
    if A.nnz <= NETWORKX_BETWEENNESS_NNZ or not source.startswith(("rmat:", "kron:")):
        # Beyond NETWORKX_BETWEENNESS_NNZ edges, ours again from fewer sources, sampled as NetworkX samples
        # them (seed 0): its Brandes takes seconds a source there.
        few = k if A.nnz <= NETWORKX_BETWEENNESS_NNZ else min(NETWORKX_CHECK_SOURCES, k)
        checked = bc if few == k else betweenness(A, k=few, seed=0, backend="device")
        nx, G = _networkx_graph(A)
        nx_diff = float(np.abs(checked - _by_node(nx.betweenness_centrality(G, k=few, seed=0), n)).max())
        nx_how = None if few == k else f"ours again from {few} sources (seed 0), NetworkX from the same"
    return GraphRow(
        algorithm="betweenness", name=loaders.display_name(source), nnz=int(A.nnz), iterations=info.iterations,
        ours_s=ours, cusparse_s=cu_setup + cu_run, speedup=(cu_setup + cu_run) / ours,
        ours_iter_ms=1e3 * info.seconds["iterations"] / max(info.iterations, 1),
        cusparse_iter_ms=1e3 * cu_run / max(info.iterations, 1), spmv_ms=None, tuned_iter_ms=None,
        tuned_setup_s=None, tuned_max_abs_diff=None, setup_s=info.seconds["setup"], cusparse_setup_s=cu_setup,
        ours_50_s=None, cusparse_50_s=None, speedup_50=None, ours_repeat_s=None, cusparse_repeat_s=None,
        max_abs_diff_vs_networkx=nx_diff, max_abs_diff_vs_cusparse=float(np.abs(bc - ref_cu).max()),
        cusparse_how=f"batched Brandes on CuPy (cuSPARSE SpMM), {k} sources", ours_how=info.backend,
        networkx_how=nx_how)


def default_suite(data_dir=None) -> list[str]:
    """The data folder's graphs, three R-MAT graphs and, where the folder has its graph, a Kronecker-scaled one.

    Example:
        >>> default_suite("/nonexistent")
        ['rmat:20', 'rmat:23', 'rmat:25']
    """
    real = loaders.real_matrices(data_dir)
    by_name = {p.name: p for p in real}
    kron = [f"kron:{by_name[n]}:{k}" for n, k in KRONECKER if n in by_name]
    return [str(p) for p in real] + list(DEFAULT_GENERATED) + kron


def format_table(rows: list[GraphRow]) -> str:
    lines = [f"{'algorithm':<9} {'graph':<24}{'nnz':>12}{'iters':>6}{'ours s':>9}{'cuSPARSE s':>11}{'x':>6}"
             f"{'ours it ms':>11}{'cuSP it ms':>11}{'spmv ms':>8}{'tuned it':>9}{'x at 50':>8}{'x again':>8}"
             f"{'vs nx':>9}"]
    for r in rows:
        nx_diff = "-" if r.max_abs_diff_vs_networkx is None else f"{r.max_abs_diff_vs_networkx:.1e}"
        spmv = "-" if r.spmv_ms is None else f"{r.spmv_ms:.3f}"
        at_50 = "-" if r.speedup_50 is None else f"{r.speedup_50:.2f}"
        tuned_it = "-" if r.tuned_iter_ms is None else f"{r.tuned_iter_ms:.3f}"
        again = "-" if r.ours_repeat_s is None else f"{r.cusparse_repeat_s / r.ours_repeat_s:.2f}"
        lines.append(f"{r.algorithm:<9} {r.name[:24]:<24}{r.nnz:>12,}{r.iterations:>6}{r.ours_s:>9.2f}"
                     f"{r.cusparse_s:>11.2f}{r.speedup:>6.2f}{r.ours_iter_ms:>11.3f}{r.cusparse_iter_ms:>11.3f}"
                     f"{spmv:>8}{tuned_it:>9}{at_50:>8}{again:>8}{nx_diff:>9}")
    return "\n".join(lines)


def run(suite: list[str], out: Path, command: str, progress=None, algorithms=ALGORITHMS) -> list[GraphRow]:
    """Every row of the suite (PageRank and RWR per graph, HITS and betweenness on its files and some of its
    generated graphs, then SimRank's; those of ``algorithms``), written to ``out`` after each, with the rows of
    other algorithms that ``out`` holds from a run on the same GPU."""
    unknown = sorted(set(algorithms) - set(ALGORITHMS))
    if unknown:
        raise ValueError(f"unknown algorithms {unknown}: choose from {list(ALGORITHMS)}")
    jobs = [(a, bench_pagerank, (s, a)) for s in suite for a in ("pagerank", "rwr") if a in algorithms]
    jobs += [("rwr_many", bench_rwr_many, (s,)) for s in suite if "rwr_many" in algorithms]
    for algorithm, fn, generated in (("hits", bench_hits, HITS_GENERATED),
                                     ("betweenness", bench_betweenness, BETWEENNESS_GENERATED)):
        if algorithm in algorithms:
            jobs += [(algorithm, fn, (s,)) for s in suite if s in generated or not s.startswith(("rmat:", "kron:"))]
    simrank_graphs = simrank_suite(suite) if "simrank" in algorithms else []
    jobs += [("simrank", bench_simrank, (s,)) for s in simrank_graphs]
    info = gpu.device_info()
    kept, commands = kept_rows(out, info.name, {(a, loaders.display_name(args[0])) for a, _, args in jobs})
    commands = commands + [command] if command not in commands else commands
    rows: list[GraphRow] = []
    # Both sides once on a tiny graph, unrecorded: the first graph would otherwise carry the process's one-time
    # costs (CuPy's kernels compiled or loaded from its disk cache, modules loaded), which a user pays once.
    _warm_up(algorithms, simrank_graphs=simrank_graphs)
    for _, fn, args in (progress(jobs) if progress else jobs):
        _fresh_staging()
        rows.append(fn(*args))
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({
            "tool": f"sparse-tuner {__version__}", "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": command, "commands": commands, "gpu": {"name": info.name, "memory_bytes": info.memory_bytes},
            "timing": (f"wall seconds between device synchronisations; float32 PageRank/RWR to a per-node change "
                       f"below {TOL} (cuSPARSE: the same iterations); HITS float64, ARPACK's tolerance and basis "
                       f"(cuSPARSE: thick-restart Lanczos as CuPy's eigsh makes it, or ARPACK where ours ran it); "
                       f"rwr_many {RWR_SETS} single-node seed sets at once, float64, per-node {TOL}; "
                       f"betweenness {BETWEENNESS_SOURCES} sampled sources; SimRank float64, NetworkX's tolerance; "
                       f"each row starts with CuPy's page-locked host memory handed back and our staging rental anew "
                       f"(both sides' first runs lock memory as a process's first call does)"),
            "rows": kept + [asdict(r) for r in rows]}, indent=1) + "\n")
    return rows


def kept_rows(out: Path, gpu_name: str, redone: set) -> tuple[list[dict], list[str]]:
    """The rows of ``out`` (a bench-graph.json) whose (algorithm, graph name) is not in ``redone``, and the
    commands that wrote it; none where it does not exist or comes from another GPU.

    Example:
        >>> kept_rows(Path("/nonexistent.json"), "NVIDIA H100 80GB HBM3", {("hits", "wiki-Vote")})
        ([], [])
    """
    if not out.exists():
        return [], []
    old = json.loads(out.read_text())
    if old.get("gpu", {}).get("name") != gpu_name:
        return [], []
    kept = [r for r in old.get("rows", []) if (r.get("algorithm"), r.get("name")) not in redone]
    commands = old.get("commands", [old["command"]] if "command" in old else [])
    return kept, (commands if kept else [])
