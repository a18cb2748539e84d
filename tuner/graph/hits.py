"""HITS hubs and authorities with NetworkX's semantics on a SciPy adjacency matrix (edge u -> v is A[u, v]).

As ``networkx.hits`` does, the authorities are A's leading right singular vector and the hubs are A times
them. Lanczos iterations find it where a plain power iteration on Aᵀ A needs hundreds of products when the
leading singular values are close:

* ``backend='device'`` (the default where CuPy reaches a GPU, for graphs of ``DEVICE_MIN_NODES`` nodes or
  more): thick-restart Lanczos on Aᵀ A with its vectors on the device (:mod:`tuner.graph.lanczos`), each
  product by Aᵀ A two launches of the tuned SpMV (:func:`device_authorities`);
* ``'tuned'``: ARPACK on the host (``scipy.sparse.linalg.svds``, k=1, as NetworkX calls it), each product by A
  or Aᵀ the tuned SpMV's, the vector crossing PCIe both ways;
* ``'scipy'``: the same ARPACK iterations with SciPy's products.

A Lanczos step on the device costs a fixed six launches (about a tenth of a millisecond of host time, the
two products included); ARPACK's step on the host costs passes over its vectors and two round trips of n values
over PCIe, growing with n: below ``DEVICE_MIN_NODES`` nodes the host's step is the cheaper, above it the
device's. Both keep a basis of ``LANCZOS_VECTORS``, so they take about as many products.

With a communicator (``comm``, :mod:`tuner.distributed`) every rank runs the same ARPACK iterations on the
host from the same start, and each product by A or Aᵀ is split by rows among the ranks (their GPUs, or SciPy
with ``backend='scipy'``), the result gathered whole on every rank.
"""
from __future__ import annotations

import time

import numpy as np
import scipy.sparse as sp  # noqa: F401 - the example uses it

from ..formats.transpose import transpose
from ..matrix import MatrixError, check_value_dtype
from .lanczos import leading_eigenpair
from .pagerank import ConvergenceError, IterationInfo, _multiply, _node_vector, adjacency, default_backend

BACKENDS = ("device", "tuned", "scipy")
DEVICE_MIN_NODES = 1 << 11  # the default runs Lanczos on the device from here on (module docstring)
LANCZOS_VECTORS = 20  # ARPACK's basis for one singular triple as svds (and so NetworkX) sets it
DEVICE_SHARE = 2  # the Lanczos basis may take at most half the device's free memory


def hits_backend(backend: str | None, n: int) -> str:
    """``backend`` (one of ``BACKENDS``), or where None: 'device' where CuPy reaches a GPU and the graph has at
    least ``DEVICE_MIN_NODES`` nodes, else 'tuned' (module docstring).

    Example:
        >>> hits_backend("scipy", 10), hits_backend("tuned", 10**6)
        ('scipy', 'tuned')
    """
    chosen = default_backend(backend, BACKENDS, "tuned")
    return "tuned" if backend is None and chosen == "device" and n < DEVICE_MIN_NODES else chosen


def lanczos_vectors(n: int, itemsize: int, free_bytes: int) -> int:
    """Vectors of the device Lanczos basis for ``n`` nodes: ``LANCZOS_VECTORS``, fewer where they would take
    over 1/``DEVICE_SHARE`` of ``free_bytes`` (each restart then keeps fewer directions: more products), 0
    where not even 8 fit (ARPACK on the host then).

    Example (8M nodes in float64: 20 vectors take 1.3 GB):
        >>> [lanczos_vectors(8 << 20, 8, free) for free in (80 << 30, 1 << 30, 1 << 28)]
        [20, 8, 0]
    """
    fits = free_bytes // DEVICE_SHARE // max(1, n * itemsize)
    return int(min(LANCZOS_VECTORS, fits)) if fits >= 8 else 0


