"""The command line and the bench helpers, on the no-GPU path (the GPU path runs in .ci/gpu-run)."""
import json
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp

import tuner
from tuner import bench, cli, gpu
from tuner.matrix import canonicalize


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(gpu, "available", lambda: False)
    monkeypatch.setattr(gpu, "unavailable_reason", lambda: "test: pretend there is no device")


@pytest.mark.parametrize("args", [["--help"], ["tune", "--help"], ["bench", "--help"], ["spgemm", "--help"],
                                  ["pagerank", "--help"], ["hits", "--help"], ["rwr", "--help"],
                                  ["bench-multigpu", "--help"], ["simrank", "--help"], ["betweenness", "--help"],
                                  ["bench-graph", "--help"], ["bench-stream", "--help"]])
def test_every_command_explains_itself(args):
    proc = subprocess.run([sys.executable, "-m", "tuner", *args], capture_output=True, text=True)
    assert proc.returncode == 0
    assert "usage: python -m tuner" in proc.stdout
    assert ("rmat:SCALE" in proc.stdout) or args == ["--help"]


def test_tune_without_gpu_ranks_compiles_and_says_so(no_gpu, capsys, tmp_path):
    code = cli.main(["tune", "rmat:9", "--cache-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == cli.NO_GPU_EXIT
    assert out.startswith("NO CUDA GPU PRESENT (test: pretend there is no device)")
    ranks = [line for line in out.splitlines() if line.split()[:1] and line.split()[0].isdigit()]
    assert len(ranks) > 10 and "tune=model" in out
    predicted = [float(line.split()[1]) for line in ranks]
    assert predicted == sorted(predicted) and predicted[0] > 0
    summary = out.split("the model's choice for ")[1]
    candidates, kernels = (int(w.strip("(")) for w in summary.split(" ms; ")[1].split()[:3:2])
    assert candidates == len(ranks) and kernels == len(list(tmp_path.glob("cubin/*/*.entry"))) > 5


def test_tune_without_gpu_honours_dtype_profile_and_says_tune_modes_need_one(no_gpu, capsys, tmp_path):
    from .fake_profile import fake_profile_json
    (tmp_path / "fake.json").write_text(fake_profile_json())
    code = cli.main(["tune", "rmat:8", "--dtype", "float64", "--tune", "exhaustive", "--profile",
                     str(tmp_path / "fake.json"), "--cache-dir", str(tmp_path / "c")])
    out = capsys.readouterr().out
    assert code == cli.NO_GPU_EXIT
    assert "(float64, int32 indices, value-free)" in out
    assert "--tune exhaustive times candidates on a GPU: without one, this is the model's ranking" in out
    assert cli.main(["tune", "rmat:8", "--profile", str(tmp_path / "missing.json")]) == 2
    assert f"no GPU profile at {tmp_path / 'missing.json'}" in capsys.readouterr().err


def test_bench_without_gpu_covers_the_whole_suite(no_gpu, capsys, tmp_path):
    mtx = tmp_path / "g.mtx"
    mtx.write_text("%%MatrixMarket matrix coordinate pattern general\n3 3 3\n1 2\n2 3\n3 1\n")
    code = cli.main(["bench", "rmat:8", str(mtx), "--cache-dir", str(tmp_path / "c")])
    out = capsys.readouterr().out
    assert code == cli.NO_GPU_EXIT
    assert "rmat:8" in out and "\ng " in out and "No CUDA GPU present" in out
    assert "The spgemm and spmm suites need a GPU: not run." in out  # --op all: named, not run
    assert cli.main(["bench", "rmat:8", "--op", "spgemm"]) == cli.NO_GPU_EXIT
    assert "The spgemm suite times products on the GPU" in capsys.readouterr().out


def test_bad_matrix_argument_is_a_clear_error(capsys):
    assert cli.main(["tune", "/nonexistent/graph.mtx"]) == 2
    assert "/nonexistent/graph.mtx" in capsys.readouterr().err
    assert cli.main(["tune", "rmat:notanumber"]) == 2


def test_report_from_csv_writes_beside_the_csv_without_a_gpu(no_gpu, tmp_path, capsys):
    from tuner.report import Row, write_csv
    write_csv([Row("rmat:9", 0, "csr_vector", "csr_vector(x)", 0.02, 0.03, 0.02, params="{}")],
              tmp_path / "report.csv")
    assert cli.main(["report", "--from-csv", str(tmp_path / "report.csv")]) == 0
    assert (tmp_path / "report.html").is_file() and (tmp_path / "report.json").is_file()


def test_user_errors_end_in_one_line_naming_the_problem_not_a_traceback(tmp_path, capsys):
    folder = tmp_path / "adir.npz"
    folder.mkdir()
    assert cli.main(["tune", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and str(folder) in err and "Traceback" not in err and err.count("\n") == 1


def test_report_refuses_fewer_than_one_timing_round_or_plan(capsys):
    assert cli.main(["report", "rmat:8", "--rounds", "0"]) == 2
    assert "--rounds must be at least 1, got 0" in capsys.readouterr().err
    assert cli.main(["report", "rmat:8", "--plan-repeats", "0"]) == 2
    assert "--plan-repeats must be at least 1, got 0" in capsys.readouterr().err


def test_compile_without_gpu_names_the_problem(no_gpu, monkeypatch):
    monkeypatch.setattr(gpu, "drv", None)
    gpu.device_info.cache_clear()
    monkeypatch.setattr(gpu, "unavailable_reason", lambda: "test: pretend there is no device")
    try:
        with pytest.raises(tuner.NoDeviceError, match="no CUDA GPU present: test: pretend"):
            tuner.compile(sp.eye(4, format="csr", dtype=np.float32))
    finally:
        gpu.device_info.cache_clear()


def test_prepare_compiles_every_candidate_without_gpu(tmp_path):
    from tuner.cache import Cache
    p = tuner.prepare(sp.random(200, 300, density=0.05, format="csr", random_state=0), cache=Cache(tmp_path))
    assert len(p.binaries) == len(p.specs) >= 10
    assert all(b.cubin[:4] == b"\x7fELF" for b in p.binaries)
    assert p.fingerprint.features["n_cols"] == 300


def test_compulsory_bytes_count_indices_values_pointers_and_vectors():
    m = canonicalize(sp.random(10, 20, density=0.5, format="csr", random_state=1, dtype=np.float64))
    assert bench.compulsory_bytes(m) == m.nnz * (4 + 8) + 11 * 4 + 20 * 8 + 10 * 8


def test_bench_table_shows_speedup_and_floor():
    row = bench.BenchRow(name="g", n_rows=10, n_cols=10, nnz=1234, value_free=True, plan="csr_vector(x)",
                         ours_ms=0.5, ours_kernel_ms=0.4, cusparse_csr_ms=1.0, cusparse_coo_ms=1.2,
                         cusparse_ms=1.0, speedup=2.0, compulsory_bytes=10**9, achieved_gbs=2000.0,
                         floor_fraction=0.5, rel_error=1e-7, load_s=0.1, tune_s=1.0, cache_hit_s=0.1)
    line = bench.format_table([row]).splitlines()[1]
    assert line.split()[:7] == ["g", "1,234", "0.5000", "1.0000", "2.00x", "2000", "50.0%"]


class ScriptedClock:
    """A stand-in for CuPy's events: a call advances a clock by its cost, times three while the host is in
    a slow spell (the calls numbered ``slow`` of all calls made, warm-ups included)."""

    def __init__(self, slow: range):
        self.now, self.calls, self.slow = 0.0, 0, slow
        clock = self

        class Event:
            def record(self):
                self.at = clock.now

            def synchronize(self):
                pass

        self.cuda = type("cuda", (), {"Event": Event, "get_elapsed_time": staticmethod(lambda a, b: b.at - a.at)})

    def call(self, cost: float):
        def run():
            self.now += cost * (3.0 if self.calls in self.slow else 1.0)
            self.calls += 1
        return run


def test_bench_times_ours_and_cusparse_in_turns_so_a_slow_spell_falls_on_both():
    # 20 samples of 10 calls each after 5 warm-ups, per way. A spell of 130 calls from the 31st: in turns
    # it falls on 8 of our samples and 5 of cuSPARSE's; timed one way after the other, on 13 of ours alone.
    spell = range(30, 160)
    fake = ScriptedClock(spell)
    medians = bench._event_medians(fake, {"ours": fake.call(0.010), "cusparse": fake.call(0.020)}, repeats=20)
    assert medians == {"ours": pytest.approx(0.010), "cusparse": pytest.approx(0.020)}
    assert fake.calls == 2 * (5 + 20 * bench.CALLS_PER_SAMPLE)
    fake = ScriptedClock(spell)  # one after the other, the spell makes ours look 3 times as slow
    sequential = {name: bench._event_medians(fake, {name: fake.call(cost)}, repeats=20)[name]
                  for name, cost in (("ours", 0.010), ("cusparse", 0.020))}
    assert sequential == {"ours": pytest.approx(0.030), "cusparse": pytest.approx(0.020)}


def test_default_suite_lists_real_matrices_then_generated(tmp_path):
    (tmp_path / "b.npz").write_bytes(b"")
    (tmp_path / "a.npz").write_bytes(b"")
    suite = bench.default_suite(tmp_path)
    assert [s.rsplit("/", 1)[-1] for s in suite] == ["a.npz", "b.npz", "rmat:20", "rmat:23", "rmat:25"]
    assert bench.large_sources(suite) == ["rmat:23", "rmat:25"]  # 134M and 537M edges drawn


def test_default_suites_scale_real_graphs_beyond_50m_for_bench_and_report(tmp_path):
    for name in ("cnr-2000.npz", "ego-Twitter-undirected.npz", "soc-Slashdot0902.npz", "bcsstk16.npz"):
        (tmp_path / name).write_bytes(b"")
    kron = [s.rsplit("/", 1)[-1] for s in bench.default_suite(tmp_path) if s.startswith("kron:")]
    assert kron == ["cnr-2000.npz:3", "ego-Twitter-undirected.npz:3", "soc-Slashdot0902.npz:4", "cnr-2000.npz:4"]
    report = [s for s in bench.default_suite(tmp_path, report=True) if s.startswith("kron:")]
    assert len(report) == 3


def test_large_sources_are_the_generated_graphs_estimated_at_100m_non_zeros_or_more(tmp_path):
    sp.save_npz(tmp_path / "g.npz", sp.random(100, 100, density=0.1, format="csr", random_state=0))
    g = str(tmp_path / "g.npz")  # 1,000 non-zeros: 3^10 x 1,000 = 59M, 3^11 x 1,000 = 177M
    assert bench.large_sources([g, f"kron:{g}:10", f"kron:{g}:11", "rmat:22", "rmat:22:24"]) == \
        [f"kron:{g}:11", "rmat:22:24"]


def test_bench_resume_keeps_rows_of_the_same_setup_and_refuses_another(tmp_path):
    from tuner import bench
    out = tmp_path / "bench.json"
    out.write_text(json.dumps({"gpu": {"name": "H100"}, "tune": "model", "repeats": 100, "command": "python -m tuner bench",
                               "rows": [{"name": "rmat:20", "nnz": 5}]}))
    rows, command = bench.resumed_rows(out, "H100", "model", 100)
    assert rows == {"rmat:20": {"name": "rmat:20", "nnz": 5}} and command == "python -m tuner bench"
    with pytest.raises(ValueError, match="cannot resume .* measured with"):
        bench.resumed_rows(out, "H100", "exhaustive", 100)


def test_report_repredict_rewrites_predictions_from_a_csv_without_gpu(tmp_path, capsys):
    from tuner.report import Row, read_csv, write_csv
    from .fake_profile import fake_profile_json
    (tmp_path / "profile.json").write_text(fake_profile_json())
    params = {"threads_per_row": 4, "block_size": 128, "order": "none"}
    rows = [Row("rmat:9", 0, "csr_vector", "csr_vector(x)", 99.0, 1.0, 0.02, params=json.dumps(params)),
            Row("rmat:9", 0, "csr_vector", "csr_vector(y)", 99.0, 1.0, 0.03,
                params=json.dumps({**params, "threads_per_row": 32}))]
    write_csv(rows, tmp_path / "report.csv")
    measured = {"gpu": "H100", "created": "2026-11-22T03:37:41Z", "command": "python -m tuner report rmat:9",
                "matrices": {"rmat:9": {"nnz": 5}}, "profile_digest": "old", "overall": {}}
    (tmp_path / "report.json").write_text(json.dumps(measured))
    out = tmp_path / "again"
    assert cli.main(["report", "rmat:9", "--from-csv", str(tmp_path / "report.csv"), "--repredict",
                     "--out", str(out)]) == 0  # the profile beside the CSV is the default
    again = read_csv(out / "report.csv")
    assert [r.measured_ms for r in again] == [0.02, 0.03] and all(0 < r.predicted_ms < 1 for r in again)
    assert "lookup" in capsys.readouterr().out
    # The measured run's record stays; the command and the profile are now also the repredicting ones.
    meta = json.loads((out / "report.json").read_text())
    assert meta["gpu"] == "H100" and meta["created"] == measured["created"] and meta["matrices"]["rmat:9"]["nnz"] == 5
    # Planning is timed again with the current model, here.
    assert meta["matrices"]["rmat:9"]["planning_seconds"] > 0 and meta["planning_host"]["cpus"] >= 1
    assert meta["command"].startswith("python -m tuner report rmat:9 ; then python -m tuner report rmat:9 --from-csv")
    assert meta["profile_digest"] not in ("old", None) and meta["overall"]["lookup"]["mdape"] > 0


def test_spgemm_without_gpu_gives_the_model_choice_and_refuses_mismatched_shapes(no_gpu, capsys):
    assert cli.main(["spgemm", "rmat:9", "--transpose"]) == cli.NO_GPU_EXIT
    out = capsys.readouterr().out
    assert "the model's choice for NVIDIA H100 80GB HBM3" in out and "products, nnz(C)" in out
    assert out.count("ms predicted") == 2 and "No CUDA GPU present" in out
    assert cli.main(["spgemm", "rmat:10", "rmat:9"]) == 2
    assert "A has 1024 columns but B has 512 rows" in capsys.readouterr().err


@pytest.mark.gpu
def test_spgemm_on_the_gpu_writes_c_and_explains_the_family(capsys, tmp_path):
    import scipy.sparse as sp
    from tuner import loaders
    assert cli.main(["spgemm", "rmat:10", "--transpose", "--out", str(tmp_path / "c.npz")]) == 0
    out = capsys.readouterr().out
    assert "ms predicted" in out and "entries; compile" in out
    A = loaders.load("rmat:10").astype(np.float64)
    C = sp.load_npz(tmp_path / "c.npz")
    assert abs(C - A @ A.T).max() == 0  # pattern operands: entries count paths exactly


def test_pagerank_without_gpu_iterates_on_the_host_and_writes_every_rank(no_gpu, capsys, tmp_path):
    import tuner
    out = tmp_path / "pr.npy"
    assert cli.main(["pagerank", "rmat:9", "--top", "3", "--tol-rule", "per_node", "--out", str(out)]) == 0
    printed = capsys.readouterr()
    assert "iterating on the host with SciPy" in printed.err and "per_node rule" in printed.out
    x = np.load(out)
    assert np.array_equal(x, tuner.pagerank(tuner.load("rmat:9"), tol_rule="per_node", backend="scipy"))
    best = int(np.argmax(x))
    assert f"    1 {best:>12} " in printed.out
    assert cli.main(["pagerank", "rmat:9", "--backend", "tuned"]) == cli.NO_GPU_EXIT
    assert cli.main(["pagerank", "rmat:9", "--backend", "device"]) == cli.NO_GPU_EXIT
    assert "--backend device multiplies on a GPU" in capsys.readouterr().out
    assert cli.main(["pagerank", "rmat:9", "--gpus", "2"]) == cli.NO_GPU_EXIT
    assert "--gpus starts one rank per GPU" in capsys.readouterr().out


def test_simrank_and_betweenness_commands_print_the_top_and_write_every_value(no_gpu, capsys, tmp_path):
    import tuner
    A = tuner.load("rmat:8")
    assert cli.main(["simrank", "rmat:8", "--top", "2", "--threshold", "0.01", "--out", str(tmp_path / "s.npz")]) == 0
    out = capsys.readouterr().out
    S = sp.load_npz(tmp_path / "s.npz")
    assert abs(S - tuner.simrank(A, threshold=0.01)).max() == 0 and "    1 " in out and "iterations" in out
    assert cli.main(["simrank", "rmat:8", "--backend", "tuned"]) == cli.NO_GPU_EXIT
    assert cli.main(["betweenness", "rmat:8", "--k", "50", "--seed", "2", "--backend", "scipy",
                     "--out", str(tmp_path / "b.npy")]) == 0
    assert np.array_equal(np.load(tmp_path / "b.npy"), tuner.betweenness(A, k=50, seed=2, backend="scipy"))
    assert "from 50 sources" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["bench-multigpu", "bench-graph", "bench-stream"])
def test_gpu_benches_without_gpu_say_so(no_gpu, capsys, command):
    assert cli.main([command, "rmat:9@1M" if command == "bench-stream" else "rmat:9"]) == cli.NO_GPU_EXIT
    assert "NO CUDA GPU PRESENT" in capsys.readouterr().out


def test_bench_stream_refuses_a_graph_without_a_budget(no_gpu, capsys):
    assert cli.main(["bench-stream", "rmat:9"]) == 2
    assert "GRAPH@BUDGET" in capsys.readouterr().err


@pytest.mark.gpu
def test_pagerank_on_gpus_spawned_as_mpi_ranks_writes_what_one_gpu_computes(capfd, tmp_path):
    import importlib.util
    import shutil
    if shutil.which("mpiexec") is None or importlib.util.find_spec("mpi4py") is None:
        pytest.skip("no MPI runtime or mpi4py")
    out = tmp_path / "pr.npy"
    assert cli.main(["pagerank", "rmat:10", "--gpus", "1", "--tol-rule", "per_node", "--tol", "1e-12",
                     "--out", str(out)]) == 0
    # --tune none, the default: one rank on one GPU runs every iteration in the resident kernel's one launch
    assert "resident generic kernel on 1 GPU" in capfd.readouterr().out
    expected = tuner.pagerank(tuner.load("rmat:10"), tol_rule="per_node", tol=1e-12, backend="scipy")
    assert np.abs(np.load(out) - expected).max() <= 1e-13


def test_hits_without_gpu_multiplies_on_the_host_and_writes_both_scores(no_gpu, capsys, tmp_path):
    import tuner
    out = tmp_path / "hits.npy"
    assert cli.main(["hits", "rmat:9", "--top", "2", "--out", str(out)]) == 0
    assert "multiplying on the host with SciPy" in capsys.readouterr().err
    h, a = tuner.hits(tuner.load("rmat:9"), backend="scipy")
    both = np.load(out)
    assert np.allclose(both[:, 0], h, rtol=1e-9) and np.allclose(both[:, 1], a, rtol=1e-9)
    assert cli.main(["hits", "rmat:9", "--gpus", "2"]) == cli.NO_GPU_EXIT
    assert "--gpus starts one rank per GPU" in capsys.readouterr().out


def test_rwr_command_takes_seed_nodes_and_refuses_others(no_gpu, capsys, tmp_path):
    import tuner
    out = tmp_path / "rwr.csv"
    assert cli.main(["rwr", "rmat:9", "--seeds", "3,40", "--out", str(out)]) == 0
    table = np.loadtxt(out, delimiter=",", skiprows=1)
    assert np.array_equal(table[:, 1], tuner.rwr(tuner.load("rmat:9"), [3, 40], backend="scipy"))
    assert cli.main(["rwr", "rmat:9", "--seeds", "x"]) == 2
    assert "--seeds takes node numbers" in capsys.readouterr().err


def test_rwr_command_walks_each_seed_set_given_into_a_column_of_its_own(no_gpu, capsys, tmp_path):
    import tuner
    out = tmp_path / "rwr.csv"
    assert cli.main(["rwr", "rmat:9", "--seeds", "3,40", "--seeds", "7", "--out", str(out), "--top", "3"]) == 0
    printed = capsys.readouterr().out
    assert "from 2 seed sets" in printed and "set 1" in printed and "set 2" in printed
    table = np.loadtxt(out, delimiter=",", skiprows=1)
    assert table.shape == (512, 3) and out.read_text().splitlines()[0] == "node,set 1,set 2"
    both = tuner.rwr(tuner.load("rmat:9"), [[3, 40], [7]], backend="scipy")
    assert np.array_equal(table[:, 1:], both)
    assert cli.main(["rwr", "rmat:8", "--seeds", "1", "--seeds", "2", "--sharded"]) == 2
    assert "--sharded walks one seed set" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["pagerank", "rmat:8"], ["rwr", "rmat:8", "--seeds", "1"]])
def test_a_sharded_walk_without_several_ranks_is_a_clear_error(capsys, command):
    assert cli.main(command + ["--sharded"]) == 2
    assert "--sharded splits the graph among several GPUs: give --gpus N" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["pagerank", "rmat:8"], ["simrank", "rmat:8"], ["spgemm", "rmat:8"]])
def test_an_out_file_in_a_missing_folder_is_refused_before_the_run(command, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(command + ["--out", str(tmp_path / "missing" / "x.npy")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"the folder {tmp_path / 'missing'} does not exist" in err and "Traceback" not in err
    with pytest.raises(SystemExit):
        cli.main(command + ["--out", str(tmp_path)])
    assert "is a folder, not a file to write" in capsys.readouterr().err
