"""Graphs every rank generates its own part of: a Kronecker-scaled graph (``kron:PATH:K``) never exists
whole, on the host or on any GPU.

The graph is :func:`tuner.generators.kronecker`'s, the same for the same arguments: G's edges copied into a
grid of blocks and relabelled by one permutation (:class:`~tuner.generators.KroneckerBlocks`, which every
rank makes from G alone). Its degrees follow from G's and the grid's without a single edge, so every rank
knows every node's (:func:`kronecker_facts`), hence the partition; each rank then runs through the blocks on
its GPU and keeps the edges into the nodes it owns (:func:`kronecker_rows`). A row's columns come block by
block, not ascending: the products sum them in another order, equal to float rounding.

Example (on a GPU machine, one MPI rank per GPU):
    >>> spmv = generated_product("kron:ego-Twitter.npz:8", comm)           # doctest: +SKIP
"""
from __future__ import annotations

import numpy as np

from ..generators import KroneckerBlocks, kronecker_blocks
from .partition import RowPartition
from .rank_tiles import RankRows
from .shard import GraphFacts, RowPlacer, product_of_shards


def generated(source) -> bool:
    """Whether ranks generate ``source`` themselves: a ``kron:PATH:K`` spec.

    Example:
        >>> generated("kron:g.npz:3"), generated("rmat:10"), generated("graph.npz")
        (True, False, False)
    """
    from .. import loaders
    return isinstance(source, str) and loaders.is_spec(source) and loaders.parse_spec(source).kind == "kron"


def blocks_of(source: str) -> KroneckerBlocks:
    """The :class:`~tuner.generators.KroneckerBlocks` of a ``kron:PATH:K`` spec, as
    :func:`tuner.loaders.load` would build that graph.

    Example:
        >>> blocks_of("rmat:8")
        Traceback (most recent call last):
        ...
        ValueError: only kron:PATH:K graphs are generated rank by rank, got 'rmat:8'
    """
    from .. import loaders
    if not generated(source):
        raise ValueError(f"only kron:PATH:K graphs are generated rank by rank, got {source!r}")
    path, k = loaders.parse_spec(source).args
    return kronecker_blocks(loaders.load(path), None, k)


def kronecker_facts(b: KroneckerBlocks) -> GraphFacts:
    """Every node's degrees of the square Kronecker graph ``b`` (a pattern: every weight 1), from G's and the
    grid's: node ``perm[B * g + i]`` has G's node i's out-degree times the blocks in block row B (in-degree:
    its in-degree times those in block column B).

    Example (G a 2-cycle plus a loop, one seed factor):
        >>> from tuner.generators import kronecker
        >>> G = np.array([[1, 1], [1, 0]])
        >>> f = kronecker_facts(kronecker_blocks(G, k=1))
        >>> K = kronecker(G, k=1)
        >>> f.out_degree.tolist() == np.diff(K.indptr).tolist(), f.in_degree.tolist() == np.bincount(K.indices, minlength=4).tolist()
        (True, True)
    """
    if b.shape[0] != b.shape[1] or b.g_shape[0] != b.g_shape[1]:
        raise ValueError(f"a graph's adjacency matrix is square, got {b.shape}")
    g = b.g_shape[0]
    grid = b.shape[0] // g
    out_unperm = (np.bincount(b.block_rows, minlength=grid)[:, None] *
                  np.bincount(b.g_rows, minlength=g)[None, :]).ravel()
    in_unperm = (np.bincount(b.block_cols, minlength=grid)[:, None] *
                 np.bincount(b.g_cols, minlength=g)[None, :]).ravel()
    out_degree, in_degree = _relabelled(out_unperm, b.row_perm), _relabelled(in_unperm, b.col_perm)
    index_dtype = np.int32 if max(b.shape[0], b.nnz) <= np.iinfo(np.int32).max else np.int64
    return GraphFacts(n=b.shape[0], nnz=b.nnz, out_degree=out_degree, in_degree=in_degree,
                      out_weight=out_degree.astype(np.float64), index_dtype=np.dtype(index_dtype), pattern_value=1.0)


