"""Probe: host time of eager SparseGatedMLP calls at 99.9% and 99% (GPU-light), cProfile top."""
import sys, time, cProfile, pstats, io, numpy as np, cupy, torch
sys.path.insert(0, "."); sys.path.insert(0, "benchmarks")
from arrays import cast
import twell, twell.torch as tt

M, D, H = 16384, 2048, 5632
def lin(w):
    l = torch.nn.Linear(w.shape[1], w.shape[0], bias=False, device="cuda", dtype=torch.bfloat16)
    l.weight = torch.nn.Parameter(w, requires_grad=False); return l
for bias in (-3.09, -2.33):
    rng = cupy.random.default_rng(0)
    x = rng.standard_normal((M, D), dtype=np.float32); x[:, 0] = 1.0
    wg = rng.standard_normal((H, D), dtype=np.float32) / np.sqrt(D); wg[:, 0] = bias
    wu = rng.standard_normal((H, D), dtype=np.float32) / np.sqrt(D)
    wd = rng.standard_normal((D, H), dtype=np.float32) / np.sqrt(H)
    tx, tg, tu, td = (torch.as_tensor(cast(cupy, a, twell.bfloat16), device="cuda") for a in (x, wg, wu, wd))
    layer = tt.SparseGatedMLP.from_linear(lin(tg), lin(tu), lin(td))
    with torch.no_grad():
        for _ in range(5): layer(tx)
        torch.cuda.synchronize()
        hs = []
        for _ in range(30):
            t0 = time.perf_counter(); layer(tx); hs.append(time.perf_counter() - t0)
            torch.cuda.synchronize()
        print(f"bias {bias}: host time of a call (launches only) median {1e3*np.median(hs):.3f} ms")
        pr = cProfile.Profile(); pr.enable()
        for _ in range(30): layer(tx)
        pr.disable(); torch.cuda.synchronize()
    for key in ("tottime", "cumtime"):
        s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats(key).print_stats(28)
        print("\n".join(l for l in s.getvalue().splitlines() if l.strip())[:7000])
