"""The shipped slots pass once for ncu's per-instruction counters (twenty-second session,
call 5): bf16, the paper's activations at 99% (M 16384, K 5632), tile width 256, 6 slots;
the first launch warms up, the second is profiled (--launch-skip 1).
Usage (repository root, on the GPU):
    ncu ... python3 benchmarks/results/2026-12-04-h200-v/pack_sass.py
"""
import sys

sys.path.insert(0, "benchmarks")
import _dev  # noqa: E402
import cupy  # noqa: E402
import numpy as np  # noqa: E402

import twell  # noqa: E402
from twell import _cupy_backend as gb  # noqa: E402
from twell import _layout  # noqa: E402

M, K, T, S = 16384, 5632, 256, 6
z = _dev.activations(M, K, 2048, 0.99, np.random.default_rng(0)).astype(twell.bfloat16)
nt = _layout.n_tiles(K, T)
parts = gb._empty_parts(M, nt, S, z.dtype, zeroed=False, overflow=False)
totals = cupy.empty((M, nt), dtype=_layout.COUNT_DTYPE)
counter = cupy.zeros(1, dtype=np.uint64)
for _ in range(2):
    gb._launch_pack_dense(z, T, S, gb._MODE_SLOTS, totals, parts, None, counter)
cupy.cuda.Device().synchronize()
