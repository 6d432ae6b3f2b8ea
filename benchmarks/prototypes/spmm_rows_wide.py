"""PROTOTYPE check and timing of ``spmm_rows_wide.cu`` (wider warps for ``twell_spmm_rows``).

Not part of the package or the test-suite. One device call answers: do the wide variants
give the bits of the shipped ``twell_spmm_rows``, and how fast are they at the paper's down
projection (M = 16384, K = 5632, N = 2048, bf16, uniform sparsity 99/95/90%) against the
shipped SpMM (tensor-core ``twell_spmm_mma`` and ``twell_spmm_rows``), dense cuBLAS, and
``A.toarray()`` followed by cuBLAS. Run from the repository root on an H100/H200:

    PYTHONPATH=. python benchmarks/prototypes/spmm_rows_wide.py
"""

import pathlib

import cupy
import numpy as np

import twell
from twell import _cupy_backend, _kernels

HERE = pathlib.Path(__file__).resolve().parent
VARIANTS = [(1, 4), (2, 2), (2, 4), (4, 1), (4, 2), (8, 1), (8, 2)]


def compile_kernels():
    loaded = _kernels.nvrtc_module((HERE / "spmm_rows_wide.cu").read_text(),
                                   "spmm_rows_wide.cu", "sm_90a",
                                   [f"-I{_kernels.source_dir()}"])
    return {v: loaded.get_function(f"proto_spmm_wide_{v[0]}_{v[1]}") for v in VARIANTS}, loaded


def wide(kernel, chunks, a, b):
    p = a._parts
    m, k = a.shape
    n = b.shape[1]
    assert n % 8 == 0 and b.data.ptr % 16 == 0
    out = cupy.empty((m, n), dtype=b.dtype)
    grid = (-(-m // 8), -(-n // (256 * chunks)))
    kernel(grid, (256,), (p.counts, p.data, p.indices, p.overflow_indptr, p.overflow_indices,
                          p.overflow_data, np.int64(m), np.int64(k), np.int32(a.tile_width),
                          np.int32(p.data.shape[2]), b, np.int64(n), out))
    return out


def rows(a, b):
    return _cupy_backend.spmm(a._parts, a.shape, a.tile_width, b, b.dtype, variant="rows")


def activations(rng, m, k, sparsity):
    """bf16 (m, k) with about ``sparsity`` zeros, uniform over columns, positive values."""
    z = cupy.asarray(rng.standard_normal((m, k), dtype=np.float32))
    t = float({0.99: 2.3263, 0.95: 1.6449, 0.9: 1.2816}.get(sparsity, 2.3263))
    return cupy.where(z > t, z - t + 0.05, 0).astype(twell.bfloat16)


def same_bits(x, y):
    return x.shape == y.shape and bool(cupy.array_equal(x.view(np.uint16), y.view(np.uint16)))


def median_ms(fn, reps=20, warmup=3):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop))
    return float(np.median(times))


def time_case(kernels, z, a, b):
    times = [median_ms(lambda: z @ b), median_ms(lambda: a.toarray() @ b),
             median_ms(lambda: a @ b), median_ms(lambda: rows(a, b))]
    return times + [median_ms(lambda kern=kern, c=v[0]: wide(kern, c, a, b))
                    for v, kern in kernels.items()]


def main():
    rng = np.random.default_rng(11)
    kernels, _module = compile_kernels()
    ok = True
    # Partial chunks in N, M not a multiple of 8, tiles of 8 and 256, overflow (slots=1..2).
    for (m, k, n), tile_width, slots, s in [((77, 300, 72), 8, 1, 0.7),
                                            ((300, 1000, 1032), 256, 2, 0.95),
                                            ((1000, 5632, 2048), 256, "auto", 0.99)]:
        a = twell.TwELLMatrix(activations(rng, m, k, s), tile_width=tile_width, slots=slots)
        b = cupy.asarray(rng.standard_normal((k, n), dtype=np.float32)).astype(twell.bfloat16)
        want = rows(a, b)
        for v, kernel in kernels.items():
            got = wide(kernel, v[0], a, b)
            verdict = same_bits(got, want)
            ok &= verdict
            if not verdict:
                print(f"  MISMATCH M={m} K={k} N={n} T={tile_width} S={slots} variant {v}")
        print(f"  checked M={m} K={k} N={n} T={tile_width} S={slots} overflow "
              f"{a.overflow_nnz}: {'same bits' if ok else 'FAILED'}")
    m, k, n = 16384, 5632, 2048
    b = cupy.asarray(rng.standard_normal((k, n), dtype=np.float32) / 40).astype(twell.bfloat16)
    print(f"\nM={m} K={k} N={n} bf16, uniform, CUDA events, median of 20 (ms)")
    header = ["dense", "dense(A)+mm", "shipped", "rows"] + [f"w{c}x{u}" for c, u in VARIANTS]
    print(f"{'sparsity':>8} {'S':>3} " + " ".join(f"{h:>11}" for h in header))
    for s in (0.99, 0.95, 0.9):
        z = activations(rng, m, k, s)
        a = twell.TwELLMatrix(z)
        times = time_case(kernels, z, a, b)
        print(f"{s:>8} {a._parts.data.shape[2]:>3} " + " ".join(f"{t:>11.3f}" for t in times))
    print("all checks passed" if ok else "CHECKS FAILED")


if __name__ == "__main__":
    main()
