"""Probe: per-kernel times of SparseGatedMLP (graph replay) and the dense layer, 99% and 95%."""
import sys, numpy as np, cupy, torch
sys.path.insert(0, "."); sys.path.insert(0, "benchmarks")
from arrays import cast
import twell, twell.torch as tt
from torch.profiler import profile, ProfilerActivity

M, D, H = 16384, 2048, 5632
def lin(w):
    l = torch.nn.Linear(w.shape[1], w.shape[0], bias=False, device="cuda", dtype=torch.bfloat16)
    l.weight = torch.nn.Parameter(w, requires_grad=False); return l
for bias in (-2.33, -1.645):
    rng = cupy.random.default_rng(0)
    x = rng.standard_normal((M, D), dtype=np.float32); x[:, 0] = 1.0
    wg = rng.standard_normal((H, D), dtype=np.float32) / np.sqrt(D); wg[:, 0] = bias
    wu = rng.standard_normal((H, D), dtype=np.float32) / np.sqrt(D)
    wd = rng.standard_normal((D, H), dtype=np.float32) / np.sqrt(H)
    tx, tg, tu, td = (torch.as_tensor(cast(cupy, a, twell.bfloat16), device="cuda") for a in (x, wg, wu, wd))
    layer = tt.SparseGatedMLP.from_linear(lin(tg), lin(tu), lin(td))
    with torch.no_grad():
        layer(tx); torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s): layer(tx)
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(g): out = layer(tx)
        dense = lambda: (torch.relu(tx @ tg.T) * (tx @ tu.T)) @ td.T
        for name, fn in (("module graph", g.replay), ("dense", dense), ("module eager", lambda: layer(tx))):
            for _ in range(10): fn()
            torch.cuda.synchronize()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(50): fn()
            e1.record(); torch.cuda.synchronize()
            print(f"bias {bias}: {name}: {e0.elapsed_time(e1)/50:.3f} ms/call (queued)")
            with profile(activities=[ProfilerActivity.CUDA]) as p:
                for _ in range(20): fn()
                torch.cuda.synchronize()
            print(p.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=60))
