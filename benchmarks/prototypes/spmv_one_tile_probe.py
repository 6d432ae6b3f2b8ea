"""SpMV probe on the one-tile layout: library A @ x, probe kernels, cupyx and torch CSR."""
import sys, statistics, numpy as np, cupy, cupyx.scipy.sparse as csp
sys.path.insert(0, "."); sys.path.insert(0, "benchmarks")
import twell
from workloads import poisson2d, powerlaw_graph

mod = cupy.RawModule(path=None, code=open("benchmarks/prototypes/spmv_one_tile_probe.cu").read(),
                     options=("-std=c++17",))
try:
    import torch
except ImportError:
    torch = None


def timeit(f, reps=100, rounds=7):
    for _ in range(5): f()
    cupy.cuda.Device().synchronize()
    out = []
    for _ in range(rounds):
        s, e = cupy.cuda.Event(), cupy.cuda.Event()
        s.record()
        for _ in range(reps): f()
        e.record(); e.synchronize()
        out.append(cupy.cuda.get_elapsed_time(s, e) / reps)
    return statistics.median(out)


for name in ("poisson", "graph"):
    for dt, tag in ((np.float32, "f32"), (np.float64, "f64")):
        if name == "poisson":
            a, _ = poisson2d(cupy, csp, 1000, dt)
        else:
            a, _ = powerlaw_graph(cupy, csp, 10**6, 16.0, 2.0, 0, dt)
        m = a.shape[0]
        x = cupy.random.default_rng(1).uniform(-1, 1, m).astype(dt)
        want = (a.astype(np.float64) @ x.astype(np.float64))
        A = twell.TwELLMatrix(a)
        nb = A.nbytes if hasattr(A, "nbytes") else -1
        res = {"twell A@x": timeit(lambda: A @ x), "cupyx csr": timeit(lambda: a @ x)}
        if torch is not None:
            t = torch.sparse_csr_tensor(torch.from_dlpack(a.indptr), torch.from_dlpack(a.indices),
                                        torch.from_dlpack(a.data), size=a.shape)
            tx = torch.from_dlpack(x)
            res["torch csr"] = timeit(lambda: t @ tx)
        assert A.counts.shape[1] == 1, A
        slots = A.data.shape[2]
        args = (A.counts, A.data, A.indices.astype(cupy.int32), A.overflow_indptr,
                A.overflow_indices, A.overflow_data, np.int64(m), np.int32(slots), x)
        for kern in ("thread_rows", "warp_staged"):
            f = mod.get_function(f"{kern}_{tag}")
            y = cupy.full(m, np.nan, dtype=dt)
            shm = 8 * 32 * slots * (np.dtype(dt).itemsize + 4) if kern == "warp_staged" else 0
            if shm > 48 * 1024:
                continue
            run = lambda: f(((m + 255) // 256,), (256,), (*args, y), shared_mem=shm)
            run(); cupy.cuda.Device().synchronize()
            err = float(cupy.linalg.norm(y.astype(np.float64) - want) / cupy.linalg.norm(want))
            res[f"{kern} (err {err:.1e})"] = timeit(run)
        floor = (a.data.nbytes + a.indices.nbytes + a.indptr.nbytes + 2 * x.nbytes) / 3.0e12 * 1e3
        print(f"{name} {tag}: tile {A.tile_width} slots {slots} overflow {A.overflow_data.size} "
              f"twell {nb/1e6:.0f} MB csr {(a.data.nbytes + a.indices.nbytes + a.indptr.nbytes)/1e6:.0f} MB "
              f"floor {floor:.4f} ms")
        for k, v in res.items():
            print(f"   {k:32s} {v:.4f} ms")
        del A, a
        cupy.get_default_memory_pool().free_all_blocks()
