"""Kernel alone and in the launcher: c283877's twell_matmul_pack_sm90 (staged packing), the
register prototype (on c283877's sources), and the new shipped kernel; interleaved rounds.

Sixteenth GPU session, call 2 (README.md beside this file). Ran from the repository root
with scratch/old_cuda/cuda_src = c283877's cuda_src and scratch/proto = 14e2bb0's
benchmarks/prototypes/matmul_pack_sm90_regs.cu (deleted when the epilogue shipped)."""
import contextlib
import pathlib
import sys

import cupy
import numpy as np

from twell import _cupy_backend, _kernels

sys.path.insert(0, "benchmarks/prototypes")
import matmul_pack_sm90_cluster as base  # noqa: E402
import matmul_pack_sm90_ws as ws  # noqa: E402

OLD = pathlib.Path("scratch/old_cuda/cuda_src").resolve()
NAME = "twell_matmul_pack_sm90"


def compiled(path, inc):
    loaded = _kernels.nvrtc_module(pathlib.Path(path).read_text(), pathlib.Path(path).name,
                                   "sm_90a", [f"-I{inc}"])
    return _kernels.ArchKernel(loaded.get_function(NAME), loaded)


def swapped(kernel):
    def ops(x, w, shipped):
        _, maps, smem = shipped(x, w, "sm90")
        return kernel, maps, smem
    return base.swapped_operands(ops)


rng = np.random.default_rng(7)
m, k, n = 16384, 2048, 5632
x, w = base.operands(rng, m, k, n, shift=2.3)
blocks = (-(-m // 128) * -(-n // 256),)
SMEM = _cupy_backend._MATMUL_SM90_SMEM
kernels = {
    "old (staged)": compiled(OLD / "matmul_pack_sm90.cu", OLD),
    "prototype": compiled("scratch/proto/matmul_pack_sm90_regs.cu", OLD),
    "new (shipped)": _kernels.function("matmul_pack_sm90.cu", NAME),
}
print(f"cuBLAS {base.median_ms(lambda: cupy.matmul(x, w.T)):.3f} ms")
for rnd in range(2):
    for name, kern in kernels.items():
        for tw, s in ((256, 13), (64, 3)):
            t = ws.kernel_alone_ms(kern, x, w, blocks, 288, SMEM, s, tw)
            print(f"ROUND{rnd} alone {name:14s} T={tw:3d} S={s:2d} {t:7.3f} ms", flush=True)
    for name, kern in kernels.items():
        swap = contextlib.nullcontext() if name.startswith("new") else swapped(kern)
        base.launcher_line(f"ROUND{rnd} launcher {name}", swap, x, w, width=40)
