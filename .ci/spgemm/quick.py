# SpGEMM preview on the GPU machine: ours (outer_product) against cuSPARSE through CuPy on five products.
#   source .whl/setup.sh && python3 .ci/spgemm/quick.py   (writes $OUT/spgemm-quick.json)
# A stand-in until `python -m tuner bench` covers SpGEMM.
"""Quick look: our outer-product SpGEMM vs cuSPARSE (CuPy) on a few products; CUDA-event timing."""
import json, os, sys, time
import numpy as np, scipy.sparse as sp
import tuner
from tuner import gpu, loaders
import cupy as cp, cupyx.scipy.sparse as csp

rows = []
for src, op in [(".data/email-Enron.npz", "AA"), (".data/soc-Slashdot0902.npz", "AA"), (".data/wiki-Vote.npz", "AAT"),
                (".data/ego-Twitter-undirected.npz", "AA"), ("rmat:16", "AA")]:
    A = loaders.load(src)
    B = A if op == "AA" else A.T.tocsr()
    t0 = time.perf_counter(); f = tuner.compile(A, B); setup = time.perf_counter() - t0
    C = f()
    ref = (A.astype(np.float64) @ B.astype(np.float64)).tocsr()
    err = abs(C - ref).max() / max(abs(ref).max(), 1)
    ts = []
    for _ in range(5):
        gpu.synchronize(); t = time.perf_counter(); f(); gpu.synchronize(); ts.append(time.perf_counter() - t)
    dA, dB = csp.csr_matrix(A), csp.csr_matrix(B)
    try:
        dC = dA @ dB; cp.cuda.Device().synchronize()
        cs = []
        for _ in range(5):
            t = time.perf_counter(); dC = dA @ dB; cp.cuda.Device().synchronize(); cs.append(time.perf_counter() - t)
        cus = float(np.median(cs)) * 1e3; cstat = "ok" if dC.nnz == ref.nnz else f"wrong: nnz {dC.nnz} vs {ref.nnz}"
    except Exception as e:
        cus, cstat = None, f"error: {e}"
    prod = int((np.diff(A.tocsc().indptr).astype(np.int64) * np.diff(B.indptr)).sum())
    dev = []
    for _ in range(5):
        gpu.synchronize(); t = time.perf_counter(); f(out="device"); gpu.synchronize(); dev.append(time.perf_counter() - t)
    f(); phases = {k: round(v * 1e3, 3) for k, v in f.seconds.items()}
    gpu_ms = sum(v for k, v in phases.items() if k != "download")
    r = dict(name=loaders.display_name(src), op=op, nnz_C=int(C.nnz), products=prod, ours_ms_host=float(np.median(ts)) * 1e3,
             ours_device_ms=gpu_ms, ours_out_device_ms=float(np.median(dev)) * 1e3, phases=phases,
             cusparse_ms_host=cus, cusparse_status=cstat, rel_err=float(err), setup_s=setup)
    rows.append(r); print(r, flush=True)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "spgemm-quick.json"), "w"), indent=1)
