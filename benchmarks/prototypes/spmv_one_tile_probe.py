"""Probe: one-tile SpMV candidates (cuda_src/spmm.cu twell_spmv_one_tile) vs library, cupyx, torch."""
import sys, statistics
import numpy as np, cupy, cupyx.scipy.sparse as csp
sys.path[:0] = [".", "benchmarks", "build"]
import twell
from twell._cuda import _compile
from workloads import poisson2d, powerlaw_graph
from spmv_names import NAMES
import torch, warnings
warnings.filterwarnings("ignore")

mod = cupy.RawModule(code=_compile.source_text("spmm.cu"), options=_compile.OPTIONS,
                     name_expressions=NAMES)
old = cupy.RawModule(code=open("build/spmv_probe.cu").read(), options=("-std=c++17",))

def ev(f, reps=200, rounds=7):
    for _ in range(5): f()
    cupy.cuda.Device().synchronize()
    out = []
    for _ in range(rounds):
        evs = [(cupy.cuda.Event(), cupy.cuda.Event()) for _ in range(reps)]
        for s, e in evs:
            s.record(); f(); e.record()
        evs[-1][1].synchronize()
        out.append(statistics.median(cupy.cuda.get_elapsed_time(s, e) for s, e in evs))
    return statistics.median(out)

CT = {np.float32: "float", np.float64: "double"}
for name in ("graph",):
    for dt in (np.float32, np.float64):
        if name == "poisson":
            a, _ = poisson2d(cupy, csp, 1000, dt)
        else:
            a, _ = powerlaw_graph(cupy, csp, 10**6, 16.0, 2.0, 0, dt)
        m = a.shape[0]
        x = cupy.random.default_rng(1).uniform(-1, 1, m).astype(dt)
        want = a.astype(np.float64) @ x.astype(np.float64)
        t = torch.sparse_csr_tensor(torch.from_dlpack(a.indptr), torch.from_dlpack(a.indices),
                                    torch.from_dlpack(a.data), size=a.shape); tx = torch.from_dlpack(x)
        A0 = twell.TwELLMatrix(a)
        base = {"cupyx": ev(lambda: a @ x), "torch": ev(lambda: t @ tx), "twell A@x": ev(lambda: A0 @ x)}
        print(f"== {name} {np.dtype(dt).name} auto slots {A0.slots} n_over {A0.overflow_data.size}: "
              + "  ".join(f"{k} {v:.4f}" for k, v in base.items()), flush=True)
        slot_choices = [A0.slots] if name == "poisson" else [A0.slots, 16]
        for slots in slot_choices:
            A = A0 if slots == A0.slots else twell.TwELLMatrix(a, tile_width=A0.tile_width, slots=slots)
            p = A._parts
            n_over = int(p.overflow_indices.size)
            res = {}
            if False:
                y = cupy.full(m, np.nan, dt)
                f = old.get_function(f"thread_rows_{'f32' if dt == np.float32 else 'f64'}")
                args = (p.counts, p.data, p.indices, p.overflow_indptr, p.overflow_indices,
                        p.overflow_data, np.int64(m), np.int32(slots), x, y)
                run = lambda: f(((m + 255) // 256,), (256,), (*args,))
                run(); err = float(cupy.linalg.norm(y - want) / cupy.linalg.norm(want))
                res[f"old probe (err {err:.0e})"] = ev(run)
            for nm in NAMES:
                if f"<{CT[dt]}," not in nm or "one_tile" not in nm:
                    continue
                ov, G, L = nm.split("<")[1][:-1].split(", ")[1:4]
                G = int(G)
                if ov == "false" and n_over:
                    continue
                kern = mod.get_function(nm)
                chunk_kern = mod.get_function(f"twell_spmv_overflow_chunks<{CT[dt]}>")
                for log2 in ([0] if ov == "false" or n_over == 0 else [0, 6, 8]):
                    nchunks = -(-n_over // (1 << log2)) if log2 else 0
                    if log2 and n_over < (2 << log2):
                        continue
                    partial = cupy.empty(max(2 * nchunks, 1), dtype=np.float64 if dt == np.float64 else np.float32)
                    y = cupy.full(m, np.nan, dt)
                    args = (p.counts, p.data, p.indices, p.overflow_indptr, p.overflow_indices,
                            p.overflow_data, np.int64(m), np.int32(slots), partial, np.int32(log2), x, y)
                    grid = (-(-m * G // 256),)
                    def run(kern=kern, args=args, grid=grid, log2=log2, nchunks=nchunks, partial=partial):
                        if log2:
                            chunk_kern((-(-nchunks * 32 // 256),), (256,), (
                                p.overflow_indptr, p.overflow_indices, p.overflow_data,
                                np.int64(m), np.int32(log2), x, partial))
                        kern(grid, (256,), args)
                    run(); cupy.cuda.Device().synchronize()
                    err = float(cupy.linalg.norm(y - want) / cupy.linalg.norm(want))
                    res[f"G{G} L{L} ov {ov[0]} split {log2} (err {err:.0e})"] = ev(run)
            best = sorted(res.items(), key=lambda kv: kv[1])
            print(f"  slots {slots} n_over {n_over} nbytes {A.nbytes/1e6:.0f} MB")
            for k, v in best[:12]:
                print(f"     {k:40s} {v:.4f}")
            print(f"     worst {best[-1][0]} {best[-1][1]:.4f}", flush=True)
        del A0, A, a, t
        cupy.get_default_memory_pool().free_all_blocks()

