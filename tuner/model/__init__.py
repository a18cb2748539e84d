"""Performance models: pure functions from a matrix structure and a GPU profile to predicted milliseconds.

No GPU import here. ``lookup`` is the model of paper 003 (a per-warp performance table measured offline by
``python -m tuner profile``, combined online by the wave equations 1-5), reading the tables through
``tables``, the warps of a launch from ``warps`` and a tiled family's tiles all at once from ``tiled``;
``tile_composite`` is paper 003's Algorithms 2-3; ``baseline`` is bytes over bandwidth, kept beside it so
that reports show what the table adds; ``aligned_coo`` holds paper 004's segment-size heuristic and
runtime-cost equations.
"""
from .baseline import predict_baseline
from .lookup import predict_lookup, predict_many, predicted_candidates
from .profile_data import Profile, load_profile
from . import tile_composite  # noqa: F401  (hands Algorithm 2 to the tile_composite family's space)

MODELS = {"lookup": predict_lookup, "baseline": predict_baseline}

__all__ = ["MODELS", "Profile", "load_profile", "predict_baseline", "predict_lookup", "predict_many",
           "predicted_candidates"]
