"""The baseline model: the bytes a kernel must move over the measured copy bandwidth, plus a launch."""
from __future__ import annotations

from .. import families
from ..families.base import Specialization
from ..matrix import CanonicalMatrix
from .profile_data import Profile


def predict_baseline(m: CanonicalMatrix, spec: Specialization, profile: Profile) -> float:
    """Milliseconds to stream the layout's arrays and x and y once at the copy bandwidth.

    Example: see tests/test_model.py.
    """
    built = families.get(spec.family).launch(m, spec.params)
    nbytes = built.nbytes + (m.n_rows + m.n_cols) * m.value_dtype.itemsize
    c = profile.constants
    return float(c["launch_overhead_ms"] + nbytes / (c["copy_bandwidth_gbs"] * 1e9) * 1e3)
