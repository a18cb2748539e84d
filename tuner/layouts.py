"""Where a compile's layout comes from: built on the GPU (families whose builders run on CuPy, matrices large
enough to pay; a fraction of a second for 100M non-zeros, so never stored), else built on the host and kept
on disk, so that a second compile of the same matrix loads it instead of building it again (a relabelled
layout of a 100M-non-zero graph takes tens of seconds to build on the host; reading and checking it back
moves its bytes once).

An entry is a folder ``<cache>/layout/<key[:2]>/<key>/`` of ``.npy`` arrays and a ``launch.json`` manifest
with the launch geometry, scalars and the sha256 of every array (64 MiB slices hashed on all cores, as the
structure digest is). The key covers the structure digest, a digest of the values (a layout holds them), the
family, its parameters and the type traits, so a layout is only ever reused for the very same matrix and
kernel. Loading checks every array against its digest: a damaged entry is reported, removed and rebuilt.
Entries are written to a temporary folder and renamed into place, so readers see all of an entry or none.

A layout is stored only where building it took longer than reading it back would (``LOAD_FIXED_S`` plus
its bytes at ``LOAD_GBS``), by a thread of its own so that the compile that built it does not wait for the disk (the
process waits for it at exit; :func:`wait` waits now), and the folder is kept under a byte budget
(``$TUNER_LAYOUT_CACHE_BYTES``, default 32 GB), dropping the entries used longest ago.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from pathlib import Path

import numpy as np

from . import families
from .cache import Cache, make_key
from .formats import device_reorder
from .formats.xp import host
from .families.base import Launch, Specialization
from .matrix import CanonicalMatrix, _chunk_digests, structure_digest
from .memory import parse_bytes

LAYOUT_VERSION = "layout-1"
KIND = "layout"
LOAD_GBS = 1.0  # a conservative disk read plus the check: storing pays off when building is slower
LOAD_FIXED_S = 0.01  # opening the entry's files and its manifest, whatever their size
BUDGET_ENV = "TUNER_LAYOUT_CACHE_BYTES"
DEFAULT_BUDGET = 32 * 10**9
log = logging.getLogger("tuner.layouts")


def _digest(array: np.ndarray) -> str:
    return "".join(d.hex() for d in _chunk_digests([array]))


def layout_key(m: CanonicalMatrix, spec: Specialization, structure: str | None = None) -> str:
    """The entry of ``m``'s layout for ``spec``: structure, values, family, parameters and type traits.

    Example:
        >>> import scipy.sparse as sp
        >>> from tuner.matrix import canonicalize
        >>> m = canonicalize(sp.eye(4, format="csr") * 2.0)
        >>> spec = families.specializations(m, ["csr_vector"])[0]
        >>> layout_key(m, spec) == layout_key(canonicalize(sp.eye(4, format="csr") * 3.0), spec)
        False
    """
    values = f"value-free {m.pattern_value!r}" if m.value_free else _digest(m.data)
    return make_key(LAYOUT_VERSION, structure or structure_digest(m), values, spec.family,
                    json.dumps(families.params_dict(spec.params), sort_keys=True, default=str),
                    m.value_dtype.str, m.index_dtype.str, int(m.value_free))


def _folder(cache: Cache, key: str) -> Path:
    return cache.root / KIND / key[:2] / key


def _arrays(launch: Launch) -> dict[str, np.ndarray]:
    out = {f"arg{i}_{name}": a for i, (name, a) in enumerate(launch.arrays)}
    for name in ("x_gather", "y_gather"):
        if getattr(launch, name) is not None:
            out[name] = getattr(launch, name)
    return out


def store(cache: Cache, key: str, launch: Launch) -> Path | None:
    """Write ``launch`` as entry ``key``; None (logged) when the disk lacks room or another writer won."""
    final = _folder(cache, key)
    if final.exists():
        return final
    arrays = {name: host(a) for name, a in _arrays(launch).items()}
    nbytes = sum(a.nbytes for a in arrays.values())
    final.parent.mkdir(parents=True, exist_ok=True)
    if shutil.disk_usage(final.parent).free < 2 * nbytes:
        log.info("layout of %d bytes not cached: too little free disk under %s", nbytes, final.parent)
        return None
    tmp = final.parent / f".{key}.{os.getpid()}.{time.monotonic_ns()}"
    tmp.mkdir()
    try:
        for name, a in arrays.items():
            np.save(tmp / f"{name}.npy", np.ascontiguousarray(a), allow_pickle=False)
        manifest = {"version": LAYOUT_VERSION, "key": key, "grid": launch.grid, "block": launch.block,
                    "zero_y": launch.zero_y, "scalars": [[n, int(v)] for n, v in launch.scalars],
                    "arrays": [name for name, _ in launch.arrays], "bytes": nbytes,
                    "digests": {name: _digest(a) for name, a in arrays.items()}}
        (tmp / "launch.json").write_text(json.dumps(manifest))
        try:
            os.rename(tmp, final)
        except OSError:  # another process put the same entry first
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    evict(cache)
    return final


def load(cache: Cache, key: str) -> Launch | None:
    """Entry ``key`` as a :class:`~tuner.families.base.Launch` whose arrays map the files, or None when absent;
    an entry that fails its check is reported, removed and reported absent."""
    folder = _folder(cache, key)
    try:
        manifest = json.loads((folder / "launch.json").read_text())
    except (OSError, ValueError):
        return None
    try:
        if manifest.get("version") != LAYOUT_VERSION or manifest.get("key") != key:
            raise ValueError("written by another version")
        arrays = {name: np.load(folder / f"{name}.npy", mmap_mode="r", allow_pickle=False)
                  for name in manifest["digests"]}
        bad = [name for name, a in arrays.items() if _digest(a) != manifest["digests"][name]]
        if bad:
            raise ValueError(f"{', '.join(bad)} differ from their digests")
    except (OSError, ValueError, KeyError) as e:
        log.warning("cached layout %s is unusable (%s): removed, building it again", folder, e)
        shutil.rmtree(folder, ignore_errors=True)
        return None
    os.utime(folder / "launch.json")  # used now: eviction drops the entries used longest ago
    args = tuple((name, arrays[f"arg{i}_{name}"]) for i, name in enumerate(manifest["arrays"]))
    return Launch(arrays=args, scalars=tuple((n, int(v)) for n, v in manifest["scalars"]),
                  grid=int(manifest["grid"]), block=int(manifest["block"]), x_gather=arrays.get("x_gather"),
                  y_gather=arrays.get("y_gather"), zero_y=bool(manifest["zero_y"]))


def budget_bytes() -> int:
    """The layout folder's byte budget: ``$TUNER_LAYOUT_CACHE_BYTES`` (bytes or e.g. '8G'), else 32 GB."""
    text = os.environ.get(BUDGET_ENV)
    return DEFAULT_BUDGET if not text else parse_bytes(text)


