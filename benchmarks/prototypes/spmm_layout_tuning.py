"""PROTOTYPE measurements: the gather SpMM's shape from the layout, and the SpMV's team width.

Open question 1 of benchmarks/NOTES.md (tenth session): short rows (the Poisson stencil)
want narrow teams with column chunks, long or skewed rows (the power-law graph) the shapes
picked from N alone. The launcher now tells them apart by the layout's array shapes
(``_cupy_backend._short_rows``: room for at most ``SHORT_ROW_ENTRIES`` entries a row); the
SpMV takes a thread per row or a team of 32 lanes by a test of the same kind
(``_cupy_backend._spmv_lanes``). This script times, on the same inputs in one process:

* the SpMM through the shipped launcher with the layout taken for one of long rows and for
  one of short rows (the rule's pick is starred), against torch's CSR (cuSPARSE) and, with
  ``--baseline FILE`` (the headers-inlined ``spmm.cu`` of an earlier commit, e.g. from
  ``_kernels.source_text`` there), that commit's kernel with the long-row shape: the same
  order of sums, so its bits must match (``=``);
* the SpMV with a thread per row (``twell_spmv_thread_rows``) and teams of 8, 16 and 32
  lanes, against torch's CSR and the baseline's ``twell_spmv`` (a warp per row) when given.

Every result is checked against the float64 product (``!``: relative error above 1e-2).
Run from the repository root on an H100/H200:

    PYTHONPATH=. timeout 400 python benchmarks/prototypes/spmm_layout_tuning.py \\
        [--baseline OLD_SPMM.cu] [--quick]
"""

import argparse
import contextlib
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
CTYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double",
          twell.bfloat16: "__nv_bfloat16"}
LANES = (1, 8, 16, 32)  # SpMV lanes per row; 1: twell_spmv_thread_rows


class Kernels:
    """Routes the launcher's ``spmm.cu`` lookups: to a module of the current source with
    every SpMV team width, or to the baseline module (``mode = "baseline"``)."""

    def __init__(self, baseline):
        self.shipped = _kernels.function
        self.mode = "current"
        exprs = [f"twell_spmv_rows<{c}, {g}>" for c in CTYPES.values() for g in LANES[1:]]
        self.current = cupy.RawModule(code=_kernels.source_text("spmm.cu"),
                                      options=_kernels.OPTIONS, name_expressions=exprs)
        self.current_exprs = set(exprs)
        self.baseline = None
        if baseline:
            shapes = {_cupy_backend._rows_shape(n, d, False) for n in (1, 64, 128, 256, 512,
                                                                         2048) for d in CTYPES}
            exprs = [f"{k}<{c}, {v}, {g}, {cc}, {e}>"
                     for k in ("twell_spmm_rows", "twell_spmm_overflow_chunks")
                     for d, c in CTYPES.items() for v in (1, _kernels.vector_width(d))
                     for g, cc, e in shapes] + [f"twell_spmv<{c}>" for c in CTYPES.values()]
            self.baseline = cupy.RawModule(code=pathlib.Path(baseline).read_text(),
                                           options=_kernels.OPTIONS, name_expressions=exprs)
        _kernels.function = self.function

    def function(self, name, expression):
        if name == "spmm.cu" and self.mode == "baseline":
            return self.baseline.get_function(expression)
        if name == "spmm.cu" and expression in self.current_exprs:
            return self.current.get_function(expression)
        return self.shipped(name, expression)


@contextlib.contextmanager
def patched(name, value):
    """``_cupy_backend.<name>`` set to ``value`` for the duration."""
    saved = getattr(_cupy_backend, name)
    setattr(_cupy_backend, name, value)
    try:
        yield
    finally:
        setattr(_cupy_backend, name, saved)


def rows(a, b):
    return _cupy_backend.spmm(a._parts, a.shape, a.tile_width, b, np.dtype(b.dtype),
                              variant="rows")


def product(a, b, short):
    with patched("SHORT_ROW_ENTRIES", 2**62 if short else -1):
        return rows(a, b)


def spmv(a, v, lanes):
    with patched("_spmv_lanes", lambda *_: lanes):
        return rows(a, v)


