"""Synthetic power-law graphs: Graph500 R-MAT and Kronecker scaling of a given graph.

They are the embedded default data: every command can run on ``rmat:23`` or ``kron:FILE:4`` with no
file at hand. Both return canonical CSR pattern matrices (sorted column indices, no duplicates, all
stored values float32 1.0) with int32 indices when the shape and nnz fit in int32, else int64.

>>> A = rmat(10, edge_factor=8)
>>> A.shape, A.dtype, A.indices.dtype
((1024, 1024), dtype('float32'), dtype('int32'))
>>> kronecker(A, k=2).shape
(4096, 4096)
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from numbers import Integral, Real

import numpy as np
import scipy.sparse as sp

from .memory import check_fits, human_count

__all__ = ["rmat", "kronecker", "rmat_size", "kronecker_size"]

# Edges per random stream. Fixed (not derived from the thread count) so that a seed always gives the
# same graph; 2**20 edges is large enough to amortise per-block Python overhead.
_BLOCK_EDGES = 1 << 20
# Edges per vectorised step inside a block: large enough that the NumPy calls, each of which takes the
# GIL, are few; small enough that the temporaries (about 7 B per edge and level) stay in cache.
_STEP_EDGES = 1 << 16
# Target edges per row partition of the final sort: partitions sort in parallel and stay cache-sized.
_PART_EDGES = 1 << 20
# Partition ids are sorted with NumPy's radix sort, which it uses for integer types of 16 bits or less.
_MAX_PART_BITS = 16

_INT32_MAX = int(np.iinfo(np.int32).max)
_INT64_MAX = int(np.iinfo(np.int64).max)

# 2x2 initiator with 3 non-zeros: nnz grows 3x per Kronecker step and the degrees stay power-law.
_DEFAULT_KRON_SEED = np.array([[1, 1], [1, 0]], dtype=np.float32)

# --- peak host memory, per the arrays alive at each algorithm's peak ---------------------------------
# Checked against tuner.memory before anything large is allocated. The figures were measured as the
# process's VmHWM growth (/proc/self/status) and with tracemalloc; see rmat_size and kronecker_size.

# R-MAT, per drawn edge: the blocks' uint64 keys (8 B; alive through the dedupe phase, then freed but
# mostly kept by glibc, whose heaps hold every allocation under its 32 MB mmap threshold, such as the
# 8 MB key arrays of the blocks), each partition's kept columns (uint32, 8 B above scale 32), and the
# result's indices (int32, int64 once nnz passes 2**31 - 1) and float32 values.
_RMAT_KEY_BYTES = 8
_RMAT_VALUE_BYTES = 4
# R-MAT, per node: the relabelling permutation (drawn as int64, kept as uint32; 12 B), the partitions'
# int64 row counts and their concatenation (16 B), then the result's index pointer (4 or 8 B) and, when
# that is int32, the int64 buffer np.cumsum fills before casting into it (8 B).
_RMAT_NODE_BYTES = 28
_CUMSUM_CAST_BYTES = 8
# R-MAT, per worker thread while drawing: one block's keys, partition ids, stable sort order and sorted
# copy (26 B per edge of the block), and one step's uniforms and bit arrays (8 B per edge and level).
_RMAT_BLOCK_WORK = 26
_RMAT_STEP_WORK = 8
# R-MAT, per worker thread while deduplicating: a partition's merged keys, keep mask, unique keys,
# local rows and masked columns (33 B per edge of the partition) and its kept columns.
_RMAT_PARTITION_WORK = 33

# Kronecker, per output edge: its int64 (row, column) key; per edge of G and block in flight, the block's
# int64 rows and columns and their relabelled copies.
_KRON_KEY_BYTES = 8
_KRON_BLOCK_BYTES = 32

# _pattern_csr, per edge on top of the int64 rows and columns its caller holds: sort keys (8 B), keep
# mask (1), deduplicated keys (8), their divmod into rows and columns (16, the pre-dedupe keys freed by
# then), and the result's indices and float32 values. lexsort order and reordered copies instead when
# rows * columns overflows int64 keys. Per row: int64 row counts, then the index pointer (and the cumsum
# buffer when that is int32).
_PATTERN_KEY_BYTES = 8 + 1 + 16 + 4
_PATTERN_LEXSORT_BYTES = 8 + 16 + 1 + 16 + 8
_PATTERN_ROW_BYTES = 8


def rmat(
    scale: int,
    edge_factor: int = 16,
    a: float = 0.57,
    b: float = 0.19,
    c: float = 0.19,
    seed: int = 0,
    threads: int | None = None,
    device: bool | None = None,
) -> sp.csr_matrix:
    """Graph500 R-MAT graph with ``2**scale`` nodes as a canonical CSR pattern matrix.

    ``edge_factor * 2**scale`` edges are drawn; for each of the ``scale`` bit levels every edge draws
    one uniform number and descends into the top-left, top-right, bottom-left or bottom-right quadrant
    with probabilities ``a``, ``b``, ``c`` and ``d = 1 - a - b - c``. Node ids are then relabelled by
    one seeded random permutation (rows and columns alike), so that high-degree nodes are not all at
    small ids. Duplicate edges are dropped; self-loops are kept. The graph depends only on the
    arguments other than ``threads``: edges come in fixed-size blocks, each with its own random stream
    spawned from ``numpy.random.SeedSequence(seed)``, and ``threads`` only sets how many blocks run at
    once (NumPy releases the GIL in the random generator, ufuncs and sorts).

    Args:
        scale: log2 of the number of nodes, 1..40 (memory bounds it far lower in practice: building
            takes about 20-25 bytes per drawn edge, 2.8 GB at scale 23; see :func:`rmat_size`). A scale
            whose estimated peak exceeds the available host memory raises
            :class:`~tuner.memory.InsufficientMemoryError` at once, before drawing.
        edge_factor: edges drawn per node, >= 1 (Graph500 uses 16).
        a, b, c: quadrant probabilities, each in (0, 1), with ``a + b + c < 1``.
        seed: non-negative integer seed.
        threads: worker threads; default: the CPUs this process may run on.
        device: draw on the GPU (:mod:`tuner.device_generators`: the same graph, array for array); None (the
            default) where CuPy reaches one and the host would need three rounds of blocks or more
            (:func:`~tuner.device_generators.pays`), and the GPU has the memory; True raises
            :class:`~tuner.gpu.NoDeviceError` where it cannot.

    Returns:
        ``scipy.sparse.csr_matrix`` of shape ``(2**scale, 2**scale)``, float32 values all 1.0.

    Example:
        >>> A = rmat(14)                      # 16,384 nodes, 262,144 edges drawn
        >>> A.shape, A.dtype
        ((16384, 16384), dtype('float32'))
        >>> 0.85 < A.nnz / (16 * 2**14) <= 1.0    # a few percent are duplicates
        True
        >>> bool((A.data == 1).all()) and A.has_sorted_indices
        True
    """
    _check_rmat_args(scale, edge_factor, a, b, c, seed)
    workers = _thread_count(threads)
    if device or device is None:
        from . import device_generators
        if device or device_generators.pays(-(-(edge_factor << scale) // _BLOCK_EDGES), workers):
            drawn = device_generators.rmat(scale, edge_factor, a, b, c, seed, workers)
            if drawn is not None:
                return drawn
            if device:
                from .gpu import NoDeviceError
                raise NoDeviceError(f"rmat(scale={scale}, edge_factor={edge_factor}) cannot be drawn on the GPU: "
                                    "none is reachable through CuPy, the scale is over "
                                    f"{device_generators.MAX_SCALE} or the device lacks the memory")
    n, m, peak = rmat_size(scale, edge_factor, threads=workers)
    check_fits(peak, f"rmat(scale={scale}, edge_factor={edge_factor})", per_edge_text(peak, m, "drawn edge"))
    thresholds = _quadrant_thresholds(a, b, c)

    n_blocks = -(-m // _BLOCK_EDGES)
    perm_seq, *block_seqs = np.random.SeedSequence(seed).spawn(1 + n_blocks)
    node_dtype = np.uint32 if scale <= 32 else np.uint64
    perm = np.random.default_rng(perm_seq).permutation(n).astype(node_dtype)

    part_bits = _partition_bits(scale, m)
    layout = _PartitionLayout(scale, part_bits)

    def block(i: int):
        count = min(_BLOCK_EDGES, m - i * _BLOCK_EDGES)
        return _rmat_block(block_seqs[i], count, scale, thresholds, perm, layout)

    def partition(p: int):
        return _dedupe_partition(p, blocks, layout)

    with ThreadPoolExecutor(max_workers=workers) as pool:
        blocks = list(pool.map(block, range(n_blocks)))
        del perm
        parts = list(pool.map(partition, range(layout.count)))
        del blocks
        return _assemble(parts, n, pool)


def rmat_size(scale: int, edge_factor: int = 16, *, threads: int = 1) -> tuple[int, int, int]:
    """Size of ``rmat(scale, edge_factor, threads=threads)`` without building it: ``(n, drawn_edges,
    peak_bytes)``.

    ``drawn_edges = edge_factor * 2**scale`` bounds the non-zeros from above (duplicates are dropped).
    ``peak_bytes`` is the estimated peak host memory of the build, as the process's high-water mark:
    20 B per drawn edge up to scale 26 at edge factor 16 (24 B once nnz may pass int32, 28 B above
    scale 32), 36-40 B per node, and a working set per thread in flight. Measured VmHWM growth
    (``/proc/self/status``) at edge factor 16 with 2 threads: 415 MB at scale 20 (estimate 457 MB),
    0.79 GB at 21 (0.83), 1.18 GB at 22 (1.59), 2.83 GB at 23 (3.10): an upper bound within 1.05-1.35x.
    tracemalloc, which sees only live arrays, measures 13-14 B per drawn edge; the rest is memory glibc
    keeps after it is freed. Raises ValueError for a bad argument.

    Example:
        >>> n, m, peak = rmat_size(23)
        >>> n, m, round(peak / 1e9, 1)
        (8388608, 134217728, 3.1)
        >>> rmat_size(40)[2] > 4 * 10**14     # 17.6T drawn edges: 0.5 PB
        True
    """
    _check_int("scale", scale, low=1, high=40)
    _check_int("edge_factor", edge_factor, low=1)
    _check_int("threads", threads, low=1)
    n = 1 << scale
    m = edge_factor * n
    return n, m, _rmat_peak_bytes(scale, m, threads)


def _rmat_peak_bytes(scale: int, m: int, threads: int) -> int:
    n = 1 << scale
    col_bytes = 4 if scale <= 32 else 8
    idx_bytes = np.dtype(_index_dtype((n, n), m)).itemsize
    per_edge = _RMAT_KEY_BYTES + col_bytes + idx_bytes + _RMAT_VALUE_BYTES
    per_node = _RMAT_NODE_BYTES + _index_pointer_bytes(idx_bytes)
    levels = -(-scale // 8) * 8
    drawing = _RMAT_BLOCK_WORK * min(m, _BLOCK_EDGES) + _RMAT_STEP_WORK * levels * min(m, _STEP_EDGES)
    part_edges = m >> _partition_bits(scale, m)
    deduping = (_RMAT_PARTITION_WORK + col_bytes) * part_edges
    in_flight = min(threads, -(-m // _BLOCK_EDGES))
    return per_edge * m + per_node * n + in_flight * max(drawing, deduping)


def kronecker_size(g_shape, g_nnz: int, k: int, seed=None) -> tuple[tuple[int, int] | None, int, int]:
    """Size of ``kronecker(G, seed, k)`` for a G of shape ``g_shape`` and ``g_nnz`` stored non-zeros,
    without building it: ``(shape, nnz, peak_bytes)``.

    ``nnz = nnz(S)**k * nnz(G)`` (exact when G has no explicit zeros or duplicates). ``peak_bytes`` is
    the estimated peak host memory of the build (with the default permutation): 16 B per output edge with
    int32 indices (the int64 (row, column) key, the index and the float32 value), 20 B with int64; 32 B
    per edge of G for each block being made at once (one per thread this process may run, at most one per
    block); 24-28 B per node and 32 B per edge of G. The estimate is meant to bound the build's high-water
    mark from above, by a few percent. Beyond int64 (row, column) keys the build sorts coordinates
    instead, at 49-53 B per output edge. ``g_shape`` may be None when unknown (an edge list before it is
    parsed): the shape is then None and the estimate counts the edges only, with int64 indices. Raises
    ValueError for a bad ``k`` or seed, or when the result could not be addressed by int64 indices.

    Example:
        >>> shape, nnz, peak = kronecker_size((325557, 325557), 3216152, 4)    # cnr-2000 scaled 4 times
        >>> shape, nnz, 16 * nnz < peak < 30 * nnz
        ((5208912, 5208912), 260508312, True)
        >>> kronecker_size((3, 3), 4, 2, seed=[[1, 0, 1]])[:2]
        ((3, 27), 16)
    """
    _check_k(k)
    _check_int("g_nnz", g_nnz, low=0)
    if seed is None:
        s_shape, s_nnz = _DEFAULT_KRON_SEED.shape, int(np.count_nonzero(_DEFAULT_KRON_SEED))
    else:
        s_rows, _, s_shape = _pattern_coords(seed, "seed")
        s_nnz = s_rows.size
    return _kron_size(g_shape, int(g_nnz), s_shape, s_nnz, int(k))


def _kron_size(g_shape, g_nnz: int, s_shape, s_nnz: int, k: int):
    shape = None if g_shape is None else _kron_shape(g_shape, s_shape, k)
    nnz = s_nnz**k * g_nnz
    blocks = s_nnz**k
    if shape is not None and shape[0] * shape[1] > _INT64_MAX:
        # Coordinates and a lexsort (_pattern_csr): the int64 rows and columns (16 B), twice while they are
        # permuted, then what _pattern_csr adds; the permutations and _pattern_csr's row arrays per node.
        per_edge = 16 + max(16, pattern_csr_bytes_per_edge(shape, nnz))
        permuted = shape[0] + (shape[1] if shape[1] != shape[0] else 0)
        node_bytes = 8 * permuted + pattern_csr_bytes_per_row(shape, nnz) * shape[0]
        return shape, nnz, per_edge * nnz + node_bytes + 16 * g_nnz
    # _kron_csr: the int64 keys, the result's indices and float32 values per edge; per block in flight, its
    # int64 rows and columns and their relabelled copies; per node, the permutations (int64), the searched
    # row pointers (int64) and their cast.
    idx_bytes = 8 if shape is None else np.dtype(_index_dtype(shape, nnz)).itemsize
    per_edge = _KRON_KEY_BYTES + idx_bytes + 4
    in_flight = _KRON_BLOCK_BYTES * g_nnz * min(_thread_count(None), max(blocks, 1))
    node_bytes = 0
    if shape is not None:
        permuted = shape[0] + (shape[1] if shape[1] != shape[0] else 0)
        node_bytes = 8 * permuted + (8 + idx_bytes) * (shape[0] + 1)
    # G's int64 pattern coordinates stay alive throughout, and its COO copy while they are made.
    return shape, nnz, per_edge * nnz + node_bytes + in_flight + 32 * g_nnz


def _kron_shape(g_shape, s_shape, k: int) -> tuple[int, int]:
    """``(s_rows**k * g_rows, s_cols**k * g_cols)``; ValueError once it passes int64 indices."""
    shape = (int(g_shape[0]), int(g_shape[1]))
    too_big = ValueError(f"k={k} makes the result larger than int64 indices can address")
    for s_dim in s_shape:
        # Checked by logarithm first so that a huge k costs no huge integer power.
        if s_dim > 1 and k * np.log2(s_dim) > 64:
            raise too_big
    shape = (s_shape[0] ** k * shape[0], s_shape[1] ** k * shape[1])
    if max(shape) > _INT64_MAX:
        raise too_big
    return shape


def pattern_csr_bytes_per_edge(shape, nnz: int) -> int:
    """Bytes per edge the CSR build of a pattern (``_pattern_csr``) allocates on top of the int64 rows
    and columns it is given; ``shape`` None counts int32 indices and int64 sort keys.

    Example:
        >>> pattern_csr_bytes_per_edge((1000, 1000), 5000), pattern_csr_bytes_per_edge((2**40, 2**40), 2**32)
        (33, 53)
    """
    if shape is not None and shape[0] * shape[1] > _INT64_MAX:
        return _PATTERN_LEXSORT_BYTES + 4
    idx_bytes = np.dtype(_index_dtype(shape or (1, 1), nnz)).itemsize
    return _PATTERN_KEY_BYTES + idx_bytes


def pattern_csr_bytes_per_row(shape, nnz: int) -> int:
    """Bytes per row the CSR build of a pattern allocates: int64 row counts, the index pointer and,
    when that is int32, the int64 buffer ``np.cumsum`` fills before casting into it.

    Example:
        >>> pattern_csr_bytes_per_row((1000, 1000), 5000), pattern_csr_bytes_per_row((2**40, 2**40), 5000)
        (20, 16)
    """
    idx_bytes = np.dtype(_index_dtype(shape or (1, 1), nnz)).itemsize
    return _PATTERN_ROW_BYTES + _index_pointer_bytes(idx_bytes)


def _index_pointer_bytes(idx_bytes: int) -> int:
    return idx_bytes + (_CUMSUM_CAST_BYTES if idx_bytes < 8 else 0)


def per_edge_text(peak_bytes: int, edges: int, unit: str) -> str:
    """How a peak was estimated, for :class:`~tuner.memory.InsufficientMemoryError` messages.

    Example:
        >>> per_edge_text(422 * 10**12, 17_592_186_044_416, "drawn edge")
        '24 B per drawn edge x 17.6T drawn edges'
    """
    return f"{peak_bytes / max(edges, 1):.0f} B per {unit} x {human_count(edges)} {unit}s"


def kronecker(
    graph,
    seed=None,
    k: int = 1,
    *,
    permute: bool = True,
    rng_seed: int = 0,
    device: bool | None = None,
) -> sp.csr_matrix:
    """Kronecker scaling of ``graph``: the pattern of ``S (x) S (x) ... (x) S (x) G`` (``k`` factors S).

    Every edge of G is replicated once per non-zero of the k-th Kronecker power of the seed S: the
    result has shape ``(s_rows**k * g_rows, s_cols**k * g_cols)`` and ``nnz(S)**k * nnz(G)`` non-zeros.
    With the default seed ``[[1, 1], [1, 0]]`` nnz grows 3x per step for 2x the nodes, and G's
    power-law degree distribution is kept. Only the patterns of ``graph`` and ``seed`` count (stored
    non-zero entries); the result holds float32 1.0 values.

    Args:
        graph: SciPy sparse matrix or 2-D array (G).
        seed: SciPy sparse matrix or 2-D 0/1 array (S); default ``[[1, 1], [1, 0]]``.
        k: number of seed factors, >= 0; ``k = 0`` gives G's pattern.
        permute: relabel node ids by a random permutation so that the blocks of the product are not
            laid out in order; a square result uses one permutation for rows and columns, so it stays
            the same graph up to relabelling.
        rng_seed: seed of that permutation.
        device: build on the GPU (:mod:`tuner.device_generators`: the same graph, array for array); None (the
            default) where CuPy reaches one, the graph has enough edges for it to pay
            (:func:`~tuner.device_generators.kron_pays`) and the GPU has the memory; True raises
            :class:`~tuner.gpu.NoDeviceError` where it cannot.

    Returns:
        Canonical ``scipy.sparse.csr_matrix``, float32 values, int32 indices if they fit else int64.

    Raises:
        ValueError: a bad argument, or a result int64 indices cannot address.
        InsufficientMemoryError: the peak of :func:`kronecker_size` exceeds the available host memory;
            raised before the result's arrays are allocated.

    Example:
        >>> import numpy as np
        >>> G = np.array([[0, 1, 1], [0, 0, 1], [1, 0, 0]])
        >>> K = kronecker(G, k=2, permute=False)
        >>> K.shape, K.nnz                    # (2**2 * 3) nodes, 3**2 * 4 edges
        ((12, 12), 36)
        >>> kronecker(G, k=2).nnz             # relabelled, same size
        36
    """
    def fits(g_shape, g_nnz: int, nnz: int, peak: int) -> None:  # before even the blocks are listed
        check_fits(peak, f"kronecker(graph of shape {g_shape} and {human_count(g_nnz)} non-zeros, k={k})",
                   per_edge_text(peak, nnz, "output edge"))
    b = kronecker_blocks(graph, seed, k, permute=permute, rng_seed=rng_seed, check=fits)
    if device or device is None:
        from . import device_generators
        if device or device_generators.kron_pays(b.nnz):
            made = device_generators.kronecker(b)
            if made is not None:
                return made
            if device:
                from .gpu import NoDeviceError
                raise NoDeviceError(f"kronecker(k={k}) cannot be built on the GPU: none is reachable through CuPy, "
                                    "the device lacks the memory or a (row, column) key needs over 64 bits")
    if b.shape[0] * b.shape[1] > _INT64_MAX:  # (row, column) keys would overflow: coordinates and a lexsort
        rows = (b.block_rows[:, None] * b.g_shape[0] + b.g_rows[None, :]).ravel()
        cols = (b.block_cols[:, None] * b.g_shape[1] + b.g_cols[None, :]).ravel()
        if permute:
            rows, cols = b.row_perm[rows], b.col_perm[cols]
        return _pattern_csr(rows, cols, b.shape)
    return _kron_csr(b.g_rows, b.g_cols, b.g_shape, b.block_rows, b.block_cols, b.shape, b.row_perm, b.col_perm)


@dataclass(frozen=True, eq=False)
class KroneckerBlocks:
    """A Kronecker-scaled graph as :func:`kronecker` builds it, without its edges: G's edges, the grid of
    blocks where the k-th power of the seed places a copy of G, and the relabelling.

    Edge (i, j) of G in block b is edge (``row_perm[block_rows[b] * g_rows_n + i]``,
    ``col_perm[block_cols[b] * g_cols_n + j]``) of the result (no permutation: None).

    Attributes:
        g_rows, g_cols, g_shape: G's pattern (int64 coordinates) and shape.
        block_rows, block_cols: each block's place in the grid (int64).
        shape, nnz: the result's.
        row_perm, col_perm: the relabelling (one permutation for a square result), or None.
    """

    g_rows: np.ndarray
    g_cols: np.ndarray
    g_shape: tuple
    block_rows: np.ndarray
    block_cols: np.ndarray
    shape: tuple
    nnz: int
    row_perm: np.ndarray | None
    col_perm: np.ndarray | None


def kronecker_blocks(graph, seed=None, k: int = 1, *, permute: bool = True, rng_seed: int = 0,
                     check=None) -> KroneckerBlocks:
    """:func:`kronecker`'s graph as :class:`KroneckerBlocks` (arguments as there): what generates any part
    of it, such as the edges into some nodes, without the rest. ``check(g_shape, g_nnz, nnz, peak_bytes)``
    may refuse the graph (by raising) before its blocks are listed.

    Example:
        >>> b = kronecker_blocks(np.array([[0, 1], [1, 1]]), k=2)
        >>> b.shape, b.nnz, b.block_rows.tolist(), b.block_cols.tolist()
        ((8, 8), 27, [0, 0, 1, 0, 0, 1, 2, 2, 3], [0, 1, 0, 2, 3, 2, 0, 1, 0])
    """
    _check_k(k)
    _check_int("rng_seed", rng_seed, low=0)
    g_rows, g_cols, g_shape = _pattern_coords(graph, "graph")
    s_rows, s_cols, s_shape = _pattern_coords(_DEFAULT_KRON_SEED if seed is None else seed, "seed")
    _, nnz, peak = _kron_size(g_shape, g_rows.size, s_shape, s_rows.size, int(k))
    if check is not None:
        check(g_shape, g_rows.size, nnz, peak)
    # S (x) ... (x) S (x) G is a grid of blocks: block (I, J) is G wherever the k-th power of S has (I, J).
    block_rows, block_cols = np.zeros(1, np.int64), np.zeros(1, np.int64)
    shape = g_shape
    for _ in range(int(k)):  # nnz(S)**k blocks: a few dozen
        block_rows = (s_rows[:, None] * (shape[0] // g_shape[0]) + block_rows[None, :]).ravel()
        block_cols = (s_cols[:, None] * (shape[1] // g_shape[1]) + block_cols[None, :]).ravel()
        shape = (shape[0] * s_shape[0], shape[1] * s_shape[1])
    row_perm = col_perm = None
    if permute:
        rng = np.random.default_rng(rng_seed)
        row_perm = rng.permutation(shape[0])
        col_perm = row_perm if shape[0] == shape[1] else rng.permutation(shape[1])
    return KroneckerBlocks(g_rows=g_rows, g_cols=g_cols, g_shape=g_shape, block_rows=block_rows,
                           block_cols=block_cols, shape=shape, nnz=int(nnz), row_perm=row_perm, col_perm=col_perm)


def _kron_csr(g_rows, g_cols, g_shape, block_rows, block_cols, shape, row_perm, col_perm) -> sp.csr_matrix:
    """The CSR pattern of G's entries placed in every block (``block_rows``, ``block_cols``), relabelled by
    the permutations (None: as they are). Each block's (row, column) keys are made in a thread of its own;
    one sort orders them (distinct already: G's pattern is, and blocks do not overlap), the row pointers are
    searched in the sorted keys and the columns taken from them in parallel pieces."""
    n_g, n_cols = g_rows.size, shape[1]
    keys = np.empty(block_rows.size * n_g, dtype=np.int64)
    workers = _thread_count(None)

    def block(b: int) -> None:
        rows = g_rows + int(block_rows[b]) * g_shape[0]
        cols = g_cols + int(block_cols[b]) * g_shape[1]
        if row_perm is not None:
            rows, cols = row_perm[rows], col_perm[cols]
        out = keys[b * n_g:(b + 1) * n_g]
        np.multiply(rows, n_cols, out=out)
        out += cols

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(block, range(block_rows.size)))
        keys.sort()
        idx_dtype = _index_dtype(shape, keys.size)
        indptr = np.searchsorted(keys, np.arange(shape[0] + 1, dtype=np.int64) * n_cols).astype(idx_dtype)
        indices = np.empty(keys.size, dtype=idx_dtype)
        data = np.empty(keys.size, dtype=np.float32)
        step = max(_PART_EDGES, -(-keys.size // workers))

        def fill(start: int) -> None:  # first-touch page faults of the outputs cost as much as the copies
            stop = min(start + step, keys.size)
            np.remainder(keys[start:stop], n_cols, out=indices[start:stop], casting="unsafe")
            data[start:stop] = 1.0

        list(pool.map(fill, range(0, keys.size, step)))
    return _csr_from_canonical(data, indices, indptr, shape)


# --- R-MAT internals -------------------------------------------------------------------------------


class _PartitionLayout:
    """Split of the node ids into ``2**bits`` row ranges, and the key of an edge inside its range.

    An edge (row, col) lives in partition ``row >> low_bits`` under the key
    ``(row & low_mask) << scale | col``: keys sort in CSR order and fit in 64 bits for scale <= 40.
    """

    def __init__(self, scale: int, bits: int):
        self.scale = scale
        self.count = 1 << bits
        self.low_bits = scale - bits
        self.rows_per_part = 1 << self.low_bits
        self.part_dtype = np.uint8 if bits <= 8 else np.uint16

    def keys(self, rows: np.ndarray, cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        low = (rows & np.asarray(self.rows_per_part - 1, dtype=rows.dtype)).astype(np.uint64)
        keys = np.left_shift(low, np.uint64(self.scale), out=low)
        np.bitwise_or(keys, cols, out=keys)
        parts = (rows >> self.low_bits).astype(self.part_dtype)
        return keys, parts


def _rmat_block(seq, count, scale, thresholds, perm, layout):
    """Draw ``count`` edges from the stream ``seq``; return their keys grouped by partition and the
    partition offsets into them."""
    bitgen = np.random.SFC64(seq)
    keys = np.empty(count, dtype=np.uint64)
    parts = np.empty(count, dtype=layout.part_dtype)
    for start in range(0, count, _STEP_EDGES):
        stop = min(start + _STEP_EDGES, count)
        rows, cols = _rmat_edges(bitgen, stop - start, scale, thresholds)
        keys[start:stop], parts[start:stop] = layout.keys(perm[rows], perm[cols])
    if layout.count > 1:
        keys = keys[np.argsort(parts, kind="stable")]
    offsets = np.zeros(layout.count + 1, dtype=np.int64)
    np.cumsum(np.bincount(parts, minlength=layout.count), out=offsets[1:])
    return keys, offsets


def _rmat_edges(bitgen, count, scale, thresholds):
    """Recursive quadrant descent for ``count`` edges, one 32-bit uniform per edge and level.

    Every level of every edge is decided in one pass over a ``(count, levels)`` array, and the
    per-level bits are packed into node ids 8 levels at a time: a handful of NumPy calls per step
    rather than several per level, which keeps the GIL free enough for many threads to scale.
    """
    levels = -(-scale // 8) * 8  # padded to whole bytes; the extra levels are masked off below
    u = bitgen.random_raw(count * levels // 2).view(np.uint32).reshape(count, levels)
    t_a, t_ab, t_abc = thresholds
    # Quadrants in order a, b, c, d are (0,0), (0,1), (1,0), (1,1): the row bit is u >= a+b and
    # the column bit is set in exactly the b and d intervals, i.e. the parity of the three tests.
    row_bits = u >= t_ab
    col_bits = u >= t_a
    np.bitwise_xor(col_bits, row_bits, out=col_bits)
    np.bitwise_xor(col_bits, u >= t_abc, out=col_bits)
    node_dtype = np.dtype("<u4" if scale <= 32 else "<u8")
    mask = node_dtype.type((1 << scale) - 1)
    return _pack_levels(row_bits, node_dtype) & mask, _pack_levels(col_bits, node_dtype) & mask


# Multiplying 8 bytes that are each 0 or 1 by this constant gathers byte i into bit 56 + i, without
# carries (every partial product lands on a distinct bit).
_GATHER_BYTES = np.uint64(0x0102040810204080)


def _pack_levels(bits: np.ndarray, node_dtype: np.dtype) -> np.ndarray:
    """Node ids from a ``(count, 8 * k)`` boolean array: level ``l`` becomes bit ``l``."""
    count = bits.shape[0]
    packed = bits.view("<u8") * _GATHER_BYTES
    packed >>= np.uint64(56)
    ids = np.zeros((count, node_dtype.itemsize), dtype=np.uint8)
    ids[:, : packed.shape[1]] = packed
    return ids.view(node_dtype).reshape(count)


def _dedupe_partition(p, blocks, layout):
    """Sort and deduplicate the keys of partition ``p``; return its row lengths and column indices."""
    merged = np.concatenate([keys[offsets[p] : offsets[p + 1]] for keys, offsets in blocks])
    merged.sort()
    keep = np.empty(merged.size, dtype=bool)
    keep[:1] = True
    np.not_equal(merged[1:], merged[:-1], out=keep[1:])
    unique = merged[keep]
    del merged, keep
    local_rows = (unique >> np.uint64(layout.scale)).astype(np.intp)
    row_counts = np.bincount(local_rows, minlength=layout.rows_per_part)
    cols = unique & np.uint64((1 << layout.scale) - 1)
    return row_counts, cols.astype(np.uint32 if layout.scale <= 32 else np.uint64)


def _assemble(parts, n, pool) -> sp.csr_matrix:
    """Concatenate the partitions into one CSR matrix; the copies run in parallel because first-touch
    page faults of the large output arrays cost as much as the copies themselves."""
    offsets = np.cumsum([0] + [cols.size for _, cols in parts])
    nnz = int(offsets[-1])
    idx_dtype = _index_dtype((n, n), nnz)
    indptr = np.empty(n + 1, dtype=idx_dtype)
    indptr[0] = 0
    np.cumsum(np.concatenate([row_counts for row_counts, _ in parts]), out=indptr[1:])
    indices = np.empty(nnz, dtype=idx_dtype)
    data = np.empty(nnz, dtype=np.float32)

    def fill(p: int) -> None:
        start, stop = offsets[p], offsets[p + 1]
        indices[start:stop] = parts[p][1]
        data[start:stop] = 1.0

    list(pool.map(fill, range(len(parts))))
    return _csr_from_canonical(data, indices, indptr, (n, n))


def _filled(size: int, dtype, value, threads: int) -> np.ndarray:
    """An array of ``size`` copies of ``value``, its pieces filled on ``threads`` threads: the first touch of a
    large array's pages costs as much as the fill itself, and spreads over cores.

    Example:
        >>> _filled(5, np.float32, 1.0, 2).tolist()
        [1.0, 1.0, 1.0, 1.0, 1.0]
    """
    out = np.empty(size, dtype=dtype)
    pieces = np.linspace(0, size, max(1, min(threads, size // _PART_EDGES)) + 1).astype(np.int64)

    def fill(p: int) -> None:
        out[pieces[p]:pieces[p + 1]] = value
    if pieces.size <= 2:
        out[:] = value
        return out
    with ThreadPoolExecutor(max_workers=pieces.size - 1) as pool:
        list(pool.map(fill, range(pieces.size - 1)))
    return out


def _partition_bits(scale: int, m: int) -> int:
    # Local keys take (scale - bits) + scale bits, so bits >= 2 * scale - 64 keeps them in a uint64.
    wanted = max(0, (m // _PART_EDGES).bit_length() - 1)
    return min(scale, _MAX_PART_BITS, max(wanted, 2 * scale - 64))


def _quadrant_thresholds(a: float, b: float, c: float) -> tuple[np.uint32, np.uint32, np.uint32]:
    """Cumulative probabilities a, a+b, a+b+c as thresholds on uniform 32-bit integers."""
    cumulative = np.cumsum([a, b, c]) * 2.0**32
    t = np.minimum(np.rint(cumulative), 2**32 - 1).astype(np.uint32)
    return t[0], t[1], t[2]


def _check_rmat_args(scale, edge_factor, a, b, c, seed) -> None:
    _check_int("scale", scale, low=1, high=40)
    _check_int("edge_factor", edge_factor, low=1)
    for name, value in (("a", a), ("b", b), ("c", c)):
        if isinstance(value, bool) or not isinstance(value, Real) or not 0.0 < float(value) < 1.0:
            raise ValueError(f"{name} must be a probability in (0, 1), got {value!r}")
    if a + b + c >= 1.0:
        raise ValueError(f"a + b + c must be < 1 (d = 1 - a - b - c > 0), got {a + b + c!r}")
    _check_int("seed", seed, low=0)


def _check_k(k) -> None:
    if isinstance(k, bool) or not isinstance(k, Integral) or k < 0:
        raise ValueError(f"k must be an integer >= 0, got {k!r}")


def _check_int(name: str, value, *, low: int, high: int | None = None) -> None:
    ok = isinstance(value, Integral) and not isinstance(value, bool)
    ok = ok and value >= low and (high is None or value <= high)
    if not ok:
        bounds = f">= {low}" if high is None else f"in {low}..{high}"
        raise ValueError(f"{name} must be an integer {bounds}, got {value!r}")


def _thread_count(threads: int | None) -> int:
    if threads is None:
        try:
            return max(1, len(os.sched_getaffinity(0)))
        except AttributeError:  # not on Linux
            return os.cpu_count() or 1
    _check_int("threads", threads, low=1)
    return int(threads)


# --- shared CSR helpers (also used by tuner.loaders and tuner.sizes) ------------------------------------


def _index_dtype(shape: tuple[int, int], nnz: int) -> type[np.signedinteger]:
    """int32 when every index, row pointer and dimension fits in int32, else int64."""
    return np.int32 if max(shape[0], shape[1], nnz) <= _INT32_MAX else np.int64


def _csr_from_canonical(data, indices, indptr, shape) -> sp.csr_matrix:
    """Wrap arrays already in canonical CSR order without SciPy re-checking or copying them."""
    matrix = sp.csr_matrix((data, indices, indptr), shape=shape, copy=False)
    matrix.has_canonical_format = True
    return matrix


def _pattern_csr(rows, cols, shape) -> sp.csr_matrix:
    """Canonical float32 pattern CSR of the (row, col) pairs; duplicate pairs are stored once."""
    shape = (int(shape[0]), int(shape[1]))
    rows = np.asarray(rows, dtype=np.int64)
    cols = np.asarray(cols, dtype=np.int64)
    if shape[0] * shape[1] <= _INT64_MAX:
        keys = rows * shape[1] + cols
        keys.sort()
        keep = np.empty(keys.size, dtype=bool)
        keep[:1] = True
        np.not_equal(keys[1:], keys[:-1], out=keep[1:])
        keys = keys[keep]
        rows, cols = np.divmod(keys, shape[1])
    else:
        order = np.lexsort((cols, rows))
        rows, cols = rows[order], cols[order]
        keep = np.ones(rows.size, dtype=bool)
        keep[1:] = (rows[1:] != rows[:-1]) | (cols[1:] != cols[:-1])
        rows, cols = rows[keep], cols[keep]
    idx_dtype = _index_dtype(shape, cols.size)
    indptr = np.zeros(shape[0] + 1, dtype=idx_dtype)
    np.cumsum(np.bincount(rows, minlength=shape[0]), out=indptr[1:])
    indices = cols.astype(idx_dtype)
    return _csr_from_canonical(np.ones(cols.size, dtype=np.float32), indices, indptr, shape)


def _pattern_coords(matrix, name: str) -> tuple[np.ndarray, np.ndarray, tuple[int, int]]:
    """Row and column indices (int64, no duplicates) of the stored non-zeros of a 2-D matrix."""
    if sp.issparse(matrix):
        coo = sp.coo_matrix(matrix)
        coo.sum_duplicates()
        nonzero = coo.data != 0
        rows, cols, shape = coo.row[nonzero], coo.col[nonzero], coo.shape
    else:
        dense = np.asarray(matrix)
        if dense.ndim != 2:
            raise ValueError(f"{name} must be 2-D, got shape {dense.shape}")
        rows, cols = np.nonzero(dense)
        shape = dense.shape
    if shape[0] < 1 or shape[1] < 1:
        raise ValueError(f"{name} must have at least one row and one column, got shape {shape}")
    return rows.astype(np.int64), cols.astype(np.int64), (int(shape[0]), int(shape[1]))
