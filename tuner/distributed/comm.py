"""What the distributed products need of a communicator, and an in-process group that provides it.

A communicator has a ``rank``, a ``size`` and three collectives: ``allgather`` (every rank's array, in rank
order, to every rank), ``allreduce_sum`` and ``bcast_array`` (rank 0's array to every rank).
:class:`LocalGroup` runs ``size`` ranks as threads of this process; it is what the CPU tests use.
:class:`MpiComm` is one rank of an MPI job (mpi4py, ``mpirun -n P``), its collectives on host arrays.
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Protocol

import numpy as np


BCAST_PIECE = 1 << 30  # bytes per MPI broadcast


class Communicator(Protocol):
    rank: int
    size: int

    def allgather(self, part: np.ndarray) -> list:
        """Every rank's ``part``, in rank order."""

    def allreduce_sum(self, value: float) -> float:
        """The sum of every rank's ``value``."""

    def bcast_array(self, array: np.ndarray | None) -> np.ndarray:
        """Rank 0's ``array`` on every rank (the others pass None)."""


class LocalGroup:
    """``size`` ranks in this process, a thread each.

    Example:
        >>> LocalGroup(3).run(lambda comm: [p.tolist() for p in comm.allgather(np.array([comm.rank]))])[1]
        [[0], [1], [2]]
    """

    def __init__(self, size: int):
        if size < 1:
            raise ValueError(f"a group needs at least one rank, got {size}")
        self.size = size
        self._barrier = threading.Barrier(size)
        self._slots: list = [None] * size

    def run(self, fn: Callable) -> list:
        """``fn(comm)`` on every rank at once (a group of one: in this thread); their results in rank order. A
        rank's exception breaks the others' waits and is raised here."""
        if self.size == 1:  # nothing to wait for: in the calling thread, whose CUDA context and device it keeps
            return [fn(_LocalComm(self, 0))]

        def rank(r: int):
            try:
                return fn(_LocalComm(self, r))
            except BaseException:
                self._barrier.abort()
                raise
        with ThreadPoolExecutor(max_workers=self.size) as pool:
            futures = [pool.submit(rank, r) for r in range(self.size)]
            errors = [f.exception() for f in futures]
        first = next((e for e in errors if e is not None and not isinstance(e, threading.BrokenBarrierError)),
                     next((e for e in errors if e is not None), None))
        if first is not None:
            raise first
        return [f.result() for f in futures]

    def _exchange(self, rank: int, value) -> list:
        self._slots[rank] = value
        self._barrier.wait()
        out = list(self._slots)
        self._barrier.wait()  # nobody writes the next exchange's slot before everyone has read this one
        return out


class _LocalComm:
    def __init__(self, group: LocalGroup, rank: int):
        self._group, self.rank, self.size = group, rank, group.size

    def allgather(self, part: np.ndarray) -> list:
        return self._group._exchange(self.rank, np.asarray(part))

    def allreduce_sum(self, value: float) -> float:
        return float(sum(self._group._exchange(self.rank, float(value))))

    def bcast_array(self, array: np.ndarray | None) -> np.ndarray:
        return self._group._exchange(self.rank, array)[0]  # one process: rank 0's array itself


class MpiComm:
    """This process's rank of an MPI communicator (mpi4py's ``COMM_WORLD`` unless ``comm`` is given); every
    rank must pass arrays of one dtype to a collective.

    Example (under ``mpirun -n 2``, with mpi4py installed: the ``mpi`` extra):
        >>> comm = MpiComm()                                          # doctest: +SKIP
        >>> [p.tolist() for p in comm.allgather(np.arange(comm.rank + 1))]  # doctest: +SKIP
        [[0], [0, 1]]
    """

    def __init__(self, comm=None):
        try:
            from mpi4py import MPI
        except ImportError as e:
            raise ImportError("MpiComm needs mpi4py (pip install 'sparse-tuner[mpi]') and an MPI runtime") from e
        self._comm = comm if comm is not None else MPI.COMM_WORLD
        self.rank, self.size = self._comm.Get_rank(), self._comm.Get_size()

    def allgather(self, part: np.ndarray) -> list:
        part = np.ascontiguousarray(part)
        counts = np.asarray(self._comm.allgather(part.size), dtype=np.int64)
        out = np.empty(int(counts.sum()), dtype=part.dtype)
        self._comm.Allgatherv(part, [out, counts])
        return np.split(out, np.cumsum(counts)[:-1])

    def allreduce_sum(self, value: float) -> float:
        return float(self._comm.allreduce(float(value)))

    def bcast_array(self, array: np.ndarray | None) -> np.ndarray:
        """Rank 0's ``array`` on every rank, sent as bytes in pieces of at most :data:`BCAST_PIECE` (MPI
        counts are 32-bit)."""
        head = self._comm.bcast(None if array is None else (np.dtype(array.dtype).str, array.shape), root=0)
        out = np.ascontiguousarray(array) if self.rank == 0 else np.empty(head[1], np.dtype(head[0]))
        flat = out.reshape(-1).view(np.uint8)
        for lo in range(0, flat.size, BCAST_PIECE):
            self._comm.Bcast(flat[lo:lo + BCAST_PIECE], root=0)
        return out
