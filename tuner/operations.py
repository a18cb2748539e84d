"""The operations the tuner compiles, one registry row each, chosen by the number of operands.

``tuner.compile(A)`` is SpMV (y = A x) and ``tuner.compile(A, B)`` SpGEMM (C = A B): each row names its
compile function and its float64 SciPy oracle, which the tests and benchmarks check results against.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from . import compiler, spgemm


@dataclass(frozen=True)
class Operation:
    """One operation the tuner compiles.

    Attributes:
        name: e.g. 'spmv'.
        operands: how many sparse matrices it takes.
        compile: (*operands, **options) -> the callable that computes it on the GPU.
        oracle: (*operands, dense or sparse input) -> the float64 SciPy result it must equal.
    """

    name: str
    operands: int
    compile: Callable
    oracle: Callable


REGISTRY: dict[str, Operation] = {op.name: op for op in (
    Operation("spmv", 1, compiler.compile, lambda A, x: A.astype(np.float64) @ np.asarray(x, np.float64)),
    Operation("spgemm", 2, spgemm.compile_spgemm, lambda A, B: (A.astype(np.float64) @ B.astype(np.float64)).tocsr()),
)}
BY_OPERANDS = {op.operands: op for op in REGISTRY.values()}


def compile(A, B=None, **options):
    """Compile the operation of the operands given: ``compile(A)`` SpMV, ``compile(A, B)`` C = A B.

    Options go to that operation's compile (:func:`tuner.compiler.compile`,
    :func:`tuner.spgemm.compile_spgemm`).

    Example (on a GPU machine):
        >>> import numpy as np, scipy.sparse as sp, tuner             # doctest: +SKIP
        >>> A = sp.random(500, 500, density=0.02, format="csr")        # doctest: +SKIP
        >>> y = tuner.compile(A)(np.ones(500))                         # doctest: +SKIP
        >>> C = tuner.compile(A, A.T)()                                # doctest: +SKIP
    """
    operands = (A,) if B is None else (A, B)
    return BY_OPERANDS[len(operands)].compile(*operands, **options)
