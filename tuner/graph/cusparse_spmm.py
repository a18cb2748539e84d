"""cuSPARSE's SpMM of a sparse matrix by dense blocks, row-major or column-major, its descriptors kept.

cuSPARSE's SpMM reads, for each entry (i, j) of the sparse matrix, row j of the dense operand. Row-major, that
row is contiguous (k columns: k values, a sector or a few); column-major, as CuPy's ``csr @ dense`` converts
every operand to, its values lie a column apart, a sector each. Measured on an H200 (float64): SimRank's
dense products of bcsstk16 (4,884 columns) 2.6 ms an iteration row-major against 9.2 column-major; eight
columns of rmat:23's Aᵀ 9.7 ms against 20.4 through CuPy.
"""
from __future__ import annotations

import numpy as np


class CachedSpmm:
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
        import cupy
        import cupyx.cusparse
        from cupy._core import _dtype
        from cupy_backends.cuda.libs import cusparse
        if not a.has_canonical_format:
            raise ValueError("CachedSpmm takes a CSR matrix in canonical format (sorted, no duplicates)")
        self._cupy, self._cusparse, self._descriptors = cupy, cusparse, cupyx.cusparse
        self._a, self._desc_a = a, cupyx.cusparse.SpMatDescriptor.create(a)  # held: the descriptor points at it
        self._type = _dtype.to_cuda_dtype(a.dtype)
        self._plans: dict = {}

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
            size = cusparse.spMM_bufferSize(handle, op, op, alpha_at, self._desc_a.desc, desc_b.desc, beta_at,
                                            desc_c.desc, self._type, cusparse.CUSPARSE_MM_ALG_DEFAULT)
            plan = self._plans[key] = (X, out, desc_b, desc_c, self._cupy.empty(max(int(size), 1), np.int8))
        _, _, desc_b, desc_c, work = plan
        cusparse.spMM(handle, op, op, alpha_at, self._desc_a.desc, desc_b.desc, beta_at, desc_c.desc,
                      self._type, cusparse.CUSPARSE_MM_ALG_DEFAULT, work.data.ptr)
