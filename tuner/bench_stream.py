"""``python -m tuner bench-stream``: products over graphs larger than a device-memory budget, streamed from
page-locked host memory (:mod:`tuner.streaming`), against the host-to-device bandwidth measured in the same
run and the same product in memory.

Rows (models/<gpu-slug>/bench-stream.json), one per (op, graph, budget):

* ``spmv``: y = A x streamed; ``ours_s`` the median wall time of a product between device synchronisations.
* ``pagerank``: :func:`tuner.pagerank` on the device with the budget (Aᵀ streamed every iteration, the rank
  vectors on the GPU), to a per-node change below ``bench_graph.TOL``; ``ours_s`` per iteration.
* ``spgemm``: C = A B in slotted pages (:mod:`tuner.spgemm.slotted`) under a budget of an eighth of the
  outer product's working set (:func:`slotted_budget`), C assembled in host memory; ``in_memory_s`` the
  same product in memory with C brought to the host, ``bound_s`` that plus the least any streamed product
  copies (A and B up and C down, once each) at the measured host-to-device rate; ``page_sizes`` the model's
  predicted and the measured seconds of the chosen page size and of pages a half and a quarter of it, and a
  call's seconds in its pages and in the assembly of C from their partials (``phases_s``).

``fraction_of_h2d`` is the bytes streamed a product over its time over ``h2d_gbs_measured`` (copies from
page-locked memory, CUDA events): how close a product comes to PCIe's floor. ``in_memory_s``: the same
product tuned in memory (no budget), where it fits.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from . import __version__, gpu, loaders
from .bench_graph import TOL
from .matrix import canonicalize

# (graph, budget): each graph's CSR at least 4 times its budget. Pattern graphs: 4 bytes an entry, 0.56 and
# 2.25 GB; rmat:23 at 64 edges a node (about 2 GB) is 8 times its budget, where x, y and the row pointers
# that stay on the device (134 MB) leave the sparser graphs no room for more than 4.
GENERATED = (("rmat:23", "128M"), ("rmat:25", "512M"), ("rmat:23:64", "224M"))
KRONECKER = (("cnr-2000.npz", 4, "256M"),)  # 260M entries, 1.04 GB
REPEATS = 10


def default_suite(data_dir=None) -> list[tuple[str, str]]:
    """The generated graphs and, where the data folder has its graph, the Kronecker-scaled one, each with
    its budget.

    Example:
        >>> default_suite("/nonexistent")
        [('rmat:23', '128M'), ('rmat:25', '512M'), ('rmat:23:64', '224M')]
    """
    by_name = {p.name: p for p in loaders.real_matrices(data_dir)}
    kron = [(f"kron:{by_name[n]}:{k}", limit) for n, k, limit in KRONECKER if n in by_name]
    return list(GENERATED) + kron


@dataclass(frozen=True)
class StreamRow:
    """One (op, graph, budget); seconds, bytes and GB/s (10^9 bytes a second).

    Attributes:
        op, name, nnz: what ran on which graph.
        budget_bytes: the device-memory limit; data_bytes: the matrix's CSR (indices, values, row pointers);
            for SpGEMM the outer product's working set the budget is an eighth of.
        streamed_bytes: bytes that cross PCIe a product; parts: the parts a product is cut into.
        passes: products (or iterations) timed.
        ours_s: a streamed product (PageRank: an iteration), median.
        h2d_gbs_measured: copies from page-locked memory in this run; fraction_of_h2d: streamed_bytes /
            ours_s / h2d_gbs_measured.
        in_memory_s: the tuned product in device memory (None where it does not fit).
        rel_error: against SciPy in float64 (SpMV), or the largest difference from PageRank in memory.
        correct: rel_error within float32's tolerance (SpMV: 1e-5), or ``PAGERANK_AGREEMENT``.
        bound_s: SpGEMM: ``in_memory_s`` plus A's and B's CSR bytes up and C's down at ``h2d_gbs_measured``.
        page_sizes: SpGEMM: predicted and measured seconds by page size (each the median of ``passes``
            calls, timed in turns with the other sizes and the in-memory product after two calls each), and
            ``phases_s``.
        first_call_s, second_call_s: SpGEMM: the first call (page-locking the pages' operands) and the second
            (the partials into page-locked arrays, C's structure found); ``ours_s`` times the calls after,
            which move values alone.
    """

    op: str
    name: str
    nnz: int
    budget_bytes: int
    data_bytes: int
    streamed_bytes: int
    parts: int
    passes: int
    ours_s: float
    h2d_gbs_measured: float
    fraction_of_h2d: float
    in_memory_s: float | None
    rel_error: float
    correct: bool
    bound_s: float | None = None
    page_sizes: dict | None = None
    first_call_s: float | None = None
    second_call_s: float | None = None


def _median_wall_s(fn, repeats: int) -> float:
    fn()  # warm-up: page-locks, first launches
    gpu.synchronize()
    return _interleaved_medians({"fn": fn}, repeats)["fn"]


def spmv_row(source: str, limit: str, h2d: float, repeats: int = REPEATS) -> StreamRow:
    """A streamed SpMV of one graph under one budget."""
    import cupy

    from .compiler import compile as compile_spmv
    from .kernel import random_vector
    from .streaming import StreamedSpMV, budget_of
    A = loaders.load(source)
    m = canonicalize(A)
    spmv = compile_spmv(A, device_memory_limit=limit)
    if not isinstance(spmv, StreamedSpMV):
        raise ValueError(f"{source} fits the budget {limit}: choose a budget under a third of its CSR")
    x = random_vector(m.n_cols, m.value_dtype, seed=2)
    xd, yd = cupy.asarray(x), cupy.full(m.n_rows, cupy.nan, m.value_dtype)
    ours = _median_wall_s(lambda: spmv(xd, out=yd), repeats)
    ref = m.to_scipy().astype(np.float64) @ x.astype(np.float64)
    err = float(np.linalg.norm(yd.get() - ref) / np.linalg.norm(ref))
    plan = spmv.plan
    del spmv, yd
    in_memory = _in_memory_s(A, xd, repeats)
    return StreamRow(op="spmv", name=loaders.display_name(source), nnz=m.nnz, budget_bytes=budget_of(limit, 0),
                     data_bytes=plan.matrix_bytes, streamed_bytes=plan.streamed_bytes, parts=plan.parts, passes=repeats,
                     ours_s=ours, h2d_gbs_measured=h2d, fraction_of_h2d=plan.streamed_bytes / ours / 1e9 / h2d,
                     in_memory_s=in_memory, rel_error=err, correct=err < 1e-5)


def _in_memory_s(A, xd, repeats: int) -> float | None:
    import cupy

    from .compiler import compile as compile_spmv
    from .formats import device_reorder
    try:
        spmv = compile_spmv(A, background=False)
        yd = cupy.empty(A.shape[0], xd.dtype)
        return _median_wall_s(lambda: spmv(xd, out=yd), repeats)
    except MemoryError:
        return None
    finally:
        device_reorder.release()


def pagerank_row(source: str, limit: str, h2d: float) -> StreamRow:
    """PageRank on the device with Aᵀ streamed each iteration, against PageRank in memory."""
    from .distributed.nccl import SoloDevice
    from .distributed.pagerank import pagerank_on_devices, pull_product
    from .formats import device_reorder
    from .streaming import StreamedSpMV, budget_of
    A = abs(loaders.load(source))
    solo = SoloDevice()
    product = pull_product(A, solo, dtype=np.float32, device_memory_limit=limit)
    if not isinstance(product.local, StreamedSpMV):
        raise ValueError(f"{source} fits the budget {limit}: choose a budget under a third of its CSR")
    options = dict(tol=TOL, tol_rule="per_node", max_iter=1000, dtype=np.float32, return_info=True)
    ranks, info = pagerank_on_devices(A, solo, product=product, **options)
    plan = product.local.plan
    del product
    device_reorder.release()
    ref, ref_info = pagerank_on_devices(A, solo, **options)
    per_iter = info.seconds["iterations"] / info.iterations
    err = float(np.abs(ranks - ref).max())
    return StreamRow(op="pagerank", name=loaders.display_name(source), nnz=int(A.nnz), budget_bytes=budget_of(limit, 0),
                     data_bytes=plan.matrix_bytes, streamed_bytes=plan.streamed_bytes,
                     parts=plan.parts, passes=info.iterations, ours_s=per_iter, h2d_gbs_measured=h2d,
                     fraction_of_h2d=plan.streamed_bytes / per_iter / 1e9 / h2d,
                     in_memory_s=ref_info.seconds["iterations"] / ref_info.iterations, rel_error=err,
                     correct=err <= PAGERANK_AGREEMENT)


SPGEMM_SUITE = (("wiki-Vote.npz", "AA"), ("cit-HepPh.npz", "AAT"), ("cnr-2000.npz", "AA"))
SPGEMM_SHARE = 8  # the budget is the slotted product's working set over this


def slotted_budget(stats, a, b) -> int:
    """The budget a slotted-page product of ``a`` and ``b`` (canonical, with the model's ``stats``) is
    benchmarked under: an eighth of the working set of the family its pages run, the outer product (its
    expansion twice, and the operands), so that the budget does not move with the in-memory family the
    model happens to pick.

    Example:
        >>> import scipy.sparse as sp
        >>> from tuner.matrix import canonicalize
        >>> from tuner.model.spgemm import ProductStats
        >>> a = canonicalize(sp.eye(4, format="csr", dtype="float32"))
        >>> slotted_budget(ProductStats(4, 4, 1000, 4.0, 0, 0, 4, 4, 4, 4), a, a)   # (2 x 1000 x 12 + 144) / 8
        3018
    """
    from .model import spgemm as model
    from .spgemm import operand_bytes
    return int(model.working_bytes("outer_product", stats) + operand_bytes(a, b)) // SPGEMM_SHARE


def spgemm_suite(data_dir=None) -> list[tuple[str, str]]:
    """The slotted-page products of the data folder's graphs, as (graph file, 'AA' or 'AAT').

    Example:
        >>> spgemm_suite("/nonexistent")
        []
    """
    by_name = {p.name: p for p in loaders.real_matrices(data_dir)}
    return [(str(by_name[n]), op) for n, op in SPGEMM_SUITE if n in by_name]


# Calls per median of a slotted product and of the others it is judged against: the calls of a small product
# vary by a fifth from one to the next (host launches, page faults in C's new arrays), about the 10 % the
# page-size model is judged by, so three calls each could not tell the sizes apart.
SPGEMM_REPEATS = 7


def _interleaved_medians(fns: dict, repeats: int, wait=None) -> dict:
    """Median wall seconds of each of ``fns`` (name -> call), timed in turns, one call of each per round,
    each until ``wait()`` returns (default: the GPU is idle): what one call leaves behind (the host heap
    grown for C's arrays, the pool's device blocks) then favours none of them.

    Example:
        >>> sorted(_interleaved_medians({"a": lambda: None, "b": lambda: None}, 3, wait=lambda: None))
        ['a', 'b']
    """
    wait = gpu.synchronize if wait is None else wait
    times: dict = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            wait()
            times[name].append(time.perf_counter() - t0)
    return {name: float(np.median(t)) for name, t in times.items()}


def spgemm_row(source: str, op: str, h2d: float, repeats: int = SPGEMM_REPEATS) -> StreamRow:
    """C = A B (or A Aᵀ) in slotted pages under :func:`slotted_budget`; it, the same product in memory and
    the slotted product at half and a quarter of the chosen page size are timed in turns
    (:func:`_interleaved_medians`) after two calls each."""
    from .spgemm import compile_spgemm
    from .spgemm.slotted import SlottedProduct, pages_at
    A = loaders.load(source).tocsr()
    B = A if op == "AA" else A.T.tocsr()
    in_memory = compile_spgemm(A, B)
    a, b = in_memory.a, in_memory.b
    budget = slotted_budget(in_memory.plan.stats, a, b)
    working = budget * SPGEMM_SHARE
    ref = in_memory()
    in_memory()
    f = compile_spgemm(A, B, device_memory_limit=budget)
    if not isinstance(f, SlottedProduct):
        raise ValueError(f"{source} {op} fits {budget:,} bytes: it streams only over its budget")
    calls = []
    for _ in range(2):  # the first two calls, timed apart: the later ones reuse what they found
        t0 = time.perf_counter()
        C = f()
        gpu.synchronize()
        calls.append(time.perf_counter() - t0)
    chosen = f.plan.page_entries
    others = {entries: SlottedProduct(f.a, f.b, pages_at(f.ops.a_colptr, f.ops.b_rowptr, entries, f.plan.budget_bytes,
                                                         f.a.n_rows, f.dtype.itemsize, f.a.index_dtype.itemsize)[0],
                                      f.cache, nnz_c=f.nnz_c, budget_bytes=f.budget_bytes)
              for entries in (chosen // 2, chosen // 4) if entries in f.plan.predicted_s}
    for g in others.values():
        g(), g()
    medians = _interleaved_medians({"in_memory": in_memory, chosen: f, **others}, repeats)
    in_memory_s, ours = medians["in_memory"], medians[chosen]
    del in_memory
    streamed = f.up_bytes + f.down_bytes
    # what any streamed product moves at least: A and B up once, C down once
    least = sum(x.nbytes for M in (A, B, C) for x in (M.data, M.indices, M.indptr))
    f.timed = True  # one more call, split into its pages (copies and kernels) and the host's assembly of C
    last = f()
    phases = {k: round(v, 6) for k, v in f.seconds.items()}
    err, same = 0.0, True
    for got in (C, last):  # the second call's C and a values-only call's
        diff = abs(got.astype(np.float64) - ref.astype(np.float64))
        largest = float(diff.max()) if got.nnz or ref.nnz else 0.0
        err = max(err, largest / max(abs(ref).max(), 1e-30) if ref.nnz else largest)
        same = same and got.nnz == ref.nnz
    sizes = {str(entries): {"predicted_s": f.plan.predicted_s[entries], "pages": g.pages.pages,
                            "measured_s": medians[entries], "chosen": g is f}
             for entries, g in {chosen: f, **others}.items()}
    sizes["phases_s"] = phases
    return StreamRow(op="spgemm", name=f"{loaders.display_name(source)} {op}", nnz=int(A.nnz), budget_bytes=budget,
                     data_bytes=working, streamed_bytes=int(streamed), parts=f.plan.pages, passes=repeats,
                     ours_s=ours, h2d_gbs_measured=h2d, fraction_of_h2d=streamed / ours / 1e9 / h2d,
                     in_memory_s=in_memory_s, rel_error=err, correct=bool(same and err < 1e-5),
                     bound_s=in_memory_s + least / h2d / 1e9, page_sizes=sizes, first_call_s=calls[0],
                     second_call_s=calls[1])


# Each run stops once no rank changes by TOL, within about TOL / (1 - alpha) of the fixed point: two runs
# that sum in different orders agree to some multiple of TOL.
PAGERANK_AGREEMENT = 10 * TOL
OPS = {"spmv": spmv_row, "pagerank": pagerank_row, "spgemm": spgemm_row}


def run(suite, out: Path, command: str, ops=("spmv", "pagerank"), progress=None,
        products: list[tuple[str, str]] = ()) -> list[StreamRow]:
    """Every op of every (graph, budget) and, with 'spgemm' in ``ops``, every slotted-page product of
    ``products`` ((graph, 'AA' or 'AAT'), see :func:`spgemm_suite`), written to ``out`` after each row."""
    from .formats import device_reorder
    h2d = gpu.pinned_copy_gbs()
    jobs = [(op, source, limit) for source, limit in suite for op in ops if op != "spgemm"]
    jobs += [("spgemm", source, op) for source, op in products] if "spgemm" in ops else []
    rows = []
    for op, source, limit in (progress(jobs) if progress else jobs):
        rows.append(OPS[op](source, limit, h2d))
        device_reorder.release()
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({
            "tool": f"sparse-tuner {__version__}", "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": command, "gpu": {"name": gpu.device_info().name},
            "timing": "wall seconds between device synchronisations, median of products after a warm-up "
                      "(PageRank: an iteration, its loop's total over its iterations); float32",
            "rows": [asdict(r) for r in rows]}, indent=1))
    return rows


def format_table(rows: list[StreamRow]) -> str:
    lines = [f"{'op':<9}{'graph':<24}{'nnz':>13}{'budget':>8}{'parts':>7}{'ours ms':>9}{'in mem ms':>10}"
             f"{'GB/s':>7}{'of H2D':>8}  ok"]
    for r in rows:
        mem = f"{1e3 * r.in_memory_s:10.2f}" if r.in_memory_s is not None else f"{'-':>10}"
        lines.append(f"{r.op:<9}{r.name[:23]:<24}{r.nnz:>13,}{r.budget_bytes / 2**30:7.2f}G{r.parts:>7}"
                     f"{1e3 * r.ours_s:9.2f}{mem}{r.streamed_bytes / r.ours_s / 1e9:7.1f}"
                     f"{100 * r.fraction_of_h2d:7.1f}%  {'yes' if r.correct else 'NO'}")
    return "\n".join(lines)


def parse_suite(items: list[str]) -> list[tuple[str, str]]:
    """GRAPH@BUDGET items as (graph, budget) pairs.

    Example:
        >>> parse_suite(["rmat:25@1G", "kron:cnr-2000.npz:4@512M"])
        [('rmat:25', '1G'), ('kron:cnr-2000.npz:4', '512M')]
    """
    out = []
    for item in items:
        source, sep, limit = item.rpartition("@")
        if not sep or not source or not limit:
            raise ValueError(f"{item!r}: give a graph and a device-memory budget as GRAPH@BUDGET, e.g. rmat:25@1G")
        out.append((source, limit))
    return out
