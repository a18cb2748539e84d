"""Several ranks: the bitonic row partition's balance and the distributed SpMV over an in-process group of
ranks (each rank multiplying its rows with SciPy: the GPU path needs the MPI + NCCL communicator)."""
import numpy as np
import pytest
import scipy.sparse as sp

from tuner.distributed import DistributedSpMV, LocalGroup, bitonic_partition
from tuner.matrix import MatrixError

from .conftest import fixture_matrices, power_law

FIXTURES = fixture_matrices()


@pytest.mark.parametrize("parts", [1, 2, 3, 4, 7])
def test_bitonic_partition_balances_rows_and_non_zeros(parts):
    A = power_law(5000, seed=51)
    lengths = np.diff(A.indptr)
    p = bitonic_partition(lengths, parts)
    assert np.array_equal(np.sort(p.order), np.arange(5000))  # every row once
    sizes = [r.size for r in p.rows]
    assert max(sizes) - min(sizes) <= 1
    assert np.array_equal(p.weight, [lengths[r].sum() for r in p.rows])
    # each round moves the heaviest rank of the last round to its lightest row: the spread stays within the
    # heaviest row
    assert p.weight.max() - p.weight.min() <= lengths.max()
    assert all(np.all(np.diff(r) > 0) for r in p.rows)
    assert np.array_equal(p.position()[p.order], np.arange(5000))


def test_a_one_rank_partition_made_from_the_counts_equals_bitonics_one_part():
    from tuner.distributed.partition import whole_partition
    lengths = np.diff(power_law(2000, seed=53).indptr)
    made, dealt = whole_partition(2000, float(lengths.sum())), bitonic_partition(lengths, 1)
    assert made.parts == dealt.parts == 1 and np.array_equal(made.owner, dealt.owner)
    assert np.array_equal(made.rows[0], dealt.rows[0]) and np.array_equal(made.weight, dealt.weight)


class _Relabelled:
    """A product in a plan order of its own, as a relabelled compile's :class:`~tuner.kernel.SpMV` shows it."""

    def __init__(self, M, order, rank):
        self.M, self.col_order, self.row_rank = M, order, rank

    def __call__(self, v):
        return self.M @ v

    def in_plan_order(self):
        return lambda v: self.M[self.col_order][:, self.col_order] @ v


@pytest.mark.parametrize("given_partition", [False, True])
def test_plan_order_here_names_the_plans_node_order_and_refuses_rows_and_columns_ordered_apart(given_partition):
    from tuner.distributed.partition import whole_partition
    A = power_law(300, seed=55)
    order = np.random.default_rng(56).permutation(300)
    rank = np.empty(300, np.int64)
    rank[order] = np.arange(300)
    partition = whole_partition(300, float(A.nnz)) if given_partition else None

    def found(rank_of_rows):
        def rank_call(comm):
            return DistributedSpMV(A, comm, partition=partition,
                                   local_compile=lambda M: _Relabelled(M, order, rank_of_rows)).plan_order_here()
        return LocalGroup(1).run(rank_call)[0]
    nodes, inner = found(rank)
    assert np.array_equal(nodes, order)  # the plan's i-th node is A's node order[i]
    x = np.random.default_rng(57).random(300)
    assert np.allclose(inner(x[nodes])[rank], A @ x)  # y back in A's order through the rank
    assert found(np.roll(rank, 1)) is None  # rows relabelled unlike the columns: no one order to iterate in


def test_bitonic_partition_orders_each_ranks_slots_by_decreasing_key_without_moving_rows_between_ranks():
    A = power_law(3000, seed=57)
    lengths = np.diff(A.indptr)
    key = lengths + np.bincount(A.indices, minlength=3000)
    plain, keyed = bitonic_partition(lengths, 4), bitonic_partition(lengths, 4, order_by=key)
    assert np.array_equal(plain.owner, keyed.owner) and np.array_equal(plain.weight, keyed.weight)
    for asc, by_key in zip(plain.rows, keyed.rows):
        assert np.array_equal(np.sort(by_key), asc)
        assert np.all(np.diff(key[by_key]) <= 0)  # hottest first
        ties = np.diff(key[by_key]) == 0
        assert np.all(np.diff(by_key)[ties] > 0)  # ties by row index
    for i, rows in enumerate(keyed.rows):  # a rank's slots follow its rows' order
        assert np.array_equal(keyed.slots()[rows], i * keyed.width + np.arange(rows.size))
    with pytest.raises(ValueError, match="order_by must be one per row"):
        bitonic_partition(lengths, 4, order_by=key[:-1])