def baseline_spmv(kernels, a, v):
    p, (m, k) = a._parts, a.shape
    out = cupy.empty((m, 1), dtype=v.dtype)
    f = kernels.baseline.get_function(f"twell_spmv<{CTYPES[np.dtype(v.dtype)]}>")
    f((-(-m // 8),), (256,), (p.counts, p.data, p.indices, p.overflow_indptr,
                               p.overflow_indices, p.overflow_data, np.int64(m), np.int64(k),
                               np.int32(a.tile_width), np.int32(p.data.shape[2]), v, out))
    return out


def torch_csr(x):
    """torch's CSR product with ``x`` (a cupyx CSR matrix or a dense CuPy array), or None."""
    try:
        import torch
    except ImportError:
        return None
    if isinstance(x, cupy.ndarray):
        t = bench.to_torch(torch, x).to_sparse_csr()
    else:
        t = torch.sparse_csr_tensor(torch.from_dlpack(x.indptr.astype(np.int64)),
                                    torch.from_dlpack(x.indices.astype(np.int64)),
                                    torch.from_dlpack(x.data), size=x.shape)
    return lambda b: torch.sparse.mm(t, bench.to_torch(torch, b))


def cell(fn, want, bits=None):
    """'ms' of fn() with marks: '!' when its result is off the float64 product ``want``,
    '=' / '~' when its bits equal / differ from ``bits``; and the result."""
    got = fn()
    if not isinstance(got, cupy.ndarray):  # torch
        got = cupy.from_dlpack(got.double())
    err = float(cupy.linalg.norm(got.astype(np.float64).reshape(want.shape) - want))
    err /= float(cupy.linalg.norm(want))
    ms = median_ms(fn)
    mark = "" if err < 1e-2 else f"!{err:.0e}"
    if bits is not None:
        same = cupy.array_equal(got.view(f"u{got.itemsize}"), bits.view(f"u{got.itemsize}"))
        mark += "=" if same else "~"
    return f"{ms:8.3f}{mark:3s}", got


def spmm_row(kernels, label, x, a, b):
    want = x.astype(np.float64) @ b.astype(np.float64)
    short = _cupy_backend._short_rows(a._parts, a.shape[0])
    cells = []
    long_cell, long_bits = cell(lambda: product(a, b, False), want)
    short_cell, _ = cell(lambda: product(a, b, True), want)
    cells += [long_cell + (" " if short else "*"), short_cell + ("*" if short else " ")]
    if kernels.baseline is not None:
        kernels.mode = "baseline"
        try:
            base_cell, _ = cell(lambda: product(a, b, False), want, long_bits)
        finally:
            kernels.mode = "current"
        cells.append(base_cell)
    t = torch_csr(x)
    if t is not None:
        cells.append(cell(lambda: t(b), want)[0])
    print(f"{label:34s}" + " ".join(cells), flush=True)


def spmv_row(kernels, label, x, a, v):
    want = x.astype(np.float64) @ v.astype(np.float64)
    pick = _cupy_backend._spmv_lanes(a._parts, a.shape[0])
    cells = [cell(lambda g=g: spmv(a, v, g), want)[0] + ("*" if g == pick else " ")
             for g in LANES]
    if kernels.baseline is not None:
        cells.append(cell(lambda: baseline_spmv(kernels, a, v), want)[0])
    t = torch_csr(x)
    if t is not None:
        cells.append(cell(lambda: t(v), want)[0])
    print(f"{label:34s}" + " ".join(cells), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", help="headers-inlined spmm.cu of an earlier commit")
    parser.add_argument("--quick", action="store_true",
                        help="float32 at N = 64 and 256, the FFN shape at 99%% only")
    args = parser.parse_args()
    kernels = Kernels(args.baseline)
    base = ["baseline"] if args.baseline else []
    print("ms, CUDA events, median of 15; * the rule's pick; ! rel. error above 1e-2; "
          "= / ~: baseline bits equal / not to the long-row shape's")
    print("SpMM" + " " * 30 + " ".join(f"{h:>11s}" for h in ["long", "short", *base,
                                                               "torch"]))
    rng = np.random.default_rng(5)
    ctx = types.SimpleNamespace(xp=cupy, sp=cs)
    sci = (("poisson", lambda d: bench.poisson2d(ctx, 1000, d)),
           ("graph", lambda d: bench.powerlaw_graph(ctx, 10**6, 16.0, 2.0, 7, d)))
    vectors = []
    for name, make in sci:
        for dtype, widths in (((np.float32, (64, 256)),) if args.quick else
                              ((np.float32, (64, 128, 256, 512)), (np.float64, (64, 256)))):
            x, _ = make(dtype)
            for t in (65536, 4096):
                a = twell.TwELLMatrix(x, tile_width=t)
                cap = a.n_tiles * a.slots + a.overflow_nnz / a.shape[0]
                for n in widths:
                    b = cupy.asarray(rng.standard_normal((x.shape[1], n))).astype(dtype)
                    spmm_row(kernels, f"{name} {np.dtype(dtype).name} T={t} ({cap:.0f}) N={n}",
                             x, a, b)
                if dtype == np.float32:
                    vectors.append((f"{name} float32 T={t} ({cap:.0f})", x, a))
    ffn = []
    for s in (0.99,) if args.quick else (0.99, 0.95, 0.9):
        z = _dev.activations(16384, 5632, 2048, s, rng).astype(twell.bfloat16)
        a = twell.TwELLMatrix(z)
        cap = a.n_tiles * a.slots + a.overflow_nnz / a.shape[0]
        label = f"ffn bf16 {s:.0%} ({cap:.0f})"
        ffn.append((label, z, a))
        for n in (2048, 128) if s == 0.99 else (2048,):
            w = (cupy.asarray(rng.standard_normal((5632, n), dtype=np.float32))
                 / np.sqrt(5632)).astype(twell.bfloat16)
            spmm_row(kernels, f"{label} N={n}", z, a, w)
    print("SpMV" + " " * 30 + " ".join(f"{h:>11s}" for h in [*map(str, LANES), *base,
                                                               "torch"]))
    for label, x, a in vectors + ffn:
        v = cupy.asarray(rng.standard_normal((x.shape[1], 1))).astype(x.dtype)
        spmv_row(kernels, label, x, a, v)


if __name__ == "__main__":
    main()
