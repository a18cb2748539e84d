import builtins
import errno
import gzip
import io
import os
import pickle
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
import scipy.io
import scipy.sparse as sp

from tuner import paths
from tuner.generators import kronecker, rmat
from tuner.loaders import (
    SPEC_FORMS,
    MatrixFileError,
    SourceSize,
    Spec,
    data_dir_or_error,
    default_data_dir,
    estimate,
    is_spec,
    load,
    parse_spec,
    real_matrices,
)
from tuner.matrix import MatrixError
from tuner.memory import InsufficientMemoryError


def assert_canonical(A):
    assert isinstance(A, sp.csr_matrix)
    assert A.has_sorted_indices
    rows = np.repeat(np.arange(A.shape[0]), np.diff(A.indptr))
    keys = rows.astype(np.int64) * A.shape[1] + A.indices
    assert np.all(np.diff(keys) > 0), "sorted within rows, no duplicates"


# --- .npz --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_npz_keeps_values_and_their_dtype(tmp_path, dtype):
    dense = np.array([[0, 2.5, 0], [1, 0, 0], [0, 0, -3]], dtype=dtype)
    sp.save_npz(tmp_path / "m.npz", sp.csr_matrix(dense))
    A = load(tmp_path / "m.npz")
    assert_canonical(A)
    assert A.dtype == dtype and A.indices.dtype == np.int32
    assert np.array_equal(A.toarray(), dense)


def test_npz_in_another_format_with_duplicates_becomes_canonical_csr(tmp_path):
    coo = sp.coo_matrix(([1.0, 2.0, 4.0], ([1, 1, 0], [2, 2, 0])), shape=(2, 3))
    sp.save_npz(tmp_path / "coo.npz", coo)
    A = load(str(tmp_path / "coo.npz"))
    assert_canonical(A)
    assert np.array_equal(A.toarray(), [[4, 0, 0], [0, 0, 3]])


def test_npz_dtype_argument_converts_values(tmp_path):
    sp.save_npz(tmp_path / "m.npz", sp.csr_matrix(np.eye(3)))
    assert load(tmp_path / "m.npz", dtype=np.float32).dtype == np.float32


# --- Matrix Market -----------------------------------------------------------------------------------


def write(path: Path, text: str, compress: bool = False) -> Path:
    data = text.encode()
    if compress:
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path


def test_mtx_general_real(tmp_path):
    path = write(
        tmp_path / "g.mtx",
        "%%MatrixMarket matrix coordinate real general\n% a comment\n3 4 3\n1 2 1.5\n3 4 -2\n2 1 7\n",
    )
    A = load(path)
    assert_canonical(A)
    assert A.dtype == np.float64
    assert np.array_equal(A.toarray(), [[0, 1.5, 0, 0], [7, 0, 0, 0], [0, 0, 0, -2]])


def test_mtx_pattern_symmetric_is_expanded_with_ones(tmp_path):
    path = write(
        tmp_path / "p.mtx",
        "%%MatrixMarket matrix coordinate pattern symmetric\n3 3 3\n2 1\n3 1\n3 3\n",
    )
    expected = [[0, 1, 1], [1, 0, 0], [1, 0, 1]]
    assert np.array_equal(load(path).toarray(), expected)


def test_mtx_gz_and_array_format(tmp_path):
    path = write(
        tmp_path / "a.mtx.gz",
        "%%MatrixMarket matrix array real general\n2 2\n1\n0\n3\n4\n",
        compress=True,
    )
    A = load(path)
    assert_canonical(A)
    assert np.array_equal(A.toarray(), [[1, 3], [0, 4]])
    assert A.nnz == 3


def test_mtx_integer_values_become_float64_and_duplicates_are_summed(tmp_path):
    path = write(
        tmp_path / "i.mtx",
        "%%MatrixMarket matrix coordinate integer general\n2 2 3\n1 1 2\n1 1 3\n2 2 1\n",
    )
    A = load(path)
    assert A.dtype == np.float64
    assert np.array_equal(A.toarray(), [[5, 0], [0, 1]])


def test_mtx_round_trip_of_scipy_mmwrite(tmp_path):
    M = sp.random(40, 30, density=0.1, format="csr", random_state=1)
    scipy.io.mmwrite(tmp_path / "r.mtx", M)
    assert np.allclose(load(tmp_path / "r.mtx").toarray(), M.toarray())


