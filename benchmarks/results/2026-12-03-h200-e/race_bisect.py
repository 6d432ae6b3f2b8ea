"""One racecheck bisection case: python race_bisect.py CASE"""
import sys

import cupy as cp
import ml_dtypes
import numpy as np

import twell

case = sys.argv[1]
m, k, n = (1000, 4096, 11008)
if case.startswith("k512"):
    k = 512
if case.startswith("n2048"):
    n = 2048
if case.startswith("m128"):
    m = 128
rng = np.random.default_rng(0)
x = cp.asarray((rng.standard_normal((m, k)) / np.sqrt(k)).astype(ml_dtypes.bfloat16))
w = cp.asarray(rng.standard_normal((n, k)).astype(ml_dtypes.bfloat16))
if case == "cublas":
    z = cp.matmul(x, w.T)
    cp.cuda.runtime.deviceSynchronize()
    print("ok cublas", float(cp.abs(z.astype(cp.float32)).sum()))
    sys.exit(0)
slots = "auto" if not case.endswith("s13") else 13
a = twell.matmul_to_twell(x, w, slots=slots)
cp.cuda.runtime.deviceSynchronize()
print("ok", case, a.nnz, a.slots)
