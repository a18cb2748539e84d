"""sparse-tuner: autotuned SpMV kernels for power-law sparse matrices on NVIDIA GPUs.

Example (on a GPU machine):
    >>> import scipy.sparse as sp, tuner                      # doctest: +SKIP
    >>> spmv = tuner.compile(tuner.load("rmat:16"))           # doctest: +SKIP
    >>> print(spmv.explain())                                 # doctest: +SKIP
"""
__version__ = "0.1.0"

from . import model  # noqa: E402  (the version is read by the modules below)
from .cache import CacheError  # noqa: E402
from .compiler import plan_offline, prepare  # noqa: E402
from .gpu import NoDeviceError  # noqa: E402
from .graph import ConvergenceError, betweenness, hits, pagerank, rwr, simrank  # noqa: E402
from .loaders import MatrixFileError, load  # noqa: E402
from .matrix import MatrixError, canonicalize, fingerprint  # noqa: E402
from .memory import InsufficientMemoryError  # noqa: E402
from .operations import compile  # noqa: E402
from .planner import Plan  # noqa: E402
from .streaming import DeviceBudgetError  # noqa: E402

__all__ = ["compile", "pagerank", "hits", "rwr", "simrank", "betweenness", "prepare", "plan_offline", "load", "model", "canonicalize", "fingerprint", "Plan",
           "MatrixError", "MatrixFileError", "InsufficientMemoryError", "CacheError", "NoDeviceError",
           "ConvergenceError", "DeviceBudgetError", "__version__"]