def test_bitonic_partition_refuses_bad_weights_and_counts():
    with pytest.raises(ValueError, match="positive integer"):
        bitonic_partition(np.ones(4), 0)
    with pytest.raises(ValueError, match="finite and non-negative"):
        bitonic_partition(np.array([1.0, np.nan]), 2)
    with pytest.raises(ValueError, match="1-D"):
        bitonic_partition(np.ones((2, 2)), 2)


def scipy_kernel(M):
    return lambda x: M.astype(np.float64) @ x


def with_dense_row_and_empty_rows():
    A = power_law(600, seed=53).tolil()
    A[7, :] = 1.0  # one dense row
    A[100:140, :] = 0.0  # empty rows
    return A.tocsr()


@pytest.mark.parametrize("name", ["power_law", "pattern", "float64", "tiny", "dense_and_empty"])
@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_distributed_spmv_equals_scipy_in_the_callers_order(name, ranks):
    A = with_dense_row_and_empty_rows() if name == "dense_and_empty" else FIXTURES[name]
    x = np.random.default_rng(ranks).uniform(-1, 1, A.shape[1])

    def rank(comm):
        spmv = DistributedSpMV(A, comm, local_compile=scipy_kernel)
        y_local = spmv(spmv.scatter(x))
        assert y_local.shape == (spmv.rows.size,)
        return spmv.gather(y_local)

    results = LocalGroup(ranks).run(rank)
    expected = A.astype(np.float64) @ x
    for y in results:  # every rank ends with the whole y
        assert np.allclose(y, expected, rtol=1e-12, atol=1e-12)


def test_distributed_spmv_refuses_a_non_square_matrix_and_a_wrong_partition():
    A = sp.random(30, 20, density=0.2, format="csr", random_state=1)
    with pytest.raises(MatrixError, match="must be square"):
        LocalGroup(2).run(lambda comm: DistributedSpMV(A, comm, local_compile=scipy_kernel))
    B = power_law(100, seed=52)
    with pytest.raises(ValueError, match="3 parts of 100 rows; the communicator 2 ranks"):
        LocalGroup(2).run(lambda comm: DistributedSpMV(B, comm, partition=bitonic_partition(np.ones(100), 3),
                                                       local_compile=scipy_kernel))


def test_an_error_on_one_rank_reaches_the_caller_without_hanging_the_others():
    def rank(comm):
        if comm.rank == 1:
            raise RuntimeError("rank 1 failed")
        comm.allgather(np.zeros(1))  # would wait for rank 1 forever without the abort
    with pytest.raises(RuntimeError, match="rank 1 failed"):
        LocalGroup(3).run(rank)
    assert LocalGroup(4).run(lambda comm: comm.allreduce_sum(comm.rank + 1)) == [10.0] * 4


MPI_RANK_SCRIPT = """
import numpy as np
from tests.conftest import power_law
from tuner.distributed import DistributedSpMV, MpiComm
A = power_law(2000, seed=54)
x = np.random.default_rng(0).uniform(-1, 1, 2000)
comm = MpiComm()
spmv = DistributedSpMV(A, comm, local_compile=lambda M: (lambda v: M.astype(np.float64) @ v))
y = spmv.gather(spmv(spmv.scatter(x)))
err = float(np.abs(y - A.astype(np.float64) @ x).max())
total = comm.allreduce_sum(spmv.rows.size)
each = comm.allgather(np.array([spmv.rows.size, err]))
if comm.rank == 0:
    print("ranks", comm.size, "rows", [int(e[0]) for e in each], "all", int(total), "error", max(e[1] for e in each))
"""


