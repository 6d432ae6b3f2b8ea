"""PROTOTYPE check and timing of ``matmul_pack_sm90_persist.cu``: the shipped Hopper fused
GEMM -> TwELL kernel made persistent (one block per SM over the output tiles, one 4-stage ring
across them, the register epilogue in 32 KB of its own), so that the next tile's loads
overlap a tile's packing.

Not part of the package or the test-suite. One device call answers: does the prototype give
the shipped kernels' bits on the cluster script's six cases (swapped in for
``twell_matmul_pack_sm90_bf16`` under ``_cupy_backend.matmul_pack``), and how fast is it alone
(CUDA events over 20 launches back to back, interleaved with the shipped kernel three times:
the card's clock drops once it is warm) and in the launcher. Run from the repository root on
an H100/H200:

    PYTHONPATH=. timeout 300 python benchmarks/prototypes/matmul_pack_sm90_persist.py
"""

import pathlib
import sys

import cupy
import numpy as np

from twell import _cupy_backend, _kernels

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import matmul_pack_sm90_cluster as base  # noqa: E402  (operands, checks, timing)
import matmul_pack_sm90_ws as ws  # noqa: E402  (the persistent launch, the kernel alone)

SOURCE = "matmul_pack_sm90_persist.cu"
NAME = "proto_matmul_pack_sm90_persist"
THREADS = 288
#: 4 stages of a 128 x 64 and a 256 x 64 bf16 tile, 32 KB of words, 8 mbarriers, alignment.
SMEM = 4 * (128 + 256) * 64 * 2 + 8 * 256 * 16 + 2 * 4 * 8 + 1024


def compile_kernel():
    return base.compile_prototype(SOURCE, [NAME])[0]


def main():
    rng = np.random.default_rng(7)
    m, k, n = 16384, 2048, 5632
    print(f"M={m} K={k} N={n} bf16, S=13")
    kernel, ok = base.checked(compile_kernel, lambda kern: ws.swapped_in(kern, THREADS, SMEM),
                              rng)
    print("all checks passed" if ok else "CHECKS FAILED", flush=True)
    if not ok:
        return
    x, w = base.operands(rng, m, k, n, shift=2.3)
    shipped = _kernels.function("matmul_pack_sm90.cu", "twell_matmul_pack_sm90_bf16")
    blocks = -(-m // 128) * -(-n // 256)
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    for _ in range(3):
        ship = ws.kernel_alone_ms(shipped, x, w, (blocks,), 288,
                                  _cupy_backend._MATMUL_SM90_SMEM)
        proto = ws.kernel_alone_ms(kernel, x, w, (sms,), THREADS, SMEM)
        print(f"  kernel alone: shipped {ship:7.3f} ms, persistent {proto:7.3f} ms", flush=True)
    base.launcher_line("shipped launcher (13 slots)", base.contextlib.nullcontext(), x, w)
    base.launcher_line("persistent in the launcher (13 slots)",
                       ws.swapped_in(kernel, THREADS, SMEM), x, w)
    print(f"  cupy.matmul (cuBLAS) {base.median_ms(lambda: cupy.matmul(x, w.T)):7.3f} ms")


if __name__ == "__main__":
    main()
