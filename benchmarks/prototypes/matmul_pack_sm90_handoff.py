"""PROTOTYPE check and timing of ``matmul_pack_sm90_handoff.cu``: the persistent Hopper fused
GEMM -> TwELL kernel whose consumers hand each tile's masks and non-zero values to three
packing warps and go straight on to the next tile's GEMM (NOTES, open question 5 (b)).

Not part of the package or the test-suite. One device call answers: does the prototype give
the shipped kernels' bits on the cluster script's six cases at ~16% and ~50% non-zero (the
second makes the consumer warps pack their own rows: past 56 positive accumulators a thread),
swapped in for ``twell_matmul_pack_sm90_bf16`` under ``_cupy_backend.matmul_pack``; and how
fast is it alone (CUDA events over 20 launches back to back), interleaved twice with the
shipped kernel, the persistent prototype and its diagnostic forms (the card's clock drops once
it is warm), at 99%, 95% and 90% non-zero, and in the launcher. Run from the repository root
on an H100/H200:

    PYTHONPATH=. timeout 400 python benchmarks/prototypes/matmul_pack_sm90_handoff.py
"""

import pathlib
import sys

import cupy
import numpy as np

from twell import _cupy_backend, _kernels

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import matmul_pack_sm90_cluster as base  # noqa: E402  (operands, checks, timing)
import matmul_pack_sm90_persist as persist  # noqa: E402  (the persistent prototype)
import matmul_pack_sm90_ws as ws  # noqa: E402  (the persistent launch, the kernel alone)

SOURCE = "matmul_pack_sm90_handoff.cu"
NAME = "proto_matmul_pack_sm90_handoff"
THREADS = 384
#: 4 stages of a 128 x 64 and a 256 x 64 bf16 tile, 32 KB of hand-off, 10 mbarriers, 8 flags,
#: alignment.
SMEM = 4 * (128 + 256) * 64 * 2 + 8 * 256 * 16 + 10 * 8 + 8 * 4 + 1024
#: The operands' bias column for ~1%, ~5% and ~10% non-zero (a standard normal's quantiles),
#: and the slots timed there (about what ``slots="auto"`` picks).
SHIFTS = {"99%": (2.326, 13), "95%": (1.645, 24), "90%": (1.282, 32)}


def compile_kernel(diag=0, packers=3):
    """The prototype with ``packers`` packing warps (``THREADS - 32 * (3 - packers)``
    threads), or with ``diag`` 1-3 one of its diagnostic forms (wrong results: the consumers'
    side alone, the packers' counts and zero fill alone, or their entries with a constant
    value; see the .cu)."""
    return base.compile_prototype(
        SOURCE, [NAME], [f"-DHANDOFF_DIAG={diag}", f"-DHANDOFF_PACKERS={packers}"])[0]


def main():
    rng = np.random.default_rng(7)
    m, k, n = 16384, 2048, 5632
    print(f"M={m} K={k} N={n} bf16, S=13")
    kernel, ok = base.checked(compile_kernel, lambda kern: ws.swapped_in(kern, THREADS, SMEM),
                              rng, shifts=(1.0, 0.0))
    print("all checks passed" if ok else "CHECKS FAILED", flush=True)
    if not ok:
        return
    shipped = _kernels.function("matmul_pack_sm90.cu", "twell_matmul_pack_sm90_bf16")
    blocks = -(-m // 128) * -(-n // 256)
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    contenders = {
        "shipped": (shipped, (blocks,), 288, _cupy_backend._MATMUL_SM90_SMEM),
        "persistent": (persist.compile_kernel(), (sms,), persist.THREADS, persist.SMEM),
        "hand-off": (kernel, (sms,), THREADS, SMEM),
        "no packing": (compile_kernel(1), (sms,), THREADS, SMEM),
        "no entries": (compile_kernel(2), (sms,), THREADS, SMEM),
        "constant values": (compile_kernel(3), (sms,), THREADS, SMEM),
        "2 packers": (compile_kernel(0, 2), (sms,), THREADS - 32, SMEM),
    }
    for label, (shift, slots) in SHIFTS.items():
        x, w = base.operands(rng, m, k, n, shift=shift)
        for _ in range(2):
            times = {name: ws.kernel_alone_ms(kern, x, w, grid, threads, smem, slots=slots)
                     for name, (kern, grid, threads, smem) in contenders.items()}
            print(f"  {label} S={slots} kernel alone (ms): " +
                  ", ".join(f"{name} {t:.3f}" for name, t in times.items()), flush=True)
    x, w = base.operands(rng, m, k, n, shift=SHIFTS["99%"][0])
    base.launcher_line("shipped launcher (13 slots, 99%)", base.contextlib.nullcontext(), x, w)
    base.launcher_line("hand-off in the launcher (13 slots, 99%)",
                       ws.swapped_in(kernel, THREADS, SMEM), x, w)
    print(f"  cupy.matmul (cuBLAS) {base.median_ms(lambda: cupy.matmul(x, w.T)):7.3f} ms")


if __name__ == "__main__":
    main()
