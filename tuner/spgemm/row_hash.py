"""The row_hash SpGEMM family: Gustavson's algorithm with hash accumulators, rows binned by table size.

The symbolic phase (once per pair of structures: the first call runs it) counts each row's distinct columns
in tables sized by its products, binned on the host (:mod:`tuner.formats.row_bins`); a CUB scan makes C's
row pointer and the rows are binned again on the device by those exact counts. Every call then runs the
numeric phase into tables sized by the counts and sorts each row's columns with CUB's segmented sort
(``templates/row_hash.cu.j2``, ``templates/cub_rows.cu.j2``). Rows too large for the biggest shared-memory
table use tables of their own in global memory; rows that fill a fair share of C's columns use dense
accumulators in shared memory, span by span of columns, which need no sort
(:func:`~tuner.formats.row_bins.dense_from`).
"""
from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass

import numpy as np

from .. import codegen, gpu
from ..cache import Cache
from ..families.base import CTYPES
from ..formats.row_bins import RowBins, bin_rows, caps, dense_from, row_products, split_rows, table_size
from ..matrix import INT32_MAX, CanonicalMatrix
from .base import DeviceCSR, Product, empty_product


@dataclass(frozen=True)
class RowHashParams:
    """Geometry of the row_hash kernels.

    Attributes:
        lanes: threads that walk one row of B together (an entry of A's row each group of them).
        tables: shared-memory table sizes (slots, powers of two) the bins may use; those that do not fit the
            device's shared memory per block are dropped per phase.
        slots_per_thread: a row with a table of T slots gets T / slots_per_thread threads (8 to 1024).
        block: threads of a block of small rows (several rows to a block).
        symbolic_load: most products per slot in the symbolic phase (products bound the distinct columns).
        numeric_load: most entries per slot in the numeric phase (sized by the exact count).
        global_block: threads of a block building part of a row in a global-memory table.
        global_item: products a block of a global-memory row takes in the symbolic phase (heavy rows are
            split among blocks). The numeric phase keeps a block per row: its every insert adds to a value,
            and blocks of one row would contend for the same hot entries in L2.
        sort_max: rows of numeric tables up to this many slots are sorted in shared memory; larger ones (and
            global rows) by CUB's segmented sort.
        dense_ratio, dense_min: a row takes a dense accumulator when its count (products in the symbolic
            phase, entries in the numeric one) is at least ``dense_min`` and at least C's columns over
            ``dense_ratio`` (:func:`~tuner.formats.row_bins.dense_from`; ratio 0: never).
        dense_block: threads of a dense row's block.
        dense_bytes: shared memory of a dense row's block: its span of columns is as wide as this holds (a bit
            per column, and a value per column in the numeric phase).
        dense_lanes: threads that walk one B row together in dense rows (a warp or part of one).
        dense_entries: with several spans, where each B row resumes is kept in shared memory for this many
            entries of A's row (16 bytes each, taken from ``dense_bytes``); later entries keep it in global
            memory.
        streams: CUDA streams the shared bins of a phase are spread over, so that the small bins run side by
            side rather than one after another.
    """

    lanes: int = 32
    tables: tuple[int, ...] = (32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
    slots_per_thread: int = 4
    block: int = 256
    symbolic_load: float = 1.0
    numeric_load: float = 0.5
    global_block: int = 1024
    global_item: int = 65536
    sort_max: int = 2048
    dense_ratio: float = 64.0
    dense_min: int = 1024
    dense_block: int = 512
    dense_bytes: int = 49152
    dense_lanes: int = 32
    dense_entries: int = 256
    streams: int = 4


@dataclass(frozen=True)
class BinGeometry:
    """One shared bin's launch: ``table`` slots per row, ``group`` threads per row, ``rows_per_block``."""

    table: int
    group: int
    rows_per_block: int

    @property
    def threads(self) -> int:
        return self.group * self.rows_per_block


def geometry(params: RowHashParams, slot_bytes: int, shared_limit: int) -> tuple[BinGeometry, ...]:
    """The shared bins of one phase: each table of ``params.tables`` whose rows fit ``shared_limit`` bytes.

    Example:
        >>> [(g.table, g.group, g.rows_per_block) for g in geometry(RowHashParams(tables=(32, 4096, 65536)), 4,
        ...                                                           49152)]
        [(32, 8, 32), (4096, 1024, 1)]
    """
    out = []
    for t in params.tables:
        group = int(min(1024, max(8, t // params.slots_per_thread)))
        rows = max(1, params.block // group)
        if rows * t * slot_bytes <= shared_limit:
            out.append(BinGeometry(int(t), group, rows))
    return tuple(out)


def dense_widths(params: RowHashParams, value_bytes: int, shared_limit: int) -> dict[str, int]:
    """Columns of a dense row's span in each phase: a bit each in the symbolic phase, a bit and a value in the
    numeric one, within ``params.dense_bytes`` (at most ``shared_limit``), a multiple of 1024 columns.

    Example:
        >>> dense_widths(RowHashParams(), 4, 116736)
        {'symbolic': 359424, 'numeric': 10240}
    """
    # Less the resume positions of dense_entries entries, and 16 bytes for each of the two 16-byte alignments.
    room = min(int(params.dense_bytes), int(shared_limit)) - 16 * int(params.dense_entries) - 32
    return {"symbolic": max(1024, room * 8 // 1024 * 1024),
            "numeric": max(1024, int(room / (value_bytes + 0.125)) // 1024 * 1024)}


def dense_shared_bytes(phase: str, width: int, n_cols: int, value_bytes: int, entries: int) -> int:
    """Dynamic shared memory of a dense block: the span's bitmap, then (numeric phase) its values, each
    16-byte aligned, then with several spans the resume positions of ``entries`` entries; a span is as wide
    as C when C has fewer columns than ``width``.

    Example:
        >>> dense_shared_bytes("numeric", 10240, 1000, 4, 256), dense_shared_bytes("symbolic", 1024, 4096, 4, 256)
        (4128, 4224)
    """
    span = min(int(width), int(n_cols))
    up = lambda n: -(-n // 16) * 16  # noqa: E731
    return (up(-(-span // 32) * 4) + (up(span * value_bytes) if phase == "numeric" else 0)
            + (16 * int(entries) if n_cols > width else 0))


NO_SPLIT = 1 << 62  # products per item that keep a row in one block


def shared_limit(shared_bytes_per_block: int, shared_bytes_per_sm: int) -> int:
    """Most shared memory a bin's block takes: what a block may ask for, and at most half an SM's, so that two
    blocks share an SM and one's inserts overlap the other's barrier-bound clearing and writing out.

    Example:
        >>> shared_limit(232448, 233472)
        116736
    """
    return min(int(shared_bytes_per_block), int(shared_bytes_per_sm) // 2 or int(shared_bytes_per_block))


HOPPER_SHARED_BYTES = (232448, 233472)  # a block's opt-in maximum and an SM's shared memory on sm_90


def profile_shared_limit(profile) -> int:
    """:func:`shared_limit` of the GPU a profile describes (its constants where recorded, else sm_90's), for
    planning without that GPU.

    Example:
        >>> profile_shared_limit(None)
        116736
    """
    c = profile.constants if profile is not None else {}
    return shared_limit(c.get("shared_bytes_per_block", HOPPER_SHARED_BYTES[0]),
                        c.get("shared_bytes_per_sm", HOPPER_SHARED_BYTES[1]))


def helpers_name(dtype, col_dtype) -> str:
    """The helper library's name: it depends on the value and column types only, so that every row_hash
    product of those types (patterns too) shares one nvcc build of CUB.

    Example:
        >>> helpers_name(np.float32, np.int64)
        'row_hash_helpers_float32_int64'
    """
    return f"row_hash_helpers_{np.dtype(dtype).name}_{np.dtype(col_dtype).name}"


def helpers_source(dtype, col_dtype) -> str:
    """The CUDA source of the helper library (CUB's scan and segmented sort) for these types."""
    return codegen.render("cub_rows.cu.j2", dict(VAL=CTYPES[np.dtype(dtype)], KEY=CTYPES[np.dtype(col_dtype)],
                                                 kernel_name=helpers_name(dtype, col_dtype)))


def library_sources() -> list[str]:
    """Every library a row_hash product may load: one per value type and column width.

    Example:
        >>> len(library_sources())
        4
    """
    return [helpers_source(d, k) for d in (np.float32, np.float64) for k in (np.int32, np.int64)]


def column_dtype(n_cols: int) -> np.dtype:
    """C's column index type: int32 where every column fits, else int64."""
    return np.dtype(np.int32 if n_cols <= INT32_MAX else np.int64)


def kernel_name(dtype, col_dtype, value_free: bool) -> str:
    """The kernels' name prefix for these value and column types (value-free or not)."""
    return f"row_hash_{np.dtype(dtype).name}_{np.dtype(col_dtype).name}{'_pattern' if value_free else ''}"


def kernel_source(a: CanonicalMatrix, b: CanonicalMatrix, params: RowHashParams, limit: int) -> str:
    """The CUDA source :class:`RowHash` compiles for A B with ``params`` (``limit``: the shared bytes a block
    may use, :func:`shared_limit`): rendering it needs no device, so candidates can be compiled ahead.

    Example:
        >>> import scipy.sparse as sp
        >>> from tuner.matrix import canonicalize
        >>> a = canonicalize(sp.random(20, 20, density=0.2, format="csr", dtype="float32", random_state=0))
        >>> "row_hash_float32_int32_numeric_global" in kernel_source(a, a, RowHashParams(), 232448)
        True
    """
    dtype, value_free = a.value_dtype, a.value_free and b.value_free
    col = column_dtype(b.n_cols)
    ks, vs = col.itemsize, dtype.itemsize
    return codegen.render("row_hash.cu.j2", dict(
        VAL=CTYPES[dtype], KEY=CTYPES[col], value_free=value_free, kernel_name=kernel_name(dtype, col, value_free),
        lanes=params.lanes, symbolic_bins=geometry(params, ks, limit), numeric_bins=geometry(params, ks + vs, limit),
        global_block=params.global_block, sort_max=params.sort_max, dense_block=params.dense_block,
        dense_widths=dense_widths(params, vs, limit), dense_lanes=params.dense_lanes,
        dense_entries=params.dense_entries))


class RowHash(Product):
    """C = A B by hashed rows (a :class:`~tuner.spgemm.base.Product`); a call's ``seconds`` has the phases
    symbolic_shared, symbolic_global, symbolic_dense, symbolic_rest (first call only), allocate, numeric_shared,
    numeric_global, numeric_dense, sort, csr (and download)."""

    family = "row_hash"

    def __init__(self, a: CanonicalMatrix, b: CanonicalMatrix, params: RowHashParams, cache: Cache):
        super().__init__(a, b, params)
        n_cols = self.shape[1]
        self.col_dtype = column_dtype(n_cols)
        info = gpu.device_info()
        ks, vs = self.col_dtype.itemsize, self.dtype.itemsize
        limit = shared_limit(info.shared_bytes_per_block, info.shared_bytes_per_sm)
        self.symbolic_bins = geometry(params, ks, limit)
        self.numeric_bins = geometry(params, ks + vs, limit)
        self.dense_widths = dense_widths(params, vs, limit)
        self.dense_from = dense_from(n_cols, params.dense_ratio, params.dense_min)
        self.products = row_products(a.indptr, a.indices, b.indptr)
        self._total_products = int(self.products.sum())
        self._a_indptr = np.asarray(a.indptr, np.int64)  # split_rows' offsets, converted once, not every call
        self.symbolic_layout: RowBins = bin_rows(self.products, tuple(g.table for g in self.symbolic_bins),
                                                 params.symbolic_load, n_cols, self.dense_from)
        name = kernel_name(self.dtype, self.col_dtype, self.value_free)
        binary = codegen.compile_source(kernel_source(a, b, params, limit), info.arch, cache=cache)
        self._library = gpu.Library(codegen.compile_library(helpers_source(self.dtype, self.col_dtype), info.arch,
                                                            cache=cache))
        self._helpers = helpers_name(self.dtype, self.col_dtype)
        v = "f" if self.dtype == np.float32 else "d"
        first = gpu.Kernel(binary.cubin, f"{name}_bin", "PqPiqPPPPi")
        self._bin = first
        self._shared = {(phase, g.table): first.sibling(f"{name}_{phase}{g.table}", "PqPPPPPP" + v + "PPPP")
                        for phase, bins in (("symbolic", self.symbolic_bins), ("numeric", self.numeric_bins))
                        for g in bins}
        self._global = {phase: first.sibling(f"{name}_{phase}_global", "PqPPPPPP" + v + "PPPPPPP")
                        for phase in ("symbolic", "numeric")}
        self._dense = {phase: first.sibling(f"{name}_{phase}_dense", "PqPPPPPP" + v + "qPPPPP")
                       for phase in ("symbolic", "numeric")}
        self._segments = first.sibling(f"{name}_segments", "PqPPP")
        self._flush = first.sibling(f"{name}_flush_global", "PPPPPPP")
        self._narrow = first.sibling(f"{name}_narrow", "PqP")
        self._widen = first.sibling(f"{name}_widen", "PqP")
        col = self.col_dtype
        self._dev = {k: gpu.upload(np.ascontiguousarray(x)) for k, x in (
            ("a_ptr", a.indptr.astype(np.int64)), ("a_cols", a.indices.astype(col, copy=False)),
            ("b_ptr", b.indptr.astype(np.int64)), ("b_cols", b.indices.astype(col, copy=False)),
            ("sym_rows", self.symbolic_layout.rows), ("sym_offsets", self.symbolic_layout.global_offsets))}
        lay = self.symbolic_layout
        self._sym_items = self._upload_items(lay.global_rows, params.global_item)
        self._numeric_caps = gpu.upload(caps(tuple(g.table for g in self.numeric_bins), params.numeric_load))
        self._set_values(a, b)
        self._structure = None
        entry = ks + (0 if self.value_free else vs)
        self.operand_bytes = int(8 * (a.n_rows + b.n_rows + 2) + (a.nnz + b.nnz) * entry
                                 + 8 * (lay.rows.size + lay.global_offsets.size)
                                 + 24 * (a.n_rows + 1)  # with C's row pointer and the numeric bins
                                 + (4 * a.nnz if n_cols > self.dense_widths["numeric"] else 0))  # dense cursors
        self._streams = None
        self._cursor = None  # a dense span's start in each B row an entry of A names, when C has several spans

    def _set_values(self, a: CanonicalMatrix, b: CanonicalMatrix) -> None:
        for key, m in (("a_vals", a), ("b_vals", b)):
            self._dev[key] = None if self.value_free else gpu.upload(np.ascontiguousarray(m.data, self.dtype))

    def _upload_items(self, rows: np.ndarray, per_item: int) -> dict:
        """The global-memory rows ``rows`` cut into blocks' items (:func:`~tuner.formats.row_bins.split_rows`);
        none (no copies, whose waits a small product would feel) where there are no such rows."""
        if not len(rows):
            return dict(n=0, slot=0, begin=0, end=0)
        slot, begin, end = split_rows(rows, self._a_indptr, self.products, per_item)
        up = gpu.upload_pooled
        return dict(n=int(slot.size), slot=up(slot), begin=up(begin), end=up(end))

    def _global_launch(self, phase: str, rows: int, items: dict, offsets, pool_keys, pool_vals, row_nnz) -> None:
        self._global[phase].launch(items["n"], self.params.global_block, np.uint64(rows), np.int64(0),
                                   *self._operands(), items["slot"], items["begin"], items["end"], offsets,
                                   pool_keys, pool_vals, row_nnz)

    def _stream(self, b: int):
        """The stream of shared bin ``b``: blocking streams, so that the default stream's next work waits for
        every bin (and the bins for its earlier work) with no events."""
        if self.params.streams <= 1:
            return None
        if self._streams is None:
            self._streams = [gpu.Stream() for _ in range(self.params.streams)]
        return self._streams[b % len(self._streams)]

    def _dense_launch(self, phase: str, rows: int, n: int, row_nnz, c_ptr, cols, vals) -> None:
        """The dense rows ``rows`` (a device pointer to ``n`` row indices) of ``phase``, a block each."""
        if not n:
            return
        n_cols, width = self.shape[1], self.dense_widths[phase]
        cursor = 0
        if n_cols > width:  # several spans: each resumes B's rows where the last stopped
            if self._cursor is None:
                self._cursor = gpu.alloc(4 * self.a.nnz)
            cursor = self._cursor
        self._dense[phase].launch(n, self.params.dense_block, np.uint64(rows), np.int64(n), *self._operands(),
                                  np.int64(n_cols), cursor, row_nnz, c_ptr, cols, vals,
                                  shared=dense_shared_bytes(phase, width, n_cols, self.dtype.itemsize,
                                                            self.params.dense_entries))

    def _operands(self):
        d = self._dev
        return (d["a_ptr"], d["a_cols"], d["a_vals"] or 0, d["b_ptr"], d["b_cols"], d["b_vals"] or 0,
                self.dtype.type(self.pattern_value))

    def _helper_bytes(self, name: str, *args) -> int:
        size = ctypes.c_size_t(0)
        self._library.call(f"{self._helpers}_{name}", ctypes.c_void_p(0), ctypes.byref(size), *args)
        return size.value

    def symbolic(self) -> None:
        """Size C: count every row's entries, build the row pointer and the numeric phase's bins. The first call
        runs it; call it again to time a whole product (symbolic and numeric) as a fresh pair would take.
        Its phases (symbolic_shared, symbolic_global, symbolic_dense, symbolic_rest) start ``seconds`` afresh."""
        if self.timed:
            gpu.synchronize()
        self.seconds = {}
        self._t = time.perf_counter()
        n_rows, n_cols = self.shape
        lay, ks = self.symbolic_layout, self.col_dtype.itemsize
        pool_slots = int(lay.global_offsets[-1])
        null = ctypes.c_void_p(0)
        scan_bytes = self._helper_bytes("scan", null, null, ctypes.c_longlong(n_rows + 1))
        self._ensure_free(16 * (n_rows + 1) + pool_slots * ks + scan_bytes + 16 * n_rows,
                          f"sizing C = A B ({n_rows:,} rows, {self._total_products:,} products)")
        row_nnz, indptr = gpu.alloc_pooled(8 * (n_rows + 1)), gpu.alloc_pooled(8 * (n_rows + 1))
        gpu.zero_async(int(row_nnz), 8 * (n_rows + 1))
        pool = gpu.alloc_pooled(pool_slots * ks)
        if pool_slots:
            gpu.memset_bytes(int(pool), 0xFF, pool_slots * ks)  # EMPTY (-1) in every slot
        ops = self._operands()
        for b, g in enumerate(self.symbolic_bins):
            n = int(lay.starts[b + 1] - lay.starts[b])
            rows = int(self._dev["sym_rows"]) + 8 * int(lay.starts[b])
            self._shared["symbolic", g.table].launch(-(-n // g.rows_per_block), g.threads, np.uint64(rows),
                                                     np.int64(n), *ops, row_nnz, 0, 0, 0,
                                                     shared=g.rows_per_block * g.table * ks, stream=self._stream(b))
        self._phase("symbolic_shared")
        g = len(self.symbolic_bins)
        self._global_launch("symbolic", int(self._dev["sym_rows"]) + 8 * int(lay.starts[g]), self._sym_items,
                            self._dev["sym_offsets"], pool, 0, row_nnz)
        self._phase("symbolic_global")
        self._dense_launch("symbolic", int(self._dev["sym_rows"]) + 8 * int(lay.starts[g + 1]),
                           int(lay.starts[g + 2] - lay.starts[g + 1]), row_nnz, 0, 0, 0)
        self._phase("symbolic_dense")
        temp = gpu.alloc_pooled(scan_bytes)
        self._library.call(f"{self._helpers}_scan", ctypes.c_void_p(int(temp)), ctypes.byref(ctypes.c_size_t(scan_bytes)),
                           ctypes.c_void_p(int(row_nnz)), ctypes.c_void_p(int(indptr)), ctypes.c_longlong(n_rows + 1))
        total = np.zeros(1, np.int64)
        gpu.copy_to_host(total, int(indptr) + 8 * n_rows)
        del pool, temp
        self._c_ptr = indptr
        self._structure = dict(nnz=int(total[0]), indptr=indptr, **self._numeric_bins(row_nnz))
        self._phase("symbolic_rest")

    def _numeric_bins(self, row_nnz) -> dict:
        """The numeric phase's bins, made on the device from the exact row sizes (the kernel ``bin``: a count
        pass, then a placing pass); the few global-bin rows get their tables' offsets from the host."""
        n_rows, n_cols = self.shape
        tables = tuple(g.table for g in self.numeric_bins)
        n_bins = len(tables) + 2  # the shared bins, the global bin, the dense bin
        caps_dev = self._numeric_caps
        cursor = gpu.alloc_pooled(8 * n_bins)
        rows, counts = gpu.alloc_pooled(8 * n_rows), gpu.alloc_pooled(8 * n_rows)
        grid = -(-n_rows // 256)
        gpu.zero_async(int(cursor), 8 * n_bins)
        dense = np.int64(self.dense_from)
        self._bin.launch(grid, 256, row_nnz, np.int64(n_rows), caps_dev, np.int32(len(tables)), dense, cursor, 0, 0,
                         0, np.int32(1))
        sizes = np.zeros(n_bins, np.int64)
        gpu.copy_to_host(sizes, int(cursor))
        starts = np.zeros(n_bins + 1, np.int64)
        np.cumsum(sizes, out=starts[1:])
        starts_dev = gpu.upload_pooled(starts)
        gpu.zero_async(int(cursor), 8 * n_bins)
        self._bin.launch(grid, 256, row_nnz, np.int64(n_rows), caps_dev, np.int32(len(tables)), dense, cursor,
                         starts_dev, rows, counts, np.int32(0))
        g = len(tables)
        glob_counts, glob_rows = np.zeros(int(sizes[g]), np.int64), np.zeros(int(sizes[g]), np.int64)
        if glob_rows.size:  # each copy waits for the GPU: none where no row needs a global table
            gpu.copy_to_host(glob_counts, int(counts) + 8 * int(starts[g]))
            gpu.copy_to_host(glob_rows, int(rows) + 8 * int(starts[g]))
        slots = table_size(glob_counts, self.params.numeric_load, n_cols)
        offsets = np.zeros(slots.size + 1, np.int64)
        np.cumsum(slots, out=offsets[1:])
        # Rows CUB sorts: those of the bins past sort_max and the global bin, contiguous before the dense bin.
        first = sum(t <= self.params.sort_max for t in tables)
        n_sorted = int(starts[g + 1] - starts[first])
        begin, end = gpu.alloc_pooled(8 * n_sorted), gpu.alloc_pooled(8 * n_sorted)
        self._segments.launch(-(-n_sorted // 256), 256, int(rows) + 8 * int(starts[first]), np.int64(n_sorted),
                              self._c_ptr, begin, end)
        return dict(rows=rows, starts=starts, global_offsets=gpu.upload_pooled(offsets) if glob_rows.size else 0,
                    pool_slots=int(offsets[-1]),
                    n_sorted=n_sorted, begin=begin, end=end, items=self._upload_items(glob_rows, NO_SPLIT),
                    n_global=int(glob_rows.size))

    def _multiply(self) -> DeviceCSR:
        if self._structure is None:
            self.symbolic()
        s, (n_rows, n_cols) = self._structure, self.shape
        nnz = s["nnz"]
        if nnz == 0:
            return empty_product(self.shape, self.dtype)
        ks, vs = self.col_dtype.itemsize, self.dtype.itemsize
        null, n_sorted = ctypes.c_void_p(0), s["n_sorted"]
        sort_bytes = self._helper_bytes("sort_rows", null, null, null, null, ctypes.c_longlong(nnz),
                                        ctypes.c_longlong(n_sorted), null, null) if n_sorted else 0
        index = np.dtype(np.int32 if max(n_cols, nnz) <= INT32_MAX else np.int64)
        out_bytes = nnz * (ks + vs) + (n_rows + 1) * index.itemsize + (nnz * 8 if index != self.col_dtype else 0)
        tmp_bytes = nnz * (ks + vs) if n_sorted else 0
        self._ensure_free(tmp_bytes + s["pool_slots"] * (ks + vs) + sort_bytes + out_bytes,
                          f"C = A B ({nnz:,} entries)")
        cols, vals = gpu.device_vector(nnz, self.col_dtype), gpu.device_vector(nnz, self.dtype)
        # Rows sorted by CUB are written to these first (at their places in C) and sorted into C.
        tmp_cols, tmp_vals = (gpu.alloc_pooled(nnz * ks), gpu.alloc_pooled(nnz * vs)) if n_sorted else (0, 0)
        pool_keys, pool_vals = gpu.alloc_pooled(s["pool_slots"] * ks), gpu.alloc_pooled(s["pool_slots"] * vs)
        if s["n_global"]:
            gpu.memset_bytes(int(pool_keys), 0xFF, s["pool_slots"] * ks)  # EMPTY (-1) in every slot
            gpu.memset_bytes(int(pool_vals), 0, s["pool_slots"] * vs)
        self._phase("allocate")
        ops = self._operands()
        for b, g in enumerate(self.numeric_bins):
            n = int(s["starts"][b + 1] - s["starts"][b])
            rows = int(s["rows"]) + 8 * int(s["starts"][b])
            out = (cols.gpudata, vals.gpudata) if g.table <= self.params.sort_max else (tmp_cols, tmp_vals)
            self._shared["numeric", g.table].launch(-(-n // g.rows_per_block), g.threads, np.uint64(rows),
                                                    np.int64(n), *ops, 0, s["indptr"], *out,
                                                    shared=g.rows_per_block * g.table * (ks + vs),
                                                    stream=self._stream(b))
        self._phase("numeric_shared")
        if s["n_global"]:
            glob = int(s["rows"]) + 8 * int(s["starts"][len(self.numeric_bins)])
            self._global_launch("numeric", glob, s["items"], s["global_offsets"], pool_keys, pool_vals, 0)
            self._flush.launch(s["n_global"], 256, np.uint64(glob), s["global_offsets"], pool_keys, pool_vals,
                               s["indptr"], tmp_cols, tmp_vals)
        self._phase("numeric_global")
        d = len(self.numeric_bins) + 1
        self._dense_launch("numeric", int(s["rows"]) + 8 * int(s["starts"][d]),
                           int(s["starts"][d + 1] - s["starts"][d]), 0, s["indptr"], cols.gpudata, vals.gpudata)
        self._phase("numeric_dense")
        del pool_keys, pool_vals
        if n_sorted:
            temp = gpu.alloc_pooled(sort_bytes)
            p = lambda buf: ctypes.c_void_p(int(buf))  # noqa: E731
            self._library.call(f"{self._helpers}_sort_rows", p(temp), ctypes.byref(ctypes.c_size_t(sort_bytes)),
                               p(tmp_cols), p(cols.gpudata), p(tmp_vals), p(vals.gpudata), ctypes.c_longlong(nnz),
                               ctypes.c_longlong(n_sorted), p(s["begin"]), p(s["end"]))
            del temp, tmp_cols, tmp_vals
        self._phase("sort")
        grid = lambda n: -(-n // 256)  # noqa: E731
        indptr = gpu.device_vector(n_rows + 1, index)
        if index == np.int32:
            self._narrow.launch(grid(n_rows + 1), 256, s["indptr"], np.int64(n_rows + 1), indptr.gpudata)
        else:
            gpu.copy_device(int(indptr.gpudata), int(s["indptr"]), 8 * (n_rows + 1))
        if index != self.col_dtype:  # entries past 2^31 in columns that fit 32 bits
            wide = gpu.device_vector(nnz, index)
            self._widen.launch(grid(nnz), 256, cols.gpudata, np.int64(nnz), wide.gpudata)
            cols = wide
        self._phase("csr")
        return DeviceCSR(indptr, cols, vals, self.shape)
