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
from ..matrix import MatrixError, canonicalize
from .comm import Communicator
from .partition import RowPartition, bitonic_partition


def local_rows(A, partition: RowPartition, rank: int) -> sp.csr_matrix:
    """Rank ``rank``'s rows of square ``A`` with their columns renumbered to the partition's slots (the order
    of x gathered from the ranks' equal-length parts), columns ascending; ``parts x width`` columns.

    Example:
        >>> A = sp.csr_matrix(np.arange(1.0, 10.0).reshape(3, 3))
        >>> p = bitonic_partition(np.array([1, 3, 2]), 2)          # rank 0: row 1; rank 1: rows 0 and 2
        >>> local_rows(A, p, 0).toarray().tolist(), p.slots().tolist()  # x gathered as x1, pad, x0, x2
        ([[5.0, 0.0, 4.0, 6.0]], [2, 0, 3])
    """
    m = sp.csr_matrix(A)[partition.rows[rank]]
    m = sp.csr_matrix((m.data, partition.slots()[m.indices], m.indptr),
                      shape=(m.shape[0], partition.parts * partition.width))
    m.sort_indices()
    return m


class DistributedSpMV:
    """This rank's part of y = A x for square A whose rows are split among the ranks of ``comm``.

    ``spmv(x_local)`` takes this rank's entries of x (``spmv.scatter(x)`` picks them from a whole x) and
    returns its entries of y; ``spmv.gather(y_local)`` puts every rank's entries back in A's order.
    ``local_compile`` turns the rank's rows into a callable (default :func:`tuner.compile`, the tuned
    kernel; any ``M -> (x -> M x)`` will do); ``options`` go to it.

    With a device communicator (:class:`~tuner.distributed.nccl.NcclComm`) and a CuPy ``x_local``, x is
    gathered on the GPUs by NCCL into a buffer the kernel reads in place, and y stays on the device.

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
                 local_compile: Callable | None = None, **options):
        m = canonicalize(A)
        if m.n_rows != m.n_cols:
            raise MatrixError(f"the distributed SpMV splits x like A's rows: A must be square, got {m.shape}")
        self.comm = comm
        self.partition = partition or bitonic_partition(m.row_lengths, comm.size)
        if self.partition.parts != comm.size or self.partition.owner.size != m.n_rows:
            raise ValueError(f"the partition has {self.partition.parts} parts of {self.partition.owner.size} rows; "
                             f"the communicator {comm.size} ranks and A {m.n_rows} rows")
        self.rows = self.partition.rows[comm.rank]
        if local_compile is None:
            from ..operations import compile as local_compile
        mine = local_rows(m.to_scipy(), self.partition, comm.rank)
        self.local_nnz = int(mine.nnz)
        self.local = local_compile(mine, **options)
        self._gathered = None  # the device buffer x is gathered into, made at the first device call

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
                self._gathered = cupy.zeros(width * self.comm.size, x_local.dtype)
            part = self._gathered[self.comm.rank * width:(self.comm.rank + 1) * width]
            if gpu.view(x_local).ptr != part.data.ptr:  # an iterative caller may write its slice in place
                part[:self.rows.size] = x_local
            return part
        out = np.zeros(width, np.asarray(x_local).dtype)
        out[:self.rows.size] = x_local
        return out

    def gather_x(self, x_local):
        """x in the partition's slots, every rank's part gathered (every rank calls it at once)."""
        part = self.padded(x_local)
        if gpu.is_device_array(part):
            # NCCL reads the rank's own part from the buffer it writes: in place, as its all-gather allows.
            self.comm.allgather_into(part, self._gathered)
            return self._gathered
        return np.concatenate(self.comm.allgather(part))

    def __call__(self, x_local, out=None):
        """This rank's entries of A x, from this rank's entries of x (every rank calls it at once)."""
        x = self.gather_x(x_local)
        return self.local(x) if out is None else self.local(x, out=out)

    def gather(self, y_local) -> np.ndarray:
        """The whole vector in A's order, from every rank's entries (every rank calls it at once)."""
        part = self.padded(y_local.get() if gpu.is_device_array(y_local) else np.asarray(y_local))
        y = np.concatenate(self.comm.allgather(part))
        return y[self.partition.slots()]
