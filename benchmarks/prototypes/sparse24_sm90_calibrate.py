"""Calibration: the prototype's pipeline with its wgmma only, sparse k32 vs dense k16 (H100)."""
import sys
sys.argv = ["x"]
src = open("benchmarks/prototypes/sparse24_sm90.py").read()
# Reuse the helpers; build only the calibration kernels.
head = src[:src.index("KEYS = ")]
exec(head)
import torch, math, numpy as np, cupy
KERNELS = {("sparse", g): build(2, g, "m2") for g in (1, 2)}
CODE_D = "#define SP_DENSE 1\n" + CODE
code_globals = globals()
def build_dense(g):
    code = f"#define SP_MODE 2\n#define SP_GROUP {g}\n#define SP_CL4 0\n#define SP_CLM 2\n" + CODE_D
    mod = _compile.nvrtc_module(code, "sparse24.cu", "sm_90a")
    k = _compile.ArchKernel(mod.get_function("sparse24_gemm_bf16"), mod)
    k.max_dynamic_shared_size_bytes = SMEM
    k.cl = "m2"; k.clusters = k.max_active_clusters(288, SMEM, 2) or 66
    return k
KERNELS.update({("dense", g): build_dense(g) for g in (1, 2)})
kern = KERNELS[("sparse", 1)]
rest = src[src.index("def tmap"):src.index("rng = np.random")]
exec(rest)
CLUSTERS = None
M, N, K = 16384, 2048, 5632
a_c = cupy.from_dlpack(torch.randn(M, K // 2, device="cuda").to(torch.bfloat16))
meta = cupy.zeros((M // 128) * (K // 64) * 256, dtype=np.uint32) + np.uint32(0x44444444)
w = (torch.randn(N, K, device="cuda") / math.sqrt(K)).to(torch.bfloat16)
h = torch.randn(M, K, device="cuda").to(torch.bfloat16)
wc = cupy.from_dlpack(w)
exec(src[src.index("def timeit"):src.index("yy = ")])
yy = cupy.from_dlpack(torch.empty(M, N, device="cuda", dtype=torch.bfloat16))
out_t = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
for rnd in range(3):
    t_dn = timeit(lambda: torch.mm(h, w.T, out=out_t))
    line = [f"round {rnd}: torch dense {t_dn:.4f} ms"]
    for key, kk in KERNELS.items():
        t = timeit(lambda: run(a_c, wc, meta, M, N, K, yy, kern=kk))
        line.append(f"wgmma only {key[0]} G{key[1]} {t:.4f} ({t_dn / t:.3f}x)")
    print("; ".join(line), flush=True)
