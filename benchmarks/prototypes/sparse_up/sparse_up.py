"""Probe: the gated kernels with the up projection at the gate's entries (sparse_up) against
the whole up GEMM, at several gate densities; the module (graph replay) against torch's dense
layer. Paper's shape, bf16, calls queued back to back, medians of rounds."""
import sys, numpy as np, cupy, torch
sys.path.insert(0, "."); sys.path.insert(0, "benchmarks")
from arrays import cast
import twell, twell.torch as tt
from twell._cuda import _ffn, _policy
from scipy.special import ndtri

M, D, H = 16384, 2048, 5632
def batch(fn, reps=20, rounds=5):
    fn(); torch.cuda.synchronize()
    out = []
    for _ in range(rounds):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(reps): fn()
        e.record(); e.synchronize()
        out.append(s.elapsed_time(e) / reps)
    return float(np.median(out))
def lin(w):
    l = torch.nn.Linear(w.shape[1], w.shape[0], bias=False, device="cuda", dtype=torch.bfloat16)
    l.weight = torch.nn.Parameter(w, requires_grad=False); return l
def tt_(a):
    return torch.as_tensor(a.view(np.int16), device="cuda").view(torch.bfloat16)
rng = cupy.random.default_rng(0)
x32 = rng.standard_normal((M, D), dtype=np.float32); x32[:, 0] = 1.0
wu = cast(cupy, rng.standard_normal((H, D), dtype=np.float32) / np.sqrt(D), twell.bfloat16)
wd = cast(cupy, rng.standard_normal((D, H), dtype=np.float32) / np.sqrt(H), twell.bfloat16)
x = cast(cupy, x32, twell.bfloat16)
tx, tu, td = tt_(x), tt_(wu), tt_(wd)
for density in (0.005, 0.01, 0.02, 0.05):
    wg32 = rng.standard_normal((H, D), dtype=np.float32) / np.sqrt(D)
    wg32[:, 0] = float(ndtri(density))
    wg = cast(cupy, wg32, twell.bfloat16); tg = tt_(wg)
    whole = batch(lambda: _ffn.gated_dense(x, wg, wu))
    sparse = batch(lambda: _ffn.gated_dense(x, wg, wu, sparse_up=True))
    a = _ffn.gated_dense(x, wg, wu); b = _ffn.gated_dense(x, wg, wu, sparse_up=True)
    nz = float((a != 0).mean())
    diff = float(cupy.abs(a.view(cupy.int16).astype(cupy.int32) - b.view(cupy.int16).astype(cupy.int32)).max())
    dense = batch(lambda: (torch.relu(tx @ tg.T) * (tx @ tu.T)) @ td.T)
    rows = {}
    for way in ("policy", "whole"):
        if way == "whole":
            saved = _policy.SPARSE_UP_MAX_DENSITY; _policy.SPARSE_UP_MAX_DENSITY = -1.0
        layer = tt.SparseGatedMLP.from_linear(lin(tg), lin(tu), lin(td))
        with torch.no_grad():
            layer(tx); torch.cuda.synchronize()
            s_ = torch.cuda.Stream(); s_.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s_): layer(tx)
            torch.cuda.current_stream().wait_stream(s_)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g): out = layer(tx)
            rows[way] = batch(g.replay)
            rows[way + " eager"] = batch(lambda: layer(tx))
        if way == "whole":
            _policy.SPARSE_UP_MAX_DENSITY = saved
    print(f"density {density:.3f} (hidden nz {nz:.4f}): gated_dense whole {whole:.4f} sparse {sparse:.4f} "
          f"(max ulp-ish diff {diff:.0f}) | module graph {rows['policy']:.4f} (whole-up {rows['whole']:.4f}) "
          f"eager {rows['policy eager']:.4f} | torch dense {dense:.4f} -> {dense / rows['policy']:.3f}x", flush=True)
