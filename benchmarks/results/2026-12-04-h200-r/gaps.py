"""Where the D2T and the gated FFN spend their time besides the kernels (eighteenth session).

Each of the launcher's steps (functions of ``twell._cupy_backend`` and ``twell._layout``) is
wrapped to record a CUDA event and the host clock as it starts and ends; a call's marks give,
between consecutive marks, the host's time and the GPU's (the GPU is idle at the call's start,
so an event records when the host got there if nothing is queued before it). Medians of 20
calls after 3 warm-ups, microseconds; bf16, the paper's shapes (M 16384, D 2048, H 5632).
The wrappers cost a few microseconds of host time each.
Usage (repository root): PYTHONPATH=. python3 benchmarks/results/2026-12-04-h200-r/gaps.py
"""
import collections
import sys
import time

sys.path.insert(0, "benchmarks")  # run from the repository root
import _dev  # noqa: E402
import cupy  # noqa: E402
import numpy as np  # noqa: E402

import twell  # noqa: E402
from twell import _cupy_backend as gb  # noqa: E402
from twell import _layout  # noqa: E402

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

x, w0, wu, wd = _dev.ffn_operands(16384, 2048, 5632, twell.bfloat16)
w = _dev.gate_weight(w0, 0.99, twell.bfloat16)

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
