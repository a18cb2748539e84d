"""Rendering and nvcc compilation of every template specialisation for sm_90 (no GPU needed)."""
import itertools

import jinja2
import numpy as np
import pytest

from tuner import codegen, families
from tuner.cache import Cache
from tuner.families import aligned_coo, binned, csr_vector, tile_composite, tile_coo
from tuner.families.base import Specialization

TRAITS = list(itertools.product(["float32", "float64"], ["int32", "int64"], [False, True]))
PARAMS = {
    "csr_vector": [csr_vector.CsrVectorParams(t, b) for t in csr_vector.THREADS_PER_ROW
                   for b in csr_vector.BLOCK_SIZES],
    "binned": [binned.BinnedParams(s, md, w, h) for s in binned.SMALL_MAX for md in binned.MEDIUM_MAX
               for w in binned.WARP_DIVISION for h in (md, *binned.HUGE_MIN)],
    "aligned_coo": [aligned_coo.AlignedCooParams(lay) for lay in aligned_coo.LAYOUTS],
    "tile_coo": [tile_coo.TileCooParams(w) for w in (0, 4096)],
    "tile_composite": [tile_composite.TileCompositeParams(w, (64,), pad) for w in (0, 4096) for pad in (False, True)],
}


def all_specializations():
    return [Specialization(fam, p, np.dtype(v), np.dtype(i), vf)
            for fam, params in PARAMS.items() for p in params for v, i, vf in TRAITS]


def test_every_template_specialisation_compiles_for_sm_90(tmp_path):
    specs = all_specializations()
    sources = [families.render(s) for s in specs]
    # Parameters that only shape the layout (binned's thresholds, aligned_coo's seg or flat, the tiles and
    # workload sizes) share a kernel; everything else differs.
    kernel_identity = {(s.family, tuple(sorted(families.get(s.family).context(None, s.params).items())),
                        s.value_dtype, s.index_dtype, s.value_free) for s in specs}
    assert len(set(sources)) == len(kernel_identity) == 12 * 8 + 2 * 8 + 2 * 8 + 8 + 8
    binaries = codegen.compile_many(sources, arch="sm_90", cache=Cache(tmp_path))
    for spec, b in zip(specs, binaries):
        assert b.cubin[:4] == b"\x7fELF", spec.label()
        assert spec.kernel_name.encode() in b.cubin, spec.label()


def test_rendered_source_carries_the_specialisation():
    spec = Specialization("binned", binned.BinnedParams(4, 32, 8, 1024), np.dtype("float64"),
                          np.dtype("int64"), True)
    src = families.render(spec)
    assert "typedef double val_t;" in src and "typedef long long idx_t;" in src
    assert "#define MEDIUM_LANES 4" in src and "partial[BLOCK / 32]" in src
    assert "data +" not in src and "const val_t* __restrict__ data" not in src
    valued = families.render(Specialization("binned", binned.BinnedParams(), np.dtype("float32"),
                                            np.dtype("int32"), False))
    assert "STREAM(data + j + 0 * STEP)" in valued and "pattern_value * (acc)" not in valued


def test_missing_template_variable_is_an_error():
    with pytest.raises(jinja2.UndefinedError):
        codegen.render("csr_vector.cu.j2", {"VAL": "float", "IDX": "int", "value_free": False})


def test_second_compile_comes_from_the_cache(tmp_path):
    cache = Cache(tmp_path)
    src = 'extern "C" __global__ void k(float* y) { y[threadIdx.x] = 2.f; }'
    first = codegen.compile_source(src, cache=cache)
    second = codegen.compile_source(src, cache=cache)
    assert not first.cached and second.cached and first.cubin == second.cubin and first.key == second.key
    assert codegen.load_binary(first.key, "sm_90", cache).cubin == first.cubin


def test_binary_key_changes_with_source_arch_and_options():
    src = 'extern "C" __global__ void k() {}'
    keys = {codegen.binary_key(src, "sm_90"), codegen.binary_key(src + " ", "sm_90"),
            codegen.binary_key(src, "sm_80"), codegen.binary_key(src, "sm_90", ("-O1",))}
    assert len(keys) == 4


def test_compile_error_shows_nvcc_log_and_source_path(tmp_path):
    with pytest.raises(codegen.CompileError) as info:
        codegen.compile_source('extern "C" __global__ void k() { undeclared_thing = 1; }', cache=Cache(tmp_path))
    text = str(info.value)
    assert "undeclared_thing" in text and "is undefined" in text
    path = text.split(" on ")[1].split("\n")[0]
    assert path.endswith(".cu") and "undeclared_thing" in open(path).read()


def test_missing_nvcc_is_reported(monkeypatch):
    codegen.nvcc_path.cache_clear()
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setenv("NVCC", "/nonexistent/nvcc")
    monkeypatch.setenv("CUDA_HOME", "/nonexistent")
    monkeypatch.setattr(codegen.Path, "is_file", lambda self: False)
    try:
        with pytest.raises(codegen.ToolchainError, match="nvcc not found"):
            codegen.nvcc_path()
    finally:
        codegen.nvcc_path.cache_clear()


def test_arch_from_capability():
    assert codegen.arch_from_capability(9, 0) == "sm_90"


