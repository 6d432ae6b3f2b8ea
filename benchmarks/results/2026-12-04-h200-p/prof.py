"""cProfile of the host side of matmul_to_twell (auto and 13 slots), bf16 99%, paper shapes;
then d2t auto with a 512- and a 1024-row sample. Sixteenth GPU session, call 4, on the tree
of 710eb31 without the early scan (README.md beside this file)."""
import cProfile
import pstats
import sys

import cupy
import numpy as np
from scipy.special import ndtri

import twell

rng = np.random.default_rng(0)
m, n, k = 16384, 5632, 2048
x = cupy.asarray(rng.standard_normal((m, k), dtype=np.float32))
w = cupy.asarray(rng.standard_normal((n, k), dtype=np.float32)) / np.sqrt(k)
x[:, 0] = 1.0
w[:, 0] = -ndtri(0.99)
x, w = x.astype(twell.bfloat16), w.astype(twell.bfloat16)
for slots in ("auto", 13):
    for _ in range(5):
        twell.matmul_to_twell(x, w, slots=slots)
    cupy.cuda.Device().synchronize()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(100):
        twell.matmul_to_twell(x, w, slots=slots)
    pr.disable()
    print(f"===== slots={slots} (100 calls; times in s per 100 calls)")
    st = pstats.Stats(pr, stream=sys.stdout)
    st.sort_stats("tottime").print_stats(28)

sys.path.insert(0, "benchmarks")
import _dev  # noqa: E402

from twell import _ffn  # noqa: E402

for rows in (1024, 512, 1024, 512):
    _ffn._SAMPLE_ROWS = rows
    t = _dev.timed(lambda: twell.matmul_to_twell(x, w), 40)
    print(f"SAMPLE {rows:5d} rows: d2t auto {t * 1e3:7.1f} us, slots "
          f"{twell.matmul_to_twell(x, w).slots}")
