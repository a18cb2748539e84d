"""SimRank on the SpGEMM path (paper 000, eq. 5-6): with W the column-normalised adjacency matrix (W[u, v] =
A[u, v] / in-weight of v), each iteration is two sparse products,

    T = Wᵀ S_k,    S_k+1 = c T W,

then the exact SimRank diagonal (every node is fully similar to itself: S_k+1[i, i] = 1), as NetworkX's
``simrank_similarity`` computes it densely. S stays sparse: entries appear only for node pairs joined by
in-paths of equal length. Where the whole S does not fit, ``threshold`` prunes it after every iteration,
dropping similarities below it. Each iteration averages similarities (W's columns sum to 1) and scales them
by c, so what one pruning drops shrinks by c an iteration: no entry ends more than threshold / (1 - c) from
the exact S (10 x threshold at c = 0.9); the tests measure it. Keeping each node's top k instead would not
converge: entries trade places at the cut from one iteration to the next.

Without pruning, S goes dense once that pays (:mod:`tuner.graph.dense_simrank`): the tuned backend on the
device (on a graph whose dense iteration takes less than compiling a sparse one's products for new
structures, from the first iteration), the host's ('scipy') in NumPy arrays once its sparse products
outnumber a dense iteration's multiply-adds and passes over S at their measured costs (on a power-law graph
of a few thousand nodes, after two or three iterations).
"""
from __future__ import annotations

import hashlib
import time

import numpy as np
import scipy.sparse as sp

from ..formats.row_bins import row_products
from ..memory import available_bytes, check_fits
from .dense_simrank import (COMPILE_FLOOR_S, HOST_DENSE_BYTES, RTOL, DenseSimRank, bandwidth_ratio,
                            dense_fits_device, dense_pays, device_simrank, host_dense_pays, host_product)
from .pagerank import ConvergenceError, IterationInfo, adjacency

BYTES_PER_PRODUCT = 24  # SciPy's product: C's entries (12 B) plus its work arrays, per scalar product at most


def _product(backend: str):
    if backend == "scipy":
        return lambda X, Y: (X @ Y).tocsr()
    if backend == "tuned":
        return ReusedProducts()
    raise ValueError(f"backend must be 'tuned' or 'scipy', got {backend!r}")


class ReusedProducts:
    """X @ Y through the tuned SpGEMM, compiled once per pair of structures: once the similarities have
    spread, S keeps its structure from one iteration to the next (and so does Wᵀ S), and each product only
    reruns its numeric phase on the new values. The ``keep`` latest pairs stay compiled (SimRank's two).

    Example (on a GPU machine):
        >>> multiply = ReusedProducts()                   # doctest: +SKIP
        >>> C = multiply(A, B); C2 = multiply(A, 2 * B)   # the second reuses the first's compile  # doctest: +SKIP
    """

    compile_s: float | None = None  # the latest compile's wall seconds in this process (any instance)

    def __init__(self, keep: int = 2):
        from ..operations import compile as compile_product
        self._compile, self._keep = compile_product, keep
        self._made: dict = {}
        self._last = None  # (X, Y, their structures' key) of the pair last asked about

    def _key(self, X, Y) -> tuple:
        """The key of X's and Y's structures, hashed once for the pair last asked about (simrank asks
        :meth:`compile_cost` and then multiplies the same matrices)."""
        if self._last is None or self._last[0] is not X or self._last[1] is not Y:
            self._last = (X, Y, (_structure(X), _structure(Y)))
        return self._last[2]

    def compile_cost(self, X, Y) -> float:
        """Seconds X @ Y would spend compiling first: none where these structures are compiled, else the
        latest compile this process timed (:data:`~tuner.graph.dense_simrank.COMPILE_FLOOR_S` before any)."""
        if self._key(X, Y) in self._made:
            return 0.0
        return COMPILE_FLOOR_S if ReusedProducts.compile_s is None else ReusedProducts.compile_s

    def __call__(self, X, Y) -> sp.csr_matrix:
        key = self._key(X, Y)
        product = self._made.pop(key, None)
        if product is None:
            t0 = time.perf_counter()
            product = self._compile(X, Y, dtype=np.float64)
            ReusedProducts.compile_s = time.perf_counter() - t0
            result = product()
        else:
            result = product(X, Y)  # the same structures: new values, numeric phase only
        self._made[key] = product  # the latest last
        while len(self._made) > self._keep:
            self._made.pop(next(iter(self._made)))  # frees its device buffers
        return result


