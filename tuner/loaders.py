"""Matrix sources: files (.npz, Matrix Market, SNAP edge lists) and generator specs (``rmat:23``).

Every command-line matrix argument goes through :func:`load`; it always returns a
``scipy.sparse.csr_matrix`` with sorted indices and no duplicates.

>>> A = load("rmat:10:4")
>>> A.shape, A.dtype
((1024, 1024), dtype('float32'))
"""

from __future__ import annotations

import errno
import gzip
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.io
import scipy.sparse as sp

from .generators import _csr_from_canonical, _index_dtype, _pattern_csr, kronecker, rmat

__all__ = ["Spec", "load", "parse_spec", "is_spec", "display_name", "default_data_dir", "real_matrices"]

SPEC_FORMS = ("rmat:SCALE", "rmat:SCALE:EDGE_FACTOR", "rmat:SCALE:EDGE_FACTOR:SEED", "kron:PATH:K")
_SPEC_KINDS = ("rmat", "kron")
# From a comment mark to the end of its line; the newline stays, so that line numbers are kept.
_COMMENT = re.compile(rb"[#%][^\n]*")


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

    Example:
        >>> A = load("rmat:8:4:3")
        >>> A.shape, A.dtype, A.has_sorted_indices
        ((256, 256), dtype('float32'), True)
    """
    if is_spec(source):
        matrix = _load_spec(source)
    else:
        matrix = _load_file(Path(os.fspath(source)))
    if dtype is not None:
        matrix = matrix.astype(dtype, copy=False)
    return matrix


def default_data_dir() -> Path:
    """Folder of the real test matrices: ``$TUNER_DATA_DIR``, else ``<checkout>/../shared/data``.

    The path is returned even when it does not exist.

    Example:
        >>> default_data_dir().name
        'data'
    """
    env = os.environ.get("TUNER_DATA_DIR")
    if env:
        return Path(env).expanduser()
    checkout = Path(__file__).resolve().parent.parent
    return checkout.parent / "shared" / "data"


def real_matrices(data_dir=None) -> list[Path]:
    """The ``*.npz`` files of ``data_dir`` (default :func:`default_data_dir`), sorted by name.

    Example:
        >>> real_matrices("/no/such/folder")
        []
    """
    folder = Path(data_dir) if data_dir is not None else default_data_dir()
    if not folder.is_dir():
        return []
    return sorted(folder.glob("*.npz"), key=lambda path: path.name)


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
    if not path.is_file():
        raise FileNotFoundError(errno.ENOENT, "no such matrix file", str(path))
    name = path.name.lower()
    if name.endswith(".npz"):
        matrix = _read_npz(path)
    elif name.endswith((".mtx", ".mtx.gz")):
        matrix = _read_mtx(path)
    else:
        return _read_edge_list(path)
    return _canonical(matrix, path)


def _read_npz(path: Path):
    try:
        return sp.load_npz(path)
    except (ValueError, OSError, KeyError) as exc:
        raise ValueError(f"{path}: not a scipy.sparse .npz file ({exc})") from exc


def _read_mtx(path: Path):
    try:
        return scipy.io.mmread(path)
    except (ValueError, OSError) as exc:
        raise ValueError(f"{path}: not a readable Matrix Market file ({exc})") from exc


def _canonical(matrix, path: Path) -> sp.csr_matrix:
    """CSR with summed duplicates, sorted indices, float values and the smallest index dtype."""
    csr = sp.csr_matrix(matrix)
    if np.iscomplexobj(csr.data):
        raise ValueError(f"{path}: complex values are not supported")
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
    text = _strip_comments(_read_bytes(path)).replace(b",", b" ")
    ncols, row_lines = _edge_list_layout(text, path)
    table = _parse_numbers(text, ncols, path).reshape(-1, ncols)
    if ncols == 2:
        src, dst = table[:, 0], table[:, 1]
    else:
        src, dst = _integral_ids(table[:, 0], table[:, 1], path, row_lines)
    negative = np.flatnonzero((src < 0) | (dst < 0))
    if negative.size:
        raise ValueError(f"{path}: line {row_lines[negative[0]] + 1}: node ids must be non-negative")
    n = int(max(src.max(), dst.max())) + 1
    if ncols == 2:
        return _pattern_csr(src, dst, (n, n))
    return _canonical(sp.csr_matrix((table[:, 2], (src, dst)), shape=(n, n)), path)


def _read_bytes(path: Path) -> bytes:
    if path.name.lower().endswith(".gz"):
        with gzip.open(path, "rb") as stream:
            return stream.read()
    return path.read_bytes()


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
        raise ValueError(f"{path} has no edges")
    per_line = np.bincount(line_of_token)
    ncols = int(per_line[line_of_token[0]])
    if ncols not in (2, 3):
        raise ValueError(
            f"{path}: line {line_of_token[0] + 1}: expected 'src dst' or 'src dst weight', "
            f"got {ncols} columns"
        )
    bad = np.flatnonzero((per_line != 0) & (per_line != ncols))
    if bad.size:
        raise ValueError(
            f"{path}: line {bad[0] + 1}: expected {ncols} columns like the first edge, "
            f"got {per_line[bad[0]]}"
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
    raise ValueError(
        f"{path}: line {line}: cannot parse {_line_text(text, line)!r} as "
        f"{'integer node ids' if ncols == 2 else 'node ids and a weight'}"
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
        raise ValueError(f"{path}: line {line_of_row[bad[0]] + 1}: node ids must be integers")
    return src.astype(np.int64), dst.astype(np.int64)
