"""PROTOTYPE check and timing of the TMA kernels of the Hopper fused GEMM -> TwELL (sm_90a):
``matmul_pack_sm90_tma.cu`` (TMA + mbarriers) and ``matmul_pack_sm90_cluster.cu`` (the same in
clusters of 2 CTAs, the w tile multicast).

Not part of the package or the test-suite: the development script of the next Hopper
``twell_matmul_pack_sm90``. One device call answers: does each prototype give the shipped
kernels' bits (swapped in for ``twell_matmul_pack_sm90`` under ``_cupy_backend.matmul_pack``
and ``twell.matmul_to_twell``), and how fast is it against the shipped wgmma and mma.sync
kernels and cuBLAS. A prototype that fails to compile or to check is reported and skipped.
Run from the repository root on an H100/H200:

    PYTHONPATH=. python benchmarks/prototypes/matmul_pack_sm90_tma.py

The tensor maps (``cuTensorMapEncodeTiled``, through ctypes from ``libcuda``) go to the kernel
in global memory; it compiles with NVRTC as twell's loader does for ``ARCH_SOURCES``.
"""

import contextlib
import ctypes
import functools
import pathlib
import sys

import cupy
import numpy as np

import twell
from twell import _cupy_backend, _kernels

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # benchmarks/: the development helpers
import _dev  # noqa: E402

