"""Matrix sources: files (.npz, Matrix Market, SNAP edge lists) and generator specs (``rmat:23``).

Every command-line matrix argument goes through :func:`load`; it always returns a
``scipy.sparse.csr_matrix`` with sorted indices and no duplicates. Before building or reading anything
large, :func:`load` estimates the peak host memory from headers only (:func:`estimate`) and refuses with
:class:`~tuner.memory.InsufficientMemoryError` when it cannot fit; a file it cannot read raises
:class:`MatrixFileError` naming the file and the problem, a missing one FileNotFoundError.

>>> A = load("rmat:10:4")
>>> A.shape, A.dtype
((1024, 1024), dtype('float32'))
>>> estimate("rmat:25").nnz                 # drawn edges, without drawing them
536870912
"""

from __future__ import annotations

import errno
import gzip
import os
import re
import struct
import warnings
import zipfile
import zlib
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.io
import scipy.sparse as sp

from .generators import (
    _csr_from_canonical,
    _index_dtype,
    _pattern_csr,
    _thread_count,
    kronecker,
    kronecker_size,
    pattern_csr_bytes_per_edge,
    pattern_csr_bytes_per_row,
    per_edge_text,
    rmat,
    rmat_size,
)
from .matrix import MatrixError
from .memory import InsufficientMemoryError, available_bytes, check_fits, human_bytes, human_count

