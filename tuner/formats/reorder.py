"""Relabelling rows and columns by degree: the orderings a plan may choose, and the permuted matrix.

On power-law graphs the random gathers of x bound SpMV. Numbering columns by decreasing length packs the
hot entries of x into few 32-byte sectors that stay cached (paper 003, section 3.1, Observation 1 and
Solution 1); numbering rows by decreasing length puts rows of like length in the same warp. A square
matrix gets one permutation for both (by row plus column length), so that an iterative caller can feed
y back as x in the plan's order; a rectangular one gets rows by row length and columns by column length.

The kernels run on B = A[row_order][:, col_order]; the callable gathers x_plan = x[col_order] before and
y = y_plan[row_rank] after (``row_rank`` inverts ``row_order``), both on the GPU.
"""
from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass
from typing import Callable

import numpy as np
import scipy.sparse as sp

from . import device_reorder
from .xp import host, like, module, stable_argsort

from ..matrix import CanonicalMatrix, Shaped

NONE = "none"
log = logging.getLogger("tuner.reorder")


@dataclass(frozen=True, eq=False)
class Ordering:
    """A relabelling of rows and columns (arrays in the matrix's index dtype).

    Attributes:
        name: the ordering's registry name.
        row_order: new row i is old row ``row_order[i]``.
        col_order: new column j is old column ``col_order[j]`` (x_plan = x[col_order]).
        row_rank: old row r is new row ``row_rank[r]`` (y = y_plan[row_rank]).
        col_lengths: the column lengths in the new order (``col_lengths[col_order]``) where the ordering
            was made beside them on the GPU, so the relabelled matrix needs no second count; else None.
    """

    name: str
    row_order: np.ndarray
    col_order: np.ndarray
    row_rank: np.ndarray
    col_lengths: np.ndarray | None = None

    @property
    def symmetric(self) -> bool:
        """True when rows and columns share one permutation (iterations may stay in the plan's order)."""
        return self.row_order is self.col_order


def by_decreasing(lengths: np.ndarray) -> np.ndarray:
    """Indices sorted by decreasing length, ties in index order.

    Example:
        >>> by_decreasing(np.array([1, 3, 0, 3])).tolist()
        [1, 3, 0, 2]
    """
    xp = module(lengths)
    if xp is not np and lengths.size:  # the gap to the longest: an unsigned key of the bits it needs (CUB)
        from .device_sort import argsort, key_bits
        longest = int(lengths.max())
        if longest < 1 << 32:
            return argsort((longest - lengths).astype(np.uint32), key_bits(longest))[0]
    return stable_argsort(-xp.asarray(lengths, dtype=np.int64))


def inverse(order: np.ndarray) -> np.ndarray:
    """The inverse permutation, in the same dtype.

    Example:
        >>> inverse(np.array([2, 0, 1])).tolist()
        [1, 2, 0]
    """
    xp = module(order)
    rank = xp.empty_like(order)
    rank[order] = xp.arange(order.size, dtype=order.dtype)
    return rank


def col_ranks(o: Ordering) -> np.ndarray:
    """Each old column's new index: the inverse of ``o.col_order`` (``o.row_rank`` when rows and columns share
    one permutation).

    Example:
        >>> col_ranks(Ordering("x", np.array([2, 0, 1]), np.array([1, 2, 0]), np.array([1, 2, 0]))).tolist()
        [2, 0, 1]
    """
    return o.row_rank if o.symmetric else inverse(o.col_order)


def degree_ordering(row_lengths: np.ndarray, col_lengths: np.ndarray, index_dtype) -> Ordering:
    """Rows and columns by decreasing length; one permutation by row + column length when square. On CuPy
    lengths the orders are computed (and returned) on the device.

    Example:
        >>> o = degree_ordering(np.array([1, 0, 2]), np.array([0, 2, 1]), np.int32)
        >>> o.row_order.tolist(), o.symmetric
        ([2, 1, 0], True)
    """
    if row_lengths.size == col_lengths.size:
        order = by_decreasing(row_lengths + col_lengths).astype(index_dtype)
        return Ordering("degree", order, order, inverse(order))
    rows = by_decreasing(row_lengths).astype(index_dtype)
    return Ordering("degree", rows, by_decreasing(col_lengths).astype(index_dtype), inverse(rows))


# name -> (row lengths, column lengths, index dtype) -> Ordering; "none" keeps the caller's order.
ORDERINGS: dict[str, Callable[[np.ndarray, np.ndarray, np.dtype], Ordering] | None] = {
    NONE: None,
    "degree": degree_ordering,
}


def check_order(name: str) -> None:
    """Raise ValueError naming the known orderings when ``name`` is not one of them."""
    if name not in ORDERINGS:
        raise ValueError(f"unknown ordering {name!r}; known: {', '.join(ORDERINGS)}")


