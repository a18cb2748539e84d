"""A graph's pull matrix Wᵀ and its rank-cache factors made on the GPU from one upload of the caller's CSR.

PageRank's setup on the host passes over every edge several times before the first iteration: the checks
(finite, non-negative weights; sorted, distinct, in-range indices), the out-weights, the transpose's copies
both ways and the generic kernel's upload of Wᵀ: about a second for 100M edges, against a few milliseconds
of iterations. Here the caller's arrays cross PCIe once through pinned buffers
(:func:`~tuner.formats.device_reorder.upload`), the checks are one kernel on the device, cuSPARSE transposes
(csr2csc), the out-weights are summed from Wᵀ's entries (float64), and Wᵀ stays on the device:
:func:`pull_arrays` hands its CuPy arrays to the resident iterations (:mod:`~tuner.graph.resident`), and
:func:`pull_on_device` to a compiled product's layout, the host holding only the row pointers and the entries
as :class:`~tuner.formats.device_reorder.HostMirror` arrays copied back only if something on the host reads them.

The resident iterations may ask for the nodes numbered by decreasing out-degree (:func:`degree_order`,
:func:`relabelled`: one pass over the edges before the transpose); the arrays then say so (``order``).

Only the happy path runs here: a graph that fails a check (or is too small to pay for the device, or has
64-bit indices) returns None, and the host path checks it again and names the problem.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from .. import codegen
from ..formats import device_reorder
from ..formats.device_reorder import DeviceCsr, HostMirror
from ..formats.transpose import DEVICE_DTYPES
from ..formats.xp import module, prefix, stable_argsort
from ..matrix import CanonicalMatrix, MatrixError

INT32_MAX = np.iinfo(np.int32).max
# Device bytes per edge at the peak: the upload (index, weight), the check's mask, Wᵀ (index, weight) and
# cuSPARSE's csr2csc buffer, with a quarter to spare; a relabelling (upload, its copy, two int32 work arrays
# and a temporary) stays within it.
PULL_BYTES_PER_ENTRY = 32
NODE_BYTES = 64  # per node: the factors (inverse, dangling, degree, out-weight) and the row pointers


def usable(A, dtype, small: bool = False) -> bool:
    """Whether :func:`pull_arrays` takes ``A`` (a SciPy CSR graph) for products in ``dtype``: large enough for
    the device to pay a compiled product's layout (any size with ``small``: for the resident iterations,
    which need no layout), 32-bit indices (cuSPARSE's transpose), float weights, CuPy with room.

    Example:
        >>> usable(sp.eye(3, format="csr"), np.float32)   # far too small
        False
    """
    n, nnz = A.shape[0], A.nnz
    if not nnz:  # no edge (or no node): the host's few passes, and its error for a graph without nodes
        return False
    if not (np.dtype(dtype) in DEVICE_DTYPES and A.dtype in DEVICE_DTYPES and nnz < INT32_MAX and n < INT32_MAX):
        return False
    need = PULL_BYTES_PER_ENTRY * nnz + NODE_BYTES * n
    if small:
        return device_reorder.available() and need <= device_reorder.free_bytes()
    return device_reorder.usable(n, n, nnz, need)


@dataclass(frozen=True, eq=False)
class DevicePull:
    """A graph's pull matrix and rank-cache factors, on the device (CuPy arrays).

    Attributes:
        matrix: the canonical Wᵀ as a CuPy CSR (int32 indices, columns ascending) in the value dtype; where
            ``pattern`` is set its values are all that weight and no kernel needs to read them.
        pattern: the weight every edge has where all are equal (every edge weighing 1 unless weighted), else None.
        dangling: bool per node, True where it has no out-weight.
        inverse: float64 per node, 1 / out-weight (0 where dangling).
        degree: out-degrees (Wᵀ's column lengths).
        order: None where the nodes keep the caller's numbers; else node i of every array above is the
            caller's node ``order[i]`` (CuPy int32, :func:`degree_order`).
        forward: W itself as a CuPy CSR in the value dtype, where asked for (the upload Wᵀ was made from);
            else None.
    """

    matrix: object
    pattern: float | None
    dangling: object
    inverse: object
    degree: object
    order: object = None
    forward: object = None


def pull_arrays(A, weighted: bool, dtype, small: bool = False, relabel: bool = False,
                forward: bool = False) -> DevicePull | None:
    """:class:`DevicePull` of square CSR graph ``A`` (edge u -> v at ``A[u, v]``) for products in ``dtype``,
    from one upload of its arrays; None where :func:`usable` says no (``small``: whatever its size) or a check
    fails (the host path then names the problem). ``relabel``: number the nodes by decreasing out-degree
    (:func:`degree_order`) before the transpose. ``forward``: keep W beside Wᵀ (``DevicePull.forward``; not
    with ``relabel``).

    Example (on a GPU machine):
        >>> pull = pull_arrays(A, True, np.float32, small=True)             # doctest: +SKIP
        >>> (pull.matrix.get() != A.T).nnz                                  # doctest: +SKIP
        0
    """
    A = A if sp.issparse(A) and A.format == "csr" else sp.csr_matrix(A)
    if A.shape[0] != A.shape[1]:
        raise MatrixError(f"an adjacency matrix is square, got {A.shape}")
    if not usable(A, dtype, small):
        return None
    if forward and relabel:
        raise ValueError("forward keeps W in the caller's numbering: not with relabel")
    try:
        return _pull(A, A.shape[0], weighted, np.dtype(dtype), relabel, forward)
    except MemoryError:  # CuPy's OutOfMemoryError is one: the host path builds it instead
        device_reorder.release()
        return None


def pull_on_device(A, weighted: bool, dtype):
    """``(Wt, dangling, inverse)`` for the graph of square CSR ``A`` (edge u -> v at ``A[u, v]``): ``Wt`` the
    canonical Wᵀ in ``dtype`` (every edge weighing 1 unless ``weighted``) with its arrays on the device
    (``device_reorder.device_csr(Wt)`` returns them) for a compiled product, ``dangling`` and ``inverse`` as
    :class:`DevicePull`'s. None where :func:`pull_arrays` gives None.

    Example (on a GPU machine):
        >>> Wt, dangling, inverse = pull_on_device(A, True, np.float32)   # doctest: +SKIP
        >>> (Wt.to_scipy() != A.T).nnz                                     # doctest: +SKIP
        0
    """
    pull = pull_arrays(A, weighted, dtype)
    if pull is None:
        return None
    return _kept(pull.matrix, pull.pattern, pull.degree, dtype), pull.dangling, pull.inverse


def products_on_device(A, dtype):
    """``(W, Wt)``: the weighted graph of square CSR ``A`` and its transpose as canonical matrices in ``dtype``
    with their arrays on the device, both from one upload of ``A`` and one run of the checks (HITS multiplies
    by both), whatever the graph's size: the alternative uploads it twice. None where :func:`pull_arrays`
    gives None (the host path then checks ``A`` and names any problem).

    Example (on a GPU machine):
        >>> W, Wt = products_on_device(A, np.float64)                       # doctest: +SKIP
        >>> (W.to_scipy() != A).nnz, (Wt.to_scipy() != A.T).nnz             # doctest: +SKIP
        (0, 0)
    """
    pull = pull_arrays(A, True, dtype, small=True, forward=True)
    if pull is None:
        return None
    t, w = pull.matrix, pull.forward
    with device_reorder.on_device():
        in_degree = t.indptr[1:] - t.indptr[:-1]  # W's column lengths are Wᵀ's row lengths
    return _kept(w, pull.pattern, in_degree, dtype), _kept(t, pull.pattern, pull.degree, dtype)


def _kept(t, pattern: float | None, col_lengths, dtype) -> CanonicalMatrix:
    """CuPy CSR ``t`` as a canonical matrix in ``dtype`` whose arrays stay on the device (kept for the
    products' layouts), the host holding its row pointers and ``col_lengths`` (a CuPy vector)."""
    n = t.shape[0]
    with device_reorder.on_device():
        col_lengths = col_lengths.astype(np.int64).get()
        csr = DeviceCsr(t.indptr, t.indices, None if pattern is not None else t.data)
        host_indptr = device_reorder.download(t.indptr)
    nnz = int(csr.indices.size)
    dtype = np.dtype(dtype)
    entries = (np.broadcast_to(np.array([pattern], dtype), (nnz,)) if pattern is not None else HostMirror(csr.data))
    M = CanonicalMatrix(indptr=host_indptr, indices=HostMirror(csr.indices), data=entries, shape=(n, t.shape[1]),
                        pattern_value=pattern)
    M.__dict__["row_lengths"] = np.diff(host_indptr).astype(np.int64)
    M.__dict__["col_lengths"] = col_lengths
    device_reorder.keep(M, csr)
    return M


def _pull(A, n: int, weighted: bool, dtype: np.dtype, relabel: bool = False, forward: bool = False
          ) -> DevicePull | None:
    with device_reorder.on_device() as cupy:
        import cupyx.scipy.sparse as cpsp
        up = device_reorder.upload
        device_reorder.expect_uploads(4 * (n + 1), 4 * A.nnz, A.data.nbytes if weighted else 0)
        indptr, indices = up(A.indptr.astype(np.int32, copy=False)), up(A.indices.astype(np.int32, copy=False))
        data = up(A.data) if weighted else None
        valid, lo, hi = _valid(cupy, indptr, indices, data, n)
        if not valid:
            return None
        if data is None:
            data = cupy.ones(indices.size, dtype)
            lo = hi = 1.0 if indices.size else None
        elif lo is not None:  # compared in the products' type, as the host path compares them
            lo, hi = float(dtype.type(lo)), float(dtype.type(hi))
        pattern = lo if lo is not None and lo == hi else None
        degree = indptr[1:] - indptr[:-1]  # out-degrees: A's row lengths, Wᵀ's column lengths
        order = None
        if relabel:
            order = degree_order(degree)
            indptr, indices, data = relabelled(indptr, indices, data, order)
            degree = degree[order]
        w = cpsp.csr_matrix((data, indices, indptr), shape=(n, n))
        t = w.T.tocsr()  # cuSPARSE csr2csc, columns ascending
        del data, indices, indptr
        if not forward:
            del w
        elif pattern is None and w.dtype != dtype:  # a pattern's products read no weights
            w = cpsp.csr_matrix((w.data.astype(dtype), w.indices, w.indptr), shape=(n, n))
        if pattern is not None:  # every edge weighs the same: a node's out-weight is its out-degree times it
            out = degree.astype(np.float64) * pattern
        else:  # the caller's weights summed in float64 by atomic adds (cupy.bincount would first build two CUB
            out = cupy.zeros(n, np.float64)  # kernels on a fresh install)
            cupy.add.at(out, t.indices, t.data.astype(np.float64, copy=False))
        if t.dtype != dtype:
            t = cpsp.csr_matrix((t.data.astype(dtype), t.indices, t.indptr), shape=(n, n))
        dangling = out == 0
        inverse = cupy.where(dangling, 0.0, 1.0 / cupy.where(dangling, 1.0, out))
    return DevicePull(t, pattern, dangling, inverse, degree, order, w if forward else None)


def degree_order(degree):
    """The nodes by decreasing out-degree, ties by number (int32, in ``degree``'s module). Numbered so, the
    rank cache entries every pull reads most sit together at the front: a warp's gathers of a hub's
    neighbours share sectors and cache lines instead of each fetching its own.

    Example:
        >>> degree_order(np.array([1, 3, 0, 3])).tolist()
        [1, 3, 0, 2]
    """
    return stable_argsort(-degree.astype(np.int64)).astype(np.int32)


def relabelled(indptr, indices, data, order):
    """The CSR arrays (int32 pointers and indices, ``data`` None stays None) of ``P A Pᵀ``: row i is row
    ``order[i]`` of ``A``, every column c renumbered to its place in ``order``; a row's entries keep their
    order, so their columns need not ascend (the transpose that follows sorts them). One pass over the
    entries on the device, each entry's row found by a scan of row starts.

    Example:
        >>> ip, ix, d = relabelled(np.array([0, 1, 3]), np.array([1, 0, 1]), np.array([5.0, 6.0, 7.0]),
        ...                        np.array([1, 0]))
        >>> ip.tolist(), ix.tolist(), d.tolist()
        ([0, 2, 3], [1, 0, 0], [6.0, 7.0, 5.0])
    """
    xp = module(indices)
    n, nnz = order.size, indices.size
    rank = xp.empty(n, np.int32)
    rank[order] = xp.arange(n, dtype=np.int32)
    lengths = (indptr[1:] - indptr[:-1])[order]
    new_ptr = prefix(lengths, np.int32)
    # Each entry's row: a one where each row starts (rows without entries add theirs at the same place), summed.
    row = xp.zeros(nnz + 1, np.int32)
    xp.add.at(row, indptr[1:-1], 1)
    row = xp.cumsum(row[:nnz], dtype=np.int32)
    dest = xp.arange(nnz, dtype=np.int32)  # in place, a step at a time: two entry-sized temporaries at most
    dest -= indptr[row]
    dest += new_ptr[rank[row]]
    del row
    out_indices = xp.empty(nnz, np.int32)
    out_indices[dest] = rank[indices]
    out_data = None
    if data is not None:
        out_data = xp.empty_like(data)
        out_data[dest] = data
    return new_ptr, out_indices, out_data


CHECK_BLOCK = 256
VALUE_CTYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}  # the graph kernels' value types


def checks_source(dtype) -> tuple[str, str]:
    """The checks kernel's name and CUDA source for weights of ``dtype`` (templates/pull_checks.cu.j2).

    Example:
        >>> name, source = checks_source(np.float64)
        >>> name, "typedef double val_t;" in source
        ('pull_checks_float64', True)
    """
    dtype = np.dtype(dtype)
    name = f"pull_checks_{dtype.name}"
    return name, codegen.render("pull_checks.cu.j2", dict(VAL=VALUE_CTYPES[dtype], block_size=CHECK_BLOCK,
                                                           kernel_name=name))


_modules: dict = {}  # (source, device) -> the loaded CuPy module


def device_modules(cupy, sources: list[str]) -> list:
    """The CuPy modules of CUDA ``sources`` on the current device, in order: those not loaded yet in this
    process built by nvcc for the device's architecture at once (in parallel, through the binary cache), then
    each loaded once per process and device (a load is a millisecond or two, as long as a small graph's whole
    run).

    Example (on a GPU machine):
        >>> module, = device_modules(cupy, [checks_source(np.float32)[1]])   # doctest: +SKIP
        >>> module.get_function(checks_source(np.float32)[0])                # doctest: +SKIP
    """
    device = cupy.cuda.Device()
    missing = list(dict.fromkeys(s for s in sources if (s, device.id) not in _modules))
    if missing:
        for source, binary in zip(missing, codegen.compile_many(missing, f"sm_{device.compute_capability}")):
            module = cupy.cuda.function.Module()
            module.load(binary.cubin)
            _modules.setdefault((source, device.id), module)
    return [_modules[(s, device.id)] for s in sources]


def cupy_function(cupy, name: str, source: str):
    """Kernel ``name`` of CUDA ``source`` on the current device (:func:`device_modules`).

    Example (on a GPU machine):
        >>> function = cupy_function(cupy, *checks_source(np.float32))   # doctest: +SKIP
    """
    return device_modules(cupy, [source])[0].get_function(name)


def _check_kernel(cupy, dtype):
    """The checks kernel for ``dtype`` on the current device; the first call loads both weight types' (a
    graph of the other type then pays for no module load)."""
    sources = [checks_source(each) for each in VALUE_CTYPES]
    device_modules(cupy, [source for _, source in sources])
    return cupy_function(cupy, *checks_source(dtype))


def _valid(cupy, indptr, indices, data, n: int) -> tuple[bool, float | None, float | None]:
    """Every check of the host path at once on the device, in one launch with three numbers read back: row
    pointers from 0 to nnz and rising, column indices in range, sorted and distinct in every row, weights
    finite and non-negative; with the weights' least and largest values (None without weights or entries).
    One launch: as a dozen CuPy reductions and a masked copy, the checks of a graph of a million edges
    would take milliseconds of launches and waits, as long as a PageRank's iterations there."""
    nnz = int(indices.size)
    if indptr.size != n + 1:
        return False, None, None
    dtype = data.dtype if data is not None else np.dtype(np.float32)  # without weights: any kernel, no data read
    # [bad, least, largest] made on the device: a host copy of it would lock host memory in CuPy's pinned pool
    out = cupy.zeros(3, np.uint64)
    out[1] = np.iinfo(np.uint64).max
    grid = max(1, min(-(-max(nnz, n + 1) // CHECK_BLOCK), 8 * cupy.cuda.Device().attributes["MultiProcessorCount"]))
    _check_kernel(cupy, dtype)((grid,), (CHECK_BLOCK,),
                               (indptr, indices, data if data is not None else np.uint64(0), np.int64(n),
                                np.int64(nnz), out))
    bad, lo, hi = (int(v) for v in out.get())
    if bad:
        return False, None, None
    if data is None or nnz == 0:
        return True, None, None
    lo, hi = (float(np.array([v], np.uint64).view(np.float64)[0]) for v in (lo, hi))
    return True, lo, hi