def device_authorities(forward, backward, n: int, start, max_iter: int, tol: float, dtype, vectors: int):
    """A's leading right singular vector by thick-restart Lanczos on Aᵀ A on the device
    (:func:`~tuner.graph.lanczos.leading_eigenpair`: two products and four kernels a step, the host reading the
    coefficients once per cycle of the basis): (authorities as a CuPy vector of unit norm, summing to a positive
    value; products by A or Aᵀ made). ``forward(v, out)`` and ``backward(v, out)`` write A v and Aᵀ v into
    ``out`` (CuPy vectors of ``dtype``); ``start``: the first Lanczos vector (None: all ones, which the
    nonnegative leading vector of a graph is never orthogonal to); ``vectors``: the basis
    (:func:`lanczos_vectors`). ``max_iter`` and ``tol`` are ARPACK's as NetworkX passes them: cycles of the
    basis, and the residual relative to the eigenvalue, here relative to the Rayleigh quotient of the start (at
    most the eigenvalue: a stopping rule at least as strict). Raises
    :class:`~tuner.graph.pagerank.ConvergenceError` where the residual is still above it after ``max_iter``
    cycles (and above the rounding of the eigenvalue).

    Example (on a GPU machine; cuSPARSE's products):
        >>> F = cupyx.scipy.sparse.csr_matrix(A); B = F.T.tocsr()                      # doctest: +SKIP
        >>> fwd = lambda v, out: cupyx.cusparse.spmv(F, v, y=out)                       # doctest: +SKIP
        >>> a, products = device_authorities(fwd, lambda v, out: cupyx.cusparse.spmv(B, v, y=out), n, None, 100,
        ...                                  1e-8, np.float64, LANCZOS_VECTORS)          # doctest: +SKIP
    """
    import cupy

    from ..formats import device_reorder
    dtype = np.dtype(dtype)
    y = cupy.empty(n, dtype)

    def normal(v, out):  # Aᵀ A v
        forward(v, y)
        backward(y, out)
    v0 = cupy.ones(n, dtype) if start is None else device_reorder.upload(np.asarray(start, dtype=dtype))
    pair = leading_eigenpair(normal, v0, min(vectors, n), max_iter, tol)
    if not pair.converged and pair.residual > 64 * np.finfo(dtype).eps * abs(pair.value):
        raise ConvergenceError(f"HITS: Lanczos did not converge in {max_iter} restarts (tol {tol}; residual "
                               f"{pair.residual / max(pair.value, np.finfo(dtype).tiny):.3g} of the eigenvalue)")
    a = pair.vector
    if _total(a) < 0:
        a = -a
    return a, 2 * pair.products


def _total(v, w=None) -> float:
    """Sum of CuPy vector ``v`` (times ``w`` entry by entry) by a kernel of our own (CuPy's reductions build a
    CUB kernel each on a machine's first use)."""
    from ..formats import xp
    return float(xp.sum64(v, w).get()[0])


