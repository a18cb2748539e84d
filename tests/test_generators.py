import time

import numpy as np
import pytest
import scipy.sparse as sp

from tuner.generators import kronecker, kronecker_size, rmat, rmat_size
from tuner.memory import InsufficientMemoryError


def assert_same_graph(gpu, host):
    """A graph built on the GPU is the host's array for array, dtypes included."""
    assert_canonical_pattern(gpu, host.shape)
    assert gpu.indptr.dtype == host.indptr.dtype and gpu.indices.dtype == host.indices.dtype
    assert np.array_equal(gpu.indptr, host.indptr) and np.array_equal(gpu.indices, host.indices)
    assert np.array_equal(gpu.data, host.data) and gpu.has_canonical_format


def assert_canonical_pattern(A, shape):
    assert isinstance(A, sp.csr_matrix)
    assert A.shape == shape
    assert A.dtype == np.float32
    assert A.indices.dtype == A.indptr.dtype == np.int32
    assert np.all(A.data == 1.0)
    assert A.indptr[0] == 0 and A.indptr[-1] == A.nnz == A.indices.size
    rows = np.repeat(np.arange(shape[0]), np.diff(A.indptr))
    keys = rows.astype(np.int64) * shape[1] + A.indices
    assert np.all(np.diff(keys) > 0), "indices must be sorted within rows and free of duplicates"
    assert A.nnz == 0 or (A.indices.min() >= 0 and A.indices.max() < shape[1])
    assert A.has_sorted_indices


# --- rmat --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rmat14():
    return rmat(14)


def test_rmat_is_a_canonical_float32_pattern_of_2_to_the_scale_nodes(rmat14):
    assert_canonical_pattern(rmat14, (2**14, 2**14))
    assert rmat14.has_canonical_format


def test_rmat_nnz_is_edge_factor_times_n_less_a_few_duplicates(rmat14):
    drawn = 16 * 2**14
    assert 0.85 * drawn < rmat14.nnz <= drawn
    assert rmat14.nnz < drawn, "R-MAT at scale 14 always draws some duplicate edges"


def test_rmat_degree_distribution_is_skewed(rmat14):
    out_degree = np.diff(rmat14.indptr)
    in_degree = np.bincount(rmat14.indices, minlength=2**14)
    assert out_degree.max() > 20 * out_degree.mean()
    assert in_degree.max() > 20 * in_degree.mean()
    assert np.count_nonzero(out_degree == 0) > 0.1 * 2**14


# 11 levels: the second byte of packed bits is only partly used; 36 levels: 64-bit node ids.
@pytest.mark.parametrize(("scale", "node_dtype"), [(11, np.uint32), (36, np.uint64)])
def test_rmat_levels_pick_quadrants_with_the_given_probabilities(scale, node_dtype):
    from tuner.generators import _quadrant_thresholds, _rmat_edges

    rows, cols = _rmat_edges(np.random.SFC64(0), 1 << 16, scale, _quadrant_thresholds(0.5, 0.2, 0.1))
    assert rows.dtype == cols.dtype == node_dtype
    assert rows.max() < 2**scale and cols.max() < 2**scale
    for level in range(scale):
        row_bit, col_bit = (rows >> level) & 1, (cols >> level) & 1
        freq = [np.mean((row_bit == i) & (col_bit == j)) for i in (0, 1) for j in (0, 1)]
        assert np.allclose(freq, [0.5, 0.2, 0.1, 0.2], atol=0.01), (level, freq)


def test_rmat_with_equal_quadrant_probabilities_is_uniform_random():
    # a = b = c = d: every (row, col) pair is equally likely, so degrees are Poisson around 16.
    uniform = rmat(12, a=0.25, b=0.25, c=0.25)
    degree = np.diff(uniform.indptr)
    assert degree.max() < 3 * degree.mean()
    assert uniform.nnz > 0.99 * 16 * 2**12
    skewed = rmat(12, a=0.7, b=0.1, c=0.1)
    assert np.diff(skewed.indptr).max() > 20 * np.diff(skewed.indptr).mean()


def test_rmat_is_deterministic_for_a_seed_and_differs_across_seeds():
    a = rmat(10, 8, seed=7)
    b = rmat(10, 8, seed=7)
    c = rmat(10, 8, seed=8)
    assert np.array_equal(a.indptr, b.indptr) and np.array_equal(a.indices, b.indices)
    assert a.nnz != c.nnz or not np.array_equal(a.indices, c.indices)
    assert (a != c).nnz > 0.5 * a.nnz