def evict(cache: Cache, budget: int | None = None) -> list[Path]:
    """Remove the entries used longest ago until the rest fit ``budget`` bytes; the folders removed."""
    budget = budget_bytes() if budget is None else budget
    entries = []
    for manifest in (cache.root / KIND).glob("*/*/launch.json"):
        try:
            entries.append((manifest.stat().st_mtime, json.loads(manifest.read_text())["bytes"], manifest.parent))
        except (OSError, ValueError, KeyError):
            continue
    total, removed = sum(b for _, b, _ in entries), []
    for _, nbytes, folder in sorted(entries, key=lambda e: e[0]):
        if total <= budget:
            break
        shutil.rmtree(folder, ignore_errors=True)
        total -= nbytes
        removed.append(folder)
    return removed


_writers: list[threading.Thread] = []


def wait() -> None:
    """Return once every layout being written has been written."""
    while _writers:
        _writers.pop().join()


def launch_for(m: CanonicalMatrix, spec: Specialization, cache: Cache, structure: str | None = None
               ) -> tuple[Launch, str]:
    """``m``'s layout for ``spec``: built on the GPU where it can be (:func:`on_device`: faster than reading
    it back from disk, so never stored), else loaded from ``cache`` or built on the host (and written there
    in the background when building took longer than loading would); with 'device', 'loaded', 'built' or
    'stored'.

    Example:
        >>> import scipy.sparse as sp, tempfile
        >>> from tuner.matrix import canonicalize
        >>> m = canonicalize(sp.random(300, 300, density=0.05, format="csr", random_state=0))
        >>> spec = families.specializations(m, ["csr_vector"])[0]
        >>> launch, how = launch_for(m, spec, Cache(tempfile.mkdtemp())); how   # built in far under a second
        'built'
    """
    launch = _device_build(m, spec)
    if launch is not None:
        return launch, "device"
    key = layout_key(m, spec, structure)
    hit = load(cache, key)
    if hit is not None:
        return hit, "loaded"
    t0 = time.perf_counter()
    launch = families.get(spec.family).launch(m, spec.params)
    build_seconds = time.perf_counter() - t0
    if build_seconds > LOAD_FIXED_S + launch.nbytes / (LOAD_GBS * 1e9) and launch.nbytes <= budget_bytes():
        writer = threading.Thread(target=_store_logged, args=(cache, key, launch), name=f"layout-{key[:8]}")
        writer.start()
        _writers.append(writer)
        return launch, "stored"
    return launch, "built"


