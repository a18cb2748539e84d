"""Where the tuner's shipped resources and its cache live, in a checkout and in an installed wheel."""
from __future__ import annotations

import os
import re
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
CHECKOUT_DIR = PACKAGE_DIR.parent


def _resource(name: str) -> Path:
    # An installed wheel ships templates/ and models/ inside the package; a checkout keeps them at the top.
    inside = PACKAGE_DIR / name
    return inside if inside.is_dir() else CHECKOUT_DIR / name


def templates_dir() -> Path:
    """Folder of the Jinja2 CUDA templates (``*.cu.j2``).

    Example:
        >>> (templates_dir() / "csr_vector.cu.j2").is_file()
        True
    """
    return _resource("templates")


def models_dir() -> Path:
    """Folder of the per-GPU measurements shipped with the package (``models/<gpu-slug>/``).

    Example:
        >>> models_dir().name
        'models'
    """
    return _resource("models")


def in_checkout() -> bool:
    """Whether the package runs from a source checkout (its parent holds pyproject.toml and templates/),
    rather than from an installed wheel.

    Example:
        >>> isinstance(in_checkout(), bool)
        True
    """
    return (CHECKOUT_DIR / "pyproject.toml").is_file() and (CHECKOUT_DIR / "templates").is_dir()


def results_dir() -> Path:
    """Where ``profile``, ``bench`` and ``report`` write: ``$TUNER_MODELS_DIR``, else ``models/`` of a
    checkout (whose measurements are committed), else ``$XDG_DATA_HOME/sparse-tuner/models`` (by default
    ``~/.local/share/sparse-tuner/models``): never inside an installed package.

    Example:
        >>> results_dir().name
        'models'
    """
    env = os.environ.get("TUNER_MODELS_DIR")
    if env:
        return Path(env).expanduser()
    if in_checkout():
        return CHECKOUT_DIR / "models"
    base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / "sparse-tuner" / "models"


def gpu_results_dir(gpu_name: str) -> Path:
    """The folder of one GPU's measurements under :func:`results_dir`.

    Example:
        >>> gpu_results_dir("NVIDIA H100 80GB HBM3").name
        'nvidia-h100-80gb-hbm3'
    """
    return results_dir() / gpu_slug(gpu_name)


def cache_dir() -> Path:
    """The cache directory: ``$TUNER_CACHE_DIR``, else ``cache/`` of a checkout, else ``~/.cache/sparse-tuner``.

    Example:
        >>> isinstance(cache_dir(), Path)
        True
    """
    env = os.environ.get("TUNER_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    if in_checkout() and (CHECKOUT_DIR / "cache").is_dir():
        return CHECKOUT_DIR / "cache"
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "sparse-tuner"


def gpu_slug(name: str) -> str:
    """Folder name for a GPU under ``models/``: 'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3'.

    Example:
        >>> gpu_slug("NVIDIA H100 80GB HBM3")
        'nvidia-h100-80gb-hbm3'
    """
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
