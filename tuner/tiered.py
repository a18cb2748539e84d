"""A compile that answers at once: the first products run on a stand-in kernel over the uploaded matrix while
the plan, the relabelling and the tuned layout are made on a thread of their own; the tuned kernel takes over
the calls as soon as it is ready.

Planning and building a tuned layout of a 100M-entry graph takes about a second, against a tenth to a fifth
of one for cuSPARSE to copy the matrix and multiply, so a caller who needs only a few hundred products would
be better off without tuning. The stand-in is the ``flat`` layout of :mod:`~tuner.families.aligned_coo` in the
caller's order: every entry with its row, in row order, a warp per 32 entries, so its work is balanced
whatever the row lengths (as cuSPARSE's CSR kernel balances it) and its layout is a search of the row
pointers on the device, a few milliseconds. It costs ``flat_bytes`` of device memory until the tuned kernel
replaces it, and is used only where that leaves the tuned build's work arrays room.

Once the tuning has relabelled the matrix on the device (columns by decreasing length, the order every
tiled plan needs first), and before it reads the plan cache, an interim kernel takes the calls while the
planner runs: :mod:`tile_coo <tuner.families.tile_coo>` over the relabelled matrix, whose only parameter is
the tile width (the middle of the L1 widths the planner would try). It needs no model and its layout is built on the device; on
power-law graphs it runs close to the tuned kernel (rmat:23 on the H100: 0.74 ms against the tuned 0.66 ms
and the stand-in's 1.26 ms), so the products made while the planner runs come faster. Its build costs
device time and memory beside the caller's products and delays the tuned kernel, unless the plan is the
interim's own specialisation, which keeps its layout.

The tuning starts when the first call has returned, when the caller waits for the tuned kernel, or
:data:`FIRST_CALL_WAIT_S` after the compile, whichever comes first, so that it does not slow the first
product. Calls never wait for the tuning (while it runs, a call returns once at most :data:`QUEUED_PRODUCTS` of
the caller's products are queued on the GPU, so that what the tuning waits for never includes a long queue of
them); everything else does (``plan``, ``spec``, ``launch``, ``time`` ...:
they describe the tuned kernel), and :meth:`TieredSpMV.wait` returns the tuned :class:`~tuner.kernel.SpMV`. If
the tuning fails, calls go on on the stand-in (its results are right, only slower) and ``wait`` raises what
the tuning raised.
"""
from __future__ import annotations

import collections
import contextlib
import logging
import sys
import threading
import time
from typing import Callable

from . import codegen, families, gpu
from .families.aligned_coo import BLOCK_SIZE, AlignedCooParams, layout_launch
from .families.base import Specialization
from .families.tile_coo import TileCooParams
from .families.tiles import TILE_ORDER, widths
from .formats import device_reorder
from .formats.aligned_coo import build_flat, flat_bytes
from .matrix import CanonicalMatrix
from .streaming import csr_bytes

log = logging.getLogger("tuner.tiered")

STAND_IN_FAMILY = "aligned_coo"
STAND_IN_PARAMS = AlignedCooParams("flat", BLOCK_SIZE, "none")
INTERIM_FAMILY = "tile_coo"
# While the tuning thread runs, the interpreter hands the GIL over this often (Python's default is 5 ms):
# the planner holds it between its NumPy passes, and each of the caller's products waits for it a few
# times, so at the default a 1 ms product could take several; at 50 us the waits stay a fraction of one.
SWITCH_S = 0.00005
# While the tuning runs, a call returns only once at most this many of the caller's products are queued on the
# GPU. A caller launching products without reading them queues up to a thousand; anything in the tuning that
# waits for the whole device (a cudaFree, a pageable copy, a module load) would then wait for all of them,
# seconds on a large graph, and the faster kernels would come that much later. A few keep the GPU busy.
QUEUED_PRODUCTS = 3
# The tuning starts once the caller's first product has returned, or after this long without one: its
# device work (the relabelling's sorts, from the first instant) would otherwise share the GPU, the copies
# and the interpreter with the one product a caller waits for most.
FIRST_CALL_WAIT_S = 0.25

_switch_lock = threading.Lock()
_switch_users = [0, None]  # tuning threads running, the interval before the first of them


