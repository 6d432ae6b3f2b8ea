"""Does the persistent GEMM keep up with the shipped one once its ring has 4 stages?
(NOTES, open question 5 (b); eighteenth session.) Kernels alone on the paper's up projection
(bf16, S = 13, CUDA events over 20 launches): the shipped kernel whole and with its packing
removed; the persistent prototype (benchmarks/prototypes/matmul_pack_sm90_ws.cu) with its
packing removed, with its 3-stage ring and 66 KB staging tile as written, and with 4 stages
and no staging tile (what an overlap design with a small handoff would have); cuBLAS.
Usage: PYTHONPATH=. python3 ws4.py (repository root)"""
import re
import sys

sys.path.insert(0, "benchmarks/prototypes")
import cupy  # noqa: E402
import matmul_pack_sm90_ws as ws  # noqa: E402
import numpy as np  # noqa: E402

from twell import _cupy_backend, _kernels  # noqa: E402

inc = [f"-I{_kernels.source_dir()}", f"-I{ws.HERE}"]
KEEP = "if (d[0] == 1234.5f && d[127] == 7.0f) totals[0] = 1;"  # d stays live


def one(pattern, text, new):
    found = re.findall(pattern, text, re.S)
    assert len(found) == 1, (pattern, len(found))
    return text.replace(found[0], new)


def build(src, name, entry):
    module = _kernels.nvrtc_module(src, name, "sm_90a", inc)
    return _kernels.ArchKernel(module.get_function(entry), module)


def ws_gemm_only(stages, staging):
    src = (ws.HERE / ws.SOURCE).read_text()
    src = one(r"      pack_staged_block<__nv_bfloat16, kPackerRows.*?lane\);\n", src, "")
    src = one(r"      stage_relu\(d, stage, wg, warp, lane\);\n", src, f"      {KEEP}\n")
    src = one(r"constexpr int kStages = 3;", src, f"constexpr int kStages = {stages};")
    if not staging:
        src = one(r"constexpr int kStagingBytes = kBM \* kPitch \* 2;", src,
                  "constexpr int kStagingBytes = 1024;")
    smem = stages * (128 + 256) * 64 * 2 + (128 * 264 * 2 if staging else 1024) + \
        (2 * stages + 2) * 8 + 1024
    return build(src, f"ws{stages}.cu", "proto_matmul_pack_sm90_ws"), smem


ship_src = _kernels.source_text("matmul_pack_sm90.cu")
ship_nopack = build(one(r"    pack_accumulators\(d, smem,.*?lane\);\n", ship_src,
                        f"    {KEEP}\n"), "ship_nopack.cu", "twell_matmul_pack_sm90_bf16")
ship_full = _kernels.function("matmul_pack_sm90.cu", "twell_matmul_pack_sm90_bf16")
ws3, smem3 = ws_gemm_only(3, True)
ws4, smem4 = ws_gemm_only(4, False)

rng = np.random.default_rng(7)
x, w = ws.base.operands(rng, 16384, 2048, 5632, shift=2.3)
sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
S90 = _cupy_backend._MATMUL_SM90_SMEM
rows = (("shipped whole", ship_full, 2816, 288, S90),
        ("shipped GEMM only", ship_nopack, 2816, 288, S90),
        ("persistent GEMM only, 3 stages + staging", ws3, sms, 384, smem3),
        ("persistent GEMM only, 4 stages", ws4, sms, 384, smem4))
for _ in range(2):
    for label, kernel, grid, threads, smem in rows:
        t = ws.kernel_alone_ms(kernel, x, w, (grid,), threads, smem)
        print(f"{label:44s}{t:7.3f} ms  (smem {smem} B)", flush=True)
print(f"cuBLAS {ws.base.median_ms(lambda: cupy.matmul(x, w.T)):7.3f} ms")
