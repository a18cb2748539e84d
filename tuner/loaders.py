"""Loading matrix sources: files (.npz, Matrix Market, SNAP edge lists) and generator specs (``rmat:23``).

Every command-line matrix argument goes through :func:`load`; it always returns a
``scipy.sparse.csr_matrix`` with sorted indices and no duplicates. Before building or reading anything
large, :func:`load` estimates the peak host memory from headers only (:func:`~tuner.sizes.estimate`) and
refuses with :class:`~tuner.memory.InsufficientMemoryError` when it cannot fit; a file it cannot read raises
:class:`~tuner.sources.MatrixFileError` naming the file and the problem, a missing one FileNotFoundError.

What a source is (specs, names, the folder of real matrices) lives in :mod:`tuner.sources`, and its size
estimate in :mod:`tuner.sizes`; their public names are imported here too, so that ``tuner.loaders`` stays
the one place callers take matrix sources from.

>>> A = load("rmat:10:4")
>>> A.shape, A.dtype
((1024, 1024), dtype('float32'))
>>> estimate("rmat:25").nnz                 # drawn edges, without drawing them
536870912
"""

from __future__ import annotations

import gzip
import inspect
import os
import warnings
from pathlib import Path

import numpy as np
import scipy.io
import scipy.sparse as sp

from .generators import (
    _csr_from_canonical,
    _index_dtype,
    _pattern_csr,
    kronecker,
    pattern_csr_bytes_per_edge,
    pattern_csr_bytes_per_row,
    rmat,
)
from .memory import InsufficientMemoryError, available_bytes, check_fits, human_bytes, human_count
from .sizes import _TEXT_COPIES, _WEIGHTED_BUILD_BYTES_PER_EDGE, SourceSize, estimate
from .sources import (
    SPEC_FORMS,  # noqa: F401  (outside __all__, but callers import it from here)
    MatrixFileError,
    Spec,
    _reading,
    _strip_comments,
    data_dir_or_error,
    default_data_dir,
    display_name,
    is_spec,
    parse_spec,
    real_matrices,
)

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
        InsufficientMemoryError: the estimated peak host memory (:func:`~tuner.sizes.estimate`) does not
            fit in :func:`tuner.memory.available_bytes`; raised before anything large is allocated.
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


# SciPy releases that announce a new default return type take the type as a keyword; the result is
# converted to CSR either way, so asking keeps their deprecation warning away from users.
_MMREAD_KEYWORDS = {"spmatrix": True} if "spmatrix" in inspect.signature(scipy.io.mmread).parameters else {}


def _read_mtx(path: Path):
    with _reading(path, "not a readable Matrix Market file"):
        return scipy.io.mmread(path, **_MMREAD_KEYWORDS)


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
