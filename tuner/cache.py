"""On-disk cache of plans and compiled kernels, keyed by sha256, written atomically.

Each entry is one file: a JSON header line (format, key, size, sha256 of the body, metadata) followed by the
body. A writer puts the whole file under a unique temporary name in the same folder and ``os.replace``s it,
so readers see the old entry, the new one or none, never a mix, however many processes write at once. An
entry whose header does not parse, whose key is foreign, whose body does not match its checksum or that
cannot be read at all (a directory in its place, no permission, an I/O error) is reported once and treated as
absent, so the caller rebuilds and overwrites it. A write that fails raises ``CacheError`` naming the path,
the operating system's reason and the fix.

Files are created with mode 0o666 less the umask and folders with 0o777 less the umask, as any program's
files are, so a cache shared by a group stays readable by it.

Building an entry can be expensive (an nvcc run), so ``Cache.lock`` gives one lock file per key,
``<root>/lock/<kind>/<key[:2]>/<key>.lock``, held with ``flock``: a second process or thread asking for the
same key waits, then finds the entry the first one put.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import secrets
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Iterator

from . import paths

FORMAT = 1
FIX = "set TUNER_CACHE_DIR or --cache-dir to a writable folder"
log = logging.getLogger("tuner.cache")
_reported: set[str] = set()


class CacheError(OSError):
    """A cache file or folder cannot be written; the message names the path, the reason and the fix.

    ``path`` is the file or folder concerned and ``errno`` the operating system's error number, when known.

    Example:
        >>> import tempfile, pathlib
        >>> f = pathlib.Path(tempfile.mkdtemp()) / "f"; f.write_text("")
        0
        >>> try:
        ...     Cache(f)
        ... except CacheError as e:
        ...     str(e) == f"cache directory {f} is not a directory; {FIX}"
        True
    """

    def __init__(self, message: str, path: str | os.PathLike | None = None, errno: int | None = None):
        super().__init__(message)
        self.path = None if path is None else Path(path)
        if errno is not None:
            self.errno = errno

    def __str__(self) -> str:
        # OSError would print "[Errno n] strerror" once errno is set; the message already holds the reason.
        return self.args[0]

    def __reduce__(self):
        return type(self), (self.args[0], self.path, self.errno)


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


def _create_temporary(path: Path) -> tuple[Path, int]:
    # Not tempfile.mkstemp: it creates files 0o600, which would hide a shared cache's entries from the group.
    # os.open's 0o666 is filtered by the umask (and a default ACL) in the kernel, as for open(path, "w").
    for _ in range(100):
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
        try:
            return tmp, os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no unused temporary name", str(path))


def atomic_write(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and ``os.replace``.

    Missing folders are made. The file gets mode 0o666 less the umask. On failure the temporary file is
    removed and the error raised; an ``OSError`` that names no file is given ``path`` as its filename.

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "f"; atomic_write(p, b"x"); p.read_bytes()
        b'x'
    """
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp, fd = _create_temporary(path)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
        if isinstance(e, OSError) and e.filename is None and e.errno is not None:
            e.filename = str(path)  # a failed write or fsync (disk full) names no file by itself
        raise


def _not_a_directory(path: Path) -> Path | None:
    """The nearest of ``path`` and its parents that exists, when it is not a directory (else None)."""
    for p in (path, *path.parents):
        try:
            st = p.stat()
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError:
            return None
        return None if stat.S_ISDIR(st.st_mode) else p
    return None


def _write_error(path: Path, e: OSError, what: str = "cache file") -> CacheError:
    """A CacheError for a failed write of ``path``: the path, the OS reason, what is in the way, the fix."""
    reason = e.strerror or str(e)
    blocker = _not_a_directory(path.parent)
    if blocker is not None:
        reason += f" ({blocker} is not a directory)"
    elif path.is_dir():
        reason += f" ({path} is a directory)"
    elif e.filename and Path(e.filename) != path and not Path(e.filename).name.startswith(f".{path.name}."):
        reason += f" ({e.filename})"
    return CacheError(f"cannot write {what} {path}: {reason}; {FIX}", path, e.errno)


