"""Header-only size estimates of matrix sources: the shape, non-zeros and peak host memory that
:func:`tuner.loaders.load` would give and need, from a generator spec's arguments or a file's headers,
without building or reading anything large (:func:`estimate`); and the measured memory costs of reading
each file format that these estimates rest on.

>>> estimate("rmat:25").nnz                 # drawn edges, without drawing them
536870912
"""

from __future__ import annotations

import gzip
import os
import re
import struct
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.io

from .generators import (
    _index_dtype,
    _thread_count,
    kronecker_size,
    pattern_csr_bytes_per_edge,
    per_edge_text,
    rmat_size,
)
from .memory import human_bytes, human_count
from .sources import (
    MatrixFileError,
    _checked_file,
    _empty_file_error,
    _reading,
    _strip_comments,
    is_spec,
    parse_spec,
)

__all__ = ["SourceSize", "estimate"]

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


def estimate(source) -> SourceSize:
    """Shape, non-zeros and peak host memory of loading ``source`` (:func:`~tuner.loaders.load`), from
    headers only (milliseconds).

    Specs use :func:`~tuner.generators.rmat_size` and :func:`~tuner.generators.kronecker_size` (a kron
    spec reads its file's header). Files: a ``.npz`` from its members' npy headers and uncompressed
    sizes (so a zip bomb is refused before it is unpacked); a Matrix Market file from its header (an
    array-format file is dense: rows x columns cells); an edge list from its size, its first 64 kB
    giving the bytes per edge line (its node ids, and so its rows, are checked once parsed).

    Raises what :func:`~tuner.loaders.load` raises for a missing or unreadable file or a bad spec, but
    never InsufficientMemoryError: the caller decides.

    Example:
        >>> size = estimate("rmat:25")
        >>> size.n_rows, size.nnz, 11e9 < size.peak_bytes < 15e9   # the per-thread part varies with CPUs
        (33554432, 536870912, True)
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
