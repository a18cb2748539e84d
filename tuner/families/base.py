"""What every SpMV kernel family provides, and the launch description its format builder produces."""
from __future__ import annotations

import copy
import hashlib
import threading
import weakref
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, replace
from typing import Callable

import numpy as np

from ..formats import device_reorder
from ..formats.device_reorder import DeviceCsr, device_csr, known_copy, permute_device
from ..formats.reorder import (NONE, Ordering, Structure, check_order, col_ranks, inverse, make_ordering, permute,
                               permuted_rows, permuted_structure)
from ..formats.xp import largest, like, on_device
from ..matrix import CanonicalMatrix

# Index loads issued ahead of their gathers in each lane's loop (templates' row_dot).
UNROLL = 4

CTYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double",
          np.dtype(np.int32): "int", np.dtype(np.int64): "long long"}


@dataclass(frozen=True)
class Launch:
    """A built layout ready to launch: device arrays in kernel-argument order, integer scalars, geometry.

    Every template's signature is ``(arrays..., const VAL* x, VAL* y, long long scalars..., VAL
    pattern_value)``; ``pattern_value`` is the common value of a pattern matrix (value-free kernels
    multiply by it once per row) and 1 otherwise.

    A plan that relabels rows and columns runs the kernel on the permuted matrix, between two gathers in
    the module's ``<kernel>_gather`` kernel: x_plan = x[x_gather] before, y = y_plan[y_gather] after.

    Attributes:
        arrays: (name, array) pairs in argument order: host arrays, uploaded when the kernel is loaded, or
            device arrays (CuPy) of a layout built on the GPU, used where they are.
        scalars: (name, value) pairs passed as 64-bit integers after x and y.
        grid: number of blocks (0: nothing to launch, e.g. a matrix without rows).
        block: threads per block.
        x_gather: column order of the plan (None: the caller's order).
        y_gather: the plan's row of each of the caller's rows (None: the caller's order).
        zero_y: the kernel adds into y (atomically), so y is zeroed before it.
        gathers_on_device: ``x_gather`` and ``y_gather`` already on the device (CuPy) where the layout was
            built there, used instead of copies of the host arrays (a copy from pageable memory would hold up
            a caller's products on other threads while a background tuning makes the kernel).
    """

    arrays: tuple[tuple[str, np.ndarray], ...]
    scalars: tuple[tuple[str, int], ...]
    grid: int
    block: int
    x_gather: np.ndarray | None = None
    y_gather: np.ndarray | None = None
    zero_y: bool = False
    gathers_on_device: tuple | None = None

    @property
    def nbytes(self) -> int:
        gathers = sum(g.nbytes for g in (self.x_gather, self.y_gather) if g is not None)
        return sum(a.nbytes for _, a in self.arrays) + gathers


@dataclass(frozen=True)
class Family:
    """One kernel family: its parameter space, format builder, template and NumPy reference.

    Attributes:
        name: registry name, e.g. 'csr_vector'.
        template: file under templates/.
        params_type: frozen dataclass of the family's tunable parameters.
        space: matrix -> every valid parameter set for it (constraints applied).
        launch: (matrix, params) -> :class:`Launch` (vectorised host-side format build).
        context: (matrix, params) -> template variables beyond the common ones (VAL, IDX, value_free,
            kernel_name).
        evaluate: (matrix, launch, x) -> y computed in NumPy from the built arrays exactly as the kernel
            reads them; the CPU tests check it against SciPy.
        uses_profile: ``space`` also takes the GPU's profile (or None), e.g. for tile widths from its L1.
        device_launch: (matrix, params) -> the same :class:`Launch` built on the GPU from the matrix's
            device copy (its arrays CuPy arrays), for families whose builders run on CuPy; None: host only.
        device_bytes: matrix -> device memory ``device_launch`` needs; None: the work arrays of every entry
            at once (:data:`~tuner.formats.device_reorder.WORK_BYTES_PER_ENTRY` each).
    """

    name: str
    template: str
    params_type: type
    space: Callable[[CanonicalMatrix], list]
    launch: Callable[[CanonicalMatrix, object], Launch]
    context: Callable[[CanonicalMatrix, object], dict]
    evaluate: Callable[[CanonicalMatrix, Launch, np.ndarray], np.ndarray]
    uses_profile: bool = False
    device_launch: Callable[[CanonicalMatrix, object], Launch] | None = None
    device_bytes: Callable[[CanonicalMatrix], int] | None = None

    def candidates(self, m: CanonicalMatrix, profile=None) -> list:
        """The family's parameter sets for ``m`` (on the GPU ``profile`` describes, for families that ask)."""
        return self.space(m, profile) if self.uses_profile else self.space(m)

    def params_from_dict(self, values: dict):
        return self.params_type(**values)

    def apply(self, m: CanonicalMatrix, built: Launch, x: np.ndarray) -> np.ndarray:
        """y = A x in NumPy from the built arrays, in the caller's order (gathers included).

        Example:
            >>> import scipy.sparse as sp
            >>> from tuner.families import get
            >>> from tuner.matrix import canonicalize
            >>> m = canonicalize(sp.csr_matrix(np.array([[0, 1.0], [2.0, 3.0]])))
            >>> fam = get("csr_vector"); p = fam.params_type(order="degree")
            >>> fam.apply(m, fam.launch(m, p), np.array([10.0, 100.0])).tolist()
            [100.0, 320.0]
        """
        plan_x = x if built.x_gather is None else x[built.x_gather]
        y_plan = self.evaluate(m, built, plan_x)
        return y_plan if built.y_gather is None else y_plan[built.y_gather]


