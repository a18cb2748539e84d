"""``python -m tuner bench-multigpu``: SpMV and PageRank across the GPUs of one machine against one GPU.

Started with ``--gpus P`` it runs itself as P MPI ranks (``--distributed``), one per GPU. Per graph, rank 0
loads it and hands it to the others, and every rank builds its rows of Aᵀ (bitonic partition; the tiles of
the model's fastest tile_composite plan for one GPU, or a kernel compiled for the rank's rows where it
predicts none); then

* ``spmv``: a product is NCCL's all-gather of x and the rank's kernel; ``ours_s`` is the slowest rank's
  median per product, vectors in the rank's slots' order. The same DistributedSpMV on rank 0's GPU alone
  (a group of one, the whole matrix in one tuned kernel, no exchange), vectors in its plan's order, gives
  ``one_gpu_s``. Results are compared with SciPy in float64 and with the one-GPU product.
* ``pagerank``: :func:`~tuner.distributed.pagerank.pagerank_on_devices` on P GPUs and on one, to the same
  per-node tolerance; ``ours_s`` and ``one_gpu_s`` are seconds per iteration.

With ``--sharded`` only rank 0 loads a graph and every rank is sent just its rows
(:func:`~tuner.distributed.shard.sharded_product`), or each rank generates its rows of a ``kron:PATH:K``
graph itself (:func:`~tuner.distributed.generated.generated_product`); a graph whose Aᵀ does not fit one
GPU then runs without a one-GPU side, its SpMV checked on sampled nodes (SciPy, or for a generated graph
G's in-edges and the seed's grid).

Rows are written after each graph, so a run cut short keeps what it measured. The whole path runs once on a
small graph first, unrecorded, so that CuPy's first-use kernel compiles stay out of the setups.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from . import __version__, gpu, loaders

SUITE = ("rmat:21", "rmat:23", "rmat:25")
SCIPY_CHECK_NNZ = 60_000_000  # PageRank: above this a float64 SciPy reference costs more than the run it checks
# SpMV: one product by the transpose's CSC view, no copy: about 10 s for a billion edges on one host thread.
SCIPY_SPMV_CHECK_NNZ = 1_200_000_000
SAMPLED_ROWS = 100_000  # rows of Aᵀ x checked against SciPy above that, from one pass over A's entries
TOP_RANKS = 1_000  # PageRank's hubs, checked with the sample: their sums are the longest

PAGERANK_TOL = 1e-9  # per node; float32 ranks of hubs (1e-4) still resolve it
CHECK_EVERY = 1  # iterations the host reads the convergence record behind the GPUs: they never wait for it
AGREE = 1e-4  # float32 results against float64 ones, relative to the largest entry
TRIALS, PRODUCTS = 7, 20


@dataclass(frozen=True)
class MultiGpuRow:
    """One (operation, graph) on ``gpus`` GPUs against one; times in seconds.

    Attributes:
        op: 'spmv' (y = Aᵀ x, the product PageRank pulls with) or 'pagerank' (per iteration).
        name, nnz: the graph and its edges.
        gpus: ranks, one GPU each.
        ours_s, one_gpu_s: median seconds per product (per iteration for PageRank), the slowest rank's.
        speedup, efficiency: one_gpu_s / ours_s, and that over ``gpus``.
        correct: the result agrees with the one-GPU result and (where affordable) SciPy's in float64.
        max_rel_diff_vs_one_gpu: max |ours - one GPU| / max |one GPU|.
        rel_error_vs_scipy: max |ours - SciPy| / max |SciPy| (None where not computed: SpMV above
            :data:`SCIPY_SPMV_CHECK_NNZ` edges, PageRank above :data:`SCIPY_CHECK_NNZ`).
        iterations, one_gpu_iterations: PageRank's iterations (None for SpMV).
        setup_s, one_gpu_setup_s: Wᵀ, partition, plan, layout or compile, and upload, the slowest rank's.
        setup_stages: the slowest rank's seconds of each stage of ``setup_s`` ('pull': Wᵀ made from A;
            'partition', 'plan', 'layout': :attr:`~tuner.distributed.spmv.DistributedSpMV.setup_seconds`).
        load_s: seconds until every rank holds the graph (rank 0 loads or generates it and broadcasts it),
            not in ``setup_s``; with a graph each rank generates its part of, the seconds of making its
            generator (the edges are made in the setup's 'rows').
        allgather_s, local_s: for SpMV, the slowest rank's all-gather alone and product alone (median).
        single_kernel_s: for SpMV, a product whose kernels start after the whole exchange (``overlap=False``;
            ``ours_s`` multiplies part of each rank's rows during the exchange).
        rows_per_rank, nnz_per_rank: how the bitonic partition split the work.
        rank_kernel: how each rank multiplied (:class:`~tuner.distributed.spmv.DistributedSpMV`'s
            ``kernel_kind``: 'tiled', the one-GPU plan's tiles; 'tuned', its rows compiled on their own).
        one_gpu_family: the family the model plans for the whole matrix on one GPU (None without a profile;
            the ranks take the tiles of its fastest tile_composite candidate whatever this is).
        one_gpu_setup_stages: seconds of ``one_gpu_setup_s``'s stages ('pull', then the compile's: 'plan' for
            its statistics and model, 'layout' for relabelling, layout and binary), and where the layout was
            built ('layout_source': 'device', or 'built' on the host).
        sharded: the ranks were given only their rows (:func:`~tuner.distributed.shard.sharded_product`;
            only rank 0 held the graph); their setup stages are then 'facts', 'partition', 'rows', 'plan'
            and 'layout'.
        scipy_check: what ``rel_error_vs_scipy`` compared: 'all' rows, 'N sampled' rows (a graph too large
            for a whole float64 product on the host), or None. A PageRank with neither SciPy's nor one GPU's
            result: 'fixed point, N sampled', ``rel_error_vs_scipy`` then being :func:`pagerank_residual`
            at N nodes (a random sample and the top ranks). PageRank's ranks must also sum to 1.

    The one-GPU fields are None where the graph does not fit one GPU at all (:func:`one_gpu_fits`).
    """

    op: str
    name: str
    nnz: int
    gpus: int
    ours_s: float
    one_gpu_s: float | None
    speedup: float | None
    efficiency: float | None
    correct: bool
    max_rel_diff_vs_one_gpu: float | None
    rel_error_vs_scipy: float | None
    iterations: int | None
    one_gpu_iterations: int | None
    setup_s: float
    one_gpu_setup_s: float | None
    setup_stages: dict
    load_s: float
    allgather_s: float | None
    local_s: float | None
    single_kernel_s: float | None
    rows_per_rank: list
    nnz_per_rank: list
    rank_kernel: str
    one_gpu_family: str | None
    one_gpu_setup_stages: dict
    sharded: bool
    scipy_check: str | None


def one_gpu_fits(n: int, nnz: int, entry_bytes: int, memory_bytes: int) -> bool:
    """Whether Aᵀ itself (CSR: ``entry_bytes`` a column index and value, 8 B a row pointer) fits one GPU's
    ``memory_bytes``; a graph that does not is run only across the GPUs.

    Example (rmat:27 in float32 on an 80 GB GPU; 21 billion pattern entries):
        >>> one_gpu_fits(2**27, 2_125_680_981, 8, 85_017_493_504), one_gpu_fits(83_342_592, 21_101_573_272, 4, 85_017_493_504)
        (True, False)
    """
    return entry_bytes * nnz + 8 * (n + 1) <= memory_bytes


def sampled_pull(A, x: np.ndarray, nodes: np.ndarray) -> np.ndarray:
    """(Wᵀ x)[nodes] in float64 for the edge-weight matrix W of ``A`` (SciPy CSR, canonical): one pass over
    A's entries, the sampled nodes' in-edges picked, no transpose.

    Example:
        >>> import scipy.sparse as sp
        >>> A = sp.csr_matrix(np.array([[0, 2.0, 1], [0, 0, 0], [3, 0, 0]]))
        >>> sampled_pull(A, np.array([1.0, 10, 100]), np.array([0, 2])).tolist()
        [300.0, 1.0]
    """
    picked = np.zeros(A.shape[0], bool)
    picked[nodes] = True
    at = np.flatnonzero(picked[A.indices])
    sources = np.searchsorted(A.indptr, at, side="right") - 1
    sums = np.bincount(A.indices[at], weights=A.data[at].astype(np.float64) * x[sources], minlength=A.shape[0])
    return sums[nodes]


def pagerank_residual(pull, out_weight: np.ndarray, pr: np.ndarray, nodes: np.ndarray,
                      alpha: float = 0.85) -> float:
    """How far PageRank's ``pr`` (uniform teleport and dangling) is from its fixed point at ``nodes``: one
    power iteration F done there in float64, max |F(pr) - pr| over them relative to the largest rank (as
    the other checks compare results). ``pull(x, nodes)`` gives (Wᵀ x)[nodes] (:func:`sampled_pull`);
    ``out_weight``: every node's summed out-weights (0: dangling). A converged PageRank's residual is its
    last change: the check of a graph with no other reference, independent of the GPUs' products.

    Example (a 3-cycle: every rank 1/3, a fixed point; ranks off it are found):
        >>> import scipy.sparse as sp
        >>> A = sp.csr_matrix(np.array([[0, 1.0, 0], [0, 0, 1], [1, 0, 0]]))
        >>> pull = lambda x, nodes: sampled_pull(A, x, nodes)
        >>> pagerank_residual(pull, np.ones(3), np.full(3, 1 / 3), np.arange(3)) < 1e-15
        True
        >>> round(pagerank_residual(pull, np.ones(3), np.array([0.5, 0.25, 0.25]), np.arange(3)), 3)
        0.475
    """
    pr = np.asarray(pr, np.float64)
    n = pr.size
    dangling = out_weight == 0
    cache = np.divide(pr, out_weight, out=np.zeros(n), where=~dangling)
    step = alpha * (pull(cache, nodes) + pr[dangling].sum() / n) + (1 - alpha) / n
    return float(np.abs(step - pr[nodes]).max() / max(np.abs(pr).max(), np.finfo(np.float64).tiny))


def _median_seconds(run, comm, trials: int = TRIALS, repeats: int = PRODUCTS) -> float:
    """The slowest rank's median over ``trials`` of the wall time of ``repeats`` calls, per call."""
    import cupy
    run()
    cupy.cuda.Device().synchronize()
    times = []
    for _ in range(trials):
        comm.allgather(np.zeros(1))  # start together
        t0 = time.perf_counter()
        for _ in range(repeats):
            run()
        cupy.cuda.Device().synchronize()
        times.append((time.perf_counter() - t0) / repeats)
    return _slowest(comm, float(np.median(times)))


def _spmv_times(spmv, x, comm) -> tuple[float, float, float, np.ndarray]:
    """Per product: whole, all-gather alone, local product alone (slowest rank, s); and y in A's order."""
    import cupy
    x_slice = spmv.padded(cupy.asarray(spmv.scatter(x)))[:spmv.rows.size]  # written in place, as PageRank does
    y = cupy.empty(spmv.rows.size, x_slice.dtype)
    whole = _median_seconds(lambda: spmv(x_slice, out=y), comm)
    gathered = spmv.gather_x(x_slice)
    gather = _median_seconds(lambda: spmv.gather_x(x_slice), comm)
    local = _median_seconds(lambda: spmv.local_product(gathered, out=y), comm)
    spmv(x_slice, out=y)
    return whole, gather, local, spmv.gather(y)


def _plan_order_times(spmv, x, comm) -> tuple[float, np.ndarray]:
    """Per product on one GPU, vectors in the plan's order as the ranks' are in their slots' (none of the
    permutations a call in A's order adds), and y in A's order."""
    import cupy
    in_plan = spmv.plan_order()
    if in_plan is None:
        whole, _, _, y = _spmv_times(spmv, x, comm)
        return whole, y
    order, product = in_plan
    xp, yp = cupy.asarray(x[order]), cupy.empty(order.size, x.dtype)
    seconds = _median_seconds(lambda: product(xp, out=yp), comm)
    y = np.empty(order.size, np.float64)
    y[order] = cupy.asnumpy(product(xp, out=yp))
    return seconds, y


def _slowest(comm, seconds: float) -> float:
    """The largest of every rank's ``seconds`` (every rank calls it at once)."""
    return float(max(p[0] for p in comm.allgather(np.array([seconds]))))


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / max(np.abs(b).max(), np.finfo(np.float64).tiny))


def bench_graph(source: str, comm, solo_factory, dtype=np.float32, progress=None,
                sharded: bool = False) -> list[MultiGpuRow]:
    """Both rows of one graph (every rank calls it; rank 0 returns them, the others nothing); ``progress``
    (rank 0's) hears where a long graph is. ``sharded``: only rank 0 loads the graph and the ranks are
    given their rows (:func:`~tuner.distributed.shard.sharded_product`), or for a ``kron:PATH:K`` graph
    each rank generates its own (:func:`~tuner.distributed.generated.generated_product`: nothing is
    loaded, and rank 0 builds the graph afterwards only where it fits one GPU); else every rank holds it."""
    say = (lambda text: progress(f"{source}: {text}")) if progress is not None and comm.rank == 0 else \
        (lambda text: None)
    from .distributed.generated import blocks_of, generated_product, kronecker_facts, kronecker_pull
    from .distributed.generated import generated as is_generated
    from .distributed.pagerank import pagerank_on_devices, pull_product
    from .distributed.shard import sharded_product
    from .distributed.share import every_cpu, load_on_root, load_once
    generated = sharded and is_generated(source)
    t0 = time.perf_counter()
    A = blocks = None
    if generated:
        blocks = blocks_of(source)
    else:
        A = load_on_root(source, comm) if sharded else load_once(source, comm)
    load = _slowest(comm, time.perf_counter() - t0)
    size = (blocks.shape[0], blocks.nnz) if generated else (A.shape[0], A.nnz) if comm.rank == 0 else None
    n, nnz = (int(v) for v in comm.bcast_array(None if size is None else np.array(size)))
    name = loaders.display_name(source)
    say(f"{'generator made' if generated else 'loaded'} in {load:.1f} s ({nnz:,} edges)")
    x = np.random.default_rng(7).uniform(0.5, 1.5, n)  # not all equal: every gathered entry counts

    t0 = time.perf_counter()
    if generated:
        spmv = generated_product(blocks, comm, dtype=dtype)
    else:
        spmv = sharded_product(A, comm, dtype=dtype) if sharded else pull_product(A, comm, dtype=dtype)
    seconds = time.perf_counter() - t0
    stages = dict(spmv.setup_seconds) if sharded else \
        {"pull": seconds - sum(spmv.setup_seconds.values()), **spmv.setup_seconds}
    setup = _slowest(comm, seconds)
    stages = {k: _slowest(comm, v) for k, v in stages.items()}
    say(f"{comm.size} ranks set up in {setup:.1f} s")
    whole, gather, local, y = _spmv_times(spmv, x.astype(dtype), comm)
    if spmv.kernel_kind == "tiled":  # the same kernels, the whole exchange before them
        spmv.overlap = False
        single_kernel = _spmv_times(spmv, x.astype(dtype), comm)[0]
        spmv.overlap = True
    else:  # the rank's rows in one kernel, the exchange before it
        single = pull_product(A, comm, dtype=dtype, overlap=False)
        single_kernel = _spmv_times(single, x.astype(dtype), comm)[0]
        del single
    pr, info = pagerank_on_devices(None if sharded else A, comm, tol=PAGERANK_TOL, tol_rule="per_node",
                                   max_iter=500, product=spmv, check_every=CHECK_EVERY, return_info=True)
    say(f"{comm.size} ranks: SpMV {1e3 * whole:.3f} ms (gather {1e3 * gather:.3f}, local {1e3 * local:.3f}), "
        f"PageRank {1e3 * info.seconds['iterations'] / info.iterations:.3f} ms an iteration ({info.iterations})")
    per_rank = [(int(p[0]), int(p[1])) for p in comm.allgather(np.array([spmv.rows.size, spmv.local_nnz]))]
    kind, family = spmv.kernel_kind, spmv.one_gpu_family
    del spmv
    if comm.rank != 0:
        comm.allgather(np.zeros(1))  # wait while rank 0 runs the one-GPU side
        return []

    entry = np.dtype(np.int32 if max(n, nnz) <= np.iinfo(np.int32).max else np.int64).itemsize + \
        np.dtype(dtype).itemsize
    fits = one_gpu_fits(n, nnz, entry, gpu.device_info().memory_bytes)
    if generated and fits:  # built for the one-GPU side and SciPy, after the ranks' run
        with every_cpu():
            A = loaders.load(source)
    solo = _one_gpu(A, solo_factory, x, dtype, say) if fits else None
    if not fits:
        say("larger than one GPU: the one-GPU side is not run")
    ref_y, check = None, None
    if A is not None and nnz <= SCIPY_SPMV_CHECK_NNZ:
        ref_y, check = _whole_pull(A, x), "all"  # float64, independent of both GPU paths
    elif solo is None:  # no other reference: SciPy on a sample of the nodes
        nodes = np.sort(np.random.default_rng(8).choice(n, min(SAMPLED_ROWS, n), replace=False))
        sampled = sampled_pull(A, x, nodes) if A is not None else kronecker_pull(blocks, x, nodes)
        ref_y, check = (nodes, sampled), f"{nodes.size} sampled"
    ref_pr, pr_check = None, None
    if A is not None and nnz <= SCIPY_CHECK_NNZ:
        from .graph import pagerank
        ref_pr = pagerank(A, tol=PAGERANK_TOL, tol_rule="per_node", max_iter=500, backend="scipy")
        pr_check = "all"
    elif solo is None:  # no other reference: one float64 power iteration at sampled nodes and the top ranks
        nodes = np.union1d(np.random.default_rng(9).choice(n, min(SAMPLED_ROWS, n), replace=False),
                           np.argsort(pr)[-min(TOP_RANKS, n):])
        if A is not None:
            from .graph.pagerank import row_sums
            residual = pagerank_residual(lambda v, at: sampled_pull(A, v, at), row_sums(A), pr, nodes)
        else:
            residual = pagerank_residual(lambda v, at: kronecker_pull(blocks, v, at),
                                         kronecker_facts(blocks).out_weight, pr, nodes)
        ref_pr, pr_check = residual, f"fixed point, {nodes.size} sampled"
    comm.allgather(np.zeros(1))
    rows = []
    for op, ours, result, ref in (("spmv", whole, y, ref_y),
                                  ("pagerank", info.seconds["iterations"] / info.iterations, pr, ref_pr)):
        one = None if solo is None else solo[op]
        diff = None if one is None else _rel(result, one["result"])
        if isinstance(ref, tuple):  # sampled nodes
            scipy_err = _rel(result[ref[0]], ref[1])
        elif isinstance(ref, float):  # a PageRank's residual at sampled nodes
            scipy_err = ref
        else:
            scipy_err = None if ref is None else _rel(result, ref)
        # Every result has a reference: one GPU's, SciPy's (whole or sampled), or PageRank's fixed point.
        ok = (diff is not None or scipy_err is not None) and (diff is None or diff <= AGREE) and \
            (scipy_err is None or scipy_err <= AGREE) and (op != "pagerank" or abs(float(result.sum()) - 1.0) <= AGREE)
        ones = one["seconds"] if one is not None else None
        rows.append(MultiGpuRow(
            op=op, name=name, nnz=nnz, gpus=comm.size, ours_s=ours, one_gpu_s=ones,
            speedup=None if ones is None else ones / ours,
            efficiency=None if ones is None else ones / ours / comm.size,
            correct=bool(ok), max_rel_diff_vs_one_gpu=diff, rel_error_vs_scipy=scipy_err,
            iterations=info.iterations if op == "pagerank" else None,
            one_gpu_iterations=one["iterations"] if one is not None and op == "pagerank" else None,
            setup_s=setup, one_gpu_setup_s=None if solo is None else solo["setup_s"], setup_stages=stages,
            load_s=load, allgather_s=gather if op == "spmv" else None,
            local_s=local if op == "spmv" else None, single_kernel_s=single_kernel if op == "spmv" else None,
            rows_per_rank=[r for r, _ in per_rank],
            nnz_per_rank=[z for _, z in per_rank], rank_kernel=kind,
            one_gpu_family=family, one_gpu_setup_stages={} if solo is None else solo["stages"],
            sharded=sharded, scipy_check=check if op == "spmv" else pr_check))
    return rows


def _whole_pull(A, x: np.ndarray) -> np.ndarray:
    """Wᵀ x in float64 by the transpose's CSC view (no copy of A)."""
    from .graph.pagerank import edge_weights
    return edge_weights(A).T @ x


def _one_gpu(A, solo_factory, x: np.ndarray, dtype, say) -> dict | None:
    """The one-GPU side on rank 0's GPU: per op its 'seconds', 'result' and 'iterations', and the setup's
    'setup_s' and 'stages'."""
    from .distributed.pagerank import pagerank_on_devices, pull_product
    solo = solo_factory()
    t0 = time.perf_counter()
    spmv1 = pull_product(A, solo, dtype=dtype)
    setup1 = time.perf_counter() - t0
    stages1 = _solo_stages(spmv1, setup1)
    say(f"one GPU set up in {setup1:.1f} s ({_stages_text(stages1)})")
    whole1, y1 = _plan_order_times(spmv1, x.astype(dtype), solo)
    pr1, info1 = pagerank_on_devices(A, solo, tol=PAGERANK_TOL, tol_rule="per_node", max_iter=500,
                                     check_every=CHECK_EVERY, product=spmv1, return_info=True)
    del spmv1
    return {"spmv": {"seconds": whole1, "result": y1, "iterations": None},
            "pagerank": {"seconds": info1.seconds["iterations"] / info1.iterations, "result": pr1,
                         "iterations": info1.iterations},
            "setup_s": setup1, "stages": stages1}


def _solo_stages(spmv, seconds: float) -> dict:
    """The stages of a one-GPU setup of ``seconds``: Wᵀ made ('pull'), planning, and the layout with its
    relabelling and binary, with where the layout was built."""
    stages = {"pull": seconds - sum(spmv.setup_seconds.values())}
    compiled = spmv.local
    plan = getattr(compiled, "plan", None)
    made = plan.seconds if plan is not None and plan.seconds else {}  # a plan-cache hit: as it was made
    planning = float(made.get("relabel", 0.0) + made.get("plan", 0.0))
    stages.update(plan=planning, layout=spmv.setup_seconds["layout"] - planning,
                  layout_source=getattr(compiled, "layout_source", None), family=getattr(plan, "family", None))
    return stages


WARM_UP = "rmat:17"  # large enough for every device build (device_reorder.MIN_NNZ), a second to set up


def _warm_up(comm, solo_factory, sharded: bool = False) -> None:
    """The whole path once on a small graph, unrecorded: CuPy compiles its kernels at their first use (for
    seconds on a machine whose kernel cache is empty), which would otherwise land in the first graph's setup."""
    from .distributed.pagerank import pagerank_on_devices, pull_product
    from .distributed.shard import sharded_product
    from .distributed.share import load_once
    A = load_once(WARM_UP, comm)
    product = sharded_product(A if comm.rank == 0 else None, comm) if sharded else pull_product(A, comm)
    pagerank_on_devices(A, comm, product=product, max_iter=500, check_every=CHECK_EVERY)
    if comm.rank == 0:
        solo = solo_factory()
        pagerank_on_devices(A, solo, product=pull_product(A, solo), max_iter=500, check_every=CHECK_EVERY)
    comm.allgather(np.zeros(1))


def _stages_text(solo: dict) -> str:
    """A one-GPU setup's stages (:func:`_solo_stages`) in a line."""
    seconds = ", ".join(f"{k} {solo[k]:.1f}" for k in ("pull", "plan", "layout") if k in solo)
    return f"{seconds}; {solo.get('family')} layout {solo.get('layout_source')}"


def format_table(rows: list[MultiGpuRow]) -> str:
    lines = [f"{'op':<9}{'graph':<12}{'nnz':>13}{'gpus':>5}{'ours ms':>10}{'1 GPU ms':>10}{'speedup':>8}"
             f"{'eff':>6}{'gather ms':>10}{'local ms':>9}{'1 kernel':>9}  {'rank':<8}check"]
    ms = lambda v: "-" if v is None else f"{1e3 * v:.3f}"  # noqa: E731
    fixed = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    for r in rows:
        against = [f"vs 1 GPU {r.max_rel_diff_vs_one_gpu:.1e}"] if r.max_rel_diff_vs_one_gpu is not None else []
        if r.rel_error_vs_scipy is not None:
            against.append(f"vs SciPy ({r.scipy_check}) {r.rel_error_vs_scipy:.1e}")
        lines.append(f"{r.op:<9}{r.name:<12}{r.nnz:>13,}{r.gpus:>5}{ms(r.ours_s):>10}{ms(r.one_gpu_s):>10}"
                     f"{fixed(r.speedup):>8}{fixed(r.efficiency):>6}{ms(r.allgather_s):>10}{ms(r.local_s):>9}"
                     f"{ms(r.single_kernel_s):>9}  {r.rank_kernel:<8}"
                     f"{'ok' if r.correct else 'WRONG'} ({'; '.join(against) or 'no reference'})")
    for r in rows[::2]:  # one setup per graph
        stages = ", ".join(f"{k} {v:.1f}" for k, v in r.setup_stages.items())
        solo = (f"one GPU {r.one_gpu_setup_s:.1f} s ({_stages_text(r.one_gpu_setup_stages)})"
                if r.one_gpu_setup_s is not None else "larger than one GPU")
        lines.append(f"setup {r.name}: load {r.load_s:.1f} s; {r.gpus} ranks{' (sharded)' if r.sharded else ''} "
                     f"{r.setup_s:.1f} s ({stages}); {solo}; model plans {r.one_gpu_family}")
    return "\n".join(lines)


def run_ranks(suite: list[str], out: Path, comm, command: str, progress=print, sharded: bool = False) -> int:
    """The bench as rank ``comm.rank`` of an MPI job (``--distributed``); rank 0 writes ``out`` after each
    graph. ``sharded``: :func:`bench_graph`'s."""
    from .distributed.nccl import SoloDevice
    _warm_up(comm, lambda: SoloDevice(comm.device), sharded)
    rows: list[MultiGpuRow] = []
    for source in suite:
        rows += bench_graph(source, comm, lambda: SoloDevice(comm.device), progress=progress, sharded=sharded)
        if comm.rank == 0:
            info = gpu.device_info()
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps({
                "tool": f"sparse-tuner {__version__}",
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": command,
                "gpu": {"name": info.name, "memory_bytes": info.memory_bytes, "count": comm.size},
                "timing": (f"wall seconds between device synchronisations, per product or iteration: median of "
                           f"{TRIALS} runs of {PRODUCTS} products after a warm-up, the slowest rank's; vectors "
                           f"in each rank's slots' order and, on one GPU, in the plan's order; float32 values; "
                           f"PageRank to a per-node change below {PAGERANK_TOL}, read by the host "
                           f"{CHECK_EVERY} iteration(s) behind the GPUs; setups after one unrecorded run on {WARM_UP}"),
                "rows": [asdict(r) for r in rows]}, indent=1) + "\n")
            progress(format_table(rows[-2:]))
    comm.close()
    return 0