def _structure(M) -> tuple:
    """A matrix's structure as a key: shape and a digest of its CSR index arrays."""
    M = sp.csr_matrix(M)
    h = hashlib.sha256(np.ascontiguousarray(M.indptr).view(np.uint8))
    h.update(np.ascontiguousarray(M.indices).view(np.uint8))
    return M.shape, M.indptr.dtype.str, M.indices.dtype.str, h.hexdigest()


def column_normalised(A) -> sp.csr_matrix:
    """W: the adjacency matrix with each column divided by its sum (columns without entries left empty).

    Example:
        >>> column_normalised(np.array([[1.0, 2.0], [3.0, 0.0]])).toarray().tolist()
        [[0.25, 1.0], [0.75, 0.0]]
    """
    W = adjacency(A)
    if W.nnz and W.data.min() < 0:
        raise ValueError("edge weights must be non-negative")
    in_weight = np.asarray(W.sum(axis=0)).ravel()
    in_weight[in_weight == 0] = 1.0
    return (W @ sp.diags(1.0 / in_weight)).tocsr()


def _check_fits(X: sp.csr_matrix, Y: sp.csr_matrix, what: str, products: int | None = None) -> None:
    """Refuse X Y before it runs when its scalar products (``products``, where already counted) may not fit
    host memory."""
    if products is None:
        products = int(row_products(X.indptr, X.indices, Y.indptr).sum())
    check_fits(BYTES_PER_PRODUCT * products, what, f"{BYTES_PER_PRODUCT} B per scalar product x {products:,}",
               hint="prune the similarities with threshold=")


def _prune(S: sp.csr_matrix, threshold: float) -> sp.csr_matrix:
    """``S`` without its off-diagonal entries below ``threshold``."""
    rows = np.repeat(np.arange(S.shape[0]), np.diff(S.indptr))
    keep = (rows == S.indices) | (S.data >= threshold)
    indptr = np.zeros(S.shape[0] + 1, np.int64)
    np.cumsum(np.bincount(rows[keep], minlength=S.shape[0]), out=indptr[1:])
    return sp.csr_matrix((S.data[keep], S.indices[keep], indptr), shape=S.shape)


def _with_unit_diagonal(S: sp.csr_matrix) -> sp.csr_matrix:
    n = S.shape[0]
    return (S - sp.diags(S.diagonal()) + sp.identity(n, format="csr")).tocsr()


