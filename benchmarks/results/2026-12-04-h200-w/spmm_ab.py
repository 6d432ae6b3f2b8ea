"""The gather SpMM before and after batches that span windows of tiles
(``benchmarks/prototypes/spmm_batches_across_windows.patch``, twenty-third session; not yet
run: the device was not lent after that session's first call), in one process: the working
tree's spmm.cu, with the patch applied, against the tree before it (``scratch/base/cuda_src``:
``git archive 4c648a1 cuda_src``, whose spmm.cu is the one the patch applies to; compiled
beside it), both called through the working tree's launcher (``_cupy_backend.spmm`` with
``_kernels.function`` patched for "spmm.cu": the old tree has no one-window instance, so
its expression goes to the old kernel without that argument, which walks such rows its own
way).

A third build, the working tree's spmm.cu with ``-DTWELL_SPMM_HELD_AS_LOADED=0`` ("made":
every held entry made into an Entry at once, the patch's first form), measures what keeping
float32 and float64 entries as loaded until their batch is whole gives; it must give the
new build's bits.

1. Bits: rows of at most one window of G tiles, G the team's lanes (the paper's activations
   at tile width 256, the graph at 65536 with 16 lanes a row: ``one_window``) must give the
   old bits; wider ones may give others (new batches), within rounding of cuSPARSE's
   product (torch CSR) or, for the activations, of the old kernel's.
2. Times (ms, medians of CUDA-event timings, old and new interleaved in 3 rounds): the
   gather kernel (``variant="rows"``) on the activations (bf16 99/95/90%, float32 99%), the
   power-law graph and the Poisson stencil with 64 and 256 float32 columns at tile widths
   4096 (with and without the tile index) and 65536, float64 at 4096, and the graph's SpMV;
   since the twenty-fourth session also a Pareto(1.5) graph at 65536 with 64 columns, with
   the capped and the uncapped slots="auto"; torch's cuSPARSE CSR on the same inputs.
Usage (repository root):
    PYTHONPATH=. python3 benchmarks/results/2026-12-04-h200-w/spmm_ab.py [OLD_CUDA_SRC]
"""
import contextlib
import functools
import pathlib
import sys
import types

import cupy
import cupyx.scipy.sparse
import numpy as np

sys.path.insert(0, "benchmarks")
import _dev  # noqa: E402
import bench as B  # noqa: E402

import twell  # noqa: E402
from twell import _cupy_backend as gb  # noqa: E402
from twell import _kernels  # noqa: E402

OLD = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "scratch/base/cuda_src")
ONE = ", false, true>"
#: The other spmm.cu builds: the tree before the patch, and the working tree's with every
#: held entry made into an Entry at once (TWELL_SPMM_HELD_AS_LOADED=0: the patch's first
#: form), to measure what keeping float32/float64 entries as loaded gives.
VARIANTS = {"old": (OLD, ()), "made": (pathlib.Path("cuda_src"),
                                        ("-DTWELL_SPMM_HELD_AS_LOADED=0",))}
_modules, _lookups = {}, {}


def variant_function(variant, expression):
    _lookups[variant] = _lookups.get(variant, 0) + 1  # printed: those kernels did run
    src, defines = VARIANTS[variant]
    if variant not in _modules:
        options = (*_kernels.OPTIONS, *defines, f"-I{src}", *_kernels._nvrtc_includes())
        names = _kernels.INSTANCES["spmm.cu"]
        if variant == "old":
            names = [e for e in names if not e.endswith(ONE)]
        _modules[variant] = cupy.RawModule(code=(src / "spmm.cu").read_text(), options=options,
                                           name_expressions=names)
    if variant == "old" and expression.endswith(ONE):
        expression = expression[:-len(ONE)] + ">"
    return _modules[variant].get_function(expression)


@contextlib.contextmanager
def spmm_from(variant):
    new = _kernels.function

    def patched(name, expression):
        if name == "spmm.cu":
            return variant_function(variant, expression)
        return new(name, expression)

    _kernels.function = patched
    try:
        yield
    finally:
        _kernels.function = new


def product(a, b, index=None):
    """The gather kernel (the SpMV kernels for one column), as ``a @ b`` launches it."""
    return gb.spmm(a._parts, a.shape, a.tile_width, b, a.dtype, variant="rows",
                   tile_index=index)


def one_window(a, n, index):
    """Whether the old and new kernels must give the same bits: rows of at most one window
    of G tiles (G the team's lanes) walked by their counts, or a thread per row (SpMV)."""
    if index is not None:
        return False
    if n == 1:
        lanes = gb._spmv_lanes(a._parts, a.shape[0])
        return lanes == 1 or a.n_tiles <= lanes
    return a.n_tiles <= gb._rows_shape(n, a.dtype, gb._short_rows(a._parts, a.shape[0]))[0]


