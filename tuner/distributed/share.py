"""A graph loaded once per job and handed to every rank: rank 0 reads (or generates) it and broadcasts its
CSR arrays, so that P ranks on one machine spend one load instead of P at once, each competing for the
same cores and memory. MPI launchers bind each rank to a share of the cores; the other ranks wait while
rank 0 loads, so it loads on every core the machine lets it have."""
from __future__ import annotations

import os
from contextlib import contextmanager

import numpy as np
import scipy.sparse as sp

from .. import loaders


def load_once(source, comm) -> sp.csr_matrix:
    """:func:`tuner.loaders.load` of ``source`` on rank 0, the same matrix on every rank of ``comm`` (every
    rank calls it). A load that fails on rank 0 raises there, and on every other rank an error naming it.

    Example:
        >>> from tuner.distributed.comm import LocalGroup
        >>> [A.nnz for A in LocalGroup(2).run(lambda comm: load_once("rmat:8:4:3", comm))]
        [852, 852]
    """
    return share_csr(load_on_root(source, comm), comm)


def load_on_root(source, comm) -> sp.csr_matrix | None:
    """:func:`tuner.loaders.load` of ``source`` on rank 0 (on every CPU the machine allows), None on the
    other ranks (every rank calls it). A load that fails on rank 0 raises there, and on every other rank an
    error naming it.

    Example:
        >>> from tuner.distributed.comm import LocalGroup
        >>> [A is None for A in LocalGroup(2).run(lambda comm: load_on_root("rmat:8:4:3", comm))]
        [False, True]
    """
    A, error = None, None
    if comm.rank == 0:
        try:
            with every_cpu():
                A = loaders.load(source)
        except Exception as e:  # noqa: BLE001 - the other ranks hear of it before it is raised
            error = e
    failed = comm.bcast_array(np.array([error is not None]) if comm.rank == 0 else None)
    if failed[0]:
        if error is not None:
            raise error
        raise RuntimeError(f"rank 0 could not load {source}: see its error")
    return A


def share_csr(A: sp.csr_matrix | None, comm) -> sp.csr_matrix:
    """Rank 0's CSR matrix ``A`` on every rank (the others pass None); its canonical flag comes along.

    Example:
        >>> from tuner.distributed.comm import LocalGroup
        >>> M = sp.csr_matrix(np.eye(3))
        >>> LocalGroup(2).run(lambda comm: float(share_csr(M if comm.rank == 0 else None, comm).toarray().trace()))
        [3.0, 3.0]
    """
    if comm.size == 1:
        return A
    root = comm.rank == 0
    head = comm.bcast_array(np.array([*A.shape, A.has_canonical_format], np.int64) if root else None)
    indptr, indices, data = (comm.bcast_array(getattr(A, name) if root else None)
                             for name in ("indptr", "indices", "data"))
    if root:
        return A
    out = sp.csr_matrix((data, indices, indptr), shape=(int(head[0]), int(head[1])), copy=False)
    out.has_canonical_format = bool(head[2])
    return out


@contextmanager
def every_cpu():
    """Inside the block, this thread (and the threads it starts) may run on every CPU of the machine that
    the system allows; after it, on those it was bound to before. Where affinity cannot be set, nothing
    changes.

    Example:
        >>> before = os.sched_getaffinity(0)
        >>> with every_cpu():
        ...     wide = os.sched_getaffinity(0)
        >>> wide >= before, os.sched_getaffinity(0) == before
        (True, True)
    """
    try:
        before = os.sched_getaffinity(0)
    except AttributeError:  # not on Linux
        yield
        return
    try:
        os.sched_setaffinity(0, range(os.cpu_count() or 1))
    except OSError:  # a CPU the cgroup forbids: keep the binding
        pass
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)
