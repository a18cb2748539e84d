import atexit
import linecache
import os
import shutil
import tempfile

import numpy as np
import pytest
import scipy.sparse as sp

from tuner import gpu
from tuner.loaders import default_data_dir, real_matrices

# The doctests of tuner/ run outside the per-test fixture below: the whole session gets a temporary cache and
# results folder, so that nothing a test run compiles or measures lands in the checkout's cache/ or models/
# (the shipped profiles are still found there).
_SESSION_DIR = tempfile.mkdtemp(prefix="tuner-tests-")
os.environ["TUNER_CACHE_DIR"] = os.path.join(_SESSION_DIR, "cache")
os.environ["TUNER_MODELS_DIR"] = os.path.join(_SESSION_DIR, "models")
atexit.register(shutil.rmtree, _SESSION_DIR, ignore_errors=True)

# Every doctest's debugger calls linecache.checkcache(), which raises KeyError on CPython before 3.13 where a
# garbage-collected function's finalizer removes its entry during the check (CPython gh-126775): SQLAlchemy,
# under Optuna, registers its generated __init__ functions so. The check only drops stale entries; an entry
# gone already needs none.
_checkcache = linecache.checkcache


def _tolerant_checkcache(filename=None):
    try:
        _checkcache(filename)
    except KeyError:
        pass


linecache.checkcache = _tolerant_checkcache

DATA_DIR = default_data_dir()
REAL = real_matrices()


def pytest_addoption(parser):
    parser.addoption("--shard", default=None, metavar="K/N",
                     help="run only the K-th of N interleaved parts of the selected tests (every N-th from the K-th "
                          "on), e.g. the GPU tests over two calls of a time-limited GPU machine: --shard 1/2, then "
                          "--shard 2/2")


def shard_part(items: list, spec: str) -> tuple[list, list]:
    """(kept, dropped): the K-th of N interleaved parts of ``items`` for a ``spec`` 'K/N', every N-th item from
    the K-th on, so that each part gets its share of every module's slow and quick tests.

    Example:
        >>> shard_part(list("abcde"), "2/2")
        (['b', 'd'], ['a', 'c', 'e'])
    """
    try:
        k, n = (int(part) for part in spec.split("/"))
    except ValueError:
        raise pytest.UsageError(f"--shard takes K/N with whole numbers, e.g. 1/2, got {spec!r}") from None
    if not 1 <= k <= n:
        raise pytest.UsageError(f"--shard K/N needs 1 <= K <= N, got {spec!r}")
    return ([item for i, item in enumerate(items) if i % n == k - 1],
            [item for i, item in enumerate(items) if i % n != k - 1])


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected theirs: the parts share what is left
def pytest_collection_modifyitems(config, items):
    spec = config.getoption("--shard")
    if spec:
        items[:], dropped = shard_part(items, spec)
        config.hook.pytest_deselected(items=dropped)
    if gpu.available():
        return
    skip = pytest.mark.skip(reason=f"no CUDA GPU: {gpu.unavailable_reason()}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


_BINARY_KINDS = ("cubin", "library", "lib", "src", "lock")


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch, request):
    """Every test gets its own cache directory, so no test sees another's plans (CPU tests: nor binaries), and
    the host's memory budget unchanged by a TUNER_HOST_MEMORY_LIMIT of the caller's environment. GPU tests
    share the session's compiled binaries (entries named by their source's hash, so sharing cannot change a
    result): otherwise nvcc would run again for every test."""
    root = tmp_path / "cache"
    if "gpu" in request.keywords:
        root.mkdir()
        for kind in _BINARY_KINDS:
            shared = os.path.join(_SESSION_DIR, "binaries", kind)
            os.makedirs(shared, exist_ok=True)
            os.symlink(shared, root / kind)
    monkeypatch.setenv("TUNER_CACHE_DIR", str(root))
    monkeypatch.delenv("TUNER_HOST_MEMORY_LIMIT", raising=False)
    return tmp_path / "cache"


@pytest.fixture(scope="session")
def real_paths():
    if not REAL:
        pytest.skip(f"no real matrices in {DATA_DIR}")
    return REAL


def power_law(n_rows=3000, n_cols=None, seed=0, dtype=np.float32):
    """A random matrix with Zipf-distributed row lengths, some empty rows and one long row."""
    rng = np.random.default_rng(seed)
    n_cols = n_cols or n_rows
    lengths = np.minimum(rng.zipf(1.8, n_rows) - 1, n_cols)
    lengths[rng.choice(n_rows, n_rows // 10, replace=False)] = 0
    rows = np.repeat(np.arange(n_rows), lengths)
    cols = rng.integers(0, n_cols, rows.size)
    vals = rng.uniform(-2, 2, rows.size).astype(dtype)
    return sp.csr_matrix((vals, (rows, cols)), shape=(n_rows, n_cols))


def fixture_matrices():
    """Named small matrices covering the edge cases every kernel must handle."""
    rng = np.random.default_rng(7)
    dense_row = sp.random(500, 400, density=0.01, format="lil", random_state=3, dtype=np.float32)
    dense_row[17, :] = rng.uniform(1, 2, 400)
    return {
        "power_law": power_law(),
        "rectangular_wide": power_law(300, 5000, seed=1),
        "rectangular_tall": power_law(4000, 70, seed=2),
        "one_dense_row": dense_row.tocsr(),
        "empty_rows": sp.csr_matrix((np.ones(3, np.float32), ([2, 2, 9], [0, 5, 1])), shape=(12, 6)),
        "pattern": (power_law(2000, seed=4) != 0).astype(np.float32),
        "float64": power_law(1500, seed=5, dtype=np.float64),
        "all_empty": sp.csr_matrix((40, 30), dtype=np.float32),
        "tiny": sp.csr_matrix(np.array([[0, 2.5], [1.5, 0]], dtype=np.float32)),
        "long_rows": long_rows(),
    }


def long_rows():
    """200 x 20000 with power-law rows plus one full row and one of 5000 entries (the huge class)."""
    base = power_law(200, 20000, seed=6).tolil()
    rng = np.random.default_rng(8)
    base[5, :] = rng.uniform(-1, 1, 20000)
    base[50, rng.choice(20000, 5000, replace=False)] = rng.uniform(-1, 1, 5000)
    return base.tocsr()
