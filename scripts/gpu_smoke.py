"""Quick GPU-vs-NumPy agreement check of every CuPy primitive (a developer's smoke test).

The test-suite is the real check; this prints one line per case, fast, for a first look at
new kernels. Usage: PYTHONPATH=. python scripts/gpu_smoke.py
"""

import itertools
import sys

import cupy
import numpy as np

import twell
from twell import _cupy_backend as gb
from twell import _numpy_backend as nb

rng = np.random.default_rng(0)
failures = 0


def check(name, ok):
    global failures
    failures += not ok
    if not ok and failures <= 25:
        print("FAIL", name, flush=True)


for dtype, (m, k), t, s, density in itertools.product(
    [np.float64, np.float32, np.float16, twell.bfloat16],
    [(0, 5), (3, 0), (1, 1), (37, 300), (64, 512), (5, 1000)],
    [1, 3, 16, 256],
    [1, 2, 7],
    [0.02, 0.3, 1.0],
):
    if s > t:
        continue
    x = (rng.standard_normal((m, k)) * (rng.random((m, k)) < density)).astype(dtype)
    if x.size:
        x.reshape(-1)[rng.integers(0, x.size, 2)] = np.nan
    xd = cupy.asarray(x)
    case = f"{np.dtype(dtype).name} {m}x{k} T={t} S={s} d={density}"
    ref = nb.pack_dense(x, t, s)
    got = gb.pack_dense(xd, t, s)
    for f, r, g in zip(ref._fields, ref, got, strict=True):
        eq = np.array_equal(r.view(np.uint8) if r.dtype == twell.bfloat16 else r,
                            g.get().view(np.uint8) if r.dtype == twell.bfloat16 else g.get(),
                            equal_nan=r.dtype != twell.bfloat16)
        check(f"pack_dense {f} {case}", eq and r.shape == g.shape)
    check(f"tile_counts {case}", np.array_equal(nb.tile_counts_dense(x, t),
                                                gb.tile_counts_dense(xd, t).get()))
    indptr, indices, data = nb.to_csr(ref, (m, k), t)
    got2 = gb.pack_csr(cupy.asarray(indptr), cupy.asarray(indices), cupy.asarray(data),
                       (m, k), t, s)
    same = [np.array_equal(np.asarray(r).view(np.uint8), g.get().view(np.uint8))
            for r, g in zip(ref, got2, strict=True)]
    check(f"pack_csr {case}", all(same))
    dense_back = gb.to_dense(got, (m, k), t).get()
    check(f"to_dense {case}", np.array_equal(dense_back.astype(np.float64), x.astype(np.float64),
                                             equal_nan=True))
    ci, cj, cd = gb.to_csr(got, (m, k), t)
    check(f"to_csr {case}", np.array_equal(ci.get(), indptr) and np.array_equal(cj.get(), indices)
          and np.array_equal(cd.get().astype(np.float64), data.astype(np.float64), equal_nan=True))
    for n in (1, 5, 64):
        xf = np.nan_to_num(x.astype(np.float64))
        clean = nb.pack_dense(xf.astype(dtype), t, s)
        b = rng.standard_normal((k, n)).astype(dtype)
        want = nb.spmm(clean, (m, k), t, b, np.dtype(dtype)).astype(np.float64)
        have = gb.spmm(twell._algorithms.Parts(*(cupy.asarray(a) for a in clean)), (m, k), t,
                       cupy.asarray(b), np.dtype(dtype)).get().astype(np.float64)
        err = np.linalg.norm(have - want) / max(np.linalg.norm(want), 1e-30)
        tol = {8: 1e-12, 4: 1e-5}.get(np.dtype(dtype).itemsize, 1e-2)
        check(f"spmm n={n} {case} err={err:.2e}", err <= tol and have.shape == want.shape)

# Non-finite B: the tensor-core path must hand over to the row kernel (0 * Inf).
for dtype in (np.float16, twell.bfloat16):
    x = (rng.standard_normal((40, 600)) * (rng.random((40, 600)) < 0.05)).astype(dtype)
    b = rng.standard_normal((600, 64)).astype(dtype)
    b[5, 3] = np.inf
    want = nb.spmm(nb.pack_dense(x, 256, 4), (40, 600), 256, b, np.dtype(dtype))
    have = (twell.TwELLMatrix(cupy.asarray(x), slots=4) @ cupy.asarray(b)).get()
    check(f"spmm inf {np.dtype(dtype).name}",
          np.array_equal(np.isnan(want.astype(np.float64)), np.isnan(have.astype(np.float64))))

print(f"gpu smoke: {failures} failures")
sys.exit(1 if failures else 0)