def make_ordering(m: CanonicalMatrix, name: str) -> Ordering | None:
    """The ordering ``name`` of ``m`` (None for 'none'). Where the matrix is relabelled on the GPU
    (:func:`~tuner.formats.device_reorder.usable`) its column lengths are counted and the orders sorted
    there too: the same arrays, a fraction of a second sooner on 100M entries."""
    check_order(name)
    build = ORDERINGS[name]
    if build is None:
        return None
    if device_reorder.usable(m.n_rows, m.n_cols, m.nnz, relabel_bytes(m)):
        try:
            return _ordering_on_device(m, build)
        except MemoryError as e:  # CuPy's OutOfMemoryError is one: the host orders it instead
            log.warning("ordering on the GPU ran out of memory (%s): ordering on the host", e)
            device_reorder.forget(m)
    return build(m.row_lengths, m.col_lengths, m.index_dtype)


def relabel_bytes(m: CanonicalMatrix) -> int:
    """Device memory the relabelling of ``m`` needs (its upload, the relabelled copy, one piece's work).

    Example (2M int32 pattern entries: two copies of 8 MB and 64 B of work an entry):
        >>> from tuner.matrix import canonicalize
        >>> relabel_bytes(canonicalize(sp.random(2000, 2000, density=0.5, format="csr", random_state=0) > 0))
        144000000
    """
    entry = m.index_dtype.itemsize + (0 if m.value_free else m.value_dtype.itemsize)
    return device_reorder.relabel_bytes(m.nnz, entry)


def _ordering_on_device(m: CanonicalMatrix, build) -> Ordering:
    with device_reorder.on_device() as cupy:
        csr = device_reorder.device_csr(m)
        if "col_lengths" in m.__dict__:
            cols = like(csr.indices, m.col_lengths)
        else:
            cols = device_reorder.device_col_lengths(csr, m.n_cols)
            m.__dict__["col_lengths"] = host(cols)
        o = build((csr.indptr[1:] - csr.indptr[:-1]).astype(np.int64), cols, m.index_dtype)  # no upload
        rows = host(o.row_order)
        return Ordering(o.name, rows, rows if o.symmetric else host(o.col_order), host(o.row_rank),
                        host(cols[o.col_order]))


def _permute_on_host(m: CanonicalMatrix, row_order: np.ndarray, col_rank: np.ndarray):
    # SciPy's row selection and per-row sort run in C++; the column relabel is one gather.
    rows = m.to_scipy()[row_order]  # C++ row gather (csr_row_index)
    indices = np.take(col_rank, rows.indices).astype(m.index_dtype, copy=False)
    out = sp.csr_matrix((rows.data, indices, rows.indptr), shape=m.shape, copy=False)
    out.has_sorted_indices = False
    out.sort_indices()  # C++ per-row sort: hot (low) columns first within each row
    return out.indptr.astype(m.index_dtype, copy=False), out.indices.astype(m.index_dtype, copy=False), out.data


def _rebuilt(source: weakref.ref, row_order: np.ndarray, col_rank: np.ndarray, part: int):
    """Builds part ``part`` (1 indices, 2 values) of the relabelled matrix on the host from the matrix
    ``source`` refers to (weakly: the relabelled matrix is kept in that matrix's memos)."""
    def build():
        m = source()
        if m is None:
            raise RuntimeError("the relabelled matrix outlived its source and its device copy: nothing to read")
        return _permute_on_host(m, row_order, col_rank)[part]
    return build