def test_mtx_that_does_not_parse_names_the_file(tmp_path):
    path = write(tmp_path / "bad.mtx", "not a matrix market file\n")
    with pytest.raises(ValueError, match="bad.mtx"):
        load(path)


# --- SNAP edge lists ---------------------------------------------------------------------------------

SNAP = """# Directed graph (each unordered pair of nodes is saved once): example.txt
# Nodes: 5 Edges: 6
# FromNodeId\tToNodeId
0\t1
1\t2
4\t0

1\t2
2\t2
% trailing comment style
3\t0
"""
SNAP_DENSE = np.array(
    [
        [0, 1, 0, 0, 0],
        [0, 0, 1, 0, 0],
        [0, 0, 1, 0, 0],
        [1, 0, 0, 0, 0],
        [1, 0, 0, 0, 0],
    ],
    dtype=np.float32,
)


@pytest.mark.parametrize("name", ["g.txt", "g.tsv", "g.edges", "g.el", "g.txt.gz"])
def test_snap_edge_list_with_comments_blank_lines_and_duplicates(tmp_path, name):
    path = write(tmp_path / name, SNAP, compress=name.endswith(".gz"))
    A = load(path)
    assert_canonical(A)
    assert A.dtype == np.float32 and A.indices.dtype == np.int32
    assert np.array_equal(A.toarray(), SNAP_DENSE)


def test_snap_comma_separated_with_crlf_and_no_final_newline(tmp_path):
    path = write(tmp_path / "g.csv", "0,1\r\n2, 0\r\n1 ,1\r\n0,1")
    assert np.array_equal(load(path).toarray(), [[0, 1, 0], [0, 1, 0], [1, 0, 0]])


def test_snap_weighted_sums_duplicates_in_float64(tmp_path):
    path = write(tmp_path / "w.tsv", "# src dst w\n0\t1\t2.5\n0\t1\t0.5\n2\t0\t-1e-1\n")
    A = load(path)
    assert_canonical(A)
    assert A.dtype == np.float64
    assert np.allclose(A.toarray(), [[0, 3.0, 0], [0, 0, 0], [-0.1, 0, 0]])


def test_snap_node_ids_are_used_as_is(tmp_path):
    A = load(write(tmp_path / "g.txt", "10 3\n"))
    assert A.shape == (11, 11) and A.nnz == 1 and A[10, 3] == 1


def test_snap_large_random_edge_list_matches_numpy(tmp_path):
    rng = np.random.default_rng(0)
    edges = rng.integers(0, 5000, size=(200_000, 2))
    with open(tmp_path / "big.txt", "w") as f:
        f.write("# header\n")
        np.savetxt(f, edges, fmt="%d", delimiter="\t")
    expected = sp.csr_matrix((np.ones(len(edges)), (edges[:, 0], edges[:, 1])))
    expected.sum_duplicates()
    A = load(tmp_path / "big.txt")
    assert np.array_equal(A.indptr, expected.indptr) and np.array_equal(A.indices, expected.indices)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("# nothing but comments\n\n", "has no edges"),
        ("", "has no edges"),
        ("0 1\n1 x\n", r"line 2: cannot parse '1 x'"),
        ("0 1\n1 2\n# ok\n3 4 5\n", "line 4: expected 2 columns"),
        ("0 1 2 3\n", "line 1: expected 'src dst' or 'src dst weight'"),
        ("1\n", "line 1: expected 'src dst'"),
        ("0 1\n2 -1\n", "line 2: node ids must be non-negative"),
        ("0 1 1.0\n0.5 2 1.0\n", "line 2: node ids must be integers"),
        ("0 1\n1.5 2\n", "line 2: cannot parse"),
    ],
)
def test_snap_errors_name_the_file_and_the_line(tmp_path, text, message):
    path = write(tmp_path / "e.txt", text)
    with pytest.raises(ValueError, match=message) as info:
        load(path)
    assert "e.txt" in str(info.value)


def test_missing_file_raises_file_not_found_naming_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.npz") as info:
        load(tmp_path / "nope.npz")
    assert info.value.filename == str(tmp_path / "nope.npz")


