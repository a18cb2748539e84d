"""The operations the tuner compiles, one registry row each, chosen by the operands given.

``tuner.compile(A)`` is SpMV (y = A x), ``tuner.compile(A, B)`` SpGEMM (C = A B) for a sparse B and SpMM
(Y = A X, a block of dense columns) for a dense one: each row names its kernel families, its compile
function (whose model or timing picks among them), its float64 SciPy oracle, which the tests and
benchmarks check results against, the cuSPARSE call it is measured against and its benchmark.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

import scipy.sparse as sp

from . import bench, bench_spgemm, bench_spmm, compiler, families, spgemm, spmm
from .formats import device_sort


@dataclass(frozen=True)
class Operation:
    """One operation the tuner compiles.

    Attributes:
        name: e.g. 'spmv'.
        operands: how many operands it takes.
        takes: (operands) -> whether they are this operation's (a sparse or a dense second operand).
        families: its kernel families by name (each lists its candidates).
        compile: (*operands, **options) -> the callable that computes it on the GPU.
        oracle: (*operands, dense or sparse input) -> the float64 SciPy result it must equal.
        baseline: the cuSPARSE call its benchmark times against.
        bench: (parsed ``bench`` arguments, suite, progress) -> runs its suite on the GPU, prints, writes JSON.
        bench_without_gpu: whether ``bench`` has something to do without a GPU (compiling every candidate).
        prebuild: (arch, cache) -> builds the binaries its first calls would wait long for (CUB libraries),
            so that ``bench`` builds them in the background while the suites before run; None: nothing.
    """

    name: str
    operands: int
    takes: Callable
    families: Mapping
    compile: Callable
    oracle: Callable
    baseline: str
    bench: Callable
    bench_without_gpu: bool
    prebuild: Callable | None = None


REGISTRY: dict[str, Operation] = {op.name: op for op in (
    Operation("spmv", 1, lambda ops: len(ops) == 1, families.REGISTRY, compiler.compile,
              lambda A, x: A.astype(np.float64) @ np.asarray(x, np.float64),
              "cupyx.cusparse.spmv, the faster of CSR and COO", bench.cli_run, True, device_sort.prebuild),
    Operation("spgemm", 2, lambda ops: len(ops) == 2 and sp.issparse(ops[1]), spgemm.FAMILIES, spgemm.compile_spgemm,
              lambda A, B: (A.astype(np.float64) @ B.astype(np.float64)).tocsr(),
              "cupyx.scipy.sparse csr @ csr (cuSPARSE SpGEMM)", bench_spgemm.cli_run, False, spgemm.prebuild),
    Operation("spmm", 2, lambda ops: len(ops) == 2 and not sp.issparse(ops[1]), spmm.FAMILIES,
              spmm.compile_spmm, lambda A, X: A.astype(np.float64) @ np.asarray(X, np.float64),
              "cupyx.scipy.sparse csr @ dense block (cuSPARSE SpMM)", bench_spmm.cli_run, False),
)}


def operation_of(*operands) -> Operation:
    """The operation ``tuner.compile`` runs for these operands.

    Example:
        >>> import scipy.sparse as sp
        >>> A = sp.eye(3, format="csr")
        >>> [operation_of(*ops).name for ops in ((A,), (A, A), (A, np.ones((3, 2))))]
        ['spmv', 'spgemm', 'spmm']
    """
    for op in REGISTRY.values():
        if op.takes(operands):
            return op
    raise TypeError(f"no operation takes {len(operands)} operands of types "
                    f"{', '.join(type(o).__name__ for o in operands)}")


def compile(A, B=None, **options):
    """Compile the operation of the operands given: ``compile(A)`` SpMV, ``compile(A, B)`` C = A B.

    Options go to that operation's compile (:func:`tuner.compiler.compile`,
    :func:`tuner.spgemm.compile_spgemm`).

    Example (on a GPU machine):
        >>> import numpy as np, scipy.sparse as sp, tuner             # doctest: +SKIP
        >>> A = sp.random(500, 500, density=0.02, format="csr")        # doctest: +SKIP
        >>> y = tuner.compile(A)(np.ones(500))                         # doctest: +SKIP
        >>> C = tuner.compile(A, A.T)()                                # doctest: +SKIP
        >>> Y = tuner.compile(A, np.ones((500, 4)))()                  # doctest: +SKIP
    """
    operands = (A,) if B is None else (A, B)
    return operation_of(*operands).compile(*operands, **options)