def simrank(A, importance_factor: float = 0.9, max_iterations: int = 1000, tolerance: float = 1e-4,
            threshold: float | None = None, backend: str = "scipy",
            return_info: bool = False):
    """SimRank similarity of every pair of nodes of the graph whose edge u -> v is ``A[u, v]`` (weighted as
    ``networkx.simrank_similarity`` weights it), as a SciPy CSR matrix.

    Stops when ``numpy.allclose(S_k, S_k+1, atol=tolerance)`` holds (NetworkX's rule) and raises
    :class:`~tuner.graph.pagerank.ConvergenceError` after ``max_iterations`` without. ``threshold``: pruning
    after each iteration, within threshold / (1 - importance_factor) of the exact S (module docstring).
    ``backend``: 'scipy' (host) or 'tuned' (both products through :func:`tuner.compile`'s SpGEMM on the GPU
    while S is sparse); without ``threshold``, S goes dense once that pays, on the host or on the device
    (module docstring; ``info.backend`` says from which iteration), and on the host also where the sparse
    product would not fit but the dense arrays do. A product whose result may not fit host memory is refused
    before it runs, with the figures.

    Example:
        >>> A = sp.csr_matrix(np.array([[0, 1, 1], [0, 0, 0], [0, 0, 0]], dtype=float))  # 0 -> 1, 0 -> 2
        >>> simrank(A).toarray().round(2).tolist()   # 1 and 2 share their only in-neighbour
        [[1.0, 0.0, 0.0], [0.0, 1.0, 0.9], [0.0, 0.9, 1.0]]
    """
    if not 0 < importance_factor < 1:
        raise ValueError(f"importance_factor must be in (0, 1), got {importance_factor}")
    if max_iterations < 1 or tolerance <= 0:
        raise ValueError(f"max_iterations and tolerance must be positive, got {max_iterations} and {tolerance}")
    if threshold is not None and not threshold > 0:
        raise ValueError(f"threshold must be positive, got {threshold}")
    multiply = _product(backend)
    t0 = time.perf_counter()
    W = column_normalised(A)
    n = W.shape[0]
    Wt = W.T.tocsr()
    S = sp.identity(n, format="csr")
    dense = None  # the device iterations on a dense S, once they pay (tuned backend, no pruning)
    ratio = bandwidth_ratio() if backend == "tuned" and threshold is None else 0.0
    for iteration in range(1, max_iterations + 1):
        if dense is None:
            products = int(row_products(Wt.indptr, Wt.indices, S.indptr).sum())
            # Both products compile anew where Wᵀ S's structures are new (T W's follow from them).
            compile_s = 2 * multiply.compile_cost(Wt, S) if hasattr(multiply, "compile_cost") else 0.0
            if backend == "tuned" and threshold is None and _goes_dense(Wt, n, products, ratio, compile_s):
                dense, dense_from = device_simrank(Wt, S), iteration
            elif backend == "scipy" and threshold is None and _host_goes_dense(Wt, n, products):
                dense, dense_from = DenseSimRank(S, host_product(Wt), np, lookahead=False), iteration
            else:
                _check_fits(Wt, S, f"SimRank's product Wᵀ S (iteration {iteration})", products)
        if dense is not None:
            error = dense.step(importance_factor)
            if error <= tolerance:
                S = dense.result()
                break
            continue
        T = multiply(Wt, S)
        _check_fits(T, W, f"SimRank's product (Wᵀ S) W (iteration {iteration})")
        new = _with_unit_diagonal(importance_factor * multiply(T, W))
        if threshold is not None:
            new = _prune(new, threshold)
        # numpy.allclose(S, new, atol=tolerance) over the entries either has
        gap = (abs(new - S) - RTOL * abs(new)).tocsr()
        error = float(gap.data.max()) if gap.nnz else 0.0
        S = new
        if error <= tolerance:
            break
    else:
        raise ConvergenceError(f"SimRank did not converge in {max_iterations} iterations (tolerance {tolerance})")
    backend_used = backend if dense is None else f"{backend} (dense from iteration {dense_from})"
    info = IterationInfo(iteration, max(error, 0.0), {"setup": 0.0, "iterations": time.perf_counter() - t0},
                         backend_used)
    return (S, info) if return_info else S


def _host_goes_dense(Wt: sp.csr_matrix, n: int, products: int) -> bool:
    """Whether the host's next iteration runs on a dense S: its arrays fit host memory, and it takes less time
    so (:func:`~tuner.graph.dense_simrank.host_dense_pays`) or the sparse product would not fit."""
    room = available_bytes()
    if HOST_DENSE_BYTES * n * n > room:
        return False
    return host_dense_pays(Wt.nnz, n, products) or BYTES_PER_PRODUCT * products > room


def _goes_dense(Wt: sp.csr_matrix, n: int, products: int, ratio: float, compile_s: float) -> bool:
    """Whether the next iteration runs on a dense S: it pays (:func:`~tuner.graph.dense_simrank.dense_pays`:
    the two sparse products estimated at twice the first's scalar products, after ``compile_s`` compiling),
    and the dense S and the SciPy matrix it ends as (an n x n float64 array, then 12 B per entry) fit host
    memory and the device's free memory (:func:`~tuner.graph.dense_simrank.dense_bytes`)."""
    return (dense_pays(Wt.nnz, n, 2 * products, ratio, compile_s) and n * n * (8 + 12) <= available_bytes()
            and dense_fits_device(n))
