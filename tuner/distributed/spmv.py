"""SpMV with A's rows split among the ranks of a communicator (paper 003, section 3.4).

Each rank owns the rows :func:`~tuner.distributed.partition.bitonic_partition` deals it and the same
entries of x and y. A product gathers x from every rank (``allgather``, each part padded to the longest) into
the partition's slots, to which the rank's rows have their columns renumbered once, and multiplies its rows
with its own compiled kernel.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import scipy.sparse as sp

from .. import gpu
from ..formats.xp import host, largest, module as module_of
from ..matrix import MatrixError, canonicalize, check_vector_dtype, check_vector_shape
from ..stages import Stages
from .comm import Communicator
from .partition import bitonic_partition  # noqa: F401 - an example uses it
from .partition import RowPartition, square_partition, whole_partition

RANK_KERNELS = ("auto", "tiles", "compile")


def _sorts(device_comm: bool):
    """Where the partition's per-row steps run: CuPy for a device communicator where it is installed, else
    NumPy."""
    if device_comm:
        try:
            import cupy
            return cupy
        except ImportError:  # a stand-in device communicator (the CPU tests)
            pass
    return np


def local_rows(A, partition: RowPartition, rank: int) -> sp.csr_matrix:
    """Rank ``rank``'s rows of square ``A`` with their columns renumbered to the partition's slots (the order
    of x gathered from the ranks' equal-length parts), columns ascending; ``parts x width`` columns.

    Example:
        >>> A = sp.csr_matrix(np.arange(1.0, 10.0).reshape(3, 3))
        >>> p = bitonic_partition(np.array([1, 3, 2]), 2)          # rank 0: row 1; rank 1: rows 0 and 2
        >>> local_rows(A, p, 0).toarray().tolist(), p.slots().tolist()  # x gathered as x1, pad, x0, x2
        ([[5.0, 0.0, 4.0, 6.0]], [2, 0, 3])
    """
    if partition.parts == 1:  # one rank holds every row, in order, in slots 0 .. n-1: A itself, no copy
        return sp.csr_matrix(A)
    m = sp.csr_matrix(A)[partition.rows[rank]]
    m = sp.csr_matrix((m.data, partition.slots()[m.indices], m.indptr),
                      shape=(m.shape[0], partition.parts * partition.width))
    m.sort_indices()
    return m


def split_own_columns(M: sp.csr_matrix, rank: int, width: int) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    """``M`` (a rank's :func:`local_rows`) as the columns of the rank's own slots, renumbered from 0 (``width``
    columns: they multiply the rank's own part of x, there before any exchange), and the rest.

    Example:
        >>> M = sp.csr_matrix(np.array([[1.0, 2, 3, 4], [0, 5, 6, 0]]))
        >>> own, rest = split_own_columns(M, 1, 2)  # rank 1 owns slots 2 and 3
        >>> own.toarray().tolist(), rest.toarray().tolist()
        ([[3.0, 4.0], [6.0, 0.0]], [[1.0, 2.0, 0.0, 0.0], [0.0, 5.0, 0.0, 0.0]])
    """
    M = sp.csr_matrix(M)
    lo = rank * width
    is_own = (M.indices >= lo) & (M.indices < lo + width)
    rows = np.repeat(np.arange(M.shape[0]), np.diff(M.indptr))

    def keep(mask, shift, n_cols):
        indptr = np.zeros(M.shape[0] + 1, np.int64)
        np.cumsum(np.bincount(rows[mask], minlength=M.shape[0]), out=indptr[1:])
        return sp.csr_matrix((M.data[mask], M.indices[mask] - shift, indptr), shape=(M.shape[0], n_cols))
    return keep(is_own, lo, width), keep(~is_own, 0, M.shape[1])


class DistributedSpMV:
    """This rank's part of y = A x for square A whose rows are split among the ranks of ``comm``.

    ``spmv(x_local)`` takes this rank's entries of x (``spmv.scatter(x)`` picks them from a whole x) and
    returns its entries of y; ``spmv.gather(y_local)`` puts every rank's entries back in A's order.
    ``local_compile`` turns the rank's rows into a callable (default :func:`tuner.compile`, the tuned
    kernel; any ``M -> (x -> M x)`` will do); ``options`` go to it.

    With a device communicator (:class:`~tuner.distributed.nccl.NcclComm`) and a CuPy ``x_local``, x is
    gathered on the GPUs by NCCL into a buffer the kernel reads in place, and y stays on the device.

    ``setup_seconds``: wall seconds of the setup's stages ('partition', 'plan': the one-GPU plan the tiles
    follow, 'layout': the rank's tiles or compile).

    ``rank_kernel`` says how a rank multiplies on several GPUs:

    * 'tiles' (under 'auto', the default, where the model predicts a tile_composite candidate for the whole
      matrix, whatever ``tune`` says; its pick if it picks tile_composite, else the fastest of those): the
      rank's rows in that plan's tiles, reading x where NCCL gathers it
      (:mod:`~tuner.distributed.rank_tiles`); with ``overlap``, the tiles of the hub columns run while NCCL
      gathers the rest of x. The rank's compile options are not used.
    * 'compile' (otherwise, and with a ``local_compile``): the rank's rows planned and compiled on their own;
      with ``overlap``, two kernels, one for the columns of its own part of x, which runs while NCCL gathers
      the other parts on a side stream, and one for the rest.

    Example:
        >>> from tuner.distributed.comm import LocalGroup
        >>> A = sp.random(40, 40, density=0.1, format="csr", random_state=0)
        >>> x = np.arange(40.0)
        >>> def rank(comm):
        ...     spmv = DistributedSpMV(A, comm, local_compile=lambda M: M.dot)
        ...     return spmv.gather(spmv(spmv.scatter(x)))
        >>> bool(np.allclose(LocalGroup(3).run(rank)[0], A @ x))
        True
    """

    def __init__(self, A, comm: Communicator, partition: RowPartition | None = None,
                 local_compile: Callable | None = None, overlap: bool = True, rank_kernel: str = "auto",
                 **options):
        if rank_kernel not in RANK_KERNELS:
            raise ValueError(f"rank_kernel must be one of {RANK_KERNELS}, got {rank_kernel!r}")
        m = canonicalize(A)
        if m.n_rows != m.n_cols:
            raise MatrixError(f"the distributed SpMV splits x like A's rows: A must be square, got {m.shape}")
        self.comm = comm
        device_comm = comm.size > 1 and hasattr(comm, "allgather_into")
        clock = Stages()
        # One rank keeps every row in order and counts no column.
        self._rows_in_order = comm.size == 1 and partition is None  # whole_partition's rows: 0..n-1
        if partition is None:
            partition = square_partition(m.row_lengths, m.col_lengths, comm.size, _sorts(device_comm)) \
                if comm.size > 1 else whole_partition(m.n_rows, float(m.nnz))
        self.partition = partition
        clock.stage("partition")
        if self.partition.parts != comm.size or self.partition.owner.size != m.n_rows:
            raise ValueError(f"the partition has {self.partition.parts} parts of {self.partition.owner.size} rows; "
                             f"the communicator {comm.size} ranks and A {m.n_rows} rows")
        self.rows = self.partition.rows[comm.rank]
        tuned = local_compile is None
        # What multiplies, for reports: the generic kernel (tune='none'), the tuned one, or the caller's.
        self.kernel_kind = ("generic" if options.get("tune") == "none" else "tuned") if tuned else "given"
        if tuned:
            from ..operations import compile as local_compile
            # The ranks run in step: a stand-in on one would hold every other at the next exchange.
            options.setdefault("background", False)
        self.dtype = m.value_dtype
        self.local = self._own = self._rest = self._tiles = None
        self.overlap = overlap  # with tiles, read at each call: may be switched between calls
        self.pull_factors = None  # (weighted, dangling, inverse) where pull_product made them on the device
        self.one_gpu_family = None
        tiles = self._tile_params(m, rank_kernel, tuned, options) if device_comm else None
        clock.stage("plan")
        if tiles is not None:
            self._tiles = self._rank_tiles(m, tiles, options.get("cache_dir"))
            self.kernel_kind, self.local_nnz = "tiled", self._tiles.tiles.nnz
        else:
            # One rank multiplies all of A: the tuned compile takes the canonical matrix as it is, unchecked.
            mine = m if tuned and comm.size == 1 else local_rows(m.to_scipy(), self.partition, comm.rank)
            self.local_nnz = int(mine.nnz)
            if overlap and device_comm:
                own, rest = split_own_columns(mine, comm.rank, self.partition.width)
                if own.nnz and rest.nnz:
                    self._own, self._rest = local_compile(own, **options), local_compile(rest, **options)
            if self._own is None:
                self.local = local_compile(mine, **options)
        clock.stage("layout")
        self.setup_seconds = clock.seconds
        self._gathered = None  # the device buffer x is gathered into, made at the first device call
        self._send = None  # with tiles: this rank's part of x, gathered from there chunk by chunk
        self._overlap_state = None

    @classmethod
    def from_rank_kernel(cls, comm: Communicator, partition: RowPartition, kernel, dtype, overlap: bool = True,
                         setup_seconds: dict | None = None) -> "DistributedSpMV":
        """The product of a rank whose tiles were made elsewhere (:func:`~tuner.distributed.shard.sharded_product`:
        its rows only, the whole matrix nowhere): ``kernel`` a :class:`~tuner.distributed.rank_kernel.RankKernel`
        over this rank's rows of ``partition``."""
        self = cls.__new__(cls)
        self.comm, self.partition = comm, partition
        self.rows = partition.rows[comm.rank]
        self._rows_in_order = False
        self.kernel_kind, self.dtype = "tiled", np.dtype(dtype)
        self.local = self._own = self._rest = None
        self._tiles, self.local_nnz = kernel, kernel.tiles.nnz
        self.overlap = overlap
        self.pull_factors = self.one_gpu_family = None
        self.setup_seconds = dict(setup_seconds or {})
        self._gathered = self._send = self._overlap_state = None
        return self

    def _tile_params(self, m, rank_kernel: str, tuned: bool, options: dict):
        """The tile_composite parameters (tile width, workload size of every tile) the rank kernel takes from
        the one-GPU plan, or None for a compiled one; the family the model plans for the whole matrix goes
        to ``one_gpu_family`` (None: no profile, or not asked).

        Where the model plans another family for one GPU (tile_coo, say), the ranks still take the
        tile_composite candidate it predicts fastest: a rank's own compile relabels its columns its own way,
        so it must permute x every product and cuts its tiles thinner, and that costs more on P GPUs than the
        gap between the two families on one."""
        if rank_kernel == "compile" or not tuned:
            return None
        from ..compiler import model_ranking
        from ..families import tile_composite
        # Even under tune='none': the one-GPU plan is predicted only (seconds of a rank's setup), and a rank's
        # generic kernel would leave the GPUs waiting on the exchange.
        ranking = model_ranking(m, options.get("profile")) if "family" not in options else None
        self.one_gpu_family = ranking[0][0].family if ranking else None
        best = next((spec for spec, _ in ranking or () if spec.family == "tile_composite"), None)
        if best is not None:
            return best.params
        if rank_kernel == "auto":
            return None
        return tile_composite.space(m)[0]  # forced: the L1's first tiling, Algorithm 2's bounds

    def _rank_tiles(self, m, params, cache_dir):
        import cupy
        from ..cache import Cache
        from ..families.base import ordering
        from ..families.tiles import TILE_ORDER
        from ..formats.device_reorder import known_copy
        from .rank_kernel import RankKernel
        from .rank_tiles import rank_tiles
        order = host(ordering(m, TILE_ORDER).col_order)
        csr = known_copy(m)  # Wᵀ built on the device (pull_product): the rank's rows are gathered there
        tiles = rank_tiles(m.to_scipy() if csr is None else csr, self.partition, self.comm.rank, order,
                           m.col_lengths, params.tile_width, m.index_dtype, values=not m.value_free,
                           workloads=params.workloads, xp=cupy)
        del csr  # the whole matrix's device copies go with m, at the end of the setup
        return RankKernel(tiles, m.value_dtype, m.index_dtype, m.value_free, m.pattern_value, Cache(cache_dir))

    def plan_order(self):
        """``(order, product)`` for iterating in the plan's order on one rank: ``product`` multiplies
        vectors whose i-th entry is node ``order[i]``'s and returns y in the same order, with none of the
        two gathers per call that bring x to a relabelled plan's order and y back (the plan relabels rows
        and columns alike). None where the rows are split among ranks, the product keeps A's order or
        relabels rows and columns differently.

        Example:
            >>> from tuner.distributed.comm import LocalGroup
            >>> LocalGroup(1).run(lambda c: DistributedSpMV(sp.eye(4, format="csr"), c, local_compile=lambda M: M.dot)
            ...                   .plan_order())  # a product with no order of its own
            [None]
        """
        found = self.plan_order_here()
        return None if found is None else (host(found[0]), found[1])

    def plan_order_here(self):
        """:meth:`plan_order` with the order where the plan keeps it (on the device for a layout built there):
        for callers that pick and place vectors on the device, without the order's round trip to the host.

        Example:
            >>> from tuner.distributed.comm import LocalGroup
            >>> LocalGroup(1).run(lambda c: DistributedSpMV(sp.eye(4, format="csr"), c, local_compile=lambda M: M.dot)
            ...                   .plan_order_here())
            [None]
        """
        local = self.local
        if self.comm.size != 1 or local is None or not hasattr(local, "in_plan_order"):
            return None
        order, rank = local.col_order, local.row_rank
        if order is None or rank is None:
            return None
        xp = module_of(order)
        rank = host(rank) if xp is np else xp.asarray(rank)
        # The same permutation for rows and columns (square plans relabel both alike): checked where they live,
        # by largest as the other device checks are (tuner.formats.xp says why not CuPy's reductions).
        if largest(rank[order] != xp.arange(order.size, dtype=rank.dtype)):
            return None
        # The plan's i-th node is rows[order[i]]; a rank dealt every row in order (rows 0..n-1) needs no pick.
        return (order if self._rows_in_order else xp.asarray(self.rows)[order]), local.in_plan_order()

    def scatter(self, x: np.ndarray) -> np.ndarray:
        """This rank's entries of a whole vector."""
        return np.asarray(x)[self.rows]

    def padded(self, x_local):
        """``x_local`` padded with zeros to the partition's width (NCCL gathers equal lengths): a view of a
        buffer reused by every call on device arrays."""
        width = self.partition.width
        if x_local.shape != (self.rows.size,):
            raise MatrixError(f"x_local must have this rank's {self.rows.size} entries, got shape {x_local.shape}")
        if gpu.is_device_array(x_local):
            if self._gathered is None or self._gathered.dtype != x_local.dtype:
                import cupy
                read = self._tiles.tiles.chunks.width if self._tiles is not None else width  # slots gathered
                self._gathered = cupy.zeros(read * self.comm.size, x_local.dtype)
                self._send = cupy.zeros(width, x_local.dtype) if self._tiles is not None else None
            part = self._send if self._tiles is not None else \
                self._gathered[self.comm.rank * width:(self.comm.rank + 1) * width]
            if gpu.view(x_local).ptr != part.data.ptr:  # an iterative caller may write its slice in place
                part[:self.rows.size] = x_local
            return part
        out = np.zeros(width, np.asarray(x_local).dtype)
        out[:self.rows.size] = x_local
        return out

    def gather_x(self, x_local):
        """x gathered from every rank's part, in the partition's slots (with the one-GPU plan's tiles: chunk
        after chunk, :class:`~tuner.distributed.rank_tiles.GatherChunks`); every rank calls it at once."""
        part = self.padded(x_local)
        if self._tiles is not None:
            if not gpu.is_device_array(part):
                return self._tiles.tiles.chunks.arrange(self.comm.allgather(part))
            for lo, hi, at in self._tiles.tiles.chunks.pieces():
                self.comm.allgather_into(part[lo:hi], self._gathered[at:at + self.comm.size * (hi - lo)])
            return self._gathered
        if gpu.is_device_array(part):
            # NCCL reads the rank's own part from the buffer it writes: in place, as its all-gather allows.
            self.comm.allgather_into(part, self._gathered)
            return self._gathered
        return np.concatenate(self.comm.allgather(part))

    def __call__(self, x_local, out=None):
        """This rank's entries of A x, from this rank's entries of x (every rank calls it at once)."""
        if self._tiles is not None:
            return self._tiled(x_local, out)
        if self._own is not None and gpu.is_device_array(x_local):
            return self._overlapped(self.padded(x_local), out)
        return self.local_product(self.gather_x(x_local), out)

    def local_product(self, x, out=None):
        """This rank's rows times an x already gathered into the partition's slots (no exchange)."""
        if self._tiles is not None:
            import cupy
            y = cupy.empty(self.rows.size, self.dtype) if out is None else out
            self._tiles(x, y)
            return y
        if self._own is None:
            return self.local(x) if out is None else self.local(x, out=out)
        width, r = self.partition.width, self.comm.rank
        y = self._rest(x) if out is None else self._rest(x, out=out)
        y += self._own(x[r * width:(r + 1) * width])
        return y

    def _overlapped(self, part, out):
        import cupy
        if self._overlap_state is None:
            # The highest priority (CUDA clamps -1000 to the device's range): the kernel queued behind NCCL's
            # would otherwise take every SM and hold the exchange until its blocks drain.
            self._overlap_state = (cupy.cuda.Stream(non_blocking=True, priority=-1000),
                                   cupy.cuda.Event(disable_timing=True),
                                   cupy.cuda.Event(disable_timing=True), cupy.empty(self.rows.size, self.dtype))
        side, ready, done, y_own = self._overlap_state
        out = cupy.empty(self.rows.size, self.dtype) if out is None else out
        null = cupy.cuda.Stream.null  # where the kernels run
        ready.record(null)  # the part is written
        side.wait_event(ready)
        self.comm.allgather_into(part, self._gathered, stream=side.ptr)
        done.record(side)
        self._own(part, out=y_own)  # meanwhile: NCCL reads this part and writes only the others
        null.wait_event(done)
        self._rest(self._gathered, out=out)
        out += y_own
        return out

    def _tiled(self, x_local, out):
        import cupy
        if not gpu.is_device_array(x_local):  # a host vector: through the device and back
            y = self._tiled(cupy.asarray(np.asarray(x_local), self.dtype), None).get()
            if out is None:
                return y
            out[...] = y
            return out
        check_vector_dtype(x_local.dtype, self.dtype, "x_local")
        if out is not None:
            check_vector_shape(out.shape, self.rows.size, "out")
            check_vector_dtype(out.dtype, self.dtype, "out")
        part = self.padded(x_local)
        y = cupy.empty(self.rows.size, self.dtype) if out is None else out
        if not self.overlap:
            return self.local_product(self.gather_x(part), y)
        pieces = self._tiles.tiles.chunks.pieces()
        if self._overlap_state is None:  # NCCL's side stream at the highest priority, as in _overlapped
            self._overlap_state = (cupy.cuda.Stream(non_blocking=True, priority=-1000),
                                   cupy.cuda.Event(disable_timing=True),
                                   [cupy.cuda.Event(disable_timing=True) for _ in pieces])
        side, ready, arrived = self._overlap_state
        null = cupy.cuda.Stream.null
        ready.record(null)  # the part is written
        side.wait_event(ready)
        for (lo, hi, at), event in zip(pieces, arrived):
            self.comm.allgather_into(part[lo:hi], self._gathered[at:at + self.comm.size * (hi - lo)],
                                     stream=side.ptr)
            event.record(side)
        self._tiles.zero(y)
        for j, event in enumerate(arrived):  # phase j reads chunks 0 .. j only
            null.wait_event(event)
            self._tiles.phase(j, self._gathered, y)
        return y

    def gather(self, y_local) -> np.ndarray:
        """The whole vector in A's order, from every rank's entries (every rank calls it at once)."""
        part = self.padded(y_local.get() if gpu.is_device_array(y_local) else np.asarray(y_local))
        y = np.concatenate(self.comm.allgather(part))
        return y[self.partition.slots()]
