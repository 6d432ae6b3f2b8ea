"""Host phases of matmul_to_twell(x, w) with slots='auto' against 13 slots at 99% (H200).

Call 3 of the seventeenth session: wall clock (perf_counter around each synchronised call,
median of 30) of the fused call and of its launchers, then cProfile of 50 calls of
``matmul_pack_auto``. (As run, less two unused helpers.) Usage on the GPU machine, from the
repository root: PYTHONPATH=. python benchmarks/results/2026-12-04-h200-q/prof.py
"""
import cProfile
import io
import pstats
import time

import cupy
import numpy as np
from scipy.special import ndtri

import twell
from twell import _cupy_backend as gb

rng = np.random.default_rng(0)
m, d, h = 16384, 2048, 5632
x = cupy.asarray(rng.standard_normal((m, d), dtype=np.float32))
x[:, 0] = 1.0
x = x.astype(twell.bfloat16)
w = cupy.asarray(rng.standard_normal((h, d), dtype=np.float32)) / np.sqrt(d)
w[:, 0] = -ndtri(0.99)
w = w.astype(twell.bfloat16)
sync = cupy.cuda.Device().synchronize


def wall(fn, n=30):
    """Median wall-clock ms of ``fn()`` followed by a device synchronisation."""
    for _ in range(3):
        fn()
        sync()
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        sync()
        ts.append(time.perf_counter() - t)
    return 1e3 * float(np.median(ts))


print(f"wall auto {wall(lambda: twell.matmul_to_twell(x, w)):.3f} ms, "
      f"S=13 {wall(lambda: twell.matmul_to_twell(x, w, slots=13)):.3f} ms")
print(f"wall pack_auto {wall(lambda: gb.matmul_pack_auto(x, w, 256)):.3f} ms, "
      f"pack S=13 {wall(lambda: gb.matmul_pack(x, w, 256, 13)):.3f}")
parts, slots, nnz = gb.matmul_pack_auto(x, w, 256)
print("slots", slots)
pr = cProfile.Profile()
for _ in range(3):
    gb.matmul_pack_auto(x, w, 256)
    sync()
pr.enable()
for _ in range(50):
    gb.matmul_pack_auto(x, w, 256)
    sync()
pr.disable()
for key, count in (("tottime", 25), ("cumulative", 30)):
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats(key).print_stats(count)
    print(s.getvalue()[:6000])
