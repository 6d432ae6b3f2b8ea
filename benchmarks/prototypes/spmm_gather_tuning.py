"""PROTOTYPE measurements for the gather SpMM ``twell_spmm_rows`` (no new kernel code).

Not part of the package or the test-suite. One device call times, at the paper's down
projection (M = 16384, K = 5632, N = 2048, bf16, uniform sparsity 98-99.5%), every
contender on the same inputs:

* the shipped launch (one warp per block, ``__maxnreg__(80)``) against the same source with
  other column chunks per warp (``kChunks`` 2, 3, 4) and register caps (64, 72, 80, none):
  fewer chunks hold fewer accumulators, and 64 registers would give the 32 warps per SM of the
  reference T2D (benchmarks/NOTES.md, open question 1). Each build's registers and spill
  bytes (the driver's function attributes) are printed with it;
* the dense path (``A.toarray() @ B``), ``A @ B`` as shipped and dense cuBLAS, so that the
  crossover of ``twell._layout.dense_product_density`` can be checked;
* the reference T2D (C = 8), when ``--reference DIR`` and PyTorch are given.

The variants are the shipped source with its two constants replaced in the text before
NVRTC compiles it. Every variant must give the shipped kernel's bits: chunking changes which
warp computes a column, not the order of its sum. History: the first run (seventh session,
2026-12-03) timed the then-shipped 256-thread launch against 32-256-thread blocks and
``--maxrregcount`` 64/80; it made the kernel ship with one warp per block and 80 registers.
Run from the repository root on an H100/H200:

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
SHIPPED_CHUNKS = "constexpr int kChunks = 4;"
SHIPPED_CAP = "constexpr int kRowsMaxRegisters = 80;"
CAP_MACRO = "#define TWELL_ROWS_MAXNREG __maxnreg__(kRowsMaxRegisters)"


def rows_kernel(chunks=None, cap=80):
    """(kernel, columns per warp, registers, local bytes): the shipped source with kChunks =
    ``chunks`` and a register cap of ``cap`` (None: no cap); defaults: the shipped kernel."""
    source = _kernels.source_text("spmm.cu")
    for text in (SHIPPED_CHUNKS, SHIPPED_CAP, CAP_MACRO):
        assert text in source, f"spmm.cu no longer holds {text!r}: update this prototype"
    chunks = chunks or _cupy_backend._ROWS_CHUNKS
    if (chunks, cap) == (_cupy_backend._ROWS_CHUNKS, 80):
        kernel = _kernels.function("spmm.cu", EXPR)
    else:
        source = source.replace(SHIPPED_CHUNKS, f"constexpr int kChunks = {chunks};")
        source = source.replace(SHIPPED_CAP, f"constexpr int kRowsMaxRegisters = {cap or 255};")
        if cap is None:
            source = source.replace(CAP_MACRO, "#define TWELL_ROWS_MAXNREG")
        module = cupy.RawModule(code=source, options=_kernels.OPTIONS, name_expressions=[EXPR])
        kernel = module.get_function(EXPR)
    return kernel, chunks * 32 * 8, kernel.num_regs, kernel.local_size_bytes


def gather(variant, a, b):
    kernel, columns_per_warp = variant[:2]
    p = a._parts
    m, k = a.shape
    n = b.shape[1]
    out = cupy.empty((m, n), dtype=b.dtype)
    kernel((m, -(-n // columns_per_warp)), (32,), (
        p.counts, p.data, p.indices, p.overflow_indptr, p.overflow_indices, p.overflow_data,
        np.int64(m), np.int64(k), np.int32(a.tile_width), np.int32(p.data.shape[2]), b,
        np.int64(n), cupy.ones((), dtype=bool), out))
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
    variants = {"shipped": rows_kernel()}
    for chunks in (2, 3, 4):
        for cap in (64, 72, 80, None):
            if (chunks, cap) != (4, 80):
                variants[f"c{chunks} r{cap or 'any'}"] = rows_kernel(chunks, cap)
    for name, (_, _, regs, local) in variants.items():
        print(f"{name}: {regs} registers, {local} bytes of local memory (spills)")
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
        want = gather(variants["shipped"], a, b)
        times = [median_ms(lambda z=z: z @ b),
                 median_ms(lambda a=a: _cupy_backend.spmm(a._parts, a.shape, a.tile_width, b,
                                                          b.dtype, variant="dense")),
                 median_ms(lambda a=a: a @ b)]
        for name, variant in variants.items():
            if not same_bits(gather(variant, a, b), want):
                ok = False
                print(f"  MISMATCH at {s}: {name}")
            times.append(median_ms(lambda a=a, variant=variant: gather(variant, a, b)))
        if torch:
            packed = to_torch(torch, a.to_packed(8))
            times.append(median_ms(lambda packed=packed: ref.t2d_out(packed, tdown, tout)))
        print(f"{s:>8} {a.nnz:>8} " + " ".join(f"{t:>10.3f}" for t in times), flush=True)
    print("all gather variants give the shipped bits" if ok else "CHECKS FAILED")


if __name__ == "__main__":
    main()
