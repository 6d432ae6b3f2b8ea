"""A/B of the launchers and the gated FFN (bf16, the paper's up projection; the D2T and pack
at 99%, the gated FFN at 99% and 95%), one process per library version: the eighteenth
session ran ``PYTHONPATH=scratch/old python3 ab.py old`` (4331ae7's twell and cuda_src) and
``PYTHONPATH=. python3 ab.py new`` (the working tree), twice, interleaved. CUDA events around
each synchronising call, median of 40 after 5 warm-ups."""
import sys

import cupy
import numpy as np
from scipy.special import ndtri

import twell

rng = np.random.default_rng(0)
m, d, h = 16384, 2048, 5632
x = cupy.asarray(rng.standard_normal((m, d), dtype=np.float32))
x[:, 0] = 1.0
x = x.astype(twell.bfloat16)
w0 = cupy.asarray(rng.standard_normal((h, d), dtype=np.float32)) / np.sqrt(d)
w0[:, 0] = -ndtri(0.99)
w = w0.astype(twell.bfloat16)
w0[:, 0] = -ndtri(0.95)
w95 = w0.astype(twell.bfloat16)
wu = (cupy.asarray(rng.standard_normal((h, d), dtype=np.float32)) / np.sqrt(d)).astype(w.dtype)
wd = (cupy.asarray(rng.standard_normal((d, h), dtype=np.float32)) / np.sqrt(h)).astype(w.dtype)
z = cupy.maximum(x @ w.T, 0)


def timed(fn, reps=40):
    """Median CUDA-event time of ``fn()`` in microseconds."""
    for _ in range(5):
        fn()
    ev = [(cupy.cuda.Event(), cupy.cuda.Event()) for _ in range(reps)]
    for a, b in ev:
        a.record()
        fn()
        b.record()
    ev[-1][1].synchronize()
    return 1e3 * float(np.median([cupy.cuda.get_elapsed_time(a, b) for a, b in ev]))


r = {"d2t S=13": timed(lambda: twell.matmul_to_twell(x, w, slots=13)),
     "pack S=13": timed(lambda: twell.TwELLMatrix(z, slots=13)),
     "d2t auto": timed(lambda: twell.matmul_to_twell(x, w)),
     "gated 99%": timed(lambda: twell.sparse_ffn(x, w, wu, wd)),
     "gated 95%": timed(lambda: twell.sparse_ffn(x, w95, wu, wd))}
print(sys.argv[1], " ".join(f"{k} {v:.0f}us" for k, v in r.items()), flush=True)
