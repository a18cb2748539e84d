"""SpMV with A's rows split among the ranks of a communicator (paper 003, section 3.4).

Each rank owns the rows :func:`~tuner.distributed.partition.bitonic_partition` deals it and the same
entries of x and y. A product gathers x from every rank (``allgather``) into the partition's order, in which
the rank's rows have their columns renumbered once, and multiplies its rows with its own compiled kernel.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import scipy.sparse as sp

from ..matrix import MatrixError, canonicalize
from .comm import Communicator
from .partition import RowPartition, bitonic_partition


def local_rows(A, partition: RowPartition, rank: int) -> sp.csr_matrix:
    """Rank ``rank``'s rows of square ``A`` with their columns renumbered to the partition's order (the order
    of x gathered from the ranks), columns ascending.

    Example:
        >>> A = sp.csr_matrix(np.arange(1.0, 10.0).reshape(3, 3))
        >>> p = bitonic_partition(np.array([1, 3, 2]), 2)          # rank 0: row 1; rank 1: rows 0 and 2
        >>> local_rows(A, p, 0).toarray().tolist(), p.order.tolist()  # x gathered as x1, x0, x2
        ([[5.0, 4.0, 6.0]], [1, 0, 2])
    """
    m = sp.csr_matrix(A)[partition.rows[rank]]
    m = sp.csr_matrix((m.data, partition.position()[m.indices], m.indptr), shape=m.shape)
    m.sort_indices()
    return m


class DistributedSpMV:
    """This rank's part of y = A x for square A whose rows are split among the ranks of ``comm``.

    ``spmv(x_local)`` takes this rank's entries of x (``spmv.scatter(x)`` picks them from a whole x) and
    returns its entries of y; ``spmv.gather(y_local)`` puts every rank's entries back in A's order.
    ``local_compile`` turns the rank's rows into a callable (default :func:`tuner.compile`, the tuned
    kernel; any ``M -> (x -> M x)`` will do); ``options`` go to it.

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
        self.local = local_compile(local_rows(m.to_scipy(), self.partition, comm.rank), **options)

    def scatter(self, x: np.ndarray) -> np.ndarray:
        """This rank's entries of a whole vector."""
        return np.asarray(x)[self.rows]

    def __call__(self, x_local: np.ndarray):
        """This rank's entries of A x, from this rank's entries of x (every rank calls it at once)."""
        return self.local(np.concatenate(self.comm.allgather(np.asarray(x_local))))

    def gather(self, y_local: np.ndarray) -> np.ndarray:
        """The whole vector in A's order, from every rank's entries (every rank calls it at once)."""
        parts = self.comm.allgather(np.asarray(y_local))
        y = np.empty(self.partition.owner.size, dtype=np.result_type(*parts))
        y[self.partition.order] = np.concatenate(parts)
        return y
