"""Render Jinja2 CUDA templates and compile them with nvcc into cached cubins.

The binary cache key is sha256 over the rendered source, the nvcc version, the options and the target
architecture (as Triton and PyCUDA do), so a changed template, compiler or flag never reuses a stale cubin.
A compile holds the cache's lock of its key while it checks the cache again, runs nvcc and puts the cubin,
so processes and threads compiling the same kernel at once run nvcc once: the others wait and read it.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import jinja2

from . import paths
from .cache import Cache, make_key

DEFAULT_ARCH = "sm_90"
NVCC_OPTIONS = ("-O3", "-lineinfo")
LIBRARY_OPTIONS = ("-O3", "-Xcompiler", "-fPIC")
# nvcc's flags of each kind of output: a cubin the driver loads, or a shared library Python loads (its
# CUDA runtime linked statically, so that nothing beyond the driver is needed where it runs).
OUTPUTS = {"cubin": ("-cubin",), "library": ("-shared", "-cudart=static")}


class CompileError(RuntimeError):
    """nvcc rejected a rendered kernel; the message holds nvcc's log and where the source was written."""


class ToolchainError(RuntimeError):
    """nvcc is missing or unusable."""


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    """The Jinja2 environment over templates/ (StrictUndefined: a missing variable is an error).

    Example:
        >>> "csr_vector.cu.j2" in environment().list_templates()
        True
    """
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(paths.templates_dir())),
                              undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                              keep_trailing_newline=True)


def render(template: str, context: dict) -> str:
    """Render ``templates/<template>`` with ``context``, once per process for a context of plain values
    (a quarter of a millisecond each: a small graph's setup renders several kernels it rendered before).

    Example:
        >>> src = render("csr_vector.cu.j2", dict(VAL="float", IDX="int", value_free=False,
        ...              threads_per_row=4, block_size=128, kernel_name="k", unroll=4))
        >>> "extern \\"C\\" __global__" in src
        True
    """
    key = (template, tuple(sorted(context.items())))
    if not all(isinstance(v, PLAIN) for _, v in key[1]):  # e.g. arrays, whose repr and hash mislead
        return environment().get_template(template).render(**context)
    with _memo_lock:
        source = _rendered.get(key)
    if source is None:
        source = environment().get_template(template).render(**context)
        with _memo_lock:
            _remember(_rendered, key, source)
    return source


PLAIN = (str, int, float, bool, type(None))  # the context values render() memoises on
MEMO_ENTRIES = 256  # sources and binaries a process keeps (render, compile_source; 30-80 KB a cubin), oldest out first
_rendered: dict = {}
_binaries: dict = {}
_memo_lock = threading.Lock()


def _remember(memo: dict, key, value) -> None:
    if len(memo) >= MEMO_ENTRIES:
        memo.pop(next(iter(memo)))
    memo[key] = value


@lru_cache(maxsize=1)
def nvcc_path() -> str:
    """Path of nvcc: ``$NVCC``, then PATH, then ``$CUDA_HOME/bin``, then /usr/local/cuda/bin (found once).

    Example:
        >>> os.access(nvcc_path(), os.X_OK)
        True
    """
    candidates = [os.environ.get("NVCC"), shutil.which("nvcc")]
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            candidates.append(str(Path(home) / "bin" / "nvcc"))
    for c in candidates:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return c
    raise ToolchainError("nvcc not found: put the CUDA toolkit's bin/ on PATH or set NVCC or CUDA_HOME")


@lru_cache(maxsize=1)
def nvcc_version() -> str:
    """nvcc's version, e.g. 'V13.0.88' (part of every binary cache key).

    Example:
        >>> nvcc_version().startswith("V")
        True
    """
    out = subprocess.run([nvcc_path(), "--version"], capture_output=True, text=True, check=True).stdout
    m = re.search(r"V(\d+\.\d+\.\d+)", out)
    return m.group(0) if m else out.strip().splitlines()[-1]


def arch_from_capability(major: int, minor: int) -> str:
    """'sm_XY' for a compute capability.

    Example:
        >>> arch_from_capability(9, 0)
        'sm_90'
    """
    return f"sm_{major}{minor}"


@dataclass(frozen=True)
class Binary:
    """A compiled kernel module.

    Attributes:
        key: binary cache key (sha256 of source, nvcc version, options, arch).
        cubin: the module's bytes, loadable by the CUDA driver.
        arch: target architecture, e.g. 'sm_90'.
        cached: True when it came from the cache without running nvcc.
    """

    key: str
    cubin: bytes
    arch: str
    cached: bool


def binary_key(source: str, arch: str, options: tuple[str, ...] = NVCC_OPTIONS) -> str:
    """The binary cache key of ``source`` compiled for ``arch`` with ``options`` by this nvcc.

    Example:
        >>> binary_key("//", "sm_90") != binary_key("//", "sm_80")
        True
    """
    return make_key("cubin", source, nvcc_version(), " ".join(options), arch)


