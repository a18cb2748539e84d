"""The planner in a Python process of its own, for a tuning that runs beside the caller's products.

In the caller's process the planner is hundreds of NumPy and CuPy passes on threads: the caller's thread waits
for the interpreter lock between them, and its products share the GPU with the planner's device statistics,
so the products made while a large graph is planned take two to three times their own time. Here the
planner runs its host path (the one machines without a GPU run: the same candidates; where the GPU counts
every row's tile runs, the host counts a sample of the rows, and on rmat:23, rmat:25 and two Kronecker graphs
it picked the same plans) in a child interpreter that sees no GPU, on the row pointers, the relabelled
matrix and its ordering, handed over through files in ``/dev/shm`` (memory, not disk; the caller's column
indices are read through the relabelled matrix: :class:`ViewIndices`); the caller's process copies them
there and waits on a pipe, holding neither. The host path takes longer than the device one (rmat:25 on an
H200's 16 cores: 1.8 s against 0.5-0.6 s once relabelled), so a compile plans here only while the caller is
making products, never when it waits for the tuned kernel (:class:`~tuner.tiered.HandOver`), nor where it
would take over half the free host memory (:func:`host_bytes`).

One child serves the process's compiles one at a time; it starts with the first compile that tunes a
matrix in the background (:func:`start`), loads its modules while the first products run and the GPU
relabels the matrix, and ends with the process (it stays idle where every later plan comes from the
cache). Anything that goes wrong here (no ``/dev/shm``, too little room there, the child failing or gone)
returns None and the compile plans in its own process as before. The shared files are unlinked as soon as
the child has mapped them, and by the caller once the answer is in.
"""
from __future__ import annotations

import atexit
import logging
import os
import pickle
import select
import struct
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from .matrix import CanonicalMatrix
from .staging import copy_in_parts

log = logging.getLogger("tuner.plan_worker")

SHARED_DIR = "/dev/shm"  # tmpfs: the arrays cross in memory
INLINE_BYTES = 1 << 20  # arrays smaller than this go through the pipe itself
ANSWER_TIMEOUT_S = 600.0  # a child that has not answered by then is stopped and the caller plans itself
_HEADER = struct.Struct("<Q")
_CHILD_MAIN = "from tuner.plan_worker import main; main()"
_lock = threading.Lock()  # one request at a time; a second tuning meanwhile plans in its own process
_start_lock = threading.Lock()
_child: subprocess.Popen | None = None


def available() -> bool:
    """Whether a planner process can be used here: a POSIX system with a writable ``/dev/shm``, and
    ``$TUNER_PLAN_PROCESS`` not '0'.

    Example:
        >>> from unittest import mock
        >>> with mock.patch.dict(os.environ, {"TUNER_PLAN_PROCESS": "0"}):
        ...     available()
        False
    """
    if os.environ.get("TUNER_PLAN_PROCESS", "").strip() == "0":
        return False
    return os.name == "posix" and os.access(SHARED_DIR, os.W_OK)


CHILD_SHARE_FACTOR = 4  # host memory of planning apart over the shared arrays (host_bytes)
CHILD_BASE_BYTES = 64 << 20  # the planner process's interpreter and modules


def host_bytes(m: CanonicalMatrix, view: CanonicalMatrix, ordering) -> int:
    """Host memory planning apart takes while it runs: the arrays shared with the child once in the shared
    files and the child's peak (the shared pages it reads, its interpreter and modules, and its own arrays
    over the same rows and entries: lengths, classes, samples), which was 2.7-3.5 times the shared arrays on
    rmat:20 to rmat:22 (:data:`CHILD_SHARE_FACTOR` over them in all). The caller's column indices are not
    shared: the child reads them through the relabelled matrix (:class:`ViewIndices`).

    Example:
        >>> import scipy.sparse as sp
        >>> from tuner.matrix import canonicalize
        >>> from tuner.formats.reorder import Ordering
        >>> m = canonicalize(sp.eye(4, format="csr", dtype="float32")); o = np.arange(4, dtype=np.int32)
        >>> host_bytes(m, m, Ordering("degree", o, o, o)) - CHILD_BASE_BYTES   # 4 x (20 x 2 + 16 + 16 x 2)
        352
    """
    arrays = [m.indptr, view.indptr, view.indices, ordering.row_order, ordering.row_rank]
    arrays += [] if ordering.symmetric else [ordering.col_order]
    arrays += [] if ordering.col_lengths is None else [ordering.col_lengths]
    shared = int(sum(np.dtype(a.dtype).itemsize * int(np.prod(a.shape)) for a in arrays))
    return CHILD_SHARE_FACTOR * shared + CHILD_BASE_BYTES


