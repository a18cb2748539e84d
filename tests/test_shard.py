"""A rank's rows of Aᵀ made without the whole graph on any rank (tuner.distributed.shard), checked on the host
against the path that holds the whole Wᵀ."""
import numpy as np
import pytest
import scipy.sparse as sp

from tests.conftest import power_law
from tuner.distributed.comm import LocalGroup
from tuner.distributed.rank_tiles import RankRows, rank_tiles
from tuner.distributed.shard import graph_facts, merge_runs, rank_runs, shard_params, shard_partition, shard_rows
from tuner.formats.device_reorder import gather_rows
from tuner.formats.tiles import ranked_runs_sorted, tile_bounds
from tuner.graph.pagerank import edge_weights, rank_cache_factors
from tuner.matrix import canonicalize


def graph(n=4000, seed=71, pattern=False):
    """A power-law digraph with hubs, dangling nodes and nodes nobody links to."""
    A = abs(power_law(n, seed=seed))
    if pattern:
        A.data[:] = 1
    return A


def facts_of(W, parts):
    return LocalGroup(parts).run(lambda c: graph_facts(W if c.rank == 0 else None, c))


@pytest.mark.parametrize("pattern", [False, True])
def test_every_rank_learns_the_degrees_and_rank_cache_factors_rank_0_holds(pattern):
    W = edge_weights(graph(pattern=pattern), keep_float=True)
    for f in facts_of(W, 3):
        assert np.array_equal(f.out_degree, np.diff(W.indptr))
        assert np.array_equal(f.in_degree, np.bincount(W.indices, minlength=W.shape[0]))
        dangling, inverse = rank_cache_factors(W)
        d, inv = f.rank_cache_factors()
        assert np.array_equal(d, dangling) and np.array_equal(inv, inverse)
        assert f.pattern_value == (1.0 if pattern else None) and f.index_dtype == np.int32
        assert (f.n, f.nnz) == (W.shape[0], W.nnz)


def test_the_partition_from_degrees_is_the_one_the_whole_matrix_gives():
    from tuner.distributed.spmv import DistributedSpMV
    W = edge_weights(graph(), keep_float=True)
    f = facts_of(W, 1)[0]
    Wt = W.T.tocsr()
    whole = LocalGroup(3).run(lambda c: DistributedSpMV(Wt, c, local_compile=lambda M: M.dot).partition)[0]
    mine = shard_partition(f, 3)
    assert all(np.array_equal(a, b) for a, b in zip(mine.rows, whole.rows))


@pytest.mark.parametrize("piece_entries", [1, 997, 1 << 27])
@pytest.mark.parametrize("values", [True, False])
def test_each_rank_keeps_exactly_its_rows_of_the_transpose_from_the_pieces_it_is_sent(piece_entries, values):
    W = edge_weights(graph(), keep_float=True)
    Wt = W.T.tocsr()
    f = facts_of(W, 1)[0]
    p = shard_partition(f, 3)
    got = LocalGroup(3).run(lambda c: shard_rows(W if c.rank == 0 else None, c, p, f.in_degree, np.float32,
                                                 values=values,
                                                 piece_entries=piece_entries))
    for r, rows in enumerate(got):
        ptr, idx, data = gather_rows(Wt.indptr, Wt.indices, Wt.data, p.rows[r])
        assert np.array_equal(rows.indptr, ptr) and np.array_equal(rows.indices, idx)
        assert rows.indices.dtype == np.int32
        assert (rows.data is None) if not values else (rows.data.dtype == np.float32 and np.array_equal(rows.data, data))


