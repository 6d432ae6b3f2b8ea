"""PROTOTYPE check and timing of ``matmul_pack_sm90.cu`` (wgmma, sm_90a) on an H100/H200.

Not part of the package or the test-suite: the development script of a Hopper
``twell_matmul_pack``. One device call answers: is the wgmma GEMM right (v1, v2, dense output,
against float64), is the fused kernel right (swapped in for ``twell_matmul_pack<bf16>`` under
``twell.matmul_to_twell``: values against float64, canonical storage, agreement with the
mma.sync kernel), and how fast is each against cuBLAS and the shipped kernel. Run from the
repository root:

    PYTHONPATH=. python benchmarks/prototypes/matmul_pack_sm90.py

It compiles with NVRTC directly (CuPy's RawModule adds an -arch of its own, and wgmma needs
sm_90a) and loads the cubin with ``cupy.cuda.function.Module``. It needs CuPy 14 or later
(bfloat16 arrays).
"""

import contextlib
import os
import pathlib
import sys

import cupy
import numpy as np
from cupy_backends.cuda.libs import nvrtc

import twell
from twell import _cupy_backend, _kernels

HERE = pathlib.Path(__file__).resolve().parent
STAGES, BM, BN, BK = 4, 128, 256, 64
SMEM = STAGES * (BM + BN) * BK * 2 + 1024  # + slack to align the tiles to 1024 bytes
#: v1 waits for each k tile's wgmma; v2 keeps one group in flight.
GEMMS = ("proto_gemm_relu_sm90", "proto_gemm_relu_sm90_v2")
FUSED = "proto_matmul_pack_sm90"


class Kernel:
    """A ``cupy.cuda.function.Function`` with the ``max_dynamic_shared_size_bytes`` setter that
    twell's launchers use (only ``cupy.RawKernel`` has it; a bare Function takes no attributes).
    """

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def _set_smem(self, size):
        driver = cupy.cuda.driver
        attribute = getattr(driver, "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES", 8)
        driver.funcSetAttribute(self.fn.ptr, attribute, size)

    max_dynamic_shared_size_bytes = property(fset=_set_smem)


def _include_options():
    """-I for cuda_src and for the CUDA headers (NVRTC has no built-in cuda_bf16.h)."""
    opts = [f"-I{_kernels.source_dir()}"]
    with contextlib.suppress(Exception):  # private CuPy helper (13.3-14.x): the wheel's headers
        opts += list(cupy.cuda.compiler._get_extra_include_dir_opts())
    with contextlib.suppress(Exception):  # what CuPy 15 uses instead
        from cuda import pathfinder

        opts.append(f"-I{pathfinder.find_nvidia_header_directory('cudart')}")
    cuda_path = cupy.cuda.get_cuda_path()
    if cuda_path and os.path.isdir(os.path.join(cuda_path, "include")):
        opts.append(f"-I{os.path.join(cuda_path, 'include')}")
    return opts


def compile_kernels():
    src = (HERE / "matmul_pack_sm90.cu").read_text()
    prog = nvrtc.createProgram(src, "matmul_pack_sm90.cu", [], [])
    try:
        nvrtc.compileProgram(prog, ["-arch=sm_90a", *_kernels.OPTIONS, *_include_options()])
    except nvrtc.NVRTCError:
        print(nvrtc.getProgramLog(prog))
        raise
    module = cupy.cuda.function.Module()
    module.load(nvrtc.getCUBIN(prog))
    kernels = {}
    for name in (*GEMMS, FUSED):
        fn = Kernel(module.get_function(name))
        fn.max_dynamic_shared_size_bytes = SMEM
        kernels[name] = fn
    return module, kernels


@contextlib.contextmanager
def fused_kernel_swapped_in(fn):
    """twell.matmul_to_twell runs ``fn`` (a :class:`Kernel`) in place of
    twell_matmul_pack<__nv_bfloat16>."""
    shipped, smem = _kernels.function, _cupy_backend._MATMUL_SMEM

    def function(name, expression):
        if (name, expression) == ("ffn.cu", "twell_matmul_pack<__nv_bfloat16>"):
            return fn
        return shipped(name, expression)

    _kernels.function, _cupy_backend._MATMUL_SMEM = function, SMEM
    try:
        yield
    finally:
        _kernels.function, _cupy_backend._MATMUL_SMEM = shipped, smem


def operands(rng, m, k, n, shift=0.0):
    """bf16 x, w; ``shift`` lowers the products so that about the wanted share is positive."""
    x = rng.standard_normal((m, k)).astype(twell.bfloat16)
    w = rng.standard_normal((n, k)).astype(twell.bfloat16)
    x[:, 0], w[:, 0] = 1.0, -shift  # a bias column: z = x w^T - shift
    return cupy.asarray(x), cupy.asarray(w)