def _report_once(path: Path, why: str) -> None:
    if str(path) not in _reported:
        _reported.add(str(path))
        log.warning("cache entry %s is unusable (%s): rebuilding it", path, why)


class Cache:
    """A folder of cache entries grouped by kind ("plan", "cubin", ...).

    ``root`` defaults to ``paths.cache_dir()``. A root that exists and is not a directory (or lies under a
    file) raises ``CacheError`` at once; a missing one is made at the first write.

    Example:
        >>> import tempfile
        >>> c = Cache(tempfile.mkdtemp())
        >>> _ = c.put("plan", make_key("m"), b"{}", meta={"family": "csr_vector"})
        >>> c.get("plan", make_key("m"))
        b'{}'
    """

    def __init__(self, root: str | os.PathLike | None = None):
        self.root = Path(root) if root is not None else paths.cache_dir()
        blocker = _not_a_directory(self.root)
        if blocker == self.root:
            raise CacheError(f"cache directory {self.root} is not a directory; {FIX}", self.root, errno.ENOTDIR)
        if blocker is not None:
            raise CacheError(f"cache directory {self.root} cannot be made: {blocker} is not a directory; {FIX}",
                             self.root, errno.ENOTDIR)

    def path(self, kind: str, key: str) -> Path:
        """The file of entry ``key`` of ``kind``.

        Example:
            >>> import tempfile
            >>> c = Cache(tempfile.mkdtemp()); c.path("plan", "abcd").relative_to(c.root).as_posix()
            'plan/ab/abcd.entry'
        """
        return self.root / kind / key[:2] / f"{key}.entry"

    def write(self, path: str | os.PathLike, data: bytes) -> Path:
        """``atomic_write`` a file into the cache; a failure raises ``CacheError`` naming ``path``.

        Example:
            >>> import tempfile
            >>> c = Cache(tempfile.mkdtemp())
            >>> c.write(c.root / "src" / "k.cu", b"//").read_bytes()
            b'//'
        """
        path = Path(path)
        try:
            atomic_write(path, data)
        except OSError as e:
            raise _write_error(path, e) from e
        return path

    def put(self, kind: str, key: str, body: bytes, meta: dict | None = None) -> Path:
        """Store ``body`` (and ``meta`` in its header) as entry ``key`` of ``kind``; returns the entry's file.

        Raises ``CacheError`` naming the file when it cannot be written.

        Example:
            >>> import tempfile
            >>> Cache(tempfile.mkdtemp()).put("plan", make_key("m"), b"{}").name[-6:]
            '.entry'
        """
        header = {"format": FORMAT, "kind": kind, "key": key, "size": len(body),
                  "sha256": hashlib.sha256(body).hexdigest(), "meta": meta or {}}
        return self.write(self.path(kind, key), json.dumps(header, sort_keys=True).encode() + b"\n" + body)

    def get(self, kind: str, key: str) -> bytes | None:
        """Body of entry ``key`` of ``kind``, or None when absent or unusable (reported once).

        Example:
            >>> import tempfile
            >>> Cache(tempfile.mkdtemp()).get("plan", make_key("absent")) is None
            True
        """
        entry = self.get_entry(kind, key)
        return None if entry is None else entry[1]

    def get_entry(self, kind: str, key: str) -> tuple[dict, bytes] | None:
        """Header and body of a valid entry, or None when absent or unusable (reported once).

        Example:
            >>> import tempfile
            >>> c = Cache(tempfile.mkdtemp()); _ = c.put("plan", "ab12", b"x", meta={"n": 1})
            >>> header, body = c.get_entry("plan", "ab12"); header["meta"], body
            ({'n': 1}, b'x')
        """
        path = self.path(kind, key)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:  # a directory in its place, no permission, an I/O error: rebuild, the write says why
            _report_once(path, e.strerror or str(e))
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
        """Store ``payload`` as JSON under ``key``.

        Example:
            >>> import tempfile
            >>> c = Cache(tempfile.mkdtemp()); _ = c.put_json("plan", "ab12", {"a": 1}); c.get_json("plan", "ab12")
            {'a': 1}
        """
        return self.put(kind, key, json.dumps(payload, sort_keys=True).encode())

    def get_json(self, kind: str, key: str) -> dict | None:
        """The JSON payload of entry ``key``, or None when absent or unusable (reported once).

        Example:
            >>> import tempfile
            >>> Cache(tempfile.mkdtemp()).get_json("plan", "ab12") is None
            True
        """
        body = self.get(kind, key)
        if body is None:
            return None
        try:
            return json.loads(body)
        except ValueError:
            _report_once(self.path(kind, key), "body is not JSON")
            return None

    def lock_path(self, kind: str, key: str) -> Path:
        """The lock file of entry ``key`` of ``kind``.

        Example:
            >>> import tempfile
            >>> c = Cache(tempfile.mkdtemp()); c.lock_path("cubin", "abcd").relative_to(c.root).as_posix()
            'lock/cubin/ab/abcd.lock'
        """
        return self.root / "lock" / kind / key[:2] / f"{key}.lock"

    @contextlib.contextmanager
    def lock(self, kind: str, key: str) -> Iterator[Path]:
        """Hold the exclusive lock of entry ``key`` of ``kind`` while building it; yields the lock file.

        The lock is ``flock`` on a descriptor opened for this call, so it excludes other processes and
        other threads of this one alike, and the kernel drops it if the holder dies. Callers check the
        cache again once they hold it: whoever held it before may have put the entry. Lock files stay (removing
        one while another process waits on it would let a third lock a new file). A lock file that cannot be
        made raises ``CacheError``; a file system without ``flock`` is reported once and the work goes on
        unlocked (entries are still written atomically).

        Example:
            >>> import tempfile
            >>> c = Cache(tempfile.mkdtemp())
            >>> with c.lock("cubin", make_key("k")) as held:
            ...     held.name.endswith(".lock")
            True
        """
        path = self.lock_path(kind, key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # Read-only is enough for flock, and lets a group member lock a file another member made 0o644.
            fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o666)
        except OSError as e:
            raise _write_error(path, e, "lock file") from e
        try:
            _flock(fd, path, kind)
            yield path
        finally:
            os.close(fd)  # the last descriptor of the open file description: releases the lock


