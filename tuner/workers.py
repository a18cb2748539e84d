"""Thread pools whose workers queue their CuPy work where the thread that made the pool queues its own.

CuPy's current device and stream belong to a thread: a new thread starts on device 0 and the legacy default
stream. A compile's background tuning runs its device work on a non-blocking stream of its own so that the
caller's products (on the legacy default stream) never queue behind it; a worker of the tuning that started
on the legacy stream would put its passes (warp histograms, gather shares: milliseconds to tens of
milliseconds each) in front of the caller's next product, and out of order with the tuning's own stream.
"""
from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor


def pool(max_workers: int) -> ThreadPoolExecutor:
    """A thread pool of ``max_workers`` whose workers run CuPy on this thread's current device and stream
    (a plain pool where CuPy was never imported or reaches no GPU: there is nothing to carry).

    Example:
        >>> with pool(2) as p:
        ...     list(p.map(abs, [-1, 2]))
        [1, 2]
    """
    cupy = sys.modules.get("cupy")
    if cupy is None:
        return ThreadPoolExecutor(max_workers=max_workers)
    try:
        device, stream = cupy.cuda.Device().id, cupy.cuda.get_current_stream()
    except cupy.cuda.runtime.CUDARuntimeError:  # CuPy installed, no device visible: the host passes run
        return ThreadPoolExecutor(max_workers=max_workers)

    def carry() -> None:
        cupy.cuda.Device(device).use()
        stream.use()
    return ThreadPoolExecutor(max_workers=max_workers, initializer=carry)