@pytest.mark.parametrize("width", [0, 64, 512])
def test_the_ranks_tile_runs_add_up_to_the_whole_plan_matrix_runs(monkeypatch, width):
    from tuner.formats import tiles
    monkeypatch.setattr(tiles, "GROUP_ENTRIES", 3000)  # several groups of tiles
    W = edge_weights(graph(), keep_float=True)
    Wt = W.T.tocsr()
    f = facts_of(W, 1)[0]
    p = shard_partition(f, 4)
    order = f.plan_order()
    position = np.empty(f.n, np.int64)
    position[order] = np.arange(f.n)
    plan = canonicalize(Wt[order][:, order])
    bounds = tile_bounds(f.out_degree[order], width)
    whole = ranked_runs_sorted(plan.indptr, plan.indices, [bounds])[0]
    parts = [rank_runs(RankRows(*gather_rows(Wt.indptr, Wt.indices, None, rows)), position, bounds)
             for rows in p.rows]
    merged = merge_runs(parts)
    for field in ("lengths", "counts", "offsets"):
        assert np.array_equal(getattr(merged, field), getattr(whole, field)), field


def test_the_ranks_choose_the_tiles_the_one_gpu_planner_offers_for_the_whole_matrix():
    from tuner.families import tile_composite
    from tuner.model import load_profile
    profile = load_profile("NVIDIA H100 80GB HBM3")
    A = graph(60000, seed=72)  # wider than the L1's tiles: several widths, several tiles each
    W = edge_weights(A, keep_float=True)
    f = facts_of(W, 1)[0]
    p = shard_partition(f, 3)

    def rank(c):
        rows = shard_rows(W if c.rank == 0 else None, c, p, f.in_degree, np.float32)
        return shard_params(f, rows, c, profile)
    chosen = LocalGroup(3).run(rank)
    assert all(c == chosen[0] for c in chosen) and chosen[0].predicted > 0
    offered = {q.tile_width: q.workloads for q in tile_composite.space(canonicalize(W.T.tocsr()), profile)}
    assert offered[chosen[0].tile_width] == chosen[0].workloads


def test_without_a_profile_the_ranks_take_algorithm_2s_bounds_on_the_narrowest_width():
    from tuner.families import tile_composite
    W = edge_weights(graph(), keep_float=True)
    f = facts_of(W, 1)[0]
    p = shard_partition(f, 2)
    chosen = LocalGroup(2).run(lambda c: shard_params(
        f, shard_rows(W if c.rank == 0 else None, c, p, f.in_degree, np.float32), c, None))[0]
    first = tile_composite.space(canonicalize(W.T.tocsr()))[0]
    assert (chosen.tile_width, chosen.workloads, chosen.predicted) == (first.tile_width, first.workloads, None)


@pytest.mark.parametrize("group_entries", [2000, 1 << 40])
def test_a_ranks_tiles_from_its_picked_rows_equal_those_gathered_from_the_whole_transpose(monkeypatch, group_entries):
    from tuner.formats import tiles
    from tuner.formats.tile_composite import evaluate_tile_composite
    W = edge_weights(graph(), keep_float=True)
    Wt = W.T.tocsr()
    f = facts_of(W, 1)[0]
    p = shard_partition(f, 3)
    order = f.plan_order()
    x = np.random.default_rng(4).uniform(0.5, 1.5, f.n)
    expected = [rank_tiles(Wt, p, r, order, f.out_degree, 64) for r in range(3)]
    monkeypatch.setattr(tiles, "GROUP_ENTRIES", group_entries)
    for r, one in enumerate(expected):
        rows = RankRows(*gather_rows(Wt.indptr, Wt.indices, Wt.data, p.rows[r]))
        got = rank_tiles(rows, p, r, order, f.out_degree, 64, workloads=one.workloads)
        assert rows.indices is None and rows.data is None  # released before the parts were joined
        for field in ("cols", "vals", "rows", "wl_slot", "wl_row", "wl_w", "wl_h", "tile_warps"):
            assert np.array_equal(getattr(got.layout, field), getattr(one.layout, field)), field
        assert (got.chunks, got.phase_warps, got.workloads) == (one.chunks, one.phase_warps, one.workloads)
        buf = got.chunks.arrange([np.pad(x[q], (0, p.width - q.size)) for q in p.rows])
        y = evaluate_tile_composite(got.layout, buf, got.n_rows)
        assert np.allclose(y, (Wt.astype(np.float64) @ x)[p.rows[r]], rtol=1e-6)


