"""Graph algorithms on the tuned products, with NetworkX's semantics on SciPy adjacency matrices."""
from .hits import hits
from .pagerank import ConvergenceError, IterationInfo, pagerank
from .rwr import rwr

__all__ = ["ConvergenceError", "IterationInfo", "hits", "pagerank", "rwr"]
