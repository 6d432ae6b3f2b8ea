"""Where the dense pack's read-back and buffers cost time (twenty-second session, after
``pack_floor.py`` put ~27 us on reading 8 bytes after the kernel and ~33 us on making the
buffers each call). Each row: a CUDA event before, one after the call returns, median of 60
after 5 warm-ups, microseconds. bf16 activations at 99%, M 16384, K 5632, 13 slots.
Usage (repository root): PYTHONPATH=. python3 benchmarks/results/2026-12-04-h200-v/read_floor.py
"""
import sys

sys.path.insert(0, "benchmarks")  # run from the repository root
import _dev  # noqa: E402
import cupy  # noqa: E402
import cupyx  # noqa: E402
from pack_floor import both, buffers, counter, kernel, noop  # noqa: E402  (the same setup)

pinned = cupyx.empty_pinned(both.shape, both.dtype)
stream = cupy.cuda.get_current_stream()


def buffers_kernel():
    p, t, _, c = buffers()
    kernel(t, p, c)


rows = {
    "noop + stream.synchronize()": lambda: (noop((1,), (32,), (counter,)), stream.synchronize()),
    "noop + get() (pageable)": lambda: (noop((1,), (32,), (counter,)), both.get()),
    "noop + get(out=pinned)": lambda: (noop((1,), (32,), (counter,)), both.get(out=pinned)),
    "kernel": kernel,
    "kernel + stream.synchronize()": lambda: (kernel(), stream.synchronize()),
    "kernel + get() (pageable)": lambda: (kernel(), both.get()),
    "kernel + get(out=pinned)": lambda: (kernel(), both.get(out=pinned)),
    "buffers alone (host)": buffers,
    "buffers, then kernel": buffers_kernel,
}
for name, fn in rows.items():
    print(f"{name:<40} {_dev.timed(fn, 60, warm=5) * 1e3:8.1f} us", flush=True)
