"""One-tile SpMV on the graph: register caps and team shapes, float64 and float32."""
import statistics, sys, warnings
import cupy, cupyx.scipy.sparse as csp, numpy as np, torch
sys.path[:0] = [".", "benchmarks"]
import twell
from twell._cuda import _compile
from workloads import powerlaw_graph
warnings.filterwarnings("ignore")

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

SRC = _compile.source_text("spmm.cu")
assert "? 6 : 8;" in SRC
SHAPES = ((8, 2), (8, 1), (4, 2), (4, 4), (16, 1), (4, 1), (2, 2))
CT = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
mods = {}
for b64 in (6, 7, 8):
    for b32 in (8,) if b64 != 6 else (8, 6, 7):
        src = SRC.replace("? 6 : 8;", f"? {b64} : {b32};")
        names = [f"twell_spmv_one_tile<{t}, true, {g}, {lo}, int>" for t in CT.values()
                 for g, lo in SHAPES]
        mods[(b64, b32)] = (cupy.RawModule(code=src, options=_compile.OPTIONS,
                                           name_expressions=names), names)

for dt in (np.float64, np.float32):
    a = powerlaw_graph(cupy, csp, 10**6, 16.0, 2.0, 0, dt)[0]
    n = a.shape[0]
    x = cupy.random.default_rng(1).uniform(-1, 1, n).astype(dt)
    ref = a.astype(np.float64) @ x.astype(np.float64)
    ta = torch.sparse_csr_tensor(torch.from_dlpack(a.indptr), torch.from_dlpack(a.indices),
                                 torch.from_dlpack(a.data), size=a.shape)
    tx = torch.from_dlpack(x)
    t_torch = ev(lambda: ta @ tx)
    t_cupyx = ev(lambda: a @ x)
    print(f"{np.dtype(dt).name} torch {t_torch:.4f} cupyx {t_cupyx:.4f}", flush=True)
    for slots in (8, 12, 16):
        A = twell.TwELLMatrix(a, slots=slots)
        p = A._parts
        assert p.indices.dtype == np.int32
        t_lib = ev(lambda: A @ x)
        hubs = cupy.flatnonzero(cupy.diff(p.overflow_indptr) >= 256)
        res = []
        for key, (mod, names) in mods.items():
            if dt == np.float32 and key[0] != 6:
                continue
            if dt == np.float64 and key[1] != 8:
                continue
            for g, lo in SHAPES:
                name = f"twell_spmv_one_tile<{CT[np.dtype(dt)]}, true, {g}, {lo}, int>"
                k = mod.get_function(name)
                grid = (int(hubs.size) + -(-n * g // 256),)
                args = (p.counts, p.data, p.indices, p.overflow_indptr, p.overflow_indices,
                        p.overflow_data, np.int64(n), np.int32(slots), hubs,
                        np.int64(hubs.size), np.int64(256), x)
                y = cupy.full(n, np.nan, dtype=dt)
                k(grid, (256,), (*args, y))
                err = float(cupy.abs(y - ref).max() / cupy.abs(ref).max())
                t = ev(lambda: k(grid, (256,), (*args, cupy.empty(n, dtype=dt))))
                res.append((t, key, g, lo, k.num_regs, k.local_size_bytes, err))
        res.sort()
        print(f"  slots {slots}: library {t_lib:.4f} ({t_torch / t_lib:.2f}x torch)", flush=True)
        for t, key, g, lo, regs, local, err in res[:8]:
            print(f"    {t:.4f} {t_torch / t:.2f}x blocks={key} G{g} L{lo} regs={regs} "
                  f"local={local} err={err:.1e}", flush=True)
        del A, p
    cupy.get_default_memory_pool().free_all_blocks()
