"""Host phases of matmul_to_twell(x, w) with slots='auto' vs 13 slots at 99% (H200)."""
import cProfile, pstats, time, io
import cupy, numpy as np
from scipy.special import ndtri
import twell
from twell import _cupy_backend as gb

rng = np.random.default_rng(0)
m, d, h = 16384, 2048, 5632
x = cupy.asarray(rng.standard_normal((m, d), dtype=np.float32)); x[:, 0] = 1.0
x = x.astype(twell.bfloat16)
w = cupy.asarray(rng.standard_normal((h, d), dtype=np.float32)) / np.sqrt(d)
w[:, 0] = -ndtri(0.99)
w = w.astype(twell.bfloat16)
sync = cupy.cuda.Device().synchronize

def wall(fn, n=30):
    for _ in range(3): fn(); sync()
    ts = []
    for _ in range(n):
        t = time.perf_counter(); fn(); sync(); ts.append(time.perf_counter() - t)
    return 1e3 * float(np.median(ts))

# Phase timing of matmul_pack_auto: wrap the pieces with perf_counter + sync around the get.
phases = {}
def wrap(mod, name):
    f = getattr(mod, name)
    def g(*a, **k):
        t = time.perf_counter(); r = f(*a, **k); phases[name] = phases.get(name, 0) + time.perf_counter() - t
        return r
    setattr(mod, name, g)
    return f

print(f"wall auto {wall(lambda: twell.matmul_to_twell(x, w)):.3f} ms, S=13 {wall(lambda: twell.matmul_to_twell(x, w, slots=13)):.3f} ms")
print(f"wall pack_auto {wall(lambda: gb.matmul_pack_auto(x, w, 256)):.3f} ms, pack S=13 {wall(lambda: gb.matmul_pack(x, w, 256, 13)):.3f}")
# GPU-only times of the auto path's kernels, by events
e = [cupy.cuda.Event() for _ in range(2)]
parts, slots, nnz = gb.matmul_pack_auto(x, w, 256)
print("slots", slots)
pr = cProfile.Profile()
for _ in range(3): gb.matmul_pack_auto(x, w, 256); sync()
pr.enable()
for _ in range(50):
    gb.matmul_pack_auto(x, w, 256); sync()
pr.disable()
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25); print(s.getvalue()[:6000])
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(30); print(s.getvalue()[:6000])
