"""The outer_product SpGEMM family: C = A B by lbGEMM's outer products (paper 000) and a CUB merge.

The host builds the workload table (:mod:`tuner.formats.wlt`: eq. 4, heaviest blocks first, long columns
split); the GPU expands every scalar product a_ik b_kj as a (row * n_cols + column) key and its value
(``templates/outer_product.cu.j2``), sorts the pairs by key and sums equal keys with CUB's device-wide radix
sort and reduction by key (``templates/cub_merge.cu.j2``, a shared library built by nvcc), and turns the
unique keys into CSR. Every count that can pass 2^31 (products, offsets, output entries) is 64-bit; a
product whose expansion does not fit in device memory is refused, before anything is allocated, with the
bytes it needs and those free.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp  # noqa: F401 - the examples use it

from .. import codegen, gpu
from ..cache import Cache
from ..families.base import CTYPES
from ..formats.wlt import WorkloadTable, workload_table
from ..matrix import INT32_MAX, CanonicalMatrix, MatrixError, canonicalize  # noqa: F401 - examples
from .base import DeviceCSR, Product, check_shapes, empty_product


@dataclass(frozen=True)
class OuterProductParams:
    """Geometry of the expansion kernel.

    Attributes:
        block_size: threads per block: eq. 4's ``#threads``, each taking entries of A's column slice.
        tile: entries of B's row staged in shared memory at a time.
        split: most entries of A's column one block takes (longer columns are split).
    """

    block_size: int = 256
    tile: int = 1024
    split: int = 4096


@dataclass(frozen=True)
class Operands:
    """A in CSC and B in CSR, as the expansion reads them.

    Attributes:
        a_colptr, a_rows, a_values: A by columns (values None for a pattern A).
        a_order: position in A's canonical CSR arrays of each CSC entry (new values are gathered through it).
        b_rowptr, b_cols, b_values: B by rows (values None for a pattern B).
        shape: (A's rows, B's columns).
        pattern_value: the product of both operands' common values when both are patterns, else None.
    """

    a_colptr: np.ndarray
    a_rows: np.ndarray
    a_values: np.ndarray | None
    a_order: np.ndarray
    b_rowptr: np.ndarray
    b_cols: np.ndarray
    b_values: np.ndarray | None
    shape: tuple[int, int]
    pattern_value: float | None


def operands(a: CanonicalMatrix, b: CanonicalMatrix) -> Operands:
    """A's CSC arrays (a stable sort of its CSR entries by column: rows stay ascending) and B's CSR arrays.

    Example:
        >>> a = canonicalize(sp.csr_matrix(np.array([[1.0, 2.0], [0.0, 3.0]])))
        >>> o = operands(a, a)
        >>> o.a_colptr.tolist(), o.a_rows.tolist(), o.a_values.tolist(), o.a_order.tolist()
        ([0, 1, 3], [0, 0, 1], [1.0, 2.0, 3.0], [0, 1, 2])
    """
    check_shapes(a, b)
    if a.n_rows * b.n_cols > 1 << 64:
        raise MatrixError(f"C would be {a.n_rows} x {b.n_cols}: its (row, column) keys need more than 64 bits")
    order = np.argsort(a.indices, kind="stable")
    rows = np.repeat(np.arange(a.n_rows, dtype=a.index_dtype), a.row_lengths)[order]
    colptr = np.zeros(a.n_cols + 1, dtype=np.int64)
    np.cumsum(a.col_lengths, out=colptr[1:])
    both = a.value_free and b.value_free
    return Operands(a_colptr=colptr, a_rows=rows, a_values=None if both else a.data[order], a_order=order,
                    b_rowptr=b.indptr.astype(np.int64), b_cols=b.indices,
                    b_values=None if both else b.data, shape=(a.n_rows, b.n_cols),
                    pattern_value=a.pattern_value * b.pattern_value if both else None)


PACK_ALIGN = 256  # bytes: where each array of a packed upload starts, as cudaMalloc aligns an allocation


@dataclass(frozen=True)
class Prepared:
    """What an outer product computes on the host before its uploads: the operands' arrays and the workload
    table (:func:`prepare`).

    Attributes:
        ops: :func:`operands` of the pair.
        table: the WLT of the pair for the product's block size and split.
    """

    ops: Operands
    table: WorkloadTable
    _uploads: dict = field(default_factory=dict, repr=False, compare=False)

    def _sources(self, index_dtype, dtype) -> dict:
        """name -> (the array an upload is made from, or None for a pattern's values; the type it goes up in)."""
        t, o = self.table, self.ops
        index, value = np.dtype(index_dtype), np.dtype(dtype)
        return {"pair": (t.pair, t.pair.dtype), "a_start": (t.a_start, t.a_start.dtype),
                "a_stop": (t.a_stop, t.a_stop.dtype), "offset": (t.offset, t.offset.dtype),
                "a_rows": (o.a_rows, index), "b_rowptr": (o.b_rowptr, o.b_rowptr.dtype), "b_cols": (o.b_cols, index),
                "a_vals": (o.a_values, value), "b_vals": (o.b_values, value)}

    def uploads(self, index_dtype, dtype) -> dict:
        """The arrays a product with these index and value types copies to the GPU, by name, each contiguous
        and in its type (values None for a pattern): made once.

        Example:
            >>> a = canonicalize(sp.csr_matrix(np.array([[1.0, 2.0], [0.0, 3.0]])))
            >>> u = prepare(a, a, OuterProductParams()).uploads(np.int32, np.float32)
            >>> u["a_rows"].dtype, u["a_vals"].tolist(), sorted(u)[:3]
            (dtype('int32'), [1.0, 2.0, 3.0], ['a_rows', 'a_start', 'a_stop'])
        """
        key = (np.dtype(index_dtype), np.dtype(dtype))
        if key not in self._uploads:
            self._uploads[key] = {k: None if x is None else np.ascontiguousarray(x, t)
                                  for k, (x, t) in self._sources(*key).items()}
        return self._uploads[key]

    def packed_offsets(self, index_dtype, dtype) -> tuple[dict, int]:
        """Where :meth:`packed` puts each upload (byte offsets by name, None for a pattern's values) and its
        size in bytes, without making it.

        Example:
            >>> a = canonicalize(sp.csr_matrix(np.array([[1.0, 2.0], [0.0, 3.0]])))
            >>> at, size = prepare(a, a, OuterProductParams()).packed_offsets(np.int32, np.float32)
            >>> at["pair"], at["a_vals"] is None, size   # 9 arrays of at most 256 bytes each
            (0, False, 2304)
        """
        offsets, end = {}, 0
        for k, (x, t) in self._sources(index_dtype, dtype).items():
            offsets[k] = None if x is None else end
            end += 0 if x is None else _aligned(x.size * np.dtype(t).itemsize)
        return offsets, end

    def packed(self, index_dtype, dtype) -> tuple[np.ndarray, dict]:
        """:meth:`uploads`' arrays side by side in one byte array, each from a multiple of :data:`PACK_ALIGN`
        bytes (:meth:`packed_offsets`), and each one's byte offset by name: made once, so that a pair
        multiplied at every call (a slotted page) is page-locked in one piece and goes up in one copy.

        Example:
            >>> a = canonicalize(sp.csr_matrix(np.array([[1.0, 2.0], [0.0, 3.0]])))
            >>> buf, at = prepare(a, a, OuterProductParams()).packed(np.int32, np.float32)
            >>> buf[at["a_vals"]:at["a_vals"] + 12].view(np.float32).tolist(), at["a_rows"] % PACK_ALIGN
            ([1.0, 2.0, 3.0], 0)
        """
        key = ("packed", np.dtype(index_dtype), np.dtype(dtype))
        if key not in self._uploads:
            offsets, size = self.packed_offsets(index_dtype, dtype)
            buf = np.zeros(size, np.uint8)
            for k, (x, t) in self._sources(index_dtype, dtype).items():
                if x is not None:
                    buf[offsets[k]:offsets[k] + x.size * np.dtype(t).itemsize].view(t)[:] = x.reshape(-1)
            self._uploads[key] = (buf, offsets)
        return self._uploads[key]


def _aligned(nbytes: int) -> int:
    return -(-int(nbytes) // PACK_ALIGN) * PACK_ALIGN


class Arena:
    """Device memory for the buffers of one step of a repeated product (a slotted page's expansion and sums,
    an assembly block's sums), carved front to back and taken again by the next step: the steps run one
    after another on one stream, so a step may reuse the last one's memory once its work is queued, and no
    step allocates (a pooled allocation costs the host microseconds, a hundred of them a call), nor does a
    CUDA graph captured over the steps name memory that may move.

    Example (on a GPU machine):
        >>> arena = Arena(Arena.need(1000, 4, 512))            # doctest: +SKIP
        >>> arena.step(); a = arena.take(8000); b = arena.take(4000); b - a   # doctest: +SKIP
        8192
    """

    def __init__(self, nbytes: int):
        self.nbytes = int(nbytes)
        self._memory = gpu.alloc_pooled(self.nbytes)
        self._base, self._at = int(self._memory), 0

    @staticmethod
    def need(pairs: int, value_bytes: int, temp_bytes: int) -> int:
        """Bytes a step of ``pairs`` (key, value) pairs takes: two pairs of buffers (the sort's in and out),
        CUB's ``temp_bytes`` and the count of unique keys, each from a multiple of :data:`PACK_ALIGN`.

        Example:
            >>> Arena.need(1000, 4, 512)   # 2 x (8,192 + 4,096) + 512 + 256
            25344
        """
        return 2 * (_aligned(8 * pairs) + _aligned(value_bytes * pairs)) + _aligned(temp_bytes) + _aligned(8)

    def step(self) -> None:
        """Start a step: its buffers from the front again."""
        self._at = 0

    def take(self, nbytes: int) -> int:
        """The device address of ``nbytes`` for this step."""
        at, self._at = self._at, self._at + _aligned(nbytes)
        if self._at > self.nbytes:
            raise ValueError(f"a step needs more than the arena's {self.nbytes:,} bytes")
        return self._base + at


def prepare(a: CanonicalMatrix, b: CanonicalMatrix, params: OuterProductParams) -> Prepared:
    """The host work of an outer product of ``a`` and ``b`` under ``params``, to make once for a pair that is
    multiplied again (a slotted page every call).

    Example:
        >>> a = canonicalize(sp.csr_matrix(np.array([[1.0, 2.0], [0.0, 3.0]])))
        >>> p = prepare(a, a, OuterProductParams())
        >>> p.ops.a_colptr.tolist(), int(p.table.pair.size)
        ([0, 1, 3], 2)
    """
    ops = operands(a, b)
    return Prepared(ops, workload_table(ops.a_colptr, ops.b_rowptr, params.block_size, params.split))


def key_bits(shape: tuple[int, int]) -> int:
    """Bits of the largest (row * n_cols + column) key: the radix sort sorts only those.

    Example:
        >>> key_bits((1000, 1000)), key_bits((1, 1))
        (20, 1)
    """
    return max(1, (shape[0] * shape[1] - 1).bit_length())


def device_bytes(table: WorkloadTable, ops: Operands, value_dtype: np.dtype, sort_temp: int = 0) -> int:
    """Device memory of one product: operands, table, the expanded keys and values twice (sort in and out),
    the row pointer and CUB's temporary storage.

    Example:
        >>> a = canonicalize(sp.eye(3, format="csr"))
        >>> o = operands(a, a); t = workload_table(o.a_colptr, o.b_rowptr, 256, 4096)
        >>> device_bytes(t, o, np.dtype(np.float64))  # 56 operands + 96 table + 2 x 3 x 16 products + 40
        288
    """
    vs = value_dtype.itemsize
    inputs = sum(x.nbytes for x in (ops.a_rows, ops.b_rowptr, ops.b_cols))
    inputs += sum(x.nbytes for x in (ops.a_values, ops.b_values) if x is not None)
    return int(inputs + 4 * 8 * table.blocks + 2 * table.products * (8 + vs) + 8 * (ops.shape[0] + 1) + 8
               + sort_temp)


def merge_name(dtype) -> str:
    """The merge library's name: it depends on the value type only (its keys are packed 64-bit (row,
    column) pairs), so that every outer product of one value type shares one nvcc build of CUB.

    Example:
        >>> merge_name(np.float32)
        'outer_merge_float32'
    """
    return f"outer_merge_{np.dtype(dtype).name}"


def merge_source(dtype) -> str:
    """The CUDA source of the merge library for values of ``dtype`` (CUB's radix sort and reduce by key)."""
    return codegen.render("cub_merge.cu.j2", dict(VAL=CTYPES[np.dtype(dtype)], kernel_name=merge_name(dtype)))


def library_sources() -> list[str]:
    """Every library an outer product may load: one per value type.

    Example:
        >>> len(library_sources())
        2
    """
    return [merge_source(d) for d in (np.float32, np.float64)]


def index_dtype(a: CanonicalMatrix, b: CanonicalMatrix) -> np.dtype:
    """The kernels' index type: int64 where either operand has int64 indices, else int32."""
    return np.dtype(np.int64) if np.dtype(np.int64) in (a.index_dtype, b.index_dtype) else np.dtype(np.int32)


def kernel_name(dtype, index, value_free: bool) -> str:
    """The kernels' name prefix for these value and index types (value-free or not)."""
    return f"outer_{np.dtype(dtype).name}_{np.dtype(index).name}{'_pattern' if value_free else ''}"


def kernel_source(a: CanonicalMatrix, b: CanonicalMatrix, params: OuterProductParams, limit: int = 0) -> str:
    """The CUDA source :class:`OuterProduct` compiles for A B with ``params`` (``limit``, the shared bytes of a
    block, does not shape it): rendering it needs no device, so candidates can be compiled ahead.

    Example:
        >>> import scipy.sparse as sp
        >>> from tuner.matrix import canonicalize
        >>> a = canonicalize(sp.random(20, 20, density=0.2, format="csr", dtype="float64", random_state=0))
        >>> "outer_float64_int32_indptr32" in kernel_source(a, a, OuterProductParams())
        True
    """
    dtype, value_free, index = a.value_dtype, a.value_free and b.value_free, index_dtype(a, b)
    return codegen.render("outer_product.cu.j2", dict(
        VAL=CTYPES[dtype], IDX=CTYPES[index], value_free=value_free, kernel_name=kernel_name(dtype, index, value_free),
        block_size=params.block_size, tile=params.tile))


class OuterProduct(Product):
    """C = A B by outer products (a :class:`~tuner.spgemm.base.Product`); a call's ``seconds`` has the phases
    allocate, expand, sort, reduce, csr (and download)."""

    family = "outer_product"

    def __init__(self, a: CanonicalMatrix, b: CanonicalMatrix, params: OuterProductParams, cache: Cache,
                 prepared: Prepared | None = None, pinned: bool = False):
        super().__init__(a, b, params)
        self._temp: dict = {}  # CUB's temporary bytes by (pairs, key bits): the same for every pair rebound
        self.index_dtype = index = index_dtype(a, b)
        name = kernel_name(self.dtype, index, self.value_free)
        info = gpu.device_info()
        binary = codegen.compile_source(kernel_source(a, b, params), info.arch, cache=cache)
        self._merge_name = merge_name(self.dtype)
        self._library = gpu.Library(codegen.compile_library(merge_source(self.dtype), info.arch, cache=cache))
        v = "f" if self.dtype == np.float32 else "d"
        self._expand = gpu.Kernel(binary.cubin, name, "PPPPPPPPPPPq" + v)
        self._indptr = {32: self._expand.sibling(f"{name}_indptr32", "PqqqqP"),
                        64: self._expand.sibling(f"{name}_indptr64", "PqqqqP")}
        self._columns = {32: self._expand.sibling(f"{name}_columns32", "PqqP"),
                         64: self._expand.sibling(f"{name}_columns64", "PqqP")}
        self._bind(a, b, prepared, pinned)

    def rebind(self, a: CanonicalMatrix, b: CanonicalMatrix, prepared: Prepared | None = None,
               pinned: bool = False, into: int | None = None, stream: gpu.Stream | None = None) -> None:
        """Multiply another pair from now on with the kernels already loaded: the same value and index types,
        value-free or not, and C of the same shape (a slotted page's operands, say). ``prepared``: the pair's
        :func:`prepare` made once for calls that come back to it (no host work but the uploads); ``pinned``:
        its :meth:`Prepared.packed` uploads are page-locked and stay unchanged (one copy, queued on
        ``stream`` or the default stream, not waited for), into the device memory at ``into`` (room for
        them, held by the caller) where given, else into new memory from the pool."""
        same = (a.value_dtype == self.dtype and a.value_free == b.value_free == self.value_free
                and (a.n_rows, b.n_cols) == self.shape and index_dtype(a, b) == self.index_dtype)
        if not same:
            raise MatrixError("rebind needs operands of the compiled types and C's shape: compile them instead")
        Product.__init__(self, a, b, self.params)
        self._bind(a, b, prepared, pinned, into, stream)

    def release(self) -> None:
        """Give the operands' device copies back to the pool, the kernels staying loaded for a later
        :meth:`rebind` (a slotted product keeps its pages' kernels from one call to the next)."""
        self._dev, self._packed = {}, None

    def _bind(self, a: CanonicalMatrix, b: CanonicalMatrix, prepared: Prepared | None = None,
              pinned: bool = False, into: int | None = None, stream: gpu.Stream | None = None) -> None:
        """The operands' CSC and CSR arrays, the workload table, and their uploads: where ``pinned``, the
        packed arrays (:meth:`Prepared.packed`, page-locked) in one queued copy (into ``into`` where given,
        on ``stream`` where given), else one copy each."""
        prepared = prepared or prepare(a, b, self.params)
        self.ops, self.table = prepared.ops, prepared.table
        self._packed = None  # the packed upload's device memory, which the pointers of _dev lie in
        if pinned:
            buf, offsets = prepared.packed(self.index_dtype, self.dtype)
            if into is None:
                self._packed = gpu.alloc_pooled(buf.nbytes)
            base = int(self._packed) if into is None else int(into)
            gpu.copy_to_device(base, buf, queued=True, stream=stream)
            self._dev = {k: None if at is None else base + at for k, at in offsets.items()}
        else:
            self._dev = {k: None if x is None else gpu.upload_pooled(x)
                         for k, x in prepared.uploads(self.index_dtype, self.dtype).items()}

    def _upload_values(self, a_values, b_values) -> None:
        for key, values in (("a_vals", a_values), ("b_vals", b_values)):
            self._dev[key] = None if values is None else gpu.upload_pooled(np.ascontiguousarray(values, self.dtype))

    def _set_values(self, a: CanonicalMatrix, b: CanonicalMatrix) -> None:
        self._upload_values(a.data[self.ops.a_order], b.data)

    def _temp_bytes(self, n: ctypes.c_longlong, bits: int) -> int:
        """CUB's temporary storage for the sort and the reduction of ``n`` pairs (asked once per count: the
        expansion's is fixed by the structures, an assembly block's by its slices)."""
        key = (n.value, bits)
        if key not in self._temp:
            sort_bytes, reduce_bytes = ctypes.c_size_t(0), ctypes.c_size_t(0)
            null = ctypes.c_void_p(0)
            self._library.call(f"{self._merge_name}_sort", null, ctypes.byref(sort_bytes), null, null, null, null, n,
                               ctypes.c_int(bits), ctypes.byref(ctypes.c_int(0)), null)
            self._library.call(f"{self._merge_name}_reduce", null, ctypes.byref(reduce_bytes), null, null, null,
                               null, null, n, null)
            self._temp[key] = max(sort_bytes.value, reduce_bytes.value)
        return self._temp[key]

    def _sorted_sums(self, n: ctypes.c_longlong, keys_in, vals_in, count: bool = True, arena: Arena | None = None,
                     stream: gpu.Stream | None = None):
        """Sort ``n`` (key, value) pairs in ``keys_in``/``vals_in`` by key and sum each key's values: (the
        unique keys' count, the key and value buffers holding the keys and sums, and the other two, free
        once the sums are made). The buffers are the given ones and a second pair of the same size (from
        ``arena`` where given, else the pool): the sums go to whichever the sort did not end in. Without
        ``count`` (a caller that knows it from the structure), the count is None and nothing waits for the
        device. ``stream``: where the work is queued (default: the legacy default stream), counts aside."""
        vs, bits = self.dtype.itemsize, key_bits(self.shape)
        if stream is not None and count:
            raise ValueError("the count of unique keys is read on the default stream: pass count=False")
        handle = ctypes.c_void_p(stream.handle if stream is not None else None)
        temp_bytes = self._temp_bytes(n, bits)
        alloc = arena.take if arena is not None else gpu.alloc_pooled
        keys_alt, vals_alt = alloc(8 * n.value), alloc(vs * n.value)
        temp, runs = alloc(temp_bytes), alloc(8)
        ptr = lambda buf: ctypes.c_void_p(int(buf))  # noqa: E731
        selector = ctypes.c_int(0)
        self._library.call(f"{self._merge_name}_sort", ptr(temp), ctypes.byref(ctypes.c_size_t(temp_bytes)),
                           ptr(keys_in), ptr(keys_alt), ptr(vals_in), ptr(vals_alt), n, ctypes.c_int(bits),
                           ctypes.byref(selector), handle)
        self._phase("sort")
        # The sorted pairs are reduced into the other pair of buffers: unique keys and their sums.
        pairs = [(keys_in, vals_in), (keys_alt, vals_alt)]
        (keys_sorted, vals_sorted), (keys, vals) = pairs[selector.value], pairs[1 - selector.value]
        self._library.call(f"{self._merge_name}_reduce", ptr(temp), ctypes.byref(ctypes.c_size_t(temp_bytes)),
                           ptr(keys_sorted), ptr(keys), ptr(vals_sorted), ptr(vals), ptr(runs), n, handle)
        if not count:
            self._phase("reduce")
            return None, keys, vals, keys_sorted, vals_sorted
        nnz_host = np.zeros(1, np.int64)
        gpu.copy_to_host(nnz_host, int(runs))
        self._phase("reduce")
        return int(nnz_host[0]), keys, vals, keys_sorted, vals_sorted

    def _expanded(self, count: bool = True, arena: Arena | None = None, stream: gpu.Stream | None = None):
        """The expansion of every product, sorted and summed by key on the device: (keys, values, nnz) in
        buffers of every product's size (from ``arena`` where given: a step of its own, the memory already
        held); None where there are no products. Without ``count``, nnz is None and nothing waits for the
        device (:meth:`_sorted_sums`); ``stream`` as there."""
        p, t, n_cols = self.params, self.table, self.shape[1]
        vs = self.dtype.itemsize
        if t.products == 0:
            return None
        n = ctypes.c_longlong(t.products)
        if arena is None:
            need = device_bytes(t, self.ops, self.dtype, self._temp_bytes(n, key_bits(self.shape)))
            self._ensure_free(need, f"A B expands to {t.products:,} products")
            keys_in, vals_in = gpu.alloc_pooled(8 * t.products), gpu.alloc_pooled(vs * t.products)
        else:
            arena.step()
            keys_in, vals_in = arena.take(8 * t.products), arena.take(vs * t.products)
        self._phase("allocate")
        d = self._dev
        self._expand.launch(t.blocks, p.block_size, d["pair"], d["a_start"], d["a_stop"], d["offset"], d["a_rows"],
                            d["a_vals"] or 0, d["b_rowptr"], d["b_cols"], d["b_vals"] or 0, keys_in, vals_in,
                            np.int64(n_cols), self.dtype.type(self.pattern_value), stream=stream)
        self._phase("expand")
        nnz, keys, vals, _, _ = self._sorted_sums(n, keys_in, vals_in, count, arena, stream)
        return keys, vals, nnz

    def pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """C's distinct keys (row * n_cols + column), ascending, and their values, in host memory: a slotted
        page's partial product as :mod:`tuner.spgemm.assemble` sums them.

        Example (on a GPU machine):
            >>> keys, values = OuterProduct(a, b, OuterProductParams(), cache).pairs()   # doctest: +SKIP
        """
        out = self._expanded()
        if out is None:
            return np.zeros(0, np.uint64), np.zeros(0, self.dtype)
        keys, vals, nnz = out
        return (gpu.download(gpu.device_vector(nnz, np.uint64, keys)),
                gpu.download(gpu.device_vector(nnz, self.dtype, vals)))

    def _slices_up(self, keys: list[np.ndarray], values: list[np.ndarray], total: int, pinned: bool,
                   arena: Arena | None = None, stream: gpu.Stream | None = None):
        """A block's slices of every page's keys and values, one after another in two new device buffers
        of ``total`` pairs (from ``arena`` where given; queued copies, on ``stream`` where given, where
        ``pinned``: see :meth:`merge_block`)."""
        vs = self.dtype.itemsize
        alloc = arena.take if arena is not None else gpu.alloc_pooled
        keys_in, vals_in = alloc(8 * total), alloc(vs * total)
        at = 0
        for k, v in zip(keys, values):
            gpu.copy_to_device(int(keys_in) + 8 * at, k, queued=pinned, stream=stream)
            gpu.copy_to_device(int(vals_in) + vs * at, v, queued=pinned, stream=stream)
            at += int(k.size)
        return keys_in, vals_in

    def pair_values(self, pieces, arena: Arena | None = None, stream: gpu.Stream | None = None) -> None:
        """:meth:`pairs`' values alone, where C's entries are known from an earlier call of the same
        structures (whose keys these sums follow), in pieces: each ``(host address, first entry, entries)``
        of ``pieces`` takes that many values from C's entry ``first`` on, into page-locked host memory that
        stays alive and unread until the work is done (a slotted page's sums go to each row block's place in
        a block-major store). ``arena``: as :meth:`_expanded` takes it. Everything is queued (on ``stream``,
        else the default stream: :func:`tuner.gpu.queue_downloads`) and nothing waits for the device."""
        out = self._expanded(count=False, arena=arena, stream=stream)
        vs = self.dtype.itemsize
        if out is None:
            if any(count for _, _, count in pieces):
                raise ValueError("pieces take entries of C, which has none")
            return
        gpu.queue_downloads(int(out[1]), [(host, vs * first, vs * count) for host, first, count in pieces], stream)

    def merge_values(self, keys: list[np.ndarray], values: list[np.ndarray], arena: Arena | None = None,
                     stream: gpu.Stream | None = None) -> int | None:
        """:meth:`merge_block`'s values alone, where the block's structure is known from an earlier call: the
        slices (page-locked, unchanged until the work is done) are queued up, sorted and summed (in a step
        of ``arena`` where given; on ``stream`` where given, else the default stream), and the device
        address of the sums, in key order, is returned (None for no slices): the caller queues their copy
        before the arena's next step takes the memory again. Nothing waits for the device."""
        total = sum(int(k.size) for k in keys)
        if total == 0:
            return None
        if arena is not None:
            arena.step()
        keys_in, vals_in = self._slices_up(keys, values, total, pinned=True, arena=arena, stream=stream)
        _, _, sums, _, _ = self._sorted_sums(ctypes.c_longlong(total), keys_in, vals_in, count=False, arena=arena,
                                             stream=stream)
        return int(sums)

    def merge_block(self, keys: list[np.ndarray], values: list[np.ndarray], r0: int, r1: int, cols_out: np.ndarray,
                    vals_out: np.ndarray) -> tuple[np.ndarray, int]:
        """The sum of the pairs of C's rows [r0, r1) that ``keys`` and ``values`` hold (a slice of each page's
        :meth:`pairs`), on the device by the same sort, reduction and CSR kernels, as
        :func:`~tuner.spgemm.assemble.assemble` merges a block: its columns and values copied into the front
        of ``cols_out`` and ``vals_out`` (whose dtypes they take) before this returns; (row starts relative to
        the block, entries)."""
        n_cols, rows = self.shape[1], r1 - r0
        total = sum(int(k.size) for k in keys)
        if total == 0:
            return np.zeros(rows, np.int64), 0
        vs = self.dtype.itemsize
        keys_in, vals_in = self._slices_up(keys, values, total, pinned=False)
        nnz, keys_in, vals_in, spare_keys, spare_vals = self._sorted_sums(ctypes.c_longlong(total), keys_in, vals_in)
        index = cols_out.dtype
        bits_out = 8 * index.itemsize
        # C's columns (at most 8 bytes an entry) in the sorted keys' buffer, its row starts in the sorted values'
        # where they fit: a block holds its pairs twice and nothing more.
        cols = gpu.device_vector(nnz, index, spare_keys)
        fits = (rows + 1) * index.itemsize <= total * vs
        indptr = gpu.device_vector(rows + 1, index, spare_vals if fits else None)
        self._indptr[bits_out].launch(-(-(rows + 1) // 256), 256, keys_in, np.int64(nnz), np.int64(r0),
                                      np.int64(rows), np.int64(n_cols), indptr.gpudata)
        self._columns[bits_out].launch(-(-nnz // 256), 256, keys_in, np.int64(nnz), np.int64(n_cols), cols.gpudata)
        gpu.download(cols, out=cols_out[:nnz])
        gpu.download(gpu.device_vector(nnz, self.dtype, vals_in), out=vals_out[:nnz])
        return gpu.download(indptr)[:rows], nnz

    def _multiply(self) -> DeviceCSR:
        n_rows, n_cols = self.shape
        vs = self.dtype.itemsize
        out = self._expanded()
        if out is None:
            return empty_product(self.shape, self.dtype)
        keys_in, vals_in, nnz = out
        # CSR in arrays of its own size (the expansion's buffers hold every product), int32 where it fits,
        # allocated after the sort's second buffers went back to the pool, whose blocks they can reuse.
        index = np.dtype(np.int32 if max(n_cols, nnz) <= INT32_MAX else np.int64)
        bits_out = 8 * index.itemsize
        if gpu.free_memory() < (n_rows + 1 + nnz) * index.itemsize + nnz * vs:
            gpu.free_memory(release_pool=True)  # the pool's blocks back to the driver: the output fits where they were
        indptr, cols, vals = (gpu.device_vector(n_rows + 1, index), gpu.device_vector(nnz, index),
                              gpu.device_vector(nnz, self.dtype))
        self._indptr[bits_out].launch(-(-(n_rows + 1) // 256), 256, keys_in, np.int64(nnz), np.int64(0),
                                      np.int64(n_rows), np.int64(n_cols), indptr.gpudata)
        self._columns[bits_out].launch(-(-nnz // 256), 256, keys_in, np.int64(nnz), np.int64(n_cols), cols.gpudata)
        gpu.copy_device(int(vals.gpudata), int(vals_in), nnz * vs)
        self._phase("csr")
        return DeviceCSR(indptr, cols, vals, self.shape)
