import pathlib, statistics, sys, warnings
import cupy, cupyx.scipy.sparse as csp, numpy as np
sys.path[:0] = [".", "benchmarks"]
import twell
from twell._cuda import _compile
from workloads import powerlaw_graph, poisson2d
warnings.filterwarnings("ignore")
HERE = pathlib.Path(__file__).parent
CT = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
SHAPES = ((4, 4), (4, 8), (8, 2), (8, 4))
MINB = (1, 8)
NAMES = [f"proto_spmv_hub<{t}, {g}, {lo}, {ix}, {mb}>" for t in CT.values() for g, lo in SHAPES
         for ix in ("int", "unsigned short") for mb in MINB]
MOD = cupy.RawModule(code=_compile.source_text("spmm.cu") + (HERE / "spmv_hub.cu").read_text(),
                     options=_compile.OPTIONS, name_expressions=NAMES)

def ev(f, reps=200, rounds=5):
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

def hub_run(A, g, lo, hub_min, mb=1):
    p = A._parts
    m, slots = A.shape[0], p.data.shape[2]
    dt = np.dtype(p.data.dtype)
    ix = "int" if p.indices.dtype == np.int32 else "unsigned short"
    olen = cupy.diff(p.overflow_indptr)
    hubs = cupy.nonzero(olen >= hub_min)[0].astype(np.int64)
    k = MOD.get_function(f"proto_spmv_hub<{CT[dt]}, {g}, {lo}, {ix}, {mb}>")
    grid = (int(hubs.size) + -(-m * g // 256),)
    def run(x):
        y = cupy.empty(m, dtype=dt)
        y[...] = np.nan
        k(grid, (256,), (p.counts, p.data, p.indices, p.overflow_indptr, p.overflow_indices,
                         p.overflow_data, np.int64(m), np.int32(slots), hubs,
                         np.int64(hubs.size), np.int64(hub_min), x, y))
        return y
    def timed(x):
        y = cupy.empty(m, dtype=dt)
        k(grid, (256,), (p.counts, p.data, p.indices, p.overflow_indptr, p.overflow_indices,
                         p.overflow_data, np.int64(m), np.int32(slots), hubs,
                         np.int64(hubs.size), np.int64(hub_min), x, y))
        return y
    return run, timed, int(hubs.size)

def main():
    import torch
    for dt in (np.float32, np.float64):
        a, info = powerlaw_graph(cupy, csp, 10**6, 16.0, 2.0, 0, dt)
        m = a.shape[0]
        x = cupy.random.default_rng(1).uniform(-1, 1, m).astype(dt)
        want = a.astype(np.float64) @ x.astype(np.float64)
        t = torch.sparse_csr_tensor(torch.from_dlpack(a.indptr), torch.from_dlpack(a.indices),
                                    torch.from_dlpack(a.data), size=a.shape)
        tx = torch.from_dlpack(x)
        res = {"cupyx csr": ev(lambda: a @ x), "torch csr": ev(lambda: t @ tx)}
        for slots in (8, 12, 16):
            A = twell.TwELLMatrix(a, slots=slots)
            res[f"twell A@x slots={A.slots} over={A.overflow_nnz}"] = ev(lambda: A @ x)
            for g, lo in SHAPES:
                for mb in MINB:
                    for hub_min in ((128, 256, 512) if (g, lo, mb) == (8, 2, 8) else (256,)):
                        run, timed, nh = hub_run(A, g, lo, hub_min, mb)
                        y = run(x); cupy.cuda.Device().synchronize()
                        err = float(cupy.linalg.norm(y - want) / cupy.linalg.norm(want))
                        res[f"hub G{g}L{lo} mb{mb} min{hub_min} slots={A.slots} hubs={nh} err={err:.0e}"] = ev(lambda: timed(x))
            del A
        print(f"== graph {np.dtype(dt).name} {info}", flush=True)
        for kk, v in sorted(res.items(), key=lambda kv: kv[1]):
            print(f"   {kk:70s} {v:.4f} ms", flush=True)
        del a, t

if __name__ == "__main__":
    main()
