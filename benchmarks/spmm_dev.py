# ruff: noqa: B023 - closures are called inside the loop iteration that defines them
"""SpMM kernel development bench: every twell SpMM variant vs dense cuBLAS on the FFN shapes.

One process, same inputs for all, CUDA events after warm-up, median. Prints a table.
Usage (GPU machine, repo root): PYTHONPATH=. python benchmarks/spmm_dev.py [--m 16384]
"""

import argparse
import functools
import json
import os

import _dev
import cupy
import numpy as np

import twell
from twell import _cupy_backend as gb
from twell import _kernels

p = argparse.ArgumentParser()
p.add_argument("--m", type=int, default=16384)
p.add_argument("--k", type=int, default=5632)
p.add_argument("--n", type=int, default=2048)
p.add_argument("--d", type=int, default=2048)
p.add_argument("--sparsities", default="0.99,0.95,0.90")
p.add_argument("--reps", type=int, default=20)
args = p.parse_args()
timed = functools.partial(_dev.timed, reps=args.reps)


rng = np.random.default_rng(0)
rows = []
bf16 = twell.bfloat16
for s in [float(v) for v in args.sparsities.split(",")]:
    z = _dev.activations(args.m, args.k, args.d, s, rng).astype(bf16)
    down = (cupy.asarray(rng.standard_normal((args.k, args.n), dtype=np.float32))
            / np.sqrt(args.k)).astype(bf16)
    ref = z.astype(np.float32) @ down.astype(np.float32)
    a = twell.TwELLMatrix(z)
    tn = a.tile_nnz()
    info = dict(sparsity=s, density=float((z != 0).mean()), slots=a.slots,
                overflow=a.overflow_nnz, max_tile=int(tn.max()), mean_tile=float(tn.mean()))
    dense_ms = timed(lambda: z @ down)
    out = {}

    def check(name, y):
        err = float(cupy.linalg.norm(y.astype(np.float32) - ref) / cupy.linalg.norm(ref))
        out[name + "_err"] = err

    # Row-warp kernel alone.
    p_ = a._parts
    common = (p_.counts, p_.data, p_.indices, p_.overflow_indptr, p_.overflow_indices,
              p_.overflow_data, np.int64(args.m), np.int64(args.k), np.int32(256),
              np.int32(a.slots))
    yes = cupy.ones((), dtype=bool)

    def rows_kernel():
        y = cupy.empty((args.m, args.n), dtype=bf16)
        kern = _kernels.function("spmm.cu", "twell_spmm_rows<__nv_bfloat16, 8, 32, 4, 1>")
        kern((args.m, -(-args.n // 1024)), (32,),  # a warp per block, 4 x 256 columns
             (*common, down, np.int64(args.n), yes, y))
        return y

    check("rows", rows_kernel())
    out["rows_ms"] = timed(rows_kernel)
    for shape in _kernels.MMA_SHAPES:
        if gb._mma_shape(bf16, 256, a.slots, down, shape) is None:
            out[f"mma{shape}_ms"] = float("nan")
            continue

        def mma(shape=shape):
            y = cupy.empty((args.m, args.n), dtype=bf16)
            gb._spmm_mma(p_, a.shape, 256, down, yes, y, shape)
            return y
        check(f"mma{shape}", mma())
        out[f"mma{shape}_ms"] = timed(mma)
    # float32 (no tensor-core kernel): twell_spmm_rows vs dense.
    z32, down32 = z.astype(np.float32), down.astype(np.float32)
    a32 = twell.TwELLMatrix(z32, slots=a.slots)
    out["f32_rows_ms"] = timed(lambda: a32 @ down32)
    out["f32_dense_ms"] = timed(lambda: z32 @ down32)
    recs = lambda: gb._block_records(p_, a.shape, 256, 32)  # noqa: E731
    out["records_ms"] = timed(recs)
    check("api", a @ down)
    out["api_ms"] = timed(lambda: a @ down)
    out["pack_ms"] = timed(lambda: twell.TwELLMatrix(z, slots=a.slots))
    out["dense_ms"] = dense_ms
    rows.append({**info, **out})
    print(json.dumps(rows[-1]), flush=True)

print(f"\n{'sparsity':>8} {'slots':>5} {'dense':>7} {'rows':>7} "
      + " ".join(f"{str(sh):>9}" for sh in _kernels.MMA_SHAPES)
      + f" {'api':>7} {'x dense':>7} {'pack':>6} {'f32 rows':>8} {'f32 dns':>8}")
for r in rows:
    best = r["api_ms"]
    print(f"{r['sparsity']:>8} {r['slots']:>5} {r['dense_ms']:7.3f} {r['rows_ms']:7.3f} "
          + " ".join(f"{r[f'mma{sh}_ms']:9.3f}" for sh in _kernels.MMA_SHAPES)
          + f" {best:7.3f} {r['dense_ms'] / best:7.2f} {r['pack_ms']:6.3f}"
          f" {r['f32_rows_ms']:8.3f} {r['f32_dense_ms']:8.3f}")
if os.environ.get("OUT"):
    json.dump(rows, open(os.path.join(os.environ["OUT"], "spmm_dev.json"), "w"), indent=1)