def test_rmat_does_not_depend_on_the_thread_count():
    # Scale 17 draws 2 Mi edges: two random-stream blocks and several row partitions.
    one = rmat(17, 16, seed=3, threads=1)
    three = rmat(17, 16, seed=3, threads=3)
    assert np.array_equal(one.indptr, three.indptr)
    assert np.array_equal(one.indices, three.indices)


def test_rmat_matches_a_plain_scipy_build_of_the_same_edges(monkeypatch):
    # Recompute the partitioned sort with scipy's COO -> CSR on the same generated keys.
    import tuner.generators as generators

    kept = []
    original = generators._rmat_block

    def spy(*args):
        keys, offsets = original(*args)
        kept.append((keys.copy(), offsets.copy()))
        return keys, offsets

    monkeypatch.setattr(generators, "_rmat_block", spy)
    A = rmat(9, 4, seed=5)
    layout = generators._PartitionLayout(9, generators._partition_bits(9, 4 * 2**9))
    rows, cols = [], []
    for keys, offsets in kept:
        for p in range(layout.count):
            part_keys = keys[offsets[p] : offsets[p + 1]]
            rows.append((part_keys >> np.uint64(9)).astype(np.int64) + p * layout.rows_per_part)
            cols.append((part_keys & np.uint64(2**9 - 1)).astype(np.int64))
    rows, cols = np.concatenate(rows), np.concatenate(cols)
    assert rows.size == 4 * 2**9
    expected = sp.csr_matrix((np.ones(rows.size), (rows, cols)), shape=(2**9, 2**9))
    expected.sum_duplicates()
    assert np.array_equal(A.indptr, expected.indptr)
    assert np.array_equal(A.indices, expected.indices)


def test_rmat_keeps_self_loops_and_works_at_tiny_scales():
    A = rmat(1, 8, seed=1)
    assert_canonical_pattern(A, (2, 2))
    assert A.nnz <= 4
    assert rmat(3, 64).diagonal().sum() > 0


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"scale": 0}, "scale"),
        ({"scale": 41}, "scale"),
        ({"scale": 2.5}, "scale"),
        ({"scale": True}, "scale"),
        ({"scale": 4, "edge_factor": 0}, "edge_factor"),
        ({"scale": 4, "a": 0.0}, "a"),
        ({"scale": 4, "b": 1.0}, "b"),
        ({"scale": 4, "c": -0.1}, "c"),
        ({"scale": 4, "a": 0.5, "b": 0.3, "c": 0.2}, "a + b + c"),
        ({"scale": 4, "seed": -1}, "seed"),
        ({"scale": 4, "threads": 0}, "threads"),
    ],
)
def test_rmat_rejects_bad_arguments_naming_them(kwargs, name):
    with pytest.raises(ValueError, match=name.replace("+", r"\+")):
        rmat(**kwargs)


def test_the_graph_draw_kernels_compile_for_sm_90(tmp_path):
    from tuner import codegen, device_generators
    from tuner.cache import Cache
    binary = codegen.compile_source(device_generators.source(), "sm_90", cache=Cache(tmp_path))
    for name in ("rmat_draw", "rmat_relabel", "kron_keys", "key_firsts", "key_csr_i32", "key_csr_i64"):
        assert name.encode() in binary.cubin


def test_rmat_asked_for_on_a_gpu_where_none_is_reachable_is_refused_by_name_and_drawn_on_the_host_by_default(
        monkeypatch):
    from tuner import device_generators
    from tuner.formats import device_reorder
    from tuner.gpu import NoDeviceError
    monkeypatch.setattr(device_reorder, "available", lambda: False)
    with pytest.raises(NoDeviceError, match="cannot be drawn on the GPU"):
        rmat(12, 8, seed=3, device=True)
    monkeypatch.setattr(device_generators, "pays", lambda blocks, threads: True)  # a GPU would be asked first
    A, host = rmat(12, 8, seed=3), rmat(12, 8, seed=3, device=False)
    assert (A != host).nnz == 0 and A.nnz == host.nnz > 0


@pytest.mark.gpu
@pytest.mark.parametrize(("scale", "edge_factor", "probabilities", "seed"), [
    (10, 8, (0.57, 0.19, 0.19), 3),  # one block, part of it drawn
    (17, 4, (0.45, 0.15, 0.25), 7),  # other quadrant probabilities; scale not a multiple of 8
    (21, 16, (0.57, 0.19, 0.19), 0),  # 32 blocks, levels padded from 21 to 24
])
def test_rmat_drawn_on_the_gpu_is_the_host_graph_array_for_array(scale, edge_factor, probabilities, seed):
    from tuner.formats import device_reorder
    if not device_reorder.available():
        pytest.skip("no GPU reachable through CuPy")
    a, b, c = probabilities
    gpu = rmat(scale, edge_factor, a, b, c, seed=seed, device=True)
    host = rmat(scale, edge_factor, a, b, c, seed=seed, device=False)
    assert_same_graph(gpu, host)


