"""Where the host time of the pack and the fused D2T goes (bf16 99%, paper shapes).

Fifteenth GPU session, H200 (README.md beside this file). Call 1 ran the phase table (the part
after ``rows_summary``, which did not exist yet) on a650206: call1_host.txt. Call 9 ran
``rows_summary`` alone (ROWS_ONLY=1) on the old and the new library in turn, LABEL naming
each: call9_ab.txt; it stopped at the "twell->csr bf16" row (cupyx holds no bfloat16).
Run from the repository root with the library under test first on PYTHONPATH."""
import sys
import time

sys.path.insert(0, "benchmarks")
import os  # noqa: E402

import _dev  # noqa: E402
import cupy  # noqa: E402
import numpy as np  # noqa: E402
from scipy.special import ndtri  # noqa: E402

import twell  # noqa: E402
from twell import _cupy_backend as gb  # noqa: E402
from twell import _kernels  # noqa: E402

LABEL = os.environ.get("LABEL", "new")
rng = np.random.default_rng(0)
m, n, k = 16384, 5632, 2048
x = cupy.asarray(rng.standard_normal((m, k), dtype=np.float32))
w = cupy.asarray(rng.standard_normal((n, k), dtype=np.float32)) / np.sqrt(k)
x[:, 0] = 1.0
w[:, 0] = -ndtri(0.99)
z = cupy.maximum(x @ w.T, 0).astype(twell.bfloat16)
zs = [z, z.copy()]
x, w = x.astype(twell.bfloat16), w.astype(twell.bfloat16)

T = []  # (label, perf_counter)
orig_function = _kernels.function


class Wrapped:
    def __init__(self, f, name):
        self.f, self.name = f, name

    def __call__(self, *a, **kw):
        T.append(("launch " + self.name, time.perf_counter()))
        r = self.f(*a, **kw)
        T.append(("launched", time.perf_counter()))
        return r

    def __setattr__(self, key, value):
        if key in ("f", "name"):
            object.__setattr__(self, key, value)
        else:
            setattr(self.f, key, value)


def function(name, expr):
    return Wrapped(orig_function(name, expr), expr.split("<")[0])


orig_size = gb._overflow_size


def size(counter):
    T.append(("get", time.perf_counter()))
    r = orig_size(counter)
    T.append(("got", time.perf_counter()))
    return r


def phases(fn, reps=40):
    """Median microseconds between consecutive marks of one call, the GPU idle before it."""
    _kernels.function, gb._overflow_size = function, size
    rows = []
    try:
        for r in range(reps + 3):
            cupy.cuda.Device().synchronize()
            T.clear()
            T.append(("start", time.perf_counter()))
            fn(r)
            T.append(("end", time.perf_counter()))
            if r >= 3:
                rows.append(list(T))
    finally:
        _kernels.function, gb._overflow_size = orig_function, orig_size
    labels = [f"{a[0]} -> {b[0]}" for a, b in zip(rows[0], rows[0][1:], strict=False)]
    d = np.median([[(b[1] - a[1]) * 1e6 for a, b in zip(r, r[1:], strict=False)] for r in rows
                   if len(r) == len(rows[0])], axis=0)
    return labels, d


def show(name, fn):
    ev = _dev.timed(lambda: fn(0), 30)
    labels, d = phases(fn)
    print(f"== {name}: events {ev * 1e3:.0f} us, wall {d.sum():.0f} us")
    for lab, v in zip(labels, d, strict=True):
        print(f"   {v:7.1f}  {lab}")



def rows_summary():
    zc = cupy.asarray(z.astype(np.float32))
    csr = twell.TwELLMatrix(zc).tocsr()
    import cupyx.scipy.sparse  # noqa: F401
    cases = {
        "pack bf16 S=13": lambda: twell.TwELLMatrix(zs[0], slots=13),
        "pack bf16 auto": lambda: twell.TwELLMatrix(zs[0]),
        "pack fp32 auto": lambda: twell.TwELLMatrix(zc),
        "d2t S=13": lambda: twell.matmul_to_twell(x, w, slots=13),
        "d2t S=6": lambda: twell.matmul_to_twell(x, w, slots=6),
        "d2t auto": lambda: twell.matmul_to_twell(x, w),
        "csr->twell fp32": lambda: twell.TwELLMatrix(csr),
    }
    for name, fn in cases.items():
        print(f"ROW {LABEL:4s} {name:18s} {_dev.timed(fn, 40) * 1e3:8.1f} us", flush=True)


rows_summary()
if os.environ.get("ROWS_ONLY"):
    sys.exit(0)
show("pack S=13", lambda i: twell.TwELLMatrix(zs[i % 2], slots=13))
show("pack auto", lambda i: twell.TwELLMatrix(zs[i % 2]))
show("d2t S=13", lambda i: twell.matmul_to_twell(x, w, slots=13))
show("d2t auto", lambda i: twell.matmul_to_twell(x, w))
kern = _kernels.function("pack.cu", f"twell_pack_dense<{_kernels.CTYPES[z.dtype]}, 8, "
                                    f"{_kernels.PACK_PAIRS}>")
print("pack kernel alone (events):", end=" ")
parts = gb._empty_parts(m, n // 256, 13, z.dtype, slot_fill=cupy.empty, overflow=False)
tot = cupy.empty((m, n // 256), np.int32)
cnt = cupy.zeros(1, np.uint64)


def pk():
    gb._launch_pack_dense(z, 256, 13, gb._MODE_SLOTS, tot, parts, None, cnt)


print(f"{_dev.timed(pk, 30) * 1e3:.0f} us")


def wall(fn, reps=200):
    fn()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps * 1e6


c = cupy.zeros(1, np.uint64)
pin = cupy.cuda.alloc_pinned_memory(8)
hostbuf = np.frombuffer(pin, np.uint64, 1)
ev = cupy.cuda.Event()


def pinned_get():
    hostbuf_ptr = hostbuf.ctypes.data
    cupy.cuda.runtime.memcpyAsync(hostbuf_ptr, c.data.ptr, 8, 2,
                                  cupy.cuda.get_current_stream().ptr)
    ev.record()
    ev.synchronize()
    return int(hostbuf[0])


cupy.cuda.Device().synchronize()
print(f"host us: counter.get {wall(lambda: int(c.get()[0])):.1f}, pinned async+event "
      f"{wall(pinned_get):.1f}, zeros(1) {wall(lambda: cupy.zeros(1, np.uint64)):.1f}, "
      f"empty {wall(lambda: cupy.empty((m, 22, 13), np.int16)):.1f}, "
      f"tensor_map {wall(lambda: _kernels.tensor_map_2d(x, 64, 128)):.1f}, "
      f"Device().synchronize {wall(lambda: cupy.cuda.Device().synchronize()):.1f}")
sm90 = _kernels.function("matmul_pack_sm90.cu", "twell_matmul_pack_sm90")
set_shared = wall(lambda: setattr(sm90, "max_dynamic_shared_size_bytes", gb._MATMUL_SM90_SMEM))
print(f"funcSetAttribute {set_shared:.1f} us")
