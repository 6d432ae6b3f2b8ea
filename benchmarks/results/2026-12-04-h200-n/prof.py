"""Host-side cost of matmul_to_twell(slots="auto") at the paper's D2T shape, bf16 99%.

Call 5 of the fourteenth session (call5_prof.txt beside this file, the profile's paths
shortened)."""
import cProfile
import io
import pstats
import sys
import time

sys.path.insert(0, "benchmarks")
import _dev  # noqa: E402
import cupy  # noqa: E402
import numpy as np  # noqa: E402
from cupy._core import _accelerator  # noqa: E402
from scipy.special import ndtri  # noqa: E402

import twell  # noqa: E402
from twell import _cupy_backend as gb  # noqa: E402
from twell import _ffn  # noqa: E402

rng = np.random.default_rng(0)
m, n, k = 16384, 5632, 2048
x = cupy.asarray(rng.standard_normal((m, k), dtype=np.float32))
w = cupy.asarray(rng.standard_normal((n, k), dtype=np.float32)) / np.sqrt(k)
x[:, 0] = 1.0
w[:, 0] = -ndtri(0.99)
x, w = x.astype(twell.bfloat16), w.astype(twell.bfloat16)
rows = cupy.ascontiguousarray(x[::16])
print("accelerators", _accelerator.get_routine_accelerators(),
      _accelerator.get_reduction_accelerators())


def wall(fn, reps=30):
    for _ in range(3):
        fn()
    cupy.cuda.Device().synchronize()
    t = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        cupy.cuda.Device().synchronize()
        t.append(time.perf_counter() - t0)
    return np.median(t) * 1e3


def show(name, fn):
    print(f"{name:50s} wall {wall(fn):7.3f}  events {_dev.timed(fn, 30):7.3f} ms", flush=True)


totals = gb.matmul_tile_counts(x, w, 256)
show("matmul_to_twell auto", lambda: twell.matmul_to_twell(x, w))
show("matmul_to_twell S=6", lambda: twell.matmul_to_twell(x, w, slots=6))
show("matmul_to_twell S=13", lambda: twell.matmul_to_twell(x, w, slots=13))
show("matmul_to_twell S=20", lambda: twell.matmul_to_twell(x, w, slots=20))
show("matmul_tile_counts 1024 rows", lambda: gb.matmul_tile_counts(rows, w, 256))
show("  + _slots_from_counts", lambda: _ffn._slots_from_counts(
    gb.matmul_tile_counts(rows, w, 256), 256, m))
c = gb.matmul_tile_counts(rows, w, 256)
show("_slots_from_counts alone", lambda: _ffn._slots_from_counts(c, 256, m))
show("count_histogram alone (no get)", lambda: gb.count_histogram(c, 257))
show("ascontiguousarray(x[::16])", lambda: cupy.ascontiguousarray(x[::16]))
show("_overflow_offsets (360k)", lambda: gb._overflow_offsets(totals, 6))
_accelerator.set_routine_accelerators(["cub"])
show("_overflow_offsets (360k) with cub", lambda: gb._overflow_offsets(totals, 6))
_accelerator.set_routine_accelerators([])
show("_overflow_offsets (360k) without", lambda: gb._overflow_offsets(totals, 6))
show("cupy.zeros(1, uint64)", lambda: cupy.zeros(1, np.uint64))
show("cupy.empty x8", lambda: [cupy.empty(1000, np.int32) for _ in range(8)])
for name, fn in (("auto", lambda: twell.matmul_to_twell(x, w)),
                 ("S=13", lambda: twell.matmul_to_twell(x, w, slots=13))):
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(50):
        fn()
    cupy.cuda.Device().synchronize()
    profile.disable()
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(18)
    print("==", name, "(50 calls)")
    print(out.getvalue()[-3500:])