def test_stream_hold_ptx_assembles_for_sm_90(tmp_path):
    # The timing hold kernel is shipped as PTX for the driver to compile; ptxas checks it here, on a CPU.
    import subprocess
    from pathlib import Path
    from tuner import gpu
    ptxas = Path(codegen.nvcc_path()).with_name("ptxas")
    src = tmp_path / "hold.ptx"
    src.write_text(gpu.HOLD_PTX)
    proc = subprocess.run([str(ptxas), "-arch=sm_90", str(src), "-o", str(tmp_path / "hold.cubin")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "hold.cubin").stat().st_size > 0


_CHILD = """
import sys, time
from pathlib import Path
from tuner import codegen
from tuner.cache import Cache
root, ready, go = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
codegen.nvcc_version()  # before the start line, so that only the compiles race
ready.touch()
while not go.exists():
    time.sleep(0.01)
b = codegen.compile_source('extern "C" __global__ void k(float* y) { y[threadIdx.x] = 3.f; }', cache=Cache(root))
print(b.cached, len(b.cubin))
"""


def test_processes_compiling_one_kernel_at_once_run_nvcc_once(tmp_path):
    import os
    import subprocess
    import sys
    import time
    calls = tmp_path / "nvcc-calls"
    wrapper = tmp_path / "nvcc"
    # Counts the compiles and makes each last a second longer, so the other processes arrive while it runs.
    wrapper.write_text(f'#!/bin/sh\ncase " $* " in *" -cubin "*) echo $$ >> {calls}; sleep 1;; esac\n'
                       f'exec {codegen.nvcc_path()} "$@"\n')
    wrapper.chmod(0o755)
    go = tmp_path / "go"
    env = {**os.environ, "NVCC": str(wrapper)}
    procs = [subprocess.Popen([sys.executable, "-c", _CHILD, str(tmp_path / "cache"), str(tmp_path / f"ready{i}"),
                               str(go)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(3)]
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"ready{i}").exists() for i in range(3)) and time.monotonic() < deadline:
        time.sleep(0.01)
    go.touch()
    results = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [err for _, err in results]
    cached = sorted(out.split()[0] for out, _ in results)
    assert cached == ["False", "True", "True"]
    assert len({out.split()[1] for out, _ in results}) == 1
    assert len(calls.read_text().split()) == 1


def test_threads_compiling_one_kernel_at_once_run_nvcc_once(tmp_path):
    from concurrent.futures import ThreadPoolExecutor
    cache = Cache(tmp_path)
    src = 'extern "C" __global__ void k(float* y) { y[threadIdx.x] = 4.f; }'
    with ThreadPoolExecutor(4) as pool:
        binaries = list(pool.map(lambda _: codegen.compile_source(src, cache=cache), range(4)))
    assert sorted(b.cached for b in binaries) == [False, True, True, True]
    assert len({b.cubin for b in binaries}) == 1


def test_compile_into_a_cache_that_became_a_file_names_the_path(tmp_path):
    from tuner.cache import CacheError
    cache = Cache(tmp_path / "cache")
    cache.root.write_text("")
    src = 'extern "C" __global__ void k(float* y) { y[threadIdx.x] = 5.f; }'
    with pytest.raises(CacheError) as info:
        codegen.compile_source(src, cache=cache)
    text = str(info.value)
    assert text.startswith(f"cannot write lock file {cache.root / 'lock' / 'cubin'}")
    assert f"({cache.root} is not a directory)" in text and "TUNER_CACHE_DIR or --cache-dir" in text


def test_compile_failure_releases_the_lock(tmp_path):
    import fcntl
    import os
    cache = Cache(tmp_path)
    src = 'extern "C" __global__ void k() { undeclared_thing = 1; }'
    with pytest.raises(codegen.CompileError):
        codegen.compile_source(src, cache=cache)
    fd = os.open(cache.lock_path("cubin", codegen.binary_key(src, "sm_90")), os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises BlockingIOError if still held
    finally:
        os.close(fd)


def test_a_binary_this_process_has_is_not_read_from_its_cache_again_but_another_cache_builds_its_own(
        tmp_path, monkeypatch):
    src = 'extern "C" __global__ void k(float* y) { y[0] = 7.f; }'
    first = codegen.compile_source(src, cache=Cache(tmp_path / "a"))
    monkeypatch.setattr(Cache, "get", lambda *a, **k: pytest.fail("the cache's file was read again"))
    again = codegen.compile_source(src, cache=Cache(tmp_path / "a"))
    assert not first.cached and again.cached and again.cubin == first.cubin
    monkeypatch.undo()
    other = codegen.compile_source(src, cache=Cache(tmp_path / "b"))
    assert not other.cached and other.key == first.key


def test_render_renders_a_context_of_plain_values_once_and_any_other_each_time(monkeypatch):
    calls = []
    real = codegen.environment().get_template
    def counted(name, *a, **k):  # the template's own includes come through here too
        if name == "csr_vector.cu.j2":
            calls.append(name)
        return real(name, *a, **k)
    monkeypatch.setattr(codegen.environment(), "get_template", counted)
    ctx = dict(VAL="float", IDX="int", value_free=True, threads_per_row=2, block_size=64, kernel_name="memo_k",
               unroll=4)
    assert codegen.render("csr_vector.cu.j2", ctx) == codegen.render("csr_vector.cu.j2", dict(ctx))
    assert "#define TPR 2" in codegen.render("csr_vector.cu.j2", ctx) and len(calls) == 1
    codegen.render("csr_vector.cu.j2", {**ctx, "block_size": (64,)})  # a tuple: not memoised
    codegen.render("csr_vector.cu.j2", {**ctx, "block_size": (64,)})
    assert len(calls) == 3
