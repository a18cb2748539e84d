"""Thick-restart Lanczos for the leading eigenpair (HITS's Aᵀ A): the steps on NumPy against SciPy's ARPACK, its
restarts, a closed Krylov space, its limits; the kernels compiled for sm_90 here and run on a GPU."""
import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as sla

import tuner
from tuner import codegen
from tuner.cache import Cache
from tuner.graph import lanczos
from tuner.graph.lanczos import leading_eigenpair

from .conftest import REAL, power_law


def normal_operator(A, dtype=np.float64):
    """(Aᵀ A as a product writing into ``out``, its largest eigenvalue and unit eigenvector by ARPACK)."""
    A = sp.csr_matrix(A, dtype=np.float64)
    M = (A.T @ A).tocsr()
    _, s, vt = sla.svds(A, k=1, tol=1e-14, random_state=0)
    v = vt[0] * np.sign(vt[0].sum())
    Md = M.astype(dtype)
    return (lambda x, out: np.copyto(out, Md @ x)), float(s[0] ** 2), v


def signed(x):
    x = np.asarray(x, dtype=np.float64)
    return x * np.sign(x.sum())


@pytest.mark.parametrize("path", [p for p in REAL if p.name in ("wiki-Vote.npz", "cit-HepPh.npz", "bcsstk16.npz")],
                         ids=lambda p: p.stem)
def test_leading_eigenpair_equals_arpack_on_real_graphs(path):
    A = abs(tuner.load(str(path)))
    apply, value, v = normal_operator(A)
    pair = leading_eigenpair(apply, np.ones(A.shape[0]), 20, 100, 1e-8)
    assert pair.converged and pair.cycles == 1 and pair.products == 20
    assert abs(pair.value - value) <= 1e-12 * value
    assert np.abs(signed(pair.vector) - v).max() <= 1e-9 and abs(np.linalg.norm(pair.vector) - 1) <= 1e-12


def test_a_small_basis_restarts_until_the_residual_meets_the_tolerance():
    A = abs(power_law(3000, seed=5))
    apply, value, v = normal_operator(A)
    start = np.random.default_rng(1).uniform(0.5, 1.5, 3000)
    pair = leading_eigenpair(apply, start, 4, 500, 1e-10)
    assert pair.converged and pair.cycles > 2 and pair.products == 4 + 3 * (pair.cycles - 1)
    assert pair.residual <= 1e-10 * value and abs(pair.value - value) <= 1e-10 * value
    assert np.abs(signed(pair.vector) - v).max() <= 1e-6


def test_it_stops_unconverged_after_max_cycles_on_close_leading_values():
    path = next(p for p in REAL if p.name == "mdual.npz")  # a mesh: its leading singular values are close
    apply, value, v = normal_operator(abs(tuner.load(str(path))))
    n = v.size
    short = leading_eigenpair(apply, np.ones(n), 20, 1, 1e-8)
    assert not short.converged and short.cycles == 1 and short.residual > 1e-8 * value
    full = leading_eigenpair(apply, np.ones(n), 20, 100, 1e-8)
    assert full.converged and full.cycles > 3 and abs(full.value - value) <= 1e-10 * value


def test_float32_vectors_reach_the_float32_rounding():
    A = abs(power_law(2000, seed=7))
    apply, value, v = normal_operator(A, np.float32)
    pair = leading_eigenpair(apply, np.ones(2000, np.float32), 20, 100, 1e-5)
    assert pair.vector.dtype == np.float32 and pair.converged
    assert abs(pair.value - value) <= 1e-5 * value and np.abs(signed(pair.vector) - v).max() <= 1e-5


def test_a_closed_krylov_space_ends_with_the_exact_pair():
    # Three distinct eigenvalues: the start's Krylov space closes after three vectors.
    M = np.diag(np.repeat([4.0, 2.0, 1.0], 10))
    pair = leading_eigenpair(lambda x, out: np.matmul(M, x, out=out), np.arange(1.0, 31.0), 20, 5, 0.0)
    assert pair.converged and pair.residual == 0.0 and pair.cycles == 1
    assert abs(pair.value - 4.0) <= 1e-13 and np.abs(pair.vector[10:]).max() <= 1e-13
    expected = np.arange(1.0, 11.0) / np.linalg.norm(np.arange(1.0, 11.0))
    assert np.abs(signed(pair.vector[:10]) - expected).max() <= 1e-13


def test_bad_arguments_name_the_problem():
    apply = lambda x, out: np.copyto(out, x)  # noqa: E731
    with pytest.raises(ValueError, match="ncv must be between 2 and min"):
        leading_eigenpair(apply, np.ones(10), 11, 5, 1e-8)
    with pytest.raises(ValueError, match="ncv must be between 2 and min"):
        leading_eigenpair(apply, np.ones(100), lanczos.MAX_VECTORS + 1, 5, 1e-8)
    with pytest.raises(ValueError, match="max_cycles must be positive and tol non-negative"):
        leading_eigenpair(apply, np.ones(10), 4, 0, 1e-8)


def test_the_lanczos_kernels_compile_for_sm_90(tmp_path):
    takes = "\n".join(f"    (void*)&{k}<{t}>," for k in lanczos.KERNELS for t in ("float", "double"))
    source = lanczos.SOURCE + "\nvoid* tuner_lanczos_instances[] = {\n" + takes + "\n};\n"
    binary = codegen.compile_source(source, arch="sm_90", cache=Cache(tmp_path))
    for kernel in lanczos.KERNELS:
        assert kernel.encode() in binary.cubin


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_the_device_steps_equal_the_host_steps(dtype):
    cupy = pytest.importorskip("cupy")
    import cupyx.scipy.sparse as csp
    A = abs(power_law(30000, seed=9))
    M = sp.csr_matrix((A.T @ A), dtype=dtype)
    Md = csp.csr_matrix(M)
    start = np.random.default_rng(3).uniform(0.5, 1.5, 30000).astype(dtype)
    host = leading_eigenpair(lambda x, out: np.copyto(out, M @ x), start, 6, 200, 1e-9)
    device = leading_eigenpair(lambda x, out: cupy.copyto(out, Md @ x), cupy.asarray(start), 6, 200, 1e-9)
    assert isinstance(device.vector, cupy.ndarray) and device.vector.dtype == dtype
    assert device.converged and host.converged and device.cycles > 1
    close = 1e-9 if dtype == np.float64 else 1e-4
    assert abs(device.value - host.value) <= close * host.value
    assert np.abs(signed(device.vector.get()) - signed(host.vector)).max() <= close * 10
