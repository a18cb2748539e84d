"""Copies between the GPU and host memory through two page-locked staging buffers: a copy into or out of
pageable memory runs at about a tenth of PCIe's rate, so the device copies out of (or into) one locked
buffer while several host threads fill (or empty) the other. The copy engine's calls differ by backend
(PyCUDA in :mod:`tuner.gpu`, CuPy in :mod:`tuner.formats.device_reorder`); the alternation is here:
:func:`feed` towards the device, :func:`drain` from it. Locking the buffers costs several copies' worth of
time, so a process rents before it buys (:class:`StagingRental`)."""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import numpy as np

STAGE_BYTES = 64 << 20  # one staging buffer; two alternate, so a copy over PCIe overlaps the host's
# Threads filling or emptying a staging buffer: one host thread copies 5-10 GB/s, PCIe 55. Together they top
# out near 30 GB/s (each byte is read and written by the host, then read again by the copy engine), which a
# GPU host's dozen cores reach with pieces of a few megabytes each.
STAGE_THREADS = max(1, min(12, os.cpu_count() or 1))
DIRECT_MAX_BYTES = 32 << 20  # arrays up to this size are copied directly, without the staging buffers
# Locking the two staging buffers costs what a pageable copy loses against a staged one over about four times
# their bytes: locking runs near 2.7 GB/s, a pageable copy near 7 and a staged one 14-31 (H200 host: 48 ms to
# lock 128 MiB; 64 MiB pageable 8.7 ms, staged 4.7 ms), so 128 MiB of locking buys back 0.1 ms a MiB copied.
RENT_FACTOR = 4

_shared: dict = {}
_shared_lock = threading.Lock()


def shared_pool() -> ThreadPoolExecutor:
    """The process's pool of :data:`STAGE_THREADS` threads for host copies that run beside the caller (a
    slotted product's blocks of C copied out of page-locked memory, C's pattern into new arrays): made once,
    since a call of a few milliseconds that started its threads anew would pay tens of microseconds a
    thread. Its tasks never wait for one another, so callers share it safely.

    Example:
        >>> shared_pool() is shared_pool()
        True
    """
    with _shared_lock:
        if "pool" not in _shared:
            _shared["pool"] = ThreadPoolExecutor(STAGE_THREADS, thread_name_prefix="tuner-copy")
        return _shared["pool"]


class StagingRental:
    """Whether a copy goes through locked host memory (the staging buffers, or for a mid-sized copy one
    locked block) or straight from pageable memory: a ski rental. Locking is paid once per process, and
    only a process that copies enough gains it back: a graph of 16M edges crosses in 9 ms pageable against
    5 ms staged plus 48 ms of locking. So the first copies go pageable (rented) while, with the one asked
    about, they total at most :data:`RENT_FACTOR` times the two staging buffers' bytes; the copy that would
    pass that locks (bought), and every later one goes through locked memory. A process never pays more
    than about twice what knowing its copies in advance would cost. ``may_rent`` False (a copy beside other
    threads' kernel launches, which a pageable copy holds up for its length): locked whatever was rented.

    Example:
        >>> rental = StagingRental()
        >>> [rental.locked(n) for n in (STAGE_BYTES, 6 * STAGE_BYTES, 2 * STAGE_BYTES, 1)]
        [False, False, True, True]
        >>> rental = StagingRental()
        >>> rental.expect(3 * STAGE_BYTES + 6 * STAGE_BYTES)  # a matrix's two arrays, past the rent together
        >>> rental.locked(3 * STAGE_BYTES)
        True
    """

    def __init__(self, bought: bool = False) -> None:
        self.rented = 0  # bytes copied pageable so far
        self.bought = bought
        self._lock = threading.Lock()

    def expect(self, nbytes: int) -> None:
        """Copies of ``nbytes`` in all follow (a matrix's arrays): where they would pass the rent, the buffers
        are bought before the first of them rather than after some were rented, a cost they would not save."""
        with self._lock:
            if self.rented + nbytes > _rent():
                self.bought = True

    def locked(self, nbytes: int, may_rent: bool = True) -> bool:
        """Whether to copy ``nbytes`` through locked memory (True) or pageable (False, counted)."""
        with self._lock:
            if not self.bought and may_rent and self.rented + nbytes <= _rent():
                self.rented += nbytes
                return False
            self.bought = True
            return True


