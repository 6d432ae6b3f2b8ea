"""initcheck vs cuBLAS outputs: python init_exp.py M"""
import sys

import cupy as cp
import ml_dtypes
import numpy as np

from twell import _cupy_backend

m, k, n = int(sys.argv[1]), 4096, 11008
rng = np.random.default_rng(0)
xh = (rng.standard_normal((m, k)) / 64).astype(ml_dtypes.bfloat16)
wh = rng.standard_normal((n, k)).astype(ml_dtypes.bfloat16)
x, w = cp.asarray(xh), cp.asarray(wh)
z = cp.matmul(x, w.T)                      # cuBLAS, bf16 out
f = _cupy_backend.cast(z, np.float32)      # twell_cast reads every element
want = cp.asarray(xh.astype(np.float32)) @ cp.asarray(wh.astype(np.float32)).T
bad = int((cp.abs(f - want) > 0.02 * cp.abs(want) + 0.05).sum())
print(f"M={m}: {z.size} outputs, {bad} differ from the fp32 product (so cuBLAS wrote them all)")