def _child_env() -> dict:
    env = dict(os.environ)
    env["CUDA_VISIBLE_DEVICES"] = ""  # the child must not make a context on the caller's GPU
    package_root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([package_root, *filter(None, [env.get("PYTHONPATH")])])
    return env


def start() -> bool:
    """Start the planner process if it is not running (it loads its modules while the caller goes on);
    False where none can run here.

    Example:
        >>> start() in (True, False)   # doctest: +SKIP
        True
    """
    global _child
    if not available():
        return False
    with _start_lock:
        if _child is None or _child.poll() is not None:
            try:
                _child = subprocess.Popen([sys.executable, "-c", _CHILD_MAIN], stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, env=_child_env(), close_fds=True)
            except OSError as e:
                log.warning("no planner process (%s): planning in this process", e)
                _child = None
                return False
    return True


def _take_child() -> subprocess.Popen | None:
    """The running child, which is no longer the module's (a later :func:`start` makes a new one)."""
    global _child
    with _start_lock:
        child, _child = _child, None
    return child if child is not None and child.poll() is None else None


def stop() -> None:
    """End the planner process (at exit; a later :func:`start` makes a new one)."""
    child = _take_child()
    if child is not None:
        try:
            child.stdin.close()
            child.wait(timeout=5)
        except Exception:  # noqa: BLE001 - it is going anyway
            child.kill()


atexit.register(stop)


def _send(stream, obj) -> None:
    payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(payload)))
    stream.write(payload)
    stream.flush()


def _read_exactly(fd: int, n: int, deadline: float | None) -> bytes | None:
    chunks, left = [], n
    while left:
        if deadline is not None:
            wait = deadline - time.monotonic()
            if wait <= 0 or not select.select([fd], [], [], wait)[0]:
                raise TimeoutError("the planner process did not answer in time")
        chunk = os.read(fd, min(left, 1 << 24))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _receive(fd: int, deadline: float | None = None):
    header = _read_exactly(fd, _HEADER.size, deadline)
    if header is None:
        return None
    payload = _read_exactly(fd, _HEADER.unpack(header)[0], deadline)
    if payload is None:
        return None
    return pickle.loads(payload)


