"""The leading eigenpair of a symmetric positive semi-definite operator (HITS's Aᵀ A) by thick-restart Lanczos,
the host out of the steps.

CuPy's ``eigsh`` makes each Lanczos step of some fifteen host calls (cuBLAS dots, norms, axpys and two gemvs,
kernels of its own, the operator's copies): on cit-HepPh (4 x 10^5 edges, H200) 0.36 ms a step, where the
calls of its two products take 0.04 ms. Here a step is the operator's products and four kernels (:data:`SOURCE`): the projection of the new
vector on the basis, its removal fused with a second projection (classical Gram-Schmidt twice: the basis stays
orthogonal to rounding, whatever the Ritz values' spread), the second removal with the vector's norm, and the
normalised vector written into the basis. Each reduction ends in the grid's last block (no second launch), the
coefficients stay on the device, and the host reads them once per cycle of ``ncv`` steps, where it solves the
small projected matrix (NumPy).

A cycle that has not converged restarts from its Ritz vector and its last residual direction (thick restart,
Wu and Simon's TRLan, one vector kept): the projected matrix starts again as the Ritz value, coupled to the new
direction by beta times the Ritz vector's last component, and the coefficients of the Gram-Schmidt passes fill
the rest of it as the steps go (they are the matrix's upper triangle, the arrow of the restart included).

The same steps run on NumPy arrays (what the CPU tests check) and on CuPy arrays (the kernels).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ..formats.xp import module

MAX_VECTORS = 32  # basis vectors a kernel projects on (its per-thread sums are registers)
BLOCK = 256
GRID = 1024  # blocks at most: each leaves MAX_VECTORS partial sums for the last block to add
BREAKDOWN_ULPS = 64  # a residual below this many rounding errors of the product is no new direction


@dataclass(frozen=True)
class Eigenpair:
    """What :func:`leading_eigenpair` found.

    Attributes:
        value: the largest Ritz value.
        vector: its Ritz vector, of unit norm, in the start's array module and dtype.
        residual: ‖M x - value x‖ for the returned vector as the projected matrix bounds it.
        converged: whether ``residual`` met the tolerance (or the Krylov space closed: then it is 0).
        products: applications of the operator.
        cycles: cycles of the basis (the first and every restart).
    """

    value: float
    vector: object
    residual: float
    converged: bool
    products: int
    cycles: int


def leading_eigenpair(apply, start, ncv: int, max_cycles: int, tol: float) -> Eigenpair:
    """The largest eigenvalue of the symmetric positive semi-definite operator ``apply`` and its eigenvector.

    ``apply(v, out)`` writes M v into ``out`` (arrays of ``start``'s module, dtype and length); ``start``: the
    first Krylov vector (not orthogonal to the leading eigenvector; any scale). ``ncv``: the basis (2 to
    :data:`MAX_VECTORS`, at most the length); ``max_cycles``: cycles of it, the first included, as ARPACK
    counts restarts; ``tol``: the residual relative to the start's Rayleigh quotient (a lower bound of the
    eigenvalue, so the rule is at least as strict as relative to the eigenvalue).

    Example:
        >>> M = np.diag([1.0, 5.0, 2.0, 3.0])
        >>> pair = leading_eigenpair(lambda v, out: np.matmul(M, v, out=out), np.ones(4), 3, 20, 1e-10)
        >>> round(pair.value, 10), np.abs(pair.vector).round(6).tolist(), pair.converged
        (5.0, [0.0, 1.0, 0.0, 0.0], True)
    """
    n = start.shape[0]
    if not 2 <= ncv <= min(MAX_VECTORS, n):
        raise ValueError(f"ncv must be between 2 and min({MAX_VECTORS}, n={n}), got {ncv}")
    if max_cycles < 1 or tol < 0:
        raise ValueError(f"max_cycles must be positive and tol non-negative, got {max_cycles} and {tol}")
    steps = (_HostSteps if module(start) is np else _DeviceSteps)(start, ncv)
    T = np.zeros((ncv, ncv))
    first, products, limit = 0, 0, None
    for cycle in range(1, max_cycles + 1):
        for j in range(first, ncv):
            apply(steps.V[j], steps.u)
            steps.orthogonalize(j)
        products += ncv - first
        H, beta = steps.coefficients()
        for j in range(first, ncv):
            T[:j + 1, j] = T[j, :j + 1] = H[:j + 1, j]
        if limit is None:
            limit = tol * T[0, 0]  # the start's Rayleigh quotient
        closed = np.flatnonzero(beta[first:ncv - 1] == 0)  # the Krylov space is invariant from there on
        m = first + int(closed[0]) + 1 if closed.size else ncv
        values, vectors = np.linalg.eigh(T[:m, :m])
        value, s = float(values[-1]), vectors[:, -1]
        residual = 0.0 if closed.size else abs(float(beta[m - 1] * s[-1]))
        x = steps.ritz(s)
        if residual <= limit or cycle == max_cycles or closed.size:
            return Eigenpair(value, x, residual, bool(residual <= limit), products, cycle)
        # The new basis: the Ritz vector, then the last residual direction; the first step's projection
        # gives their coupling (beta times the Ritz vector's last component).
        steps.restart(x)
        T[:] = 0.0
        T[0, 0] = value
        first = 1
    raise AssertionError("unreachable: the last cycle returns")


class _HostSteps:
    """The steps on NumPy arrays: the reference of the kernels, float64 sums as theirs."""

    def __init__(self, start: np.ndarray, ncv: int):
        n, self.dtype, self.ncv = start.shape[0], start.dtype, ncv
        self.V = np.zeros((ncv, n), self.dtype)
        self.u = np.empty(n, self.dtype)
        self.H, self.beta = np.zeros((ncv, ncv)), np.zeros(ncv)
        s = start.astype(np.float64)
        self.V[0] = s / np.sqrt(s @ s)
        self.eps2 = (BREAKDOWN_ULPS * float(np.finfo(self.dtype).eps)) ** 2

    def orthogonalize(self, j: int) -> None:
        B = self.V[:j + 1].astype(np.float64)
        u = self.u.astype(np.float64)
        c1 = B @ u
        u = (u - c1 @ B).astype(self.dtype).astype(np.float64)  # stored in the dtype between passes, as on the GPU
        c2 = B @ u
        u = (u - c2 @ B).astype(self.dtype)
        self.u[:] = u
        u = u.astype(np.float64)
        norm2 = float(u @ u)
        total = norm2 + float(((c1 + c2) ** 2).sum())
        beta = 0.0 if norm2 <= self.eps2 * total else np.sqrt(norm2)
        self.H[:j + 1, j], self.beta[j] = c1 + c2, beta
        if j + 1 < self.ncv:
            self.V[j + 1] = u / beta if beta else 0.0

    def coefficients(self) -> tuple[np.ndarray, np.ndarray]:
        return self.H.copy(), self.beta.copy()

    def ritz(self, s: np.ndarray) -> np.ndarray:
        x = s @ self.V[:s.size].astype(np.float64)
        return (x / np.sqrt(x @ x)).astype(self.dtype)

    def restart(self, x: np.ndarray) -> None:
        last = self.beta[self.ncv - 1]
        self.V[0] = x
        self.V[1] = self.u / last if last else 0.0


SOURCE = r"""
#define BLOCK 256
#define MAXV 32