def check_launch(block_size: int, order: str) -> None:
    """Validate the parameters every family shares: threads per block and the ordering.

    Example:
        >>> check_launch(100, "none")
        Traceback (most recent call last):
        ...
        ValueError: block_size must be a multiple of 32 in [32, 1024], got 100
    """
    if block_size % 32 or not 32 <= block_size <= 1024:
        raise ValueError(f"block_size must be a multiple of 32 in [32, 1024], got {block_size}")
    check_order(order)


def params_dict(params) -> dict:
    """Parameters as a plain dict of JSON values (for plans, JSON and explain()): a tuple becomes a list,
    so that a plan equals itself read back from the cache.

    Example:
        >>> from tuner.families.tile_composite import TileCompositeParams
        >>> params_dict(TileCompositeParams(64, (8, 16)))["workloads"]
        [8, 16]
    """
    return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(params).items()}


def csr_arrays(m: CanonicalMatrix) -> tuple[tuple[str, np.ndarray], ...]:
    """The CSR arrays a kernel reads; value-free kernels never read ``data``."""
    arrays = [("indptr", m.indptr), ("indices", m.indices)]
    if not m.value_free:
        arrays.append(("data", m.data))
    return tuple(arrays)


def device_csr_arrays(csr) -> tuple[tuple[str, object], ...]:
    """:func:`csr_arrays` of a matrix's device copy (:class:`~tuner.formats.device_reorder.DeviceCsr`, whose
    ``data`` is None for a pattern matrix)."""
    return (("indptr", csr.indptr), ("indices", csr.indices)) + ((("data", csr.data),) if csr.data is not None
                                                                 else ())


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


DEVICE_ROWS = 1 << 22  # from this many rows on, a view's passes over all its rows run on the GPU if it is there


@contextmanager
def device_row_lengths(m):
    """A block in which ``m``'s row lengths are a device (CuPy) array, where ``m``'s CSR is on the GPU
    (uploaded, or relabelled there: :func:`~tuner.formats.device_reorder.known_copy`) and it has
    :data:`DEVICE_ROWS` rows or more; else None. The block runs on that GPU whichever thread enters it (the
    planner's threads start on CuPy's default device). The passes of the warp histograms over every row of a
    30M-row view take tenths of a second each on the host, holding the interpreter the other planning
    threads wait for, and a millisecond there; what they return (histograms by length) is small.

    Example:
        >>> import scipy.sparse as sp; from tuner.matrix import canonicalize
        >>> with device_row_lengths(canonicalize(sp.eye(3, format="csr"))) as lengths:  # small, not on a GPU
        ...     lengths is None
        True
    """
    csr = known_copy(m) if isinstance(m, CanonicalMatrix) and m.n_rows >= DEVICE_ROWS else None
    if csr is None:
        yield None
        return
    # Host arrays standing in for the device's (tests) need no device.
    with device_reorder.on_device() if on_device(csr.indptr) else nullcontext():
        yield csr.indptr[1:] - csr.indptr[:-1]


def longest_row(m: CanonicalMatrix) -> int:
    """The most entries of any row of ``m``: from its row pointers on the GPU (:func:`device_row_lengths`)
    where the host has not counted its row lengths yet, so that the families' spaces do not wait for a pass
    over tens of millions of rows before the planner's threads can start (they count the lengths when they
    need them, beside each other).

    Example:
        >>> import scipy.sparse as sp; from tuner.matrix import canonicalize
        >>> longest_row(canonicalize(sp.csr_matrix(np.tril(np.ones((4, 4), np.float32)))))
        4
    """
    if not m.n_rows:
        return 0
    if "row_lengths" not in m.__dict__:
        try:
            with device_row_lengths(m) as lengths:
                if lengths is not None:
                    return largest(lengths)
        except MemoryError:  # CuPy's OutOfMemoryError is one: the host counts the lengths instead
            pass
    return int(m.row_lengths.max())