def compile_source(source: str, arch: str = DEFAULT_ARCH, options: tuple[str, ...] = NVCC_OPTIONS,
                   cache: Cache | None = None, kind: str = "cubin") -> Binary:
    """Compile CUDA ``source`` to a cubin for ``arch``, through the binary cache.

    nvcc runs under the cache's lock of the binary key, so concurrent compiles of one source, in other
    processes or threads, run it once. The source is kept as ``<cache>/src/<key>.cu`` for nvcc's messages.
    Raises ``CompileError`` when nvcc fails, ``ToolchainError`` when it is missing, ``CacheError`` when the
    cache cannot be written. ``kind`` 'library' builds a shared library instead (see :func:`compile_library`).

    Example:
        >>> import tempfile
        >>> cache = Cache(tempfile.mkdtemp())
        >>> b = compile_source('extern "C" __global__ void k(float* y) { y[0] = 1.f; }', cache=cache)
        >>> b.arch, len(b.cubin) > 0, b.cached
        ('sm_90', True, False)
        >>> compile_source('extern "C" __global__ void k(float* y) { y[0] = 1.f; }', cache=cache).cached
        True
    """
    cache = cache or Cache()
    if kind not in OUTPUTS:
        raise ValueError(f"kind must be one of {sorted(OUTPUTS)}, got {kind!r}")
    key = binary_key(source, arch, options)
    # A binary this process read or built from this cache before: its bytes are fixed by the key, and reading
    # the cache's file again costs a small graph's setup a few tenths of a millisecond a kernel.
    memo_key = (str(cache.root), kind, key)
    with _memo_lock:
        known = _binaries.get(memo_key)
    if known is not None:
        return known
    body = cache.get(kind, key)
    if body is not None:
        return _remembered(memo_key, Binary(key=key, cubin=body, arch=arch, cached=True))
    with cache.lock(kind, key):
        body = cache.get(kind, key)  # put by whoever held the lock before us
        if body is not None:
            return _remembered(memo_key, Binary(key=key, cubin=body, arch=arch, cached=True))
        src_path = cache.write(cache.root / "src" / f"{key}.cu", source.encode())
        with tempfile.TemporaryDirectory(prefix="tuner-nvcc-") as tmp:
            out = Path(tmp) / f"kernel.{kind}"
            cmd = [nvcc_path(), *OUTPUTS[kind], f"-arch={arch}", *options, "-o", str(out), str(src_path)]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise CompileError(f"nvcc failed (exit {proc.returncode}) on {src_path}\n"
                                   f"command: {' '.join(cmd)}\n{proc.stderr}{proc.stdout}")
            cubin = out.read_bytes()
        cache.put(kind, key, cubin, meta={"arch": arch, "nvcc": nvcc_version(), "options": list(options)})
    _remembered(memo_key, Binary(key=key, cubin=cubin, arch=arch, cached=True))
    return Binary(key=key, cubin=cubin, arch=arch, cached=False)


def _remembered(memo_key, binary: Binary) -> Binary:
    with _memo_lock:
        _remember(_binaries, memo_key, binary)
    return binary


def compile_library(source: str, arch: str = DEFAULT_ARCH, cache: Cache | None = None) -> Path:
    """Compile CUDA ``source`` with host code (e.g. CUB's device-wide algorithms, which are launched from the
    host) into a shared library through the binary cache; returns the path of a loadable copy,
    ``<cache>/lib/<key>.so`` (the cache entry itself carries a header, so the loader needs this copy).

    Example:
        >>> import tempfile
        >>> path = compile_library('extern "C" int answer() { return 42; }', cache=Cache(tempfile.mkdtemp()))
        >>> import ctypes; ctypes.CDLL(str(path)).answer()
        42
    """
    cache = cache or Cache()
    binary = compile_source(source, arch, LIBRARY_OPTIONS, cache, kind="library")
    path = cache.root / "lib" / f"{binary.key}.so"
    if not path.is_file() or path.stat().st_size != len(binary.cubin):
        cache.write(path, binary.cubin)
    return path


def load_binary(key: str, arch: str, cache: Cache | None = None) -> Binary | None:
    """A cached binary by key, without running nvcc; None when absent or corrupt.

    Example:
        >>> import tempfile
        >>> cache = Cache(tempfile.mkdtemp())
        >>> _ = cache.put("cubin", "ab" * 32, b"\\x7fELF...")
        >>> load_binary("ab" * 32, "sm_90", cache).cubin, load_binary("cd" * 32, "sm_90", cache)
        (b'\\x7fELF...', None)
    """
    body = (cache or Cache()).get("cubin", key)
    return None if body is None else Binary(key=key, cubin=body, arch=arch, cached=True)


def compile_many(sources: list[str], arch: str = DEFAULT_ARCH, cache: Cache | None = None,
                 workers: int | None = None) -> list[Binary]:
    """Compile several sources in parallel (nvcc runs are independent processes); equal sources once.

    Example:
        >>> import tempfile
        >>> [b.arch for b in compile_many(['extern "C" __global__ void k() {}'], cache=Cache(tempfile.mkdtemp()))]
        ['sm_90']
    """
    cache = cache or Cache()
    unique = list(dict.fromkeys(sources))  # candidates differing only in layout share one kernel
    workers = workers or min(len(unique), os.cpu_count() or 1) or 1
    with ThreadPoolExecutor(max_workers=workers) as pool:
        built = dict(zip(unique, pool.map(lambda s: compile_source(s, arch, cache=cache), unique)))
    return [built[s] for s in sources]
