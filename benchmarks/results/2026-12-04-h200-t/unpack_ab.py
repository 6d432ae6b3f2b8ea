"""twell_unpack_dense before (c22b014's unpack.cu, from scratch/old) and after (the working
tree's: windows staged in shared memory), in one process on the same TwELL parts: the paper's
down-projection activations (M = 16384, K = 5632, bf16, uniform, slots="auto"), both outputs
compared bit for bit, each kernel timed alone (CUDA events, medians, two interleaved passes)
against a copy of the dense matrix; then A.toarray() and A @ B by A.toarray() + cuBLAS
(N = 2048) through the launcher against cuBLAS on the dense A.

Run from the repository root: PYTHONPATH=. python3 benchmarks/results/2026-12-04-h200-t/unpack_ab.py
"""

import pathlib
import sys

import cupy
import numpy as np

sys.path.insert(0, "benchmarks")
import _dev  # noqa: E402

import twell  # noqa: E402
from twell import _cupy_backend, _kernels  # noqa: E402

M, K, N = 16384, 5632, 2048
EXPR = "twell_unpack_dense<__nv_bfloat16, 8>"
old_dir = pathlib.Path("scratch/old/cuda_src")
out = []
_kernels._inline(old_dir, "unpack.cu", out, set())
old = cupy.RawModule(code="\n".join(out) + "\n", options=_kernels.OPTIONS,
                     name_expressions=[EXPR]).get_function(EXPR)
new = _kernels.function("unpack.cu", EXPR)

rng = np.random.default_rng(0)
b = (cupy.asarray(rng.standard_normal((K, N), dtype=np.float32)) / np.sqrt(K)).astype(
    twell.bfloat16)
rows = []
for s in (0.99, 0.95, 0.90):
    z = _dev.activations(M, K, 2048, s, rng).astype(twell.bfloat16)
    a = twell.TwELLMatrix(z)
    p = a._parts
    outs = {}

    def launch(kernel, o, p=p, a=a):
        kernel((-(-M * p.counts.shape[1] // 8),), (256,), (
            p.counts, p.data, p.indices, np.int64(M), np.int64(K), np.int32(a.tile_width),
            np.int32(p.data.shape[2]), o))

    for name, kernel in (("old", old), ("new", new)):
        o = cupy.full((M, K), np.nan, dtype=z.dtype)
        launch(kernel, o)
        outs[name] = o
    same = bool(cupy.array_equal(outs["old"].view(np.uint16), outs["new"].view(np.uint16)))
    whole = bool(cupy.array_equal(a.toarray().view(np.uint16), z.view(np.uint16)))
    o = outs["new"]
    ways = {"unpack kernel, old": lambda o=o: launch(old, o),
            "unpack kernel, new": lambda o=o: launch(new, o),
            "copy of the dense A": lambda z=z: z.copy(),
            "A.toarray() (new, with overflow)": lambda a=a: a.toarray(),
            "A @ B, toarray + cuBLAS": lambda a=a, p=p: _cupy_backend.spmm(
                p, a.shape, a.tile_width, b, a.dtype, variant="dense"),
            "cuBLAS dense": lambda z=z: z @ b}
    times = {w: [] for w in ways}
    for _ in range(2):
        for w, f in ways.items():
            times[w].append(_dev.timed(f, 20))
    rows.append((s, a.slots, a.overflow_nnz, a.nbytes, same, whole, times))
    del z, a, p, outs, o

print(f"\nH200 twell_unpack_dense A/B, M={M} K={K} bf16 (B: N={N}); ms, two passes")
for s, slots, over, nbytes, same, whole, times in rows:
    print(f"\nsparsity {s}: slots {slots}, overflow {over}; old and new bits equal: {same}; "
          f"toarray == A: {whole}")
    dense = M * K * 2
    for w, t in times.items():
        extra = ""
        if w.startswith("unpack"):
            gbs = (dense + nbytes) / (min(t) * 1e-3) / 1e9
            extra = f"  ({gbs:.0f} GB/s of read + write)"
        elif w.startswith("copy"):
            extra = f"  ({2 * dense / (min(t) * 1e-3) / 1e9:.0f} GB/s)"
        print(f"  {w:34s} " + " / ".join(f"{x:.3f}" for x in t) + extra)
