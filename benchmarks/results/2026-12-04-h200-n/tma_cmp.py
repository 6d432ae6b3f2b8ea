"""Why the shipped TMA kernel measures 1.02 ms in the launcher where the prototype took 0.80:
kernel-only times (CUDA events over 20 launches, no launcher) of the shipped kernel, the
shipped kernel with prefetch.tensormap, the old prototype (maps in global memory) and the
old cp.async kernel; the host cost of encoding two maps; the launcher's time.

Calls 4, 6 and 7 of the fourteenth session (outputs call4_tma_cmp.txt, call6_epi.txt and
call7_epi.txt beside this file). The old sources were taken from git into scratch/old/:
``git show 6f8ae17^:benchmarks/prototypes/matmul_pack_sm90_tma.cu > scratch/old/proto_tma.cu``,
likewise ``tma.cuh`` and ``mbarrier.cuh`` of that folder, and
``6f8ae17^:cuda_src/matmul_pack_sm90.cu`` as ``scratch/old/cpasync.cu``. They include the
checkout's ``matmul_pack.cuh``: in call 7 the old kernels ran with the new epilogue too.
"""
import pathlib
import sys
import time

sys.path.insert(0, "benchmarks")
import _dev  # noqa: E402
import cupy  # noqa: E402
import numpy as np  # noqa: E402
from scipy.special import ndtri  # noqa: E402

import twell  # noqa: E402
from twell import _cupy_backend as gb  # noqa: E402
from twell import _kernels  # noqa: E402

rng = np.random.default_rng(0)
m, n, k, S, T = 16384, 5632, 2048, 13, 256
x = cupy.asarray(rng.standard_normal((m, k), dtype=np.float32))
w = cupy.asarray(rng.standard_normal((n, k), dtype=np.float32)) / np.sqrt(k)
x[:, 0] = 1.0
w[:, 0] = -ndtri(0.99)
x, w = x.astype(twell.bfloat16), w.astype(twell.bfloat16)
nt = n // T
totals = cupy.empty((m, nt), np.int32)
counts = cupy.empty((m, nt), np.int32)
data = cupy.empty((m, nt, S), x.dtype)
idx = cupy.empty((m, nt, S), np.uint16)
sstart = cupy.empty((m, nt), np.int64)
cap = m * n // 64 + 4096
sidx = cupy.empty(cap, np.int32)
sdata = cupy.empty(cap, x.dtype)
counter = cupy.zeros(1, np.uint64)
grid = ((m // 128) * (n // 256),)
tail = (np.int64(m), np.int64(n), np.int64(k), np.int32(T), np.int32(S), totals, counts, data,
        idx, sstart, sidx, sdata, np.int64(cap), counter)
maps = (_kernels.tensor_map_2d(x, 64, 128), _kernels.tensor_map_2d(w, 64, 256))
SMEM = 4 * (128 + 256) * 64 * 2 + 64 + 1024


def kernel_ms(fn, reps=20):
    for _ in range(3):
        fn()
    a, b = cupy.cuda.Event(), cupy.cuda.Event()
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    b.synchronize()
    return cupy.cuda.get_elapsed_time(a, b) / reps


def compile_src(code, name, fn, extra=()):
    mod = _kernels.nvrtc_module(code, name, "sm_90a", [*extra, f"-I{_kernels.source_dir()}"])
    kern = mod.get_function(fn)
    cupy.cuda.driver.funcSetAttribute(kern.ptr, 8, SMEM)
    return mod, kern


rows = []
shipped, _, _ = gb._matmul_operands(x, w, "sm90")
shipped.max_dynamic_shared_size_bytes = SMEM
rows.append(("shipped (param maps)", kernel_ms(
    lambda: shipped(grid, (288,), (*maps, *tail), shared_mem=SMEM))))

src = _kernels.source_text("matmul_pack_sm90.cu")
pre = src.replace("    if (lane == 0) {\n      for (int kt = 0;",
                  "    if (lane == 0) {\n      asm volatile(\"prefetch.tensormap [%0];\" :: "
                  "\"l\"(reinterpret_cast<unsigned long long>(&tmap_x)) : \"memory\");\n"
                  "      asm volatile(\"prefetch.tensormap [%0];\" :: "
                  "\"l\"(reinterpret_cast<unsigned long long>(&tmap_w)) : \"memory\");\n"
                  "      for (int kt = 0;", 1)
assert pre != src
try:
    mod1, k1 = compile_src(pre, "pre.cu", "twell_matmul_pack_sm90")
    rows.append(("shipped + prefetch.tensormap", kernel_ms(
        lambda: k1(grid, (288,), (*maps, *tail), shared_mem=SMEM))))
except Exception as e:  # noqa: BLE001
    print("prefetch variant failed:", e)

old = pathlib.Path("scratch/old")
try:
    mod2, k2 = compile_src((old / "proto_tma.cu").read_text(), "proto.cu",
                           "proto_matmul_pack_sm90_tma", [f"-I{old.resolve()}"])
    dmaps = cupy.asarray(np.concatenate([mp.view(np.uint64) for mp in maps]))
    rows.append(("old prototype (global maps)", kernel_ms(
        lambda: k2(grid, (288,), (x, w, *tail, dmaps), shared_mem=SMEM))))
except Exception as e:  # noqa: BLE001
    print("prototype failed:", e)
try:
    smem_old = 4 * (128 + 256) * 64 * 2 + 1024
    mod3, k3 = compile_src((old / "cpasync.cu").read_text(), "cpasync.cu",
                           "twell_matmul_pack_sm90")
    cupy.cuda.driver.funcSetAttribute(k3.ptr, 8, smem_old)
    rows.append(("old cp.async kernel", kernel_ms(
        lambda: k3(grid, (256,), (x, w, *tail), shared_mem=smem_old))))
except Exception as e:  # noqa: BLE001
    print("cp.async failed:", e)

t0 = time.perf_counter()
for _ in range(200):
    _kernels.tensor_map_2d(x, 64, 128)
    _kernels.tensor_map_2d(w, 64, 256)
enc = (time.perf_counter() - t0) / 200 * 1e3
rows.append(("host: encode two maps", enc))
rows.append(("cuBLAS GEMM", kernel_ms(lambda: cupy.matmul(x, w.T))))
rows.append(("launcher matmul_pack S=13 (timed)", _dev.timed(
    lambda: gb.matmul_pack(x, w, T, S), 20)))
rows.append(("launcher matmul_pack S=13 mma (timed)", _dev.timed(
    lambda: gb.matmul_pack(x, w, T, S, variant="mma"), 20)))
t0 = time.perf_counter()
for _ in range(20):
    gb.matmul_pack(x, w, T, S)
rows.append(("launcher wall per call (perf_counter)", (time.perf_counter() - t0) / 20 * 1e3))
for name, ms in rows:
    print(f"{name:44s} {ms:8.3f} ms")
