"""Split of the shipped Hopper fused kernel's time: the full kernel, the kernel without the
packing (GEMM + staging of relu(acc)), and without the epilogue (GEMM only), kernel-only
CUDA events over 20 launches at M = 16384, K = 2048, N = 5632, S = 13; cuBLAS beside."""
import re
import sys

sys.path.insert(0, "benchmarks/results/2026-12-04-h200-n")  # ran from scratch/
import cupy  # noqa: E402
import tma_cmp as base  # noqa: E402  (builds the operands and times the shipped kernel)

from twell import _kernels  # noqa: E402

src = _kernels.source_text("matmul_pack_sm90.cu")
tail = re.search(r"  pack_staged_block<__nv_bfloat16, kBM.*?lane\);\n", src, re.S)
assert tail
keep = ("  if (warp_id < kConsumerWarps && d[0] == 1234.5f && d[127] == -1.0f) totals[tid] = 1;\n")
no_pack = src.replace(tail.group(0),
                      "  if (stage[tid] == __float2bfloat16(1234.5f)) totals[tid] = 1;\n")
start = src.index("  // Every stage is consumed")
no_epi = src[:start] + keep + "}\n"
rows = []
for name, code in (("GEMM + staging, no packing", no_pack), ("GEMM only", no_epi)):
    mod, kern = base.compile_src(code, "v.cu", "twell_matmul_pack_sm90")
    rows.append((name, base.kernel_ms(
        lambda kern=kern: kern(base.grid, (288,), (*base.maps, *base.tail),
                               shared_mem=base.SMEM))))
for name, ms in rows:
    print(f"{name:44s} {ms:8.3f} ms")
cupy.cuda.Device().synchronize()
