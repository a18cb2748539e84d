"""A rank's tile_composite kernel over its :class:`~tuner.distributed.rank_tiles.RankTiles`, run in phases:
phase j multiplies the workloads that read only the chunks of x gathered so far."""
from __future__ import annotations

import numpy as np

from .. import codegen, families, gpu
from ..families.base import Specialization
from ..families.tile_composite import BLOCK_SIZE, TileCompositeParams
from ..kernel import SIGNATURE_CODES
from .rank_tiles import RankTiles

# Per-workload arrays and their item sizes: a phase's launch passes them from its first workload on.
_PER_WORKLOAD = ("wl_slot", "wl_row", "wl_w", "wl_h")


class RankKernel:
    """Launches the tile_composite kernel over a rank's tiles (device arrays, CuPy); its binary comes through
    ``cache`` (a :class:`~tuner.cache.Cache`; default the user's).

    Example (on a GPU machine; ``tiles`` from :func:`~tuner.distributed.rank_tiles.rank_tiles`):
        >>> k = RankKernel(tiles, np.dtype("float32"), np.dtype("int32"), False, 1.0)  # doctest: +SKIP
        >>> k.zero(y); k.phase(0, x, y); k.phase(1, x, y)                             # doctest: +SKIP
    """

    def __init__(self, tiles: RankTiles, dtype: np.dtype, index_dtype: np.dtype, value_free: bool,
                 pattern_value: float, cache=None):
        import cupy
        self.tiles = tiles
        self.dtype = np.dtype(dtype)
        params = TileCompositeParams(tile_width=tiles.tile_width, workloads=tiles.workloads, camping_pad=False,
                                     block_size=BLOCK_SIZE, order="none")
        self.spec = Specialization("tile_composite", params, self.dtype, np.dtype(index_dtype), value_free)
        cubin = codegen.compile_source(families.render(self.spec), gpu.device_info().arch, cache=cache).cubin
        f = tiles.layout
        arrays = [("cols", f.cols)] + ([] if value_free else [("vals", f.vals)]) + [
            ("rows", f.rows), ("wl_slot", f.wl_slot), ("wl_row", f.wl_row), ("wl_w", f.wl_w), ("wl_h", f.wl_h)]
        self._arrays = [(name, cupy.asarray(a)) for name, a in arrays]  # held: the pointers live with them
        self.kernel = gpu.Kernel(cubin, self.spec.kernel_name, "P" * (len(arrays) + 2) + "q" + SIGNATURE_CODES[self.dtype])
        self._pattern = self.dtype.type(pattern_value if value_free else 1.0)

    @property
    def phases(self) -> int:
        return len(self.tiles.phase_warps) - 1

    def zero(self, y) -> None:
        """y = 0 (the kernel adds each tile's partial sums to it)."""
        gpu.zero_async(int(y.data.ptr), y.size * y.itemsize)

    def phase(self, j: int, x, y) -> None:
        """Add the products of phase ``j``'s workloads to ``y``, reading ``x`` (the gathered buffer)."""
        lo, hi = self.tiles.phase_warps[j], self.tiles.phase_warps[j + 1]
        if hi <= lo:
            return
        ptrs = [int(a.data.ptr) + (lo * a.itemsize if name in _PER_WORKLOAD else 0) for name, a in self._arrays]
        block = self.spec.params.block_size
        self.kernel.launch(-(-(hi - lo) * 32 // block), block, *ptrs, int(x.data.ptr), int(y.data.ptr),
                           np.int64(hi - lo), self._pattern)

    def __call__(self, x, y) -> None:
        """y = this rank's rows times the whole gathered ``x``."""
        self.zero(y)
        for j in range(self.phases):
            self.phase(j, x, y)
