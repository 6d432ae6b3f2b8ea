"""PROTOTYPE check and timing of ``gemm_sm90.cu`` (wgmma GEMM + ReLU, bf16), on an H100/H200.

Not part of the package or the test-suite: a development script for the Hopper half of a
faster ``twell_matmul_pack``. It compiles the kernel with NVRTC for sm_90a (CuPy's RawModule
adds an -arch of its own), loads the cubin with ``cupy.cuda.function.Module``, checks the
result against float64 on shapes with partial blocks, then times it against ``cupy.matmul``
(cuBLAS) at the paper's up-projection shape. Run from the repository root:

    PYTHONPATH=. python benchmarks/prototypes/gemm_sm90.py
"""

import pathlib
import sys

import cupy
import numpy as np
from cupy_backends.cuda.libs import nvrtc

import twell

HERE = pathlib.Path(__file__).resolve().parent
STAGES, BM, BN, BK = 4, 128, 256, 64
SMEM = STAGES * (BM + BN) * BK * 2 + 1024  # + slack to align the tiles to 1024 bytes
#: v1 waits for each k tile's wgmma; v2 keeps one group in flight.
KERNELS = ("proto_gemm_relu_sm90", "proto_gemm_relu_sm90_v2")


def compile_kernel():
    src = (HERE / "gemm_sm90.cu").read_text()
    prog = nvrtc.createProgram(src, "gemm_sm90.cu", [], [])
    try:
        nvrtc.compileProgram(prog, ["-arch=sm_90a", "-std=c++17"])
    except nvrtc.NVRTCError:
        print(nvrtc.getProgramLog(prog))
        raise
    module = cupy.cuda.function.Module()
    module.load(nvrtc.getCUBIN(prog))
    kernels = {}
    for name in KERNELS:
        fn = module.get_function(name)
        cupy.cuda.driver.funcSetAttribute(
            fn.ptr, cupy.cuda.driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, SMEM)
        kernels[name] = fn
    return module, kernels


def run(fn, x, w):
    m, k = x.shape
    n = w.shape[0]
    out = cupy.full((m, n), 0x7FC0, dtype=np.uint16)  # NaN bits: unwritten elements show
    grid = (-(-m // BM) * -(-n // BN),)
    fn(grid, (256,), (x.view(np.uint16), w.view(np.uint16), np.int64(m), np.int64(n),
                      np.int64(k), out), shared_mem=SMEM)
    return out.view(twell.bfloat16)


def check(fn, rng, m, k, n):
    x = cupy.asarray(rng.standard_normal((m, k)).astype(twell.bfloat16))
    w = cupy.asarray(rng.standard_normal((n, k)).astype(twell.bfloat16))
    got = run(fn, x, w).astype(np.float64).get()
    want = np.maximum(x.get().astype(np.float64) @ w.get().astype(np.float64).T, 0)
    scale = np.sqrt(k)
    err = np.max(np.abs(got - want)) / scale
    ok = bool(np.all(np.isfinite(got)) and err < 2e-2)
    print(f"check M={m} K={k} N={n}: max |err| / sqrt(K) = {err:.2e} {'ok' if ok else 'WRONG'}")
    return ok


def timed(f, reps=20):
    for _ in range(3):
        f()
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    times = []
    for _ in range(reps):
        start.record()
        f()
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop))
    return float(np.median(times))


def main():
    cc = cupy.cuda.Device().compute_capability
    if cc != "90":
        sys.exit(f"needs compute capability 9.0 (H100/H200); this GPU is {cc}")
    _, kernels = compile_kernel()
    shapes = [(128, 64, 256), (1000, 4096, 11008 // 4), (77, 136, 300), (16384 // 8, 2048, 5632)]
    m, k, n = 16384, 2048, 5632
    rng = np.random.default_rng(0)
    x = cupy.asarray(rng.standard_normal((m, k)).astype(twell.bfloat16))
    w = cupy.asarray(rng.standard_normal((n, k)).astype(twell.bfloat16))
    flop = 2 * m * k * n
    ok = True
    for name, fn in kernels.items():
        print(name)
        good = all([check(fn, np.random.default_rng(1), *shape) for shape in shapes])
        ok &= good
        if good:
            t = timed(lambda fn=fn: run(fn, x, w))
            print(f"  M={m} K={k} N={n} bf16: {t:.3f} ms ({flop / t / 1e9:.0f} TFLOP/s)")
    t = timed(lambda: cupy.matmul(x, w.T))
    print(f"cupy.matmul (cuBLAS): {t:.3f} ms ({flop / t / 1e9:.0f} TFLOP/s)")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
