"""What a matrix source is: a generator spec (``rmat:23``, ``kron:PATH:K``) or a file; its short name for
tables; the folder of real matrices; and the file checks and edge-list syntax that both estimating a file's
size (:mod:`tuner.sizes`) and loading it (:mod:`tuner.loaders`) rely on.

A file that cannot be read raises :class:`MatrixFileError` naming the file and the problem, a missing one
FileNotFoundError.

>>> is_spec("rmat:23"), parse_spec("rmat:23"), display_name("/data/cnr-2000.npz")
(True, Spec(kind='rmat', args=(23, 16, 0)), 'cnr-2000')
"""

from __future__ import annotations

import errno
import gzip
import os
import re
import struct
import zipfile
import zlib
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from . import paths
from .matrix import MatrixError

__all__ = [
    "Spec",
    "MatrixFileError",
    "SPEC_FORMS",
    "parse_spec",
    "is_spec",
    "display_name",
    "default_data_dir",
    "data_dir_or_error",
    "real_matrices",
]

SPEC_FORMS = ("rmat:SCALE", "rmat:SCALE:EDGE_FACTOR", "rmat:SCALE:EDGE_FACTOR:SEED", "kron:PATH:K")
_SPEC_KINDS = ("rmat", "kron")
# From a comment mark to the end of its line; the newline stays, so that line numbers are kept.
_COMMENT = re.compile(rb"[#%][^\n]*")


