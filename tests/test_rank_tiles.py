"""A rank's rows in the one-GPU plan's tiles (tuner.distributed.rank_tiles), checked on the host."""
import numpy as np
import pytest
import scipy.sparse as sp

from tests.conftest import power_law
from tuner.distributed.partition import bitonic_partition
from tuner.distributed.rank_tiles import GatherChunks, first_tiles, rank_tiles
from tuner.formats.reorder import by_decreasing
from tuner.formats.tile_composite import evaluate_tile_composite


def plan_inputs(W):
    """The partition DistributedSpMV makes and the one-GPU plan's order (by decreasing row + column length)."""
    rows, cols = np.diff(W.indptr), np.bincount(W.indices, minlength=W.shape[1])
    return rows, cols, by_decreasing(rows + cols)


def buffer_of(x, partition, chunks):
    return chunks.arrange([np.pad(x[r], (0, partition.width - r.size)) for r in partition.rows])


@pytest.mark.parametrize("parts", [2, 3, 4])
@pytest.mark.parametrize("width", [0, 64, 700])
def test_every_rank_multiplies_its_rows_from_the_chunked_buffer(parts, width):
    W = power_law(3000, seed=61)
    rows, cols, order = plan_inputs(W)
    p = bitonic_partition(rows, parts, order_by=rows + cols)
    x = np.random.default_rng(3).uniform(0.5, 1.5, 3000)
    expected = W.astype(np.float64) @ x
    for r in range(parts):
        t = rank_tiles(W, p, r, order, cols, width)
        y = evaluate_tile_composite(t.layout, buffer_of(x, p, t.chunks), t.n_rows)
        assert np.allclose(y, expected[p.rows[r]], rtol=1e-12, atol=1e-9)
        assert t.nnz == W[p.rows[r]].nnz and len(t.workloads) == t.layout.tile_warps.size - 1


def test_a_pattern_matrix_keeps_no_values_and_multiplies_by_its_pattern_value():
    W = power_law(2000, seed=62)
    W.data[:] = 1
    rows, cols, order = plan_inputs(W)
    p = bitonic_partition(rows, 2, order_by=rows + cols)
    x = np.random.default_rng(4).uniform(0.5, 1.5, 2000)
    t = rank_tiles(W, p, 1, order, cols, 128, values=False)
    assert t.layout.vals is None
    y = evaluate_tile_composite(t.layout, buffer_of(x, p, t.chunks), t.n_rows, pattern_value=1.0)
    assert np.allclose(y, (W @ x)[p.rows[1]], rtol=1e-12)


def test_the_first_phase_reads_only_the_first_chunk_and_holds_the_hub_tiles():
    W = power_law(6000, seed=63).T.tocsr()  # Zipf column lengths: a few hub columns, as Aᵀ of a graph
    rows, cols, order = plan_inputs(W)
    p = bitonic_partition(rows, 4, order_by=rows + cols)
    for r in range(4):
        t = rank_tiles(W, p, r, order, cols, 64)
        f, (_, w1, warps) = t.layout, t.phase_warps
        assert len(t.chunks.cuts) == 3 and 0 < w1 < warps
        first_chunk_end = 4 * t.chunks.cuts[1]
        spans = [f.cols[s:s + w * abs(h)] for s, w, h in zip(f.wl_slot[:w1], f.wl_w[:w1], f.wl_h[:w1])]
        read = np.concatenate(spans)
        assert read[read >= 0].max() < first_chunk_end
        # The hub tiles: few columns (a small first chunk), many of the entries.
        assert (read >= 0).sum() >= 0.3 * t.nnz and t.chunks.cuts[1] <= p.width // 8


def test_gather_chunks_place_every_slot_once_and_refuse_bad_cuts():
    c = GatherChunks(3, (0, 2, 5))
    parts = [np.arange(5) + 10 * r for r in range(3)]
    buf = c.arrange(parts)
    rank, k = np.repeat(np.arange(3), 5), np.tile(np.arange(5), 3)
    at = c.offsets(rank, k)
    assert sorted(at.tolist()) == list(range(15)) and np.array_equal(buf[at], 10 * rank + k)
    assert c.pieces() == [(0, 2, 0), (2, 5, 6)] and c.width == 5
    for bad in [(1, 5), (0, 3, 3), (0,)]:
        with pytest.raises(ValueError, match="cuts must rise strictly from 0"):
            GatherChunks(2, bad)