def hits(A, max_iter: int = 100, tol: float = 1e-8, nstart=None, normalized: bool = True,
         backend: str | None = None, dtype=np.float64, return_info: bool = False, device_memory_limit=None,
         comm=None, tune: str = "none"):
    """(hubs, authorities) of the graph whose edge u -> v is ``A[u, v]``, as ``networkx.hits`` computes them.

    ``backend``: 'device', 'tuned' or 'scipy' (module docstring; default 'device' where CuPy reaches a GPU and
    the graph has ``DEVICE_MIN_NODES`` nodes or more, else 'tuned'). ``max_iter`` and ``tol`` are ARPACK's (as
    in NetworkX; on the device, restarts of the Lanczos basis and the residual relative to the eigenvalue
    alike: :func:`device_authorities`); ``nstart``: the starting vector (array or {node: value} dict; on the
    device all ones without one). ``normalized``: both vectors sum to 1 (else A's unit right singular vector
    and A times it). With ``return_info``, an :class:`~tuner.graph.pagerank.IterationInfo` whose
    ``iterations`` counts the products by A and by Aᵀ. ``device_memory_limit`` (ARPACK on the host): as
    :func:`~tuner.graph.pagerank.pagerank`'s, each of the two products streamed from host memory where it does
    not fit. ``comm``: the ranks to split
    the products among (every rank calls this with the same A; each gets the whole result; ARPACK starts from
    ``nstart`` or all ones so that every rank iterates alike). ``tune`` (backend 'tuned', one GPU): how the
    products by A and Aᵀ are compiled (:func:`tuner.compile`'s modes); the default, 'none', runs the generic
    kernel, ready in milliseconds: ARPACK's tens of products never repay a tuning. On one GPU (no ``comm``,
    no ``device_memory_limit``) a CSR ``A`` is uploaded once and checked there, and both products are made from
    that upload (:func:`~tuner.graph.device_pull.products_on_device`); a graph that fails a check there is
    checked on the host, which names the problem. Raises :class:`~tuner.graph.pagerank.ConvergenceError`
    where the iterations do not converge.

    Example:
        >>> A = sp.csr_matrix(np.array([[0, 1, 1], [0, 0, 1], [1, 0, 0]], dtype=float))
        >>> h, a = hits(A, backend="scipy")
        >>> (h.round(3) + 0.0).tolist(), (a.round(3) + 0.0).tolist()  # + 0.0: ARPACK may leave a -0.0
        ([0.618, 0.382, 0.0], [0.0, 0.382, 0.618])
    """
    if max_iter < 1 or tol < 0:
        raise ValueError(f"max_iter must be positive and tol non-negative, got {max_iter} and {tol}")
    check_value_dtype(dtype)
    from ..compiler import check_tune
    tune = check_tune(tune)
    t0 = time.perf_counter()
    # On one GPU both products come from one upload, checked there; anything else (or a graph failing a
    # check there) takes the host's checks, which name the problem.
    products = _device_products(A, backend, dtype, tune) if comm is None and device_memory_limit is None else None
    if products is not None:
        n, (forward, backward) = A.shape[0], products
        backend = _backend_for(backend, n, comm, device_memory_limit)
    else:
        W = adjacency(A)
        n = W.shape[0]
        if W.nnz == 0 or n < 2:
            raise MatrixError("HITS needs at least two nodes and one edge")
        backend = _backend_for(backend, n, comm, device_memory_limit)
        if comm is not None:
            forward, backward = (_split_product(M, comm, backend, dtype) for M in (W, transpose(W)))
        else:
            forward, backward = _products(W, "tuned" if backend == "device" else backend, dtype,
                                          device_memory_limit, tune)
    how = backend
    from scipy.sparse.linalg import ArpackNoConvergence, LinearOperator, svds  # ARPACK: loaded on first use

    start = None if nstart is None else _node_vector(nstart, n, "nstart")
    if start is None and comm is not None:
        start = np.ones(n)  # ARPACK's own random start may differ between ranks
    t1 = time.perf_counter()
    if backend == "device":  # the basis beside the products, in what they leave free
        from ..formats import device_reorder
        free = device_reorder.free_bytes()
        vectors = lanczos_vectors(n, np.dtype(dtype).itemsize, free)
        how = f"device (Lanczos on the GPU, {vectors} vectors, tuned products)"
        if vectors == 0:
            backend, how = "tuned", (f"tuned (ARPACK on the host: 8 Lanczos vectors of {n:,} nodes need more than "
                                     f"1/{DEVICE_SHARE} of the device's {free:,} free bytes)")
    if backend == "device":
        a, products = device_authorities(lambda v, out: forward(v, out=out), lambda v, out: backward(v, out=out),
                                         n, start, max_iter, tol, dtype, vectors)
        h = forward(a)
        if normalized:
            h, a = h / _total(h), a / _total(a)
        h, a = (device_reorder.download(v.astype(np.float64, copy=False)) for v in (h, a))
        info = IterationInfo(products + 1, float("nan"), {"setup": t1 - t0, "iterations": time.perf_counter() - t1},
                             how)
        return ((h, a), info) if return_info else (h, a)
    calls = [0]

    def counted(product):
        def run(v):
            calls[0] += 1
            return np.asarray(product(np.ascontiguousarray(np.ravel(v), dtype=np.float64)), dtype=np.float64)
        return run

    op = LinearOperator((n, n), matvec=counted(forward), rmatvec=counted(backward), dtype=np.float64)
    try:
        _, _, vt = svds(op, k=1, v0=start, maxiter=max_iter, tol=tol)
    except ArpackNoConvergence as e:
        raise ConvergenceError(f"HITS: ARPACK did not converge in {max_iter} iterations (tol {tol})") from e
    a = vt.ravel().real
    h = counted(forward)(a)
    if normalized:
        h, a = h / h.sum(), a / a.sum()
    info = IterationInfo(calls[0], float("nan"), {"setup": t1 - t0, "iterations": time.perf_counter() - t1}, how)
    return ((h, a), info) if return_info else (h, a)