@pytest.mark.gpu
def test_rmat_drawn_on_the_gpu_with_int64_indices_is_the_host_graph(monkeypatch):
    from tuner import device_generators
    from tuner.formats import device_reorder
    if not device_reorder.available():
        pytest.skip("no GPU reachable through CuPy")
    host = rmat(15, 8, seed=5, device=False)
    # The kernel of int64 indices, as past 2**31 entries (SciPy narrows what it gets back to int32 here).
    monkeypatch.setattr(device_generators, "_index_dtype", lambda shape, nnz: np.int64)
    gpu = rmat(15, 8, seed=5, device=True)
    assert np.array_equal(gpu.indptr, host.indptr) and np.array_equal(gpu.indices, host.indices)


# --- kronecker ---------------------------------------------------------------------------------------

G = np.array(
    [
        [0, 1, 1, 0],
        [0, 0, 1, 0],
        [1, 0, 0, 1],
        [0, 0, 0, 1],
    ]
)
S = np.array([[1, 1], [1, 0]])


def explicit_kron(seed, k, graph):
    power = sp.csr_matrix(np.ones((1, 1)))
    for _ in range(k):
        power = sp.kron(power, seed, format="csr")
    return (sp.kron(power, graph).toarray() != 0).astype(np.float32)


def test_kronecker_without_permutation_equals_scipy_kron():
    K = kronecker(G, S, 3, permute=False)
    assert_canonical_pattern(K, (2**3 * 4, 2**3 * 4))
    assert np.array_equal(K.toarray(), explicit_kron(S, 3, G))
    assert K.nnz == 3**3 * 6


def test_kronecker_default_seed_is_the_three_entry_2x2_initiator():
    assert np.array_equal(kronecker(G, None, 2, permute=False).toarray(), explicit_kron(S, 2, G))


def test_kronecker_permutation_relabels_the_same_graph():
    plain = kronecker(G, S, 3, permute=False)
    shuffled = kronecker(G, S, 3, rng_seed=4)
    assert_canonical_pattern(shuffled, plain.shape)
    assert shuffled.nnz == plain.nnz
    assert np.array_equal(np.sort(np.diff(shuffled.indptr)), np.sort(np.diff(plain.indptr)))
    assert np.array_equal(
        np.sort(np.bincount(shuffled.indices, minlength=32)), np.sort(np.bincount(plain.indices, minlength=32))
    )
    assert shuffled.diagonal().sum() == plain.diagonal().sum(), "one permutation for rows and columns"
    assert (shuffled != plain).nnz > 0
    assert np.array_equal(shuffled.toarray(), kronecker(G, S, 3, rng_seed=4).toarray())


@pytest.mark.parametrize("graph,seed,k", [(G, S, 3), (G, np.array([[1, 0, 1]]), 2), (G[:3], S, 2), (G, None, 0)])
def test_kronecker_relabels_by_the_seeded_permutations_drawn_rows_first(graph, seed, k):
    # The same graph for the same seeds as ever: the explicit product, rows and columns relabelled by the
    # permutations a default_rng(rng_seed) draws (the rows', then the columns' where not square).
    plain = sp.csr_matrix(explicit_kron(S if seed is None else seed, k, graph))
    rng = np.random.default_rng(9)
    rows = rng.permutation(plain.shape[0])
    cols = rows if plain.shape[0] == plain.shape[1] else rng.permutation(plain.shape[1])
    coo = plain.tocoo()
    expected = sp.csr_matrix((coo.data, (rows[coo.row], cols[coo.col])), shape=plain.shape)
    K = kronecker(graph, seed, k, rng_seed=9)
    assert_canonical_pattern(K, plain.shape)
    assert (K != expected).nnz == 0 and K.nnz == plain.nnz


def test_kronecker_builds_in_blocks_on_several_threads_as_on_one(monkeypatch):
    from tuner import generators
    A = rmat(10, 8, seed=3)
    many = kronecker(A, None, 3, rng_seed=2, device=False)
    monkeypatch.setattr(generators, "_thread_count", lambda threads: 1)
    one = kronecker(A, None, 3, rng_seed=2, device=False)
    for field in ("indptr", "indices", "data"):
        a, b = getattr(many, field), getattr(one, field)
        assert a.dtype == b.dtype and np.array_equal(a, b), field


