"""Graphs drawn on the GPU (``templates/graph_draw.cu.j2``): the graphs :func:`tuner.generators.rmat` and
:func:`tuner.generators.kronecker` build on the host, array for array, for the same arguments.

R-MAT: the host draws 2**20 edges a block on its cores, each block from an SFC64 stream NumPy seeds from the seed.
Here a GPU thread draws each block from the same state (an SFC64 stream cannot jump ahead, so one thread walks
it), every block at once; the edges become 64-bit keys, relabelled by the host's node permutation (drawn on the
host meanwhile: the same NumPy call), sorted by CuPy (Thrust) and made into the CSR by two passes, and the CSR
comes to the host through pinned buffers. On an H200 host of 16 cores: rmat:25 in 2.4 s against the host's
15.6 s, rmat:23 in 1.0 s against 3.2 s.

Kronecker: the host's blocks (:class:`~tuner.generators.KroneckerBlocks`: G's edges, the grid, the permutation)
go up, one thread a key makes every edge of every block, and the keys become the CSR as R-MAT's do: the host's
one-core sort of the keys is what this replaces (H200 host: kron:cnr-2000:4 in 0.77 s against 7.0 s).
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from . import codegen
from .generators import (_BLOCK_EDGES, _csr_from_canonical, _filled, _index_dtype, _quadrant_thresholds,
                         _thread_count, per_edge_text)
from .memory import check_fits

THREADS = 32  # a CUDA block's threads, each drawing a block of edges: few, so the blocks spread over the SMs
PASS_BLOCK = 256
BYTES_PER_EDGE = 32  # device memory a drawn edge needs at the peak: its key, the sort's copy, its count and place
MAX_SCALE = 32  # a key holds a row and a column of SCALE bits in 64
KRON_MIN_EDGES = 1 << 24  # kron_pays: where the host's one-core sort takes 0.45 s or more


def source() -> str:
    """The kernels' CUDA source.

    Example:
        >>> "rmat_draw(" in source() and "kron_keys(" in source() and "key_csr_i64(" in source()
        True
    """
    return codegen.render("graph_draw.cu.j2", {})


def pays(blocks: int, threads: int) -> bool:
    """Whether the GPU draws ``blocks`` blocks of edges sooner than ``threads`` host threads. A GPU thread walks
    its block's stream one output after another, about 0.9 s whatever the scale (H200: rmat:20 to rmat:23 all
    took 0.89-1.03 s in all), while a host core draws and sorts a block with NumPy in about 0.4 s; the GPU
    draws every block at once, so it pays once the host needs three rounds of blocks or more (H200, 16
    threads: rmat:21's 32 blocks 0.94 s against the host's 0.80, rmat:22's 64 blocks 0.94 against 1.55).

    Example:
        >>> pays(32, 16), pays(64, 16)
        (False, True)
    """
    return blocks >= 3 * threads


def rmat(scale: int, edge_factor: int, a: float, b: float, c: float, seed: int,
         threads: int | None = None) -> sp.csr_matrix | None:
    """:func:`tuner.generators.rmat`'s graph (arguments already checked there) drawn on the GPU, or None where
    no GPU is reachable, the scale is over :data:`MAX_SCALE` or the device lacks the memory
    (:data:`BYTES_PER_EDGE` a drawn edge): the caller then draws it on the host.

    Example (on a GPU machine):
        >>> A = rmat(20, 16, 0.57, 0.19, 0.19, 0)                      # doctest: +SKIP
        >>> (A != generators.rmat(20, device=False)).nnz               # doctest: +SKIP
        0
    """
    from .formats import device_reorder
    if scale > MAX_SCALE or not device_reorder.available():
        return None
    n, m = 1 << scale, edge_factor << scale
    if BYTES_PER_EDGE * m > device_reorder.free_bytes():
        return None
    idx_bytes = np.dtype(_index_dtype((n, n), m)).itemsize
    # The host holds the result (indices and float32 values per entry, row pointers) and the permutation.
    peak = m * (idx_bytes + 4) + (n + 1) * idx_bytes + 12 * n
    check_fits(peak, f"rmat(scale={scale}, edge_factor={edge_factor})", per_edge_text(peak, m, "drawn edge"))
    with device_reorder.on_device() as cupy:
        return _draw(cupy, scale, n, m, _quadrant_thresholds(a, b, c), seed, _thread_count(threads))


def kron_pays(edges: int) -> bool:
    """Whether the GPU builds a Kronecker graph of ``edges`` edges sooner than the host. The host makes the keys
    on every core but sorts them on one, 21-41 ns an edge (H200 host: kron:cnr-2000:4's 261M edges in 7.0 s,
    kron:email-Enron:3's 9.9M in 0.21 s); the GPU took 0.02-0.36 s for graphs of 0.3-29M edges and 0.77 s for
    261M, once CuPy and the module were loaded (1.3 s, the first time in a process). From
    :data:`KRON_MIN_EDGES` the host needs more than the GPU's longest build of a smaller graph, so the GPU
    wins even where its first use is paid within a few graphs.

    Example:
        >>> kron_pays(1_000_000), kron_pays(20_000_000)
        (False, True)
    """
    return edges >= KRON_MIN_EDGES


def kronecker(blocks, threads: int | None = None) -> sp.csr_matrix | None:
    """:func:`tuner.generators.kronecker`'s graph (``blocks``: its :class:`~tuner.generators.KroneckerBlocks`)
    built on the GPU, or None where no GPU is reachable, it lacks the memory (:data:`BYTES_PER_EDGE` an edge)
    or a (row, column) key needs more than 64 bits: the caller then builds it on the host.

    Example (on a GPU machine):
        >>> b = generators.kronecker_blocks(G, k=3)                     # doctest: +SKIP
        >>> (kronecker(b) != generators.kronecker(G, k=3, device=False)).nnz   # doctest: +SKIP
        0
    """
    from .formats import device_reorder
    if not device_reorder.available():
        return None
    n_rows, n_cols = blocks.shape
    if int(n_rows - 1).bit_length() + _column_bits(n_cols) > 64:
        return None
    m = blocks.nnz
    node_bytes = 8 * (n_rows + n_cols) if blocks.row_perm is not None else 0
    if BYTES_PER_EDGE * m + node_bytes + 16 * blocks.g_rows.size > device_reorder.free_bytes():
        return None
    idx = np.dtype(_index_dtype(blocks.shape, m))
    peak = m * (idx.itemsize + 4) + (n_rows + 1) * idx.itemsize  # the result on the host (the blocks are held)
    check_fits(peak, f"kronecker graph of shape {blocks.shape}", per_edge_text(peak, m, "output edge"))
    threads = _thread_count(threads)
    if m == 0:
        return _csr_from_canonical(np.empty(0, np.float32), np.empty(0, idx), np.zeros(n_rows + 1, idx), blocks.shape)
    with device_reorder.on_device() as cupy:
        return _kron(cupy, blocks, threads)


def _column_bits(n_cols: int) -> int:
    return max(int(n_cols - 1).bit_length(), 1)


def _kron(cupy, b, threads: int) -> sp.csr_matrix:
    from .formats import device_reorder
    k = _kernels(cupy)
    n_rows, n_cols = b.shape
    shift = _column_bits(n_cols)
    up = device_reorder.upload
    keys = cupy.empty(b.nnz, np.uint64)
    null = np.uint64(0)
    row_perm = col_perm = null
    if b.row_perm is not None:
        row_perm = up(np.ascontiguousarray(b.row_perm, np.int64))
        col_perm = row_perm if b.col_perm is b.row_perm else up(np.ascontiguousarray(b.col_perm, np.int64))
    k["kron_keys"](_grid(cupy, b.nnz), (PASS_BLOCK,),
                   (up(np.ascontiguousarray(b.g_rows, np.int64)), up(np.ascontiguousarray(b.g_cols, np.int64)),
                    np.int64(b.g_rows.size), up(np.ascontiguousarray(b.block_rows, np.int64)),
                    up(np.ascontiguousarray(b.block_cols, np.int64)), np.int64(b.nnz), np.int64(b.g_shape[0]),
                    np.int64(b.g_shape[1]), row_perm, col_perm, np.int32(shift), keys))
    del row_perm, col_perm
    return _csr_of_keys(cupy, k, keys, shift, n_rows, b.shape, threads)


def _kernels(cupy) -> dict:
    from .graph.device_pull import device_modules
    module, = device_modules(cupy, [source()])
    return {name: module.get_function(name) for name in
            ("rmat_draw", "rmat_relabel", "kron_keys", "key_firsts", "key_csr_i32", "key_csr_i64")}


def _draw(cupy, scale: int, n: int, m: int, thresholds, seed: int, threads: int) -> sp.csr_matrix:
    from .formats import device_reorder
    k = _kernels(cupy)
    blocks = -(-m // _BLOCK_EDGES)
    perm_seq, *block_seqs = np.random.SeedSequence(seed).spawn(1 + blocks)
    states = np.array([np.random.SFC64(s).state["state"]["state"] for s in block_seqs], dtype=np.uint64)
    keys = cupy.empty(m, np.uint64)
    t_a, t_ab, t_abc = (np.uint32(t) for t in thresholds)
    k["rmat_draw"]((-(-blocks // THREADS),), (THREADS,),
                   (cupy.asarray(states), np.int64(blocks), np.int64(m), np.int64(_BLOCK_EDGES), np.int32(scale),
                    np.int32(-(-scale // 8) * 4), t_a, t_ab, t_abc, keys))
    # The permutation is drawn while the GPU draws the edges: the host's call, the host's numbers.
    perm = device_reorder.upload(np.random.default_rng(perm_seq).permutation(n).astype(np.uint32))
    k["rmat_relabel"](_grid(cupy, m), (PASS_BLOCK,), (keys, np.int64(m), np.int32(scale), perm))
    del perm
    return _csr_of_keys(cupy, k, keys, scale, n, (n, n), threads)


def _grid(cupy, m: int) -> tuple[int]:
    return (int(max(1, min(-(-m // PASS_BLOCK), 32 * cupy.cuda.Device().attributes["MultiProcessorCount"]))),)


def _csr_of_keys(cupy, k: dict, keys, shift: int, n_rows: int, shape: tuple[int, int], threads: int) -> sp.csr_matrix:
    """The float32 CSR pattern of the distinct values of ``keys`` (row << ``shift`` | column, on the device),
    sorted there in place, brought to the host."""
    from .formats import device_reorder
    m = int(keys.size)
    grid = _grid(cupy, m)
    keys.sort()
    places = cupy.empty(m, np.int64)
    k["key_firsts"](grid, (PASS_BLOCK,), (keys, np.int64(m), places))
    places = cupy.cumsum(places)
    nnz = int(places[-1])
    idx_dtype = np.dtype(_index_dtype(shape, nnz))
    cols, indptr = cupy.empty(nnz, idx_dtype), cupy.empty(n_rows + 1, idx_dtype)
    k["key_csr_i32" if idx_dtype == np.int32 else "key_csr_i64"](
        grid, (PASS_BLOCK,), (keys, places, np.int64(m), np.int32(shift), np.int64(n_rows), cols, indptr))
    del places
    indices, pointers = device_reorder.download(cols), device_reorder.download(indptr)
    return _csr_from_canonical(_filled(nnz, np.float32, 1.0, threads), indices, pointers, shape)