def permute(m: CanonicalMatrix, o: Ordering) -> CanonicalMatrix:
    """B = A[row_order][:, col_order] in canonical form (sorted column indices).

    On the GPU where one is present and the matrix is large (:mod:`~tuner.formats.device_reorder`: one
    radix sort of (row, column) keys, milliseconds for 100M entries), else on the host (seconds for 100M);
    both give the same arrays.

    Example:
        >>> from tuner.matrix import canonicalize
        >>> m = canonicalize(sp.csr_matrix(np.array([[0, 1.0, 0], [2.0, 0, 3.0], [0, 0, 4.0]])))
        >>> b = permute(m, degree_ordering(m.row_lengths, m.col_lengths, m.index_dtype))
        >>> b.to_scipy().toarray().tolist()
        [[0.0, 3.0, 2.0], [0.0, 4.0, 0.0], [1.0, 0.0, 0.0]]
    """
    col_rank = col_ranks(o)
    csr = None
    if device_reorder.usable(m.n_rows, m.n_cols, m.nnz, relabel_bytes(m)):
        try:
            csr = device_reorder.permute_device(device_reorder.device_csr(m), o.row_order, col_rank)
            # Row pointers now (the model's row samples read them); entries only if the host reads them,
            # relabelled on the host if the device copy has gone by then.
            source = weakref.ref(m)
            indptr = host(csr.indptr)
            indices = device_reorder.HostMirror(csr.indices, _rebuilt(source, o.row_order, col_rank, 1))
            data = None if csr.data is None else device_reorder.HostMirror(
                csr.data, _rebuilt(source, o.row_order, col_rank, 2))
        except MemoryError as e:  # CuPy's OutOfMemoryError is one: the host relabels it instead
            log.warning("relabelling on the GPU ran out of memory (%s): relabelling on the host", e)
            csr = None
            device_reorder.forget(m)
        if csr is not None and data is None:  # a pattern, all values equal and never read by its kernels
            data = np.broadcast_to(m.data[:1], (m.nnz,))
    if csr is None:
        indptr, indices, data = _permute_on_host(m, o.row_order, col_rank)
    b = CanonicalMatrix(indptr=indptr, indices=indices, data=data, shape=m.shape, pattern_value=m.pattern_value)
    # Its lengths are m's, permuted: seed the cached properties instead of counting the entries again.
    if csr is None:
        b.__dict__["row_lengths"] = m.row_lengths[o.row_order]
        b.__dict__["col_lengths"] = m.col_lengths[o.col_order]
    else:  # the same counts without two random gathers over the host's rows (a tenth of a second at 8M)
        b.__dict__["row_lengths"] = np.diff(indptr).astype(np.int64, copy=False)
        b.__dict__["col_lengths"] = (o.col_lengths if o.col_lengths is not None
                                     else device_reorder.col_lengths(csr, m.n_cols))
        device_reorder.keep(b, csr)  # the layout builders start from the device copy
    return b


@dataclass(frozen=True, eq=False)
class Structure(Shaped):
    """What the performance model reads of a matrix (lengths, sizes, types), here of a permuted one.

    The model needs the permuted row and column lengths, not the permuted arrays: a reordered candidate
    is predicted without building its layout. Same attribute names as :class:`CanonicalMatrix`.
    ``matrix`` builds the permuted matrix itself, for the model of a family whose warps depend on where
    the entries lie (the tiled families read its tiles); None when nobody can. ``entries`` reads some of
    its rows without building it (:meth:`row_entries`); None when nobody can.
    """

    shape: tuple[int, int]
    nnz: int
    index_dtype: np.dtype
    value_dtype: np.dtype
    value_free: bool
    row_lengths: np.ndarray
    col_lengths: np.ndarray
    matrix: Callable[[], CanonicalMatrix] | None = None
    entries: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]] | None = None

    def row_entries(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(lengths, columns) of the permuted matrix's ``rows``, as
        :meth:`~tuner.matrix.CanonicalMatrix.row_entries` gives them (a row's columns in any order)."""
        if self.entries is None:
            raise ValueError("this structure holds lengths only: its rows' columns cannot be read")
        return self.entries(rows)


def permuted_structure(m: CanonicalMatrix, o: Ordering, matrix: Callable[[], CanonicalMatrix] | None = None,
                       entries: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]] | None = None) -> Structure:
    """The lengths of ``permute(m, o)`` without building it.

    Example:
        >>> from tuner.matrix import canonicalize
        >>> m = canonicalize(sp.csr_matrix(np.array([[0, 1.0, 0], [2.0, 0, 3.0], [0, 0, 4.0]])))
        >>> s = permuted_structure(m, degree_ordering(m.row_lengths, m.col_lengths, m.index_dtype))
        >>> s.row_lengths.tolist(), s.col_lengths.tolist()
        ([2, 1, 1], [1, 2, 1])
    """
    return Structure(shape=m.shape, nnz=m.nnz, index_dtype=m.index_dtype, value_dtype=m.value_dtype,
                     value_free=m.value_free, row_lengths=m.row_lengths[o.row_order],
                     col_lengths=m.col_lengths[o.col_order], matrix=matrix, entries=entries)


def permuted_rows(m: CanonicalMatrix, o: Ordering, col_rank: np.ndarray, rows: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(lengths, columns) of ``rows`` of ``permute(m, o)`` read from ``m`` (``col_rank``: the inverse of
    ``o.col_order``), each row's columns in m's order rather than sorted.

    Example:
        >>> from tuner.matrix import canonicalize
        >>> m = canonicalize(sp.csr_matrix(np.array([[0, 1.0, 0], [2.0, 0, 3.0], [0, 0, 4.0]])))
        >>> o = degree_ordering(m.row_lengths, m.col_lengths, m.index_dtype)
        >>> [a.tolist() for a in permuted_rows(m, o, inverse(o.col_order), np.array([0, 2]))]
        [[2, 1], [2, 1, 0]]
        >>> permute(m, o).to_scipy()[[0, 2]].indices.tolist()
        [1, 2, 0]
    """
    lengths, cols = m.row_entries(o.row_order[np.asarray(rows, dtype=np.int64)])
    return lengths, col_rank[cols]