def test_kronecker_asked_for_on_a_gpu_where_none_is_reachable_is_refused_by_name_and_built_on_the_host_by_default(
        monkeypatch):
    from tuner import device_generators
    from tuner.formats import device_reorder
    from tuner.gpu import NoDeviceError
    monkeypatch.setattr(device_reorder, "available", lambda: False)
    with pytest.raises(NoDeviceError, match=r"kronecker\(k=3\) cannot be built on the GPU"):
        kronecker(G, S, 3, device=True)
    monkeypatch.setattr(device_generators, "kron_pays", lambda edges: True)  # a GPU would be asked first
    K, host = kronecker(G, S, 3, rng_seed=4), kronecker(G, S, 3, rng_seed=4, device=False)
    assert (K != host).nnz == 0 and K.nnz == host.nnz == 27 * 6


def test_kronecker_keys_past_64_bits_are_left_to_the_host(monkeypatch):
    from tuner import device_generators
    from tuner.formats import device_reorder
    from tuner.generators import KroneckerBlocks
    monkeypatch.setattr(device_reorder, "available", lambda: True)  # as on a GPU machine

    def asked(*args):
        raise AssertionError("the GPU was asked")
    monkeypatch.setattr(device_reorder, "free_bytes", asked)
    monkeypatch.setattr(device_reorder, "on_device", asked)
    none = np.zeros(0, np.int64)
    wide = KroneckerBlocks(none, none, (2**40, 2**40), none, none, (2**40, 2**40), 0, None, None)
    assert device_generators.kronecker(wide) is None  # 40 bits of a row and 40 of a column
    assert device_generators._column_bits(2**40) == 40 and device_generators._column_bits(2**40 + 1) == 41


@pytest.mark.gpu
@pytest.mark.parametrize(("graph", "seed", "k", "permute"), [
    (G, S, 3, True),  # square: one permutation for rows and columns
    (G, np.array([[1, 0, 1]]), 2, True),  # rectangular: a permutation each
    (G[:3], S, 2, False),  # no permutation; a graph with an empty row
    ("rmat", None, 3, True),  # 27 blocks of a few thousand edges, a column count not a power of two
    (np.zeros((5, 5)), S, 2, True),  # no edges at all
])
def test_kronecker_built_on_the_gpu_is_the_host_graph_array_for_array(graph, seed, k, permute):
    from tuner.formats import device_reorder
    if not device_reorder.available():
        pytest.skip("no GPU reachable through CuPy")
    if isinstance(graph, str):
        graph = rmat(10, 4, seed=6)[:1000, :999]
    gpu = kronecker(graph, seed, k, permute=permute, rng_seed=3, device=True)
    host = kronecker(graph, seed, k, permute=permute, rng_seed=3, device=False)
    assert_same_graph(gpu, host)


@pytest.mark.gpu
def test_kronecker_built_on_the_gpu_with_int64_indices_is_the_host_graph(monkeypatch):
    from tuner import device_generators
    from tuner.formats import device_reorder
    if not device_reorder.available():
        pytest.skip("no GPU reachable through CuPy")
    A = rmat(9, 4, seed=8)
    host = kronecker(A, None, 2, device=False)
    monkeypatch.setattr(device_generators, "_index_dtype", lambda shape, nnz: np.int64)
    gpu = kronecker(A, None, 2, device=True)
    assert np.array_equal(gpu.indptr, host.indptr) and np.array_equal(gpu.indices, host.indices)


def test_kronecker_of_sparse_inputs_with_values_uses_their_pattern():
    graph = sp.coo_matrix(G * 2.5)
    seed = sp.csr_matrix(S * 7)
    K = kronecker(graph, seed, 2, permute=False)
    assert np.array_equal(K.toarray(), explicit_kron(S, 2, G))


def test_kronecker_k0_returns_the_graph_pattern():
    assert np.array_equal(kronecker(sp.csr_matrix(G * 3.0), k=0, permute=False).toarray(), G != 0)
    shuffled = kronecker(G, k=0)
    assert shuffled.shape == G.shape and shuffled.nnz == np.count_nonzero(G)


def test_kronecker_of_a_real_sized_graph_keeps_nnz_power_law():
    A = rmat(8, 4, seed=2)
    K = kronecker(A, None, 4)
    assert K.shape == (2**4 * 256, 2**4 * 256)
    assert K.nnz == 3**4 * A.nnz
    assert_canonical_pattern(K, K.shape)