def _flock(fd: int, path: Path, kind: str) -> None:
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for %s: another process is building this %s", path, kind)
            fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError as e:
        where = f"flock {path.parents[2]}"  # <root>/lock: one report per cache, not per key
        if where not in _reported:
            _reported.add(where)
            log.warning("cannot lock %s (%s): building without the lock, work may be repeated", path,
                        e.strerror or e)


COMPILED_KINDS = ("cubin", "library")  # what nvcc made: the same for any matrix


@contextlib.contextmanager
def cold_plans(root: str | os.PathLike | None = None) -> Iterator[Path]:
    """A fresh cache folder that shares ``root``'s compiled binaries but holds no plan, layout or study: a
    new matrix on a machine that has compiled before (what the benches' times to a first result assume).
    Removed on exit; the binaries it links to stay, those compiled inside it too.

    Example:
        >>> import tempfile
        >>> warm = Cache(tempfile.mkdtemp())
        >>> _ = warm.put("cubin", make_key("k"), b"x"); _ = warm.put("plan", make_key("m"), b"{}")
        >>> with cold_plans(warm.root) as root:
        ...     _ = Cache(root).put("library", make_key("l"), b"y")
        ...     Cache(root).get("cubin", make_key("k")), Cache(root).get("plan", make_key("m"))
        (b'x', None)
        >>> warm.get("library", make_key("l"))
        b'y'
    """
    warm = Cache(root).root
    cold = Path(tempfile.mkdtemp(prefix="tuner-cold-"))
    try:
        for kind in COMPILED_KINDS:  # made where missing: what the cold compiles build stays for later ones
            (warm / kind).mkdir(parents=True, exist_ok=True)
            (cold / kind).symlink_to(warm / kind, target_is_directory=True)
        yield cold
    finally:
        shutil.rmtree(cold, ignore_errors=True)  # the links, not what they point to
