"""C = A B with A's rows split among the ranks of a communicator and B whole on every rank.

The rows are dealt by :func:`~tuner.distributed.partition.bitonic_partition` weighted by their scalar
products (the work each row of C costs); each rank multiplies its rows of A by B with its own compiled
product, and ``gather`` assembles C in A's row order on every rank.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import scipy.sparse as sp

from ..formats.row_bins import row_products
from ..matrix import MatrixError
from .comm import Communicator
from .partition import RowPartition, bitonic_partition


class DistributedSpGEMM:
    """This rank's rows of C = A B; ``gather`` makes the whole C (every rank calls it at once).

    ``local_compile`` turns (rows of A, B) into a callable returning SciPy CSR (default: :func:`tuner.compile`,
    the tuned product; any ``(M, B) -> (() -> M @ B)`` will do); ``options`` go to it.

    Example:
        >>> from tuner.distributed.comm import LocalGroup
        >>> A = sp.random(30, 30, density=0.1, format="csr", random_state=0)
        >>> def rank(comm):
        ...     f = DistributedSpGEMM(A, A.T, comm, local_compile=lambda M, B: (lambda: (M @ B).tocsr()))
        ...     return f.gather(f())
        >>> C = LocalGroup(2).run(rank)[1]
        >>> bool(abs(C - A @ A.T).max() < 1e-12)
        True
    """

    def __init__(self, A, B, comm: Communicator, partition: RowPartition | None = None,
                 local_compile: Callable | None = None, **options):
        A, B = sp.csr_matrix(A), sp.csr_matrix(B)
        if A.shape[1] != B.shape[0]:
            raise MatrixError(f"A has {A.shape[1]} columns but B has {B.shape[0]} rows: A B needs them equal")
        self.comm, self.shape = comm, (A.shape[0], B.shape[1])
        self.partition = partition or bitonic_partition(row_products(A.indptr, A.indices, B.indptr), comm.size)
        if self.partition.parts != comm.size or self.partition.owner.size != A.shape[0]:
            raise ValueError(f"the partition has {self.partition.parts} parts of {self.partition.owner.size} rows; "
                             f"the communicator {comm.size} ranks and A {A.shape[0]} rows")
        self.rows = self.partition.rows[comm.rank]
        if local_compile is None:
            from ..operations import compile as local_compile
        self.local = local_compile(A[self.rows], B, **options)

    def __call__(self) -> sp.csr_matrix:
        """This rank's rows of C (in the order of ``rows``)."""
        return sp.csr_matrix(self.local())

    def gather(self, c_local: sp.csr_matrix) -> sp.csr_matrix:
        """The whole C in A's row order, from every rank's rows."""
        c_local = sp.csr_matrix(c_local)
        lengths = np.concatenate(self.comm.allgather(np.diff(c_local.indptr).astype(np.int64)))
        indices = np.concatenate(self.comm.allgather(c_local.indices))
        data = np.concatenate(self.comm.allgather(c_local.data))
        indptr = np.zeros(lengths.size + 1, np.int64)
        np.cumsum(lengths, out=indptr[1:])
        in_rank_order = sp.csr_matrix((data, indices, indptr), shape=self.shape)  # rows as `partition.order`
        return in_rank_order[self.partition.position()]