class _SharedArrays:
    """Host arrays written to files in :data:`SHARED_DIR` for the child to map; removed on close. Room is
    reserved before anything is written (a full tmpfs would otherwise kill the process on a write)."""

    def __init__(self):
        self.paths: list[str] = []
        self.bytes = 0
        self.threads = min(8, os.cpu_count() or 1)
        self.pool = ThreadPoolExecutor(max_workers=self.threads)

    def put(self, array) -> tuple:
        """A description the child turns back into the array: ('inline', array) or ('file', path, dtype,
        shape). ``array``: a NumPy array or anything with ``read_into(out)`` (a device mirror)."""
        dtype, shape = np.dtype(array.dtype), tuple(array.shape)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if nbytes < INLINE_BYTES or nbytes == 0:
            return ("inline", np.array(array, copy=True))
        fd, path = tempfile.mkstemp(prefix="tuner-plan-", dir=SHARED_DIR)
        self.paths.append(path)
        self.bytes += nbytes
        try:
            os.posix_fallocate(fd, 0, nbytes)
        finally:
            os.close(fd)
        out = np.memmap(path, dtype=dtype, mode="r+", shape=shape)
        if hasattr(array, "read_into"):
            array.read_into(out)
        else:
            flat, src = out.reshape(-1), np.ascontiguousarray(array).reshape(-1)
            part = max(1 << 22, -(-flat.size // self.threads))
            for done in copy_in_parts(self.pool, flat, src, part):
                done.result()
        del out
        return ("file", path, dtype.str, shape)

    def close(self) -> None:
        self.pool.shutdown(wait=False)
        for path in self.paths:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass


def _matrix_request(m: CanonicalMatrix, shared: _SharedArrays, indices: bool = True) -> dict:
    """``m`` for the child; without ``indices`` its column indices stay here (the child reads them through
    the relabelled view: :class:`ViewIndices`)."""
    return {"indptr": shared.put(m.indptr), "shape": tuple(m.shape), "value_dtype": np.dtype(m.value_dtype).str,
            "pattern_value": m.pattern_value, "index_dtype": np.dtype(m.index_dtype).str,
            "indices": shared.put(m.indices) if indices else None}


def plan_apart(m: CanonicalMatrix, view: CanonicalMatrix, ordering, profile, timeout_s: float = ANSWER_TIMEOUT_S):
    """Every candidate of ``m`` and its prediction, as :func:`~tuner.model.lookup.predicted_candidates`
    makes them, made in the planner process from ``m``, its relabelled matrix ``view`` and the
    :class:`~tuner.formats.reorder.Ordering` that made it (``m``'s row pointers, the view's arrays and the
    ordering's copied to shared memory, a device mirror's straight from the GPU); with what it took:
    'share' (seconds copying), 'child' (seconds from the request's arrival there to its answer), 'plan'
    (seconds from the first copy to the answer), 'shared_bytes' (the copies' size) and 'child_peak_bytes'
    (the planner process's own peak resident memory so far). None where no planner process can serve (see
    the module docstring).

    Example: see tests/test_plan_worker.py.
    """
    from .families.tiles import TILE_ORDER
    from .memory import available_bytes
    need = host_bytes(m, view, ordering)
    if need > available_bytes() // 2:  # never at the risk of pushing the caller's process out of memory
        log.info("planning in this process: planning apart would take %.1f GB of host memory", need / 1e9)
        return None
    if not _lock.acquire(blocking=False):
        return None
    shared = _SharedArrays()
    t0 = time.perf_counter()
    try:
        child = _child
        if child is None or child.poll() is not None:
            return None
        request = {"matrix": _matrix_request(m, shared, indices=False), "view": _matrix_request(view, shared),
                   "order": TILE_ORDER, "ordering": _ordering_request(ordering, shared), "profile": profile}
        shared_s = time.perf_counter() - t0
        _send(child.stdin, request)
        answer = _receive(child.stdout.fileno(), time.monotonic() + timeout_s)
        if answer is None:
            raise RuntimeError("the planner process ended")
        if answer[0] != "ok":
            raise RuntimeError(answer[1])
        _, specs, predicted, child_s, child_peak = answer
        return specs, predicted, {"share": shared_s, "child": child_s, "plan": time.perf_counter() - t0,
                                  "shared_bytes": shared.bytes, "child_peak_bytes": child_peak}
    except Exception as e:  # noqa: BLE001 - no room in /dev/shm, a broken pipe, the child failing: plan here
        log.warning("the planner process failed (%s: %s): planning in this process", type(e).__name__, e)
        _stop_locked()
        return None
    finally:
        shared.close()
        _lock.release()


def _stop_locked() -> None:
    child = _take_child()
    if child is not None:
        child.kill()
        child.wait()  # reaped at once: SIGKILL cannot be ignored


def _ordering_request(o, shared: _SharedArrays) -> dict:
    arrays = {"row_order": o.row_order, "col_order": None if o.symmetric else o.col_order, "row_rank": o.row_rank,
              "col_lengths": o.col_lengths}
    return {"name": o.name, "arrays": {k: None if v is None else shared.put(v) for k, v in arrays.items()}}


# The child's side.

class ViewIndices:
    """The caller's column indices, read through the relabelled matrix: row r of the caller's matrix is row
    ``row_rank[r]`` of the view, its columns ``col_order`` of the view's, sorted. What the planner reads of
    them (whole rows of its samples: :meth:`~tuner.matrix.CanonicalMatrix.row_entries`) comes back exactly;
    reading all of them as one array is refused, so that the planner process never holds a third copy of
    the entries.

    Example:
        >>> import scipy.sparse as sp
        >>> from tuner.matrix import canonicalize
        >>> from tuner.formats.reorder import degree_ordering, permute
        >>> m = canonicalize(sp.csr_matrix(np.array([[0, 1.0, 2.0], [3.0, 0, 0], [0, 4.0, 5.0]])))
        >>> o = degree_ordering(m.row_lengths, m.col_lengths, m.index_dtype)
        >>> ViewIndices(m.indptr, permute(m, o), o, m.index_dtype)[np.array([0, 1, 4])].tolist()
        [1, 2, 2]
    """

    def __init__(self, indptr: np.ndarray, view: CanonicalMatrix, ordering, dtype):
        self._indptr, self._view, self._ordering = indptr, view, ordering
        self.dtype = np.dtype(dtype)
        self.size = int(view.nnz)
        self.shape, self.ndim, self.nbytes = (self.size,), 1, self.size * self.dtype.itemsize

    def __len__(self) -> int:
        return self.size

    def __array__(self, dtype=None, copy=None):
        raise TypeError("the planner process reads the caller's column indices row by row through the relabelled "
                        "matrix, not as one array")

    def __getitem__(self, at) -> np.ndarray:
        # Positions searched in the row pointers' own type: a wider one would copy every pointer each time.
        at = np.asarray(at).astype(self._indptr.dtype, copy=False)
        rows = np.searchsorted(self._indptr, at, side="right") - 1
        wanted, which = np.unique(rows, return_inverse=True)
        lengths, cols = self._view.row_entries(np.asarray(self._ordering.row_rank)[wanted])
        old = np.asarray(self._ordering.col_order)[cols].astype(np.int64)
        segment = np.repeat(np.arange(wanted.size, dtype=np.int64), lengths)
        old = old[np.lexsort((old, segment))]  # each row's columns in rising order, as the caller's CSR has them
        starts = np.cumsum(lengths) - lengths
        offsets = at.astype(np.int64) - self._indptr[rows].astype(np.int64)
        return old[starts[which] + offsets].astype(self.dtype)


def _array(desc) -> np.ndarray:
    if desc[0] == "inline":
        return desc[1]
    _, path, dtype, shape = desc
    mapped = np.memmap(path, dtype=np.dtype(dtype), mode="r", shape=shape)
    try:  # mapped, the file needs no name: nothing is left in /dev/shm if either process dies from here on
        os.unlink(path)
    except FileNotFoundError:
        pass
    return mapped


def _matrix(desc: dict, indices=None) -> CanonicalMatrix:
    # Planners read structure only; the values' type is all they need of them (no array is made).
    indptr = _array(desc["indptr"])
    indices = _array(desc["indices"]) if indices is None else indices(indptr)
    data = np.broadcast_to(np.zeros(1, np.dtype(desc["value_dtype"])), indices.shape)
    return CanonicalMatrix(indptr, indices, data, tuple(desc["shape"]), desc["pattern_value"])


def answer(request: dict) -> tuple[list, list, float, int]:
    """The planner's candidates and predictions for a request of :func:`plan_apart` (in the child), the
    seconds it took and the process's peak resident bytes.

    Example: see tests/test_plan_worker.py.
    """
    from .families.base import shared_layout
    from .formats.reorder import Ordering
    from .model.lookup import predicted_candidates
    t0 = time.perf_counter()
    view = _matrix(request["view"])
    arrays = {k: None if v is None else _array(v) for k, v in request["ordering"]["arrays"].items()}
    row_order = arrays["row_order"]
    ordering = Ordering(request["ordering"]["name"], row_order,
                        row_order if arrays["col_order"] is None else arrays["col_order"], arrays["row_rank"],
                        arrays["col_lengths"])
    desc = request["matrix"]
    m = _matrix(desc, lambda indptr: ViewIndices(indptr, view, ordering, desc["index_dtype"]))
    if ordering.col_lengths is not None:  # counted beside the ordering on the GPU: no pass over the entries here
        view.__dict__["col_lengths"] = ordering.col_lengths
    # The caller's column lengths are the view's, put back in the caller's column order.
    view_lengths = view.col_lengths
    lengths = np.empty_like(view_lengths)
    lengths[ordering.col_order] = view_lengths
    m.__dict__["col_lengths"] = lengths
    order = request["order"]
    # The relabelled view as the caller's process made it: the planner finds it instead of relabelling.
    shared_layout(m, ("ordering", order), lambda: ordering)
    shared_layout(m, ("permuted", order), lambda: view)
    specs, predicted = predicted_candidates(m, request["profile"])
    return specs, predicted, time.perf_counter() - t0, _peak_bytes()


def _peak_bytes() -> int:
    """This process's peak resident bytes: Linux's VmHWM, the high-water mark of the memory it has mapped
    since it started. Not getrusage's ru_maxrss, which Linux carries across the exec that started the
    process, so that it would count the caller's resident memory at the fork too."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux counts kilobytes


def main() -> None:
    """The child's loop: a request in on stdin, its answer out on stdout, until stdin closes."""
    import signal
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the caller's to handle; it closes the pipe
    requests, answers = sys.stdin.buffer, os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything written to stdout, by Python or a library, goes to stderr, not into the answers
    sys.stdout = sys.stderr
    while True:
        request = _receive(requests.fileno())
        if request is None:
            return
        try:
            reply = ("ok", *answer(request))
        except Exception as e:  # noqa: BLE001 - told to the caller, who plans itself
            reply = ("error", f"{type(e).__name__}: {e}")
        _send(answers, reply)