def stand_in_spec(m: CanonicalMatrix) -> Specialization:
    """The stand-in's specialisation for ``m``'s types.

    Example:
        >>> import scipy.sparse as sp; from tuner.matrix import canonicalize
        >>> stand_in_spec(canonicalize(sp.eye(4, format="csr", dtype="float32"))).label()
        'aligned_coo(layout=flat,block_size=256,order=none)'
    """
    return Specialization(STAND_IN_FAMILY, STAND_IN_PARAMS, m.value_dtype, m.index_dtype, m.value_free)


def stand_in_fits(m: CanonicalMatrix, free_bytes: int) -> bool:
    """Whether the stand-in's layout, the uploaded matrix and the tuned build's device work arrays
    (:func:`~tuner.formats.device_reorder.fits`) all fit ``free_bytes`` of device memory.

    Example (131M entries of float32: 1.6 GB of stand-in beside 1.05 GB of CSR and the sorts' 17 GB):
        >>> import scipy.sparse as sp; from tuner.matrix import canonicalize
        >>> m = canonicalize(sp.random(10, 10, density=0.5, format="csr", dtype="float32", random_state=0))
        >>> stand_in_fits(m, 10**6), stand_in_fits(m, 100)
        (True, False)
    """
    own = flat_bytes(m.nnz, m.index_dtype.itemsize, 0 if m.value_free else m.value_dtype.itemsize)
    return device_reorder.fits(m.nnz, free_bytes - own - csr_bytes(m))


def stand_in(m: CanonicalMatrix, arch: str, cache, force: bool = False):
    """The stand-in :class:`~tuner.kernel.SpMV` of ``m``, its layout built on the device from the matrix's
    one upload (which the tuned build then relabels); None where tuning in the background does not pay
    (a matrix the host plans in a few tens of milliseconds, unless ``force``), or CuPy or the room for it
    is missing."""
    if not device_reorder.available():
        return None
    if not force and not device_reorder.usable(m.n_rows, m.n_cols, m.nnz):
        return None
    if not stand_in_fits(m, device_reorder.free_bytes()):
        return None
    with device_reorder.on_device():
        csr = device_reorder.device_csr(m)
        layout = build_flat(csr.indptr, csr.indices, csr.data, m.index_dtype)
    spec = stand_in_spec(m)
    binary = codegen.compile_source(families.render(spec, m), arch, cache=cache)
    device_reorder.finish()  # the layout is complete before another thread's stream may read it
    return _untuned(m, spec, arch, binary, layout_launch(layout, BLOCK_SIZE), "stand-in")


def _untuned(m: CanonicalMatrix, spec: Specialization, arch: str, binary, launch, tier: str):
    """The :class:`~tuner.kernel.SpMV` of ``spec`` on ``launch`` (a layout built on the device) under a plan
    that predicted and timed nothing, its ``tune`` naming the tier ('stand-in', 'interim')."""
    from . import planner
    from .kernel import SpMV
    plan = planner.Plan(family=spec.family, params=families.params_dict(spec.params), predicted_ms=None,
                        measured_ms=None, fingerprint="", value_dtype=m.value_dtype.name,
                        index_dtype=m.index_dtype.name, value_free=m.value_free, arch=arch,
                        binary_key=binary.key, tune=tier)
    return SpMV(m, spec, binary.cubin, plan, launch=launch, layout_source="device")


