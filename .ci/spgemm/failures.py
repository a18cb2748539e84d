# SpGEMM where cuSPARSE fails or is wrong: ours checked independently.
#   source .whl/setup.sh && python3 .ci/spgemm/failures.py   (writes $OUT/spgemm-fail.json; needs an H200 for rmat:18)
# A stand-in until `python -m tuner bench` covers SpGEMM.
"""Products where cuSPARSE fails or is wrong: ours checked independently (SciPy where it can, else row sums
through two SpMVs in float64 and 300 sampled rows computed exactly by SciPy)."""
import json, os, time
import numpy as np, scipy.sparse as sp
import tuner
from tuner import gpu, loaders
from tuner.spgemm import DeviceMemoryError
import cupy as cp, cupyx.scipy.sparse as csp

rows = []
for src, op in [(".data/cnr-2000.npz", "AA"), (".data/cnr-2000.npz", "AAT"), ("rmat:17", "AA"), ("rmat:18", "AA")]:
    A = loaders.load(src); B = A if op == "AA" else A.T.tocsr()
    r = dict(name=loaders.display_name(src), op=op, free_device=gpu.free_memory() if gpu.available() else None)
    try:
        f = tuner.compile(A, B)
        r["products"] = f.table.products
        t = time.perf_counter(); C = f(); r["ours_call_s"] = time.perf_counter() - t
        r["phases_ms"] = {k: round(v * 1e3, 2) for k, v in f.seconds.items()}
        r["nnz_C"] = int(C.nnz)
        ones = np.ones(B.shape[1])
        sums = A.astype(np.float64) @ (B.astype(np.float64) @ ones)
        got = np.asarray(C.sum(axis=1), dtype=np.float64).ravel()
        r["row_sum_rel_err"] = float(abs(got - sums).max() / max(abs(sums).max(), 1))
        pick = np.random.default_rng(0).choice(A.shape[0], 300, replace=False)
        exact = (A[pick].astype(np.float64) @ B.astype(np.float64)).tocsr(); exact.sort_indices()
        sub = C[pick]
        r["sampled_rows_same_structure"] = bool(np.array_equal(sub.indptr, exact.indptr) and np.array_equal(sub.indices, exact.indices))
        r["sampled_rows_rel_err"] = float(abs(sub - exact).max() / max(abs(exact).max(), 1)) if exact.nnz else 0.0
        del C, f
    except DeviceMemoryError as e:
        r["ours"] = f"refused: {e}"
    try:
        dC = csp.csr_matrix(A) @ csp.csr_matrix(B); cp.cuda.Device().synchronize()
        r["cusparse"] = f"nnz {int(dC.nnz)}" + ("" if "nnz_C" not in r else (" (same)" if dC.nnz == r["nnz_C"] else " (WRONG)"))
        del dC
    except Exception as e:
        r["cusparse"] = f"error: {type(e).__name__}: {str(e)[:120]}"
    cp.get_default_memory_pool().free_all_blocks()
    rows.append(r); print(r, flush=True)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "spgemm-fail.json"), "w"), indent=1)
