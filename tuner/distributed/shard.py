"""A rank's rows of Aᵀ made without the whole graph on any GPU: PageRank's pull product for a graph larger
than one GPU's memory (paper 003's row partition, section 3.4, each GPU holding only its part).

Only rank 0 holds the graph, on the host. What every rank needs of the whole is a few numbers per node:
its out- and in-degree and its out-weight (:class:`GraphFacts`, broadcast). From those alone every rank
makes the same bitonic partition and the same plan order (nodes by in- plus out-degree, the one-GPU
plan's relabelling of Aᵀ). A's rows then pass every rank in pieces (:func:`shard_rows`); each keeps the
entries whose target node it owns, its rows of Aᵀ. The tile width and every tile's workload size come from
the ranks' tile statistics added up (:func:`shard_params`: their rows are disjoint, so the counts of each
tile's row lengths add), by Algorithm 2 over the lookup model as the one-GPU plan chooses them.

Example (on a GPU machine, one MPI rank per GPU; only rank 0 passes the graph):
    >>> spmv = sharded_product(A if comm.rank == 0 else None, comm)         # doctest: +SKIP
    >>> x = pagerank_on_devices(None, comm, product=spmv)                   # doctest: +SKIP
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..families.tile_composite import bound_workloads
from ..families.tiles import widths
from ..formats.reorder import Structure, degree_ordering
from ..formats.tiles import RankedRuns, grouped_tiles, merge_runs, tile_bounds, tile_runs
from ..formats.xp import host, stable_argsort
from ..matrix import MatrixError
from .partition import RowPartition, square_partition
from .rank_tiles import RankRows, in_plan_numbers

PIECE_ENTRIES = 1 << 27  # A's entries broadcast at once: one piece's arrays on every rank, not the graph


@dataclass(frozen=True)
class GraphFacts:
    """What every rank needs of the whole graph: a few numbers per node.

    Attributes:
        n, nnz: nodes and edges.
        out_degree: each node's out-edges (A's row lengths, the columns' lengths of Aᵀ), int64.
        in_degree: each node's in-edges (the rows' lengths of Aᵀ), int64.
        out_weight: each node's summed out-edge weights (float64; 0: dangling).
        index_dtype: of A's indices (int32 where every index and nnz fit; a rank's layout indexes the
            gathered x and picks its own).
        pattern_value: the common weight of every edge (a pattern graph, multiplied by value-free kernels),
            or None.
    """

    n: int
    nnz: int
    out_degree: np.ndarray
    in_degree: np.ndarray
    out_weight: np.ndarray
    index_dtype: np.dtype
    pattern_value: float | None

    def plan_order(self, xp=np) -> np.ndarray:
        """The nodes in the one-GPU plan's order for Aᵀ: by decreasing in- plus out-degree, ties by node
        (sorted where ``xp`` puts the degrees; returned on the host)."""
        o = degree_ordering(xp.asarray(self.in_degree), xp.asarray(self.out_degree), np.int64)
        return host(o.col_order).astype(np.int64)

    def rank_cache_factors(self) -> tuple[np.ndarray, np.ndarray]:
        """(dangling nodes, 1 / out-weight or 0): :func:`~tuner.graph.pagerank.rank_cache_factors`'."""
        dangling = self.out_weight == 0
        return dangling, np.divide(1.0, self.out_weight, out=np.zeros(self.n), where=~dangling)


def graph_facts(W, comm) -> GraphFacts:
    """Rank 0's :class:`GraphFacts` of its edge-weight matrix ``W`` (square SciPy CSR, canonical; the other
    ranks pass None), on every rank.

    Example:
        >>> import scipy.sparse as sp
        >>> from tuner.distributed.comm import LocalGroup
        >>> W = sp.csr_matrix(np.array([[0, 2.0, 1], [0, 0, 0], [3, 0, 0]]))
        >>> f = LocalGroup(2).run(lambda c: graph_facts(W if c.rank == 0 else None, c))[1]
        >>> f.out_degree.tolist(), f.in_degree.tolist(), f.out_weight.tolist(), f.pattern_value
        ([2, 0, 1], [1, 1, 1], [3.0, 0.0, 3.0], None)
    """
    from ..graph.pagerank import row_sums
    head = None
    if comm.rank == 0:
        if W.shape[0] != W.shape[1]:
            raise MatrixError(f"the graph's adjacency matrix must be square, got {W.shape}")
        data = W.data
        same = W.nnz > 0 and float(data.min()) == float(data.max())
        head = np.array([W.shape[0], W.nnz, np.dtype(W.indices.dtype).itemsize, int(same),
                         np.float64(data[0] if same else 0).view(np.int64)], np.int64)
    head = comm.bcast_array(head)
    n, nnz = int(head[0]), int(head[1])
    root = comm.rank == 0
    out_degree = comm.bcast_array(np.diff(W.indptr).astype(np.int64) if root else None)
    in_degree = comm.bcast_array(np.bincount(W.indices, minlength=n).astype(np.int64) if root else None)
    out_weight = comm.bcast_array(row_sums(W).astype(np.float64) if root else None)
    return GraphFacts(n=n, nnz=nnz, out_degree=out_degree, in_degree=in_degree, out_weight=out_weight,
                      index_dtype=np.dtype(np.int32 if head[2] == 4 else np.int64),
                      pattern_value=float(head[4:5].view(np.float64)[0]) if head[3] else None)


