"""SpMV over a matrix that does not fit the device (or a device-memory budget): row partitions streamed from
page-locked host memory every product (paper 002, section V).

The vectors and the row pointers stay on the device; the column indices and values of the matrix stay on
the host, page-locked in place (registered with the driver, no copy). A product cuts the rows into parts of
at most ``slot_entries`` entries (balanced by non-zeros: every part full but the last) and sends each part
into one of ``slots`` device buffers through a CUDA stream of its own: while one part crosses PCIe, the
kernels of the parts before it run, so a product takes about its bytes over the host-to-device bandwidth.
The first parts of the next product cross as soon as this one's kernels are done with their slots, while
the caller works on the result.
The kernel of a part is the ``csr_vector`` family on the slice (its row pointers and y at the part's first
row, its indices and values through a pointer moved back by the part's first entry, so the slice is read
with the matrix's own row pointers): row by row, so a part's rows come out exactly as the whole matrix's
would, and a product streamed in any number of parts equals the product in one, bit for bit. The kernel is
far faster than PCIe feeds it (it reads device memory at terabytes a second, the copies come at tens of
gigabytes), so no tuning of it would show.

A budget too small for the vectors, the row pointers and one slot per stream holding the longest row is
refused with the sizes it would need.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import codegen, families, gpu
from .families.base import Specialization
from .families.csr_vector import CsrVectorParams
from .kernel import SIGNATURE_CODES, VectorCalls
from .matrix import CanonicalMatrix

# Device buffers (and streams): a part's copy queues behind the kernel of the part that used its slot
# before, so the slots in flight must cover a kernel and the latency from its end to the dependent copy's
# start. With two, the copy engine idles between parts; parts of a few megabytes (168 us of PCIe each)
# still leave it idle with three, and four keep it busy while costing larger parts nothing.
SLOTS = 4
BLOCK = 256
# The matrix fits in memory when its CSR, a tuned layout of about the same size, the relabelling's work on
# it and the vectors do: three times the CSR, as an upload, a layout and its build's temporaries.
IN_MEMORY_FACTOR = 3


_ADDRESSES = 1 << 64


class DeviceBudgetError(MemoryError):
    """A device-memory budget too small for even one part of a streamed product."""


@dataclass(frozen=True)
class StreamPlan:
    """How a product is streamed through a device-memory budget.

    Attributes:
        budget_bytes: device memory the product may hold.
        resident_bytes: x, y and the row pointers, on the device while the product lives.
        slot_entries: entries one slot holds (their indices and values).
        slots: slots, one CUDA stream each.
        row_cuts: each part's first row, then the number of rows (parts + 1 values).
        entry_cuts: the row pointers at ``row_cuts``: each part's first entry, then nnz.
        streamed_bytes: bytes that cross PCIe each product (every entry's index and value).
        matrix_bytes: the matrix's CSR (streamed bytes and row pointers).
        threads_per_row: the kernel's lanes per row.
        reason: why the product is streamed.
    """

    budget_bytes: int
    resident_bytes: int
    slot_entries: int
    slots: int
    row_cuts: np.ndarray
    entry_cuts: np.ndarray
    streamed_bytes: int
    matrix_bytes: int
    threads_per_row: int
    reason: str

    @property
    def parts(self) -> int:
        return self.row_cuts.size - 1

    def describe(self) -> str:
        return (f"streamed: {self.reason}; {self.parts} part(s) of up to {self.slot_entries:,} entries through "
                f"{self.slots} slots, {self.streamed_bytes:,} bytes over PCIe a product, "
                f"{self.resident_bytes:,} bytes resident (x, y, row pointers); csr_vector, "
                f"{self.threads_per_row} lanes a row")


def entry_bytes(m: CanonicalMatrix) -> int:
    """Bytes one entry takes: its column index and (unless the matrix is a pattern) its value."""
    return m.index_dtype.itemsize + (0 if m.value_free else m.value_dtype.itemsize)


def csr_bytes(m: CanonicalMatrix) -> int:
    """The matrix's CSR: every entry's index and value, and the row pointers.

    Example:
        >>> import scipy.sparse as sp; from tuner.matrix import canonicalize
        >>> csr_bytes(canonicalize(sp.random(10, 10, density=0.5, format="csr", dtype="float32", random_state=0)))
        444
    """
    return m.nnz * entry_bytes(m) + (m.n_rows + 1) * m.index_dtype.itemsize


def resident_bytes(m: CanonicalMatrix) -> int:
    """x, y and the row pointers: what a streamed product keeps on the device."""
    return (m.n_rows + m.n_cols) * m.value_dtype.itemsize + (m.n_rows + 1) * m.index_dtype.itemsize


def fits_in_memory(m: CanonicalMatrix, budget: int) -> bool:
    """Whether ``m`` is multiplied in device memory within ``budget`` bytes (``IN_MEMORY_FACTOR`` times its CSR
    and the vectors), rather than streamed.

    Example (10,000 entries of float32: 80 kB of indices and values):
        >>> import scipy.sparse as sp; from tuner.matrix import canonicalize
        >>> m = canonicalize(sp.random(1000, 1000, density=0.01, format="csr", dtype="float32", random_state=0))
        >>> fits_in_memory(m, 10**6), fits_in_memory(m, 100_000)
        (True, False)
    """
    return IN_MEMORY_FACTOR * csr_bytes(m) + (m.n_rows + m.n_cols) * m.value_dtype.itemsize <= budget


def lanes_per_row(mean_length: float) -> int:
    """csr_vector's lanes a row for rows of this mean length: the power of two that covers it, at most a
    warp (Bell and Garland's rule: a group as wide as a typical row keeps its lanes busy).

    Example:
        >>> lanes_per_row(0.5), lanes_per_row(3), lanes_per_row(15.6), lanes_per_row(900)
        (1, 4, 16, 32)
    """
    lanes = 1
    while lanes < 32 and lanes < mean_length:
        lanes *= 2
    return lanes


def stream_plan(m: CanonicalMatrix, budget: int, slots: int = SLOTS, reason: str = "") -> StreamPlan:
    """The parts of ``m`` for a budget of ``budget`` bytes: what stays resident, the slots' size, and row cuts
    that fill every slot but the last one's (greedily, in row order).

    Example (rows of 0, 1, ..., 9 entries; float32 values and int32 indices are 8 bytes an entry):
        >>> import scipy.sparse as sp; from tuner.matrix import canonicalize
        >>> m = canonicalize(sp.csr_matrix(np.tril(np.arange(1.0, 101.0, dtype=np.float32).reshape(10, 10), -1)))
        >>> p = stream_plan(m, resident_bytes(m) + 3 * 8 * 12, slots=3)
        >>> p.slot_entries, p.row_cuts.tolist(), p.entry_cuts.tolist()
        (12, [0, 5, 7, 8, 9, 10], [0, 10, 21, 28, 36, 45])
    """
    if slots < 1:
        raise ValueError(f"slots must be at least 1, got {slots}")
    resident = resident_bytes(m)
    per_entry = entry_bytes(m)
    slot_entries = max(0, (int(budget) - resident) // (slots * per_entry))
    longest = int(m.row_lengths.max()) if m.n_rows else 0
    if slot_entries < max(longest, 1):
        need = resident + slots * per_entry * max(longest, 1)
        raise DeviceBudgetError(
            f"a device-memory budget of {int(budget):,} bytes is too small to stream this {m.n_rows:,} x "
            f"{m.n_cols:,} matrix: x, y and the row pointers take {resident:,} bytes, and each of {slots} slots "
            f"must hold its longest row ({longest:,} entries, {longest * per_entry:,} bytes); it needs at least "
            f"{need:,} bytes")
    indptr = np.asarray(m.indptr, dtype=np.int64)
    cuts = [0]
    while cuts[-1] < m.n_rows:  # one step a part: parts are few (a slot holds millions of entries)
        r = cuts[-1]
        end = int(np.searchsorted(indptr, indptr[r] + slot_entries, side="right")) - 1
        cuts.append(min(max(end, r + 1), m.n_rows))
    row_cuts = np.array(cuts, dtype=np.int64)
    return StreamPlan(budget_bytes=int(budget), resident_bytes=resident, slot_entries=int(slot_entries),
                      slots=slots, row_cuts=row_cuts, entry_cuts=indptr[row_cuts],
                      streamed_bytes=m.nnz * per_entry, matrix_bytes=csr_bytes(m),
                      threads_per_row=lanes_per_row(m.nnz / max(m.n_rows, 1)), reason=reason)


def stream_spec(m: CanonicalMatrix, threads_per_row: int) -> Specialization:
    """The kernel a part runs: csr_vector in the caller's order."""
    return Specialization("csr_vector", CsrVectorParams(threads_per_row, BLOCK, "none"), m.value_dtype,
                          m.index_dtype, m.value_free)


class StreamedSpMV(VectorCalls):
    """y = A @ x with A's entries streamed from page-locked host memory each product (see the module
    docstring). Called like :class:`~tuner.kernel.SpMV`: NumPy vectors (copied in and out) or contiguous
    device vectors (used in place), ``out=`` a preallocated result.

    Attributes:
        shape, dtype: of the matrix.
        plan: the :class:`StreamPlan`.
        spec: the kernel of every part.

    Example (on a GPU machine):
        >>> spmv = tuner.compile(A, device_memory_limit="2G")   # A too large for 2 GB  # doctest: +SKIP
        >>> print(spmv.explain()); y = spmv(x)                                          # doctest: +SKIP
    """

    def __init__(self, m: CanonicalMatrix, plan: StreamPlan, arch: str, cache=None):
        self.shape, self.dtype, self.plan = m.shape, m.value_dtype, plan
        self.spec = stream_spec(m, plan.threads_per_row)
        binary = codegen.compile_source(families.render(self.spec, m), arch, cache=cache)
        arrays = 2 if m.value_free else 3
        self._kernel = gpu.Kernel(binary.cubin, self.spec.kernel_name,
                                  "P" * (arrays + 2) + "q" + SIGNATURE_CODES[self.dtype])
        self._pattern = self.dtype.type(m.pattern_value if m.value_free else 1.0)
        self._index_bytes = m.index_dtype.itemsize
        self._value_bytes = 0 if m.value_free else m.value_dtype.itemsize
        # Held while the product lives: the host arrays stay page-locked, the device buffers allocated.
        self._pinned = [gpu.Pinned(m.indices[:m.nnz])] + ([] if m.value_free else [gpu.Pinned(m.data[:m.nnz])])
        self._indices = self._pinned[0].array
        self._data = None if m.value_free else self._pinned[1].array
        self._indptr = gpu.upload(np.ascontiguousarray(m.indptr))
        self._x_buf = gpu.alloc(m.n_cols * self.dtype.itemsize)
        self._y_buf = gpu.alloc(m.n_rows * self.dtype.itemsize)
        slot = plan.slot_entries
        self._slots = [(gpu.alloc(slot * self._index_bytes),
                        gpu.alloc(slot * self._value_bytes) if self._value_bytes else None)
                       for _ in range(plan.slots)]
        # The slots' streams order with nothing (non-blocking): a part's copy waits only for the kernel that
        # used its slot before, not for the caller's work on the default stream; a part's kernel waits for
        # that work (x, and y's readers) through an event. The default stream waits for the kernels through
        # the join stream, a blocking one, which waits for them (PyCUDA has no wait on the default stream).
        self._streams = [gpu.Stream(blocking=False) for _ in range(plan.slots)]
        self._join = gpu.Stream()
        # Parts already in their slots when a product starts: the first ones, sent after the previous
        # product's kernels (the matrix never changes), so that the copy engine keeps busy while the caller
        # works on a result (a PageRank's update and test between its products).
        self._prefetched = 0

    def launch(self, x_ptr: int, y_ptr: int) -> None:
        """Queue one product on device pointers (no checks): every part's copy, then its kernel, each part
        on the stream of its slot; then the copies of the next product's first parts."""
        p = self.plan
        ready = gpu.default_event()
        for k in range(p.parts):
            s = k % p.slots
            stream = self._streams[s]
            if k >= self._prefetched:
                self._send(k)
            if k < p.slots:
                stream.wait(ready)
            r0, r1 = int(p.row_cuts[k]), int(p.row_cuts[k + 1])
            grid = -(-(r1 - r0) * p.threads_per_row // BLOCK)
            self._kernel.launch(grid, BLOCK, *self._part_args(k), np.uintp(x_ptr),
                                np.uintp(y_ptr + r0 * self.dtype.itemsize), np.int64(r1 - r0), self._pattern,
                                stream=stream)
        for stream in self._streams[:p.parts]:
            self._join.wait(stream.record())
        # Work on the default stream waits for the blocking streams' (the join's waits); an event recorded
        # there now makes every blocking stream's later work, which waits only for the default stream's, wait
        # for them too (a staged copy of y runs on a blocking stream of its own).
        gpu.default_event()
        if p.parts > p.slots:  # (where every part has a slot of its own, each product still sends them all)
            for k in range(p.slots):
                self._send(k)
            self._prefetched = p.slots

    def __del__(self):
        # The next product's first parts may still be crossing from the page-locked pages into the slots:
        # neither is let go before they have.
        for stream in getattr(self, "_streams", ()):
            try:
                stream.synchronize()
            except Exception:  # noqa: BLE001 - interpreter shutdown: the context is gone, and the copies with it
                pass

    def _send(self, k: int) -> None:
        """Queue part ``k``'s copy into its slot on the slot's stream."""
        p = self.plan
        s = k % p.slots
        stream, (idx, val) = self._streams[s], self._slots[s]
        e0, e1 = int(p.entry_cuts[k]), int(p.entry_cuts[k + 1])
        stream.copy_to_device(int(idx), self._indices[e0:e1])
        if val is not None:
            stream.copy_to_device(int(val), self._data[e0:e1])

    def _part_args(self, k: int) -> list:
        """Part ``k``'s row pointers and its slot's pointers moved back by the part's first entry, in the GPU's
        64-bit arithmetic (it wraps; the kernel only ever adds the part's own entries back)."""
        p = self.plan
        ib, vb = self._index_bytes, self._value_bytes
        idx, val = self._slots[k % p.slots]
        r0, e0 = int(p.row_cuts[k]), int(p.entry_cuts[k])
        args = [np.uintp(int(self._indptr) + r0 * ib), np.uintp((int(idx) - e0 * ib) % _ADDRESSES)]
        if val is not None:
            args.append(np.uintp((int(val) - e0 * vb) % _ADDRESSES))
        return args

    def wait(self, timeout: float | None = None) -> "StreamedSpMV":
        """This product (nothing is tuned in the background)."""
        return self

    def explain(self) -> str:
        return self.plan.describe()

    def time(self, repeats: int = 10, warmup: int = 2, seed: int = 0) -> float:
        """Median milliseconds of one product (every part's copy and kernel), CUDA events, random x."""
        from .kernel import random_vector
        gpu.copy_to_device(int(self._x_buf), random_vector(self.shape[1], self.dtype, seed))
        return float(np.median(gpu.time_launches(lambda: self.launch(int(self._x_buf), int(self._y_buf)),
                                                 repeats, warmup, queued=False)))

    def __repr__(self) -> str:
        return (f"<StreamedSpMV {self.shape[0]}x{self.shape[1]} {self.dtype.name}, {self.plan.parts} parts "
                f"through {self.plan.slots} slots of {self.plan.slot_entries:,} entries>")


def budget_of(limit, free_bytes: int) -> int:
    """A device-memory limit (bytes, a figure such as '2G', or None) as bytes: None is what is free.

    Example:
        >>> budget_of("2G", 80 * 10**9), budget_of(None, 5000), budget_of(123, 5000)
        (2000000000, 5000, 123)
    """
    if limit is None:
        return int(free_bytes)
    from .memory import parse_bytes
    value = parse_bytes(limit) if isinstance(limit, str) else int(limit)
    if value <= 0:
        raise ValueError(f"device_memory_limit must be positive, got {limit!r}")
    return value


def compile_streamed(m: CanonicalMatrix, limit, arch: str, cache=None) -> StreamedSpMV | None:
    """A :class:`StreamedSpMV` of ``m`` when it does not fit the budget (``limit``, default what is free on
    the device), else None (multiply it in memory)."""
    free = gpu.free_memory()
    budget = budget_of(limit, free)
    if fits_in_memory(m, budget):
        return None
    if limit is None:  # blocks the memory pools hold unused count as free: look again without them
        free = budget = gpu.free_memory(release_pool=True)
        if fits_in_memory(m, budget):
            return None
    reason = (f"{IN_MEMORY_FACTOR} x its {csr_bytes(m):,} bytes of CSR and the vectors exceed the "
              f"{'free device memory' if limit is None else 'device-memory limit'} of {budget:,} bytes")
    return StreamedSpMV(m, stream_plan(m, min(budget, free), reason=reason), arch, cache)
