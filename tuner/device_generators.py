"""Graph500 R-MAT drawn on the GPU (``templates/rmat_draw.cu.j2``): the graph :func:`tuner.generators.rmat` draws
on the host, array for array, for the same arguments.

The host draws 2**20 edges a block on its cores, each block from an SFC64 stream NumPy seeds from the seed.
Here a GPU thread draws each block from the same state (an SFC64 stream cannot jump ahead, so one thread walks
it), every block at once; the edges become 64-bit keys, relabelled by the host's node permutation (drawn on the
host meanwhile: the same NumPy call), sorted by CuPy (Thrust) and made into the CSR by two passes, and the CSR
comes to the host through pinned buffers. On an H200 host of 16 cores: rmat:25 in 2.4 s against the host's
15.6 s, rmat:23 in 1.0 s against 3.2 s.
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


def source() -> str:
    """The kernels' CUDA source.

    Example:
        >>> "rmat_draw(" in source() and "rmat_csr_i64(" in source()
        True
    """
    return codegen.render("rmat_draw.cu.j2", {})


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


def _kernels(cupy) -> dict:
    from .graph.device_pull import device_modules
    module, = device_modules(cupy, [source()])
    return {name: module.get_function(name) for name in
            ("rmat_draw", "rmat_relabel", "rmat_firsts", "rmat_csr_i32", "rmat_csr_i64")}


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
    grid = (int(min(-(-m // PASS_BLOCK), 32 * cupy.cuda.Device().attributes["MultiProcessorCount"])),)
    k["rmat_relabel"](grid, (PASS_BLOCK,), (keys, np.int64(m), np.int32(scale), perm))
    del perm
    keys.sort()
    places = cupy.empty(m, np.int64)
    k["rmat_firsts"](grid, (PASS_BLOCK,), (keys, np.int64(m), places))
    places = cupy.cumsum(places)
    nnz = int(places[-1])
    idx_dtype = np.dtype(_index_dtype((n, n), nnz))
    cols, indptr = cupy.empty(nnz, idx_dtype), cupy.empty(n + 1, idx_dtype)
    k["rmat_csr_i32" if idx_dtype == np.int32 else "rmat_csr_i64"](
        grid, (PASS_BLOCK,), (keys, places, np.int64(m), np.int32(scale), np.int64(n), cols, indptr))
    del keys, places
    indices, pointers = device_reorder.download(cols), device_reorder.download(indptr)
    return _csr_from_canonical(_filled(nnz, np.float32, 1.0, threads), indices, pointers, (n, n))
