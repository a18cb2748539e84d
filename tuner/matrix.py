"""Validation, canonical CSR and fingerprints: the first stage of the data flow.

Everything later (families, planner, kernels) sees only a :class:`CanonicalMatrix`: sorted column indices,
duplicates summed, int32 indices when they fit and int64 otherwise, float32 or float64 values.
"""
from __future__ import annotations

import hashlib
import os
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import scipy.sparse as sp

INT32_MAX = np.iinfo(np.int32).max
FINGERPRINT_VERSION = b"sparse-tuner-fingerprint-v2"


class MatrixError(ValueError):
    """A matrix or vector the tuner cannot accept; the message names the problem."""


class Shaped:
    """Row and column counts of anything with a ``shape`` (matrices and the model's views of them)."""

    shape: tuple[int, int]

    @property
    def n_rows(self) -> int:
        return self.shape[0]

    @property
    def n_cols(self) -> int:
        return self.shape[1]


@dataclass(frozen=True, eq=False)
class CanonicalMatrix(Shaped):
    """A sparse matrix in the tuner's canonical CSR form.

    Attributes:
        indptr, indices, data: CSR arrays; indices sorted within each row, no duplicates; ``indptr`` and
            ``indices`` share one integer dtype (int32 when every index and nnz fit, else int64).
        shape: (rows, columns).
        pattern_value: the common value of every stored entry when they are all equal (a pattern matrix,
            served by value-free kernels that never read ``data``), else None. None for an empty matrix.
    """

    indptr: np.ndarray
    indices: np.ndarray
    data: np.ndarray
    shape: tuple[int, int]
    pattern_value: float | None = field(default=None)

    @property
    def nnz(self) -> int:
        return int(self.indices.size)

    @property
    def index_dtype(self) -> np.dtype:
        return self.indices.dtype

    @property
    def value_dtype(self) -> np.dtype:
        return self.data.dtype

    @property
    def value_free(self) -> bool:
        return self.pattern_value is not None

    @cached_property
    def row_lengths(self) -> np.ndarray:
        """Stored entries per row (int64)."""
        return np.diff(self.indptr).astype(np.int64, copy=False)

    @cached_property
    def col_lengths(self) -> np.ndarray:
        """Stored entries per column (int64), counted in parallel chunks (bincount releases the GIL)."""
        n, nnz = self.n_cols, self.nnz
        # Each chunk's count array has n_cols entries: keep their sum under about 1 GB.
        chunks = max(1, min(os.cpu_count() or 1, nnz // (1 << 22), (1 << 30) // max(8 * n, 1)))
        if chunks == 1:
            return np.bincount(self.indices, minlength=n).astype(np.int64, copy=False)
        with ThreadPoolExecutor(max_workers=chunks) as pool:
            parts = pool.map(lambda c: np.bincount(c, minlength=n), np.array_split(self.indices, chunks))
            total = next(parts).astype(np.int64, copy=True)
            for part in parts:
                total += part
        return total

    def row_entries(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(lengths, columns) of ``rows`` in the order given, their columns concatenated.

        Example:
            >>> m = canonicalize(sp.csr_matrix(np.array([[1.0, 0, 2.0], [0, 0, 0], [0, 3.0, 0]])))
            >>> [a.tolist() for a in m.row_entries(np.array([2, 0]))]
            [[1, 2], [1, 0, 2]]
        """
        rows = np.asarray(rows, dtype=np.int64)
        # From the rows' pointers: a few rows' lengths, not a count of every row's.
        start = self.indptr[rows].astype(np.int64)
        lengths = self.indptr[rows + 1].astype(np.int64) - start
        offsets = np.cumsum(lengths) - lengths
        at = np.repeat(start - offsets, lengths) + np.arange(int(lengths.sum()), dtype=np.int64)
        return lengths, self.indices[at]

    def to_scipy(self) -> sp.csr_matrix:
        """The same matrix as a SciPy CSR matrix (shares the arrays), marked canonical: SciPy need not scan it."""
        out = sp.csr_matrix((self.data, self.indices, self.indptr), shape=self.shape, copy=False)
        out.has_canonical_format = True
        return out


# Integers up to these magnitudes convert to float32 and float64 without rounding.
FLOAT32_EXACT = 1 << 24
FLOAT64_EXACT = 1 << 53


def _largest_integer(data: np.ndarray) -> int:
    """Largest magnitude of integer or boolean values (0 when empty); no abs(), which overflows at INT_MIN."""
    if data.size == 0 or data.dtype == np.bool_:
        return int(data.size > 0 and data.any())
    return max(-int(data.min()), int(data.max()))


def check_value_dtype(dtype) -> np.dtype:
    """``dtype`` as a NumPy dtype if kernels compute in it (float32 or float64), else MatrixError naming it.

    Example:
        >>> check_value_dtype("float32")
        dtype('float32')
        >>> check_value_dtype(np.int32)
        Traceback (most recent call last):
        ...
        tuner.matrix.MatrixError: dtype must be float32 or float64, got int32
    """
    d = np.dtype(dtype)
    if d not in (np.float32, np.float64):
        raise MatrixError(f"dtype must be float32 or float64, got {d}")
    return d


def _value_dtype(dtype: np.dtype, data: np.ndarray, requested) -> np.dtype:
    """The kernel's value type for values ``data`` of ``dtype``: float32 or float64, chosen so that integer
    values are not rounded unasked."""
    if np.issubdtype(dtype, np.complexfloating):
        raise MatrixError(f"complex matrices are not supported (got {dtype})")
    integral = np.issubdtype(dtype, np.integer) or dtype == np.bool_
    if requested is not None:
        req = check_value_dtype(requested)
        if integral:
            big = _largest_integer(data)
            if big > (FLOAT32_EXACT if req == np.float32 else FLOAT64_EXACT):
                warnings.warn(f"integer values up to {big} do not fit {req.name} exactly and are rounded",
                              RuntimeWarning, stacklevel=3)
        return req
    if dtype == np.float64:
        return np.dtype(np.float64)
    if dtype == np.float32 or dtype == np.float16:
        return np.dtype(np.float32)
    if integral:
        # Adjacency counts and flags: float32 holds them exactly up to 2^24, float64 up to 2^53.
        big = _largest_integer(data)
        if big > FLOAT64_EXACT:
            warnings.warn(f"integer values up to {big} do not fit float64 exactly and are rounded",
                          RuntimeWarning, stacklevel=3)
        return np.dtype(np.float32 if big <= FLOAT32_EXACT else np.float64)
    raise MatrixError(f"unsupported value dtype {dtype}: use a real floating, integer or boolean matrix")


def row_blocks(indptr: np.ndarray, blocks: int) -> list[tuple[int, int]]:
    """(first, end) row ranges, about equal in entries, at most ``blocks`` of them, none empty.

    Example:
        >>> row_blocks(np.array([0, 5, 6, 7, 12]), 2)
        [(0, 2), (2, 4)]
    """
    n_rows = indptr.size - 1
    targets = np.linspace(0, int(indptr[-1]), max(1, blocks) + 1)[1:-1]
    cuts = np.unique(np.concatenate([[0], np.searchsorted(indptr, targets).clip(0, n_rows), [n_rows]]))
    return [(int(a), int(b)) for a, b in zip(cuts[:-1], cuts[1:]) if b > a]


def csr_on(data: np.ndarray, indices: np.ndarray, indptr: np.ndarray, shape: tuple[int, int]) -> sp.csr_matrix:
    """A SciPy CSR matrix on these arrays themselves, unchecked (the caller built them consistent, indices and
    row pointers of one integer type): SciPy's constructor copies index and value arrays that are views of
    arrays over twice their size, one more pass over a product's entries.

    Example:
        >>> indices = np.array([0, 1, 1, 0, 0, 0], np.int32)
        >>> m = csr_on(np.ones(3), indices[:3], np.array([0, 2, 3], np.int32), (2, 2))
        >>> m.toarray().tolist(), bool(np.shares_memory(m.indices, indices))
        ([[1.0, 1.0], [0.0, 1.0]], True)
    """
    m = sp.csr_matrix(shape, dtype=data.dtype)
    m.indptr, m.indices, m.data = indptr, indices, data
    return m


def _in_pieces(fn, a: np.ndarray) -> list:
    """``fn`` of consecutive pieces of ``a``, on several threads for large arrays (NumPy's passes release the
    GIL): the checks of a 100M-entry matrix then take a fraction of the time one core needs."""
    k = min(os.cpu_count() or 1, 16, max(1, a.size // (1 << 22)))
    if k == 1:
        return [fn(a)]
    with ThreadPoolExecutor(max_workers=k) as pool:
        return list(pool.map(fn, np.array_split(a, k)))


def extrema(a: np.ndarray) -> tuple:
    """(smallest, largest) entry of a non-empty array.

    Example:
        >>> extrema(np.array([3, -1, 7]))
        (-1, 7)
    """
    return value_extrema(a)[:2]


def value_extrema(a: np.ndarray) -> tuple:
    """(smallest, largest, all finite) of a non-empty array in one pass over it: a NaN makes its
    piece's least and greatest NaN and an infinity is one of them, so the pieces' extrema tell both (a
    100M-entry matrix's values are read once, not once per question).

    Example:
        >>> value_extrema(np.array([3.0, -1.0])), value_extrema(np.array([1.0, np.nan]))[2]
        ((-1.0, 3.0, True), False)
    """
    parts = _in_pieces(lambda p: (p.min(), p.max()), a)
    finite = all(np.isfinite(lo) and np.isfinite(hi) for lo, hi in parts)
    return min(p[0] for p in parts).item(), max(p[1] for p in parts).item(), bool(finite)


def all_finite(a: np.ndarray) -> bool:
    """True when no entry is NaN or infinite.

    Example:
        >>> all_finite(np.array([1.0, np.inf])), all_finite(np.array([1.0]))
        (False, True)
    """
    return all(_in_pieces(lambda p: bool(np.isfinite(p).all()), a))


def _check_index_range(what: str, idx: np.ndarray, bound: int, dim: str) -> None:
    """Raise :class:`MatrixError` unless every entry of ``idx`` lies in ``[0, bound)``."""
    if idx.size == 0:
        return
    if not np.issubdtype(idx.dtype, np.integer):
        raise MatrixError(f"{what} must be integers, got dtype {idx.dtype}")
    lo, hi = (int(v) for v in extrema(idx))
    if lo < 0:
        at = int(np.argmax(idx < 0))
        raise MatrixError(f"negative {what} {lo} (first at position {at}): indices must be >= 0")
    if hi >= bound:
        at = int(np.argmax(idx >= bound))
        raise MatrixError(f"{what} {hi} (first out of range at position {at}) is out of range for {bound} {dim}")


def _check_compressed(indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, n_major: int, n_minor: int,
                      major: str, minor: str) -> None:
    """Raise :class:`MatrixError` naming the first structural defect of a CSR (or CSC) triple."""
    if indptr.ndim != 1 or indptr.size != n_major + 1:
        raise MatrixError(f"indptr has {indptr.size} entries, but {n_major} {major}s need {n_major + 1}")
    if not np.issubdtype(indptr.dtype, np.integer):
        raise MatrixError(f"indptr must be integers, got dtype {indptr.dtype}")
    if indices.size != data.size:
        raise MatrixError(f"indices has {indices.size} entries but data has {data.size}")
    if int(indptr[0]) != 0:
        raise MatrixError(f"indptr[0] is {int(indptr[0])}, but it must be 0")
    falls = np.flatnonzero(indptr[1:] < indptr[:-1])
    if falls.size:
        i = int(falls[0])
        raise MatrixError(f"indptr is not monotonic: indptr[{i + 1}] = {int(indptr[i + 1])} < "
                          f"indptr[{i}] = {int(indptr[i])} ({major} {i} would have a negative length)")
    if int(indptr[-1]) != indices.size:
        raise MatrixError(f"indptr[-1] = {int(indptr[-1])} does not match the {indices.size} stored entries "
                          "(nnz)")
    _check_index_range(f"{minor} index", indices, n_minor, f"{minor}s")


def check_structure(A) -> None:
    """Raise :class:`MatrixError` naming the first structural defect of a SciPy sparse matrix.

    SciPy's constructors do not check index ranges, and its arrays can be changed after construction: an
    index out of range would make a kernel read or write out of bounds, and a falling ``indptr`` crashes
    SciPy's own conversions. Checked, before anything is converted or built: ``indptr`` (length, first
    entry 0, monotonic, last entry = nnz) and index ranges of CSR, CSC and BSR; row and column ranges of
    COO. LIL, DOK and DIA keep their structure in forms SciPy validates on every change.

    Example:
        >>> A = sp.csr_matrix((np.ones(2), np.array([0, 1]), np.array([0, 1, 2])), shape=(2, 2))
        >>> A.indices[1] = 5
        >>> check_structure(A)
        Traceback (most recent call last):
        ...
        tuner.matrix.MatrixError: column index 5 (first out of range at position 1) is out of range for 2 columns
    """
    n_rows, n_cols = (int(s) for s in A.shape)
    fmt = A.format
    if fmt in ("csr", "csc"):
        major, minor = ("row", "column") if fmt == "csr" else ("column", "row")
        n_major, n_minor = (n_rows, n_cols) if fmt == "csr" else (n_cols, n_rows)
        _check_compressed(np.asarray(A.indptr), np.asarray(A.indices), np.asarray(A.data), n_major, n_minor,
                          major, minor)
    elif fmt == "bsr":
        r, c = A.blocksize
        _check_compressed(np.asarray(A.indptr), np.asarray(A.indices), np.asarray(A.data)[:, 0, 0],
                          n_rows // r, n_cols // c, "block row", "block column")
    elif fmt == "coo":
        row, col = np.asarray(A.row), np.asarray(A.col)
        if not row.size == col.size == np.asarray(A.data).size:
            raise MatrixError(f"COO arrays differ in length: row {row.size}, col {col.size}, "
                              f"data {np.asarray(A.data).size}")
        _check_index_range("row index", row, n_rows, "rows")
        _check_index_range("column index", col, n_cols, "columns")


def canonicalize(A, dtype=None, index_dtype=None) -> CanonicalMatrix:
    """Validate ``A`` and return it as a :class:`CanonicalMatrix`; ``A`` itself is never modified.

    Args:
        A: any SciPy sparse matrix or array (CSR, CSC, COO, ...), 2-D.
        dtype: force float32 or float64 values; default keeps float32/float64 and casts integer or boolean
            values to float32, or to float64 when one exceeds 2^24 in magnitude (float32 would round it).
        index_dtype: force int64 (or int32, when everything fits) indices; default int32 when it fits.

    Example:
        >>> import scipy.sparse as sp
        >>> m = canonicalize(sp.coo_matrix(([1, 2, 3], ([0, 0, 1], [2, 2, 0])), shape=(2, 3)))
        >>> m.indices.tolist(), m.data.tolist(), m.index_dtype
        ([2, 0], [3.0, 3.0], dtype('int32'))
    """
    if isinstance(A, CanonicalMatrix):
        same = (dtype is None or np.dtype(dtype) == A.value_dtype) and \
            (index_dtype is None or np.dtype(index_dtype) == A.index_dtype)
        return A if same else canonicalize(A.to_scipy(), dtype, index_dtype)
    if not sp.issparse(A):
        kind = type(A).__name__
        if isinstance(A, np.ndarray) or hasattr(A, "__array__"):
            raise MatrixError(
                f"expected a SciPy sparse matrix, got dense {kind}: convert with scipy.sparse.csr_matrix(A)")
        raise MatrixError(f"expected a SciPy sparse matrix, got {kind}")
    if A.ndim != 2:
        raise MatrixError(f"expected a 2-D sparse matrix, got {A.ndim}-D with shape {A.shape}")
    check_structure(A)
    if np.issubdtype(A.dtype, np.complexfloating):
        raise MatrixError(f"complex matrices are not supported (got {A.dtype})")
    if np.issubdtype(A.dtype, np.integer) and A.dtype.itemsize < 8:
        A = A.astype(np.int64)  # duplicates are summed below (or by tocsr): narrow integers would wrap
    csr = A.tocsr()
    if not csr.has_canonical_format:
        # Copy first: sum_duplicates sorts in place and the caller's matrix must stay as it was.
        csr = csr.copy()
        csr.sum_duplicates()
    n_rows, n_cols = (int(s) for s in csr.shape)
    data = np.asarray(csr.data)
    vdtype = _value_dtype(csr.dtype, data, dtype)
    floating = np.issubdtype(data.dtype, np.floating)
    span = value_extrema(data) if data.size and floating else None  # one pass: finiteness and the pattern test
    if span is not None and not span[2]:
        bad = "NaN" if np.isnan(data).any() else "infinite"
        raise MatrixError(f"matrix values contain {bad} entries")
    narrowed = data.dtype != vdtype
    with np.errstate(over="ignore"):  # overflow is reported just below, with the culprit's size
        data = data.astype(vdtype, copy=False)
    if data.size and (narrowed or span is None):
        span = value_extrema(data)  # of the values as stored (a narrowing may merge or overflow them)
        if not span[2]:
            raise MatrixError(f"matrix values overflow {vdtype} (largest magnitude {np.abs(csr.data).max():g})")
    nnz = int(csr.indptr[-1]) if csr.indptr.size else 0
    fits32 = max(n_rows, n_cols, nnz) <= INT32_MAX
    idx_dtype = np.dtype(np.int32 if fits32 else np.int64)
    if index_dtype is not None:
        idx_dtype = np.dtype(index_dtype)
        if idx_dtype not in (np.int32, np.int64):
            raise MatrixError(f"index_dtype must be int32 or int64, got {idx_dtype}")
        if idx_dtype == np.int32 and not fits32:
            raise MatrixError(f"int32 indices overflow: shape {A.shape} with {nnz} non-zeros needs int64")
    indptr = csr.indptr.astype(idx_dtype, copy=False)
    indices = csr.indices.astype(idx_dtype, copy=False)
    pattern = float(span[0]) if span is not None and span[0] == span[1] else None
    return CanonicalMatrix(indptr=indptr, indices=indices, data=data, shape=(n_rows, n_cols),
                           pattern_value=pattern)


@dataclass(frozen=True)
class Fingerprint:
    """Identity of a matrix structure for plan caching.

    Attributes:
        digest: sha256 hex digest over shape, index dtype, value-free flag and the CSR structure arrays.
        features: small summary (sizes, row/column length quantiles) kept beside it for reports and
            nearest-neighbour reuse; not part of the digest.
    """

    digest: str
    features: dict

    @property
    def short(self) -> str:
        return self.digest[:12]


HASH_CHUNK = 64 << 20


def _chunk_digests(arrays: list[np.ndarray]) -> list[bytes]:
    # sha256 of fixed 64 MiB slices, hashed on all cores (hashlib releases the GIL): a 100M-non-zero
    # structure is hashed in a fraction of a second instead of seconds. No slice is copied.
    views = [memoryview(np.ascontiguousarray(a)).cast("B") for a in arrays]
    slices = [v[i:i + HASH_CHUNK] for v in views for i in range(0, len(v), HASH_CHUNK)]
    if len(slices) <= 1:
        return [hashlib.sha256(s).digest() for s in slices]
    with ThreadPoolExecutor(max_workers=min(len(slices), os.cpu_count() or 1)) as pool:
        return list(pool.map(lambda s: hashlib.sha256(s).digest(), slices))


def length_quantiles(lengths: np.ndarray, qs) -> list[int]:
    """``np.quantile(lengths, qs, method="higher")`` of non-negative integers, from their histogram: one
    counting pass instead of a partition per quantile (a tenth of the time on millions of rows); 0s when
    empty.

    Example:
        >>> length_quantiles(np.array([5, 0, 2, 2, 9]), (0.5, 0.9, 1.0))
        [2, 9, 9]
    """
    n = lengths.size
    if n == 0:
        return [0] * len(qs)
    below = np.cumsum(np.bincount(lengths))  # values <= k
    at = np.ceil(np.asarray(qs, dtype=np.float64) * (n - 1)).astype(np.int64)  # numpy's 'higher' index
    return [int(k) for k in np.searchsorted(below, at, side="right")]


def structure_features(m: CanonicalMatrix) -> dict:
    """Summary statistics of the structure: sizes and row/column length quantiles.

    Example:
        >>> import scipy.sparse as sp
        >>> structure_features(canonicalize(sp.eye(4, format="csr")))["row_max"]
        1
    """
    rows = m.row_lengths
    cols = m.col_lengths

    rq, cq = (length_quantiles(v, (0.5, 0.9, 0.99, 1.0)) for v in (rows, cols))
    return {
        "n_rows": m.n_rows, "n_cols": m.n_cols, "nnz": m.nnz,
        "index_dtype": str(m.index_dtype), "value_dtype": str(m.value_dtype), "value_free": m.value_free,
        "row_mean": float(m.nnz / m.n_rows) if m.n_rows else 0.0,
        "row_p50": rq[0], "row_p90": rq[1], "row_p99": rq[2], "row_max": rq[3],
        "empty_rows": int(np.count_nonzero(rows == 0)),
        "col_p50": cq[0], "col_p90": cq[1], "col_p99": cq[2], "col_max": cq[3],
    }


def structure_digest(m: CanonicalMatrix) -> str:
    """sha256 over shape, index dtype, value-free flag and the CSR structure (values excluded).

    The structure arrays are hashed in 64 MiB slices and the digest is the sha256 of the header and the
    slices' digests, in order, so any change of any index changes it.

    Example:
        >>> import scipy.sparse as sp
        >>> len(structure_digest(canonicalize(sp.eye(3, format="csr"))))
        64
    """
    h = hashlib.sha256(FINGERPRINT_VERSION)
    h.update(f"{m.n_rows}x{m.n_cols}:{m.index_dtype.str}:{int(m.value_free)}:{m.indptr.size}:{m.nnz}:".encode())
    for digest in _chunk_digests([m.indptr, m.indices]):
        h.update(digest)
    return h.hexdigest()


def fingerprint(m: CanonicalMatrix) -> Fingerprint:
    """The structure digest (see :func:`structure_digest`) with the feature summary beside it.

    Example:
        >>> import scipy.sparse as sp
        >>> a = canonicalize(sp.random(50, 50, density=0.1, format="csr", random_state=1))
        >>> fingerprint(a).digest == fingerprint(canonicalize(a.to_scipy() * 2.0)).digest
        True
    """
    return Fingerprint(digest=structure_digest(m), features=structure_features(m))


def check_vector_shape(shape: tuple, length: int, what: str = "x") -> None:
    """Raise :class:`MatrixError` unless ``shape`` is that of a 1-D vector of ``length`` entries.

    Example:
        >>> check_vector_shape((3,), 3)
    """
    if len(shape) != 1:
        raise MatrixError(f"{what} must be a 1-D vector of length {length}, got shape {tuple(shape)}")
    if shape[0] != length:
        raise MatrixError(f"{what} has length {shape[0]}, but the matrix needs {length}")


def check_vector_dtype(dtype, expected: np.dtype, what: str = "x", allow_safe_cast: bool = False) -> None:
    """Raise :class:`MatrixError` unless ``dtype`` matches ``expected`` (or casts safely when allowed).

    Example:
        >>> check_vector_dtype(np.float32, np.dtype(np.float32))
    """
    dtype = np.dtype(dtype)
    if dtype == expected:
        return
    if allow_safe_cast and np.can_cast(dtype, expected, "safe"):
        return
    hint = f"convert with .astype({expected.name})" if not allow_safe_cast else \
        f"it does not convert to {expected.name} without loss; convert explicitly or compile with dtype={dtype.name}"
    raise MatrixError(f"{what} has dtype {dtype.name}, but the kernel computes in {expected.name}: {hint}")
