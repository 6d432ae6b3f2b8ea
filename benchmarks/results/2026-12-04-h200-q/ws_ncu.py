"""Why is the persistent 3-stage GEMM slower than the shipped one? Four kernels on the
paper's up projection (bf16, S = 13): the shipped kernel and the persistent v1 prototype,
each whole and with its packing removed. Without --profile: CUDA-event times (20 launches).
With --profile: one launch of each, for ncu."""
import re
import sys

sys.path.insert(0, "benchmarks/prototypes")
import cupy  # noqa: E402
import matmul_pack_sm90_ws as ws  # noqa: E402
import numpy as np  # noqa: E402

from twell import _cupy_backend, _kernels  # noqa: E402

inc = [f"-I{_kernels.source_dir()}", f"-I{ws.HERE}"]
src = (ws.HERE / ws.SOURCE).read_text()
calls = re.findall(r"      pack_staged_block<__nv_bfloat16, kPackerRows.*?lane\);\n", src, re.S)
assert len(calls) == 1
nopack = src.replace(calls[0],
                     "      if (stage[lane] == __float2bfloat16(1234.5f)) totals[lane] = 1;\n")
m1 = _kernels.nvrtc_module(nopack, "ws_nopack.cu", "sm_90a", inc)
ws_nopack = _kernels.ArchKernel(m1.get_function("proto_matmul_pack_sm90_ws"), m1)
ws_full = ws.compile_kernels()["proto_matmul_pack_sm90_ws"]
ship_src = _kernels.source_text("matmul_pack_sm90.cu")
pc = re.findall(r"    pack_accumulators\(d, smem,.*?lane\);\n", ship_src, re.S)
assert len(pc) == 1, len(pc)
keep = "    if (d[0] == 1234.5f && d[127] == 7.0f) totals[0] = 1;\n"  # d stays live
ship_nopack_src = ship_src.replace(pc[0], keep)
m2 = _kernels.nvrtc_module(ship_nopack_src, "ship_nopack.cu", "sm_90a", inc)
ship_nopack = _kernels.ArchKernel(m2.get_function("twell_matmul_pack_sm90_bf16"), m2)
ship_full = _kernels.function("matmul_pack_sm90.cu", "twell_matmul_pack_sm90_bf16")

rng = np.random.default_rng(7)
x, w = ws.base.operands(rng, 16384, 2048, 5632, shift=2.3)
sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
S90 = _cupy_backend._MATMUL_SM90_SMEM
rows = (("shipped whole", ship_full, 2816, 288, S90),
        ("shipped GEMM only", ship_nopack, 2816, 288, S90),
        ("persistent v1 whole", ws_full, sms, 384, ws.SMEM),
        ("persistent v1 GEMM only", ws_nopack, sms, 384, ws.SMEM))
reps = 1 if "--profile" in sys.argv else 20
for label, kernel, grid, threads, smem in rows:
    t = ws.kernel_alone_ms(kernel, x, w, (grid,), threads, smem, reps=reps)
    print(f"{label:28s}{t:7.3f} ms", flush=True)
print(f"cuBLAS {ws.base.median_ms(lambda: cupy.matmul(x, w.T)):7.3f} ms")
