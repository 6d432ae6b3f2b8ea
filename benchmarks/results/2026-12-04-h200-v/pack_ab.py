"""The dense pack before and after the shuffled pair setup of pack_pairs_staged
(twenty-second session), in one process: the working tree's pack.cu against the session's
starting tree's (13abff8, copied to ``scratch/base``; compiled beside it), both called
through the working tree's launcher (``_cupy_backend._launch_pack_dense`` with
``_kernels.function`` patched for "pack.cu"), so that both run the expression the launcher
picks. The twenty-first session's ``results/2026-12-04-h200-u/pack_ab.py`` runs this script
with its own old tree (c22b014's, ``scratch/old/cuda_src``).

1. Bits: both passes (count, slots) and the overflow pass on odd shapes with NaN, Inf and
   -0.0, every dtype, tile widths that take one load a pair (PAIRS), 2-4 loads (CHUNKS) and
   the scalar path (K not a multiple of the vector), outputs poisoned.
2. Times (us, medians, interleaved in 3 rounds): each pass alone, and ``TwELLMatrix(z)`` and
   ``TwELLMatrix(z, slots=13)`` end to end, bf16 and float32, the paper's activations at
   99/95/90%; a read-only kernel (the prototype's) for the floor.
Usage (repository root; OLD_CUDA_SRC defaults to scratch/base/cuda_src):
    PYTHONPATH=. python3 benchmarks/results/2026-12-04-h200-v/pack_ab.py [OLD_CUDA_SRC]
"""
import contextlib
import functools
import pathlib
import sys

import cupy
import numpy as np

sys.path.insert(0, "benchmarks")
sys.path.insert(0, "benchmarks/prototypes")
import _dev  # noqa: E402
import pack_stream as ps  # noqa: E402

import twell  # noqa: E402
from twell import _cupy_backend as gb  # noqa: E402
from twell import _kernels  # noqa: E402

OLD = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "scratch/base/cuda_src")
_old = {}


def old_function(expression):
    _old["lookups"] = _old.get("lookups", 0) + 1  # printed: the old kernels did run
    if "module" not in _old:  # one compile of every instance the library has
        options = (*_kernels.OPTIONS, f"-I{OLD}", *_kernels._nvrtc_includes())
        _old["module"] = cupy.RawModule(code=(OLD / "pack.cu").read_text(), options=options,
                                        name_expressions=_kernels.INSTANCES["pack.cu"])
    return _old["module"].get_function(expression)


@contextlib.contextmanager
def old_pack():
    new = _kernels.function

    def patched(name, expression):
        return old_function(expression) if name == "pack.cu" else new(name, expression)

    # The launcher keeps the kernels it chose (_pack_dense_kernel): the old tree's get a
    # cache of their own, looked up through the patched _kernels.function.
    shipped_cache = gb._pack_dense_kernel
    _kernels.function = patched
    gb._pack_dense_kernel = _old.setdefault(
        "cache", functools.cache(shipped_cache.__wrapped__))
    try:
        yield
    finally:
        _kernels.function = new
        gb._pack_dense_kernel = shipped_cache


def run_passes(z, tw, slots):
    """Count, slots and overflow passes into poisoned outputs; every array they write."""
    totals, parts, counter = ps.outputs(z, tw, slots)
    gb._launch_pack_dense(z, tw, slots, gb._MODE_COUNT, totals, parts, None, counter)
    count_totals = totals.copy()
    totals.view(np.uint8).fill(0xA5)
    gb._launch_pack_dense(z, tw, slots, gb._MODE_SLOTS, totals, parts, None, counter)
    n_over = int(counter.get()[0])
    over = []
    if n_over:
        offset, row_starts = gb._overflow_offsets(totals, slots)
        parts = gb._with_overflow(parts, row_starts, n_over)
        for a in (parts.overflow_indices, parts.overflow_data):
            a.view(np.uint8).fill(0xA5)
        gb._launch_pack_dense(z, tw, slots, gb._MODE_OVERFLOW, totals, parts, offset, counter)
        over = [parts.overflow_indices, parts.overflow_data]
    return [count_totals, totals, parts.counts, parts.data, parts.indices, counter, *over]


