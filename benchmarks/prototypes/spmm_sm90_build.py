"""Prototype twell_spmm_sm90 (spmm_sm90_build.cu): A @ B on Hopper as a wgmma GEMM whose A
operand a builder thread per row writes into shared memory from the TwELL arrays, B^T by TMA.

Checks it on small shapes (partial blocks, odd N, tile widths 64-512, slots 1-40 with the
overflow, outputs poisoned) within the bound of a float32 sum rounded once, then times it
alone and through a transposed copy of B against the gather kernel, A.toarray() + cuBLAS and
cuBLAS on the dense A at the paper's down projection (M = 16384, K = 5632, N = 2048, bf16,
uniform activations), interleaved, two passes.

Run on an H100/H200 from the repository root:
    PYTHONPATH=. timeout 300 python benchmarks/prototypes/spmm_sm90_build.py
"""

import pathlib
import sys

import cupy
import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
import _dev  # noqa: E402
from matmul_pack_sm90_cluster import compile_prototype  # noqa: E402

import twell  # noqa: E402
from twell import _cupy_backend, _kernels  # noqa: E402

CHUNKS = (8, 16, 32)
KERNELS = dict(zip(CHUNKS, compile_prototype(
    "spmm_sm90_build.cu", [f"twell_spmm_sm90_bf16_c{c}" for c in CHUNKS]), strict=True))
SMEM = _cupy_backend._MATMUL_SM90_SMEM  # the D2T's ring: 4 stages of 48 KB, barriers, slack


def spmm(a, bt):
    """``a @ bt.T`` (bf16 TwELL ``a``, C-contiguous ``bt`` (N, K)) by the prototype."""
    (m, k), n, p = a.shape, bt.shape[0], a._parts
    slots = p.data.shape[2]
    kernel = KERNELS[next((c for c in CHUNKS if slots <= c), CHUNKS[-1])]
    kernel.max_dynamic_shared_size_bytes = SMEM
    out = cupy.empty((m, n), dtype=a.dtype)
    kernel((-(-m // 128) * -(-n // 256),), (384,), (
        _kernels.tensor_map_2d(bt, 64, 256), p.counts, p.data, p.indices, p.overflow_indptr,
        p.overflow_indices, p.overflow_data, np.int64(m), np.int64(n), np.int64(k),
        np.int32(a.tile_width), np.int32(slots), out), shared_mem=SMEM)
    return out


def check(rng, m, k, n, tile_width, slots, density):
    x = (rng.standard_normal((m, k)) * (rng.random((m, k)) < density)).astype(twell.bfloat16)
    b = rng.standard_normal((k, n)).astype(twell.bfloat16)
    a = twell.TwELLMatrix(cupy.asarray(x), tile_width=tile_width, slots=slots)
    # The pool's free blocks filled with 0xFF (bf16 NaN): an element left unwritten shows.
    blocks = [cupy.full(1 << p, 0xFF, dtype=np.uint8) for p in range(9, 24)]
    del blocks
    got = spmm(a, cupy.ascontiguousarray(cupy.asarray(b).T)).astype(np.float64).get()
    x64, b64 = x.astype(np.float64), b.astype(np.float64)
    want = x64 @ b64
    bound = 2.0**-8 * np.abs(want) + k * 2.0**-24 * (np.abs(x64) @ np.abs(b64)) + 2.0**-24
    ok = bool(np.all(np.abs(got - want) <= bound))
    print(f"  check m={m} k={k} n={n} T={tile_width} S={slots} density={density}: "
          f"{'right' if ok else 'WRONG'} (overflow {a.overflow_nnz})")
    return ok


def main():
    rng = np.random.default_rng(0)
    print("checks (float32 sums rounded once to bf16, outputs poisoned):")
    cases = [(300, 520, 264, 256, 19, 0.1), (130, 256, 37, 64, 1, 0.5), (1, 8, 1, 512, 3, 0.5),
             (257, 1104, 300, 128, 40, 0.3), (1024, 5632, 512, 256, 6, 0.01)]
    if not all([check(rng, *c) for c in cases]):
        sys.exit("the prototype is wrong: not timed")
    m, k, n = 16384, 5632, 2048
    b = (cupy.asarray(rng.standard_normal((k, n), dtype=np.float32)) / np.sqrt(k)).astype(
        twell.bfloat16)
    bt = cupy.ascontiguousarray(b.T)
    print(f"\nH200-class timing, M={m} K={k} N={n} bf16, ms (two interleaved passes):")
    for s in (0.999, 0.99, 0.95, 0.90):
        z = _dev.activations(m, k, 2048, s, rng).astype(twell.bfloat16)
        a = twell.TwELLMatrix(z)

        def way(v, a=a):
            return lambda: _cupy_backend.spmm(a._parts, a.shape, a.tile_width, b, a.dtype,
                                              variant=v)

        ways = {"prototype alone (B^T given)": lambda a=a: spmm(a, bt),
                "prototype + B^T copy": lambda a=a: spmm(a, cupy.ascontiguousarray(b.T)),
                "gather": way("rows"), "toarray + cuBLAS": way("dense"),
                "cuBLAS dense": lambda z=z: z @ b}
        times = {w: [] for w in ways}
        for _ in range(2):
            for w, f in ways.items():
                times[w].append(_dev.timed(f, 20))
        print(f"sparsity {s}: slots {a.slots}, overflow {a.overflow_nnz}")
        for w, t in times.items():
            print(f"  {w:28s} " + " / ".join(f"{x:.3f}" for x in t))
        del z, a


if __name__ == "__main__":
    main()
