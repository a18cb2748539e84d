"""PageRank whose iterations stay on the GPUs: each rank owns the ranks of its nodes (the rows of Aᵀ that
:class:`~tuner.distributed.spmv.DistributedSpMV` deals it), and an iteration is

1. the rank cache x / outdeg of the rank's nodes, already in its slice of the gathered buffer (the update of
   the previous iteration writes it, paper 002's once-per-iteration division);
2. NCCL's all-gather of the cache, then the rank's tuned SpMV of its rows of Aᵀ;
3. the update x_new = alpha (pulled + dangling d) + (1 - alpha) p, the next cache, the change (L1 or max)
   and the next dangling sum in one pass (templates/pagerank_step.cu.j2);
4. every rank's [dangling sum, change] gathered in one collective and combined on each GPU, which records
   there the first iteration whose change meets the tolerance; the iterations queued after it change
   nothing. The host reads that record ``check_every`` iterations behind the device (page-locked, copied
   as the iteration ends), so it never waits for the iteration it has just queued: the GPU goes from one
   product to the next without idling, and stops at the same iteration, with the same ranks, whatever
   ``check_every`` is (at most that many products are queued past it).

With one GPU (:class:`~tuner.distributed.nccl.SoloDevice`) the same loop runs without the exchanges.
Semantics, tolerance rules and errors are :func:`tuner.graph.pagerank`'s.
"""
from __future__ import annotations

import time

import numpy as np

from .. import codegen, gpu
from ..formats import xp
from ..formats.transpose import transpose
from ..graph.device_pull import VALUE_CTYPES, pull_on_device
from ..graph.pagerank import (TOL_RULES, ConvergenceError, IterationInfo, _node_vector, edge_weights,
                              rank_cache_factors)
from .spmv import DistributedSpMV

STEP_BLOCK = 256


