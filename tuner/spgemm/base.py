"""What every SpGEMM family's callable shares: the call (SciPy or device output, new values on the same
structures), phase timing, the device-memory check, and C on the device as :class:`DeviceCSR`."""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from .. import gpu
from ..matrix import CanonicalMatrix, MatrixError, canonicalize, structure_digest
from ..memory import check_fits


class DeviceMemoryError(MatrixError):
    """A product needs more device memory than is free; the message gives both figures."""


@dataclass(frozen=True)
class DeviceCSR:
    """C on the GPU as three PyCUDA GPUArrays, which CuPy and PyTorch take without a copy through
    ``__cuda_array_interface__`` (indices int32 when the columns and nnz fit, else int64; each row's
    columns ascending).

    Example (on a GPU machine):
        >>> import cupy, cupyx.scipy.sparse as csp                                   # doctest: +SKIP
        >>> c = tuner.compile(A, A.T)(out="device")                                  # doctest: +SKIP
        >>> C = csp.csr_matrix((cupy.asarray(c.data), cupy.asarray(c.indices), cupy.asarray(c.indptr)),
        ...                    shape=c.shape)                                         # doctest: +SKIP
    """

    indptr: object
    indices: object
    data: object
    shape: tuple[int, int]

    @property
    def nnz(self) -> int:
        return int(self.data.shape[0])

    def to_scipy(self, timer=None) -> sp.csr_matrix:
        """The same matrix in host memory (``timer``: a :class:`Product` whose ``seconds`` gets 'download').

        Raises :class:`~tuner.memory.InsufficientMemoryError` before copying when host memory cannot hold it
        (the copies NumPy and SciPy hold at once: the arrays, and SciPy's checked copy of the indices).
        """
        arrays = (self.indptr, self.indices, self.data)
        need = sum(int(a.shape[0]) * np.dtype(a.dtype).itemsize for a in arrays) + self.indices.shape[0] * 8
        check_fits(need, f"C = A B ({self.shape[0]:,} x {self.shape[1]:,}, {self.nnz:,} entries) in host memory",
                   "its CSR arrays", hint="keep it on the GPU with out='device'")
        c = sp.csr_matrix((gpu.download(self.data), gpu.download(self.indices), gpu.download(self.indptr)),
                          shape=self.shape)
        c.has_sorted_indices = True  # every family leaves each row's columns ascending
        if timer is not None:
            timer._phase("download")
        return c


def empty_product(shape: tuple[int, int], dtype) -> DeviceCSR:
    """C with no entries (no products at all), on the device."""
    n_rows, n_cols = shape
    index = np.dtype(np.int32 if n_cols <= np.iinfo(np.int32).max else np.int64)
    indptr = gpu.device_vector(n_rows + 1, index)
    gpu.memset_bytes(int(indptr.gpudata), 0, indptr.nbytes)
    return DeviceCSR(indptr, gpu.device_vector(0, index), gpu.device_vector(0, dtype), shape)


def check_shapes(a, b) -> None:
    """MatrixError unless A B is defined: A's columns as many as B's rows.

    Example:
        >>> import numpy as np
        >>> check_shapes(np.ones((2, 3)), np.ones((3, 4))) is None
        True
        >>> check_shapes(np.ones((2, 3)), np.ones((2, 4)))
        Traceback (most recent call last):
        ...
        tuner.matrix.MatrixError: A has 3 columns but B has 2 rows: A B needs them equal
    """
    if a.shape[1] != b.shape[0]:
        raise MatrixError(f"A has {a.shape[1]} columns but B has {b.shape[0]} rows: A B needs them equal")


class Product:
    """C = A B on the GPU for fixed structures of A and B; ``product()`` returns C as SciPy CSR.

    ``product(A2, B2)`` with matrices of the same structures (values may differ) multiplies those: only
    their values are uploaded. With ``timed`` set, ``seconds`` holds after a call the wall seconds of its
    phases, each closed by a synchronisation (off by default: the waits cost small products a tenth of a
    millisecond or more). Families subclass it with ``family``, ``_set_values`` and ``_multiply``.
    """

    family = ""

    def __init__(self, a: CanonicalMatrix, b: CanonicalMatrix, params):
        check_shapes(a, b)
        self.a, self.b, self.params = a, b, params
        self.dtype = a.value_dtype
        self.shape = (a.n_rows, b.n_cols)
        self.value_free = a.value_free and b.value_free
        self.pattern_value = a.pattern_value * b.pattern_value if self.value_free else 1.0
        self._digests: dict[str, str] = {}
        self.seconds: dict[str, float] = {}
        self.timed = False
        self.operand_bytes = 0  # device bytes held between calls that a family's working memory does not count
        self.peak_bytes = 0

    def __call__(self, A=None, B=None, out: str = "scipy"):
        """C = A B: a SciPy CSR matrix (``out='scipy'``) or a :class:`DeviceCSR` left on the GPU
        (``out='device'``). ``A``/``B``: new values on the structures compiled for."""
        if out not in ("scipy", "device"):
            raise ValueError(f"out must be 'scipy' or 'device', got {out!r}")
        if A is not None or B is not None:
            self._new_values(A, B)
        self.seconds = {}
        self._t = time.perf_counter()
        c = self._multiply()
        return c if out == "device" else c.to_scipy(self)

    def explain(self) -> str:
        """Why this family (see :func:`tuner.spgemm.describe`): the choice, the model's view, each family's
        prediction and any measurements."""
        from . import describe
        plan = getattr(self, "plan", None)
        return describe(plan) if plan is not None else f"{self.family} {self.params}"

    def _new_values(self, A, B) -> None:
        if self.value_free:
            raise MatrixError("this product was compiled for pattern matrices: compile again for new values")
        a = self._same_structure(A, self.a, "A") if A is not None else self.a
        b = self._same_structure(B, self.b, "B") if B is not None else self.b
        self._set_values(a, b)

    def _set_values(self, a: CanonicalMatrix, b: CanonicalMatrix) -> None:
        raise NotImplementedError

    def _multiply(self) -> DeviceCSR:
        raise NotImplementedError

    def _same_structure(self, M, like: CanonicalMatrix, what: str) -> CanonicalMatrix:
        m = canonicalize(M, dtype=self.dtype, index_dtype=like.index_dtype)
        if what not in self._digests:  # the compiled structure's, hashed once
            self._digests[what] = structure_digest(like)
        if m.shape != like.shape or structure_digest(m) != self._digests[what]:
            raise MatrixError(f"{what} has another structure than the one compiled for: compile again")
        return m

    def _phase(self, name: str) -> None:
        """Close the running phase of a call when ``timed``: wait for the GPU, note its seconds in
        ``self.seconds``."""
        if not self.timed:
            return
        gpu.synchronize()
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self._t
        self._t = now

    def _ensure_free(self, need: int, what: str) -> None:
        """Raise :class:`DeviceMemoryError` unless ``need`` bytes are free (after the pool's idle blocks go back);
        ``peak_bytes`` keeps the most a call needed, with the operands."""
        self.peak_bytes = max(self.peak_bytes, int(need) + self.operand_bytes)
        free = gpu.free_memory()
        if need > free:
            free = gpu.free_memory(release_pool=True)
        if need > free:
            raise DeviceMemoryError(f"{what}: it needs {need:,} bytes of device memory, {free:,} are free")
