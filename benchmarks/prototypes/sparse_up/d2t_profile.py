"""Probe: where an eager twell.matmul_to_twell call spends its time (paper's shape, bf16,
99% sparse output): events per call, the fused kernel alone, the host's time before the
launch and after the read, and cProfile's top functions."""
import sys, time, cProfile, pstats, io, numpy as np, cupy
sys.path.insert(0, "."); sys.path.insert(0, "benchmarks")
from arrays import cast
import twell
from twell._cuda import _ffn, _reduce

M, K, N = 16384, 2048, 5632
rng = cupy.random.default_rng(0)
x = rng.standard_normal((M, K), dtype=np.float32)
w = rng.standard_normal((N, K), dtype=np.float32) / np.sqrt(K)
x[:, 0] = 1.0
w[:, 0] = -2.33  # shifts each output by about -2.33 sigma: about 1% positive
x = cast(cupy, x, twell.bfloat16); w = cast(cupy, w, twell.bfloat16)
a = twell.matmul_to_twell(x, w)
print("density", a.nnz / (M * N), "slots", a.slots)
marks = {}
orig_launch, orig_read = _ffn._launch_matmul_pack, _ffn.read_counts
ev = {}
def launch(*args, **kw):
    marks["launch"] = time.perf_counter()
    ev["k0"] = cupy.cuda.Event(); ev["k1"] = cupy.cuda.Event()
    ev["k0"].record(); r = orig_launch(*args, **kw); ev["k1"].record()
    return r
def read(*args, **kw):
    marks["read0"] = time.perf_counter(); r = orig_read(*args, **kw); marks["read1"] = time.perf_counter()
    return r
_ffn._launch_matmul_pack = launch; _ffn.read_counts = read
for slots in ("auto", 13):
    rows = []
    for i in range(40):
        cupy.cuda.Device().synchronize()
        e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
        t0 = time.perf_counter(); e0.record()
        twell.matmul_to_twell(x, w, slots=slots)
        e1.record(); e1.synchronize(); t1 = time.perf_counter()
        rows.append((cupy.cuda.get_elapsed_time(e0, e1), cupy.cuda.get_elapsed_time(ev["k0"], ev["k1"]),
                     1e3 * (marks["launch"] - t0), 1e3 * (marks["read1"] - marks["read0"]),
                     1e3 * (t1 - marks["read1"]), 1e3 * (t1 - t0)))
    r = np.median(np.array(rows[5:]), axis=0)
    print(f"slots={slots}: call {r[0]:.3f} ms (events) | kernel {r[1]:.3f} | host before launch "
          f"{r[2]:.3f} | read (wait) {r[3]:.3f} | host after read {r[4]:.3f} | wall {r[5]:.3f}")
_ffn._launch_matmul_pack = orig_launch; _ffn.read_counts = orig_read
pr = cProfile.Profile(); pr.enable()
for _ in range(30): twell.matmul_to_twell(x, w, slots=13)
pr.disable()
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(18)
print("\n".join(l for l in s.getvalue().splitlines() if l.strip())[:6000])

# Kernel-level comparison in one process: torch profiler over eager calls, and queued
# back-to-back timing of the no-sync pack against the reference D2T.
import torch
from torch.profiler import profile, ProfilerActivity
from contenders import Reference
ref = Reference("reference", torch)
tx, tw = torch.as_tensor(x, device="cuda"), torch.as_tensor(w, device="cuda")
packed = torch.zeros((M, N // 8), dtype=torch.int32, device="cuda").view(torch.uint32)
def queued(fn, n=50):
    for _ in range(5): fn()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(n): fn()
    e1.record(); torch.cuda.synchronize()
    return e0.elapsed_time(e1) / n
from twell._cuda import _ffn as cffn
for rnd in range(3):
    print(f"round {rnd}: ref D2T queued {queued(lambda: ref.d2t_out(tx, tw, packed, 8)):.4f} ms | "
          f"bounded pack S=13 queued {queued(lambda: cffn.matmul_pack_bounded(x, w, 256, 13)):.4f} | "
          f"bounded S=8 {queued(lambda: cffn.matmul_pack_bounded(x, w, 256, 8)):.4f} | "
          f"torch GEMM {queued(lambda: torch.relu(tx @ tw.T)):.4f}")
with profile(activities=[ProfilerActivity.CUDA]) as p:
    for _ in range(20):
        twell.matmul_to_twell(x, w, slots=13); ref.d2t_out(tx, tw, packed, 8)
    torch.cuda.synchronize()
print(p.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=60))