def _rent() -> int:
    """Bytes a process copies pageable before it locks: :data:`RENT_FACTOR` times the two staging buffers."""
    return RENT_FACTOR * 2 * STAGE_BYTES


def drain(dst: np.ndarray, stages: list, fetch: Callable[[int, int, int], None],
          wait: Callable[[int], None]) -> None:
    """Fill ``dst`` (bytes) piece by piece through the two ``stages`` (byte arrays of :data:`STAGE_BYTES`):
    ``fetch(k, start, size)`` queues the device's copy of bytes ``start .. start + size`` into stage ``k``,
    ``wait(k)`` returns once it has arrived. The next piece is fetched into the other stage while
    :data:`STAGE_THREADS` threads empty this one.

    Example (NumPy standing in for the device):
        >>> src, dst = np.arange(100, dtype=np.uint8), np.zeros(100, np.uint8)
        >>> stages = [np.zeros(STAGE_BYTES, np.uint8) for _ in range(2)]
        >>> drain(dst, stages, lambda k, start, size: np.copyto(stages[k][:size], src[start:start + size]),
        ...       lambda k: None)
        >>> bool((dst == src).all())
        True
    """
    n = dst.size
    starts = list(range(0, n, STAGE_BYTES))
    if not starts:
        return
    with ThreadPoolExecutor(STAGE_THREADS) as pool:
        fetch(0, 0, min(STAGE_BYTES, n))
        for i, start in enumerate(starts):
            k = i % 2
            wait(k)
            if i + 1 < len(starts):  # into the other stage, emptied in the previous round, while this one is emptied
                fetch(1 - k, starts[i + 1], min(STAGE_BYTES, n - starts[i + 1]))
            size = min(STAGE_BYTES, n - start)
            _copy(pool, dst[start:start + size], stages[k][:size])


def feed(src: np.ndarray, stages: list, put: Callable[[int, int, int], None], wait: Callable[[int], None]) -> None:
    """Send ``src`` (bytes) piece by piece through the two ``stages`` (byte arrays of :data:`STAGE_BYTES`):
    :data:`STAGE_THREADS` threads fill stage ``k`` with the piece at ``start``, then ``put(k, start, size)``
    queues the device's copy of it out of the stage, and the next piece is filled into the other stage while
    that copy runs. ``wait(k)`` returns once stage ``k``'s last copy has left it (called before the stage
    is filled again, and for both stages at the end, so that ``src`` may change once this returns).

    Example (NumPy standing in for the device):
        >>> src, dst = np.arange(100, dtype=np.uint8), np.zeros(100, np.uint8)
        >>> stages = [np.zeros(STAGE_BYTES, np.uint8) for _ in range(2)]
        >>> feed(src, stages, lambda k, start, size: np.copyto(dst[start:start + size], stages[k][:size]),
        ...      lambda k: None)
        >>> bool((dst == src).all())
        True
    """
    n = src.size
    queued = [False, False]
    with ThreadPoolExecutor(STAGE_THREADS) as pool:
        for i, start in enumerate(range(0, n, STAGE_BYTES)):
            k = i % 2
            if queued[k]:
                wait(k)  # the stage's previous piece has left it
            size = min(STAGE_BYTES, n - start)
            _copy(pool, stages[k][:size], src[start:start + size])
            put(k, start, size)
            queued[k] = True
    for k in (0, 1):
        if queued[k]:
            wait(k)


def _copy(pool: ThreadPoolExecutor, dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[:] = src`` (byte arrays of one size, at most a stage) in :data:`STAGE_THREADS` parts on ``pool``."""
    for done in copy_in_parts(pool, dst, src, -(-STAGE_BYTES // STAGE_THREADS)):
        done.result()


def copy_in_parts(pool: ThreadPoolExecutor, dst: np.ndarray, src: np.ndarray, part: int) -> list:
    """Start ``dst[:] = src`` (1-D arrays of one size) on ``pool`` in parts of ``part`` elements, and return
    the parts' futures: NumPy's copies let go of the GIL, so the parts run on as many cores as ``pool`` has.

    Example:
        >>> dst = np.zeros(5)
        >>> with ThreadPoolExecutor(2) as pool:
        ...     _ = [done.result() for done in copy_in_parts(pool, dst, np.arange(5.0), 2)]
        >>> dst.tolist()
        [0.0, 1.0, 2.0, 3.0, 4.0]
    """
    return [pool.submit(np.copyto, dst[p:p + part], src[p:p + part]) for p in range(0, dst.size, part)]
