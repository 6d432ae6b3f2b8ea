"""Probe: host overhead of A @ x, graph overflow shape, dense pack auto cost."""
import sys, time, statistics, cProfile, pstats, io
import numpy as np, cupy, cupyx.scipy.sparse as csp
sys.path.insert(0, "."); sys.path.insert(0, "benchmarks")
import twell
from workloads import poisson2d, powerlaw_graph
import torch

def ev(f, reps=200, rounds=7):
    for _ in range(5): f()
    cupy.cuda.Device().synchronize()
    out = []
    for _ in range(rounds):
        ts = []
        evs = [(cupy.cuda.Event(), cupy.cuda.Event()) for _ in range(reps)]
        for s, e in evs:
            s.record(); f(); e.record()
        evs[-1][1].synchronize()
        out.append(statistics.median(cupy.cuda.get_elapsed_time(s, e) for s, e in evs))
    return statistics.median(out)

def host(f, reps=3000):
    for _ in range(20): f()
    cupy.cuda.Device().synchronize()
    t = time.perf_counter()
    for _ in range(reps): f()
    dt = (time.perf_counter() - t) / reps * 1e6
    cupy.cuda.Device().synchronize()
    return dt

if 0:
  pass
if False:
    # 1. host overhead on a small matrix
    a, _ = poisson2d(cupy, csp, 30, np.float32)
    A = twell.TwELLMatrix(a); x = cupy.ones(a.shape[0], np.float32)
    t = torch.sparse_csr_tensor(torch.from_dlpack(a.indptr), torch.from_dlpack(a.indices),
                                torch.from_dlpack(a.data), size=a.shape); tx = torch.from_dlpack(x)
    print("host us/call small: twell A@x %.1f  A.dot %.1f  cupyx %.1f  torch %.1f  cupy.empty %.1f" % (
        host(lambda: A @ x), host(lambda: A.dot(x)), host(lambda: a @ x), host(lambda: t @ tx),
        host(lambda: cupy.empty(900, np.float32))))
    pr = cProfile.Profile(); pr.enable()
    for _ in range(3000): A @ x
    pr.disable(); s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(30)
    print(s.getvalue()[:6000])
    
# 2. large matrices
for name in ("poisson", "graph"):
    for dt in (np.float32, np.float64):
        if name == "poisson":
            a, _ = poisson2d(cupy, csp, 1000, dt)
        else:
            a, info = powerlaw_graph(cupy, csp, 10**6, 16.0, 2.0, 0, dt); print(info)
        m = a.shape[0]
        x = cupy.random.default_rng(1).uniform(-1, 1, m).astype(dt)
        A = twell.TwELLMatrix(a)
        ol = cupy.diff(A.overflow_indptr).get()
        rl = cupy.diff(a.indptr).get()
        print(f"{name} {np.dtype(dt).name} tw {A.tile_width} slots {A.slots} n_over {A.overflow_data.size}"
              f" rows>16over {(ol>16).sum()} >256 {(ol>256).sum()} >2048 {(ol>2048).sum()} max over {ol.max()} max row {rl.max()}")
        t = torch.sparse_csr_tensor(torch.from_dlpack(a.indptr), torch.from_dlpack(a.indices),
                                    torch.from_dlpack(a.data), size=a.shape); tx = torch.from_dlpack(x)
        res = {"twell": ev(lambda: A @ x), "cupyx": ev(lambda: a @ x), "torch": ev(lambda: t @ tx)}
        y = cupy.empty(m, dt)
        # the kernel alone, same args as the launcher
        from twell._cuda import _compile, _policy
        from twell._cuda._launch import BLOCK, blocks, i32, i64, instance, indexed
        p = A._parts
        kern = _compile.function(*indexed("spmm.cu", instance("twell_spmv_thread_rows", dt), p.indices.dtype))
        args = (p.counts, p.data, p.indices, p.overflow_indptr, p.overflow_indices, p.overflow_data,
                i64(m), i64(m), i32(A.tile_width), i32(p.data.shape[2]), p.overflow_indptr, p.overflow_indices, x, y)
        g = blocks(m, BLOCK); b = (BLOCK,)
        res["kernel"] = ev(lambda: kern(g, b, args))
        if name == "graph":
            # same graph, rows cut to slots+16 entries: the cost of the long rows
            keep = cupy.minimum(cupy.diff(a.indptr), A.slots + 16)
            ind = cupy.concatenate([cupy.zeros(1, cupy.int64), cupy.cumsum(keep)])
            r = cupy.repeat(cupy.arange(m), keep.get().tolist()) if False else None
            rows = cupy.repeat(cupy.arange(m), keep)
            pos = cupy.arange(int(ind[-1])) - ind[:-1][rows] + a.indptr[:-1][rows]
            a2 = csp.csr_matrix((a.data[pos], a.indices[pos], ind), shape=a.shape)
            A2 = twell.TwELLMatrix(a2, tile_width=A.tile_width, slots=A.slots)
            res["twell cut rows"] = ev(lambda: A2 @ x)
            res["cupyx cut rows"] = ev(lambda: a2 @ x)
        print("   " + "  ".join(f"{k} {v:.4f}" for k, v in res.items()))
        del A, a, t
        cupy.get_default_memory_pool().free_all_blocks()

# 3. dense pack auto
from workloads import ffn_inputs32
g = cupy.random.default_rng(0)
d = g.standard_normal((16384, 5632), dtype=np.float32)
d = cupy.where(g.random((16384, 5632)) < 0.01, d, 0).astype(cupy.float32)
import twell._build as tb, twell._backend as tbe
for tw, sl in (("auto", "auto"), (256, "auto"), (256, 8), (5632, "auto")):
    try:
        ms = ev(lambda: twell.TwELLMatrix(d, tile_width=tw, slots=sl), reps=20, rounds=5)
        print(f"pack dense fp32 tw={tw} slots={sl}: {ms:.3f} ms (host {host(lambda: twell.TwELLMatrix(d, tile_width=tw, slots=sl), reps=50):.0f} us)")
    except Exception as e:
        print("pack", tw, sl, "failed", e)
be = tbe.backend(cupy)
print("auto_dense_tiles alone %.3f ms" % ev(lambda: tb._auto_dense_tiles(be, d, "auto"), reps=20, rounds=5))
print("tile_counts_dense 256 %.3f ms" % ev(lambda: be.tile_counts_dense(d, 256), reps=20, rounds=5))