def test_kronecker_rectangular_seed():
    seed = np.array([[1, 0, 1]])
    K = kronecker(G, seed, 2, permute=False)
    assert K.shape == (4, 9 * 4)
    assert np.array_equal(K.toarray(), explicit_kron(seed, 2, G))
    shuffled = kronecker(G, seed, 2)
    assert shuffled.shape == (4, 36) and shuffled.nnz == K.nnz


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"k": -1}, "k must"),
        ({"k": 1.5}, "k must"),
        ({"seed": np.ones(3)}, "seed must be 2-D"),
        ({"seed": np.ones((0, 2))}, "seed must have at least one row"),
        ({"rng_seed": -2}, "rng_seed"),
    ],
)
def test_kronecker_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        kronecker(G, **{"k": 1, **kwargs})


# --- host memory -------------------------------------------------------------------------------------


def traced_peak(build):
    """Peak bytes NumPy allocates (as traced by tracemalloc) while ``build()`` runs."""
    import tracemalloc

    tracemalloc.start()
    try:
        build()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_rmat_size_counts_nodes_and_drawn_edges_without_drawing():
    n, m, peak = rmat_size(25)
    assert (n, m) == (2**25, 16 * 2**25)
    assert 20 * m < peak < 30 * m, "about 20 B per drawn edge plus nodes and working space"
    assert rmat_size(12, 4)[:2] == (4096, 4 * 4096)


def test_rmat_size_bounds_the_arrays_a_real_build_allocates():
    _, m, peak = rmat_size(16, threads=2)
    traced = traced_peak(lambda: rmat(16, threads=2))
    assert traced <= peak <= 3 * traced


def test_rmat_size_grows_per_edge_with_wider_indices():
    per_edge = [rmat_size(scale)[2] / rmat_size(scale)[1] for scale in (24, 28, 36)]
    assert per_edge[0] < per_edge[1] < per_edge[2]


@pytest.mark.parametrize(
    ("kwargs", "name"), [({"scale": 41}, "scale"), ({"scale": 5, "edge_factor": 0}, "edge_factor")]
)
def test_rmat_size_rejects_bad_arguments_naming_them(kwargs, name):
    with pytest.raises(ValueError, match=name):
        rmat_size(**kwargs)


def test_rmat_40_is_refused_at_once_with_the_figure():
    start = time.perf_counter()
    message = r"rmat\(scale=40, edge_factor=16\) would need about [\d.]+ TB"
    with pytest.raises(InsufficientMemoryError, match=message) as info:
        rmat(40)
    assert time.perf_counter() - start < 1.0
    assert "17.6T drawn edges" in str(info.value) and "is available" in str(info.value)
    assert info.value.need_bytes > 4 * 10**14


def test_rmat_within_a_small_memory_limit_is_refused(monkeypatch):
    monkeypatch.setenv("TUNER_HOST_MEMORY_LIMIT", "1M")
    with pytest.raises(InsufficientMemoryError, match=r"rmat\(scale=12.*1\.0 MB is available"):
        rmat(12)


def test_kronecker_size_matches_the_built_shape_and_nnz():
    A = rmat(8, 4, seed=2)
    shape, nnz, _ = kronecker_size(A.shape, A.nnz, 3)
    K = kronecker(A, None, 3)
    assert shape == K.shape and nnz == K.nnz == 27 * A.nnz
    assert kronecker_size(G.shape, np.count_nonzero(G), 2, seed=np.array([[1, 0, 1]]))[:2] == ((4, 36), 4 * 6)


def test_kronecker_size_bounds_the_arrays_a_real_build_allocates():
    A = rmat(12, 8)
    _, nnz, peak = kronecker_size(A.shape, A.nnz, 3)
    traced = traced_peak(lambda: kronecker(A, None, 3, device=False))
    assert 16 * nnz < peak < 24 * nnz, "16 B per output edge with int32 indices, and the blocks in flight"
    assert 0.95 * traced <= peak <= 1.2 * traced


def test_kronecker_size_of_an_unknown_shape_counts_the_edges_only():
    shape, nnz, peak = kronecker_size(None, 1000, 2)
    assert shape is None and nnz == 9000 and peak >= 20 * nnz  # int64 indices assumed


def test_kronecker_size_with_a_huge_k_is_refused_as_unaddressable_at_once():
    start = time.perf_counter()
    with pytest.raises(ValueError, match="larger than int64 indices"):
        kronecker_size((10, 10), 20, 10**9)
    assert time.perf_counter() - start < 1.0


def test_kronecker_that_cannot_fit_is_refused_before_building():
    start = time.perf_counter()
    message = r"kronecker\(graph of shape \(4, 4\) and 6 non-zeros, k=30\)"
    with pytest.raises(InsufficientMemoryError, match=message) as info:
        kronecker(G, None, 30)
    assert time.perf_counter() - start < 1.0
    assert "B per output edge x 1.2P output edges" in str(info.value)