class _Step:
    """The update kernel (templates/pagerank_step.cu.j2) and its reductions for one value type."""

    def __init__(self, dtype: np.dtype):
        import cupy
        info = gpu.device_info()
        name = f"pagerank_step_{dtype.name}"
        source = codegen.render("pagerank_step.cu.j2", dict(VAL=VALUE_CTYPES[dtype], block_size=STEP_BLOCK,
                                                             kernel_name=name))
        self.update = gpu.Kernel(codegen.compile_source(source, info.arch).cubin, name, "PPPPPPPPPPPqdi")
        self.finish = self.update.sibling(name + "_finish", "PPqqPiPdq")
        self.grid = 4 * info.sm_count  # fixed for the device: the order of the sums, and so the run, repeats
        self.partials = cupy.zeros(2 * self.grid, np.float64)
        # [iteration that met the tolerance, its change]; 0 until one does (templates/pagerank_step.cu.j2)
        self.status = cupy.zeros(2, np.float64)

    def __call__(self, pulled, d, p, inverse, dangling, x_old, sums, x_new, cache, mine, alpha: float,
                 max_rule: int) -> None:
        ptr = lambda a: int(a.data.ptr)  # noqa: E731
        self.update.launch(self.grid, STEP_BLOCK, ptr(pulled), ptr(d), ptr(p), ptr(inverse), ptr(dangling),
                           ptr(x_old), ptr(sums), ptr(x_new), ptr(cache), ptr(self.partials), ptr(self.status),
                           np.int64(pulled.size), np.float64(alpha), np.int32(max_rule))
        self.finish.launch(1, STEP_BLOCK, ptr(self.partials), ptr(self.partials) + 8 * self.grid,
                           np.int64(self.grid), np.int64(1), ptr(mine), np.int32(max_rule), ptr(self.status),
                           np.float64(-1.0), np.int64(0))  # a rank's pair alone never meets the tolerance

    def combine(self, parts, sums, max_rule: int, limit: float = -1.0, iteration: int = 0) -> None:
        """The whole graph's [dangling sum, change] from every rank's pair; where the change is below
        ``limit``, ``iteration`` is recorded in :attr:`status` as the one that met the tolerance."""
        self.finish.launch(1, STEP_BLOCK, int(parts.data.ptr), int(parts.data.ptr) + 8, np.int64(parts.size // 2),
                           np.int64(2), int(sums.data.ptr), np.int32(max_rule), int(self.status.data.ptr),
                           np.float64(limit), np.int64(iteration))


class _StatusReader:
    """The host's view of the device's convergence record (:attr:`_Step.status`): a page-locked copy queued
    as each iteration ends, into a slot of its own, read once that of ``behind`` iterations earlier has
    arrived. Each read is of exactly that iteration's record, so every rank of a communicator stops after
    queueing the same iterations (their collectives match)."""

    def __init__(self, status, behind: int):
        import cupy
        import cupyx
        self.status, self.behind = status, behind
        self.slots = cupyx.empty_pinned((behind + 1, 2), np.float64)  # iteration i's copy in slot i % (behind + 1)
        self.slots[:] = 0.0
        # One event per slot, made once rather than one per iteration: the slot iteration i records into was
        # last recorded at iteration i - behind - 1 and waited for at iteration i - 1.
        self.events = [cupy.cuda.Event(disable_timing=True) for _ in range(behind + 1)]
        self.calls = 0
        self._copy = lambda slot: cupy.cuda.runtime.memcpyAsync(  # noqa: E731
            self.slots[slot].ctypes.data, status.data.ptr, status.nbytes, cupy.cuda.runtime.memcpyDeviceToHost, 0)

    def queued(self, iteration: int) -> bool:
        """Queue the copy of ``iteration``'s record (the iteration just queued); True once the record of
        ``behind`` iterations back shows the tolerance met."""
        slot = iteration % (self.behind + 1)
        self._copy(slot)
        self.events[slot].record()
        self.calls += 1
        if self.calls <= self.behind:
            return False
        earlier = (iteration - self.behind) % (self.behind + 1)
        self.events[earlier].synchronize()
        return self.slots[earlier, 0] != 0.0

    def final(self) -> tuple[int, float]:
        """(the iteration that met the tolerance, 0 if none; its change), after the device has finished."""
        met, change = (float(v) for v in self.status.get())
        return int(met), change


def pull_product(A, comm, dtype=np.float32, weighted: bool = True, overlap: bool = True,
                 **options) -> DistributedSpMV:
    """The distributed SpMV by Aᵀ that :func:`pagerank_on_devices` pulls ranks with, to reuse across calls
    (the compile is the costly part of a short run). On a device communicator Wᵀ is built on the rank's GPU
    from one upload of A (:func:`~tuner.graph.device_pull.pull_on_device`) where it fits, and the rank-cache
    factors made there are kept with the product (``pull_factors``) for PageRank; else on the host.

    Example (on a GPU machine):
        >>> spmv = pull_product(A, comm)                                   # doctest: +SKIP
        >>> x = pagerank_on_devices(A, comm, product=spmv)                 # doctest: +SKIP
    """
    on_device = pull_on_device(A, weighted, dtype) if hasattr(comm, "allgather_into") else None
    if on_device is None:
        return DistributedSpMV(transpose(edge_weights(A, weighted, keep_float=True), dtype), comm, overlap=overlap,
                               **options)
    Wt, dangling, inverse = on_device
    spmv = DistributedSpMV(Wt, comm, overlap=overlap, **options)
    spmv.pull_factors = (weighted, dangling, inverse)
    return spmv


def pagerank_on_devices(A, comm, alpha: float = 0.85, personalization=None, max_iter: int = 100,
                        tol: float = 1e-6, nstart=None, dangling=None, weighted: bool = True,
                        tol_rule: str = "networkx", dtype=np.float32, check_every: int = 1,
                        return_info: bool = False, product: DistributedSpMV | None = None,
                        resident: bool | None = None, **options):
    """PageRank of ``A`` (edge u -> v is ``A[u, v]``) on the GPUs of device communicator ``comm``.

    ``comm``: :class:`~tuner.distributed.nccl.NcclComm` (one MPI rank per GPU; every rank calls this with the
    same A, or with None and a ``product`` from :func:`~tuner.distributed.shard.sharded_product`) or
    :class:`~tuner.distributed.nccl.SoloDevice`. ``dtype``: of the matrix and the vectors (the
    sums are accumulated in float64). ``options`` go to each rank's :func:`tuner.compile`; ``product``
    reuses one made by :func:`pull_product` for the same A, comm and options. ``resident``: every
    iteration in one kernel launch (:mod:`tuner.graph.resident`); None (the default) where it applies: one GPU,
    no ``product``, the generic kernel (``tune='none'``) and no ``device_memory_limit``. Returns the whole
    rank vector (float64, A's order) on every rank, and with ``return_info`` an
    :class:`~tuner.graph.pagerank.IterationInfo` whose ``seconds`` split setup (partition, compile, upload)
    from the iterations (which include the at most ``check_every`` products queued past the last one).
    ``check_every``: how many iterations behind the device the host reads whether the tolerance is met (the
    module docstring; 0: after each iteration, the GPU idling while the host queues the next). Other
    arguments: :func:`tuner.graph.pagerank`.

    Example (on a GPU machine):
        >>> from tuner.distributed.nccl import SoloDevice                   # doctest: +SKIP
        >>> x = pagerank_on_devices(A, SoloDevice(), dtype=np.float64)      # doctest: +SKIP
    """
    # The product's rank-cache factors where it made them for these weights (None: made on the host, or none).
    factors = getattr(product, "pull_factors", None)
    factors = factors if factors is not None and factors[0] == weighted else None
    if A is None and factors is None:
        raise ValueError("without the graph (A None) pass a product that holds its rank-cache factors for "
                         f"weighted={weighted}: sharded_product's")
    import cupy
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if tol_rule not in TOL_RULES:
        raise ValueError(f"tol_rule must be one of {TOL_RULES}, got {tol_rule!r}")
    if max_iter < 1 or tol <= 0 or check_every < 0:
        raise ValueError(f"max_iter and tol must be positive and check_every at least 0, got {max_iter}, {tol}, "
                         f"{check_every}")
    alone = comm.size == 1 and product is None and A is not None
    if resident is None:
        resident = alone and options.get("tune") == "none" and options.get("device_memory_limit") is None
    elif resident and not alone:
        raise ValueError("resident iterations run on one GPU (comm.size 1) from the graph, without a product")
    if resident:
        from ..graph import resident as resident_run
        done = resident_run.pagerank(A, alpha, personalization, max_iter, tol, nstart, dangling, weighted, tol_rule,
                                     dtype, return_info)
        if done is not None:  # else the graph stays on the host (too large, or a check to name): the loop below
            return done
    t0 = time.perf_counter()
    # One GPU: Wᵀ and the rank-cache factors made on the device from one upload (None: on the host instead).
    on_device = pull_on_device(A, weighted, dtype) if product is None and comm.size == 1 else None
    if on_device is not None:
        Wt, dangling_nodes, inverse = on_device
        spmv = DistributedSpMV(Wt, comm, **options)
    elif factors is not None:
        spmv, (_, dangling_nodes, inverse) = product, factors  # made with Wᵀ on the device
    else:
        W = edge_weights(A, weighted, keep_float=True)  # cast to dtype on the GPU
        dangling_nodes, inverse = rank_cache_factors(W)
        spmv = product or DistributedSpMV(transpose(W, dtype), comm, **options)
    n = spmv.partition.owner.size
    if (product is not None and A is not None and n != A.shape[0]) or spmv.comm is not comm:
        raise ValueError(f"product multiplies {n} nodes on another communicator: make it with "
                         "pull_product(A, comm) for this graph")
    x0 = None if nstart is None else _node_vector(nstart, n, "nstart")
    p = None if personalization is None else _node_vector(personalization, n, "personalization")
    d = p if dangling is None else _node_vector(dangling, n, "dangling")
    dtype = np.dtype(spmv.dtype)
    rows = spmv.rows
    in_plan = spmv.plan_order_here()
    if in_plan is not None:  # one GPU, a relabelled plan: the vectors live in its order, gathered never
        rows, inner = in_plan
        multiply = lambda v, out: inner(v, out=out)  # noqa: E731
    else:
        multiply = lambda v, out: spmv(v, out=out)  # noqa: E731
    in_order = in_plan is None and comm.size == 1  # the rank's vectors are in A's order: nothing to pick
    picks = None if in_order else cupy.asarray(rows)

    def local(v):
        """This rank's entries of a node vector in A's order (None: uniform), on the device in ``dtype``."""
        if v is None:
            return cupy.full(rows.size, 1.0 / n, dtype)
        v = cupy.asarray(v)
        return (v if in_order else v[picks]).astype(dtype)
    x, p_l, inv_l, dangling_l = local(x0), local(p), local(inverse), local(dangling_nodes)
    d_l = p_l if d is p else local(d)
    x_new, pulled = cupy.empty_like(x), cupy.empty_like(x)
    cache = spmv.padded(x * inv_l)[:rows.size]  # this rank's slice of the buffer NCCL gathers into
    # Every rank's [dangling sum, change], gathered in one collective a step and combined on each GPU.
    parts = cupy.zeros(2 * comm.size, np.float64)
    mine = parts[2 * comm.rank:2 * comm.rank + 2]
    sums = cupy.zeros(2, np.float64)  # [dangling sum, change] of the whole graph
    mine[0:1] = xp.sum64(x, dangling_l)  # not CuPy's sum: its CUB kernel takes seconds to build on first use
    comm.allgather_into(mine, parts)
    step, max_rule = _Step(dtype), int(tol_rule == "per_node")
    step.combine(parts, sums, max_rule)
    limit = n * tol if tol_rule == "networkx" else tol
    cupy.cuda.Device().synchronize()
    t1 = time.perf_counter()

    seen = _StatusReader(step.status, check_every)
    for iteration in range(1, max_iter + 1):
        multiply(cache, pulled)
        step(pulled, d_l, p_l, inv_l, dangling_l, x, sums, x_new, cache, mine, alpha, max_rule)
        comm.allgather_into(mine, parts)
        step.combine(parts, sums, max_rule, limit, iteration)
        x, x_new = x_new, x
        if seen.queued(iteration):  # the iteration check_every behind this one met the tolerance, or an earlier one
            break
    cupy.cuda.Device().synchronize()
    t2 = time.perf_counter()
    met, error = seen.final()
    if not met:
        error = float(sums[1].get())
        raise ConvergenceError(f"PageRank did not converge in {max_iter} iterations (last change {error:.3g}, "
                               f"rule {tol_rule!r}, tol {tol})")
    iteration = met
    if in_plan is not None:  # back to A's order on the device: a scatter of n values there, not on the host
        ranks = cupy.empty(n, np.float64)
        ranks[picks] = x
        ranks = xp.host(ranks)
    elif in_order:
        ranks = cupy.asnumpy(x).astype(np.float64)
    else:
        ranks = spmv.gather(x).astype(np.float64)
    info = IterationInfo(iteration, error, {"setup": t1 - t0, "iterations": t2 - t1,
                                            "gather": time.perf_counter() - t2},
                         f"{spmv.kernel_kind} SpMV on {comm.size} GPU(s)")
    return (ranks, info) if return_info else ranks