def shard_partition(facts: GraphFacts, parts: int, xp=np) -> RowPartition:
    """The bitonic partition of Aᵀ's rows that :class:`~tuner.distributed.spmv.DistributedSpMV` makes,
    from the degrees alone: balanced by in-degree, each rank's nodes by in- plus out-degree, those no
    row reads (no out-edge) last.

    Example (node 1 has no out-edge: last on its rank):
        >>> f = GraphFacts(3, 3, np.array([2, 0, 1]), np.array([1, 1, 1]), np.array([2.0, 0, 1]), np.dtype(np.int32), 1.0)
        >>> [r.tolist() for r in shard_partition(f, 2).rows]
        [[0], [2, 1]]
    """
    return square_partition(facts.in_degree, facts.out_degree, parts, xp)


def shard_rows(W, comm, partition: RowPartition, in_degree: np.ndarray, dtype, values: bool = True,
               piece_entries: int = PIECE_ENTRIES, xp=np) -> RankRows:
    """This rank's rows of Wᵀ (``partition.rows[rank]``, in that order; each row's columns ascending), from
    rank 0's ``W`` (SciPy CSR, canonical; None on the others) broadcast a piece of about ``piece_entries``
    entries at a time: each rank keeps the entries whose column it owns, where ``xp`` puts them (CuPy: on
    its GPU). The rows' lengths are known beforehand (``in_degree``, every node's), so each piece's entries
    are written straight to their places: the rank holds its rows and one piece, never a sort of all its
    entries. Values in ``dtype``; without ``values``, none.

    Example (rank 1 owns node 0: its row of Wᵀ is W's column 0):
        >>> import scipy.sparse as sp
        >>> from tuner.distributed.comm import LocalGroup
        >>> W = sp.csr_matrix(np.array([[0, 2.0, 1], [0, 0, 0], [3, 0, 0]]))
        >>> p = RowPartition(parts=2, owner=np.array([1, 0, 0]), rows=(np.array([1, 2]), np.array([0])),
        ...                  weight=np.array([2.0, 1.0]))
        >>> r = LocalGroup(2).run(lambda c: shard_rows(W if c.rank == 0 else None, c, p, np.array([1, 1, 1]),
        ...                                             np.float32, piece_entries=1))
        >>> r[1].indptr.tolist(), r[1].indices.tolist(), r[1].data.tolist()
        ([0, 1], [2], [3.0])
    """
    placer = RowPlacer(partition, comm.rank, in_degree, dtype, values, xp)
    cuts = None
    if comm.rank == 0:
        nnz = int(W.indptr[-1])
        cuts = np.unique(np.concatenate([[0], np.searchsorted(W.indptr, np.arange(0, nnz, max(piece_entries, 1)),
                                                              side="right") - 1, [W.shape[0]]])).astype(np.int64)
    cuts = comm.bcast_array(cuts)
    for r0, r1 in zip(cuts[:-1].tolist(), cuts[1:].tolist()):
        piece = None
        if comm.rank == 0:
            e0, e1 = int(W.indptr[r0]), int(W.indptr[r1])
            piece = (W.indptr[r0:r1 + 1] - e0, W.indices[e0:e1], W.data[e0:e1] if values else None)
        ptr = xp.asarray(comm.bcast_array(None if piece is None else piece[0].astype(np.int64)))
        cols = xp.asarray(comm.bcast_array(None if piece is None else piece[1]))
        vals = xp.asarray(comm.bcast_array(None if piece is None else piece[2])) if values else None
        placer.add(cols, lambda keep: r0 + xp.searchsorted(ptr, keep, side="right") - 1, vals)
    return placer.rows()


