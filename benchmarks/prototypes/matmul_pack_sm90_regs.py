"""PROTOTYPE check and timing of ``matmul_pack_sm90_regs.cu``: the shipped Hopper fused GEMM ->
TwELL kernel with the packing done from the wgmma accumulators in registers (quad masks and
popcounts) instead of from a staging tile in shared memory.

Not part of the package or the test-suite. One device call answers: does the prototype give
the shipped kernels' bits on the cluster script's six cases (swapped in for
``twell_matmul_pack_sm90`` under ``_cupy_backend.matmul_pack``, a one-entry spill buffer
included, which exercises the spill and the rerun), and how fast is it alone (CUDA events
over 20 launches back to back) and in the launcher, against the shipped kernel and cuBLAS, at
the paper's up projection with 13 slots (tile width 256) and with 3 slots at tile width 64.
Run from the repository root on an H100/H200:

    PYTHONPATH=. timeout 300 python benchmarks/prototypes/matmul_pack_sm90_regs.py
"""

import contextlib
import pathlib
import sys

import cupy
import numpy as np

from twell import _cupy_backend, _kernels

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import matmul_pack_sm90_cluster as base  # noqa: E402  (operands, checks, the launcher swap)
import matmul_pack_sm90_ws as ws  # noqa: E402  (the kernel-alone timing)

#: The prototype keeps the shipped kernel's name and arguments (its source includes the
#: shipped one with the epilogue redirected); it is looked up in the prototype's own module.
NAME = "twell_matmul_pack_sm90"
SOURCE = "matmul_pack_sm90_regs.cu"
THREADS = 288
SMEM = _cupy_backend._MATMUL_SM90_SMEM  # the shipped stages; no staging tile


def compile_kernel():
    loaded = _kernels.nvrtc_module((HERE / SOURCE).read_text(), SOURCE, "sm_90a",
                                   [f"-I{_kernels.source_dir()}"])
    return _kernels.ArchKernel(loaded.get_function(NAME), loaded)


def swapped_in(kernel):
    """The prototype in place of twell_matmul_pack_sm90 (variant "sm90") in the launcher,
    with the shipped grid, block, arguments and shared memory."""
    def sm90_operands(x, w, shipped):
        _, maps, smem = shipped(x, w, "sm90")
        return kernel, maps, smem

    return base.swapped_operands(sm90_operands)


def main():
    rng = np.random.default_rng(7)
    m, k, n = 16384, 2048, 5632
    x, w = base.operands(rng, m, k, n, shift=2.3)
    blocks = (-(-m // 128) * -(-n // 256),)
    shipped = _kernels.function("matmul_pack_sm90.cu", "twell_matmul_pack_sm90")
    print(f"M={m} K={k} N={n} bf16 (~1% non-zero)")
    print(f"  {'cupy.matmul (cuBLAS)':<52} {base.median_ms(lambda: cupy.matmul(x, w.T)):7.3f} ms")
    for tile_width, slots in ((256, 13), (64, 3)):
        t = ws.kernel_alone_ms(shipped, x, w, blocks, THREADS, SMEM, slots, tile_width)
        print(f"  {f'shipped kernel alone, T={tile_width} S={slots}':<52} {t:7.3f} ms",
              flush=True)
    base.launcher_line("shipped launcher, T=256 S=13", contextlib.nullcontext(), x, w, width=52)
    print(f"\n{SOURCE}", flush=True)
    kernel, ok = base.checked(compile_kernel, swapped_in, rng)
    if ok:
        for tile_width, slots in ((256, 13), (64, 3)):
            t = ws.kernel_alone_ms(kernel, x, w, blocks, THREADS, SMEM, slots, tile_width)
            print(f"  {f'prototype kernel alone, T={tile_width} S={slots}':<52} {t:7.3f} ms")
        base.launcher_line("prototype in the launcher, T=256 S=13", swapped_in(kernel), x, w,
                           width=52)
    print("all checks passed" if ok else "CHECKS FAILED")
    if ok:
        variants(x, w, blocks)


def variants(x, w, blocks):
    """Kernel alone (T = 256, S = 13) compiled with the source's timing-only switches: no
    epilogue at all (TWELL_PROTO_GEMM_ONLY), everything after the words and masks left out
    (TWELL_PROTO_NO_PACK), the zero fill left out (TWELL_PROTO_NO_FILL), the per-entry loop
    left out (TWELL_PROTO_NO_ENTRIES). Their outputs are wrong; only the differences
    matter."""
    for option in ("-DTWELL_PROTO_GEMM_ONLY", "-DTWELL_PROTO_NO_PACK", "-DTWELL_PROTO_NO_FILL",
                   "-DTWELL_PROTO_NO_ENTRIES"):
        loaded = _kernels.nvrtc_module((HERE / SOURCE).read_text(), SOURCE, "sm_90a",
                                       [f"-I{_kernels.source_dir()}", option])
        kernel = _kernels.ArchKernel(loaded.get_function(NAME), loaded)
        t = ws.kernel_alone_ms(kernel, x, w, blocks, THREADS, SMEM)
        print(f"  {f'prototype kernel alone, {option[2:]}':<52} {t:7.3f} ms", flush=True)


if __name__ == "__main__":
    main()
