"""PROTOTYPE measurements for the gather SpMM's shapes (no kernel code of its own).

``twell_spmm_rows<T, VEC, G, C, E>`` (``cuda_src/spmm.cu``) takes any team width G (8, 16,
32) and any C column chunks x E entries in flight with C * E = 4; the launcher ships five
of them (``_kernels.SPMM_ROWS_SHAPES``, picked from N by ``_cupy_backend._rows_shape``).
Open question 1 of benchmarks/NOTES.md (ninth session): the Poisson stencil with N = 64
float32 is 0.53 ms against torch's CSR 0.46-0.50, and 2 rows per warp gained 1.35x over 1;
would 4 rows per warp ((8, 2, 2), (8, 4, 1)) gain more, and what does each shape cost the
power-law graph and the FFN shape? Every shape is compiled from the shipped source and run
through the shipped launcher (split rows included), checked against the float64 product
(different shapes sum in different orders), and timed with CUDA events on the same inputs,
float32 at tile width 65536 for the bench's scientific matrices, bf16 for the paper's down
projection at 99%. Run from the repository root on an H100/H200:

    PYTHONPATH=. timeout 300 python benchmarks/prototypes/spmm_shapes_tuning.py
"""

import functools
import pathlib
import sys
import types

import cupy
import numpy as np
from cupyx.scipy import sparse as cs

import twell
from twell import _cupy_backend, _kernels

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))  # benchmarks/
import _dev  # noqa: E402
import bench  # noqa: E402

median_ms = functools.partial(_dev.timed, reps=15)
SHAPES = [(g, c, 4 // c) for g in (32, 16, 8) for c in (4, 2, 1) if g % (4 // c) == 0]
DTYPES = {"float": np.float32, "__nv_bfloat16": twell.bfloat16}


def install(shapes):
    """Compile every shape for float32 and bf16 (both vector widths) and route the launcher's
    kernel lookups for them to that module."""
    exprs = [f"{kernel}<{ctype}, {vec}, {g}, {c}, {e}>"
             for kernel in ("twell_spmm_rows", "twell_spmm_overflow_chunks")
             for ctype, dtype in DTYPES.items()
             for vec in (1, _kernels.vector_width(np.dtype(dtype)))
             for g, c, e in shapes]
    module = cupy.RawModule(code=_kernels.source_text("spmm.cu"), options=_kernels.OPTIONS,
                            name_expressions=exprs)
    shipped = _kernels.function

    def function(name, expression):
        if name == "spmm.cu" and expression in exprs:
            return module.get_function(expression)
        return shipped(name, expression)

    _kernels.function = function


def run(a, b, shape):
    shipped = _cupy_backend._rows_shape
    _cupy_backend._rows_shape = lambda n, dtype: shape
    try:
        return _cupy_backend.spmm(a._parts, a.shape, a.tile_width, b, np.dtype(b.dtype),
                                  variant="rows")
    finally:
        _cupy_backend._rows_shape = shipped


def row(label, a, x64, b, rhs64):
    want = x64 @ rhs64
    norm = float(cupy.linalg.norm(want))
    shipped = _cupy_backend._rows_shape(b.shape[1], b.dtype)
    cells = []
    for shape in SHAPES:
        err = float(cupy.linalg.norm(run(a, b, shape).astype(np.float64) - want)) / norm
        ms = median_ms(lambda shape=shape: run(a, b, shape))
        mark = "*" if shape == shipped else " "
        cells.append(f"{ms:7.3f}{mark}" + ("" if err < 1e-2 else f"!{err:.0e}"))
    print(f"{label:24s}" + " ".join(cells), flush=True)


def main():
    install(SHAPES)
    print("ms, CUDA events, median of 15; * the shipped shape; ! rel. error above 1e-2")
    print(" " * 24 + " ".join(f"{str(s):>8s}" for s in SHAPES))
    rng = np.random.default_rng(5)
    ctx = types.SimpleNamespace(xp=cupy, sp=cs)
    for name, make in (("poisson", lambda: bench.poisson2d(ctx, 1000, np.float32)),
                       ("graph", lambda: bench.powerlaw_graph(ctx, 10**6, 16.0, 2.0, 7,
                                                              np.float32))):
        x, _ = make()
        a = twell.TwELLMatrix(x, tile_width=65536)
        x64 = x.astype(np.float64)
        for n in (64, 128, 256):
            b = cupy.asarray(rng.standard_normal((x.shape[1], n), dtype=np.float32))
            row(f"{name} fp32 N={n}", a, x64, b, b.astype(np.float64))
        del x, a, x64
    z = _dev.activations(16384, 5632, 2048, 0.99, rng)
    w = cupy.asarray(rng.standard_normal((5632, 2048), dtype=np.float32)) / np.sqrt(5632)
    zb, wb = z.astype(twell.bfloat16), w.astype(twell.bfloat16)
    row("ffn bf16 99% N=2048", twell.TwELLMatrix(zb), zb.astype(np.float64), wb,
        wb.astype(np.float64))


if __name__ == "__main__":
    main()