def test_first_tiles_counts_the_leading_tiles_within_the_share_of_columns():
    bounds = np.array([0, 100, 200, 300, 1600])
    assert first_tiles(bounds, 1 / 16) == 1  # 100 columns: the first tile, though 1/16 is 100
    assert first_tiles(bounds, 0.2) == 3 and first_tiles(bounds, 0.01) == 1 and first_tiles(bounds, 1.0) == 4
    assert first_tiles(np.array([0, 1600])) == 1


def test_x_that_no_row_reads_is_not_gathered():
    W = power_law(6000, seed=65).T.tocsr()  # most columns empty, as a graph's dangling nodes in Aᵀ
    rows, cols, order = plan_inputs(W)
    key = rows + cols + (rows + cols).max() * (cols > 0)  # DistributedSpMV's slots: read columns first
    p = bitonic_partition(rows, 3, order_by=key)
    x = np.random.default_rng(7).uniform(0.5, 1.5, 6000)
    read_per_rank = np.bincount(p.owner[cols > 0], minlength=3)
    for r in range(3):
        t = rank_tiles(W, p, r, order, cols, 64)
        assert t.chunks.width == read_per_rank.max() < 0.6 * p.width
        y = evaluate_tile_composite(t.layout, buffer_of(x, p, t.chunks), t.n_rows)
        assert np.allclose(y, (W.astype(np.float64) @ x)[p.rows[r]], rtol=1e-12)


def test_one_tile_means_one_chunk_and_one_phase():
    W = sp.random(300, 300, density=0.02, format="csr", random_state=5)
    rows, cols, order = plan_inputs(W)
    p = bitonic_partition(rows, 2, order_by=rows + cols)
    t = rank_tiles(W, p, 0, order, cols, 0)
    assert len(t.chunks.cuts) == 2 and t.phase_warps == (0, t.layout.warps)


def test_ranks_take_the_fastest_predicted_tile_composite_plan_even_where_the_model_picks_another_family():
    from types import SimpleNamespace

    from tuner.compiler import model_ranking
    from tuner.distributed.spmv import DistributedSpMV
    from tuner.families.tile_composite import TileCompositeParams
    from tuner.matrix import canonicalize
    from tuner.model import load_profile
    options = {"profile": load_profile("NVIDIA H100 80GB HBM3")}
    m = canonicalize(power_law(4000, seed=66).T.tocsr())  # small: the model plans another family for it
    ranking = model_ranking(m, options["profile"])
    fastest_tiles = next(s for s, _ in ranking if s.family == "tile_composite")
    assert ranking[0][0].family != "tile_composite"
    rank = SimpleNamespace(one_gpu_family=None)
    params = lambda *a: DistributedSpMV._tile_params(rank, m, *a)  # noqa: E731
    assert params("auto", True, options) == fastest_tiles.params and rank.one_gpu_family == ranking[0][0].family
    assert params("compile", True, options) is None and params("tiles", False, options) is None
    forced = params("tiles", True, {**options, "family": "csr_vector"})  # no plan asked: Algorithm 2's bounds
    assert isinstance(forced, TileCompositeParams) and len(forced.workloads) >= 1 and rank.one_gpu_family is None
    assert params("auto", True, {**options, "family": "csr_vector"}) is None


def test_an_unknown_rank_kernel_is_refused_by_name():
    from tuner.distributed.comm import LocalGroup
    from tuner.distributed.spmv import DistributedSpMV
    with pytest.raises(ValueError, match="rank_kernel must be one of"):
        LocalGroup(1).run(lambda c: DistributedSpMV(sp.eye(4, format="csr"), c, rank_kernel="rows"))


@pytest.mark.parametrize("values", [True, False])
def test_rows_gathered_from_device_arrays_give_the_scipy_gathers_layout(values):
    from tuner.formats.device_reorder import DeviceCsr
    W = power_law(3000, seed=64)
    rows, cols, order = plan_inputs(W)
    p = bitonic_partition(rows, 3, order_by=rows + cols)
    csr = DeviceCsr(W.indptr.copy(), W.indices.copy(), W.data.copy() if values else None)  # NumPy stands in
    for r in range(3):
        a = rank_tiles(W, p, r, order, cols, 64, values=values).layout
        b = rank_tiles(csr, p, r, order, cols, 64, values=values).layout
        for field in ("cols", "rows", "wl_slot", "wl_row", "wl_w", "wl_h") + (("vals",) if values else ()):
            assert np.array_equal(getattr(a, field), getattr(b, field)), field
