"""Sparse matrix times sparse matrix, C = A B, by lbGEMM's outer products (paper 000) and a CUB merge.

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
import time
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from . import codegen, gpu
from .cache import Cache
from .families.base import CTYPES
from .formats.wlt import WorkloadTable, workload_table
from .matrix import INT32_MAX, CanonicalMatrix, MatrixError, canonicalize, structure_digest
from .memory import check_fits


class DeviceMemoryError(MatrixError):
    """A product needs more device memory than is free; the message gives both figures."""


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
    if a.n_cols != b.n_rows:
        raise MatrixError(f"A has {a.n_cols} columns but B has {b.n_rows} rows: A B needs them equal")
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


class SpGEMM:
    """C = A B on the GPU for fixed structures of A and B; ``spgemm()`` returns C as SciPy CSR.

    ``spgemm(A2, B2)`` with matrices of the same structures (values may differ) multiplies those: only
    their values are uploaded. Build one with :func:`tuner.compile` ``(A, B)``. After a call, ``seconds``
    holds the wall seconds of its phases (allocate, expand, sort, reduce, csr, download), each closed by a
    synchronisation.
    """

    def __init__(self, a: CanonicalMatrix, b: CanonicalMatrix, params: OuterProductParams, cache: Cache):
        self.a, self.b, self.params = a, b, params
        self._digests: dict[str, str] = {}
        self._temp: int | None = None
        self.dtype = a.value_dtype
        self.ops = operands(a, b)
        self.shape = self.ops.shape
        self.table = workload_table(self.ops.a_colptr, self.ops.b_rowptr, params.block_size, params.split)
        self.value_free = self.ops.pattern_value is not None
        index = np.dtype(np.int64) if np.dtype(np.int64) in (a.index_dtype, b.index_dtype) else np.dtype(np.int32)
        self.index_dtype = index
        name = f"outer_{self.dtype.name}_{index.name}{'_pattern' if self.value_free else ''}"
        source = codegen.render("outer_product.cu.j2", dict(
            VAL=CTYPES[self.dtype], IDX=CTYPES[index], value_free=self.value_free, kernel_name=name,
            block_size=params.block_size, tile=params.tile))
        merge = codegen.render("cub_merge.cu.j2", dict(VAL=CTYPES[self.dtype], kernel_name=name))
        info = gpu.device_info()
        binary = codegen.compile_source(source, info.arch, cache=cache)
        self._merge_name = name
        self._library = gpu.Library(codegen.compile_library(merge, info.arch, cache=cache))
        v = "f" if self.dtype == np.float32 else "d"
        self._expand = gpu.Kernel(binary.cubin, name, "PPPPPPPPPPPq" + v)
        self._indptr = {32: self._expand.sibling(f"{name}_indptr32", "PqqqP"),
                        64: self._expand.sibling(f"{name}_indptr64", "PqqqP")}
        self._columns = {32: self._expand.sibling(f"{name}_columns32", "PqqP"),
                         64: self._expand.sibling(f"{name}_columns64", "PqqP")}
        t = self.table
        self._dev = {k: gpu.upload(np.ascontiguousarray(x)) for k, x in (
            ("pair", t.pair), ("a_start", t.a_start), ("a_stop", t.a_stop), ("offset", t.offset),
            ("a_rows", self.ops.a_rows.astype(index, copy=False)),
            ("b_rowptr", self.ops.b_rowptr), ("b_cols", self.ops.b_cols.astype(index, copy=False)))}
        self._set_values(self.ops.a_values, self.ops.b_values)

    def _set_values(self, a_values, b_values) -> None:
        for key, values in (("a_vals", a_values), ("b_vals", b_values)):
            self._dev[key] = None if values is None else gpu.upload(np.ascontiguousarray(values, self.dtype))

    def __call__(self, A=None, B=None, out: str = "scipy"):
        """C = A B: a SciPy CSR matrix (``out='scipy'``) or a :class:`DeviceCSR` left on the GPU
        (``out='device'``). ``A``/``B``: new values on the structures compiled for."""
        if out not in ("scipy", "device"):
            raise ValueError(f"out must be 'scipy' or 'device', got {out!r}")
        if A is not None or B is not None:
            self._new_values(A, B)
        c = self._multiply()
        return c if out == "device" else c.to_scipy(self)

    def _new_values(self, A, B) -> None:
        if self.value_free:
            raise MatrixError("this product was compiled for pattern matrices: compile again for new values")
        a = self._same_structure(A, self.a, "A") if A is not None else self.a
        b = self._same_structure(B, self.b, "B") if B is not None else self.b
        self._set_values(a.data[self.ops.a_order], b.data)

    def _same_structure(self, M, like: CanonicalMatrix, what: str) -> CanonicalMatrix:
        m = canonicalize(M, dtype=self.dtype, index_dtype=like.index_dtype)
        if what not in self._digests:  # the compiled structure's, hashed once
            self._digests[what] = structure_digest(like)
        if m.shape != like.shape or structure_digest(m) != self._digests[what]:
            raise MatrixError(f"{what} has another structure than the one compiled for: compile again")
        return m

    def _phase(self, name: str) -> None:
        """Close the running phase of a call: wait for the GPU, note its seconds in ``self.seconds``."""
        gpu.synchronize()
        now = time.perf_counter()
        self.seconds[name] = now - self._t
        self._t = now

    def _temp_bytes(self, n: ctypes.c_longlong, bits: int) -> int:
        """CUB's temporary storage for the sort and the reduction of this product's expansion (asked once: the
        count of products is fixed by the structures)."""
        if self._temp is None:
            sort_bytes, reduce_bytes = ctypes.c_size_t(0), ctypes.c_size_t(0)
            null = ctypes.c_void_p(0)
            self._library.call(f"{self._merge_name}_sort", null, ctypes.byref(sort_bytes), null, null, null, null, n,
                               ctypes.c_int(bits))
            self._library.call(f"{self._merge_name}_reduce", null, ctypes.byref(reduce_bytes), null, null, null,
                               null, null, n)
            self._temp = max(sort_bytes.value, reduce_bytes.value)
        return self._temp

    def _multiply(self) -> "DeviceCSR":
        self.seconds: dict[str, float] = {}
        self._t = time.perf_counter()
        p, t, n_rows, n_cols = self.params, self.table, *self.shape
        vs = self.dtype.itemsize
        if t.products == 0:
            index = np.int32 if n_cols <= INT32_MAX else np.int64
            indptr = gpu.device_vector(n_rows + 1, index)
            gpu.memset_bytes(int(indptr.gpudata), 0, indptr.nbytes)
            return DeviceCSR(indptr, gpu.device_vector(0, index), gpu.device_vector(0, self.dtype), self.shape)
        n = ctypes.c_longlong(t.products)
        bits = key_bits(self.shape)
        temp_bytes = self._temp_bytes(n, bits)
        need = device_bytes(t, self.ops, self.dtype, temp_bytes)
        free = gpu.free_memory()
        if need > free:  # the pool's unused blocks may make the difference
            free = gpu.free_memory(release_pool=True)
        if need > free:
            raise DeviceMemoryError(f"A B expands to {t.products:,} products: it needs {need:,} bytes of device "
                                    f"memory, {free:,} are free")
        keys_in, keys_out = gpu.alloc_pooled(8 * t.products), gpu.alloc_pooled(8 * t.products)
        vals_in, vals_out = gpu.alloc_pooled(vs * t.products), gpu.alloc_pooled(vs * t.products)
        temp, runs = gpu.alloc_pooled(temp_bytes), gpu.alloc_pooled(8)
        self._phase("allocate")
        d = self._dev
        pattern = self.ops.pattern_value if self.value_free else 1.0
        self._expand.launch(t.blocks, p.block_size, d["pair"], d["a_start"], d["a_stop"], d["offset"], d["a_rows"],
                            d["a_vals"] or 0, d["b_rowptr"], d["b_cols"], d["b_vals"] or 0, keys_in, vals_in,
                            np.int64(n_cols), self.dtype.type(pattern))
        self._phase("expand")
        ptr = lambda buf: ctypes.c_void_p(int(buf))  # noqa: E731
        self._library.call(f"{self._merge_name}_sort", ptr(temp), ctypes.byref(ctypes.c_size_t(temp_bytes)),
                           ptr(keys_in), ptr(keys_out), ptr(vals_in), ptr(vals_out), n, ctypes.c_int(bits))
        self._phase("sort")
        # The sorted pairs are reduced back into the first buffers: unique keys and their sums.
        self._library.call(f"{self._merge_name}_reduce", ptr(temp), ctypes.byref(ctypes.c_size_t(temp_bytes)),
                           ptr(keys_out), ptr(keys_in), ptr(vals_out), ptr(vals_in), ptr(runs), n)
        nnz_host = np.zeros(1, np.int64)
        gpu.copy_to_host(nnz_host, int(runs))
        nnz = int(nnz_host[0])
        self._phase("reduce")
        # CSR in arrays of its own size (the expansion's buffers hold every product), int32 where it fits,
        # allocated after the sort's second buffers went back to the pool, whose blocks they can reuse.
        del keys_out, vals_out, temp
        index = np.dtype(np.int32 if max(n_cols, nnz) <= INT32_MAX else np.int64)
        bits_out = 8 * index.itemsize
        if gpu.free_memory() < (n_rows + 1 + nnz) * index.itemsize + nnz * vs:
            gpu.free_memory(release_pool=True)  # the pool's blocks back to the driver: the output fits where they were
        indptr, cols, vals = (gpu.device_vector(n_rows + 1, index), gpu.device_vector(nnz, index),
                              gpu.device_vector(nnz, self.dtype))
        self._indptr[bits_out].launch(-(-(n_rows + 1) // 256), 256, keys_in, np.int64(nnz), np.int64(n_rows),
                                      np.int64(n_cols), indptr.gpudata)
        self._columns[bits_out].launch(-(-nnz // 256), 256, keys_in, np.int64(nnz), np.int64(n_cols), cols.gpudata)
        gpu.copy_device(int(vals.gpudata), int(vals_in), nnz * vs)
        self._phase("csr")
        return DeviceCSR(indptr, cols, vals, self.shape)


@dataclass(frozen=True)
class DeviceCSR:
    """C on the GPU as three PyCUDA GPUArrays, which CuPy and PyTorch take without a copy through
    ``__cuda_array_interface__`` (indices int32 when the columns and nnz fit, else int64).

    Example (on a GPU machine):
        >>> import cupy, cupyx.scipy.sparse as csp                                   # doctest: +SKIP
        >>> c = tuner.compile(A, A.T)(out="device")                                  # doctest: +SKIP
        >>> C = csp.csr_matrix((cupy.asarray(c.data), cupy.asarray(c.indices), cupy.asarray(c.indptr)),
        ...                    shape=c.shape)                                         # doctest: +SKIP
    """

    indptr: object
    indices: object
    data: object
    shape: tuple[int, int]

    @property
    def nnz(self) -> int:
        return int(self.data.shape[0])

    def to_scipy(self, timer=None) -> sp.csr_matrix:
        """The same matrix in host memory (``timer``: a :class:`SpGEMM` whose ``seconds`` gets 'download').

        Raises :class:`~tuner.memory.InsufficientMemoryError` before copying when host memory cannot hold it
        (the copies NumPy and SciPy hold at once: the arrays, and SciPy's checked copy of the indices).
        """
        arrays = (self.indptr, self.indices, self.data)
        need = sum(int(a.shape[0]) * np.dtype(a.dtype).itemsize for a in arrays) + self.indices.shape[0] * 8
        check_fits(need, f"C = A B ({self.shape[0]:,} x {self.shape[1]:,}, {self.nnz:,} entries) in host memory",
                   "its CSR arrays", hint="keep it on the GPU with out='device'")
        c = sp.csr_matrix((self.data.get(), self.indices.get(), self.indptr.get()), shape=self.shape)
        if timer is not None:
            timer._phase("download")
        return c


def compile_spgemm(A, B, *, dtype=None, tune: str = "model", params: OuterProductParams | None = None,
                   cache_dir=None) -> SpGEMM:
    """A callable computing C = A B on this GPU (B may be A, A.T or any matrix with A's column count as rows).

    Values are float32 or float64 (the wider of the operands', or ``dtype``); a pattern A times a pattern B
    runs value-free kernels whose entries count paths (times the product of the common values). One family
    (outer_product) with the geometry of ``params`` runs for now: nothing is tuned, so ``tune`` must be
    'model'.

    Example (on a GPU machine):
        >>> import scipy.sparse as sp, tuner                            # doctest: +SKIP
        >>> A = sp.random(300, 300, density=0.02, format="csr")         # doctest: +SKIP
        >>> C = tuner.compile(A, A.T)()                                 # doctest: +SKIP
        >>> abs(C - A @ A.T).max() < 1e-12                              # doctest: +SKIP
        True
    """
    if tune != "model":
        raise ValueError(f"SpGEMM has one kernel family and no tuning yet: tune must be 'model', got {tune!r}")
    a = canonicalize(A, dtype)
    b = canonicalize(B, dtype)
    wide = np.result_type(a.value_dtype, b.value_dtype) if dtype is None else np.dtype(dtype)
    index = np.result_type(a.index_dtype, b.index_dtype)
    a, b = canonicalize(a, wide, index), canonicalize(b, wide, index)
    gpu.device_info()  # raises NoDeviceError before any work that needs the GPU
    return SpGEMM(a, b, params or OuterProductParams(), Cache(cache_dir))
