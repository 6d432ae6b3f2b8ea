"""cProfile of the D2T launchers' host work (eighteenth session): 200 calls of
matmul_to_twell(x, w, slots=13) and of slots="auto", bf16, 99%, the paper's up projection.
The GPU time hides in the read-back (``get``); everything else is the host's.
Usage: PYTHONPATH=. python3 host_prof.py"""
import cProfile
import pstats

import cupy
import numpy as np
from scipy.special import ndtri

import twell

rng = np.random.default_rng(0)
m, d, h = 16384, 2048, 5632
x = cupy.asarray(rng.standard_normal((m, d), dtype=np.float32))
x[:, 0] = 1.0
x = x.astype(twell.bfloat16)
w = cupy.asarray(rng.standard_normal((h, d), dtype=np.float32)) / np.sqrt(d)
w[:, 0] = -ndtri(0.99)
w = w.astype(twell.bfloat16)
for slots in (13, "auto"):
    for _ in range(5):
        twell.matmul_to_twell(x, w, slots=slots)
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(200):
        twell.matmul_to_twell(x, w, slots=slots)
    profile.disable()
    print(f"\n## matmul_to_twell(x, w, slots={slots!r}), 200 calls")
    pstats.Stats(profile).sort_stats("tottime").print_stats(22)