def test_a_rank_made_from_its_tiles_has_the_state_of_one_made_from_the_whole_matrix():
    from types import SimpleNamespace
    from tuner.distributed.spmv import DistributedSpMV
    W = sp.random(50, 50, density=0.1, format="csr", random_state=1)
    whole = LocalGroup(1).run(lambda c: DistributedSpMV(W, c, local_compile=lambda M: M.dot))[0]
    made = DistributedSpMV.from_rank_kernel(whole.comm, whole.partition, SimpleNamespace(tiles=SimpleNamespace(nnz=7)),
                                            np.float32)
    assert set(vars(made)) == set(vars(whole)) and made.kernel_kind == "tiled" and made.local_nnz == 7


def test_pagerank_without_the_graph_needs_a_product_with_its_rank_cache_factors():
    from tuner.distributed.pagerank import pagerank_on_devices
    with pytest.raises(ValueError, match="sharded_product"):
        pagerank_on_devices(None, None)


def test_a_non_square_graph_is_refused_on_rank_0():
    from tuner.matrix import MatrixError
    with pytest.raises(MatrixError, match="square"):
        graph_facts(sp.random(5, 6, density=0.5, format="csr"), LocalGroup(1).run(lambda c: c)[0])


def test_pagerank_with_a_product_made_on_the_host_reads_no_factors_from_it():
    from types import SimpleNamespace
    from tuner.distributed.pagerank import pagerank_on_devices
    with pytest.raises(ValueError, match="sharded_product"):  # factors None: refused, not a TypeError
        pagerank_on_devices(None, None, product=SimpleNamespace(pull_factors=None))
    with pytest.raises(ValueError, match="sharded_product"):  # factors for other weights
        pagerank_on_devices(None, None, weighted=False, product=SimpleNamespace(pull_factors=(True, None, None)))


def kron_case(k=3):
    from tuner.generators import kronecker, kronecker_blocks
    G = abs(power_law(300, seed=74))
    return kronecker_blocks(G, None, k), kronecker(G, None, k)


def test_a_kronecker_graphs_degrees_come_from_its_factor_and_grid_alone():
    from tuner.distributed.generated import kronecker_facts
    b, K = kron_case()
    f, whole = kronecker_facts(b), facts_of(edge_weights(K, keep_float=True), 1)[0]
    for field in ("out_degree", "in_degree", "out_weight"):
        assert np.array_equal(getattr(f, field), getattr(whole, field)), field
    assert (f.n, f.nnz, f.pattern_value, f.index_dtype) == (whole.n, whole.nnz, 1.0, whole.index_dtype)


def test_each_rank_generates_exactly_its_rows_of_the_kronecker_graphs_transpose():
    from tuner.distributed.generated import kronecker_facts, kronecker_rows
    b, K = kron_case()
    Kt = K.T.tocsr()
    f = kronecker_facts(b)
    p = shard_partition(f, 3)
    for r in range(3):
        rows = kronecker_rows(b, p, r, f.in_degree)
        got = sp.csr_matrix((np.ones(rows.indices.size), rows.indices, rows.indptr), shape=(p.rows[r].size, f.n))
        got.sort_indices()  # a row's columns come block by block
        ptr, idx, _ = gather_rows(Kt.indptr, Kt.indices, None, p.rows[r])
        assert np.array_equal(got.indptr, ptr) and np.array_equal(got.indices, idx)


def test_the_sampled_check_of_a_kronecker_graph_equals_the_whole_product_on_its_nodes():
    from tuner.distributed.generated import kronecker_pull
    b, K = kron_case()
    x = np.random.default_rng(5).uniform(0.5, 1.5, K.shape[0])
    nodes = np.sort(np.random.default_rng(6).choice(K.shape[0], 700, replace=False))
    assert np.allclose(kronecker_pull(b, x, nodes), (K.T @ x)[nodes], rtol=1e-12, atol=0)


def test_only_kronecker_specs_are_generated_rank_by_rank():
    from tuner.distributed.generated import blocks_of
    with pytest.raises(ValueError, match="only kron:PATH:K"):
        blocks_of("rmat:10")
