"""D2T at the paper's up projection, bf16 99% (M = 16384, K = 2048 -> N = 5632): where
matmul_to_twell spends its time with the TMA kernel and the fused-count sample.

Calls 3 and 7 of the fourteenth session (call3_d2t.txt, call7_d2t.txt beside this file);
from the repository root on a GPU: ``PYTHONPATH=. python <this file>``."""
import sys

sys.path.insert(0, "benchmarks")
import _dev  # noqa: E402
import cupy  # noqa: E402
import numpy as np  # noqa: E402
from scipy.special import ndtri  # noqa: E402

import twell  # noqa: E402
from twell import _cupy_backend as gb  # noqa: E402
from twell import _ffn  # noqa: E402

rng = np.random.default_rng(0)
m, n, k, s = 16384, 5632, 2048, 0.99
bf = twell.bfloat16
x = cupy.asarray(rng.standard_normal((m, k), dtype=np.float32))
w = cupy.asarray(rng.standard_normal((n, k), dtype=np.float32)) / np.sqrt(k)
x[:, 0] = 1.0
w[:, 0] = -ndtri(s)
x, w = x.astype(bf), w.astype(bf)
auto = twell.matmul_to_twell(x, w)
S = auto.slots
print("auto slots", S, "overflow", auto.overflow_nnz, "nnz", auto.nnz, flush=True)
# bits: sm90 vs mma on the full shape
a = gb.matmul_pack(x, w, 256, 13, variant="sm90")
b = gb.matmul_pack(x, w, 256, 13, variant="mma")
same = all(bool(cupy.array_equal(p.view(np.uint8), q.view(np.uint8)))
           for p, q in zip(a, b, strict=True))
print("sm90 == mma bits at the paper shape:", same, flush=True)
step = max(1, -(-m // _ffn._SAMPLE_ROWS))
rows = cupy.ascontiguousarray(x[::step])


def t(name, fn, reps=30):
    print(f"{name:52s} {_dev.timed(fn, reps):7.3f} ms", flush=True)


t("cupy.matmul (cuBLAS GEMM)", lambda: cupy.matmul(x, w.T))
t("composed: relu(matmul) + TwELLMatrix(slots=13)",
  lambda: twell.TwELLMatrix(cupy.maximum(cupy.matmul(x, w.T), 0), slots=13))
t("matmul_to_twell auto", lambda: twell.matmul_to_twell(x, w))
t(f"matmul_to_twell S={S}", lambda: twell.matmul_to_twell(x, w, slots=S))
t("matmul_to_twell S=13", lambda: twell.matmul_to_twell(x, w, slots=13))
t("  sample: matmul_tile_counts (1024 rows)", lambda: gb.matmul_tile_counts(rows, w, 256))
t("  sample: counts + histogram + sync",
  lambda: _ffn._slots_from_counts(gb.matmul_tile_counts(rows, w, 256), 256, m))
for v in ("sm90", "mma"):
    for sl in (S, 13):
        t(f"  matmul_pack {v} S={sl}", lambda v=v, sl=sl: gb.matmul_pack(x, w, 256, sl, variant=v))
t("  matmul_tile_counts (all rows, sm90)", lambda: gb.matmul_tile_counts(x, w, 256))
