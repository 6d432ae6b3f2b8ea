"""PROTOTYPE check and timing of ``matmul_pack_sm90_ws.cu``: the shipped Hopper fused GEMM ->
TwELL kernel made persistent and warp-specialised (a TMA producer warp, three packing warps,
two wgmma consumer warpgroups), so that packing a tile overlaps the next tile's GEMM.

Not part of the package or the test-suite. One device call answers: does the prototype give
the shipped kernels' bits on the cluster script's six cases (swapped in for
``twell_matmul_pack_sm90_bf16`` under ``_cupy_backend.matmul_pack``), and how fast is it, alone
(CUDA events over 20 launches back to back, no launcher) and in the launcher, against the
shipped kernel and cuBLAS, for each of its two forms. Run from the repository root on an H100/H200:

    PYTHONPATH=. timeout 300 python benchmarks/prototypes/matmul_pack_sm90_ws.py

It takes the shipped kernel's arguments (tensor maps from ``_kernels.tensor_map_2d``, boxes
as shipped); the swap gives it one block per SM (or per tile, when there are fewer), 384
threads and its own shared memory.
"""

import pathlib
import sys

import cupy
import numpy as np

from twell import _cupy_backend, _kernels

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import matmul_pack_sm90_cluster as base  # noqa: E402  (operands, checks, timing)

#: v1: three packing warps pack whole tiles; v2: the consumers pack each tile's first 32 rows.
NAMES = ("proto_matmul_pack_sm90_ws", "proto_matmul_pack_sm90_ws2")
SOURCE = "matmul_pack_sm90_ws.cu"
THREADS = 384
SMEM = 3 * (128 + 256) * 64 * 2 + 128 * 264 * 2 + 8 * 8 + 1024


def compile_kernels():
    return dict(zip(NAMES, base.compile_prototype(SOURCE, NAMES), strict=True))


class Persistent:
    """Called as the launcher calls twell_matmul_pack_sm90_bf16; runs a persistent prototype on
    the same arguments with one block per SM (at most one per output tile) of ``threads``
    (384 here) and ``smem`` bytes of dynamic shared memory."""

    def __init__(self, kernel, threads=THREADS, smem=SMEM):
        self.kernel, self.threads, self.smem = kernel, threads, smem
        self.kernel.max_dynamic_shared_size_bytes = smem

    def __call__(self, grid, block, args, shared_mem=0):
        sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
        return self.kernel((min(grid[0], sms),), (self.threads,), args, shared_mem=self.smem)

    def _set_shared(self, size):
        pass  # the prototype's own size, set once

    max_dynamic_shared_size_bytes = property(fset=_set_shared)


def swapped_in(kernel, threads=THREADS, smem=SMEM):
    """The prototype in place of twell_matmul_pack_sm90_bf16 (variant "sm90") in the launcher,
    with the shipped kernel's tensor maps."""
    def sm90_operands(x, w, shipped):
        return Persistent(kernel, threads, smem), shipped(x, w, "sm90")[1], smem

    return base.swapped_operands(sm90_operands)


def kernel_alone_ms(kernel, x, w, grid, threads, smem, slots=13, tile_width=256, reps=20):
    """CUDA events over ``reps`` launches back to back of one fused kernel (no launcher)."""
    m, k = x.shape
    n = w.shape[0]
    nt = -(-n // tile_width)
    cap = m * n // 64 + 4096
    args = (*_cupy_backend._matmul_operands(x, w, "sm90")[1], np.int64(m), np.int64(n),
            np.int64(k), np.int32(tile_width), np.int32(slots), np.int32(1),
            cupy.empty((m, nt), np.int32), cupy.empty((m, nt), np.int32),
            cupy.empty((m, nt, slots), x.dtype), cupy.empty((m, nt, slots), np.uint16),
            cupy.empty((m, nt), np.int64), cupy.empty(cap, np.int32), cupy.empty(cap, x.dtype),
            np.int64(cap), cupy.zeros(1, np.uint64))
    kernel.max_dynamic_shared_size_bytes = smem

    def launch():
        kernel(grid, (threads,), args, shared_mem=smem)

    for _ in range(3):
        launch()
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    for _ in range(reps):
        launch()
    stop.record()
    stop.synchronize()
    return cupy.cuda.get_elapsed_time(start, stop) / reps


def main():
    rng = np.random.default_rng(7)
    m, k, n = 16384, 2048, 5632
    x, w = base.operands(rng, m, k, n, shift=2.3)
    print(f"M={m} K={k} N={n} bf16, S=13")
    print(f"  {'cupy.matmul (cuBLAS)':<48} {base.median_ms(lambda: cupy.matmul(x, w.T)):7.3f} ms")
    shipped = _kernels.function("matmul_pack_sm90.cu", "twell_matmul_pack_sm90_bf16")
    blocks = -(-m // 128) * -(-n // 256)
    print(f"  {'shipped kernel alone':<48} "
          f"{kernel_alone_ms(shipped, x, w, (blocks,), 288, _cupy_backend._MATMUL_SM90_SMEM):7.3f}"
          " ms", flush=True)
    print(f"  {'shipped launcher':<48} "
          f"{base.median_ms(lambda: _cupy_backend.matmul_pack(x, w, 256, 13)):7.3f} ms")
    kernels = compile_kernels()
    passed = True
    for name, compiled in kernels.items():
        print(f"\n{name}", flush=True)
        kernel, ok = base.checked(lambda compiled=compiled: compiled, swapped_in, rng)
        passed &= ok
        if not ok:
            continue
        sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
        print(f"  {'prototype kernel alone':<48} "
              f"{kernel_alone_ms(kernel, x, w, (sms,), THREADS, SMEM):7.3f} ms")
        base.launcher_line("prototype in the launcher", swapped_in(kernel), x, w)
    print("all checks passed" if passed else "CHECKS FAILED")


if __name__ == "__main__":
    main()
