"""PROTOTYPE measurements for the gather SpMM ``twell_spmm_rows`` (no new kernel code).

Not part of the package or the test-suite. One device call answers the sixth session's open
questions 1 and 2 (``benchmarks/NOTES.md``), at the paper's down projection (M = 16384,
K = 5632, N = 2048, bf16, uniform sparsity 98-99.5%), every contender on the same inputs:

* where the gather kernel and ``A.toarray() @ B`` (cuBLAS) cross, to set
  the constants of ``twell._layout.dense_product_density`` for 16-bit values;
* whether the shipped kernel is held back by its launch: 32/64/128/256-thread blocks (the
  reference T2D runs 32-thread blocks), and occupancy (the same source compiled with
  ``--maxrregcount`` 64 and 80, with 32- and 256-thread blocks; the build shipped then used
  89 registers on sm_90; its run, 2026-12-03, made the kernel ship with 32-thread blocks and
  ``__maxnreg__(80)``, so "256 thr" here is no longer the shipped launch);
* the reference T2D (C = 8) beside them, when ``--reference DIR`` and PyTorch are given.

Every gather variant must give the shipped kernel's bits (only the launch or the register
budget differs). Run from the repository root on an H100/H200:

    PYTHONPATH=. python benchmarks/prototypes/spmm_gather_tuning.py [--reference reference]
"""

import argparse
import functools
import pathlib
import sys

import cupy
import numpy as np

import twell
from twell import _cupy_backend, _kernels

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))  # benchmarks/
import _dev  # noqa: E402

median_ms = functools.partial(_dev.timed, reps=20)
EXPR = "twell_spmm_rows<__nv_bfloat16, 8>"
COLUMNS_PER_WARP = _cupy_backend._ROWS_CHUNKS * 32 * 8


def rows_kernel(maxrregcount=None):
    if maxrregcount is None:
        return _kernels.function("spmm.cu", EXPR)
    module = cupy.RawModule(code=_kernels.source_text("spmm.cu"),
                            options=(*_kernels.OPTIONS, f"--maxrregcount={maxrregcount}"),
                            name_expressions=[EXPR])
    return module.get_function(EXPR)


def gather(kernel, a, b, block):
    p = a._parts
    m, k = a.shape
    n = b.shape[1]
    out = cupy.empty((m, n), dtype=b.dtype)
    grid = (-(-m // (block // 32)), -(-n // COLUMNS_PER_WARP))
    kernel(grid, (block,), (p.counts, p.data, p.indices, p.overflow_indptr, p.overflow_indices,
                            p.overflow_data, np.int64(m), np.int64(k), np.int32(a.tile_width),
                            np.int32(p.data.shape[2]), b, np.int64(n),
                            cupy.ones((), dtype=bool), out))
    return out


def same_bits(x, y):
    return x.shape == y.shape and bool(cupy.array_equal(x.view(np.uint16), y.view(np.uint16)))


def reference_t2d(folder):
    """(torch, Reference, to_torch) from benchmarks/bench.py, or (None, why, None)."""
    try:
        import bench
        import torch
        return torch, bench.Reference(folder, torch), bench.to_torch
    except Exception as exc:  # noqa: BLE001 - the reference is optional
        return None, f"{type(exc).__name__}: {exc}", None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--reference", help="folder of the reference kernels (twell.py)")
    args = parser.parse_args()
    rng = np.random.default_rng(5)
    m, k, n = 16384, 5632, 2048
    b = cupy.asarray(rng.standard_normal((k, n), dtype=np.float32) / 40).astype(twell.bfloat16)
    variants = {f"{blk} thr": (rows_kernel(), blk) for blk in (32, 64, 128, 256)}
    variants.update({f"r{r} {blk}": (rows_kernel(r), blk) for r in (64, 80) for blk in (32, 256)})
    torch, ref, to_torch = reference_t2d(args.reference) if args.reference else (None, None, None)
    if args.reference and torch is None:
        print(f"reference T2D not run: {ref}")
    header = ["dense", "dense path", "auto"] + list(variants) + (["ref T2D"] if torch else [])
    print(f"M={m} K={k} N={n} bf16, uniform, CUDA events, median of 20 (ms); "
          f"'auto' is A @ B with slots='auto' (the shipped choice)")
    print(f"{'sparsity':>8} {'nnz':>8} " + " ".join(f"{h:>10}" for h in header))
    if torch:
        tdown = to_torch(torch, b)
        tout = torch.empty((m, n), dtype=torch.bfloat16, device="cuda")
    ok = True
    for s in (0.98, 0.985, 0.99, 0.9925, 0.995):
        z = _dev.activations(m, k, 2048, s, rng).astype(twell.bfloat16)  # bias trick
        a = twell.TwELLMatrix(z)
        want = gather(variants["256 thr"][0], a, b, 256)
        times = [median_ms(lambda z=z: z @ b),
                 median_ms(lambda a=a: _cupy_backend.spmm(a._parts, a.shape, a.tile_width, b,
                                                          b.dtype, variant="dense")),
                 median_ms(lambda a=a: a @ b)]
        for name, (kernel, block) in variants.items():
            got = gather(kernel, a, b, block)
            if not same_bits(got, want):
                ok = False
                print(f"  MISMATCH at {s}: {name}")
            times.append(median_ms(lambda a=a, kernel=kernel, block=block:
                                   gather(kernel, a, b, block)))
        if torch:
            packed = to_torch(torch, a.to_packed(8))
            times.append(median_ms(lambda packed=packed: ref.t2d_out(packed, tdown, tout)))
        print(f"{s:>8} {a.nnz:>8} " + " ".join(f"{t:>10.3f}" for t in times), flush=True)
    print("all gather variants give the shipped bits" if ok else "CHECKS FAILED")


if __name__ == "__main__":
    main()