// Thread 0 of the last block to finish gets true: every block's partial sums are then in global memory.
__device__ bool last_block(unsigned int* arrivals) {
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(arrivals, 1u) == gridDim.x - 1;
    __syncthreads();
    return last;
}

// The block's sums of acc[0..cols) into partials[blockIdx.x * MAXV + i].
__device__ void block_sums(double* acc, int cols, double* partials) {
    __shared__ double warps[MAXV][BLOCK / 32];
#pragma unroll
    for (int i = 0; i < MAXV; ++i) {
        if (i < cols) {
            double s = acc[i];
            for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);
            if ((threadIdx.x & 31) == 0) warps[i][threadIdx.x >> 5] = s;
        }
    }
    __syncthreads();
    if (threadIdx.x < cols) {
        double s = 0.0;
        for (int w = 0; w < BLOCK / 32; ++w) s += warps[threadIdx.x][w];
        partials[blockIdx.x * MAXV + threadIdx.x] = s;
    }
}

// Every thread: acc zeroed and, where c is given, the first cols coefficients in the block's shared c.
__device__ __forceinline__ void begin(double* acc, double* c, const double* coef, int cols) {
#pragma unroll
    for (int i = 0; i < MAXV; ++i) acc[i] = 0.0;
    if (c != nullptr) {
        if (threadIdx.x < MAXV) c[threadIdx.x] = threadIdx.x < cols ? coef[threadIdx.x] : 0.0;
        __syncthreads();
    }
}

