"""Where matmul_to_twell and TwELLMatrix(z) with slots="auto" spend their time (bf16 99%).

Call 4 of the thirteenth session (the output is call4_d2t_prof.txt beside this file; the
script is kept as run, reformatted for the linter). From the repository root on a GPU:
``PYTHONPATH=. python benchmarks/results/2026-12-04-h200-m/d2t_prof.py``.
"""

import cProfile
import io
import pstats
import sys

sys.path.insert(0, "benchmarks")
import _dev  # noqa: E402
import cupy  # noqa: E402
import numpy as np  # noqa: E402
from cupyx.profiler import benchmark  # noqa: E402
from scipy.special import ndtri  # noqa: E402

import twell  # noqa: E402
from twell import _cupy_backend as gb  # noqa: E402
from twell import _ffn  # noqa: E402

rng = np.random.default_rng(0)
m, k, d, s = 16384, 5632, 2048, 0.99
bf = twell.bfloat16
x = cupy.asarray(rng.standard_normal((m, d), dtype=np.float32))
w = cupy.asarray(rng.standard_normal((k, d), dtype=np.float32)) / np.sqrt(d)
x[:, 0] = 1.0
w[:, 0] = -ndtri(s)
x, w = x.astype(bf), w.astype(bf)
z = cupy.maximum(x @ w.T, 0)
auto = twell.matmul_to_twell(x, w)
S = auto.slots
print("auto slots", S, "overflow", auto.overflow_nnz, "nnz", auto.nnz)


def bench(name, fn):
    r = benchmark(fn, n_repeat=40, n_warmup=5)
    print(f"{name:48s} events {_dev.timed(fn, 30):7.3f} ms   "
          f"cpu {np.median(r.cpu_times) * 1e3:7.3f}  gpu {np.median(r.gpu_times[0]) * 1e3:7.3f}",
          flush=True)


def sample_product():
    rows = cupy.ascontiguousarray(x[::step])
    return cupy.maximum(cupy.matmul(rows, w.T).astype(np.float32), 0)


step = max(1, -(-m // _ffn._SAMPLE_ROWS))
sample = sample_product()
bench("matmul_to_twell auto", lambda: twell.matmul_to_twell(x, w))
bench(f"matmul_to_twell S={S}", lambda: twell.matmul_to_twell(x, w, slots=S))
bench("matmul_to_twell S=13", lambda: twell.matmul_to_twell(x, w, slots=13))
bench("  sample matmul+cast+relu", sample_product)
bench("  _sample_slots", lambda: _ffn._sample_slots(gb, sample, 256, m))
bench(f"  gb.matmul_pack S={S}", lambda: gb.matmul_pack(x, w, 256, S))
bench("  gb.matmul_pack S=13", lambda: gb.matmul_pack(x, w, 256, 13))
bench("  gb.matmul_pack S=32", lambda: gb.matmul_pack(x, w, 256, 32))
totals = cupy.asarray(rng.integers(0, 12, size=(m, 22)), dtype=np.int32)
bench("  _overflow_offsets (cumsum 360K)", lambda: gb._overflow_offsets(totals, S))
bench("  TwELLMatrix._from_parts",
      lambda: twell.TwELLMatrix._from_parts(auto._parts, auto.shape, 256, None))
bench("TwELLMatrix(z) auto", lambda: twell.TwELLMatrix(z))
bench(f"TwELLMatrix(z, slots={S})", lambda: twell.TwELLMatrix(z, slots=S))
bench("TwELLMatrix(z, slots=13)", lambda: twell.TwELLMatrix(z, slots=13))
for name, fn in (("matmul_to_twell auto", lambda: twell.matmul_to_twell(x, w)),
                 ("TwELLMatrix(z) auto", lambda: twell.TwELLMatrix(z))):
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(50):
        fn()
    cupy.cuda.Device().synchronize()
    profile.disable()
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(14)
    print("==", name, "(50 calls)")
    print(out.getvalue()[-3000:])