def on_device(m: CanonicalMatrix, spec: Specialization) -> bool:
    """Whether ``m``'s layout for ``spec`` is built on the GPU: the family's builders run on CuPy
    (:attr:`~tuner.families.base.Family.device_launch`), and the matrix is large enough and its work arrays
    fit the free device memory (:func:`~tuner.formats.device_reorder.usable`; a build that runs out of memory
    all the same falls back to the host, :func:`build`).

    Example:
        >>> import scipy.sparse as sp
        >>> from tuner.matrix import canonicalize
        >>> m = canonicalize(sp.random(30, 30, density=0.1, format="csr", random_state=0))
        >>> on_device(m, families.specializations(m, ["tile_coo"])[0])   # far too small to pay
        False
    """
    family = families.get(spec.family)
    if family.device_launch is None:
        return False
    need = family.device_bytes(m) if family.device_bytes is not None else device_reorder.WORK_BYTES_PER_ENTRY * m.nnz
    return device_reorder.usable(m.n_rows, m.n_cols, m.nnz, need)


def build(m: CanonicalMatrix, spec: Specialization) -> tuple[Launch, str]:
    """``m``'s layout for ``spec`` built where :func:`launch_for` builds it, nothing loaded or stored: with
    'device' or 'built' (the host)."""
    launch = _device_build(m, spec)
    if launch is not None:
        return launch, "device"
    return families.get(spec.family).launch(m, spec.params), "built"


def _device_build(m: CanonicalMatrix, spec: Specialization) -> Launch | None:
    """The layout built on the GPU (its work finished), or None where it is not built there (:func:`on_device`)
    or the device ran out of memory (logged)."""
    if not on_device(m, spec):
        return None
    try:
        launch = families.get(spec.family).device_launch(m, spec.params)
        device_reorder.finish()  # this thread's stream: a caller's products queued elsewhere are not waited for
        return launch
    except MemoryError as e:  # CuPy's OutOfMemoryError is one
        log.warning("building the %s layout on the GPU ran out of memory (%s): building it on the host",
                    spec.family, e)
        return None
    finally:
        device_reorder.release()


def _store_logged(cache: Cache, key: str, launch: Launch) -> None:
    try:
        store(cache, key, launch)
    except Exception as e:  # noqa: BLE001 - a layout not kept costs a rebuild, never the result
        log.warning("layout %s not cached: %s", key[:12], e)
