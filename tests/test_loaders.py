import gzip
from pathlib import Path

import numpy as np
import pytest
import scipy.io
import scipy.sparse as sp

from tuner.generators import kronecker, rmat
from tuner.loaders import (
    SPEC_FORMS,
    Spec,
    default_data_dir,
    is_spec,
    load,
    parse_spec,
    real_matrices,
)


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
