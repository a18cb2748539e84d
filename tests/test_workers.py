"""Thread pools whose workers queue CuPy work on the creating thread's device and stream."""
import sys
import threading
import types

import pytest

from tuner import workers


def test_without_cupy_a_pool_is_a_plain_thread_pool(monkeypatch):
    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    with workers.pool(3) as p:
        assert sorted(p.map(lambda v: v * v, [3, 1, 2])) == [1, 4, 9]


def _fake_cupy(device_id: int, stream_name: str):
    """A CuPy stand-in with thread-local current device and stream, as CuPy keeps them."""
    local = threading.local()

    class Stream:
        def __init__(self, name):
            self.name = name

        def use(self):
            local.stream = self

    class Device:
        def __init__(self, i=None):
            self.id = getattr(local, "device", 0) if i is None else i

        def use(self):
            local.device = self.id

    cuda = types.SimpleNamespace(Device=Device, get_current_stream=lambda: getattr(local, "stream", Stream("null")))
    Device(device_id).use()
    Stream(stream_name).use()
    return types.SimpleNamespace(cuda=cuda)


def test_a_pools_workers_start_on_the_creators_device_and_stream(monkeypatch):
    cupy = _fake_cupy(2, "tuning")
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    with workers.pool(2) as p:
        seen = list(p.map(lambda _: (cupy.cuda.Device().id, cupy.cuda.get_current_stream().name), range(6)))
    assert seen == [(2, "tuning")] * 6
    # A thread of its own starts where CuPy starts every thread: device 0, the legacy stream.
    fresh = []
    t = threading.Thread(target=lambda: fresh.append((cupy.cuda.Device().id, cupy.cuda.get_current_stream().name)))
    t.start()
    t.join()
    assert fresh == [(0, "null")]


def test_with_cupy_but_no_visible_device_a_pool_is_a_plain_thread_pool(monkeypatch):
    class CUDARuntimeError(RuntimeError):
        pass

    def no_device(i=None):
        raise CUDARuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected")
    cuda = types.SimpleNamespace(Device=no_device, runtime=types.SimpleNamespace(CUDARuntimeError=CUDARuntimeError))
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=cuda))
    with workers.pool(2) as p:
        assert list(p.map(lambda v: v + 1, [1, 2, 3])) == [2, 3, 4]


@pytest.mark.gpu
def test_a_pools_workers_queue_cupy_work_on_the_creators_stream():
    cupy = pytest.importorskip("cupy")
    side = cupy.cuda.Stream(non_blocking=True)
    with side:
        with workers.pool(2) as p:
            ptrs = list(p.map(lambda _: cupy.cuda.get_current_stream().ptr, range(4)))
    assert ptrs == [side.ptr] * 4 and side.ptr != 0
