"""PROTOTYPE check and timing of ``matmul_pack_sm90_cluster.cu``: the shipped Hopper fused
GEMM -> TwELL kernel (``twell_matmul_pack_sm90_bf16``: TMA + mbarriers) in clusters of 2 CTAs along
M, the w tile multicast.

Not part of the package or the test-suite. One device call answers: does the prototype give
the shipped kernels' bits (swapped in for ``twell_matmul_pack_sm90_bf16`` under
``_cupy_backend.matmul_pack`` and ``twell.matmul_to_twell``), and how fast is it against the
shipped TMA and mma.sync kernels and cuBLAS. A prototype that fails to compile or to check is
reported and not timed. Run from the repository root on an H100/H200:

    PYTHONPATH=. python benchmarks/prototypes/matmul_pack_sm90_cluster.py

The swap replaces ``_cupy_backend._matmul_operands`` for ``variant="sm90"``: the prototype
takes the shipped kernel's arguments (the tensor maps by value, from
``_kernels.tensor_map_2d``) except that w's boxes are 64 x 128 (half a w tile), and its grid
is rounded up to whole clusters. It compiles with NVRTC as twell's loader does for
``ARCH_SOURCES``.
"""

import contextlib
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
BM, BN, BK, THREADS, CLUSTER = 128, 256, 64, 288, 2
NAME = "proto_matmul_pack_sm90_cluster"
SOURCE = "matmul_pack_sm90_cluster.cu"


def compile_prototype(source, names, options=()):
    """The kernels ``names`` of the prototype ``source`` (a file beside this script), compiled
    by NVRTC for sm_90a with the package's CUDA sources and this folder on the include path,
    plus ``options``: a list in the order of ``names``."""
    loaded = _kernels.nvrtc_module((HERE / source).read_text(), source, "sm_90a",
                                   [f"-I{_kernels.source_dir()}", f"-I{HERE}", *options])
    return [_kernels.ArchKernel(loaded.get_function(name), loaded) for name in names]


def compile_kernel():
    return compile_prototype(SOURCE, [NAME])[0]


class Clustered:
    """Called as the launcher calls twell_matmul_pack_sm90_bf16 for operands of m rows and n
    columns; runs the prototype on the same arguments with the row blocks rounded up to whole
    clusters (a padding CTA packs nothing)."""

    def __init__(self, kernel, m, n):
        self.kernel, self.m, self.n = kernel, m, n

    def __call__(self, grid, block, args, shared_mem=0):
        row_blocks, col_blocks = -(-self.m // BM), -(-self.n // BN)
        assert grid == (row_blocks * col_blocks,) and block == (THREADS,), (grid, block)
        grid = (-(-row_blocks // CLUSTER) * CLUSTER * col_blocks,)
        return self.kernel(grid, block, args, shared_mem=shared_mem)

    def _set_shared(self, size):
        self.kernel.max_dynamic_shared_size_bytes = size

    max_dynamic_shared_size_bytes = property(fset=_set_shared)


@contextlib.contextmanager
def swapped_operands(sm90_operands):
    """The launcher's ``_matmul_operands`` for ``variant="sm90"`` replaced by
    ``sm90_operands(x, w, shipped)`` (shipped: the original function), which returns a
    prototype's (kernel, operands, shared memory)."""
    shipped = _cupy_backend._matmul_operands

    def operands(x, w, variant):
        return shipped(x, w, variant) if variant != "sm90" else sm90_operands(x, w, shipped)

    _cupy_backend._matmul_operands = operands
    try:
        yield
    finally:
        _cupy_backend._matmul_operands = shipped


def swapped_in(kernel):
    """The prototype in place of twell_matmul_pack_sm90_bf16 (variant "sm90") in the launcher."""
    def sm90_operands(x, w, shipped):
        maps = (_kernels.tensor_map_2d(x, BK, BM), _kernels.tensor_map_2d(w, BK, BN // CLUSTER))
        return (Clustered(kernel, x.shape[0], w.shape[0]), maps,
                _cupy_backend._MATMUL_SM90_SMEM)

    return swapped_operands(sm90_operands)


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


def check(swap, rng, shift=1.0):
    """Each case through the shipped kernels and through the launcher under ``swap()`` (a
    context that swaps a prototype in), with a roomy spill buffer and a one-entry one; the
    operands' bias column at ``shift`` (1: ~16% non-zero, 0: ~50%)."""
    cases = [((128, 64, 256), 256, 5), ((77, 136, 300), 8, 1), ((300, 72, 777), 64, 2),
             ((1000, 4096, 2752), 64, 5), ((2048, 2048, 5632), 256, 13),
             ((1100, 1024, 600), 64, 5)]  # odd row blocks (9) with the ring wrapping (16 k tiles)
    ok = True
    for (m, k, n), tile_width, slots in cases:
        x, w = operands(rng, m, k, n, shift)
        # matmul_pack returns (parts, nnz): the parts are compared.
        want = _cupy_backend.matmul_pack(x, w, tile_width, slots, variant="sm90")[0]
        mma = _cupy_backend.matmul_pack(x, w, tile_width, slots, variant="mma")[0]
        with swap():
            got = _cupy_backend.matmul_pack(x, w, tile_width, slots, variant="sm90")[0]
            tight = _cupy_backend.matmul_pack(x, w, tile_width, slots, spill_capacity=1,
                                              variant="sm90")[0]
        cupy.cuda.Device().synchronize()
        verdict = same_bits(got, want) and same_bits(tight, want) and same_bits(want, mma)
        nnz = int(got.counts.sum()) + got.overflow_data.size
        print(f"  M={m} K={k} N={n} T={tile_width} S={slots}: nnz {nnz}, same bits as the "
              f"shipped kernels: {verdict}")
        ok &= verdict
    return ok


def checked(compile_kernel, swap_for, rng, shifts=(1.0,)):
    """``(kernel, ok)``: a prototype compiled by ``compile_kernel()`` and run through
    :func:`check` under ``swap_for(kernel)`` once per operand shift in ``shifts``; a failure
    is printed and returned as not ok (a prototype's failure is a result to print)."""
    try:
        kernel = compile_kernel()
        ok = True
        for shift in shifts:
            print(f" operands' shift {shift}:")
            ok &= check(lambda: swap_for(kernel), rng, shift)
        return kernel, ok
    except Exception as exc:  # noqa: BLE001
        print(f"  FAILED: {type(exc).__name__}: {exc}")
        return None, False


def launcher_line(label, swap, x, w, width=48):
    """Print the launcher's time (``matmul_pack``, tile width 256, 13 slots) under ``swap``."""
    with swap:
        t = median_ms(lambda: _cupy_backend.matmul_pack(x, w, 256, 13))
    print(f"  {label:<{width}} {t:7.3f} ms", flush=True)


def main():
    """The shipped kernels first, then the prototype (checked, then timed): a prototype that
    breaks the CUDA context (a fault) then costs only its own rows."""
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
    show("matmul_pack S=13, wgmma TMA (shipped)",
         lambda: _cupy_backend.matmul_pack(x, w, 256, 13, variant="sm90"))
    print(f"\n{NAME}", flush=True)
    kernel, ok = checked(compile_kernel, swapped_in, rng)
    if ok:
        with swapped_in(kernel):
            show("matmul_pack S=13, cluster prototype",
                 lambda: _cupy_backend.matmul_pack(x, w, 256, 13, variant="sm90"))
            show("twell.matmul_to_twell auto, cluster prototype",
                 lambda: twell.matmul_to_twell(x, w))
    print("all checks passed" if ok else "CHECKS FAILED")


if __name__ == "__main__":
    main()