_layouts: "weakref.WeakKeyDictionary[CanonicalMatrix, dict]" = weakref.WeakKeyDictionary()
_gates: "weakref.WeakKeyDictionary[CanonicalMatrix, dict]" = weakref.WeakKeyDictionary()  # a lock per key
_memo_lock = threading.Lock()


def shared_layout(m: CanonicalMatrix, key: tuple, build: Callable[[], object]):
    """``build()`` once per matrix and key: candidates that differ only in launch constants share one
    host layout (and so, through :class:`~tuner.kernel.DeviceArrays`, one upload). Freed with the matrix.
    Safe across threads (the planner builds histograms on several): a second caller of a key being built
    waits for it instead of building it again.
    """
    with _memo_lock:
        per_matrix = _layouts.setdefault(m, {})
        if key in per_matrix:
            return per_matrix[key]
        gate = _gates.setdefault(m, {}).setdefault(key, threading.Lock())
    with gate:
        if key not in per_matrix:
            per_matrix[key] = build()
    return per_matrix[key]


def known_layout(m: CanonicalMatrix, key: tuple):
    """What :func:`shared_layout` holds for ``m`` under ``key``, or None when nothing was built yet."""
    return _layouts.get(m, {}).get(key)


@dataclass(frozen=True, eq=False)
class MemoState:
    """A matrix as it stands at one moment: a shallow copy of it (the arrays and cached properties it has
    so far) and what :func:`shared_layout` holds for it, matrices among that (a relabelled view) in turn.
    :func:`restore` makes a new matrix from it that has exactly that and nothing built since: the same
    planning can be timed again from the same start. Other memos are shared, not copied: take it before
    planning makes views that refer back to the matrix (:func:`ordered_structure`'s)."""

    matrix: CanonicalMatrix
    memos: dict


def memo_state(m: CanonicalMatrix) -> MemoState:
    """What ``m`` holds now (see :class:`MemoState`)."""
    with _memo_lock:
        memos = dict(_layouts.get(m, {}))
    return MemoState(copy.copy(m), {k: memo_state(v) if isinstance(v, CanonicalMatrix) else v
                                    for k, v in memos.items()})


def restore(state: MemoState) -> CanonicalMatrix:
    """A new matrix equal to the one ``state`` was taken of, sharing its arrays, with only what it held then.

    Example:
        >>> import scipy.sparse as sp; from tuner.matrix import canonicalize
        >>> m = canonicalize(sp.eye(4, format="csr"))
        >>> _ = shared_layout(m, ("a",), lambda: 1)
        >>> state = memo_state(m)
        >>> _ = shared_layout(m, ("b",), lambda: 2)
        >>> r = restore(state)
        >>> r is not m, r.indices is m.indices, known_layout(r, ("a",)), known_layout(r, ("b",))
        (True, True, 1, None)
    """
    m = copy.copy(state.matrix)
    memos = {k: restore(v) if isinstance(v, MemoState) else v for k, v in state.memos.items()}
    with _memo_lock:
        _layouts[m] = memos
    return m


def ordering(m: CanonicalMatrix, order: str) -> Ordering | None:
    """The ordering ``order`` of ``m``, built once per matrix (None for 'none')."""
    return shared_layout(m, ("ordering", order), lambda: make_ordering(m, order))


def ordered_matrix(m: CanonicalMatrix, order: str) -> CanonicalMatrix:
    """``m`` relabelled by ``order`` (``m`` itself for 'none'), built once per matrix."""
    if order == NONE:
        return m
    return shared_layout(m, ("permuted", order), lambda: permute(m, ordering(m, order)))


def ordered_structure(m: CanonicalMatrix, order: str) -> CanonicalMatrix | Structure:
    """What the model reads of ``m`` relabelled by ``order``: lengths only, no permuted arrays; the
    permuted matrix itself when it is already built (the tiled families build it to count their tiles),
    so that the model's memos of that view - tile runs, gather shares - are the planner's."""
    if order == NONE:
        return m
    source = weakref.ref(m)  # not m: the memo's value must not keep its key alive

    def view():
        built = known_layout(m, ("permuted", order))
        if built is not None:
            return built
        o = ordering(m, order)

        def entries(rows):  # some rows of the permuted matrix, read from m (the model's block samples)
            a = source()
            rank = o.row_rank if o.symmetric else shared_layout(a, ("col_rank", order), lambda: inverse(o.col_order))
            return permuted_rows(a, o, rank, rows)
        return permuted_structure(m, o, lambda: ordered_matrix(source(), order), entries)
    # The first answer stays, so that what the model memoises on the view is found again.
    return shared_layout(m, ("structure", order), view)


