"""Where ``TwELLMatrix(z)`` and ``TwELLMatrix(z, slots=13)`` spend their time besides the
kernels (twenty-first session, call 10; the D2T's version is
``results/2026-12-04-h200-r/gaps.py``, whose method this is).

Each step of the dense pack's path (functions of ``twell._twell``, ``twell._convert``,
``twell._cupy_backend`` and ``twell._layout``) is wrapped to record a CUDA event and the host
clock as it starts and ends; between consecutive marks a call's events give the GPU's time
and the clock the host's (the GPU is idle at the call's start, so an event records when the
host got there if nothing is queued before it). Medians of 20 calls after 3 warm-ups,
microseconds; bf16 activations at 99%, M 16384, K 5632 (the bias-column trick). The wrappers
cost a few microseconds of host time each.
Usage (repository root):
    PYTHONPATH=. python3 benchmarks/results/2026-12-04-h200-u/pack_gaps.py
"""
import collections
import sys
import time

sys.path.insert(0, "benchmarks")  # run from the repository root
import _dev  # noqa: E402
import cupy  # noqa: E402
import numpy as np  # noqa: E402

import twell  # noqa: E402
from twell import _convert, _layout, _twell  # noqa: E402
from twell import _cupy_backend as gb  # noqa: E402

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


for name in ("tile_counts_dense", "pack_dense", "_empty_parts", "_count_buffer",
             "_launch_pack_dense", "_no_overflow", "_read_counts", "_overflow_offsets",
             "_with_overflow", "count_histogram"):
    wrap(gb, name)
for name in ("auto_choice", "checked_histogram"):
    wrap(_layout, name)
wrap(_convert, "coerce")
for name in ("_pack", "_tile_counts_histogram"):
    wrap(_twell, name)

z = _dev.activations(16384, 5632, 2048, 0.99, np.random.default_rng(0)).astype(twell.bfloat16)


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


breakdown("TwELLMatrix(z, slots=13)", lambda: twell.TwELLMatrix(z, slots=13))
breakdown("TwELLMatrix(z) (auto)", lambda: twell.TwELLMatrix(z))
