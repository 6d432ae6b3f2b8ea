"""Prototype probe (not shipped): the one-tile SpMV with rows binned by length, on the
power-law graph and the stencil, against the library's A @ x, cupyx and torch's CSR.

Run on a GPU machine from the repo root: PYTHONPATH=. python3 benchmarks/prototypes/spmv_binned.py
"""
import pathlib
import statistics
import sys
import warnings

import cupy
import cupyx.scipy.sparse as csp
import numpy as np

sys.path[:0] = [".", "benchmarks"]
import twell  # noqa: E402
from twell._cuda import _compile  # noqa: E402
from workloads import poisson2d, powerlaw_graph  # noqa: E402

warnings.filterwarnings("ignore")
HERE = pathlib.Path(__file__).parent
CT = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
SHAPES = ((1, 8), (2, 8), (4, 4), (4, 8), (8, 4), (8, 8), (16, 4), (32, 4))
NAMES = ([f"proto_spmv_binned<{t}, {o}, {g}, {lo}>" for t in CT.values()
          for o in ("false", "true") for g, lo in SHAPES]
         + [f"twell_spmv_overflow_chunks<{t}>" for t in CT.values()])
MOD = cupy.RawModule(code=_compile.source_text("spmm.cu") + (HERE / "spmv_binned.cu").read_text(),
                     options=_compile.OPTIONS, name_expressions=NAMES)

#: Bin plans: (upper bound of a row's entries, G, Loads) per bin, rows sorted by bin.
PLANS = {
    "one bin G8L4 (unbinned order)": None,
    "3 bins 8/32/inf: G1L8 G4L8 G8L8": [(8, 1, 8), (32, 4, 8), (np.inf, 8, 8)],
    "3 bins 8/32/inf: G1L8 G4L8 G8L4": [(8, 1, 8), (32, 4, 8), (np.inf, 8, 4)],
    "3 bins 8/16/inf: G1L8 G2L8 G8L4": [(8, 1, 8), (16, 2, 8), (np.inf, 8, 4)],
    "4 bins 8/24/64/inf: G1L8 G4L8 G8L8 G32L4": [(8, 1, 8), (24, 4, 8), (64, 8, 8),
                                                 (np.inf, 32, 4)],
    "2 bins 32/inf: G4L8 G16L4": [(32, 4, 8), (np.inf, 16, 4)],
}


def ev(f, reps=200, rounds=7):
    for _ in range(5):
        f()
    cupy.cuda.Device().synchronize()
    out = []
    for _ in range(rounds):
        evs = [(cupy.cuda.Event(), cupy.cuda.Event()) for _ in range(reps)]
        for s, e in evs:
            s.record()
            f()
            e.record()
        evs[-1][1].synchronize()
        out.append(statistics.median(cupy.cuda.get_elapsed_time(s, e) for s, e in evs))
    return statistics.median(out)


def binned_run(A, x, plan, log2=8):
    p = A._parts
    m, slots = A.shape[0], p.data.shape[2]
    dt = np.dtype(p.data.dtype)
    n_over = int(p.overflow_indices.size)
    over = "true" if n_over else "false"
    lengths = p.counts.ravel().astype(np.int64) + cupy.diff(p.overflow_indptr)
    acc = np.float64 if dt == np.float64 else np.float32
    chunks = -(-n_over >> log2) if n_over >= 2 << log2 else 0
    launches = []
    if plan is None:
        plan = [(np.inf, 8, 4)]
        lists = [cupy.arange(m, dtype=np.int64)]
    else:
        lists, lo = [], 0
        for hi, _, _ in plan:
            lists.append(cupy.nonzero((lengths > lo) & (lengths <= hi))[0].astype(np.int64))
            lo = hi
        # rows of no entries (lengths == 0) go with the first bin
        lists[0] = cupy.concatenate([cupy.nonzero(lengths == 0)[0].astype(np.int64), lists[0]])
    for (_, g, lo), rows in zip(plan, lists):
        if rows.size:
            k = MOD.get_function(f"proto_spmv_binned<{CT[dt]}, {over}, {g}, {lo}>")
            launches.append((k, (-(-rows.size * g // 256),), rows))
    chunk_k = MOD.get_function(f"twell_spmv_overflow_chunks<{CT[dt]}>")

    def run():
        partial = cupy.empty(max(2 * chunks, 1), dtype=acc)
        if chunks:
            chunk_k((-(-chunks * 32 // 256),), (256,), (
                p.overflow_indptr, p.overflow_indices, p.overflow_data, np.int64(m),
                np.int32(log2), x, partial))
        y = cupy.empty(m, dtype=dt)
        for k, grid, rows in launches:
            k(grid, (256,), (p.counts, p.data, p.indices, p.overflow_indptr,
                             p.overflow_indices, p.overflow_data, rows, np.int64(rows.size),
                             np.int32(slots), partial, np.int32(log2 if chunks else 0), x, y))
        return y
    return run


def main():
    import torch
    for name in ("graph", "poisson"):
        for dt in (np.float32, np.float64):
            if name == "poisson":
                a, _ = poisson2d(cupy, csp, 1000, dt)
            else:
                a, _ = powerlaw_graph(cupy, csp, 10**6, 16.0, 2.0, 0, dt)
            m = a.shape[0]
            x = cupy.random.default_rng(1).uniform(-1, 1, m).astype(dt)
            want = a.astype(np.float64) @ x.astype(np.float64)
            A = twell.TwELLMatrix(a)
            if A.indices.dtype != np.int32:  # the prototype takes int columns
                A = twell.TwELLMatrix(a, tile_width=1 << 20)
            t = torch.sparse_csr_tensor(torch.from_dlpack(a.indptr),
                                        torch.from_dlpack(a.indices),
                                        torch.from_dlpack(a.data), size=a.shape)
            tx = torch.from_dlpack(x)
            res = {"cupyx csr": ev(lambda: a @ x), "torch csr": ev(lambda: t @ tx),
                   "twell A @ x": ev(lambda: A @ x)}
            for label, plan in PLANS.items():
                run = binned_run(A, x, plan)
                y = run()
                cupy.cuda.Device().synchronize()
                err = float(cupy.linalg.norm(y - want) / cupy.linalg.norm(want))
                res[f"{label} (err {err:.0e})"] = ev(run)
            print(f"== {name} {np.dtype(dt).name}: slots {A.slots}, overflow {A.overflow_nnz}")
            for k, v in sorted(res.items(), key=lambda kv: kv[1]):
                print(f"   {k:58s} {v:.4f} ms")
            del A, a, t


if __name__ == "__main__":
    main()
