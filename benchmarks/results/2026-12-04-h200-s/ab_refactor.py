"""Call 6: the shipped Hopper D2T kernel (twell_matmul_pack_sm90_bf16) before and after the
pack_quad_row refactor of wgmma.cuh (1971e36), alone, interleaved in one process (the card's
clock drops once warm), with the same bits. The old sources are ``scratch/old/cuda_src``
(``git archive c4640fc cuda_src``). From the repo root, on an H100/H200:

    PYTHONPATH=. python benchmarks/results/2026-12-04-h200-s/ab_refactor.py
"""

import pathlib
import sys

import cupy
import numpy as np

from twell import _cupy_backend, _kernels

sys.path.insert(0, "benchmarks/prototypes")
import matmul_pack_sm90_cluster as base  # noqa: E402
import matmul_pack_sm90_ws as ws  # noqa: E402


def load(folder):
    code = (pathlib.Path(folder) / "matmul_pack_sm90.cu").read_text()
    loaded = _kernels.nvrtc_module(code, "matmul_pack_sm90.cu", "sm_90a", [f"-I{folder}"])
    return _kernels.ArchKernel(loaded.get_function("twell_matmul_pack_sm90_bf16"), loaded)


def main():
    rng = np.random.default_rng(3)
    m, k, n = 16384, 2048, 5632
    kernels = {"before": load("scratch/old/cuda_src"), "after": load(_kernels.source_dir())}
    blocks = -(-m // 128) * -(-n // 256)
    smem = _cupy_backend._MATMUL_SM90_SMEM
    for label, shift, slots in (("99%", 2.326, 13), ("95%", 1.645, 24), ("90%", 1.282, 32)):
        x, w = base.operands(rng, m, k, n, shift=shift)
        for _ in range(3):
            times = {name: ws.kernel_alone_ms(kern, x, w, (blocks,), 288, smem, slots=slots)
                     for name, kern in kernels.items()}
            print(f"  {label} S={slots}: " + ", ".join(f"{a} {t:.3f} ms" for a, t in
                                                    times.items()), flush=True)
    cupy.cuda.Device().synchronize()


if __name__ == "__main__":
    main()
