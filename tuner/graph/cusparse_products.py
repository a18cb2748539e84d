"""cuSPARSE's SpMV and SpMM with their descriptors and work space made once, as a careful CuPy user calls them
for an iterative method: ``cupyx.cusparse.spmv`` and ``spmm`` (and CuPy's ``@``) make the descriptors, ask for
the work space's size and allocate it at every call, host time that on a graph of a few thousand nodes
outlasts the product.

cuSPARSE's SpMM reads, for each entry (i, j) of the sparse matrix, row j of the dense operand. Row-major, that
row is contiguous (k columns: k values, a sector or a few); column-major, as CuPy's ``csr @ dense`` converts
every operand to, its values lie a column apart, a sector each: :class:`CachedSpmm` takes either order, and
the solvers hand it row-major blocks (the SpMM bench times cuSPARSE in both).

A careful caller of many products also lets cuSPARSE analyse the matrix once (``cusparseSpMV_preprocess``,
``cusparseSpMM_preprocess``): the calls after it skip that work, a sizeable part of a CSR product's call on
a small graph. CuPy binds neither, so they are called through ctypes from
the copy of cuSPARSE CuPy has loaded; where that copy lacks them (SpMV's before cuSPARSE 12.4) or they fail,
the products run without (``preprocessed`` says which).
"""
from __future__ import annotations

import ctypes
import logging

import numpy as np

log = logging.getLogger("tuner.graph.cusparse_products")
_functions: dict = {}  # entry point name -> ctypes function of the loaded cuSPARSE, or None


def loaded_function(name: str, maps: str = "/proc/self/maps"):
    """The cuSPARSE entry point ``name`` (a ctypes function returning the status as an int) from the copy of
    the library this process has mapped (CuPy's, so that its handles and descriptors are that copy's); None
    where no cuSPARSE is mapped or it lacks ``name``.

    Example:
        >>> loaded_function("cusparseSpMV_preprocess", maps="/nonexistent") is None
        True
    """
    key = (name, maps)
    if key not in _functions:
        _functions[key] = None
        try:
            with open(maps) as f:
                paths = {line.split()[-1] for line in f if "libcusparse.so" in line}
        except OSError:
            paths = set()
        for path in sorted(paths):
            try:
                function = getattr(ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL), name)
            except (OSError, AttributeError):
                continue
            function.restype = ctypes.c_int
            _functions[key] = function
            break
    return _functions[key]


def _preprocess(name: str, *args) -> bool:
    """Call cuSPARSE's ``name`` (a preprocessing entry point) on ``args``, (int, whether it is a pointer)
    pairs (pointers go as void pointers, enums as C ints): whether it ran and succeeded."""
    function = loaded_function(name)
    if function is None:
        return False
    status = function(*(ctypes.c_void_p(a) if big else ctypes.c_int(a) for a, big in args))
    if status != 0:
        log.info("%s returned status %d: the products run without it", name, status)
    return status == 0


class _KeptMatrix:
    """The sparse side of a product with kept descriptors: CuPy CSR or COO matrix ``a`` (canonical: sorted, no
    duplicates), its cuSPARSE descriptor, held with it (the descriptor points at its arrays), and its
    values' CUDA type."""

    def __init__(self, a):
        import cupy
        import cupyx.cusparse
        from cupy._core import _dtype
        from cupy_backends.cuda.libs import cusparse
        if not a.has_canonical_format:
            raise ValueError(f"{type(self).__name__} takes a matrix in canonical format (sorted, no duplicates)")
        self._cupy, self._cusparse, self._descriptors = cupy, cusparse, cupyx.cusparse
        self._a, self._desc_a = a, cupyx.cusparse.SpMatDescriptor.create(a)
        self._type = _dtype.to_cuda_dtype(a.dtype)