def check(z, tw, slots):
    got = run_passes(z, tw, slots)
    with old_pack():
        want = run_passes(z, tw, slots)
    names = ("count totals", "totals", "counts", "data", "indices", "overflow count",
             "overflow indices", "overflow data")
    if len(got) != len(want):
        return "overflow count"
    for name, a, b in zip(names, got, want, strict=False):
        if a.shape != b.shape or not bool(cupy.array_equal(a.view(np.uint8), b.view(np.uint8))):
            return name
    return ""


def main():
    print(f"{cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()}, "
          f"CuPy {cupy.__version__}")
    rng = np.random.default_rng(5)
    failures = checked = 0
    for dtype in (twell.bfloat16, np.float16, np.float32, np.float64):
        for m, k in ((1000, 1000), (257, 2056), (77, 1001), (33, 4099)):
            z = ps.odd_matrix(rng, m, k, dtype)
            for tw in (8, 32, 64, 128, 256, 512, 1024):
                for slots in sorted({1, 3, min(tw, 16), tw}):
                    err = check(z, tw, slots)
                    checked += 1
                    if err:
                        failures += 1
                        print(f"  FAIL {np.dtype(dtype).name} {m}x{k} T={tw} S={slots}: {err}")
    print(f"{checked} cases, " + ("all bits equal" if not failures else
                                  f"{failures} DIFFER")
          + f" ({_old.get('lookups', 0)} old kernels looked up)", flush=True)

    read = ps.module([ps.expr(twell.bfloat16, 256, 2)]).get_function("proto_read_only")
    sink = cupy.zeros(1, dtype=np.uint32)
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    rows = []
    for s in (0.99, 0.95, 0.90):
        for dtype in (twell.bfloat16, np.float32):
            z = _dev.activations(16384, 5632, 2048, s, np.random.default_rng(0)).astype(dtype)
            slots = twell.TwELLMatrix(z).slots
            totals, parts, counter = ps.outputs(z, 256, slots)
            steps = {
                "slots pass": lambda z=z, sl=slots, o=(totals, parts, counter):
                    gb._launch_pack_dense(z, 256, sl, gb._MODE_SLOTS, o[0], o[1], None, o[2]),
                "count pass": lambda z=z, sl=slots, o=(totals, parts, counter):
                    gb._launch_pack_dense(z, 256, sl, gb._MODE_COUNT, o[0], o[1], None, o[2]),
                "TwELLMatrix(z)": lambda z=z: twell.TwELLMatrix(z),
                "TwELLMatrix(z, slots=13)": lambda z=z: twell.TwELLMatrix(z, slots=13),
            }
            times = {}
            for _ in range(3):
                for name, fn in steps.items():
                    times.setdefault((name, "new"), []).append(_dev.timed(fn, reps=20))
                    with old_pack():
                        times.setdefault((name, "shipped"), []).append(_dev.timed(fn, reps=20))
                times.setdefault(("read only", ""), []).append(_dev.timed(
                    lambda z=z: read((sms * 8,), (256,), (z, np.int64(z.nbytes // 16), sink)),
                    reps=20))
            label = f"{np.dtype(dtype).name} {s:.2f} S={slots}"
            for name in steps:
                v4, new = (float(np.median(times[(name, w)])) * 1e3 for w in ("shipped", "new"))
                rows.append((label, name, v4, new))
            ro = float(np.median(times[("read only", "")])) * 1e3
            rows.append((label, "read only (floor)", ro, ro))
    print(f"\n{'case':<22} {'step':<26} {'old us':>8} {'new us':>8} {'new/old':>7}")
    for label, name, v4, new in rows:
        print(f"{label:<22} {name:<26} {v4:8.1f} {new:8.1f} {new / v4:7.2f}")


if __name__ == "__main__":
    main()