class RowPlacer:
    """A rank's rows of Wᵀ filled as edges arrive in any number of batches: each row's length is known
    beforehand (``in_degree``, every node's), so each batch's entries are written straight to their places,
    after the row's entries of earlier batches and in the batch's order. The rank holds its rows and one
    batch, never a sort of all its entries."""

    def __init__(self, partition: RowPartition, rank: int, in_degree: np.ndarray, dtype, values: bool, xp=np):
        mine = partition.rows[rank]
        self.xp, self.dtype, self.n_local = xp, dtype, int(mine.size)
        local = np.full(partition.owner.size, -1, np.int64)
        local[mine] = np.arange(self.n_local, dtype=np.int64)
        self.local = xp.asarray(local)
        self.indptr = np.zeros(self.n_local + 1, np.int64)
        np.cumsum(np.asarray(in_degree)[mine], out=self.indptr[1:])
        self.index_dtype = np.int32 if partition.owner.size <= np.iinfo(np.int32).max else np.int64
        self.indices = xp.empty(int(self.indptr[-1]), self.index_dtype)
        self.data = xp.empty(int(self.indptr[-1]), dtype) if values else None
        self.start = xp.array(self.indptr[:-1])  # each row's next place (a copy: NumPy's asarray would share)

    def add(self, targets, sources_of, vals=None) -> None:
        """A batch of edges: their ``targets`` (node ids), ``sources_of(kept)`` the sources of the kept
        positions of the batch, and their values (None without)."""
        xp = self.xp
        keep = xp.flatnonzero(self.local[targets] >= 0)
        slot = self.local[targets[keep]]
        by_row = stable_argsort(slot)  # the batch's entries of one row keep their order
        keep, slot = keep[by_row], slot[by_row]
        first = xp.searchsorted(slot, slot, side="left")
        at = self.start[slot] + (xp.arange(slot.size, dtype=np.int64) - first)
        self.indices[at] = sources_of(keep).astype(self.index_dtype)
        if self.data is not None:
            self.data[at] = vals[keep].astype(self.dtype)
        self.start += xp.bincount(slot, minlength=self.n_local)

    def rows(self) -> RankRows:
        """The rows, once every batch is in; refused where the batches did not fill exactly their lengths."""
        if not bool((host(self.start) == self.indptr[1:]).all()):
            raise MatrixError("the edges sent disagree with the in-degrees every rank was sent")
        return RankRows(indptr=self.indptr, indices=self.indices, data=self.data)


def rank_runs(rows: RankRows, position: np.ndarray, bounds: np.ndarray, xp=np) -> RankedRuns:
    """The :class:`RankedRuns` of this rank's rows in the tiles of column ``bounds`` over the plan's order
    (``position``: each node's place in it), a group of tiles at a time; rows numbered by node are
    renumbered in place (:func:`~tuner.distributed.rank_tiles.in_plan_numbers`) and so spent.

    Example (one row of 3 entries; tiles of columns 0-1 and 2-3):
        >>> rows = RankRows(np.array([0, 3]), np.array([3, 0, 1], np.int32))
        >>> r = rank_runs(rows, np.arange(4), np.array([0, 2, 4]))
        >>> r.ranked(0).tolist(), r.ranked(1).tolist()
        ([2], [1])
    """
    n = position.size
    plan_cols = in_plan_numbers(rows, position, xp).indices
    lengths, counts, offsets = [], [], [np.zeros(1, np.int64)]
    for g in grouped_tiles(xp.asarray(rows.indptr), plan_cols, None, bounds, xp.bincount(plan_cols, minlength=n)):
        r = tile_runs(g.tiled)
        lengths.append(r.lengths)
        counts.append(r.counts)
        offsets.append(r.offsets[1:] + offsets[-1][-1])
    return RankedRuns(np.concatenate(lengths), np.concatenate(counts), np.concatenate(offsets))


@dataclass(frozen=True)
class ShardParams:
    """The tiles the ranks share: ``tile_width`` columns (of the plan's order), each tile's workload size,
    and the predicted sum of the tiles' times (None without a profile: Algorithm 2's bounds alone)."""

    tile_width: int
    workloads: tuple
    predicted: float | None


