"""The persistent prototype (v1) with its packing removed: does the 3-stage persistent GEMM
itself run at the shipped GEMM's 0.467 ms? Call 11 of the fourteenth session
(call11_ws_gemm.txt beside this file), run from scratch/ on 95c4c1e."""
import re
import sys

sys.path.insert(0, "benchmarks/prototypes")  # from the repository root
import cupy  # noqa: E402
import matmul_pack_sm90_ws as ws  # noqa: E402
import numpy as np  # noqa: E402

from twell import _kernels  # noqa: E402

src = (ws.HERE / ws.SOURCE).read_text()
calls = re.findall(r"      pack_staged_block<__nv_bfloat16, kPackerRows.*?lane\);\n", src, re.S)
assert len(calls) == 1
nopack = src.replace(calls[0],
                     "      if (stage[lane] == __float2bfloat16(1234.5f)) totals[lane] = 1;\n")
loaded = _kernels.nvrtc_module(nopack, "nopack.cu", "sm_90a", [f"-I{_kernels.source_dir()}"])
kern = _kernels.ArchKernel(loaded.get_function("proto_matmul_pack_sm90_ws"), loaded)
rng = np.random.default_rng(7)
x, w = ws.base.operands(rng, 16384, 2048, 5632, shift=2.3)
sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
full = ws.compile_kernels()["proto_matmul_pack_sm90_ws"]
for label, kernel, grid, threads, smem in (
        ("persistent v1 kernel alone", full, sms, 384, ws.SMEM),
        ("persistent v1 without packing (GEMM)", kern, sms, 384, ws.SMEM),
        ("shipped kernel alone", _kernels.function("matmul_pack_sm90.cu", "twell_matmul_pack_sm90"),
         2816, 288, 197696)):
    print(f"{label:38s}{ws.kernel_alone_ms(kernel, x, w, (grid,), threads, smem):7.3f} ms")