__all__ = [
    "Spec",
    "SourceSize",
    "MatrixFileError",
    "load",
    "estimate",
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
# The start of a line that holds a token (an edge, once comments are blanked out).
_TOKEN_LINE = re.compile(rb"^[ \t\r,]*[^ \t\r\n,]", re.MULTILINE)

# --- peak host memory of reading files (measured as VmHWM growth; see estimate) ----------------------
# Edge lists: the shortest edge line is "0 1\n", so a file of S bytes holds at most (S + 1) // 4 edges.
_MIN_EDGE_LINE_BYTES = 4
# Bytes of an edge list's head read to estimate its bytes per edge line.
_HEAD_BYTES = 1 << 16
# Copies of the text held at once while comments are stripped (text, body, substitution, joined).
_TEXT_COPIES = 4
# Finding the tokens (the peak of reading an edge list), per byte of text: the text, its blank mask and
# token-start mask (3 B); per line, the newline positions (8 B); per token, the token positions and
# their line numbers (16 B). Measured on 3.9M-edge lists: 313 MB with 2 columns (model: 313), 483 MB
# with 3 (model: 482).
_LAYOUT_BYTES_PER_BYTE = 3
_LAYOUT_BYTES_PER_LINE = 8
_LAYOUT_BYTES_PER_TOKEN = 16
# The token counting the columns of the head.
_TOKEN = re.compile(rb"[^ \t\r\n,]+")
# Weighted lists, building: int64 ids and float64 weights are held (24 B per edge); SciPy's COO ids
# (int32 or int64), CSR indices and float64 values are added.
_WEIGHTED_BUILD_BYTES_PER_EDGE = 2 * 8 + 8 + 8
# Matrix Market coordinate files, per stored entry (symmetric storage expanded): SciPy's COO (two
# index arrays and float64 values) alive with the CSR built from it (indices and values), plus the
# float64 copy of integer values. Measured: 28.8 B per entry with int32 indices (estimate 30).
_MTX_VALUE_BYTES = 8
_MTX_SLACK_BYTES = 2
# Matrix Market array files, per cell: the dense float64 array, its non-zero mask, the int64 coordinates
# of the non-zeros, the COO values and the CSR indices and values. Measured 40.8 B per cell (dense).
_MTX_DENSE_BYTES_PER_CELL = 8 + 1 + 16 + 8 + 4 + 8
# .npz members whose uncompressed size may be read whole to decide the format and shape.
_SMALL_MEMBER_BYTES = 4096
_NPZ_FORMATS = ("csr", "csc", "coo", "bsr", "dia")
# Files that reach the edge-list reader by their name but are not text.
_BINARY_SIGNATURES = (
    (b"\x1f\x8b", "gzip-compressed data (name it with a .gz ending)"),
    (b"PK\x03\x04", "a zip archive (a .npz file needs the .npz ending)"),
    (b"\x93NUMPY", "a NumPy .npy array"),
    (b"BZh", "bzip2-compressed data (decompress it first)"),
    (b"\xfd7zXZ", "xz-compressed data (decompress it first)"),
)


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
class SourceSize:
    """What loading a matrix source would give and cost, known from headers only (:func:`estimate`).

    Attributes:
        n_rows, n_cols: the shape; None for an edge list (its node ids are known only once parsed).
        nnz: stored non-zeros, an upper bound where the exact count needs the build: R-MAT's drawn edges
            (duplicates are dropped), a file's stored entries (duplicates are summed; symmetric Matrix
            Market storage counted twice), an edge list's size over 4 bytes (the shortest edge line).
        peak_bytes: estimated peak host memory of loading it.
        basis: how ``peak_bytes`` was estimated, for messages.

    Example:
        >>> size = estimate("rmat:20")
        >>> size.n_rows, size.nnz, size.peak_bytes > size.nnz * 20
        (1048576, 16777216, True)
    """

    n_rows: int | None
    n_cols: int | None
    nnz: int
    peak_bytes: int
    basis: str = ""


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


def load(source, *, dtype=None) -> sp.csr_matrix:
    """Load a matrix from a file or build it from a generator spec, as canonical CSR.

    Files, by extension (``.gz`` allowed where noted):

    - ``.npz``: ``scipy.sparse.save_npz`` output; values keep their stored float32/float64 type.
    - ``.mtx``, ``.mtx.gz``: Matrix Market, coordinate or array; pattern entries become 1.0,
      symmetric storage is expanded, duplicate entries are summed.
    - anything else (``.txt``, ``.tsv``, ``.edges``, ... and their ``.gz``): a SNAP edge list, one
      ``src dst`` or ``src dst weight`` per line, separated by blanks, tabs or commas; ``#`` or ``%``
      starts a comment that runs to the end of the line. Node ids are used as they are (square,
      n = largest id + 1). Without weights the result is a float32 pattern with duplicate edges
      stored once; with weights it is float64 with duplicate edges summed.

    Specs (a ``str`` only; a ``Path`` is always a file): ``rmat:SCALE``, ``rmat:SCALE:EDGE_FACTOR``,
    ``rmat:SCALE:EDGE_FACTOR:SEED`` and ``kron:PATH:K`` (``kronecker(load(PATH), None, K)``).

    Integer and boolean values become float64; ``dtype``, if given, converts the values at the end.

    Raises:
        FileNotFoundError: the file (or a spec's file) does not exist; the message names it.
        MatrixFileError: a file that cannot be read or holds no usable matrix; the message names the
            file and the problem.
        InsufficientMemoryError: the estimated peak host memory (:func:`estimate`) does not fit in
            :func:`tuner.memory.available_bytes`; raised before anything large is allocated.
        ValueError: a bad generator spec.

    Example:
        >>> A = load("rmat:8:4:3")
        >>> A.shape, A.dtype, A.has_sorted_indices
        ((256, 256), dtype('float32'), True)
    """
    size = estimate(source)
    check_fits(size.peak_bytes, os.fspath(source), size.basis)
    if is_spec(source):
        matrix = _load_spec(source)
    else:
        matrix = _load_file(Path(os.fspath(source)))
    if dtype is not None:
        matrix = matrix.astype(dtype, copy=False)
    return matrix


def default_data_dir() -> Path | None:
    """Folder of the real test matrices: ``$TUNER_DATA_DIR``, else ``<checkout>/../shared/data`` when
    running from a checkout (the package's parent folder holds ``pyproject.toml``), else None (an
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
    checkout = Path(__file__).resolve().parent.parent
    if (checkout / "pyproject.toml").is_file():
        return checkout.parent / "shared" / "data"
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


# --- estimates -------------------------------------------------------------------------------------


def estimate(source) -> SourceSize:
    """Shape, non-zeros and peak host memory of ``load(source)``, from headers only (milliseconds).

    Specs use :func:`~tuner.generators.rmat_size` and :func:`~tuner.generators.kronecker_size` (a kron
    spec reads its file's header). Files: a ``.npz`` from its members' npy headers and uncompressed
    sizes (so a zip bomb is refused before it is unpacked); a Matrix Market file from its header (an
    array-format file is dense: rows x columns cells); an edge list from its size, its first 64 kB
    giving the bytes per edge line (its node ids, and so its rows, are checked once parsed).

    Raises what :func:`load` raises for a missing or unreadable file or a bad spec, but never
    InsufficientMemoryError: the caller decides.

    Example:
        >>> size = estimate("rmat:25")
        >>> size.n_rows, size.nnz, round(size.peak_bytes / 1e9)
        (33554432, 536870912, 12)
        >>> estimate("rmat:40").peak_bytes > 10**14
        True
    """
    if is_spec(source):
        return _estimate_spec(source)
    return _estimate_file(_checked_file(Path(os.fspath(source))))


def _estimate_spec(text: str) -> SourceSize:
    spec = parse_spec(text)
    if spec.kind == "rmat":
        scale, edge_factor, _ = spec.args
        with _spec_errors(text):
            n, m, peak = rmat_size(scale, edge_factor, threads=_thread_count(None))
        return SourceSize(n, n, m, peak, per_edge_text(peak, m, "drawn edge"))
    path, k = spec.args
    graph = estimate(path)  # outside _spec_errors: a bad file is reported as such, not as a bad spec
    g_shape = None if graph.n_rows is None else (graph.n_rows, graph.n_cols)
    with _spec_errors(text):
        shape, nnz, peak = kronecker_size(g_shape, graph.nnz, k)
        if g_shape is None and not is_spec(path):
            # An edge list's nnz is a bound from its size; its likely edge count makes a fairer peak.
            peak = kronecker_size(None, _edge_list_counts(Path(path))[2], k)[2]
    # The file's matrix stays alive while its Kronecker scaling is built.
    peak += graph.peak_bytes
    rows, cols = shape if shape is not None else (None, None)
    return SourceSize(rows, cols, nnz, peak, per_edge_text(peak, nnz, "output edge"))


@contextmanager
def _spec_errors(text: str):
    try:
        yield
    except ValueError as exc:
        raise ValueError(f"bad generator spec {text!r}: {exc}") from exc


def _estimate_file(path: Path) -> SourceSize:
    name = path.name.lower()
    if name.endswith(".npz"):
        return _npz_size(path)
    if name.endswith((".mtx", ".mtx.gz")):
        return _mtx_size(path)
    return _edge_list_size(path)


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


# .npz: scipy.sparse.save_npz archives


def _npz_size(path: Path) -> SourceSize:
    what = "not a readable scipy.sparse .npz file"
    if path.stat().st_size == 0:
        raise _empty_file_error(path)
    with _reading(path, what), zipfile.ZipFile(path) as archive:
        members = {info.filename: info for info in archive.infolist()}
        fmt = _npz_format(path, archive, members)
        arrays = [info for name, info in members.items() if name.endswith(".npy")]
        headers = {info.filename: _npy_header(path, archive, info) for info in arrays}
        shape = _npz_shape(path, archive, members)
    data_shape, data_dtype = headers["data.npy"]
    if data_dtype.kind == "c":
        raise MatrixFileError(path, "complex values are not supported")
    nnz = int(np.prod(data_shape, dtype=object))
    unpacked = sum(info.file_size for info in members.values())
    # Formats other than CSR are converted: CSR indices and values plus an int64 row pointer.
    idx_bytes = np.dtype(_index_dtype(shape, nnz)).itemsize
    convert = 0 if fmt == "csr" else nnz * (idx_bytes + 8) + 8 * (shape[0] + 1)
    if data_dtype.kind not in "fc":  # integer and boolean values become float64
        convert += 8 * nnz
    basis = f"its arrays unpack to {human_bytes(unpacked)}"
    if convert:
        basis += f", and converting them to float CSR takes {human_bytes(convert)}"
    return SourceSize(shape[0], shape[1], nnz, unpacked + convert, basis)


def _npz_format(path: Path, archive: zipfile.ZipFile, members: dict) -> str:
    """The sparse format saved in ``format.npy``, after checking the members it needs are there."""
    if "format.npy" not in members:
        listed = ", ".join(sorted(name.removesuffix(".npy") for name in members)) or "none"
        raise MatrixFileError(
            path, f"not a scipy.sparse .npz file: it has no 'format' array (its arrays: {listed})"
        )
    value = _small_npy(path, archive, members["format.npy"])
    fmt = value.item()
    fmt = fmt.decode("ascii", "replace") if isinstance(fmt, bytes) else str(fmt)
    if fmt not in _NPZ_FORMATS:
        expected = ", ".join(_NPZ_FORMATS)
        raise MatrixFileError(path, f"unknown sparse format {fmt!r} (expected one of {expected})")
    needed = {"csr": ["indices", "indptr"], "csc": ["indices", "indptr"], "bsr": ["indices", "indptr"],
              "dia": ["offsets"], "coo": ["row", "col"] if "coords.npy" not in members else ["coords"]}
    missing = [key for key in ["data", "shape"] + needed[fmt] if f"{key}.npy" not in members]
    if missing:
        listed = ", ".join(map(repr, missing))
        raise MatrixFileError(path, f"not a complete {fmt} .npz file: it has no {listed} array")
    return fmt


def _npz_shape(path: Path, archive: zipfile.ZipFile, members: dict) -> tuple[int, int]:
    shape = _small_npy(path, archive, members["shape.npy"])
    if shape.shape != (2,) or shape.dtype.kind not in "iu" or (shape < 0).any():
        raise MatrixFileError(path, f"its 'shape' array is not two non-negative integers: {shape.tolist()!r}")
    return int(shape[0]), int(shape[1])


def _npy_header(path: Path, archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> tuple[tuple, np.dtype]:
    """Shape and dtype of an npy member, from its header; checks that it holds the data it declares."""
    with archive.open(info) as stream:
        try:
            version = np.lib.format.read_magic(stream)
            # Version 3.0 differs from 2.0 only in the header's encoding (UTF-8 for field names).
            if version == (1, 0):
                shape, _, dtype = np.lib.format.read_array_header_1_0(stream)
            else:
                shape, _, dtype = np.lib.format.read_array_header_2_0(stream)
        except ValueError as exc:
            raise MatrixFileError(path, f"member {info.filename} is not a NumPy array ({exc})") from exc
        header_bytes = stream.tell()
    if dtype.hasobject:
        raise MatrixFileError(path, f"member {info.filename} holds Python objects, not numbers")
    declared = int(np.prod(shape, dtype=object)) * dtype.itemsize
    if header_bytes + declared > info.file_size:
        raise MatrixFileError(
            path,
            f"member {info.filename} declares {human_bytes(declared)} of data but holds "
            f"{human_bytes(info.file_size - header_bytes)}; the file is corrupt",
        )
    return shape, dtype


def _small_npy(path: Path, archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> np.ndarray:
    if info.file_size > _SMALL_MEMBER_BYTES:
        size = human_bytes(info.file_size)
        raise MatrixFileError(path, f"member {info.filename} is {size}; expected a few bytes")
    with archive.open(info) as stream:
        return np.lib.format.read_array(stream, allow_pickle=False)


# Matrix Market


def _mtx_size(path: Path) -> SourceSize:
    if path.stat().st_size == 0:
        raise _empty_file_error(path)
    with _reading(path, "not a readable Matrix Market file"):
        rows, cols, entries, layout, field, symmetry = scipy.io.mminfo(path)
    if field == "complex":
        raise MatrixFileError(path, "complex values are not supported")
    if layout == "array":
        cells = rows * cols
        peak = _MTX_DENSE_BYTES_PER_CELL * cells
        per_cell = _MTX_DENSE_BYTES_PER_CELL
        basis = f"a dense {rows} x {cols} array: {per_cell} B per cell x {human_count(cells)} cells"
        return SourceSize(rows, cols, cells, peak, basis)
    stored = entries if symmetry == "general" else 2 * entries
    idx_bytes = np.dtype(_index_dtype((rows, cols), stored)).itemsize
    per_entry = 3 * idx_bytes + 2 * _MTX_VALUE_BYTES + _MTX_SLACK_BYTES + (8 if field == "integer" else 0)
    peak = per_entry * stored + 8 * (rows + 1)
    return SourceSize(rows, cols, stored, peak, per_edge_text(peak, stored, "stored entry"))


# SNAP edge lists


def _edge_list_size(path: Path) -> SourceSize:
    text_bytes, nnz_bound, edges, columns = _edge_list_counts(path)
    peak = _edge_list_peak(text_bytes, edges, columns)
    basis = f"{human_bytes(text_bytes)} of text, about {human_count(edges)} edges; rows counted once parsed"
    return SourceSize(None, None, nnz_bound, peak, basis)


def _edge_list_counts(path: Path) -> tuple[int, int, int, float]:
    """Bytes of text, most edges it can hold, likely edges, and columns of an edge list, from its size
    and its head's bytes and tokens per edge line."""
    with _reading(path, "not a readable edge list"):
        text_bytes = _text_bytes(path)
        head = _read_head(path)
    _check_text(path, head)
    nnz_bound = (text_bytes + 1) // _MIN_EDGE_LINE_BYTES
    stripped = _strip_comments(head)
    lines = len(_TOKEN_LINE.findall(stripped))
    if not lines:
        return text_bytes, nnz_bound, nnz_bound, 2.0
    edges = min(nnz_bound, text_bytes * lines // len(stripped))
    return text_bytes, nnz_bound, edges, len(_TOKEN.findall(stripped)) / lines


def _check_text(path: Path, head: bytes) -> None:
    """Refuse binary data in an edge list, naming the kind when its signature tells."""
    for signature, kind in _BINARY_SIGNATURES:
        if head.startswith(signature):
            raise MatrixFileError(path, f"holds {kind}, not a text edge list")
    if b"\0" in head:
        raise MatrixFileError(path, "holds binary data, not a text edge list")


def _edge_list_peak(text_bytes: int, edges: int, columns: float) -> int:
    """Peak of reading an edge list before its node ids are known: the larger of stripping comments,
    finding the tokens, and building the CSR of the edges (its rows are checked once parsed)."""
    stripping = _TEXT_COPIES * text_bytes
    per_line = _LAYOUT_BYTES_PER_LINE + _LAYOUT_BYTES_PER_TOKEN * columns
    tokenizing = _LAYOUT_BYTES_PER_BYTE * text_bytes + int(per_line * edges)
    held = 16 if columns < 2.5 else 24  # int64 ids, and float64 weights
    building = (held + max(pattern_csr_bytes_per_edge(None, edges), _WEIGHTED_BUILD_BYTES_PER_EDGE)) * edges
    return max(stripping, tokenizing, building)


def _text_bytes(path: Path) -> int:
    """Bytes of text in the file: its size, or for gzip its trailer's uncompressed size (modulo 4 GiB
    as gzip stores it; reading refuses text that would not fit in any case)."""
    size = path.stat().st_size
    if not path.name.lower().endswith(".gz") or size < 18:
        return size
    with open(path, "rb") as stream:
        stream.seek(-4, os.SEEK_END)
        return max(size, struct.unpack("<I", stream.read(4))[0])


def _read_head(path: Path) -> bytes:
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    with opener(path, "rb") as stream:
        head = stream.read(_HEAD_BYTES)
    # Cut a partial last line: only whole lines count.
    return head if len(head) < _HEAD_BYTES else head[: head.rfind(b"\n") + 1]


# --- specs -----------------------------------------------------------------------------------------


def _load_spec(text: str) -> sp.csr_matrix:
    spec = parse_spec(text)
    if spec.kind == "kron":
        path, k = spec.args
        graph = load(path)  # outside the try: a bad file is reported as such, not as a bad spec
    try:
        if spec.kind == "rmat":
            scale, edge_factor, seed = spec.args
            return rmat(scale, edge_factor, seed=seed)
        return kronecker(graph, None, k)
    except ValueError as exc:
        raise ValueError(f"bad generator spec {text!r}: {exc}") from exc


# --- files -----------------------------------------------------------------------------------------


def _load_file(path: Path) -> sp.csr_matrix:
    name = path.name.lower()
    if name.endswith(".npz"):
        matrix = _read_npz(path)
    elif name.endswith((".mtx", ".mtx.gz")):
        matrix = _read_mtx(path)
    else:
        return _read_edge_list(path)
    return _canonical(matrix, path)


def _read_npz(path: Path):
    with _reading(path, "not a readable scipy.sparse .npz file"):
        return sp.load_npz(path)


def _read_mtx(path: Path):
    with _reading(path, "not a readable Matrix Market file"):
        return scipy.io.mmread(path)


def _canonical(matrix, path: Path) -> sp.csr_matrix:
    """CSR with summed duplicates, sorted indices, float values and the smallest index dtype."""
    if matrix.ndim != 2:
        raise MatrixFileError(path, f"holds a {matrix.ndim}-D array, not a matrix")
    csr = sp.csr_matrix(matrix)
    if np.iscomplexobj(csr.data):
        raise MatrixFileError(path, "complex values are not supported")
    if csr.dtype not in (np.float32, np.float64):
        csr = csr.astype(np.float64)
    csr.sum_duplicates()
    idx_dtype = _index_dtype(csr.shape, csr.nnz)
    if csr.indices.dtype != idx_dtype:
        csr = _csr_from_canonical(
            csr.data, csr.indices.astype(idx_dtype), csr.indptr.astype(idx_dtype), csr.shape
        )
    return csr


def _read_edge_list(path: Path) -> sp.csr_matrix:
    src, dst, weights = _parse_edge_list(path)
    n = int(max(src.max(), dst.max())) + 1
    _check_edge_list_build(path, src.size, n, weighted=weights is not None)
    if weights is None:
        return _pattern_csr(src, dst, (n, n))
    return _canonical(sp.csr_matrix((weights, (src, dst)), shape=(n, n)), path)


def _parse_edge_list(path: Path):
    """Node ids (int64) and weights (float64, or None) of an edge list; the text and the per-line
    arrays are freed on return, before the CSR is built."""
    text = _strip_comments(_read_bytes(path)).replace(b",", b" ")
    ncols, row_lines = _edge_list_layout(text, path)
    table = _parse_numbers(text, ncols, path).reshape(-1, ncols)
    del text
    if ncols == 2:
        src, dst, weights = table[:, 0], table[:, 1], None
    else:
        src, dst = _integral_ids(table[:, 0], table[:, 1], path, row_lines)
        weights = np.ascontiguousarray(table[:, 2])  # so that the float64 table can go
    negative = np.flatnonzero((src < 0) | (dst < 0))
    if negative.size:
        raise MatrixFileError(path, f"line {row_lines[negative[0]] + 1}: node ids must be non-negative")
    return src, dst, weights


def _check_edge_list_build(path: Path, nnz: int, n: int, weighted: bool) -> None:
    """Refuse at once when the CSR of ``nnz`` edges over ``n = largest id + 1`` nodes cannot fit: one
    huge node id makes an index pointer of that many entries."""
    shape = (n, n)
    if weighted:
        per_edge, per_row = _WEIGHTED_BUILD_BYTES_PER_EDGE, 16
    else:
        per_edge, per_row = pattern_csr_bytes_per_edge(shape, nnz), pattern_csr_bytes_per_row(shape, nnz)
    how = (
        f"node ids up to {n - 1} make {human_count(n)} rows at {per_row} B each for the index pointer "
        f"and row counts, plus {per_edge} B per edge x {human_count(nnz)} edges"
    )
    hint = ""
    if n > 4 * nnz:
        hint = f"the ids are sparse ({nnz} edges, largest id {n - 1}): relabel them compactly as 0..N-1"
    check_fits(per_edge * nnz + per_row * (n + 1), os.fspath(path), how, hint=hint)


def _read_bytes(path: Path) -> bytes:
    with _reading(path, "not a readable edge list"):
        if not path.name.lower().endswith(".gz"):
            return path.read_bytes()
        return _read_gzip(path)


def _read_gzip(path: Path) -> bytes:
    """The decompressed text, refused once it outgrows what stripping its comments could hold (a gzip
    bomb, or a file over 4 GiB whose trailer size wrapped around)."""
    limit = available_bytes() // _TEXT_COPIES
    chunks, total = [], 0
    with gzip.open(path, "rb") as stream:
        while chunk := stream.read(1 << 24):
            total += len(chunk)
            if total > limit:
                raise InsufficientMemoryError(
                    os.fspath(path),
                    _TEXT_COPIES * total,
                    available_bytes(),
                    f"it decompresses to more than {human_bytes(total)} of text, held up to "
                    f"{_TEXT_COPIES} times while parsed",
                )
            chunks.append(chunk)
    return b"".join(chunks)


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


def _edge_list_layout(text: bytes, path: Path) -> tuple[int, np.ndarray]:
    """Columns per line (2 or 3, all lines alike) and the 0-based line number of every edge."""
    chars = np.frombuffer(text, dtype=np.uint8)
    blank = chars <= ord(" ")  # space, tab, CR, LF (commas were turned into spaces)
    token_start = ~blank
    token_start[1:] &= blank[:-1]
    line_of_token = np.searchsorted(np.flatnonzero(chars == ord("\n")), np.flatnonzero(token_start))
    if line_of_token.size == 0:
        raise MatrixFileError(path, "has no edges (the file is empty or holds only comments)")
    per_line = np.bincount(line_of_token)
    ncols = int(per_line[line_of_token[0]])
    if ncols not in (2, 3):
        raise MatrixFileError(
            path, f"line {line_of_token[0] + 1}: expected 'src dst' or 'src dst weight', got {ncols} columns"
        )
    bad = np.flatnonzero((per_line != 0) & (per_line != ncols))
    if bad.size:
        raise MatrixFileError(
            path, f"line {bad[0] + 1}: expected {ncols} columns like the first edge, got {per_line[bad[0]]}"
        )
    return ncols, line_of_token[::ncols]


def _parse_numbers(text: bytes, ncols: int, path: Path) -> np.ndarray:
    # np.fromstring parses blank-separated numbers in C, many times faster than np.loadtxt.
    dtype = np.int64 if ncols == 2 else np.float64
    try:
        return _fromstring(text, dtype)
    except ValueError:
        pass
    line = _first_unparsable_line(text, dtype)
    raise MatrixFileError(
        path,
        f"line {line}: cannot parse {_line_text(text, line)!r} as "
        f"{'integer node ids' if ncols == 2 else 'node ids and a weight'}",
    )


def _fromstring(text: bytes, dtype) -> np.ndarray:
    # NumPy 1.x only warns (and returns a truncated array) where NumPy 2 raises on unparsable text.
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        try:
            return np.fromstring(text, dtype=dtype, sep=" ")
        except DeprecationWarning as exc:
            raise ValueError(str(exc)) from None


def _first_unparsable_line(text: bytes, dtype) -> int:
    # Only reached on malformed input, so a per-line loop costs nothing in the common case.
    for number, line in enumerate(text.split(b"\n"), start=1):
        try:
            _fromstring(line, dtype)
        except ValueError:
            return number
    return 0


def _line_text(text: bytes, line: int) -> str:
    lines = text.split(b"\n")
    return lines[line - 1].decode(errors="replace").strip() if 0 < line <= len(lines) else ""


def _integral_ids(src, dst, path: Path, line_of_row: np.ndarray):
    """Node ids parsed as float64 (weighted lists) back to int64, rejecting fractions."""
    ids = np.stack([src, dst])
    bad = np.flatnonzero(((ids != np.floor(ids)) | (np.abs(ids) >= 2.0**53)).any(axis=0))
    if bad.size:
        raise MatrixFileError(path, f"line {line_of_row[bad[0]] + 1}: node ids must be integers")
    return src.astype(np.int64), dst.astype(np.int64)
