"""ALIGNED_COO (paper 004, section IV): a seg part of equal lanes stored column-major, and a flat COO part.

Each row's entries go to the two parts by the layout: ``hybrid`` puts the warp-multiple head of a row in
the flat part and its trailing ``length % 32`` entries in the seg part (section IV-D), ``seg`` puts every
entry in the seg part and ``flat`` every entry in the flat part.

The seg part lays its entries out, in row order, over lanes of ``seg_len`` slots, where ``seg_len`` is
Algorithm 1's number of segments (the longest seg row); slot s of lane l is stored at ``s * lanes + l``
(segment s is one column of the lane x segment grid: one coalesced load per step of the kernel). A row is
never longer than a lane, so a segment holds at most one entry of each row, even where a row runs from the
end of one lane into the start of the next. Every lane is full except the last, so exactly
``ceil(n_seg / seg_len)`` lanes are needed; Algorithm 1's seg_size is the paper's estimate for its own
packing, which keeps rows whole, and is not used for the lane count.

Padding: the slots after the last entry hold row -1, column -1 and value 0. No row means no thread of a
segment writes a row another thread of it holds, and no column means no extra fetch of x (value-free
kernels, which have no values to zero, skip it too). The paper's substitution of x values for J (Fig.
2c) needs x when the layout is built and is left out.

The flat part is COO in row order, padded to whole warps of 32 entries the same way; under ``hybrid`` each
warp's 32 entries belong to one row (the kernel reduces them with a plain warp sum), under ``flat`` a warp
may cross rows (a segmented warp sum). Both parts add into y atomically: y is zeroed before the kernel.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .xp import largest, module, prefix

WARP = 32
LAYOUTS = ("hybrid", "seg", "flat")


@dataclass(frozen=True)
class Segmentation:
    """Output of Algorithm 1.

    Attributes:
        seg_size: entries per segment (the paper's lane count for its own packing).
        num_segs: number of segments (the longest row's length).
    """

    seg_size: int
    num_segs: int


def segment_size(row_lengths: np.ndarray) -> Segmentation:
    """Algorithm 1 of paper 004: segment size and number of segments.

    The number of segments is the longest row; the size starts at max(nnz / segments, rows at least as long
    as the mean) and grows while two consecutive rows from that position together still fill a segment
    (the first position where they do not is found in one vectorised pass).

    Example (the 6 x 5 matrix of paper 004's Fig. 2):
        >>> segment_size(np.array([3, 1, 2, 2, 1, 1]))
        Segmentation(seg_size=4, num_segs=3)
    """
    L = np.asarray(row_lengths, dtype=np.int64)
    nr, nnz = L.size, int(L.sum())
    if nr == 0 or nnz == 0:
        return Segmentation(0, 0)
    num_segs = int(L.max())
    size = max(nnz // num_segs, int(np.count_nonzero(L >= nnz / nr)))
    if size + 1 < nr:
        stops = np.flatnonzero(L[size:-1] + L[size + 1:] < num_segs)
        size = size + int(stops[0]) if stops.size else nr - 1
    return Segmentation(min(size, nr), num_segs)


def split_lengths(row_lengths: np.ndarray, layout: str) -> tuple[np.ndarray, np.ndarray]:
    """Per row, how many entries go to the flat part (the head) and to the seg part (the rest).

    Example:
        >>> [a.tolist() for a in split_lengths(np.array([70, 5, 32]), "hybrid")]
        [[64, 0, 32], [6, 5, 0]]
    """
    L = np.asarray(row_lengths, dtype=np.int64)
    if layout == "hybrid":
        flat = L - L % WARP
    elif layout == "seg":
        flat = np.zeros_like(L)
    elif layout == "flat":
        flat = L
    else:
        raise ValueError(f"unknown ALIGNED_COO layout {layout!r}; known: {', '.join(LAYOUTS)}")
    return flat, L - flat


@dataclass(frozen=True)
class Sizes:
    """The geometry of an ALIGNED_COO layout, from row lengths alone (what the model reads).

    Attributes:
        seg_len: slots per lane (Algorithm 1's number of segments: the longest seg row).
        lanes: lanes of the seg part (one thread each).
        n_seg: entries in the seg part.
        n_flat: entries in the flat part.
    """

    seg_len: int
    lanes: int
    n_seg: int
    n_flat: int

    @property
    def chunks(self) -> int:
        """Warps of 32 flat entries (the last one padded)."""
        return -(-self.n_flat // WARP)


def sizes(row_lengths: np.ndarray, layout: str, counts: np.ndarray | None = None) -> Sizes:
    """Geometry of ``layout`` over rows of these lengths (``counts`` rows of each, when given): the seg
    part's lanes hold Algorithm 1's number of segments, its longest row, each.

    Example (Fig. 2 of paper 004: 10 entries, longest row 3, so 4 lanes of 3 slots):
        >>> sizes(np.array([3, 1, 2, 2, 1, 1]), "hybrid")
        Sizes(seg_len=3, lanes=4, n_seg=10, n_flat=0)
        >>> sizes(np.array([3, 2, 1]), "hybrid", counts=np.array([1, 2, 3]))
        Sizes(seg_len=3, lanes=4, n_seg=10, n_flat=0)
    """
    flat, seg = split_lengths(row_lengths, layout)
    each = np.ones(seg.size, dtype=np.int64) if counts is None else np.asarray(counts, dtype=np.int64)
    n_seg = int(seg @ each)
    seg_len = int(seg[each > 0].max(initial=0)) if n_seg else 0
    return Sizes(seg_len, -(-n_seg // seg_len) if seg_len else 0, n_seg, int(flat @ each))


@dataclass(frozen=True)
class AlignedCoo:
    """An ALIGNED_COO layout (arrays in the matrix's index and value dtypes; values None when value-free).

    Attributes:
        seg_rows, seg_cols, seg_vals: the seg part, ``lanes * seg_len`` slots, slot s of lane l at
            ``s * lanes + l``; padding is row -1, column -1, value 0.
        flat_rows, flat_cols, flat_vals: the flat part in row order, padded to a multiple of 32 likewise.
        sizes: the geometry.
        layout: 'hybrid', 'seg' or 'flat'.
    """

    seg_rows: np.ndarray
    seg_cols: np.ndarray
    seg_vals: np.ndarray | None
    flat_rows: np.ndarray
    flat_cols: np.ndarray
    flat_vals: np.ndarray | None
    sizes: Sizes
    layout: str

    @property
    def parts(self) -> tuple[tuple, tuple]:
        """(rows, cols, values) of the seg part and of the flat part."""
        return (self.seg_rows, self.seg_cols, self.seg_vals), (self.flat_rows, self.flat_cols, self.flat_vals)


def build_aligned_coo(indptr: np.ndarray, indices: np.ndarray, data: np.ndarray | None, layout: str,
                      index_dtype=np.int32) -> AlignedCoo:
    """The ALIGNED_COO layout of a CSR matrix (vectorised: a few passes over the entries), from NumPy
    arrays or, through :func:`build_aligned_coo_pieces`, CuPy arrays.

    Example (paper 004's Fig. 2 matrix, 0-based):
        >>> import scipy.sparse as sp
        >>> A = sp.csr_matrix(np.array([[0, 2, 0, 4, 5], [1, 0, 0, 0, 0], [0, 3, 6, 0, 0], [0, 7, 0, 8, 0],
        ...                             [0, 0, 0, 9, 0], [10, 0, 0, 0, 0]], dtype=np.float32))
        >>> f = build_aligned_coo(A.indptr, A.indices, A.data, "hybrid")
        >>> f.seg_rows.reshape(3, 4).tolist()  # segment by segment: lanes 0-3
        [[0, 1, 3, 5], [0, 2, 3, -1], [0, 2, 4, -1]]
        >>> f.seg_vals.reshape(3, 4).tolist()
        [[2.0, 1.0, 7.0, 10.0], [4.0, 3.0, 8.0, 0.0], [5.0, 6.0, 9.0, 0.0]]
    """
    if module(indices) is not np:  # on the device: a piece of the entries at a time
        return build_aligned_coo_pieces(indptr, indices, data, layout, index_dtype)
    indptr = np.asarray(indptr)
    lengths = np.diff(indptr).astype(np.int64)
    flat_len, _ = split_lengths(lengths, layout)
    geometry = sizes(lengths, layout)
    nnz = int(indptr[-1])
    rows = np.repeat(np.arange(lengths.size, dtype=index_dtype), lengths)
    # An entry is flat when its offset in its row is inside the row's flat head.
    offset = np.arange(nnz, dtype=np.int64) - np.repeat(indptr[:-1].astype(np.int64), lengths)
    is_flat = offset < np.repeat(flat_len, lengths)
    del offset
    parts = []
    for mask, slots, where in ((~is_flat, geometry.lanes * geometry.seg_len, _column_major(geometry)),
                               (is_flat, geometry.chunks * WARP, None)):
        parts.append(_padded(rows[mask], indices[mask].astype(index_dtype, copy=False),
                             None if data is None else data[mask], slots, where, index_dtype))
    (sr, sc, sv), (fr, fc, fv) = parts
    return AlignedCoo(sr, sc, sv, fr, fc, fv, geometry, layout)


PIECE = 1 << 24  # entries placed at once by :func:`build_aligned_coo_pieces`: bounds its work arrays


def build_aligned_coo_pieces(indptr, indices, data, layout: str, index_dtype=np.int32,
                             piece: int = PIECE) -> AlignedCoo:
    """:func:`build_aligned_coo` from CSR arrays of either module (NumPy or CuPy), as the GPU builds it:
    the same arrays, each entry's place found from its row (a search of the row pointers) and its offset in
    the row, ``piece`` entries at a time, so that the work beside the layout is a few arrays of one piece.

    Example (the matrix of :func:`build_aligned_coo`'s example, two entries at a time):
        >>> import scipy.sparse as sp
        >>> A = sp.csr_matrix(np.array([[0, 2, 0, 4, 5], [1, 0, 0, 0, 0], [0, 3, 6, 0, 0], [0, 7, 0, 8, 0],
        ...                             [0, 0, 0, 9, 0], [10, 0, 0, 0, 0]], dtype=np.float32))
        >>> f = build_aligned_coo_pieces(A.indptr, A.indices, A.data, "hybrid", piece=2)
        >>> f.seg_rows.reshape(3, 4).tolist()
        [[0, 1, 3, 5], [0, 2, 3, -1], [0, 2, 4, -1]]
    """
    xp = module(indices)
    starts = indptr[:-1].astype(np.int64)
    lengths = indptr[1:].astype(np.int64) - starts
    flat_len = {"hybrid": lengths - lengths % WARP, "seg": xp.zeros_like(lengths), "flat": lengths}.get(layout)
    if flat_len is None:
        raise ValueError(f"unknown ALIGNED_COO layout {layout!r}; known: {', '.join(LAYOUTS)}")
    seg_len_of = lengths - flat_len
    flat_start, seg_start = prefix(flat_len), prefix(seg_len_of)  # each row's first place in each part
    n_flat, n_seg = int(flat_start[-1]), int(seg_start[-1])
    seg_len = largest(seg_len_of) if n_seg else 0
    g = Sizes(seg_len, -(-n_seg // seg_len) if seg_len else 0, n_seg, n_flat)
    nnz = int(indptr[-1]) if indptr.size else 0

    seg_slots, flat_slots = g.lanes * g.seg_len, g.chunks * WARP  # padding: row and column -1, value 0
    seg_r, seg_c = xp.full(seg_slots, -1, index_dtype), xp.full(seg_slots, -1, index_dtype)
    flat_r, flat_c = xp.full(flat_slots, -1, index_dtype), xp.full(flat_slots, -1, index_dtype)
    seg_v = flat_v = None
    if data is not None:
        seg_v, flat_v = xp.zeros(seg_slots, data.dtype), xp.zeros(flat_slots, data.dtype)
    ends = indptr[1:]
    for lo in range(0, nnz, max(int(piece), 1)):
        hi = min(lo + int(piece), nnz)
        e = xp.arange(lo, hi, dtype=np.int64)
        row = xp.searchsorted(ends, e, side="right")
        offset = e - starts[row]
        flat = offset < flat_len[row]
        cols = indices[lo:hi].astype(index_dtype, copy=False)
        rows = row.astype(index_dtype)
        f = xp.flatnonzero(flat)
        at = flat_start[row[f]] + offset[f]
        flat_r[at], flat_c[at] = rows[f], cols[f]
        if data is not None:
            flat_v[at] = data[lo:hi][f]
        s = xp.flatnonzero(~flat)
        i = seg_start[row[s]] + offset[s] - flat_len[row[s]]  # the entry's number in the seg part
        at = (i % max(g.seg_len, 1)) * g.lanes + i // max(g.seg_len, 1)
        seg_r[at], seg_c[at] = rows[s], cols[s]
        if data is not None:
            seg_v[at] = data[lo:hi][s]
    return AlignedCoo(seg_r, seg_c, seg_v, flat_r, flat_c, flat_v, g, layout)


def aligned_coo_bytes(n_rows: int, nnz: int, index_bytes: int, value_bytes: int, piece: int = PIECE) -> int:
    """Device memory :func:`build_aligned_coo_pieces` needs for a matrix of ``n_rows`` rows and ``nnz``
    entries (value_bytes 0: a pattern matrix): the layout (a lane's and a warp's padding at most beyond the
    entries), six int64 arrays per row, and a piece's work (about 64 bytes an entry).

    Example:
        >>> aligned_coo_bytes(10, 100, 4, 4, piece=50)
        5696
    """
    layout = (nnz + 2 * WARP) * (2 * index_bytes + value_bytes)
    return layout + 6 * 8 * (n_rows + 1) + 64 * min(nnz, piece)


def _column_major(g: Sizes):
    """Storage position of the i-th seg entry: lane i // seg_len, slot i % seg_len, stored slot-major."""
    def where(i: np.ndarray) -> np.ndarray:
        return (i % g.seg_len) * g.lanes + i // g.seg_len
    return where


def _padded(rows, cols, vals, slots: int, where, index_dtype):
    """Entries placed into ``slots`` positions (``where``: entry number -> position; None: in order)."""
    out_r = np.full(slots, -1, dtype=index_dtype)
    out_c = np.full(slots, -1, dtype=index_dtype)
    out_v = None if vals is None else np.zeros(slots, dtype=vals.dtype)
    pos = slice(0, rows.size) if where is None else where(np.arange(rows.size, dtype=np.int64))
    out_r[pos], out_c[pos] = rows, cols
    if vals is not None:
        out_v[pos] = vals
    return out_r, out_c, out_v


def evaluate_aligned_coo(parts, x: np.ndarray, n_rows: int, pattern_value: float = 1.0) -> np.ndarray:
    """y = A x from the built (rows, cols, values) parts as the kernel reads them: y zeroed, every non-pad
    slot added to its row (values None: a pattern matrix of ``pattern_value``).

    Example:
        >>> f = build_aligned_coo(np.array([0, 2, 3]), np.array([0, 1, 1]), None, "seg")
        >>> evaluate_aligned_coo(f.parts, np.array([1.0, 2.0]), 2).tolist()
        [3.0, 2.0]
    """
    y = np.zeros(n_rows)
    for rows, cols, vals in parts:
        live = cols >= 0
        v = x[cols[live]].astype(np.float64)
        v = v * (pattern_value if vals is None else vals[live])
        y += np.bincount(rows[live].astype(np.int64), weights=v, minlength=n_rows)
    return y


FLAT_PIECE = 1 << 26  # entries whose rows are searched at once: bounds the int64 work array (512 MiB)


def build_flat(indptr, indices, data, index_dtype=np.int32) -> AlignedCoo:
    """The ``flat`` layout straight from CSR arrays of either module (NumPy or CuPy): the same arrays as
    ``build_aligned_coo(..., "flat")``, with each entry's row found by a search of the row pointers, a
    piece at a time, so that on the device the layout costs its own arrays and one bounded work array.

    Example (the matrix of :func:`build_aligned_coo`'s example):
        >>> import scipy.sparse as sp
        >>> A = sp.csr_matrix(np.array([[0, 2, 0, 4, 5], [1, 0, 0, 0, 0], [0, 3, 6, 0, 0], [0, 7, 0, 8, 0],
        ...                             [0, 0, 0, 9, 0], [10, 0, 0, 0, 0]], dtype=np.float32))
        >>> f = build_flat(A.indptr, A.indices, A.data)
        >>> f.flat_rows[:11].tolist(), f.flat_rows.size, f.sizes
        ([0, 0, 0, 1, 2, 2, 3, 3, 4, 5, -1], 32, Sizes(seg_len=0, lanes=0, n_seg=0, n_flat=10))
    """
    from .xp import module
    xp = module(indices)
    nnz = int(indptr[-1])
    slots = -(-nnz // WARP) * WARP
    ends = indptr[1:]
    rows = xp.full(slots, -1, dtype=index_dtype)
    for start in range(0, nnz, FLAT_PIECE):
        stop = min(start + FLAT_PIECE, nnz)
        rows[start:stop] = xp.searchsorted(ends, xp.arange(start, stop, dtype=ends.dtype), side="right")
    cols = xp.full(slots, -1, dtype=index_dtype)
    cols[:nnz] = indices[:nnz]
    vals = None
    if data is not None:
        vals = xp.zeros(slots, dtype=data.dtype)
        vals[:nnz] = data[:nnz]
    empty = xp.zeros(0, dtype=index_dtype)
    return AlignedCoo(empty, empty, None if data is None else xp.zeros(0, dtype=data.dtype), rows, cols, vals,
                      Sizes(0, 0, 0, nnz), "flat")


def flat_bytes(nnz: int, index_bytes: int, value_bytes: int) -> int:
    """Bytes of :func:`build_flat`'s arrays for ``nnz`` entries (value_bytes 0: a pattern matrix).

    Example:
        >>> flat_bytes(100, 4, 4)
        1536
    """
    return -(-nnz // WARP) * WARP * (2 * index_bytes + value_bytes)
