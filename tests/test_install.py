"""The package as a user installs it: a wheel built from this checkout, imported and run from elsewhere."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")


def test_every_package_folder_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "tuner").rglob("__init__.py")}
    assert folders and folders <= listed, f"not in pyproject.toml's packages: {sorted(folders - listed)}"


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The wheel of this checkout installed into a folder of its own, and a home folder to run it in."""
    pytest.importorskip("wheel", reason="the 'test' extra (setuptools, wheel) builds the wheel offline")
    tmp = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation", "--no-index",
                    "-q", "-w", str(tmp / "dist")], check=True, capture_output=True)
    wheel = next((tmp / "dist").glob("sparse_tuner-*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target",
                    str(tmp / "site"), str(wheel)], check=True, capture_output=True)
    home = tmp / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TUNER_", "XDG_"))}
    # No device, so that a GPU machine runs the same path as CI.
    env.update(HOME=str(home), PYTHONPATH=str(tmp / "site"), CUDA_VISIBLE_DEVICES="")
    return tmp / "site", home, env


def run_installed(installed, *args, timeout=300):
    site, home, env = installed
    return subprocess.run([sys.executable, *args], cwd=home, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_installed_wheel_imports_outside_the_checkout_with_its_resources(installed):
    site, home, _ = installed
    code = ("import tuner, json; from tuner import paths, loaders; from tuner.model import load_profile; "
            "print(json.dumps([tuner.__file__, str(paths.templates_dir()), str(paths.models_dir()), "
            "str(paths.results_dir()), str(paths.cache_dir()), str(loaders.default_data_dir()), "
            "load_profile('NVIDIA H100 80GB HBM3').gpu['name']]))")
    proc = run_installed(installed, "-c", code)
    assert proc.returncode == 0, proc.stderr
    import json
    module, templates, models, results, cache, data, gpu_name = json.loads(proc.stdout)
    assert module.startswith(str(site)) and str(ROOT) not in module
    assert (Path(templates) / "csr_vector.cu.j2").is_file() and Path(templates).is_relative_to(site)
    assert (Path(models) / "nvidia-h100-80gb-hbm3" / "profile.json").is_file()
    assert results == str(home / ".local" / "share" / "sparse-tuner" / "models")
    assert cache == str(home / ".cache" / "sparse-tuner")
    assert data == "None" and gpu_name == "NVIDIA H100 80GB HBM3"


def test_installed_tool_plans_without_a_gpu_and_writes_only_under_home(installed):
    site, home, _ = installed
    before = sorted(p for p in site.rglob("*") if "__pycache__" not in p.parts)
    proc = run_installed(installed, "-m", "tuner", "tune", "rmat:7:4")
    assert proc.returncode == 3, proc.stderr
    assert "NO CUDA GPU PRESENT" in proc.stdout and "the model's choice for NVIDIA H100 80GB HBM3" in proc.stdout
    assert "rank  predicted ms" in proc.stdout
    assert list((home / ".cache" / "sparse-tuner" / "cubin").rglob("*.entry"))
    assert sorted(p for p in site.rglob("*") if "__pycache__" not in p.parts) == before