def run_as_mpi_ranks(script: str, ranks: int, timeout: int, args: list | None = None) -> str:
    """The line starting 'ranks' that ``script`` prints when run as ``ranks`` MPI processes from the checkout
    (skips where mpi4py or an MPI runtime is missing)."""
    import pathlib
    import shutil
    import subprocess
    import sys
    pytest.importorskip("mpi4py")
    mpiexec = shutil.which("mpiexec") or shutil.which("mpirun")
    if mpiexec is None:
        pytest.skip("no mpiexec: MPI runtime not installed")
    import os
    root = pathlib.Path(__file__).resolve().parents[1]
    # Open MPI refuses to start as root (the GPU machine's user) unless told twice; MPICH ignores these.
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    done = subprocess.run([mpiexec, "-n", str(ranks), sys.executable, "-c", script, *(args or [])], capture_output=True,
                          text=True, cwd=root, timeout=timeout, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return next(line for line in done.stdout.splitlines() if line.startswith("ranks"))


def ranks_errors(script: str, ranks: int, timeout: int, args: list | None = None) -> tuple[float, float]:
    """The two figures of the line 'ranks N errors A B' that ``script`` prints as ``ranks`` MPI processes
    (``args``: the script's command-line arguments)."""
    line = run_as_mpi_ranks(script, ranks, timeout, args)
    assert line.startswith(f"ranks {ranks} errors "), line
    first, second = (float(v) for v in line.split()[-2:])
    return first, second


def test_distributed_spmv_runs_as_mpi_ranks():
    line = run_as_mpi_ranks(MPI_RANK_SCRIPT, 3, 300)
    assert line.startswith("ranks 3 rows [667, 667, 666] all 2000 error ") and float(line.split()[-1]) <= 1e-10


MPI_HITS_SCRIPT = """
import numpy as np
from tests.conftest import power_law
from tuner.distributed import MpiComm
from tuner.graph import hits
A = abs(power_law(3000, seed=67))
comm = MpiComm()
(h, a), info = hits(A, backend="scipy", comm=comm, return_info=True)
h1, a1 = hits(A, backend="scipy", nstart=np.ones(A.shape[0]))
diffs = comm.allgather(np.array([np.abs(h - h1).max(), np.abs(a - a1).max(), info.iterations]))
if comm.rank == 0:
    print("ranks", comm.size, "products", int(diffs[0][2]), "same", all(int(d[2]) == int(diffs[0][2]) for d in diffs),
          "diff", max(max(d[0], d[1]) for d in diffs), "top", int(np.argmax(a)))
"""


def test_hits_splits_both_products_among_mpi_ranks_and_equals_one_process():
    line = run_as_mpi_ranks(MPI_HITS_SCRIPT, 3, 300)
    words = line.split()
    assert words[:2] == ["ranks", "3"] and int(words[3]) > 2 and words[5] == "True"
    assert float(words[7]) <= 1e-12


def scipy_product(M, B):
    return lambda: (M.astype(np.float64) @ B.astype(np.float64)).tocsr()


@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_distributed_spgemm_gathers_c_in_the_callers_row_order(ranks):
    from tuner.distributed import DistributedSpGEMM
    A = with_dense_row_and_empty_rows()
    for B in (A, A.T.tocsr(), power_law(600, 90, seed=55)):
        def rank(comm):
            f = DistributedSpGEMM(A, B, comm, local_compile=scipy_product)
            part = f()
            assert part.shape == (f.rows.size, B.shape[1])
            return f.gather(part)
        expected = (A.astype(np.float64) @ B.astype(np.float64)).tocsr()
        for C in LocalGroup(ranks).run(rank):
            assert C.shape == expected.shape and abs(C - expected).max() <= 1e-12 * abs(expected).max()
            assert np.array_equal(np.diff(C.indptr), np.diff(expected.indptr))


def test_distributed_spgemm_balances_products_not_rows():
    from tuner.distributed import DistributedSpGEMM
    from tuner.formats.row_bins import row_products
    A = power_law(3000, seed=56)
    f = LocalGroup(4).run(lambda comm: DistributedSpGEMM(A, A, comm, local_compile=scipy_product).partition)[0]
    products = row_products(A.indptr, A.indices, A.indptr)
    assert np.array_equal(f.weight, [products[r].sum() for r in f.rows])
    assert f.weight.max() - f.weight.min() <= products.max()
    with pytest.raises(MatrixError, match="A has 3000 columns but B has 20 rows"):
        LocalGroup(2).run(lambda comm: DistributedSpGEMM(A, sp.eye(20, format="csr"), comm,
                                                         local_compile=scipy_product))


MPI_GPU_SCRIPT = """
import numpy as np
from tests.conftest import power_law
from tuner.distributed import DistributedSpGEMM, DistributedSpMV, MpiComm
A = power_law(3000, seed=57)
x = np.random.default_rng(1).uniform(-1, 1, 3000).astype(np.float32)
comm = MpiComm()
spmv = DistributedSpMV(A, comm)  # each rank's rows through the tuned SpMV on the GPU (float32, as A)
y = spmv.gather(spmv(spmv.scatter(x)))
ref = A.astype(np.float64) @ x
f = DistributedSpGEMM(A, A.T.tocsr(), comm)  # and through the tuned SpGEMM
C = f.gather(f())
E = (A.astype(np.float64) @ A.T.astype(np.float64)).tocsr()
errs = comm.allgather(np.array([np.abs(y - ref).max() / np.abs(ref).max(), abs(C - E).max() / abs(E).max()]))
if comm.rank == 0:
    print("ranks", comm.size, "errors", max(e[0] for e in errs), max(e[1] for e in errs))
"""


@pytest.mark.gpu
def test_two_mpi_ranks_on_one_gpu_multiply_with_the_tuned_kernels():
    spmv_err, spgemm_err = ranks_errors(MPI_GPU_SCRIPT, 2, 600)
    assert spmv_err <= 1e-5 and spgemm_err <= 1e-5


RELAY = """
import numpy as np
import cupy
class Relay:  # device collectives through the host, so that two ranks can share one GPU (NCCL refuses)
    def __init__(self, host):
        self.host, self.rank, self.size = host, host.rank, host.size
    def allgather(self, part):
        return self.host.allgather(part)
    def allreduce_sum(self, value):
        return self.host.allreduce_sum(value)
    def bcast_array(self, array):
        return self.host.bcast_array(array)
    def allgather_into(self, part, out, stream=0):
        cupy.cuda.Device().synchronize()
        out.set(np.concatenate(self.host.allgather(part.get())))

"""

MPI_TILES_SCRIPT = RELAY + """
from tests.conftest import power_law
from tuner.distributed import DistributedSpMV, MpiComm
from tuner.distributed.nccl import SoloDevice
from tuner.distributed.pagerank import pagerank_on_devices

A = abs(power_law(60000, seed=64)).T.tocsr()  # hub columns, wider than an L1 tile: two chunks
comm = Relay(MpiComm())
x = np.random.default_rng(6).uniform(0.5, 1.5, A.shape[0]).astype(np.float32)
ref = A.astype(np.float64) @ x
errs = []
for overlap in (True, False):
    spmv = DistributedSpMV(A, comm, rank_kernel="tiles", overlap=overlap)
    assert (spmv.kernel_kind, len(spmv._tiles.tiles.chunks.cuts)) == ("tiled", 3), spmv._tiles.tiles.chunks
    y = cupy.full(spmv.rows.size, np.nan, np.float32)
    y = spmv.gather(spmv(cupy.asarray(spmv.scatter(x)), out=y))
    errs.append(np.abs(y - ref).max() / np.abs(ref).max())
pr = pagerank_on_devices(A, comm, dtype=np.float64, tol=1e-12, tol_rule="per_node", rank_kernel="tiles")
one = pagerank_on_devices(A, SoloDevice(), dtype=np.float64, tol=1e-12, tol_rule="per_node")
each = comm.allgather(np.array([max(errs), np.abs(pr - one).max()]))
if comm.rank == 0:
    print("ranks", comm.size, "errors", max(e[0] for e in each), max(e[1] for e in each))
"""


@pytest.mark.gpu
def test_two_ranks_multiply_in_the_one_gpu_plans_tiles_from_the_chunked_gather():
    spmv_err, pagerank_diff = ranks_errors(MPI_TILES_SCRIPT, 2, 600)
    assert spmv_err <= 1e-6 and pagerank_diff <= 1e-13


MPI_DEVICE_SETUP_SCRIPT = RELAY + """
from tuner import loaders
from tuner.distributed import MpiComm, bitonic_partition
from tuner.distributed.nccl import SoloDevice
from tuner.distributed.pagerank import pagerank_on_devices, pull_product
from tuner.graph.pagerank import edge_weights
A = loaders.load("rmat:17")  # above the size the device builds pay for
comm = Relay(MpiComm())
spmv = pull_product(A, comm, rank_kernel="tiles")  # Wᵀ, partition sorts and the rank's rows on the GPU
assert spmv.pull_factors is not None and spmv.kernel_kind == "tiled", (spmv.pull_factors, spmv.kernel_kind)
Wt = edge_weights(A).T.tocsr()
lengths = np.diff(Wt.indptr)
key = lengths + np.bincount(Wt.indices, minlength=A.shape[0])
key += (key.max() + 1) * (np.bincount(Wt.indices, minlength=A.shape[0]) > 0)
host = bitonic_partition(lengths, comm.size, order_by=key)
same = all(np.array_equal(a, b) for a, b in zip(host.rows, spmv.partition.rows))
x = np.random.default_rng(8).uniform(0.5, 1.5, A.shape[0]).astype(np.float32)
ref = Wt.astype(np.float64) @ x
y = spmv.gather(spmv(cupy.asarray(spmv.scatter(x))))
pr = pagerank_on_devices(A, comm, tol=1e-9, tol_rule="per_node", product=spmv)
one = pagerank_on_devices(A, SoloDevice(), tol=1e-9, tol_rule="per_node")
each = comm.allgather(np.array([np.abs(y - ref).max() / np.abs(ref).max(), np.abs(pr - one).max() / one.max()]))
if comm.rank == 0:
    print("ranks", comm.size, "errors", max(e[0] for e in each) + (0 if same else 1), max(e[1] for e in each))
"""


@pytest.mark.gpu
def test_ranks_build_their_rows_on_the_device_and_match_scipy_and_one_gpu():
    spmv_err, pagerank_diff = ranks_errors(MPI_DEVICE_SETUP_SCRIPT, 2, 600)
    assert spmv_err <= 1e-6 and pagerank_diff <= 1e-5


MPI_SHARD_SCRIPT = RELAY + """
import sys
from tuner import loaders
from tuner.distributed import MpiComm
from tuner.distributed.generated import generated_product
from tuner.distributed.nccl import SoloDevice
from tuner.distributed.pagerank import pagerank_on_devices
from tuner.distributed.shard import sharded_product
from tuner.graph.pagerank import edge_weights
comm = Relay(MpiComm())
source, how = sys.argv[1], sys.argv[2]
if how == "generated":  # no rank builds the graph: each generates its rows on the GPU
    spmv = generated_product(source, comm)
else:  # only rank 0 holds the graph; its rows reach the ranks in pieces of 100,000 entries
    spmv = sharded_product(loaders.load(source) if comm.rank == 0 else None, comm, piece_entries=100_000)
assert spmv.kernel_kind == "tiled" and spmv.pull_factors is not None, (spmv.kernel_kind, spmv.pull_factors)
assert set(spmv.setup_seconds) == {"facts", "partition", "rows", "plan", "layout"}, spmv.setup_seconds
A = loaders.load(source)  # the references
x = np.random.default_rng(9).uniform(0.5, 1.5, A.shape[0]).astype(np.float32)
ref = edge_weights(A).T.tocsr().astype(np.float64) @ x
y = spmv.gather(spmv(cupy.asarray(spmv.scatter(x))))
pr = pagerank_on_devices(None, comm, tol=1e-9, tol_rule="per_node", product=spmv)
one = pagerank_on_devices(A, SoloDevice(), tol=1e-9, tol_rule="per_node")
each = comm.allgather(np.array([np.abs(y - ref).max() / np.abs(ref).max(), np.abs(pr - one).max() / one.max()]))
if comm.rank == 0:
    print("ranks", comm.size, "errors", max(e[0] for e in each), max(e[1] for e in each))
"""


@pytest.mark.gpu
def test_ranks_given_only_their_rows_of_a_graph_rank_0_holds_match_scipy_and_one_gpu():
    spmv_err, pagerank_diff = ranks_errors(MPI_SHARD_SCRIPT, 2, 600, args=["rmat:17", "sent"])
    assert spmv_err <= 1e-6 and pagerank_diff <= 1e-5


@pytest.mark.gpu
def test_ranks_generating_their_own_rows_of_a_kronecker_graph_match_scipy_and_one_gpu(tmp_path):
    G = tmp_path / "g.npz"
    sp.save_npz(G, abs(power_law(20000, seed=79)).tocsr())  # 3 seed factors: 160,000 nodes
    spmv_err, pagerank_diff = ranks_errors(MPI_SHARD_SCRIPT, 2, 600, args=[f"kron:{G}:3", "generated"])
    assert spmv_err <= 1e-6 and pagerank_diff <= 1e-5


MPI_GPU_HITS_SCRIPT = RELAY + """
from tests.conftest import power_law
from tuner.distributed import MpiComm
from tuner.graph import hits
A = abs(power_law(20000, seed=68))
comm = Relay(MpiComm())
h, a = hits(A, comm=comm)  # each rank's rows of A and of Aᵀ through its tuned kernel on the GPU
h1, a1 = hits(A, backend="scipy", nstart=np.ones(A.shape[0]))
each = comm.allgather(np.array([max(np.abs(h - h1).max(), np.abs(a - a1).max())]))
if comm.rank == 0:
    print("ranks", comm.size, "diff", max(e[0] for e in each))
"""


@pytest.mark.gpu
def test_hits_across_two_ranks_on_the_gpu_equals_scipy():
    line = run_as_mpi_ranks(MPI_GPU_HITS_SCRIPT, 2, 600)
    assert line.startswith("ranks 2 diff") and float(line.split()[-1]) <= 1e-9


def test_partition_slots_pad_every_part_to_the_longest():
    p = bitonic_partition(np.array([4, 1, 9, 3, 7]), 2)  # rank 0: rows 2, 3, 4... as dealt; width 3
    slots = p.slots()
    assert p.width == max(r.size for r in p.rows) == 3
    for r, rows in enumerate(p.rows):
        assert slots[rows].tolist() == list(range(r * 3, r * 3 + rows.size))
    assert np.unique(slots).size == 5 and slots.max() < p.parts * p.width


def test_one_rank_multiplies_the_matrix_itself_without_relabelling_a_copy():
    from tuner.distributed.spmv import local_rows
    A = power_law(500, seed=33).tocsr()
    A.sort_indices()
    p = bitonic_partition(np.diff(A.indptr), 1)
    mine = local_rows(A, p, 0)
    assert np.shares_memory(mine.indices, A.indices) and mine.shape == A.shape and (mine != A).nnz == 0
    assert np.array_equal(p.slots(), np.arange(500)) and np.array_equal(p.rows[0], np.arange(500))


def test_padded_host_gather_puts_each_rank_slice_at_its_slots():
    A = with_dense_row_and_empty_rows()
    x = np.random.default_rng(4).uniform(-1, 1, A.shape[0])

    def rank(comm):
        spmv = DistributedSpMV(A, comm, local_compile=lambda M: M.dot)
        gathered = spmv.gather_x(spmv.scatter(x))
        assert gathered.size == comm.size * spmv.partition.width
        assert np.array_equal(gathered[spmv.partition.slots()], x)
        with pytest.raises(MatrixError, match="x_local must have this rank's"):
            spmv.padded(np.zeros(spmv.rows.size + 1))
        return spmv.gather(spmv(spmv.scatter(x)))
    for y in LocalGroup(3).run(rank):
        assert np.abs(y - A.astype(np.float64) @ x).max() <= 1e-5 * np.abs(A).max() * A.shape[0]


def test_without_option_drops_the_option_and_its_value_in_either_spelling():
    from tuner.distributed.launch import without_option
    assert without_option(["pagerank", "g", "--gpus", "4", "--top", "3"], "--gpus") == ["pagerank", "g", "--top", "3"]
    assert without_option(["pagerank", "g", "--gpus=2"], "--gpus") == ["pagerank", "g"]
    assert without_option(["pagerank", "g", "--gpusx"], "--gpus") == ["pagerank", "g", "--gpusx"]


def test_spawning_more_ranks_than_gpus_is_refused_before_starting_any(monkeypatch):
    from tuner.distributed import launch
    monkeypatch.setattr(launch.gpu, "device_count", lambda: 2)
    with pytest.raises(ValueError, match=r"--gpus 3 asks for more GPUs than this machine has \(2\)"):
        launch.spawn(3, ["pagerank", "g"])
    with pytest.raises(ValueError, match="--gpus must be at least 1"):
        launch.spawn(0, ["pagerank", "g"])
    monkeypatch.setattr(launch.shutil, "which", lambda name: None)
    with pytest.raises(OSError, match="mpiexec, which is not on PATH"):
        launch.spawn(2, ["pagerank", "g"])


@pytest.mark.gpu
def test_nccl_group_of_one_gathers_reduces_and_iterates_like_the_solo_device():
    cupy = pytest.importorskip("cupy")
    from tuner.distributed.nccl import NcclComm, SoloDevice
    from tuner.distributed.pagerank import pagerank_on_devices
    A = abs(power_law(3000, seed=58))

    def rank(host):
        comm = NcclComm(host)
        out = cupy.full(4, -1.0)
        comm.allgather_into(cupy.arange(4.0), out)
        buf = cupy.array([2.0, -3.0])
        comm.allreduce_into(buf, "max")
        x = pagerank_on_devices(A, comm, dtype=np.float64, tol=1e-12, tol_rule="per_node")
        comm.close()
        return out.tolist(), buf.tolist(), x
    gathered, reduced, x = LocalGroup(1).run(rank)[0]
    assert gathered == [0.0, 1.0, 2.0, 3.0] and reduced == [2.0, -3.0]
    solo = pagerank_on_devices(A, SoloDevice(), dtype=np.float64, tol=1e-12, tol_rule="per_node")
    assert np.array_equal(x, solo)


MPI_GPUS_SCRIPT = """
import numpy as np
from tests.conftest import power_law
from tuner.distributed.launch import rank_comm
from tuner.distributed.nccl import SoloDevice
from tuner.distributed.pagerank import pagerank_on_devices
from tuner.distributed import DistributedSpMV
import cupy
A = abs(power_law(20000, seed=59)).astype(np.float64)
comm = rank_comm()
x = np.random.default_rng(2).uniform(-1, 1, A.shape[0])
spmv = DistributedSpMV(A, comm)
y = spmv.gather(spmv(cupy.asarray(spmv.scatter(x))))
pr = pagerank_on_devices(A, comm, dtype=np.float64, tol=1e-12, tol_rule="per_node")
ref = A @ x
errs = comm.allgather(np.array([np.abs(y - ref).max() / np.abs(ref).max()]))
if comm.rank == 0:
    one = pagerank_on_devices(A, SoloDevice(comm.device), dtype=np.float64, tol=1e-12, tol_rule="per_node")
    print("ranks", comm.size, "errors", max(e[0] for e in errs), np.abs(pr - one).max())
comm.close()
"""


@pytest.mark.gpu
def test_spmv_and_pagerank_across_every_gpu_equal_one_gpu():
    from tuner import gpu
    if gpu.device_count() < 2:
        pytest.skip("one GPU: NCCL puts one rank on each GPU")
    spmv_err, pagerank_diff = ranks_errors(MPI_GPUS_SCRIPT, min(gpu.device_count(), 4), 600)
    assert spmv_err <= 1e-12 and pagerank_diff <= 1e-13


def test_split_kernels_for_own_and_gathered_columns_add_up_to_the_whole_product():
    A = with_dense_row_and_empty_rows()
    x = np.random.default_rng(5).uniform(-1, 1, A.shape[0])

    class DeviceLike:  # a host group that claims device collectives, so that each rank splits its rows
        def __init__(self, comm):
            self.rank, self.size, self._comm = comm.rank, comm.size, comm

        def allgather(self, part):
            return self._comm.allgather(part)

        def allgather_into(self, part, out, stream=0):
            raise AssertionError("host vectors are gathered on the host")

    def rank(comm):
        spmv = DistributedSpMV(A, DeviceLike(comm), local_compile=lambda M: M.dot)
        assert spmv.local is None and spmv._own is not None
        return spmv.gather(spmv.local_product(spmv.gather_x(spmv.scatter(x))))
    for y in LocalGroup(3).run(rank):
        assert np.abs(y - A.astype(np.float64) @ x).max() <= 1e-5 * np.abs(A).max() * A.shape[0]


def _bench_row(**changes):
    from tuner.bench_multigpu import MultiGpuRow
    row = dict(op="spmv", name="rmat:9", nnz=5738, gpus=4, ours_s=1e-3, one_gpu_s=3e-3, speedup=3.0,
               efficiency=0.75, correct=False, max_rel_diff_vs_one_gpu=2e-3, rel_error_vs_scipy=None,
               iterations=None, one_gpu_iterations=None, setup_s=1.0, one_gpu_setup_s=2.0,
               setup_stages={"pull": 0.25, "partition": 0.75}, load_s=3.0, allgather_s=4e-4,
               local_s=7e-4, single_kernel_s=1.2e-3, rows_per_rank=[128] * 4, nnz_per_rank=[1434] * 4,
               rank_kernel="tiled", one_gpu_family="tile_composite",
               one_gpu_setup_stages={"pull": 0.5, "plan": 0.25, "layout": 1.25, "layout_source": "device",
                                     "family": "tile_coo"}, sharded=False, scipy_check=None)
    row.update(changes)
    return MultiGpuRow(**row)


def test_multigpu_bench_table_shows_times_in_ms_efficiency_and_the_check():
    from tuner.bench_multigpu import format_table
    table = format_table([_bench_row()]).splitlines()
    line = table[1].split()
    assert line[:9] == ["spmv", "rmat:9", "5,738", "4", "1.000", "3.000", "3.00", "0.75", "0.400"]
    assert line[9:13] == ["0.700", "1.200", "tiled", "WRONG"]
    assert table[2] == ("setup rmat:9: load 3.0 s; 4 ranks 1.0 s (pull 0.2, partition 0.8); one GPU 2.0 s "
                        "(pull 0.5, plan 0.2, layout 1.2; tile_coo layout device); model plans tile_composite")


def test_multigpu_bench_table_shows_a_graph_larger_than_one_gpu_without_a_one_gpu_side():
    from tuner.bench_multigpu import format_table
    row = _bench_row(one_gpu_s=None, speedup=None, efficiency=None, max_rel_diff_vs_one_gpu=None, correct=True,
                     rel_error_vs_scipy=3e-8, scipy_check="100000 sampled", one_gpu_setup_s=None,
                     one_gpu_setup_stages={}, sharded=True, setup_stages={"facts": 2.0, "rows": 5.0})
    table = format_table([row]).splitlines()
    assert table[1].split()[5:8] == ["-", "-", "-"]
    assert table[1].endswith("ok (vs SciPy (100000 sampled) 3.0e-08)")
    assert table[2] == ("setup rmat:9: load 3.0 s; 4 ranks (sharded) 1.0 s (facts 2.0, rows 5.0); larger than one "
                        "GPU; model plans tile_composite")


def test_the_one_gpu_side_is_skipped_only_where_the_bare_transpose_exceeds_the_gpu():
    from tuner.bench_multigpu import one_gpu_fits
    assert one_gpu_fits(1000, 10_000, 8, 10_000 * 8 + 8 * 1001)
    assert not one_gpu_fits(1000, 10_000, 8, 10_000 * 8 + 8 * 1000)


def test_the_sampled_scipy_check_equals_the_whole_product_on_its_nodes():
    from tuner.bench_multigpu import sampled_pull
    from tuner.graph.pagerank import edge_weights
    A = abs(power_law(3000, seed=77)).tocsr()
    x = np.random.default_rng(2).uniform(0.5, 1.5, 3000)
    nodes = np.sort(np.random.default_rng(3).choice(3000, 500, replace=False))
    assert np.allclose(sampled_pull(A, x, nodes), (edge_weights(A).T @ x)[nodes], rtol=1e-12, atol=0)


def test_the_pagerank_fixed_point_check_passes_a_converged_pagerank_and_flags_a_perturbed_one():
    from tuner.bench_multigpu import AGREE, pagerank_residual, sampled_pull
    from tuner.distributed.generated import kronecker_facts, kronecker_pull
    from tuner.generators import kronecker, kronecker_blocks
    from tuner.graph import pagerank
    from tuner.graph.pagerank import row_sums
    A = abs(power_law(3000, seed=77)).tocsr()
    b = kronecker_blocks(abs(power_law(200, seed=5)).tocsr(), k=2)
    K = kronecker(abs(power_law(200, seed=5)).tocsr(), k=2)
    cases = ((A, lambda v, at: sampled_pull(A, v, at), row_sums(A)),
             (K, lambda v, at: kronecker_pull(b, v, at), kronecker_facts(b).out_weight))
    for M, pull, out_weight in cases:
        pr = pagerank(M, tol=1e-12, tol_rule="per_node", max_iter=500, backend="scipy")
        nodes = np.arange(M.shape[0])
        assert pagerank_residual(pull, out_weight, pr, nodes) < 1e-9
        off = pr.copy()
        off[int(np.argmax(pr))] *= 1.001
        assert pagerank_residual(pull, out_weight, off, nodes) > AGREE


MPI_SHARE_SCRIPT = """
import numpy as np
from tuner.distributed import comm as comm_module
from tuner.distributed import MpiComm
from tuner.distributed.share import load_once
from tuner import loaders
comm_module.BCAST_PIECE = 1000  # many pieces
comm = MpiComm()
A = load_once("rmat:10", comm)
B = loaders.load("rmat:10")
same = (A.shape == B.shape and A.has_canonical_format and all(
    np.array_equal(getattr(A, f), getattr(B, f)) and getattr(A, f).dtype == getattr(B, f).dtype
    for f in ("indptr", "indices", "data")))
each = comm.allgather(np.array([same]))
if comm.rank == 0:
    print("ranks", comm.size, "same", all(bool(e[0]) for e in each))
"""


def test_a_graph_loaded_once_reaches_every_mpi_rank_whole():
    assert run_as_mpi_ranks(MPI_SHARE_SCRIPT, 3, 300) == "ranks 3 same True"


def test_a_load_that_fails_on_rank_0_fails_on_every_rank_naming_the_source():
    from tuner.distributed.share import load_once

    def rank(comm):
        try:
            load_once("no-such-graph.npz", comm)
        except Exception as e:  # noqa: BLE001
            return type(e).__name__, str(e)
    got = LocalGroup(3).run(rank)
    assert got[0][0] == "FileNotFoundError" and "no-such-graph.npz" in got[0][1]
    assert got[1] == got[2] == ("RuntimeError", "rank 0 could not load no-such-graph.npz: see its error")


def test_multigpu_bench_splits_a_one_gpu_setup_into_pull_planning_and_layout():
    from types import SimpleNamespace
    from tuner.bench_multigpu import _solo_stages
    plan = SimpleNamespace(family="tile_coo", seconds={"relabel": 1.5, "plan": 0.5, "plan_runs": [0.5, 0.4]})
    spmv = SimpleNamespace(setup_seconds={"partition": 0.25, "plan": 0.0, "layout": 7.0},
                           local=SimpleNamespace(plan=plan, layout_source="device"))
    assert _solo_stages(spmv, 10.0) == {"pull": 2.75, "plan": 2.0, "layout": 5.0, "layout_source": "device",
                                        "family": "tile_coo"}
