"""The radix sorts of the device layout builders (templates/cub_sort.cu.j2 through tuner.formats.device_sort):
the library builds for sm_90 with every sort it is asked for, and on a GPU it orders keys and values as
NumPy's stable sort does, over the bits it is given."""
import ctypes

import numpy as np
import pytest

from tuner import codegen
from tuner.cache import Cache
from tuner.formats import device_sort


def test_every_sort_library_is_built_ahead_for_sm_90_each_with_its_own_sort(tmp_path, monkeypatch):
    monkeypatch.setattr(device_sort, "_paths", {})
    device_sort.prebuild("sm_90", Cache(tmp_path))
    assert len(device_sort.FUNCTIONS) == 6 and len(device_sort._paths) == 6
    monkeypatch.setattr(codegen.subprocess, "run", lambda *a, **k: pytest.fail("nvcc ran again"))
    for key in ("u32", "u64"):
        names = [f"{device_sort.LIBRARY}_keys_{key}"] + [f"{device_sort.LIBRARY}_pairs_{key}_{v}" for v in ("u32", "u64")]
        for name in names:
            path = device_sort._paths[("sm_90", name)]  # where the first sort on an sm_90 device loads it from
            assert codegen.compile_library(device_sort.source(name), "sm_90", Cache(tmp_path)) == path
            lib = ctypes.CDLL(str(path))
            assert hasattr(lib, name)
            assert not any(hasattr(lib, other) for other in device_sort.FUNCTIONS if other != name)


def test_a_sort_that_is_not_one_of_the_librarys_is_refused_by_name():
    with pytest.raises(ValueError, match="no sort 'cub_sort_keys_u16'"):
        device_sort.source("cub_sort_keys_u16")


def test_the_host_stand_in_sorts_stably_by_the_low_bits_alone():
    keys = np.array([0b101, 0b001, 0b111, 0b011], np.uint64)  # low two bits: 1, 1, 3, 3
    k, v = device_sort.sort(keys.copy(), np.arange(4, dtype=np.int32), end_bit=2)
    assert k.tolist() == [0b101, 0b001, 0b111, 0b011] and v.tolist() == [0, 1, 2, 3]
    k, v = device_sort.sort(keys.copy(), np.arange(4, dtype=np.int32))
    assert k.tolist() == [1, 3, 5, 7] and v.tolist() == [1, 3, 0, 2]


@pytest.mark.gpu
@pytest.mark.parametrize("key_dtype,val_dtype", [(np.uint64, None), (np.uint32, None), (np.uint64, np.float32),
                                                 (np.uint64, np.float64), (np.uint32, np.int32),
                                                 (np.uint32, np.int64), (np.int64, np.float32)])
def test_the_gpu_sorts_keys_and_values_as_numpys_stable_sort(key_dtype, val_dtype):
    cupy = pytest.importorskip("cupy")
    rng = np.random.default_rng(5)
    bits = 37 if np.dtype(key_dtype).itemsize == 8 else 21
    keys = rng.integers(0, 1 << bits, 300_001).astype(key_dtype)
    keys[::7] = keys[3]  # ties, kept in their order
    values = None if val_dtype is None else rng.standard_normal(keys.size).astype(val_dtype) * 1000
    order = np.argsort(keys, kind="stable")
    k, v = device_sort.sort(cupy.asarray(keys), None if values is None else cupy.asarray(values), end_bit=bits)
    assert k.dtype == keys.dtype and np.array_equal(cupy.asnumpy(k), keys[order])
    if values is not None:
        assert v.dtype == values.dtype and np.array_equal(cupy.asnumpy(v), values[order])


@pytest.mark.gpu
def test_the_gpu_argsort_of_small_keys_equals_numpys_stable_argsort():
    cupy = pytest.importorskip("cupy")
    keys = np.random.default_rng(6).integers(0, 300, 100_000).astype(np.uint16)
    order, sorted_keys = device_sort.argsort(cupy.asarray(keys), device_sort.key_bits(299))
    assert order.dtype == np.int64 and np.array_equal(cupy.asnumpy(order), np.argsort(keys, kind="stable"))
    assert np.array_equal(cupy.asnumpy(sorted_keys), np.sort(keys))
