"""The dense pack's host costs (twenty-second session): end to end, each piece alone, and the
stage profile.

Modes (bf16 activations at 99%, M 16384, K 5632, the bias-column trick; float32 too for
``e2e``):

- ``e2e``: ``TwELLMatrix(z, slots=13)``, ``TwELLMatrix(z)``, ``matmul_to_twell`` at 13 slots and
  auto, as the bench times them (a CUDA event before the call and one after it returns,
  median of 60 after 5 warm-ups), beside the slots pass alone. Run once per library tree
  (``PYTHONPATH=old`` / ``PYTHONPATH=.``) in separate processes, interleaved.
- ``micro``: the host's microseconds per call of each piece of the path (the minimum over 5
  loops of 400 calls; the GPU drained before each loop).
- ``profile``: ``_dev.StageProfile`` over the pack's steps (those the tree has).

Usage (repository root): ``PYTHONPATH=<tree> python3 benchmarks/results/2026-12-04-h200-v/
host_costs.py e2e|micro|profile``
"""
import sys
import time

sys.path.insert(0, "benchmarks")  # run from the repository root
import _dev  # noqa: E402
import cupy  # noqa: E402
import numpy as np  # noqa: E402

import twell  # noqa: E402
from twell import _convert, _layout, _twell  # noqa: E402
from twell import _cupy_backend as gb  # noqa: E402

M, K, D = 16384, 5632, 2048
rng = np.random.default_rng(0)
z32 = _dev.activations(M, K, D, 0.99, rng)
z = z32.astype(twell.bfloat16)
x, w0, _, _ = _dev.ffn_operands(M, D, K, twell.bfloat16)
w = _dev.gate_weight(w0, 0.99, twell.bfloat16)
tree = twell.__file__.rsplit("/", 2)[0]


def e2e():
    nt = _layout.n_tiles(K, 256)
    parts = gb._empty_parts(M, nt, 13, z.dtype, **({"zeroed": False} if hasattr(gb, "_carve")
                                                  else {"slot_fill": cupy.empty}))
    totals = cupy.empty((M, nt), dtype=np.int32)
    counter = cupy.zeros(1, dtype=np.uint64)
    cases = {
        "slots pass alone (kernel)": lambda: gb._launch_pack_dense(
            z, 256, 13, gb._MODE_SLOTS, totals, parts, None, counter),
        "TwELLMatrix(z, slots=13)": lambda: twell.TwELLMatrix(z, slots=13),
        "TwELLMatrix(z)": lambda: twell.TwELLMatrix(z),
        "TwELLMatrix(z32, slots=13)": lambda: twell.TwELLMatrix(z32, slots=13),
        "TwELLMatrix(z32)": lambda: twell.TwELLMatrix(z32),
        "matmul_to_twell(x, w, slots=13)": lambda: twell.matmul_to_twell(x, w, slots=13),
        "matmul_to_twell(x, w)": lambda: twell.matmul_to_twell(x, w),
    }
    for name, fn in cases.items():
        print(f"{tree:<24} {name:<34} {_dev.timed(fn, 60, warm=5) * 1e3:8.1f} us", flush=True)


def host_us(fn, n=400):
    best = float("inf")
    for _ in range(5):
        cupy.cuda.Device().synchronize()
        t = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t) / n * 1e6)
    cupy.cuda.Device().synchronize()
    return best