def main():
    import torch

    print(f"{cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()}, "
          f"CuPy {cupy.__version__}, torch {torch.__version__}", flush=True)
    ns = types.SimpleNamespace(xp=cupy, sp=cupyx.scipy.sparse)
    cases = []  # (label, a, b, index, torch csr or None, torch b)
    rng = np.random.default_rng(0)
    for s in (0.99, 0.95, 0.90):
        z = _dev.activations(16384, 5632, 2048, s, rng)
        for dtype in ((twell.bfloat16, np.float32) if s == 0.99 else (twell.bfloat16,)):
            a = twell.TwELLMatrix(z.astype(dtype))
            b = cupy.asarray(rng.standard_normal((5632, 2048), dtype=np.float32)).astype(dtype)
            cases.append((f"ffn {np.dtype(dtype).name} {s:.2f}", a, b, None, None, None))
    for name, make in (("graph", lambda dt: B.powerlaw_graph(
            ns, B.SCI_GRAPH_N, B.SCI_GRAPH_DEGREE, B.SCI_GRAPH_ALPHA, 5, dt)[0]),
                       ("poisson", lambda dt: B.poisson2d(ns, B.SCI_GRID, dt)[0])):
        for dtype in (np.float32, np.float64):
            csr = make(dtype)
            n = csr.shape[0]
            tcsr = torch.sparse_csr_tensor(B.to_torch(torch, csr.indptr),
                                           B.to_torch(torch, csr.indices),
                                           B.to_torch(torch, csr.data), size=(n, n))
            rhs = (64, 256, 1) if dtype == np.float32 else (64,)
            for t in ((4096, 65536) if dtype == np.float32 else (4096,)):
                a = twell.TwELLMatrix(csr, tile_width=t)
                index = None
                if t == 4096:
                    a.index_tiles()
                    index = a.tile_index
                for r in rhs:
                    b = cupy.asarray(rng.standard_normal((n, r), dtype=np.float32)).astype(dtype)
                    tb = torch.from_dlpack(b)
                    label = f"{name} {np.dtype(dtype).name} N={r} T={t}"
                    cases.append((label, a, b, None, tcsr, tb))
                    if index is not None and r != 1:
                        cases.append((label + " +index", a, b, index, tcsr, tb))
            del csr
    # (twenty-fourth session) A heavier-tailed graph, Pareto(1.5) degrees: slots="auto" is
    # capped there (52 slots, 5.4% overflow, 5 GB at 65536, by the CPU's generator), against
    # the uncapped 1% rule (579 slots, 56 GB) while it fits.
    csr = B.powerlaw_graph(ns, B.SCI_GRAPH_N, B.SCI_GRAPH_DEGREE, 1.5, 5, np.float32)[0]
    n = csr.shape[0]
    tcsr = torch.sparse_csr_tensor(B.to_torch(torch, csr.indptr), B.to_torch(torch, csr.indices),
                                   B.to_torch(torch, csr.data), size=(n, n))
    b = cupy.asarray(rng.standard_normal((n, 64), dtype=np.float32))
    tb = torch.from_dlpack(b)
    a = twell.TwELLMatrix(csr, tile_width=65536)
    hist = np.bincount(cupy.asnumpy(a.tile_nnz()).ravel())
    cases.append((f"graph1.5 float32 N=64 T=65536 S={a.slots}", a, b, None, tcsr, tb))
    uncapped = twell.auto_slots(hist, 65536, max_factor=None)
    try:
        a = twell.TwELLMatrix(csr, tile_width=65536, slots=uncapped)
        cases.append((f"graph1.5 float32 N=64 T=65536 S={uncapped}", a, b, None, tcsr, tb))
    except cupy.cuda.memory.OutOfMemoryError:
        print(f"graph1.5 with {uncapped} slots: out of memory, skipped", flush=True)
    del csr

    # 1. Bits and accuracy.
    same = differ = bad = 0
    for label, a, b, index, tcsr, tb in cases:
        one = one_window(a, b.shape[1], index)
        new = product(a, b, index)
        with spmm_from("old"):
            old = product(a, b, index)
        with spmm_from("made"):
            made = product(a, b, index)
        equal = bool(cupy.array_equal(new.view(np.uint8), old.view(np.uint8)))
        # Keeping entries as loaded changes when they are made, not their sums.
        made_equal = bool(cupy.array_equal(new.view(np.uint8), made.view(np.uint8)))
        if tcsr is not None:
            want = cupy.from_dlpack(tcsr @ tb).astype(np.float64)
        else:
            want = old.astype(np.float64)
        err = float(cupy.linalg.norm(new.astype(np.float64) - want) / cupy.linalg.norm(want))
        tol = 1e-2 if a.dtype.itemsize == 2 else 1e-5 if a.dtype.itemsize == 4 else 1e-12
        ok = err <= tol and (equal or not one) and made_equal
        same += equal
        differ += not equal
        bad += not ok
        print(f"  {label:<40} bits {'equal' if equal else 'differ'} (one window: {one}), "
              f"rel. error {err:.1e}, made {'equal' if made_equal else 'DIFFERS'} "
              f"{'ok' if ok else 'FAIL'}", flush=True)
    print(f"{len(cases)} cases: {same} bit-equal, {differ} differ, "
          + ("all right" if not bad else f"{bad} WRONG")
          + f" (kernels looked up: {_lookups})", flush=True)

    # 2. Times.
    rows = []
    for label, a, b, index, tcsr, tb in cases:
        times = {}
        ours = functools.partial(product, a, b, index)
        for _ in range(3):
            times.setdefault("new", []).append(_dev.timed(ours, 10))
            for variant in VARIANTS:
                with spmm_from(variant):
                    times.setdefault(variant, []).append(_dev.timed(ours, 10))
            if tcsr is not None and index is None:
                times.setdefault("torch", []).append(
                    _dev.timed(lambda tcsr=tcsr, tb=tb: tcsr @ tb, 10))
        med = {k: float(np.median(v)) for k, v in times.items()}
        rows.append((label, med["old"], med["made"], med["new"], med.get("torch")))
    print(f"\n{'case':<40} {'old ms':>8} {'made ms':>8} {'new ms':>8} {'new/old':>7} "
          f"{'torch':>8} {'x torch':>7}")
    for label, old, made, new, tt in rows:
        t = f"{tt:8.3f} {tt / new:7.2f}" if tt else f"{'-':>8} {'-':>7}"
        print(f"{label:<40} {old:8.3f} {made:8.3f} {new:8.3f} {new / old:7.2f} {t}")


if __name__ == "__main__":
    main()
