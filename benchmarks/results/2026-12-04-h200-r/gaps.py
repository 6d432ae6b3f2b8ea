"""Where the D2T and the gated FFN spend their time besides the kernels (eighteenth session).

Each of the launcher's steps (functions of ``twell._cupy_backend`` and ``twell._layout``) is
wrapped to record a CUDA event and the host clock as it starts and ends; a call's marks give,
between consecutive marks, the host's time and the GPU's (the GPU is idle at the call's start,
so an event records when the host got there if nothing is queued before it). Medians of 20
calls after 3 warm-ups, microseconds; bf16, the paper's shapes (M 16384, D 2048, H 5632).
The wrappers cost a few microseconds of host time each.
Usage: PYTHONPATH=. python3 gaps.py
"""
import collections
import time

import cupy
import numpy as np
from scipy.special import ndtri

import twell
from twell import _cupy_backend as gb
from twell import _layout

marks = []


def mark(name):
    e = cupy.cuda.Event()
    e.record()
    marks.append((name, time.perf_counter(), e))


def wrap(module, name):
    inner = getattr(module, name)

    def wrapped(*args, **kwargs):
        mark(f"{name}>")
        result = inner(*args, **kwargs)
        mark(f"{name}<")
        return result

    setattr(module, name, wrapped)


for name in ("matmul_plan", "_empty_parts", "_count_buffer", "_launch_matmul_pack",
             "_no_overflow", "_read_counts", "_overflow_offsets", "_with_overflow",
             "matmul_pack", "matmul_pack_auto", "gated_up", "_gemm_nt_float32", "spmm",
             "to_dense", "_nonfinite"):
    wrap(gb, name)
for name in ("auto_choice", "checked_histogram"):
    wrap(_layout, name)

rng = np.random.default_rng(0)
m, d, h = 16384, 2048, 5632
x = cupy.asarray(rng.standard_normal((m, d), dtype=np.float32))
x[:, 0] = 1.0
x = x.astype(twell.bfloat16)
w0 = cupy.asarray(rng.standard_normal((h, d), dtype=np.float32)) / np.sqrt(d)
w0[:, 0] = -ndtri(0.99)
w = w0.astype(twell.bfloat16)
wu = (cupy.asarray(rng.standard_normal((h, d), dtype=np.float32)) / np.sqrt(d)).astype(w.dtype)
wd = (cupy.asarray(rng.standard_normal((d, h), dtype=np.float32)) / np.sqrt(h)).astype(w.dtype)


def breakdown(label, fn, reps=20):
    for _ in range(3):
        fn()
    cupy.cuda.Device().synchronize()
    host, gpu, total = collections.defaultdict(list), collections.defaultdict(list), []
    for _ in range(reps):
        marks.clear()
        mark("call>")
        fn()
        mark("call<")
        marks[-1][2].synchronize()
        total.append(cupy.cuda.get_elapsed_time(marks[0][2], marks[-1][2]) * 1e3)
        for i, ((a, ta, ea), (b, tb, eb)) in enumerate(zip(marks[:-1], marks[1:], strict=True)):
            key = f"{i:2d} {a} -> {b}"
            host[key].append((tb - ta) * 1e6)
            gpu[key].append(cupy.cuda.get_elapsed_time(ea, eb) * 1e3)
    print(f"\n## {label}: {np.median(total):.0f} us between the first and last event")
    print(f"{'step':<58} {'host us':>8} {'GPU us':>8}")
    for key in host:
        print(f"{key:<58} {np.median(host[key]):8.1f} {np.median(gpu[key]):8.1f}")


breakdown("matmul_to_twell(x, w, slots=13)", lambda: twell.matmul_to_twell(x, w, slots=13))
breakdown("matmul_to_twell(x, w) (auto)", lambda: twell.matmul_to_twell(x, w))
breakdown("sparse_ffn(x, w, wu, wd) at 99%", lambda: twell.sparse_ffn(x, w, wu, wd))