def micro():
    nt = _layout.n_tiles(K, 256)
    both, counter, totals = gb._count_buffer(256, ((M, nt), np.int32))
    parts = gb._empty_parts(M, nt, 13, z.dtype, zeroed=False, overflow=False)
    gb._launch_pack_dense(z, 256, 13, gb._MODE_SLOTS, totals, parts, None, counter)
    hist, _ = gb._read_counts(both, totals, 256)
    noop = cupy.RawKernel("extern \"C\" __global__ void noop(const int* a, long long b, int c,"
                          " int d, int e, int f, int* g, int* h, int* i, int* j, int* k) {}",
                          "noop")
    noop1 = cupy.RawKernel("extern \"C\" __global__ void noop1(const int* a) {}", "noop1")
    i64, i32 = np.int64, np.int32
    small = cupy.zeros(8, dtype=np.uint64)
    cases = {
        "cupy.empty((M, nt, 13), bf16)": lambda: cupy.empty((M, nt, 13), dtype=z.dtype),
        "cupy.empty(259, uint64)": lambda: cupy.empty(259, dtype=np.uint64),
        "cupy.zeros(259, uint64)": lambda: cupy.zeros(259, dtype=np.uint64),
        "cupy.cuda.alloc(1 MB)": lambda: cupy.cuda.alloc(1 << 20),
        "cupy.ndarray(memptr=...)": lambda: cupy.ndarray((M, nt), np.int32, memptr=both.data),
        "slice both[-1:]": lambda: both[-1:],
        "gb._empty_parts(.., zeroed=False)": lambda: gb._empty_parts(
            M, nt, 13, z.dtype, zeroed=False, overflow=False),
        "gb._count_buffer(256, totals)": lambda: gb._count_buffer(256, ((M, nt), np.int32)),
        "gb._no_overflow(parts)": lambda: gb._no_overflow(parts),
        "_convert.coerce(z, None, (256, 13))": lambda: _convert.coerce(z, None, (256, 13)),
        "gb._dense_vec(z, 256)": lambda: gb._dense_vec(z, 256),
        "noop kernel, 11 args": lambda: noop((1,), (32,), (
            z, i64(M), i32(1), i32(2), i32(3), i32(4), totals, parts.counts, parts.data,
            parts.indices, counter)),
        "noop kernel, 1 arg": lambda: noop1((1,), (32,), (z,)),
        "gb.count_histogram(totals, 257, out)": lambda: gb.count_histogram(
            totals, 257, out=both[:-1]),
        "small.get() (8 values, GPU idle)": lambda: small.get(),
        "both.get() (259 values, GPU idle)": lambda: both.get(),
        "_layout.checked_histogram": lambda: _layout.checked_histogram(
            both.get().view(np.int64)[:-1], 256),
        "_layout.histogram_nnz(hist)": lambda: _layout.histogram_nnz(hist),
        "_layout.auto_choice(hist, 256)": lambda: _layout.auto_choice(hist, 256),
        "TwELLMatrix._from_parts": lambda: twell.TwELLMatrix._from_parts(
            parts, (M, K), 256, 5),
    }
    for name, fn in cases.items():
        print(f"{name:<40} {host_us(fn):8.2f} us", flush=True)
    n = 50  # launches of the 71 us kernel: the host's cost of each launch call alone
    cupy.cuda.Device().synchronize()
    t = time.perf_counter()
    for _ in range(n):
        gb._launch_pack_dense(z, 256, 13, gb._MODE_SLOTS, totals, parts, None, counter)
    print(f"{'gb._launch_pack_dense (host)':<40} {(time.perf_counter() - t) / n * 1e6:8.2f} us")
    cupy.cuda.Device().synchronize()


def profile():
    p = _dev.StageProfile()
    steps = ("tile_counts_dense", "pack_dense", "_empty_parts", "_count_buffer", "_carve",
             "_launch_pack_dense", "_no_overflow", "_read_counts", "_overflow_offsets",
             "_with_overflow", "count_histogram")
    p.wrap(gb, [s for s in steps if hasattr(gb, s)])
    p.wrap(_layout, ("auto_choice", "checked_histogram", "histogram_nnz"))
    p.wrap(_convert, ("coerce",))
    p.wrap(_twell, ("_pack", "_tile_counts_histogram"))
    print(f"# tree {tree}")
    p.breakdown("TwELLMatrix(z, slots=13)", lambda: twell.TwELLMatrix(z, slots=13))
    p.breakdown("TwELLMatrix(z) (auto)", lambda: twell.TwELLMatrix(z))


{"e2e": e2e, "micro": micro, "profile": profile}[sys.argv[1]]()
