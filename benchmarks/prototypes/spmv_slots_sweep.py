"""Slots sweep for one-tile layouts: A @ x and A @ B (N=8, 64) against torch's cuSPARSE."""
import statistics, sys, warnings
import cupy, cupyx.scipy.sparse as csp, numpy as np, torch
sys.path[:0] = [".", "benchmarks"]
import twell
from workloads import powerlaw_graph, poisson2d
warnings.filterwarnings("ignore")

def ev(f, reps=100, rounds=3):
    for _ in range(5):
        f()
    cupy.cuda.Device().synchronize()
    out = []
    for _ in range(rounds):
        evs = [(cupy.cuda.Event(), cupy.cuda.Event()) for _ in range(reps)]
        for s, e in evs:
            s.record(); f(); e.record()
        evs[-1][1].synchronize()
        out.append(statistics.median(cupy.cuda.get_elapsed_time(s, e) for s, e in evs))
    return statistics.median(out)

def tcsr(a):
    return torch.sparse_csr_tensor(torch.from_dlpack(a.indptr.astype(np.int64)),
                                   torch.from_dlpack(a.indices.astype(np.int64)),
                                   torch.from_dlpack(a.data), size=a.shape)

def uniform(n, deg, dt):
    g = np.random.default_rng(5)
    d = g.poisson(deg, n)
    indptr = np.concatenate([[0], np.cumsum(d)])
    cols = cupy.asarray(g.integers(0, n, int(indptr[-1])).astype(np.int32))
    rows = cupy.asarray(np.repeat(np.arange(n, dtype=np.int32), d))
    vals = cupy.random.default_rng(2).uniform(0.25, 1.25, cols.size).astype(dt)
    a = csp.coo_matrix((vals, (rows, cols)), shape=(n, n)).tocsr(); a.sum_duplicates()
    return a

cases = []
for dt in (np.float32, np.float64):
    cases.append(("graph", dt, powerlaw_graph(cupy, csp, 10**6, 16.0, 2.0, 0, dt)[0]))
cases.append(("uniform16", np.float32, uniform(10**6, 16, np.float32)))
cases.append(("poisson", np.float32, poisson2d(cupy, csp, 1000, np.float32)[0]))
print(f"{'case':10} {'dt':8} {'slots':>5} {'MB':>7} {'ovfl%':>6} {'spmv':>7} {'t_spmv':>7} "
      f"{'N8':>7} {'t_N8':>7} {'N64':>7} {'t_N64':>7}", flush=True)
for name, dt, a in cases:
    n = a.shape[0]
    x = cupy.random.default_rng(1).uniform(-1, 1, n).astype(dt)
    ta = tcsr(a)
    ref = a.astype(np.float64) @ x.astype(np.float64)
    tt = {"spmv": ev(lambda: ta @ torch.from_dlpack(x))}
    bs = {}
    for N in (8, 64):
        bs[N] = cupy.random.default_rng(3).uniform(-1, 1, (n, N)).astype(dt)
        tb = torch.from_dlpack(bs[N])
        tt[N] = ev(lambda: ta @ tb, reps=30)
    for s in ("auto", 5, 8, 9, 10, 12, 16, 20):
        if name == "poisson" and s not in ("auto", 5, 8):
            continue
        try:
            A = twell.TwELLMatrix(a, tile_width="auto", slots=s)
        except Exception as e:  # noqa
            print(name, s, "failed", str(e)[:80]); continue
        p = A._parts
        y = A @ x
        err = float(cupy.abs(y - ref).max() / cupy.abs(ref).max())
        assert err < 1e-4, err
        ts = ev(lambda: A @ x)
        tn = {N: ev(lambda: A @ bs[N], reps=30) for N in (8, 64)}
        ov = 100 * p.overflow_indices.size / a.nnz
        print(f"{name:10} {np.dtype(dt).name:8} {str(A.slots):>5} {A.nbytes/1e6:7.0f} {ov:6.1f} "
              f"{ts:7.4f} {tt['spmv']:7.4f} {tn[8]:7.4f} {tt[8]:7.4f} {tn[64]:7.4f} {tt[64]:7.4f}",
              flush=True)
        del A, p
    cupy.get_default_memory_pool().free_all_blocks()
