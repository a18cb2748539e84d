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