class MatrixFileError(MatrixError):
    """A matrix file that cannot be read: truncated, garbled, empty, a folder, unreadable, or of
    unsupported contents. A ValueError (through :class:`~tuner.matrix.MatrixError`).

    Attributes:
        path: the file, as a string.
        problem: what is wrong with it.

    Example:
        >>> print(MatrixFileError("/data/g.npz", "the file is empty (0 bytes)"))
        /data/g.npz: the file is empty (0 bytes)
    """

    def __init__(self, path, problem: str):
        self.path = os.fspath(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")

    def __reduce__(self):
        return type(self), (self.path, self.problem)


@dataclass(frozen=True)
class Spec:
    """A parsed generator spec: ``kind`` is 'rmat' or 'kron'.

    ``args`` is ``(scale, edge_factor, seed)`` for rmat and ``(path, k)`` for kron.

    Example:
        >>> parse_spec("rmat:20")
        Spec(kind='rmat', args=(20, 16, 0))
    """

    kind: str
    args: tuple


def is_spec(text) -> bool:
    """Whether ``text`` is meant as a generator spec rather than a file name.

    Example:
        >>> is_spec("rmat:23"), is_spec("kron:graph.npz:3"), is_spec("graph.npz")
        (True, True, False)
    """
    return isinstance(text, str) and text.split(":", 1)[0] in _SPEC_KINDS


def parse_spec(text: str) -> Spec:
    """Parse ``rmat:SCALE[:EDGE_FACTOR[:SEED]]`` or ``kron:PATH:K``.

    Raises ValueError naming the spec and listing the accepted forms. Argument ranges are checked by
    the generators when the spec is loaded.

    Example:
        >>> parse_spec("rmat:8:4:3")
        Spec(kind='rmat', args=(8, 4, 3))
        >>> parse_spec("kron:data/wiki-Vote.npz:2")
        Spec(kind='kron', args=('data/wiki-Vote.npz', 2))
    """
    kind, _, rest = str(text).partition(":")
    try:
        if kind == "rmat":
            fields = rest.split(":")
            if not 1 <= len(fields) <= 3:
                raise ValueError
            values = [int(field) for field in fields] + [16, 0][len(fields) - 1 :]
            return Spec("rmat", tuple(values))
        if kind == "kron":
            path, _, k = rest.rpartition(":")
            if not path:
                raise ValueError
            return Spec("kron", (path, int(k)))
    except ValueError:
        pass
    raise ValueError(f"bad generator spec {text!r}; accepted forms: {', '.join(SPEC_FORMS)}")


def display_name(source) -> str:
    """Short name of a matrix source for tables: a file's stem, or the spec with its path shortened.

    Example:
        >>> display_name("/data/cnr-2000.npz"), display_name("kron:/data/cnr-2000.npz:3"), display_name("rmat:20")
        ('cnr-2000', 'kron:cnr-2000:3', 'rmat:20')
    """
    if is_spec(source):
        spec = parse_spec(source)
        return f"kron:{Path(spec.args[0]).stem}:{spec.args[1]}" if spec.kind == "kron" else str(source)
    return Path(os.fspath(source)).name.split(".")[0]


# --- the folder of real matrices -------------------------------------------------------------------


def default_data_dir() -> Path | None:
    """Folder of the real test matrices: ``$TUNER_DATA_DIR``, else ``<checkout>/../shared/data`` when
    running from a checkout (:func:`~tuner.paths.in_checkout`), else None (an
    installed package has no default folder).

    The path is returned even when it does not exist; :func:`data_dir_or_error` checks one.

    Example:
        >>> import os
        >>> from unittest import mock
        >>> with mock.patch.dict(os.environ, {"TUNER_DATA_DIR": "/srv/matrices"}):
        ...     default_data_dir()
        PosixPath('/srv/matrices')
    """
    env = os.environ.get("TUNER_DATA_DIR")
    if env:
        return Path(env).expanduser()
    if paths.in_checkout():
        return paths.CHECKOUT_DIR.parent / "shared" / "data"
    return None


def data_dir_or_error(data_dir=None) -> Path | None:
    """The folder of real matrices to use, checked: ``data_dir`` when given, else ``$TUNER_DATA_DIR``
    when set, each of which must be an existing folder; else the checkout's default folder (returned
    even when absent: it is optional) or None.

    Raises FileNotFoundError naming the folder (and where it came from) when a given one does not exist
    or is not a folder, so that a mistyped ``--data-dir`` is refused rather than read as "no matrices".

    Example:
        >>> import tempfile
        >>> folder = tempfile.gettempdir()
        >>> data_dir_or_error(folder) == Path(folder)
        True
        >>> data_dir_or_error("/no/such/folder")
        Traceback (most recent call last):
        ...
        FileNotFoundError: [Errno 2] data folder does not exist: '/no/such/folder'
    """
    if data_dir is not None:
        folder, origin = Path(os.fspath(data_dir)).expanduser(), "data folder"
    elif os.environ.get("TUNER_DATA_DIR"):
        folder, origin = default_data_dir(), "$TUNER_DATA_DIR names a folder that"
    else:
        return default_data_dir()
    if folder.is_dir():
        return folder
    if folder.exists():
        raise FileNotFoundError(errno.ENOTDIR, f"{origin} is not a folder", str(folder))
    raise FileNotFoundError(errno.ENOENT, f"{origin} does not exist", str(folder))


def real_matrices(data_dir=None) -> list[Path]:
    """The ``*.npz`` files of ``data_dir`` (default :func:`default_data_dir`), sorted by name; [] when
    the folder is absent or there is no default folder.

    Example:
        >>> real_matrices("/no/such/folder")
        []
    """
    folder = Path(data_dir) if data_dir is not None else default_data_dir()
    if folder is None or not folder.is_dir():
        return []
    return sorted(folder.glob("*.npz"), key=lambda path: path.name)


# --- file checks shared by estimating and loading --------------------------------------------------


def _checked_file(path: Path) -> Path:
    """``path`` if it is a regular file; FileNotFoundError if it is missing, else MatrixFileError."""
    if path.is_dir():
        raise MatrixFileError(path, "is a folder, not a matrix file")
    if not path.exists():
        raise FileNotFoundError(errno.ENOENT, "no such matrix file", str(path))
    if not path.is_file():
        raise MatrixFileError(path, "is not a regular file (a device, pipe or socket?)")
    # Opened once here, so that every format (some read by compiled code) reports a refusal alike.
    with _reading(path, "cannot be opened"), open(path, "rb"):
        pass
    return path


@contextmanager
def _reading(path: Path, what: str):
    """Turn the errors of reading ``path`` into MatrixFileError naming it and the problem; a missing
    file and memory errors pass unchanged."""
    try:
        yield
    except (MatrixFileError, FileNotFoundError, MemoryError):
        raise
    except PermissionError as exc:
        raise MatrixFileError(path, "cannot be read: permission denied") from exc
    except IsADirectoryError as exc:
        raise MatrixFileError(path, "is a folder, not a matrix file") from exc
    except (zipfile.BadZipFile, zipfile.LargeZipFile) as exc:
        problem = f"{what}: not a zip archive, or a truncated or corrupt one ({exc})"
        raise MatrixFileError(path, problem) from exc
    except EOFError as exc:
        raise MatrixFileError(path, f"{what}: the file ends early; it is truncated ({exc})") from exc
    except (zlib.error, gzip.BadGzipFile) as exc:
        raise MatrixFileError(path, f"{what}: its compressed data is corrupt ({exc})") from exc
    except (OSError, ValueError, KeyError, OverflowError, NotImplementedError, struct.error) as exc:
        raise MatrixFileError(path, f"{what} ({type(exc).__name__}: {exc})") from exc


def _empty_file_error(path: Path) -> MatrixFileError:
    return MatrixFileError(path, "the file is empty (0 bytes)")


# --- edge-list syntax shared by estimating and loading ---------------------------------------------


def _strip_comments(text: bytes) -> bytes:
    """Blank out comments (``#`` or ``%`` to the end of the line), keeping every newline."""
    # SNAP files carry their comments in a header: cut it line by line, then scan the body only if it
    # still holds a comment mark (the regular expression costs a few ns per byte).
    start = 0
    while text[start : start + 1024].lstrip(b" \t\r").startswith((b"#", b"%")):
        newline = text.find(b"\n", start)
        start = len(text) if newline < 0 else newline + 1
    body = text[start:]
    if b"#" in body or b"%" in body:
        body = _COMMENT.sub(b"", body)
    return b"\n" * text.count(b"\n", 0, start) + body