def _device_products(A, backend: str | None, dtype, tune: str):
    """The products by A and by Aᵀ compiled from one upload of CSR graph ``A`` to this GPU, checked there
    (:func:`~tuner.graph.device_pull.products_on_device`), where ``backend`` multiplies on the GPU (None,
    'device' or 'tuned') and CuPy reaches one; else None."""
    import scipy.sparse as sparse
    if backend not in (None, "device", "tuned") or not (sparse.issparse(A) and A.format == "csr") \
            or A.shape[0] != A.shape[1] or A.shape[0] < 2 or A.nnz == 0:
        return None
    from ..formats import device_reorder
    if not device_reorder.available():
        return None
    from ..operations import compile as compile_product
    from .device_pull import products_on_device
    made = products_on_device(A, dtype)
    if made is None:
        return None
    return tuple(compile_product(M, dtype=dtype, tune=tune) for M in made)


def _products(W, backend: str, dtype, device_memory_limit, tune: str):
    """The products by W and by Wᵀ on one device (or SciPy's) where :func:`_device_products` does not make
    them: W uploaded by its compile and Wᵀ made on the host."""
    forward = _multiply(W, backend, dtype, device_memory_limit, tune)
    if backend == "scipy":
        return forward, _multiply(W.T.tocsr(), backend, dtype)
    return forward, _multiply(transpose(W), backend, dtype, device_memory_limit, tune)


def _backend_for(backend: str | None, n: int, comm, device_memory_limit) -> str:
    """The backend of a HITS run: 'device' only on one GPU with the products in its memory (with ``comm`` or
    ``device_memory_limit``, ARPACK on the host: 'tuned' by default); where the Lanczos basis does not fit
    beside the products, :func:`hits` runs ARPACK on the host instead."""
    if comm is not None or device_memory_limit is not None:
        if backend == "device":
            raise ValueError("backend='device' runs every Lanczos step on one GPU holding both products: with comm= "
                             "or device_memory_limit= use 'tuned' (ARPACK on the host) or 'scipy'")
        backend = backend or "tuned"
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        return backend
    backend = hits_backend(backend, n)
    if backend == "device":
        from .. import gpu
        from ..formats import device_reorder
        if not device_reorder.available():
            raise gpu.NoDeviceError("HITS with backend='device' runs Lanczos on the GPU, and CuPy reaches no GPU here: "
                                    "use backend='tuned' or 'scipy'")
    return backend


def _split_product(M, comm, backend: str, dtype):
    """v -> M v for whole host vectors, M's rows split among ``comm``'s ranks (each multiplies its own, with
    SciPy for backend 'scipy', else its tuned kernel), the result gathered whole on every rank."""
    from ..distributed import DistributedSpMV
    local = (lambda R: (lambda v: R.astype(np.float64) @ v)) if backend == "scipy" else None
    spmv = DistributedSpMV(M.astype(dtype) if backend != "scipy" else M, comm, local_compile=local)
    return lambda v: spmv.gather(np.asarray(spmv(spmv.scatter(np.asarray(v, dtype=spmv.dtype)))))
