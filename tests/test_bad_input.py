"""Bad input as a user meets it: each case is an input, the error type it must raise and words its message
must hold; the same inputs through the command line end in one line on stderr, never a traceback."""
import os
import time

import numpy as np
import pytest
import scipy.sparse as sp

import tuner
from tuner import cli
from tuner.cache import Cache, CacheError
from tuner.loaders import MatrixFileError, load
from tuner.matrix import MatrixError, canonicalize, check_vector_dtype, check_vector_shape
from tuner.memory import InsufficientMemoryError


def csr_with(indptr=(0, 1, 2, 3), indices=(0, 1, 2), shape=(3, 3)):
    """A CSR matrix whose arrays were changed after construction (SciPy checks none of this)."""
    A = sp.csr_matrix(np.eye(3, dtype=np.float32))
    A.indptr, A.indices = np.array(indptr, np.int32), np.array(indices, np.int32)
    A.data = np.arange(1, len(indices) + 1, dtype=np.float32)
    A._shape = shape
    return A


def coo_with(row):
    """A 2 x 2 COO matrix whose first row index was changed after construction."""
    A = sp.coo_matrix((np.array([1.0, 2.0]), ([0, 1], [1, 0])), shape=(2, 2))
    A.row[0] = row
    return A


def npz_bytes(tmp_path):
    sp.save_npz(tmp_path / "ok.npz", sp.random(60, 60, density=0.1, format="csr", random_state=0))
    return (tmp_path / "ok.npz").read_bytes()


def write(tmp_path, name, data):
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


# (case, make the input from tmp_path, action, expected error type, words of the message)
MATRICES = [
    ("column index too large", lambda t: csr_with(indices=(0, 3, 2)), MatrixError,
     "column index 3 (first out of range at position 1) is out of range for 3 columns"),
    ("negative column index", lambda t: csr_with(indices=(0, -4, 2)), MatrixError,
     "negative column index -4 (first at position 1)"),
    ("indptr falls", lambda t: csr_with(indptr=(0, 2, 1, 3)), MatrixError,
     "indptr is not monotonic: indptr[2] = 1 < indptr[1] = 2"),
    ("indptr short of nnz", lambda t: csr_with(indptr=(0, 1, 2, 2)), MatrixError,
     "indptr[-1] = 2 does not match the 3 stored entries"),
    ("indptr of the wrong length", lambda t: csr_with(indptr=(0, 1, 3)), MatrixError,
     "indptr has 3 entries, but 3 rows need 4"),
    ("row index of COO too large", lambda t: coo_with(row=5), MatrixError,
     "row index 5 (first out of range at position 0) is out of range for 2 rows"),
    ("dense array", lambda t: np.eye(3), MatrixError, "dense ndarray"),
    ("NaN value", lambda t: sp.csr_matrix(np.array([[np.nan, 1.0]])), MatrixError, "NaN"),
    ("infinite value", lambda t: sp.csr_matrix(np.array([[np.inf, 1.0]])), MatrixError, "infinite"),
    ("complex values", lambda t: sp.csr_matrix(np.array([[1j, 1.0]])), MatrixError, "complex"),
]

FILES = [
    ("missing file", lambda t: str(t / "missing.npz"), FileNotFoundError, "missing.npz"),
    ("empty .npz", lambda t: write(t, "empty.npz", b""), MatrixFileError, "empty.npz: the file is empty"),
    ("truncated .npz", lambda t: write(t, "cut.npz", npz_bytes(t)[:300]), MatrixFileError,
     "cut.npz: not a readable scipy.sparse .npz file"),
    ("garbled .npz", lambda t: write(t, "noise.npz", bytes(range(256)) * 4), MatrixFileError,
     "noise.npz: not a readable scipy.sparse .npz file"),
    ("folder for a file", lambda t: (t / "adir.mtx").mkdir() or str(t / "adir.mtx"), MatrixFileError,
     "adir.mtx: is a folder, not a matrix file"),
    ("garbled .mtx", lambda t: write(t, "bad.mtx", b"%%MatrixMarket matrix nonsense\n1 2\n"), MatrixFileError,
     "bad.mtx"),
    ("corrupt .gz edge list", lambda t: write(t, "g.txt.gz", b"\x1f\x8b\x08\x00garbage"), MatrixFileError,
     "g.txt.gz"),
    ("edge list with a fraction", lambda t: write(t, "e.txt", b"0 1\n1 2.5\n"), MatrixFileError,
     "e.txt: line 2: cannot parse"),
    ("node id 10^12", lambda t: write(t, "sparse.txt", b"0 1\n1000000000000 2\n"), InsufficientMemoryError,
     "relabel them compactly"),
    ("rmat:40", lambda t: "rmat:40", InsufficientMemoryError, "rmat:40 would need about"),
    ("kron:FILE:30", lambda t: f"kron:{write(t, 'k.npz', npz_bytes(t))}:30", InsufficientMemoryError,
     "k.npz:30 would need about"),
    ("bad generator spec", lambda t: "rmat:many", ValueError, "bad generator spec 'rmat:many'"),
]