class CachedSpmm(_KeptMatrix):
    """cuSPARSE's SpMM ``out = alpha a X`` of one CuPy CSR matrix ``a`` by CuPy arrays X and out, both
    row-major (C-contiguous: the fast order, module docstring) or both column-major, the descriptors and work
    space of each (X, out) made at its first call and kept: ``cupyx.cusparse.spmm`` makes three descriptors,
    asks for the work space's size and allocates it at every call, host time that on a graph of a few
    thousand nodes outlasts the product, and takes column-major arrays only. The cache holds X and out (keyed
    by their addresses, shapes and order), so a key always names the same arrays.

    Example (on a GPU machine):
        >>> spmm = CachedSpmm(wt); spmm(S, T); spmm(T, S2, alpha=0.9)   # doctest: +SKIP
    """

    def __init__(self, a):
        super().__init__(a)
        self._plans: dict = {}
        self.preprocessed = False  # whether cuSPARSE analysed the matrix for the last new (X, out) pair

    def _dense(self, X, row_major: bool):
        """A dense-matrix descriptor of X in its order (CuPy's own describes column-major arrays only)."""
        cusparse = self._cusparse
        rows, cols = X.shape
        order = cusparse.CUSPARSE_ORDER_ROW if row_major else cusparse.CUSPARSE_ORDER_COL
        desc = cusparse.createDnMat(rows, cols, cols if row_major else rows, X.data.ptr, self._type, order)
        return self._descriptors.DnMatDescriptor(desc, cusparse.dnMatGet, cusparse.destroyDnMat)

    def __call__(self, X, out, alpha: float = 1.0) -> None:
        if self._a.nnz == 0:  # as cupyx.cusparse.spmm: no product to call cuSPARSE for
            out.fill(0)
            return
        cusparse = self._cusparse
        handle = self._cupy.cuda.device.get_cusparse_handle()
        op = cusparse.CUSPARSE_OPERATION_NON_TRANSPOSE
        # alpha, beta: read from the host during the call, in the compute type (the values' type)
        scalars = np.array([alpha, 0.0], self._a.dtype)
        alpha_at, beta_at = scalars.ctypes.data, scalars.ctypes.data + scalars.itemsize
        row_major = bool(X.flags.c_contiguous and out.flags.c_contiguous)
        key = (X.data.ptr, X.shape, out.data.ptr, out.shape, row_major)
        plan = self._plans.get(key)
        if plan is None:
            if not row_major and not (X.flags.f_contiguous and out.flags.f_contiguous):
                raise ValueError("CachedSpmm takes X and out both row-major (C-contiguous) or both column-major")
            desc_b, desc_c = self._dense(X, row_major), self._dense(out, row_major)
            # A matrix descriptor of the plan's own: cuSPARSE keeps one analysis per descriptor, in that
            # plan's work space, and the analysis is of the product's shapes and orders too.
            desc_a = self._descriptors.SpMatDescriptor.create(self._a)
            size = cusparse.spMM_bufferSize(handle, op, op, alpha_at, desc_a.desc, desc_b.desc, beta_at,
                                            desc_c.desc, self._type, cusparse.CUSPARSE_MM_ALG_DEFAULT)
            work = self._cupy.empty(max(int(size), 1), np.int8)
            self.preprocessed = self._a.format == "csr" and _preprocess(
                "cusparseSpMM_preprocess", (handle, True), (op, False), (op, False), (alpha_at, True),
                (desc_a.desc, True), (desc_b.desc, True), (beta_at, True), (desc_c.desc, True),
                (self._type, False), (cusparse.CUSPARSE_MM_ALG_DEFAULT, False), (work.data.ptr, True))
            plan = self._plans[key] = (X, out, desc_a, desc_b, desc_c, work)
        _, _, desc_a, desc_b, desc_c, work = plan
        cusparse.spMM(handle, op, op, alpha_at, desc_a.desc, desc_b.desc, beta_at, desc_c.desc,
                      self._type, cusparse.CUSPARSE_MM_ALG_DEFAULT, work.data.ptr)


class CachedSpmv(_KeptMatrix):
    """cuSPARSE's SpMV ``y = a x`` of one CuPy CSR (or COO) matrix ``a`` by CuPy vectors, the matrix's
    descriptor and the work space made once, a CSR matrix analysed once by ``cusparseSpMV_preprocess`` at the
    first call (module docstring; ``preprocessed`` says whether it was), each (x, y) pair's vector
    descriptors at its first call and kept (the cache holds x and y, keyed by their addresses, so a key
    always names the same arrays): a call after the first of a pair allocates nothing and is one cuSPARSE
    call. (CuPy refuses cuSPARSE calls while a stream is captured, so the calls cannot go into a CUDA graph.)

    Example (on a GPU machine):
        >>> spmv = CachedSpmv(at); spmv(cache, pulled)   # doctest: +SKIP
    """

    def __init__(self, a):
        super().__init__(a)
        # alpha 1, beta 0: read from the host during the call, in the compute type (the values' type)
        self._scalars = np.array([1.0, 0.0], a.dtype)
        self._vectors: dict = {}
        self._work = None
        self.preprocessed = False

    def __call__(self, x, y) -> None:
        if x.shape != (self._a.shape[1],) or y.shape != (self._a.shape[0],):
            raise ValueError(f"CachedSpmv of a {self._a.shape} matrix takes x of {self._a.shape[1]} and y of "
                             f"{self._a.shape[0]} values, got {x.shape} and {y.shape}")
        if self._a.nnz == 0:  # as cupyx.cusparse.spmv: no product to call cuSPARSE for
            y.fill(0)
            return
        cusparse = self._cusparse
        handle = self._cupy.cuda.device.get_cusparse_handle()  # bound to the current stream
        # the algorithm cupyx.cusparse.spmv asks for
        op, alg = cusparse.CUSPARSE_OPERATION_NON_TRANSPOSE, cusparse.CUSPARSE_MV_ALG_DEFAULT
        alpha_at = self._scalars.ctypes.data
        beta_at = alpha_at + self._scalars.itemsize
        key = (x.data.ptr, y.data.ptr)
        pair = self._vectors.get(key)
        if pair is None:
            if not (x.flags.c_contiguous and y.flags.c_contiguous):
                raise ValueError("CachedSpmv takes contiguous vectors")
            if x.dtype != self._a.dtype or y.dtype != self._a.dtype:
                raise ValueError(f"CachedSpmv of a {self._a.dtype} matrix takes {self._a.dtype} vectors, got "
                                 f"{x.dtype} and {y.dtype}")
            desc_x = self._descriptors.DnVecDescriptor.create(x)
            desc_y = self._descriptors.DnVecDescriptor.create(y)
            if self._work is None:  # the work space's size depends on the matrix and the types alone
                size = cusparse.spMV_bufferSize(handle, op, alpha_at, self._desc_a.desc, desc_x.desc, beta_at,
                                                desc_y.desc, self._type, alg)
                self._work = self._cupy.empty(max(int(size), 1), np.int8)
                # The analysis is of the matrix (its one work space holds it), whatever vectors follow.
                self.preprocessed = self._a.format == "csr" and _preprocess(
                    "cusparseSpMV_preprocess", (handle, True), (op, False), (alpha_at, True),
                    (self._desc_a.desc, True), (desc_x.desc, True), (beta_at, True), (desc_y.desc, True),
                    (self._type, False), (alg, False), (self._work.data.ptr, True))
            pair = self._vectors[key] = (x, y, desc_x, desc_y)
        _, _, desc_x, desc_y = pair
        cusparse.spMV(handle, op, alpha_at, self._desc_a.desc, desc_x.desc, beta_at, desc_y.desc, self._type, alg,
                      self._work.data.ptr)