def _relabelled(values: np.ndarray, perm: np.ndarray | None) -> np.ndarray:
    """``values`` of node x moved to node ``perm[x]``."""
    if perm is None:
        return values.astype(np.int64)
    out = np.empty_like(values, dtype=np.int64)
    out[perm] = values
    return out


def kronecker_rows(b: KroneckerBlocks, partition: RowPartition, rank: int, in_degree: np.ndarray,
                   xp=np) -> RankRows:
    """This rank's rows of the Kronecker graph's transpose (no values: a pattern), its GPU running through the
    blocks (with ``xp`` CuPy) and keeping each block's edges into its nodes.

    Example: see tests/test_shard.py.
    """
    placer = RowPlacer(partition, rank, in_degree, np.float32, False, xp)
    g = b.g_shape[0]
    g_rows, g_cols = xp.asarray(b.g_rows), xp.asarray(b.g_cols)
    perm = xp.asarray(b.row_perm if b.row_perm is not None else np.arange(b.shape[0], dtype=np.int64))
    for r, c in zip(b.block_rows.tolist(), b.block_cols.tolist()):
        targets = perm[c * g + g_cols]
        placer.add(targets, lambda keep, r=r: perm[r * g + g_rows[keep]])
    return placer.rows()


def kronecker_pull(b: KroneckerBlocks, x: np.ndarray, nodes: np.ndarray) -> np.ndarray:
    """(Aᵀ x)[nodes] in float64 for the Kronecker graph ``b`` (every edge weighing 1), from G's in-edges and
    the grid alone: the sampled check of a graph too large to build.

    Example:
        >>> from tuner.generators import kronecker
        >>> G = np.array([[0, 1, 1], [0, 0, 1], [1, 0, 0]])
        >>> b, x = kronecker_blocks(G, k=2), np.arange(12.0)
        >>> bool(np.allclose(kronecker_pull(b, x, np.array([0, 5, 11])), (kronecker(G, k=2).T @ x)[[0, 5, 11]]))
        True
    """
    import scipy.sparse as sp
    g = b.g_shape[0]
    perm = b.row_perm if b.row_perm is not None else np.arange(b.shape[0], dtype=np.int64)
    where = np.empty_like(perm)
    where[perm] = np.arange(perm.size, dtype=perm.dtype)  # unrelabelled id of each node
    block_col, j = np.divmod(where[nodes], g)
    into = sp.csr_matrix((np.ones(b.g_rows.size), (b.g_cols, b.g_rows)), shape=(g, g))  # G's in-edges
    out = np.zeros(nodes.size)
    for c in np.unique(block_col).tolist():
        picked = np.flatnonzero(block_col == c)
        block_rows = b.block_rows[b.block_cols == c]
        starts, ends = into.indptr[j[picked]], into.indptr[j[picked] + 1]
        lengths = ends - starts
        owner = np.repeat(np.arange(picked.size), lengths)
        sources = into.indices[np.repeat(starts - np.cumsum(np.r_[0, lengths[:-1]]), lengths) + np.arange(lengths.sum())]
        for r in block_rows.tolist():
            out[picked] += np.bincount(owner, weights=x[perm[r * g + sources]], minlength=picked.size)
    return out


def generated_product(graph, comm, dtype=np.float32, overlap: bool = True, profile=None, cache_dir=None):
    """:func:`~tuner.distributed.shard.sharded_product` of a ``kron:PATH:K`` graph (the spec, or its
    :func:`blocks_of`) that no rank builds: each loads G, makes the same facts and partition, and generates
    its own rows on its GPU.

    Example: see the module's.
    """
    import cupy
    b = blocks_of(graph) if isinstance(graph, str) else graph
    return product_of_shards(
        lambda: kronecker_facts(b),
        lambda facts, partition, values: kronecker_rows(b, partition, comm.rank, facts.in_degree, xp=cupy),
        comm, dtype, True, overlap, profile, cache_dir)
