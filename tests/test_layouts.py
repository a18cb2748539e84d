"""The layout cache: a stored layout loads back identical, only for the very same matrix and kernel, and a
damaged or foreign entry is never trusted."""
import json
import logging

import numpy as np
import pytest
import scipy.sparse as sp

from tuner import families, layouts
from tuner.cache import Cache
from tuner.matrix import canonicalize

from .conftest import power_law


@pytest.fixture
def always_store(monkeypatch):
    monkeypatch.setattr(layouts, "LOAD_GBS", float("inf"))  # every build counts as slower than a load
    monkeypatch.setattr(layouts, "LOAD_FIXED_S", 0.0)


def same_launch(a, b):
    assert (a.grid, a.block, a.zero_y, a.scalars) == (b.grid, b.block, b.zero_y, b.scalars)
    assert [n for n, _ in a.arrays] == [n for n, _ in b.arrays]
    for (_, x), (_, y) in zip(a.arrays, b.arrays):
        assert x.dtype == y.dtype and np.array_equal(x, y)
    for name in ("x_gather", "y_gather"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None) and (x is None or np.array_equal(x, y))


def test_every_family_layout_loads_back_identical_and_multiplies_right(always_store, tmp_path):
    cache = Cache(tmp_path)
    m = canonicalize(power_law(700, seed=80))
    x = np.random.default_rng(1).uniform(-1, 1, m.n_cols)
    specs = families.specializations(m)
    assert len({s.family for s in specs}) >= 4
    for spec in specs[::3]:
        built, how = layouts.launch_for(m, spec, cache)
        layouts.wait()
        loaded, how_again = layouts.launch_for(m, spec, cache)
        assert (how, how_again) == ("stored", "loaded")
        same_launch(built, loaded)
        fam = families.get(spec.family)
        plan_x = x if loaded.x_gather is None else x[loaded.x_gather]
        y = fam.evaluate(m, loaded, plan_x)
        y = y if loaded.y_gather is None else y[loaded.y_gather]
        assert np.allclose(y, m.to_scipy().astype(np.float64) @ x, rtol=1e-4, atol=1e-4)


def test_other_values_or_parameters_never_load_anothers_layout(always_store, tmp_path):
    cache = Cache(tmp_path)
    A = power_law(500, seed=81)
    m = canonicalize(A)
    spec, other = families.specializations(m, ["csr_vector"])[:2]
    layouts.launch_for(m, spec, cache)
    layouts.wait()
    scaled = canonicalize(A * np.float32(2))
    assert layouts.launch_for(scaled, spec, cache)[1] == "stored"
    assert layouts.launch_for(m, other, cache)[1] == "stored"
    layouts.wait()
    launch, how = layouts.launch_for(scaled, spec, cache)
    assert how == "loaded" and np.array_equal(dict(launch.arrays)["data"], scaled.data)


def test_a_damaged_entry_is_reported_removed_and_rebuilt(always_store, tmp_path, caplog):
    cache = Cache(tmp_path)
    m = canonicalize(power_law(500, seed=82))
    spec = families.specializations(m, ["csr_vector"])[0]
    fresh, _ = layouts.launch_for(m, spec, cache)
    layouts.wait()
    folder = layouts._folder(cache, layouts.layout_key(m, spec))
    target = sorted(folder.glob("arg*.npy"))[-1]
    raw = bytearray(target.read_bytes())
    raw[-1] ^= 0xFF  # one bit of the last entry
    target.write_bytes(bytes(raw))
    with caplog.at_level(logging.WARNING, logger="tuner.layouts"):
        launch, how = layouts.launch_for(m, spec, cache)
    assert how == "stored" and "differ from their digests" in caplog.text
    same_launch(fresh, launch)
    layouts.wait()
    (folder / "launch.json").write_text("{not json")
    assert layouts.launch_for(m, spec, cache)[1] == "stored"  # an unreadable manifest is an absent entry


def test_the_entries_used_longest_ago_go_first_past_the_budget(always_store, tmp_path):
    cache = Cache(tmp_path)
    keys = []
    for seed in (83, 84, 85):
        m = canonicalize(power_law(400, seed=seed))
        spec = families.specializations(m, ["csr_vector"])[0]
        layouts.launch_for(m, spec, cache)
        layouts.wait()
        keys.append(layouts.layout_key(m, spec))
    sizes = [json.loads((layouts._folder(cache, k) / "launch.json").read_text())["bytes"] for k in keys]
    removed = layouts.evict(cache, budget=sizes[1] + sizes[2])
    assert removed == [layouts._folder(cache, keys[0])]
    assert [layouts._folder(cache, k).exists() for k in keys] == [False, True, True]


def test_a_build_faster_than_a_load_is_not_stored(tmp_path):
    cache = Cache(tmp_path)
    m = canonicalize(sp.random(200, 200, density=0.05, format="csr", random_state=2, dtype=np.float32))
    spec = families.specializations(m, ["csr_vector"])[0]
    assert layouts.launch_for(m, spec, cache)[1] == "built"
    assert not (tmp_path / "layout").exists()


def test_layout_budget_reads_bytes_or_figures(monkeypatch):
    monkeypatch.setenv(layouts.BUDGET_ENV, "8G")
    assert layouts.budget_bytes() == 8 * 10**9 or layouts.budget_bytes() == 8 << 30
    monkeypatch.delenv(layouts.BUDGET_ENV)
    assert layouts.budget_bytes() == layouts.DEFAULT_BUDGET


@pytest.mark.gpu
def test_a_second_compile_loads_its_layout_and_multiplies_the_same(always_store, tmp_path):
    import tuner
    A = power_law(3000, seed=86)
    first = tuner.compile(A, cache_dir=tmp_path)
    layouts.wait()
    second = tuner.compile(A, cache_dir=tmp_path)
    assert (first.layout_source, second.layout_source) == ("stored", "loaded")
    x = np.random.default_rng(3).uniform(-1, 1, A.shape[1]).astype(np.float32)
    assert np.array_equal(first(x), second(x))
    assert tuner.compile(A * np.float32(3), cache_dir=tmp_path).layout_source == "stored"  # other values


def test_a_device_build_out_of_memory_builds_on_the_host_with_a_warning(monkeypatch, tmp_path, caplog):
    import dataclasses
    m = canonicalize(power_law(2000, seed=14))
    spec = families.specializations(m, ["tile_coo"])[0]
    real = families.get("tile_coo")

    def out_of_memory(*args):
        raise MemoryError("out of memory allocating 9,000,000,000 bytes")
    patched = dataclasses.replace(real, device_launch=out_of_memory)
    monkeypatch.setattr(layouts.families, "get", lambda name: patched if name == "tile_coo" else real)
    monkeypatch.setattr(layouts, "on_device", lambda m, spec: True)
    with caplog.at_level("WARNING", logger="tuner.layouts"):
        launch, how = layouts.launch_for(m, spec, Cache(tmp_path))
    assert how in ("built", "stored") and "ran out of memory" in caplog.text
    expected = real.launch(canonicalize(power_law(2000, seed=14)), spec.params)
    assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(expected.arrays, launch.arrays))