def reference(x, w):
    return np.maximum(x.get().astype(np.float64) @ w.get().astype(np.float64).T, 0)


def close(got, want, k):
    """Within bf16 rounding of the output plus fp32 accumulation, relative to sqrt(K)."""
    err = np.max(np.abs(got - want), initial=0.0) / np.sqrt(k)
    return bool(np.all(np.isfinite(got)) and err < 2e-2), err


def run_gemm(fn, x, w):
    m, k = x.shape
    n = w.shape[0]
    out = cupy.full((m, n), 0x7FC0, dtype=np.uint16)  # NaN bits: unwritten elements show
    fn((-(-m // BM) * -(-n // BN),), (256,), (x.view(np.uint16), w.view(np.uint16), np.int64(m),
                                              np.int64(n), np.int64(k), out), shared_mem=SMEM)
    return out.view(twell.bfloat16)


def check_gemm(fn, rng, m, k, n):
    x, w = operands(rng, m, k, n)
    ok, err = close(run_gemm(fn, x, w).astype(np.float64).get(), reference(x, w), k)
    print(f"  gemm M={m} K={k} N={n}: max |err| / sqrt(K) = {err:.2e} {'ok' if ok else 'WRONG'}")
    return ok


def same_bits(a, b):
    names = ("counts", "data", "indices", "overflow_indptr", "overflow_indices", "overflow_data")
    return all(cupy.array_equal(getattr(a, f).view(np.uint8), getattr(b, f).view(np.uint8))
               for f in names)


def check_fused(fn, rng, m, k, n, tile_width, slots):
    x, w = operands(rng, m, k, n, shift=2.0 * np.sqrt(k))  # ~2% positive: some overflow
    shipped = twell.matmul_to_twell(x, w, tile_width=tile_width, slots=slots)
    with fused_kernel_swapped_in(fn):
        got = twell.matmul_to_twell(x, w, tile_width=tile_width, slots=slots)
    ok, err = close(got.toarray().astype(np.float64).get(), reference(x, w), k)
    canonical = same_bits(got, twell.TwELLMatrix(got.toarray(), tile_width=tile_width,
                                                 slots=slots))
    differ = int(cupy.count_nonzero(got.toarray().view(np.uint16)
                                    != shipped.toarray().view(np.uint16)))
    good = ok and canonical
    print(f"  fused M={m} K={k} N={n} T={tile_width} S={slots}: err {err:.2e}, canonical "
          f"{canonical}, nnz {got.nnz} (mma.sync {shipped.nnz}), {differ} values differ from "
          f"mma.sync {'ok' if good else 'WRONG'}")
    return good


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
    _, kernels = compile_kernels()
    ok = True
    gemm_shapes = [(128, 64, 256), (1000, 4096, 2752), (77, 136, 300), (2048, 2048, 5632)]
    for name in GEMMS:
        print(name)
        ok &= all([check_gemm(kernels[name], np.random.default_rng(1), *s) for s in gemm_shapes])
    print(FUSED)
    fused_cases = [(128, 64, 256, 256, 5), (77, 136, 300, 8, 1), (1000, 4096, 2752, 64, 5),
                   (1000, 4096, 2752, 256, 13), (2048, 2048, 5632, 256, 13)]
    fused_ok = all([check_fused(kernels[FUSED], np.random.default_rng(2), *c)
                    for c in fused_cases])
    ok &= fused_ok

    m, k, n = 16384, 2048, 5632  # the paper's up projection, ~1% positive
    x, w = operands(np.random.default_rng(0), m, k, n, shift=2.33 * np.sqrt(k))
    flop = 2 * m * k * n
    rows = [("cupy.matmul (cuBLAS)", lambda: cupy.matmul(x, w.T)),
            ("cupy.matmul + relu", lambda: cupy.maximum(cupy.matmul(x, w.T), 0)),
            ("twell.matmul_to_twell S=13 (mma.sync, shipped)",
             lambda: twell.matmul_to_twell(x, w, slots=13))]
    rows += [(f"{name} (dense out)", lambda f=kernels[name]: run_gemm(f, x, w)) for name in GEMMS]
    if fused_ok:
        def prototype():
            with fused_kernel_swapped_in(kernels[FUSED]):
                return twell.matmul_to_twell(x, w, slots=13)
        rows.append(("twell.matmul_to_twell S=13 (wgmma prototype)", prototype))
    print(f"\nM={m} K={k} N={n} bf16, CUDA events, median of 20")
    for label, f in rows:
        try:
            t = timed(f)
        except Exception as e:  # one failing contender must not hide the others
            print(f"  {label:50s} failed: {type(e).__name__}: {e}")
            continue
        print(f"  {label:50s} {t:7.3f} ms  {flop / t / 1e9:5.0f} TFLOP/s")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
