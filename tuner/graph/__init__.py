"""Graph algorithms on the tuned products, with NetworkX's semantics on SciPy adjacency matrices."""
from .betweenness import betweenness
from .hits import hits
from .pagerank import ConvergenceError, IterationInfo, pagerank
from .rwr import rwr, rwr_block
from .simrank import simrank

__all__ = ["ConvergenceError", "IterationInfo", "betweenness", "hits", "pagerank", "rwr", "rwr_block", "simrank"]