@pytest.mark.parametrize("case, make, error, words", MATRICES, ids=[c[0] for c in MATRICES])
def test_bad_matrix_is_refused_before_anything_is_built(case, make, error, words, tmp_path):
    with pytest.raises(error) as info:
        tuner.prepare(make(tmp_path))  # the whole pipeline up to the GPU: the check comes first
    assert words in str(info.value)


@pytest.mark.parametrize("case, make, error, words", FILES, ids=[c[0] for c in FILES])
def test_bad_source_is_refused_at_once_with_its_name(case, make, error, words, tmp_path):
    source = make(tmp_path)
    t0 = time.perf_counter()
    with pytest.raises(error) as info:
        load(source)
    assert words in str(info.value)
    assert time.perf_counter() - t0 < 2.0  # refused from headers and sizes, not after building


@pytest.mark.parametrize("case, make, error, words", FILES, ids=[c[0] for c in FILES])
def test_bad_source_on_the_command_line_ends_in_one_line(case, make, error, words, tmp_path, capsys):
    assert cli.main(["tune", make(tmp_path), "--cache-dir", str(tmp_path / "cache")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("limit, words", [("abc", "'abc' is not a byte figure"), (-1, "must be positive"),
                                          ("0", "must be positive")])
@pytest.mark.parametrize("op", ["spmv", "spgemm"])
def test_a_device_memory_limit_it_cannot_read_is_named_before_the_gpu_is_asked_for(monkeypatch, op, limit, words):
    from tuner import gpu

    def no_gpu():
        raise gpu.NoDeviceError("no CUDA GPU present")
    monkeypatch.setattr(gpu, "device_info", no_gpu)
    A = sp.random(6, 6, density=0.5, format="csr", random_state=1)
    operands = (A,) if op == "spmv" else (A, A)
    with pytest.raises(ValueError, match=words):
        tuner.compile(*operands, device_memory_limit=limit)
    with pytest.raises(gpu.NoDeviceError):  # a limit it reads goes on to ask for the GPU
        tuner.compile(*operands, device_memory_limit="1G")


def test_vectors_of_the_wrong_length_or_dtype_are_refused():
    with pytest.raises(MatrixError, match="x has length 4, but the matrix needs 3"):
        check_vector_shape((4,), 3)
    with pytest.raises(MatrixError, match="x has dtype float64, but the kernel computes in float32"):
        check_vector_dtype(np.float64, np.dtype(np.float32))


def test_cache_folder_that_is_a_file_names_the_path(tmp_path, capsys):
    blocker = tmp_path / "cache"
    blocker.write_text("not a folder")
    with pytest.raises(CacheError, match=f"cache directory {blocker} is not a directory"):
        Cache(blocker)
    assert cli.main(["tune", "rmat:6", "--cache-dir", str(blocker)]) == 2
    err = capsys.readouterr().err
    assert str(blocker) in err and "TUNER_CACHE_DIR" in err and err.count("\n") == 1


def test_host_memory_limit_is_honoured_by_generators(monkeypatch):
    monkeypatch.setenv("TUNER_HOST_MEMORY_LIMIT", "1M")
    with pytest.raises(InsufficientMemoryError, match="1.0 MB is available"):
        load("rmat:14")