def shard_params(facts: GraphFacts, rows: RankRows, comm, profile=None, value_dtype=np.float32,
                 xp=np, order: np.ndarray | None = None) -> ShardParams:
    """The tile width and workload sizes every rank uses (every rank calls it at once): for each of the
    L1's tile widths (:func:`~tuner.families.tiles.widths`) the ranks' runs are counted and added up, and
    Algorithm 2 over the lookup model (:func:`~tuner.model.tile_composite.timed_partition`) sizes every
    tile of the whole matrix as the one-GPU plan does; the width whose tiles sum to the least predicted time
    wins. Without a profile: the narrowest width, each tile at Algorithm 2's bounds
    (:func:`~tuner.families.tile_composite.bound_workloads`). ``order``: :meth:`GraphFacts.plan_order`, if made."""
    from ..model.tile_composite import timed_partition
    order = facts.plan_order(xp) if order is None else order
    position = np.empty(facts.n, np.int64)
    position[order] = np.arange(facts.n, dtype=np.int64)
    view = Structure(shape=(facts.n, facts.n), nnz=facts.nnz, index_dtype=facts.index_dtype,
                     value_dtype=np.dtype(value_dtype), value_free=facts.pattern_value is not None,
                     row_lengths=facts.in_degree[order], col_lengths=facts.out_degree[order])
    best = None
    for width in (widths(view, profile) if profile is not None else widths(view)[:1]):
        bounds = tile_bounds(view.col_lengths, width)
        mine = rank_runs(rows, position, bounds, xp)
        every = comm.allgather(np.concatenate([[mine.lengths.size], mine.lengths, mine.counts, mine.offsets]))
        runs = merge_runs([_unpack_runs(a) for a in every])
        timed = timed_partition(view, width, runs, profile) if profile is not None else None
        if timed is None:
            candidate = ShardParams(int(width), bound_workloads(runs), None)
        else:
            candidate = ShardParams(int(width), timed[0], timed[1])
        if best is None or (None not in (candidate.predicted, best.predicted) and
                            candidate.predicted < best.predicted):
            best = candidate
    return best


def _unpack_runs(a: np.ndarray) -> RankedRuns:
    k = int(a[0])
    return RankedRuns(a[1:1 + k], a[1 + k:1 + 2 * k], a[1 + 2 * k:])


def sharded_product(A, comm, dtype=np.float32, weighted: bool = True, overlap: bool = True, profile=None,
                    cache_dir=None, piece_entries: int = PIECE_ENTRIES):
    """PageRank's pull product Wᵀ x across the ranks of device communicator ``comm`` (every rank calls it;
    rank 0 passes the graph's adjacency matrix A, edge u -> v at A[u, v], the others None), no GPU ever
    holding more than its rows: a :class:`~tuner.distributed.spmv.DistributedSpMV` on the one-GPU plan's
    tiles (``kernel_kind`` 'tiled') whose ``pull_factors`` PageRank reads. ``profile``: the GPU's (default:
    the one found for it); ``setup_seconds`` splits 'facts', 'partition', 'rows', 'plan' and 'layout'.

    Example: see the module's.
    """
    import cupy
    from ..graph.pagerank import edge_weights
    W = edge_weights(A, weighted, keep_float=True) if comm.rank == 0 else None
    return product_of_shards(
        lambda: graph_facts(W, comm),
        lambda facts, partition, values: shard_rows(W, comm, partition, facts.in_degree, dtype, values=values,
                                                    piece_entries=piece_entries, xp=cupy),
        comm, dtype, weighted, overlap, profile, cache_dir)


def product_of_shards(make_facts, make_rows, comm, dtype=np.float32, weighted: bool = True, overlap: bool = True,
                      profile=None, cache_dir=None):
    """:func:`sharded_product` from wherever the graph comes: ``make_facts()`` gives every rank the
    :class:`GraphFacts`, ``make_rows(facts, partition, values)`` this rank's :class:`RankRows` on its GPU
    (values or none)."""
    import cupy
    from .. import gpu
    from ..cache import Cache
    from ..model import load_profile
    from ..stages import Stages
    from .rank_kernel import RankKernel
    from .rank_tiles import rank_tiles
    from .spmv import DistributedSpMV
    if profile is None:
        try:
            profile = load_profile(gpu.device_info().name)
        except FileNotFoundError:
            profile = None
    clock = Stages()
    facts = make_facts()
    clock.stage("facts")
    partition = shard_partition(facts, comm.size, xp=cupy)
    clock.stage("partition")
    values = facts.pattern_value is None
    rows = make_rows(facts, partition, values)
    clock.stage("rows")
    order = facts.plan_order(cupy)
    # A rank's columns index the gathered x, not the graph's entries: int32 wherever that buffer allows,
    # however many edges the whole graph has.
    index_dtype = np.dtype(np.int32 if comm.size * partition.width <= np.iinfo(np.int32).max else np.int64)
    params = shard_params(replace(facts, index_dtype=index_dtype), rows, comm, profile, dtype, xp=cupy,
                          order=order)
    clock.stage("plan")
    tiles = rank_tiles(rows, partition, comm.rank, order, facts.out_degree, params.tile_width,
                       index_dtype, values=values, workloads=params.workloads, xp=cupy)
    del rows
    kernel = RankKernel(tiles, np.dtype(dtype), index_dtype, not values,
                        facts.pattern_value if facts.pattern_value is not None else 1.0, Cache(cache_dir))
    clock.stage("layout")
    spmv = DistributedSpMV.from_rank_kernel(comm, partition, kernel, dtype, overlap, clock.seconds)
    spmv.pull_factors = (weighted, *facts.rank_cache_factors())
    return spmv