# --- generator specs ---------------------------------------------------------------------------------


def test_parse_spec_forms_and_defaults():
    assert parse_spec("rmat:8") == Spec("rmat", (8, 16, 0))
    assert parse_spec("rmat:8:4") == Spec("rmat", (8, 4, 0))
    assert parse_spec("rmat:8:4:3") == Spec("rmat", (8, 4, 3))
    assert parse_spec("kron:/data/g:1.npz:2") == Spec("kron", ("/data/g:1.npz", 2))
    assert is_spec("rmat:8") and is_spec("kron:x:1") and is_spec("rmat")
    assert not is_spec("graph.npz") and not is_spec(Path("rmat:8"))


@pytest.mark.parametrize("text", ["rmat", "rmat:", "rmat:x", "rmat:1:2:3:4", "kron:2", "kron:g.npz:", "kron:"])
def test_bad_spec_names_it_and_lists_the_accepted_forms(text):
    with pytest.raises(ValueError) as info:
        load(text)
    assert repr(text) in str(info.value)
    assert all(form in str(info.value) for form in SPEC_FORMS)


def test_spec_with_out_of_range_arguments_names_the_spec_and_the_argument():
    with pytest.raises(ValueError, match=r"'rmat:99'.*scale"):
        load("rmat:99")
    with pytest.raises(ValueError, match=r"'rmat:4:0'.*edge_factor"):
        load("rmat:4:0")


def test_rmat_specs_load_the_generated_graph():
    assert np.array_equal(load("rmat:8").indices, rmat(8).indices)
    A = load("rmat:8:4:3")
    B = rmat(8, 4, seed=3)
    assert A.shape == (256, 256) and np.array_equal(A.indptr, B.indptr)
    assert np.array_equal(A.indices, B.indices)


def test_kron_spec_scales_the_loaded_file(tmp_path):
    path = write(tmp_path / "g.txt", SNAP)
    A = load(f"kron:{path}:2")
    B = kronecker(sp.csr_matrix(SNAP_DENSE), None, 2)
    assert A.shape == (20, 20) and A.nnz == 3**2 * 5
    assert np.array_equal(A.indices, B.indices) and np.array_equal(A.indptr, B.indptr)


def test_kron_spec_of_a_missing_file_is_a_file_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.npz"):
        load(f"kron:{tmp_path / 'missing.npz'}:2")


# --- data directory ----------------------------------------------------------------------------------


def test_default_data_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("TUNER_DATA_DIR", str(tmp_path))
    assert default_data_dir() == tmp_path
    monkeypatch.delenv("TUNER_DATA_DIR")
    package = Path(__import__("tuner").__file__).resolve().parent
    assert default_data_dir() == package.parent.parent / "shared" / "data"


def test_real_matrices_lists_npz_files_sorted(tmp_path):
    for name in ["b.npz", "a.npz", "notes.txt"]:
        (tmp_path / name).write_bytes(b"")
    assert real_matrices(tmp_path) == [tmp_path / "a.npz", tmp_path / "b.npz"]
    assert real_matrices(tmp_path / "absent") == []


def test_real_wiki_vote_loads_with_its_published_size():
    path = default_data_dir() / "wiki-Vote.npz"
    if not path.is_file():
        pytest.skip(f"no real matrices in {default_data_dir()}")
    assert path in real_matrices()
    A = load(path)
    assert_canonical(A)
    assert A.shape == (8298, 8298) and A.nnz == 103689
    assert A.dtype == np.float32 and np.all(A.data == 1)


def test_default_data_dir_is_none_outside_a_checkout(monkeypatch, tmp_path):
    # An installed package: no pyproject.toml next to the package folder.
    monkeypatch.delenv("TUNER_DATA_DIR", raising=False)
    monkeypatch.setattr(paths, "CHECKOUT_DIR", tmp_path / "site-packages")
    assert default_data_dir() is None
    assert real_matrices() == []
    assert data_dir_or_error(None) is None


def test_data_dir_or_error_returns_a_given_existing_folder(tmp_path):
    assert data_dir_or_error(tmp_path) == tmp_path
    assert data_dir_or_error(str(tmp_path)) == tmp_path


