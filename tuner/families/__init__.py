"""The registry of SpMV kernel families: name -> :class:`~tuner.families.base.Family`."""
from __future__ import annotations

from .. import codegen
from ..matrix import CanonicalMatrix
from . import aligned_coo, binned, csr_vector, tile_composite, tile_coo
from .base import CTYPES, Family, Launch, Specialization, params_dict

REGISTRY: dict[str, Family] = {f.name: f for f in (csr_vector.FAMILY, binned.FAMILY, aligned_coo.FAMILY,
                                                   tile_coo.FAMILY, tile_composite.FAMILY)}


def get(name: str) -> Family:
    """The family registered under ``name``.

    Example:
        >>> get("csr_vector").template
        'csr_vector.cu.j2'
    """
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown kernel family {name!r}; known: {', '.join(REGISTRY)}") from None


def specializations(m: CanonicalMatrix, families: list[str] | None = None, profile=None) -> list[Specialization]:
    """Every valid (family, parameters) candidate for ``m``, with its type traits; ``profile`` (the GPU's,
    or None) sets the tiled families' widths and workload sizes.

    Example:
        >>> import scipy.sparse as sp
        >>> from tuner.matrix import canonicalize
        >>> len(specializations(canonicalize(sp.eye(3, format="csr")), ["csr_vector"]))  # 2 blocks, 2 orders
        4
    """
    out = []
    for name in list(REGISTRY) if families is None else families:
        fam = get(name)
        out.extend(Specialization(name, p, m.value_dtype, m.index_dtype, m.value_free)
                   for p in fam.candidates(m, profile))
    return out


def render(spec: Specialization, m: CanonicalMatrix | None = None) -> str:
    """CUDA source of one specialisation (the matrix is passed to families whose context needs it).

    Example:
        >>> import numpy as np
        >>> s = Specialization("csr_vector", csr_vector.CsrVectorParams(8, 128), np.dtype("float32"),
        ...                    np.dtype("int32"), False)
        >>> "#define TPR 8" in render(s)
        True
    """
    fam = get(spec.family)
    ctx = {"VAL": CTYPES[spec.value_dtype], "IDX": CTYPES[spec.index_dtype], "value_free": spec.value_free,
           "kernel_name": spec.kernel_name, **fam.context(m, spec.params)}
    return codegen.render(fam.template, ctx)


__all__ = ["REGISTRY", "Family", "Launch", "Specialization", "get", "params_dict", "render",
           "specializations"]
