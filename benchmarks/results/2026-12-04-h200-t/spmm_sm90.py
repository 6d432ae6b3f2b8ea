"""The Hopper SpMM that builds A in shared memory (twell_spmm_sm90) against the gather kernel,
A.toarray() + cuBLAS and cuBLAS on the dense A, on the paper's down projection (M = 16384,
K = 5632, N = 2048, bf16, uniform activations by the bias-column trick), interleaved in one
process: every way on the same inputs, CUDA events, medians, two passes.

Run from the repository root: PYTHONPATH=. python3 benchmarks/results/2026-12-04-h200-t/spmm_sm90.py
"""

import sys

import cupy
import numpy as np

sys.path.insert(0, "benchmarks")
import _dev  # noqa: E402

import twell  # noqa: E402
from twell import _cupy_backend  # noqa: E402

M, K, N = 16384, 5632, 2048
rng = np.random.default_rng(0)
dt = twell.bfloat16
b = (cupy.asarray(rng.standard_normal((K, N), dtype=np.float32)) / np.sqrt(K)).astype(dt)
bt = cupy.ascontiguousarray(b.T)


def way(a, v):
    return lambda: _cupy_backend.spmm(a._parts, a.shape, a.tile_width, b, a.dtype, variant=v)


rows = []
for s in (0.999, 0.99, 0.95, 0.90):
    z = _dev.activations(M, K, 2048, s, rng).astype(dt)
    a = twell.TwELLMatrix(z)
    want = z.astype(np.float32) @ b.astype(np.float32)
    scale = float(cupy.abs(want).max())
    for v in ("sm90", "rows", "dense"):
        got = way(a, v)().astype(np.float32)
        err = float(cupy.abs(got - want).max()) / scale
        assert err < 2e-2, (s, v, err)
    ways = {"fused (spmm: b.T copied, nonfinite check)": way(a, "sm90"),
            "fused kernel alone (b.T given)": lambda a=a: _cupy_backend._spmm_sm90(
                a._parts, a.shape, a.tile_width, bt, a.dtype),
            "gather": way(a, "rows"), "toarray + cuBLAS": way(a, "dense"),
            "cuBLAS dense": lambda z=z: z @ b}
    times = {w: [] for w in ways}
    for _ in range(2):
        for w, f in ways.items():
            times[w].append(_dev.timed(f, 20))
    default = _cupy_backend.spmm_way(M, K, N, a.dtype, a._nnz_hint, a.tile_width)
    rows.append((s, a.slots, a.overflow_nnz, default, times))
    del z, a, want

print(f"\nH200 SpMM, M={M} K={K} N={N} bf16; ms, two interleaved passes")
for s, slots, over, default, times in rows:
    print(f"\nsparsity {s}: slots auto {slots}, overflow {over}, default way {default}")
    for w, t in times.items():
        print(f"  {w:42s} " + " / ".join(f"{x:.3f}" for x in t))