def test_data_dir_or_error_refuses_a_missing_folder_naming_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="data folder does not exist") as info:
        data_dir_or_error(tmp_path / "absent")
    assert info.value.filename == str(tmp_path / "absent")


def test_data_dir_or_error_refuses_a_file_in_place_of_the_folder(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(FileNotFoundError, match="data folder is not a folder") as info:
        data_dir_or_error(tmp_path / "f")
    assert info.value.filename == str(tmp_path / "f")


def test_data_dir_or_error_checks_the_environment_folder_when_none_is_given(monkeypatch, tmp_path):
    monkeypatch.setenv("TUNER_DATA_DIR", str(tmp_path / "typo"))
    with pytest.raises(FileNotFoundError, match=r"\$TUNER_DATA_DIR names a folder that does not exist"):
        data_dir_or_error(None)
    monkeypatch.setenv("TUNER_DATA_DIR", str(tmp_path))
    assert data_dir_or_error(None) == tmp_path


def test_data_dir_or_error_without_a_folder_given_is_the_optional_default(monkeypatch):
    monkeypatch.delenv("TUNER_DATA_DIR", raising=False)
    assert data_dir_or_error(None) == default_data_dir()


# --- estimates ---------------------------------------------------------------------------------------


def test_estimate_of_rmat_25_is_its_drawn_edges_in_milliseconds():
    start = time.perf_counter()
    size = estimate("rmat:25")
    assert time.perf_counter() - start < 0.1
    assert (size.n_rows, size.n_cols, size.nnz) == (2**25, 2**25, 16 * 2**25)
    assert 20 * size.nnz < size.peak_bytes < 30 * size.nnz
    assert "B per drawn edge x 536.9M drawn edges" in size.basis


def test_estimate_of_a_kron_spec_reads_only_the_npz_headers(tmp_path):
    A = rmat(7, 4, seed=1)
    sp.save_npz(tmp_path / "g.npz", A)
    start = time.perf_counter()
    size = estimate(f"kron:{tmp_path / 'g.npz'}:3")
    assert time.perf_counter() - start < 0.1
    assert (size.n_rows, size.n_cols, size.nnz) == (8 * 128, 8 * 128, 27 * A.nnz)
    K = load(f"kron:{tmp_path / 'g.npz'}:3")
    assert K.shape == (size.n_rows, size.n_cols) and K.nnz == size.nnz


def test_estimate_of_a_kron_spec_of_an_edge_list_bounds_its_nnz(tmp_path):
    path = write(tmp_path / "g.txt", SNAP)
    size = estimate(f"kron:{path}:2")
    assert size.n_rows is None and size.nnz == 9 * ((len(SNAP) + 1) // 4)
    assert load(f"kron:{path}:2").nnz <= size.nnz


def test_estimate_of_an_npz_reads_shape_nnz_and_unpacked_size(tmp_path):
    A = sp.random(300, 200, density=0.05, format="csr", random_state=2, dtype=np.float32)
    sp.save_npz(tmp_path / "m.npz", A)
    size = estimate(tmp_path / "m.npz")
    members = sum(info.file_size for info in zipfile.ZipFile(tmp_path / "m.npz").infolist())
    assert (size.n_rows, size.n_cols, size.nnz, size.peak_bytes) == (300, 200, A.nnz, members)


def test_estimate_of_a_coo_npz_adds_the_conversion_to_csr(tmp_path):
    A = sp.random(300, 200, density=0.05, format="coo", random_state=2)
    sp.save_npz(tmp_path / "m.npz", A)
    size = estimate(tmp_path / "m.npz")
    members = sum(info.file_size for info in zipfile.ZipFile(tmp_path / "m.npz").infolist())
    assert size.nnz == A.nnz and size.peak_bytes == members + 12 * A.nnz + 8 * 301


def test_estimate_of_a_matrix_market_file_reads_its_header(tmp_path):
    path = write(tmp_path / "s.mtx", "%%MatrixMarket matrix coordinate pattern symmetric\n3 3 3\n2 1\n3 1\n3 3\n")
    size = estimate(path)
    assert (size.n_rows, size.n_cols, size.nnz) == (3, 3, 6), "symmetric storage counted twice"


def test_estimate_of_an_array_matrix_market_file_is_dense(tmp_path):
    path = write(tmp_path / "a.mtx", "%%MatrixMarket matrix array real general\n100000 100000\n1\n")
    size = estimate(path)
    assert size.nnz == 10**10 and size.peak_bytes >= 8 * 10**10


def test_estimate_of_an_edge_list_bounds_nnz_by_the_file_size(tmp_path):
    path = write(tmp_path / "g.txt", SNAP)
    size = estimate(path)
    assert size == SourceSize(None, None, (len(SNAP) + 1) // 4, size.peak_bytes, size.basis)
    assert size.nnz >= load(path).nnz


def test_estimate_raises_no_memory_error_itself(monkeypatch):
    monkeypatch.setenv("TUNER_HOST_MEMORY_LIMIT", "1M")
    assert estimate("rmat:30").peak_bytes > 10**9


# --- host memory -------------------------------------------------------------------------------------


def test_rmat_40_is_refused_in_well_under_a_second():
    start = time.perf_counter()
    with pytest.raises(InsufficientMemoryError, match=r"^rmat:40 would need about [\d.]+ TB of host memory") as info:
        load("rmat:40")
    assert time.perf_counter() - start < 1.0
    assert "B per drawn edge x 17.6T drawn edges" in str(info.value)


def test_rmat_beyond_the_environment_memory_limit_is_refused(monkeypatch):
    monkeypatch.setenv("TUNER_HOST_MEMORY_LIMIT", "1M")
    with pytest.raises(InsufficientMemoryError, match=r"rmat:12 would need about .* MB .*; 1\.0 MB is available"):
        load("rmat:12")


def test_kron_spec_too_large_is_refused_before_building(tmp_path):
    sp.save_npz(tmp_path / "g.npz", rmat(6, 4))
    start = time.perf_counter()
    with pytest.raises(InsufficientMemoryError, match=r"kron:.*g\.npz:30 would need about") as info:
        load(f"kron:{tmp_path / 'g.npz'}:30")
    assert time.perf_counter() - start < 1.0
    assert "B per output edge" in str(info.value)


def test_edge_list_with_a_huge_node_id_is_refused_before_building(tmp_path):
    path = write(tmp_path / "sparse-ids.txt", "0 1\n1000000000000 1\n")
    start = time.perf_counter()
    with pytest.raises(InsufficientMemoryError) as info:
        load(path)
    assert time.perf_counter() - start < 1.0
    message = str(info.value)
    assert message.startswith(f"{path} would need about 16.0 TB of host memory")
    assert "node ids up to 1000000000000 make 1.0T rows" in message
    assert "relabel them compactly as 0..N-1" in message


def write_archive(path: Path, arrays: dict, raw: dict | None = None) -> Path:
    """A compressed .npz of ``arrays`` (saved with np.save) and ``raw`` members (bytes as given)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, array in arrays.items():
            buffer = io.BytesIO()
            np.save(buffer, array)
            archive.writestr(f"{name}.npy", buffer.getvalue())
        for name, data in (raw or {}).items():
            archive.writestr(f"{name}.npy", data)
    return path


def npy_header(dtype: str, shape: tuple) -> bytes:
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": dtype, "fortran_order": False, "shape": shape})
    return header.getvalue()


def test_npz_whose_members_unpack_beyond_the_memory_is_refused_unread(tmp_path, monkeypatch):
    # 40 MB of zeros compress to about 40 kB: the check must use the uncompressed sizes.
    arrays = {"format": np.array(b"csr"), "shape": np.array([10, 10]), "indptr": np.zeros(11, np.int32)}
    raw = {name: npy_header(dtype, (5_000_000,)) + bytes(20_000_000) for name, dtype in [("data", "<f4"), ("indices", "<i4")]}
    path = write_archive(tmp_path / "bomb.npz", arrays, raw)
    assert path.stat().st_size < 200_000
    monkeypatch.setenv("TUNER_HOST_MEMORY_LIMIT", "10M")
    with pytest.raises(InsufficientMemoryError, match=r"bomb\.npz would need about 40\.0 MB .*unpack to 40\.0 MB"):
        load(path)


def test_gzip_edge_list_that_decompresses_beyond_the_memory_is_cut_off(tmp_path, monkeypatch):
    # Two gzip members: the trailer of the last one tells 4 bytes, the first holds 4 MB.
    path = tmp_path / "bomb.txt.gz"
    path.write_bytes(gzip.compress(b"0 1\n" * 1_000_000) + gzip.compress(b"0 1\n"))
    monkeypatch.setenv("TUNER_HOST_MEMORY_LIMIT", "4M")
    with pytest.raises(InsufficientMemoryError, match=r"bomb\.txt\.gz would need about .*decompresses to more than"):
        load(path)


def test_dense_matrix_market_file_is_refused_from_its_header(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNER_HOST_MEMORY_LIMIT", "8G")
    path = write(tmp_path / "a.mtx", "%%MatrixMarket matrix array real general\n100000 100000\n1\n")
    message = r"a\.mtx would need about 450\.0 GB .*\(a dense 100000 x 100000 array: 45 B per cell"
    with pytest.raises(InsufficientMemoryError, match=message):
        load(path)


# --- unreadable files --------------------------------------------------------------------------------


def npz_bytes(tmp_path) -> bytes:
    sp.save_npz(tmp_path / "whole.npz", sp.random(60, 50, density=0.2, format="csr", random_state=0))
    return (tmp_path / "whole.npz").read_bytes()


def test_matrix_file_error_is_a_matrix_error_naming_the_path_and_survives_pickling():
    error = MatrixFileError("/d/g.npz", "the file is empty (0 bytes)")
    assert isinstance(error, MatrixError) and isinstance(error, ValueError)
    assert str(error) == "/d/g.npz: the file is empty (0 bytes)" and error.path == "/d/g.npz"
    assert str(pickle.loads(pickle.dumps(error))) == str(error)


@pytest.mark.parametrize("keep", [0.5, 0.9, 0.99])
def test_truncated_npz_names_the_path_and_the_problem(tmp_path, keep):
    data = npz_bytes(tmp_path)
    path = tmp_path / "cut.npz"
    path.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(MatrixFileError, match=r"cut\.npz: not a readable scipy\.sparse \.npz file: not a zip archive"):
        load(path)


def test_npz_with_a_corrupt_member_names_the_path(tmp_path):
    data = bytearray(npz_bytes(tmp_path))
    start = data.index(b"data.npy") + 200  # inside the compressed data of the values
    data[start : start + 64] = bytes(64)
    path = tmp_path / "bad.npz"
    path.write_bytes(bytes(data))
    with pytest.raises(MatrixFileError, match=r"bad\.npz: not a readable scipy\.sparse \.npz file"):
        load(path)


@pytest.mark.parametrize("name", ["empty.npz", "empty.mtx", "empty.mtx.gz"])
def test_empty_file_names_the_path(tmp_path, name):
    (tmp_path / name).write_bytes(b"")
    with pytest.raises(MatrixFileError, match=rf"{name}: the file is empty \(0 bytes\)"):
        load(tmp_path / name)


def test_empty_edge_list_has_no_edges(tmp_path):
    (tmp_path / "empty.txt").write_bytes(b"")
    with pytest.raises(MatrixFileError, match=r"empty\.txt: has no edges"):
        load(tmp_path / "empty.txt")


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("g.npz", "not a readable scipy.sparse .npz file: not a zip archive"),
        ("g.mtx", "not a readable Matrix Market file"),
        ("g.txt", "holds binary data, not a text edge list"),
    ],
)
def test_garbage_bytes_name_the_path_and_the_problem(tmp_path, name, message):
    (tmp_path / name).write_bytes(bytes(range(256)) * 8)
    with pytest.raises(MatrixFileError, match=f"{name}: {message}".replace(".", r"\.")):
        load(tmp_path / name)


def test_gzip_data_without_a_gz_ending_is_named_as_such(tmp_path):
    (tmp_path / "g.txt").write_bytes(gzip.compress(b"0 1\n"))
    with pytest.raises(MatrixFileError, match=r"g\.txt: holds gzip-compressed data \(name it with a \.gz ending\)"):
        load(tmp_path / "g.txt")


@pytest.mark.parametrize("name", ["g.txt.gz", "g.mtx.gz"])
def test_corrupt_gzip_names_the_path(tmp_path, name):
    text = b"%%MatrixMarket matrix coordinate real general\n2 2 1\n1 1 1\n" if "mtx" in name else b"0 1\n" * 500
    data = bytearray(gzip.compress(text))
    data[12:-8] = bytes(len(data) - 20)  # keep the header and trailer, zero the deflate stream
    (tmp_path / name).write_bytes(bytes(data))
    with pytest.raises(MatrixFileError, match=name.replace(".", r"\.") + ": not a readable"):
        load(tmp_path / name)


def test_truncated_gzip_edge_list_says_it_ends_early(tmp_path):
    data = gzip.compress(b"0 1\n1 2\n" * 2000)
    (tmp_path / "g.txt.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(MatrixFileError, match=r"g\.txt\.gz: .*ends early; it is truncated"):
        load(tmp_path / "g.txt.gz")


@pytest.mark.parametrize("name", ["folder.npz", "folder.mtx", "folder"])
def test_a_folder_is_not_a_matrix_file(tmp_path, name):
    (tmp_path / name).mkdir()
    with pytest.raises(MatrixFileError, match=rf"{name}: is a folder, not a matrix file"):
        load(tmp_path / name)
    with pytest.raises(MatrixFileError, match="is a folder"):
        load(f"kron:{tmp_path / name}:2")


def test_a_pipe_is_not_read(tmp_path):
    os.mkfifo(tmp_path / "pipe.txt")
    with pytest.raises(MatrixFileError, match=r"pipe\.txt: is not a regular file"):
        load(tmp_path / "pipe.txt")


@pytest.mark.parametrize("name", ["m.npz", "m.mtx", "g.txt", "g.txt.gz"])
def test_unreadable_file_says_permission_denied(tmp_path, monkeypatch, name):
    path = tmp_path / name
    path.write_bytes(b"0 1\n")
    real_open = io.open

    def denied(file, *args, **kwargs):
        if os.fspath(file) == str(path):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(file, *args, **kwargs)

    # Root reads anything, so the refusal is simulated where every reader opens files.
    monkeypatch.setattr(builtins, "open", denied)
    monkeypatch.setattr(io, "open", denied)
    with pytest.raises(MatrixFileError, match=rf"{name}: cannot be read: permission denied"):
        load(path)


def test_npz_without_the_sparse_keys_lists_what_it_holds(tmp_path):
    np.savez(tmp_path / "dense.npz", a=np.ones(3), b=np.zeros(2))
    message = r"dense\.npz: not a scipy\.sparse \.npz file: it has no 'format' array \(its arrays: a, b\)"
    with pytest.raises(MatrixFileError, match=message):
        load(tmp_path / "dense.npz")


def test_npz_missing_one_array_of_its_format_names_it(tmp_path):
    path = write_archive(tmp_path / "partial.npz", {"format": np.array(b"csr"), "shape": np.array([2, 2]), "data": np.ones(1)})
    message = r"partial\.npz: not a complete csr \.npz file: it has no 'indices', 'indptr' array"
    with pytest.raises(MatrixFileError, match=message):
        load(path)


def test_npz_member_declaring_more_data_than_it_holds_is_corrupt(tmp_path):
    arrays = {"format": np.array(b"csr"), "shape": np.array([2, 2]), "indptr": np.zeros(3, np.int32),
              "indices": np.zeros(0, np.int32)}
    path = write_archive(tmp_path / "lie.npz", arrays, {"data": npy_header("<f8", (10**12,)) + bytes(16)})
    with pytest.raises(MatrixFileError, match=r"lie\.npz: member data\.npy declares 8\.0 TB of data but holds 16 B"):
        load(path)


def test_npz_of_complex_values_is_refused(tmp_path):
    sp.save_npz(tmp_path / "c.npz", sp.csr_matrix(np.array([[1j, 0], [0, 2]])))
    with pytest.raises(MatrixFileError, match=r"c\.npz: complex values are not supported"):
        load(tmp_path / "c.npz")


def test_garbled_matrix_market_body_names_the_path(tmp_path):
    path = write(tmp_path / "t.mtx", "%%MatrixMarket matrix coordinate real general\n3 3 4\n1 1 1.0\n2 x 2.0\n")
    with pytest.raises(MatrixFileError, match=r"t\.mtx: not a readable Matrix Market file"):
        load(path)