// u[k] -= sum_i c[i] V[i][k], stored in u's type; the stored value, as a double.
template <typename T>
__device__ __forceinline__ double remove_at(const T* V, T* u, const double* c, int cols, long long n, long long k) {
    double uk = (double)u[k];
#pragma unroll
    for (int i = 0; i < MAXV; ++i) if (i < cols) uk -= c[i] * (double)V[i * n + k];
    T stored = (T)uk;
    u[k] = stored;
    return (double)stored;
}

// The grid's sums, in block order (the same at every call), by the last block; the counter is reset.
__device__ void grid_sums(const double* partials, int cols, double* out, unsigned int* arrivals) {
    if (threadIdx.x < cols) {
        double s = 0.0;
        for (int b = 0; b < gridDim.x; ++b) s += ((volatile const double*)partials)[b * MAXV + threadIdx.x];
        out[threadIdx.x] = s;
    }
    if (threadIdx.x == 0) *arrivals = 0u;
}

// coef[i] = V[i] . u for i < cols.
template <typename T>
__global__ void __launch_bounds__(BLOCK, 2) lanczos_project(const T* V, const T* u, long long n, int cols,
                                                         double* partials, unsigned int* arrivals, double* coef) {
    double acc[MAXV];
    begin(acc, nullptr, nullptr, cols);
    for (long long k = blockIdx.x * (long long)BLOCK + threadIdx.x; k < n; k += (long long)gridDim.x * BLOCK) {
        double uk = (double)u[k];
#pragma unroll
        for (int i = 0; i < MAXV; ++i) if (i < cols) acc[i] += (double)V[i * n + k] * uk;
    }
    block_sums(acc, cols, partials);
    if (last_block(arrivals)) grid_sums(partials, cols, coef, arrivals);
}

// u -= sum_i coef[i] V[i], then again[i] = V[i] . u: each thread reprojects the entries it updated.
template <typename T>
__global__ void __launch_bounds__(BLOCK, 2) lanczos_remove_project(const T* V, T* u, long long n, int cols,
                                                                const double* coef, double* partials,
                                                                unsigned int* arrivals, double* again) {
    __shared__ double c[MAXV];
    double acc[MAXV];
    begin(acc, c, coef, cols);
    for (long long k = blockIdx.x * (long long)BLOCK + threadIdx.x; k < n; k += (long long)gridDim.x * BLOCK) {
        double uk = remove_at(V, u, c, cols, n, k);
        // The basis entries again, from L1 (the warp's sectors of them were just read): held in registers
        // beside the sums they would halve the kernel's occupancy.
#pragma unroll
        for (int i = 0; i < MAXV; ++i) if (i < cols) acc[i] += (double)V[i * n + k] * uk;
    }
    block_sums(acc, cols, partials);
    if (last_block(arrivals)) grid_sums(partials, cols, again, arrivals);
}

// u -= sum_i again[i] V[i]; column j of H gets coef + again and beta[j] the norm of u (0 where u is only
// rounding: at most eps2 of the product's square norm, the Krylov space closed).
template <typename T>
__global__ void __launch_bounds__(BLOCK, 2) lanczos_remove_norm(const T* V, T* u, long long n, int cols,
                                                             const double* coef, const double* again,
                                                             double* partials, unsigned int* arrivals, double* H,
                                                             double* beta, int j, int ncv, double eps2) {
    __shared__ double c[MAXV];
    double acc[MAXV];
    begin(acc, c, again, cols);
    for (long long k = blockIdx.x * (long long)BLOCK + threadIdx.x; k < n; k += (long long)gridDim.x * BLOCK) {
        double uk = remove_at(V, u, c, cols, n, k);
        acc[0] += uk * uk;
    }
    block_sums(acc, 1, partials);
    if (last_block(arrivals)) {
        grid_sums(partials, 1, beta + j, arrivals);  // the square norm, for now
        __syncthreads();
        if (threadIdx.x == 0) {
            double norm2 = beta[j], total = norm2;
            for (int i = 0; i < cols; ++i) {
                double h = coef[i] + again[i];
                H[i * ncv + j] = h;
                total += h * h;
            }
            beta[j] = norm2 <= eps2 * total ? 0.0 : sqrt(norm2);
        }
    }
}