median_ms = functools.partial(_dev.timed, reps=20)
STAGES, BM, BN, BK, THREADS = 4, 128, 256, 64, 288
SMEM = STAGES * (BM + BN) * BK * 2 + 2 * STAGES * 8 + 1024
SHIPPED = ("matmul_pack_sm90.cu", "twell_matmul_pack_sm90")
#: name -> (source, w box rows, CTAs per cluster along M)
PROTOTYPES = {"proto_matmul_pack_sm90_tma": ("matmul_pack_sm90_tma.cu", BN, 1),
              "proto_matmul_pack_sm90_cluster": ("matmul_pack_sm90_cluster.cu", BN // 2, 2)}


def compile_kernel(name):
    source = PROTOTYPES[name][0]
    loaded = _kernels.nvrtc_module((HERE / source).read_text(), source, "sm_90a",
                                   [f"-I{_kernels.source_dir()}", f"-I{HERE}"])
    return _kernels.ArchKernel(loaded.get_function(name), loaded)


def _encode():
    fn = ctypes.CDLL("libcuda.so.1").cuTensorMapEncodeTiled
    u32, u64 = ctypes.c_uint32, ctypes.c_uint64
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int, u32, ctypes.c_void_p, ctypes.POINTER(u64),
                   ctypes.POINTER(u64), ctypes.POINTER(u32), ctypes.POINTER(u32), ctypes.c_int,
                   ctypes.c_int, ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


ENCODE = _encode()
BFLOAT16, INTERLEAVE_NONE, SWIZZLE_128B, L2_256B, OOB_ZERO = 9, 0, 3, 3, 0


def tensor_map(array, box_rows):
    """The 128-byte CUtensorMap of a C-contiguous bf16 (rows, K) array, boxes of 64 x box_rows,
    128-byte swizzle, zero fill past the edges. K = 0 gets a map of K = 8 (the driver refuses
    zero sizes; the kernel issues no copy then)."""
    rows, k = array.shape
    k = max(k, 8)
    buf = (ctypes.c_uint64 * 32)()  # 256 bytes: a 128-byte aligned 128-byte window
    address = ctypes.addressof(buf)
    aligned = address + (-address) % 128
    result = ENCODE(
        ctypes.c_void_p(aligned), BFLOAT16, 2, ctypes.c_void_p(array.data.ptr),
        (ctypes.c_uint64 * 2)(k, rows), (ctypes.c_uint64 * 1)(k * 2),
        (ctypes.c_uint32 * 2)(BK, box_rows), (ctypes.c_uint32 * 2)(1, 1), INTERLEAVE_NONE,
        SWIZZLE_128B, L2_256B, OOB_ZERO)
    if result != 0:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed with CUresult {result}")
    return np.frombuffer(ctypes.string_at(aligned, 128), dtype=np.uint64)


class Swapped:
    """Called as the launcher calls twell_matmul_pack_sm90; runs the prototype with the tensor
    maps of that call's x and w appended. The maps (on the device) are kept per (address,
    shape) of x and w, so that timed calls do not pay for encoding and copying them. A
    cluster kernel gets its grid: the row blocks rounded up to whole clusters."""

    def __init__(self, kernel, w_box_rows=BN, cluster=1):
        self.kernel, self.w_box_rows, self.cluster = kernel, w_box_rows, cluster
        self.maps = {}

    def __call__(self, grid, block, args, shared_mem=0):
        x, w = args[0], args[1]
        key = (x.data.ptr, x.shape, w.data.ptr, w.shape)
        if key not in self.maps:
            self.maps[key] = cupy.asarray(np.concatenate([tensor_map(x, BM),
                                                          tensor_map(w, self.w_box_rows)]))
        row_blocks, col_blocks = -(-x.shape[0] // BM), -(-w.shape[0] // BN)
        assert grid == (row_blocks * col_blocks,), grid
        pairs = -(-row_blocks // self.cluster)
        grid = (pairs * self.cluster * col_blocks,)
        return self.kernel(grid, (THREADS,), (*args, self.maps[key]), shared_mem=SMEM)

    def _set_shared(self, size):
        self.kernel.max_dynamic_shared_size_bytes = size

    max_dynamic_shared_size_bytes = property(fset=_set_shared)


@contextlib.contextmanager
def swapped_in(kernel, name):
    shipped, smem = _kernels.function, _cupy_backend._MATMUL_SM90_SMEM
    swap = Swapped(kernel, *PROTOTYPES[name][1:])

    def function(name, expression):
        return swap if (name, expression) == SHIPPED else shipped(name, expression)

    _kernels.function, _cupy_backend._MATMUL_SM90_SMEM = function, SMEM
    try:
        yield
    finally:
        _kernels.function, _cupy_backend._MATMUL_SM90_SMEM = shipped, smem


def operands(rng, m, k, n, shift=1.0):
    """bf16 x, w with a bias column: about 16% of relu(x @ w^T) positive at shift 1."""
    x = rng.standard_normal((m, k)).astype(twell.bfloat16)
    w = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(twell.bfloat16)
    x[:, 0], w[:, 0] = 1.0, -shift
    return cupy.asarray(x), cupy.asarray(w)


def same_bits(a, b):
    return all(
        p.shape == q.shape and bool(cupy.array_equal(p.view(np.uint8), q.view(np.uint8)))
        for p, q in zip(a, b, strict=True))


def check(kernel, name, rng):
    cases = [((128, 64, 256), 256, 5), ((77, 136, 300), 8, 1), ((300, 72, 777), 64, 2),
             ((1000, 4096, 2752), 64, 5), ((2048, 2048, 5632), 256, 13),
             ((1100, 1024, 600), 64, 5)]  # odd row blocks (9) with the ring wrapping (16 k tiles)
    ok = True
    for (m, k, n), tile_width, slots in cases:
        x, w = operands(rng, m, k, n)
        want = _cupy_backend.matmul_pack(x, w, tile_width, slots, variant="sm90")
        mma = _cupy_backend.matmul_pack(x, w, tile_width, slots, variant="mma")
        with swapped_in(kernel, name):
            got = _cupy_backend.matmul_pack(x, w, tile_width, slots, variant="sm90")
            tight = _cupy_backend.matmul_pack(x, w, tile_width, slots, spill_capacity=1,
                                              variant="sm90")
        cupy.cuda.Device().synchronize()
        verdict = same_bits(got, want) and same_bits(tight, want) and same_bits(want, mma)
        nnz = int(got.counts.sum()) + got.overflow_data.size
        print(f"  M={m} K={k} N={n} T={tile_width} S={slots}: nnz {nnz}, same bits as the "
              f"shipped kernels: {verdict}")
        ok &= verdict
    return ok


def main():
    """The shipped kernels first, then each prototype (checked, then timed) in turn: a
    prototype that breaks the CUDA context (a fault) then costs only what comes after it."""
    rng = np.random.default_rng(7)
    m, k, n = 16384, 2048, 5632
    x, w = operands(rng, m, k, n, shift=2.3)
    flop = 2.0 * m * k * n

    def show(label, fn):
        t = median_ms(fn)
        print(f"  {label:<56} {t:7.3f} ms {flop / t / 1e9:7.0f} TFLOP/s", flush=True)

    print(f"M={m} K={k} N={n} bf16, CUDA events, median of 20")
    show("cupy.matmul (cuBLAS)", lambda: cupy.matmul(x, w.T))
    show("matmul_pack S=13, mma.sync (shipped, fp16 path)",
         lambda: _cupy_backend.matmul_pack(x, w, 256, 13, variant="mma"))
    show("matmul_pack S=13, wgmma cp.async (shipped)",
         lambda: _cupy_backend.matmul_pack(x, w, 256, 13, variant="sm90"))
    ok = True
    for name in PROTOTYPES:
        print(f"\n{name}", flush=True)
        try:
            kernel = compile_kernel(name)
            passed = check(kernel, name, rng)
        except Exception as exc:  # noqa: BLE001 - a prototype's failure is a result to print
            print(f"  FAILED: {type(exc).__name__}: {exc}")
            passed = False
        ok &= passed
        if not passed:
            continue
        short = name.removeprefix("proto_matmul_pack_sm90_")
        with swapped_in(kernel, name):
            show(f"matmul_pack S=13, {short} prototype",
                 lambda: _cupy_backend.matmul_pack(x, w, 256, 13, variant="sm90"))
            show(f"twell.matmul_to_twell auto, {short} prototype",
                 lambda: twell.matmul_to_twell(x, w))
    print("all checks passed" if ok else "CHECKS FAILED")


if __name__ == "__main__":
    main()
