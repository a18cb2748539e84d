"""HITS hubs and authorities with NetworkX's semantics on a SciPy adjacency matrix (edge u -> v is A[u, v]).

As ``networkx.hits`` does, the authorities are A's leading right singular vector, found by ARPACK
(``scipy.sparse.linalg.svds``, k=1) and the hubs are A times them; here ARPACK sees A as an operator whose
products by A and Aᵀ are the tuned SpMV's (``backend='tuned'``) or SciPy's (``backend='scipy'``). ARPACK's
Lanczos iterations converge where a plain power iteration on Aᵀ A needs hundreds of products when the leading
singular values are close.

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
from .pagerank import ConvergenceError, IterationInfo, _multiply, _node_vector, adjacency


def hits(A, max_iter: int = 100, tol: float = 1e-8, nstart=None, normalized: bool = True,
         backend: str = "tuned", dtype=np.float64, return_info: bool = False, device_memory_limit=None, comm=None,
         tune: str = "none"):
    """(hubs, authorities) of the graph whose edge u -> v is ``A[u, v]``, as ``networkx.hits`` computes them.

    ``max_iter`` and ``tol`` are ARPACK's (as in NetworkX); ``nstart``: its starting vector (array or
    {node: value} dict). ``normalized``: both vectors sum to 1 (else as ARPACK returns them). With
    ``return_info``, an :class:`~tuner.graph.pagerank.IterationInfo` whose ``iterations`` counts the products
    by A and by Aᵀ. ``device_memory_limit`` (backend 'tuned'): as :func:`~tuner.graph.pagerank.pagerank`'s,
    each of the two products streamed from host memory where it does not fit. ``comm``: the ranks to split
    the products among (every rank calls this with the same A; each gets the whole result; ARPACK starts from
    ``nstart`` or all ones so that every rank iterates alike). ``tune`` (backend 'tuned', one GPU): how the
    products by A and Aᵀ are compiled (:func:`tuner.compile`'s modes); the default, 'none', runs the generic
    kernel, ready in milliseconds: ARPACK's tens of products never repay a tuning. Raises
    :class:`~tuner.graph.pagerank.ConvergenceError` where ARPACK does not converge.

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
    W = adjacency(A)
    n = W.shape[0]
    if W.nnz == 0 or n < 2:
        raise MatrixError("HITS needs at least two nodes and one edge")
    from scipy.sparse.linalg import ArpackNoConvergence, LinearOperator, svds  # ARPACK: loaded on first use

    t0 = time.perf_counter()
    if comm is not None:
        forward, backward = (_split_product(M, comm, backend, dtype) for M in (W, transpose(W)))
    else:
        forward = _multiply(W, backend, dtype, device_memory_limit, tune)
        backward = _multiply(W.T.tocsr() if backend == "scipy" else transpose(W), backend, dtype,
                             device_memory_limit, tune)
    start = None if nstart is None else _node_vector(nstart, n, "nstart")
    if start is None and comm is not None:
        start = np.ones(n)  # ARPACK's own random start may differ between ranks
    t1 = time.perf_counter()
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
    info = IterationInfo(calls[0], float("nan"), {"setup": t1 - t0, "iterations": time.perf_counter() - t1}, backend)
    return ((h, a), info) if return_info else (h, a)


def _split_product(M, comm, backend: str, dtype):
    """v -> M v for whole host vectors, M's rows split among ``comm``'s ranks (each multiplies its own, with
    SciPy for backend 'scipy', else its tuned kernel), the result gathered whole on every rank."""
    from ..distributed import DistributedSpMV
    local = (lambda R: (lambda v: R.astype(np.float64) @ v)) if backend == "scipy" else None
    spmv = DistributedSpMV(M.astype(dtype) if backend != "scipy" else M, comm, local_compile=local)
    return lambda v: spmv.gather(np.asarray(spmv(spmv.scatter(np.asarray(v, dtype=spmv.dtype)))))
