"""PROTOTYPE check and timing of ``spmv_thread_batch.cu`` (a thread per row, a batch's entries
read before their x values) against the shipped SpMV kernels and torch's CSR.

Open question 6 of benchmarks/NOTES.md (eleventh session): the shipped
``twell_spmv_thread_rows`` takes 0.083 ms on the 10^6-row stencil at tile width 65536
(torch's cuSPARSE 0.031, floor ~0.034) because it walks a count batch's non-empty tiles one
after another, each an entries -> x chain. One device call answers: is the prototype right
(within rounding of the float64 product: ``!`` marks a miss, ``?n`` n outputs left
unwritten), and how fast is it against the shipped thread and team kernels, on the same
inputs (``*``: the launcher's pick), on the stencil and the graph at tile widths 65536 and
4096 and on the paper's activations. Run from the repository root on an H100/H200:

    PYTHONPATH=. timeout 300 python benchmarks/prototypes/spmv_thread_batch.py
"""

import pathlib
import sys
import types

import cupy
import numpy as np
from cupyx.scipy import sparse as cs

import twell
from twell import _cupy_backend, _kernels

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # benchmarks/
import _dev  # noqa: E402
import bench  # noqa: E402
import spmm_layout_tuning as layout  # noqa: E402  (HERE is on the path: the script's folder)

SUFFIX = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64", twell.bfloat16: "bf16"}
BLOCK = 256  # kBlock of the prototype


def prototype():
    """The prototype's kernels, by dtype."""
    module = cupy.RawModule(code=(HERE / "spmv_thread_batch.cu").read_text(),
                            options=(*_kernels.OPTIONS, f"-I{_kernels.source_dir()}"))
    return {d: module.get_function(f"proto_spmv_thread_batch_{s}") for d, s in SUFFIX.items()}


def run_prototype(kernel, a, v, poison=False):
    p, (m, k) = a._parts, a.shape
    # Poisoned for the check (an unwritten row shows as NaN), not for the timing.
    y = cupy.full((m, 1), np.nan, dtype=v.dtype) if poison else cupy.empty((m, 1), v.dtype)
    kernel((-(-m // BLOCK),), (BLOCK,), (p.counts, p.data, p.indices, p.overflow_indptr,
                                         p.overflow_indices, p.overflow_data, np.int64(m),
                                         np.int64(k), np.int32(a.tile_width),
                                         np.int32(p.data.shape[2]), v, y))
    return y


def row(kernels, label, x, a, v):
    want = x.astype(np.float64) @ v.astype(np.float64)
    pick = _cupy_backend._spmv_lanes(a._parts, a.shape[0])
    cells = [layout.cell(lambda g=g: layout.spmv(a, v, g), want)[0] + ("*" if g == pick else " ")
             for g in _kernels.SPMV_LANES]
    kernel = kernels[np.dtype(v.dtype)]
    unwritten = int(cupy.isnan(run_prototype(kernel, a, v, poison=True)).sum())
    cells.append(layout.cell(lambda: run_prototype(kernel, a, v), want)[0]
                 + (f"?{unwritten}" if unwritten else ""))
    t = layout.torch_csr(x)
    if t is not None:
        cells.append(layout.cell(lambda: t(v), want)[0])
    room = _cupy_backend._row_room(a._parts, a.shape[0])
    print(f"{label:28s}{room:6.0f} " + " ".join(cells), flush=True)


def main():
    kernels = prototype()
    print("ms, CUDA events, median of 15; * the launcher's pick; ! rel. error above 1e-2")
    heads = [f"lanes={g}" for g in _kernels.SPMV_LANES] + ["batch", "torch"]
    print(" " * 28 + "  room " + " ".join(f"{h:>11s}" for h in heads))
    rng = np.random.default_rng(5)
    ctx = types.SimpleNamespace(xp=cupy, sp=cs)
    cases = []
    for dtype in (np.float32, np.float64):
        x, _ = bench.poisson2d(ctx, 1000, dtype)
        cases += [(f"poisson {np.dtype(dtype).name} T={t}", x, t) for t in (65536, 4096)]
    x, _ = bench.powerlaw_graph(ctx, 10**6, 16.0, 2.0, 7, np.float32)
    cases += [(f"graph float32 T={t}", x, t) for t in (65536, 4096)]
    for label, x, t in cases:
        a = twell.TwELLMatrix(x, tile_width=t)
        v = cupy.asarray(rng.standard_normal((x.shape[1], 1))).astype(x.dtype)
        row(kernels, label, x, a, v)
    for s in (0.99, 0.9):
        z = _dev.activations(16384, 5632, 2048, s, rng)
        for dtype in (twell.bfloat16, np.float32):
            zd = z.astype(dtype)
            v = cupy.asarray(rng.standard_normal((5632, 1))).astype(dtype)
            row(kernels, f"ffn {np.dtype(dtype).name} {s:.0%}", zd, twell.TwELLMatrix(zd), v)


if __name__ == "__main__":
    main()
