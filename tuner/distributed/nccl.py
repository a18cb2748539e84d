"""Collectives on device arrays: NCCL (CuPy's binding) between one process per GPU, or a group of one.

A device communicator is a host communicator (:mod:`~tuner.distributed.comm`: its ``rank``, ``size`` and host
collectives, used to set up) plus ``allgather_into`` and ``allreduce_into`` on CuPy arrays, queued on the
legacy default stream where the tuned kernels run, so that no host synchronisation sits between a product
and the exchange that feeds the next one.
"""
from __future__ import annotations

import numpy as np

from .. import gpu

_REDUCE_OPS = ("sum", "max")


def _cupy():
    try:
        import cupy
    except ImportError as e:
        raise ImportError("collectives on device arrays need CuPy (pip install cupy-cuda13x, or the CUDA "
                          "version of your driver)") from e
    return cupy


def _pack_id(uid) -> np.ndarray:
    """NCCL's 128-byte id as int64s for a host collective: a flag (1: CuPy gave bytes, 0: a tuple of signed
    chars, as older CuPy does), then the bytes."""
    as_bytes = isinstance(uid, (bytes, bytearray))
    raw = np.frombuffer(bytes(uid), np.uint8) if as_bytes else np.array(uid, np.int64).astype(np.int8).view(np.uint8)
    return np.concatenate([[int(as_bytes)], raw.astype(np.int64)])


def _unpack_id(packed: np.ndarray):
    """The id in the form this CuPy's ``NcclCommunicator`` takes (what its ``get_unique_id`` returns).

    Example:
        >>> uid = bytes(range(128)); _unpack_id(_pack_id(uid)) == uid
        True
        >>> uid = tuple(range(-64, 64)); _unpack_id(_pack_id(uid)) == uid
        True
    """
    raw = np.asarray(packed[1:], np.int64).astype(np.uint8)
    return raw.tobytes() if packed[0] else tuple(int(v) for v in raw.view(np.int8))


class SoloDevice:
    """A group of one GPU: the collectives of :class:`NcclComm` with nothing to exchange.

    Example (on a GPU machine):
        >>> import cupy                                               # doctest: +SKIP
        >>> comm = SoloDevice(); out = cupy.empty(3)                  # doctest: +SKIP
        >>> comm.allgather_into(cupy.arange(3.0), out); out.tolist()  # doctest: +SKIP
        [0.0, 1.0, 2.0]
    """

    rank, size = 0, 1

    def __init__(self, device: int = 0):
        gpu.select_device(device)
        _cupy().cuda.Device(device).use()
        self.device = device

    def allgather(self, part: np.ndarray) -> list:
        return [np.asarray(part)]

    def allreduce_sum(self, value: float) -> float:
        return float(value)

    def bcast_array(self, array):
        return array

    def allgather_into(self, part, out, stream: int = 0) -> None:
        if out.data.ptr != part.data.ptr:
            out[:part.size] = part

    def allreduce_into(self, buf, op: str = "sum") -> None:
        if op not in _REDUCE_OPS:
            raise ValueError(f"op must be one of {_REDUCE_OPS}, got {op!r}")


class NcclComm:
    """One rank of a group of GPUs, one process each: NCCL for device arrays, ``host`` for host arrays.

    ``host`` is any communicator of :mod:`~tuner.distributed.comm` (:class:`~tuner.distributed.comm.MpiComm`
    under ``mpirun``); it hands rank 0's NCCL id to every rank. ``device``: this rank's GPU (default: its rank
    modulo the GPUs this machine has, one rank per GPU).

    Example (under ``mpirun -n 2`` on a machine with two GPUs):
        >>> from tuner.distributed import MpiComm                     # doctest: +SKIP
        >>> comm = NcclComm(MpiComm()); x = cupy.full(2, comm.rank)   # doctest: +SKIP
        >>> out = cupy.empty(4); comm.allgather_into(x, out); out.tolist()  # doctest: +SKIP
        [0.0, 0.0, 1.0, 1.0]
    """

    def __init__(self, host, device: int | None = None):
        cupy = _cupy()
        from cupy.cuda import nccl
        self.host, self.rank, self.size = host, host.rank, host.size
        count = gpu.device_count()
        self.device = host.rank % max(count, 1) if device is None else device
        gpu.select_device(self.device)
        cupy.cuda.Device(self.device).use()
        gpu.ensure_context()
        uid = _pack_id(nccl.get_unique_id()) if host.rank == 0 else np.zeros(129, np.int64)
        self._nccl = nccl.NcclCommunicator(host.size, _unpack_id(host.allgather(uid)[0]), host.rank)
        self._types = {np.dtype(np.float32): nccl.NCCL_FLOAT32, np.dtype(np.float64): nccl.NCCL_FLOAT64,
                       np.dtype(np.int32): nccl.NCCL_INT32, np.dtype(np.int64): nccl.NCCL_INT64}
        self._ops = {"sum": nccl.NCCL_SUM, "max": nccl.NCCL_MAX}

    def allgather(self, part: np.ndarray) -> list:
        return self.host.allgather(part)

    def allreduce_sum(self, value: float) -> float:
        return self.host.allreduce_sum(value)

    def bcast_array(self, array):
        return self.host.bcast_array(array)

    def _type(self, array):
        t = self._types.get(np.dtype(array.dtype))
        if t is None:
            raise TypeError(f"NCCL collectives here take float32/64 or int32/64 arrays, got {array.dtype}")
        return t

    def allgather_into(self, part, out, stream: int = 0) -> None:
        """Every rank's ``part`` (one length on every rank), rank after rank, into ``out``, queued on ``stream``
        (default: the legacy default stream, where the kernels run)."""
        if out.size != part.size * self.size or out.dtype != part.dtype:
            raise ValueError(f"out must hold {self.size} x {part.size} {part.dtype}, got {out.size} {out.dtype}")
        self._nccl.allGather(part.data.ptr, out.data.ptr, part.size, self._type(part), stream)

    def allreduce_into(self, buf, op: str = "sum") -> None:
        """``buf`` replaced, in place, by the elementwise ``op`` ('sum' or 'max') of every rank's ``buf``."""
        if op not in self._ops:
            raise ValueError(f"op must be one of {_REDUCE_OPS}, got {op!r}")
        self._nccl.allReduce(buf.data.ptr, buf.data.ptr, buf.size, self._type(buf), self._ops[op], 0)

    def close(self) -> None:
        """Free NCCL's resources for this rank (every rank calls it)."""
        if self._nccl is not None:
            self._nccl.destroy()
            self._nccl = None