def interim_spec(m: CanonicalMatrix, profile=None) -> Specialization:
    """The interim kernel's specialisation for ``m``: tile_coo in degree order, the middle of the tile widths
    the planner tries (:func:`~tuner.families.tiles.widths`: a quarter, half and all of the L1's columns of x).

    Example:
        >>> import scipy.sparse as sp; from tuner.matrix import canonicalize
        >>> interim_spec(canonicalize(sp.eye(4, format="csr", dtype="float32"))).label()
        'tile_coo(tile_width=0,block_size=256,order=degree)'
    """
    ws = widths(m, profile)
    params = TileCooParams(ws[len(ws) // 2], BLOCK_SIZE, TILE_ORDER)
    return Specialization(INTERIM_FAMILY, params, m.value_dtype, m.index_dtype, m.value_free)


def interim(m: CanonicalMatrix, arch: str, cache, profile=None):
    """The interim :class:`~tuner.kernel.SpMV` of ``m`` (:func:`interim_spec`), its layout built on the device
    from the relabelled matrix there; None where the device lacks the room for its layout and the tuned one's
    beside it, or its build runs out of memory (the stand-in then answers until the tuned kernel is ready)."""
    spec = interim_spec(m, profile)
    family = families.get(spec.family)
    if not device_reorder.usable(m.n_rows, m.n_cols, m.nnz, 2 * family.device_bytes(m)):
        return None
    binary = codegen.compile_source(families.render(spec, m), arch, cache=cache)
    try:
        launch = family.device_launch(m, spec.params)
        device_reorder.finish()  # complete before the caller's stream reads it
    except MemoryError as e:  # CuPy's OutOfMemoryError is one
        log.info("no interim kernel: its layout ran out of device memory (%s)", e)
        return None
    finally:
        device_reorder.release()
    return _untuned(m, spec, arch, binary, launch, "interim")


class HandOver:
    """What a :class:`TieredSpMV`'s tuning is given: called with a kernel, it lets that kernel answer the
    calls until the tuned one does (:meth:`TieredSpMV.hand_over`); ``caller_waits`` tells whether the
    caller has asked for the tuned kernel (:meth:`TieredSpMV.wait`), so that no products of its run beside
    the rest of the tuning.

    Example:
        >>> waits = threading.Event()
        >>> h = HandOver(lambda kernel: print("answering:", kernel), waits); h("interim"); h.caller_waits
        answering: interim
        False
    """

    def __init__(self, hand_over: Callable, caller_waits: threading.Event):
        self._hand_over, self._caller_waits = hand_over, caller_waits

    def __call__(self, kernel) -> None:
        self._hand_over(kernel)

    @property
    def caller_waits(self) -> bool:
        return self._caller_waits.is_set()


class TieredSpMV:
    """y = A @ x at once on a stand-in kernel, then on the tuned one as soon as a thread has made it.

    Calls (``spmv(x)``, ``spmv(x, out=y)``, NumPy or device vectors, as :class:`~tuner.kernel.SpMV`) never
    wait for the tuning (while it runs, they wait for all but :data:`QUEUED_PRODUCTS` of their products
    queued on the GPU). Any other attribute is the tuned kernel's and waits for it: ``spmv.plan``,
    ``spmv.spec``, ``spmv.explain()``, ``spmv.launch``, ``spmv.time()``.

    ``tune`` makes the tuned kernel; it is given a :class:`HandOver`, through which it may put an interim
    kernel in the stand-in's place while it goes on, and learn whether the caller waits for it.

    Attributes:
        shape, dtype: of the matrix.
        stand_in_products: calls answered before the tuned kernel took over (by the stand-in or the interim).
        interim_s: seconds from this object's making to the interim kernel taking over (None if none did).
        switch_s: seconds from this object's making to the tuned kernel taking over (None before).

    Example (on a GPU machine):
        >>> spmv = tuner.compile(A)          # a large matrix: returns once the stand-in is ready  # doctest: +SKIP
        >>> y = spmv(x)                      # at once, on the stand-in                             # doctest: +SKIP
        >>> spmv.wait().plan.family          # waits for the tuned kernel                           # doctest: +SKIP
        'tile_composite'
    """

    def __init__(self, first, tune: Callable[[Callable], object]):
        self._current = first
        self._tuned = None
        self._error: BaseException | None = None
        self._done = threading.Event()
        self.shape, self.dtype = first.shape, first.dtype
        self.stand_in_products = 0
        self.switch_s: float | None = None
        self.interim_s: float | None = None
        self._hand_lock = threading.Lock()
        self._first_answered = threading.Event()
        self._caller_waits = threading.Event()
        self._t0 = time.perf_counter()
        self._queued: collections.deque = collections.deque()  # events after the products still on the GPU
        self._bounds_queue = gpu.available()
        # Not a daemon: the process waits for a tuning under way (its plan and binary go to the cache).
        self._thread = threading.Thread(target=self._run, args=(tune,), name="tuner-tuning")
        self._thread.start()

    def _run(self, tune) -> None:
        self._first_answered.wait(FIRST_CALL_WAIT_S)
        _switch_faster()
        try:
            # The tuning's device work (sorts, layouts: tens of milliseconds each) goes on a stream of its
            # own, so that the caller's products run beside it rather than queue behind it, and it keeps
            # CuPy's freed blocks rather than free them (a cudaFree waits for every stream); all of it is
            # finished before the tuned kernel, which reads what it built, takes over. That stream has the
            # device's highest priority: back-to-back products fill the GPU, and the faster kernel it
            # builds is worth more to them than the share of the GPU it takes while it builds it.
            with _side_stream(), device_reorder.releases_deferred():
                tuned = tune(HandOver(self.hand_over, self._caller_waits))
                device_reorder.finish()
        except BaseException as exc:  # noqa: BLE001 - handed to wait(); calls go on on the stand-in
            self._error = exc
            log.warning("tuning failed (%s: %s): products go on on the stand-in kernel", type(exc).__name__, exc)
        else:
            with self._hand_lock:
                self._tuned, self._current = tuned, tuned
            self.switch_s = time.perf_counter() - self._t0
            device_reorder.release()  # the stand-in's layout, unless a call still runs on it
        finally:
            gpu.leave_thread()
            _switch_back()
            self._done.set()

    def hand_over(self, kernel) -> None:
        """Let ``kernel`` (its results ready to read on the caller's stream) answer the calls until the tuned
        kernel does; nothing once that has taken over."""
        with self._hand_lock:
            if self._tuned is None:
                self._current = kernel
                self.interim_s = time.perf_counter() - self._t0

    def __call__(self, x, out=None):
        current = self._current
        tuning = current is not self._tuned
        if tuning:
            self.stand_in_products += 1
        try:
            return current(x, out)
        finally:
            if not self._first_answered.is_set():  # set() takes a lock: a call of a small product notices it
                self._first_answered.set()
            if tuning and self._bounds_queue:
                self._bound_queue()
            elif self._queued:
                self._queued.clear()

    def _bound_queue(self) -> None:
        """Wait until at most :data:`QUEUED_PRODUCTS` of the products answered so far are still queued (ours
        run on the default stream, so an event there follows each)."""
        self._queued.append(gpu.default_event())
        while len(self._queued) > QUEUED_PRODUCTS:
            self._queued.popleft().synchronize()

    @property
    def ready(self) -> bool:
        """Whether the tuning has finished (the tuned kernel answers the calls, or the tuning failed)."""
        return self._done.is_set()

    @property
    def tuned(self) -> bool:
        """Whether the tuned kernel answers the calls now."""
        return self._tuned is not None

    def wait(self, timeout: float | None = None):
        """The tuned :class:`~tuner.kernel.SpMV`, once made; raises what the tuning raised, or TimeoutError."""
        self._caller_waits.set()
        self._first_answered.set()  # a caller waiting for the tuning has no first product to protect
        if not self._done.wait(timeout):
            raise TimeoutError(f"the tuning did not finish within {timeout} s")
        if self._error is not None:
            raise self._error
        return self._tuned

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.wait(), name)

    def __repr__(self) -> str:
        if self._tuned is not None:
            return f"<TieredSpMV, tuned: {self._tuned!r}>"
        state = "failed" if self._error is not None else "tuning"
        return f"<TieredSpMV {self.shape[0]}x{self.shape[1]} {self.dtype.name}, {state}, stand-in answering>"


@contextlib.contextmanager
def _side_stream():
    """CuPy's work in this thread on a stream of its own, of the device's highest priority (nothing to do
    without CuPy and a GPU)."""
    if not device_reorder.available():
        yield
        return
    with device_reorder.on_device() as cupy:
        try:  # CUDA clamps a priority past the device's range to its highest
            stream = cupy.cuda.Stream(non_blocking=True, priority=-1000)
        except TypeError:  # a CuPy from before stream priorities: the default one
            stream = cupy.cuda.Stream(non_blocking=True)
        with stream:
            yield


def _switch_faster() -> None:
    with _switch_lock:
        if _switch_users[0] == 0:
            _switch_users[1] = sys.getswitchinterval()
            sys.setswitchinterval(SWITCH_S)
        _switch_users[0] += 1


def _switch_back() -> None:
    with _switch_lock:
        _switch_users[0] -= 1
        if _switch_users[0] == 0:
            sys.setswitchinterval(_switch_users[1])
