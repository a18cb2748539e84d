"""On-disk cache of plans and compiled kernels, keyed by sha256, written atomically.

Each entry is one file: a JSON header line (format, key, size, sha256 of the body, metadata) followed by the
body. A writer puts the whole file under a unique temporary name in the same folder and ``os.replace``s it,
so readers see the old entry, the new one or none, never a mix, however many processes write at once. An
entry whose header does not parse, whose key is foreign or whose body does not match its checksum is
reported once and treated as absent, so the caller rebuilds and overwrites it.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path

from . import paths

FORMAT = 1
log = logging.getLogger("tuner.cache")
_reported: set[str] = set()


def make_key(*parts) -> str:
    """sha256 over an explicit list of parts (strings, numbers, bytes), order significant.

    Example:
        >>> make_key("a", 1) == make_key("a", 1) != make_key("a", 2)
        True
    """
    h = hashlib.sha256()
    for part in parts:
        raw = part if isinstance(part, bytes) else str(part).encode()
        h.update(len(raw).to_bytes(8, "little"))
        h.update(raw)
    return h.hexdigest()


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and ``os.replace``.

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "f"; atomic_write(p, b"x"); p.read_bytes()
        b'x'
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _report_once(path: Path, why: str) -> None:
    if str(path) not in _reported:
        _reported.add(str(path))
        log.warning("cache entry %s is unusable (%s): rebuilding it", path, why)


class Cache:
    """A folder of cache entries grouped by kind ("plan", "cubin", ...).

    Example:
        >>> import tempfile
        >>> c = Cache(tempfile.mkdtemp())
        >>> _ = c.put("plan", make_key("m"), b"{}", meta={"family": "csr_vector"})
        >>> c.get("plan", make_key("m"))
        b'{}'
    """

    def __init__(self, root: str | os.PathLike | None = None):
        self.root = Path(root) if root is not None else paths.cache_dir()

    def path(self, kind: str, key: str) -> Path:
        return self.root / kind / key[:2] / f"{key}.entry"

    def put(self, kind: str, key: str, body: bytes, meta: dict | None = None) -> Path:
        header = {"format": FORMAT, "kind": kind, "key": key, "size": len(body),
                  "sha256": hashlib.sha256(body).hexdigest(), "meta": meta or {}}
        path = self.path(kind, key)
        atomic_write(path, json.dumps(header, sort_keys=True).encode() + b"\n" + body)
        return path

    def get(self, kind: str, key: str) -> bytes | None:
        entry = self.get_entry(kind, key)
        return None if entry is None else entry[1]

    def get_entry(self, kind: str, key: str) -> tuple[dict, bytes] | None:
        """Header and body of a valid entry, or None when absent or unusable (reported once)."""
        path = self.path(kind, key)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        line, sep, body = raw.partition(b"\n")
        try:
            header = json.loads(line) if sep else None
        except (ValueError, UnicodeDecodeError):
            header = None
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            _report_once(path, "unreadable header")
            return None
        if header.get("key") != key or header.get("kind") != kind:
            _report_once(path, "entry belongs to another key")
            return None
        if header.get("size") != len(body) or header.get("sha256") != hashlib.sha256(body).hexdigest():
            _report_once(path, "checksum mismatch")
            return None
        return header, body

    def put_json(self, kind: str, key: str, payload: dict) -> Path:
        return self.put(kind, key, json.dumps(payload, sort_keys=True).encode())

    def get_json(self, kind: str, key: str) -> dict | None:
        body = self.get(kind, key)
        if body is None:
            return None
        try:
            return json.loads(body)
        except ValueError:
            _report_once(self.path(kind, key), "body is not JSON")
            return None