def plan_matrix(m: CanonicalMatrix | Structure) -> CanonicalMatrix:
    """The matrix itself behind what the model reads: ``m``, or the permuted matrix a Structure stands for."""
    if isinstance(m, CanonicalMatrix):
        return m
    if m.matrix is None:
        raise ValueError("this structure holds lengths only: its permuted matrix cannot be built")
    return m.matrix()


def device_matrix(m: CanonicalMatrix, order: str) -> DeviceCsr:
    """``m`` relabelled by ``order`` as device arrays, built on the GPU once per matrix (the copy the host
    relabelling made there when the planner asked for it first; ``m``'s own upload for 'none')."""
    if order == NONE:
        return device_csr(m)
    built = known_layout(m, ("permuted", order))
    if built is not None:
        return known_copy(built) or device_csr(built)

    def relabel():
        o = ordering(m, order)
        return permute_device(device_csr(m), o.row_order, col_ranks(o))
    return shared_layout(m, ("device_permuted", order), relabel)


def drop_device_copies(m: CanonicalMatrix) -> None:
    """Free the device arrays kept for ``m`` and its relabelled views (its upload, their relabelled copies):
    once its layout is built, they only hold device memory the kernels may need."""
    with _memo_lock:
        memos = _layouts.get(m, {})
        views = [v for k, v in memos.items() if k[0] == "permuted"]
        for k in [k for k in memos if k[0] == "device_permuted"]:
            del memos[k]
    for v in views:
        device_reorder.forget(v)
    device_reorder.forget(m)


def ordered_device_launch(m: CanonicalMatrix, order: str,
                          build: Callable[[CanonicalMatrix, DeviceCsr, np.ndarray], Launch]) -> Launch:
    """:func:`ordered_launch` on the GPU: ``build`` gets ``m`` (whose sizes and types the relabelled matrix
    shares), the relabelled matrix's device arrays (:func:`device_matrix`) and its column lengths (counted
    there unless the ordering or ``m`` already knows them: nothing of the relabelled matrix is needed on
    the host)."""
    csr = device_matrix(m, order)
    o = ordering(m, order)
    known = m.__dict__.get("col_lengths") if o is None else o.col_lengths
    built = build(m, csr, known if known is not None else device_reorder.col_lengths(csr, m.n_cols))
    if o is None:
        return built
    copies = tuple(like(csr.indices, g) for g in (o.col_order, o.row_rank))  # on this thread's stream
    return replace(built, x_gather=o.col_order, y_gather=o.row_rank, gathers_on_device=copies)


def ordered_launch(m: CanonicalMatrix, order: str, build: Callable[[CanonicalMatrix], Launch]) -> Launch:
    """``build`` run on the relabelled matrix, with the gathers that bring x to its order and y back."""
    plan = ordered_matrix(m, order)
    built = build(plan)
    if plan is m:
        return built
    o = ordering(m, order)
    return replace(built, x_gather=o.col_order, y_gather=o.row_rank)


@dataclass(frozen=True)
class Specialization:
    """The compile-time identity of a kernel: family, parameters and the matrix's type traits.

    Attributes:
        family: registry name.
        params: the family's parameter dataclass instance.
        value_dtype: float32 or float64.
        index_dtype: int32 or int64.
        value_free: True for the pattern-matrix kernel that never reads values.
    """

    family: str
    params: object
    value_dtype: np.dtype
    index_dtype: np.dtype
    value_free: bool

    @property
    def kernel_name(self) -> str:
        return f"spmv_{self.family}"

    def label(self) -> str:
        """``family(k=v,...)``; a long tuple (a workload size per tile) shows as its length, range and digest.

        Example:
            >>> from tuner.families.csr_vector import CsrVectorParams
            >>> Specialization("csr_vector", CsrVectorParams(8, 128), np.dtype("float32"), np.dtype("int32"),
            ...                False).label()
            'csr_vector(threads_per_row=8,block_size=128,order=none)'
        """
        parts = ",".join(f"{k}={_shown(v)}" for k, v in params_dict(self.params).items())
        return f"{self.family}({parts})"


def _shown(v):
    if isinstance(v, (tuple, list)) and len(v) > 4:
        digest = hashlib.sha256(repr(tuple(v)).encode()).hexdigest()[:8]
        return f"[{len(v)}:{min(v)}..{max(v)}#{digest}]"
    return v