// out = u / *divisor (its square root where root is set); 0 where the divisor is 0.
template <typename T>
__global__ void lanczos_scale(const T* u, T* out, const double* divisor, int root, long long n) {
    double d = root ? sqrt(*divisor) : *divisor;
    double inverse = d > 0.0 ? 1.0 / d : 0.0;
    for (long long k = blockIdx.x * (long long)BLOCK + threadIdx.x; k < n; k += (long long)gridDim.x * BLOCK)
        out[k] = (T)((double)u[k] * inverse);
}
"""
KERNELS = ("lanczos_project", "lanczos_remove_project", "lanczos_remove_norm", "lanczos_scale")
_TYPES = {"float32": "float", "float64": "double"}


@functools.cache
def _kernels(cupy, kind: str) -> dict:
    names = {k: f"{k}<{kind}>" for k in KERNELS}
    mod = cupy.RawModule(code=SOURCE, name_expressions=list(names.values()))
    return {k: mod.get_function(name) for k, name in names.items()}


class _DeviceSteps:
    """The steps on CuPy arrays: four launches a step, the coefficients on the device until a cycle ends."""

    def __init__(self, start, ncv: int):
        import cupy
        self.xp, n, self.dtype, self.ncv = cupy, start.shape[0], start.dtype, ncv
        kind = _TYPES.get(self.dtype.name)
        if kind is None:
            raise ValueError(f"the Lanczos kernels run float32 or float64 vectors, got {self.dtype}")
        self.k = _kernels(cupy, kind)
        self.n, self.grid = np.int64(n), (int(max(1, min(-(-n // BLOCK), GRID))),)
        self.V = cupy.zeros((ncv, n), self.dtype)
        self.u = cupy.empty(n, self.dtype)
        self.H, self.beta = cupy.zeros((ncv, ncv)), cupy.zeros(ncv)
        self.partials = cupy.empty(GRID * MAX_VECTORS)
        self.coef, self.again = cupy.empty(MAX_VECTORS), cupy.empty(MAX_VECTORS)
        self.arrivals = cupy.zeros(1, np.uint32)
        self.eps2 = np.float64((BREAKDOWN_ULPS * float(np.finfo(self.dtype).eps)) ** 2)
        start = cupy.ascontiguousarray(start)
        self.k["lanczos_project"](self.grid, (BLOCK,), (start, start, self.n, np.int32(1), self.partials,
                                                        self.arrivals, self.coef))
        self._scale(start, self.V[0], self.coef, root=True)

    def _scale(self, u, out, divisor, root: bool = False) -> None:
        self.k["lanczos_scale"](self.grid, (BLOCK,), (u, out, divisor, np.int32(root), self.n))

    def orthogonalize(self, j: int) -> None:
        cols, args = np.int32(j + 1), (self.partials, self.arrivals)
        self.k["lanczos_project"](self.grid, (BLOCK,), (self.V, self.u, self.n, cols, *args, self.coef))
        self.k["lanczos_remove_project"](self.grid, (BLOCK,), (self.V, self.u, self.n, cols, self.coef, *args,
                                                                 self.again))
        self.k["lanczos_remove_norm"](self.grid, (BLOCK,), (self.V, self.u, self.n, cols, self.coef, self.again,
                                                              *args, self.H, self.beta, np.int32(j),
                                                              np.int32(self.ncv), self.eps2))
        if j + 1 < self.ncv:
            self._scale(self.u, self.V[j + 1], self.beta[j:])

    def coefficients(self) -> tuple[np.ndarray, np.ndarray]:
        return self.H.get(), self.beta.get()

    def ritz(self, s: np.ndarray):
        x = self.xp.asarray(s, dtype=self.dtype) @ self.V[:s.size]
        self.k["lanczos_project"](self.grid, (BLOCK,), (x, x, self.n, np.int32(1), self.partials, self.arrivals,
                                                        self.coef))
        self._scale(x, x, self.coef, root=True)
        return x

    def restart(self, x) -> None:
        self.V[0] = x
        self._scale(self.u, self.V[1], self.beta[self.ncv - 1:])
