"""What ``TwELLMatrix(z, slots=13)`` adds to its kernel, piece by piece (twenty-second
session): each row times, from a CUDA event before it to one after it returns (median of 60
after 5 warm-ups, microseconds), a longer prefix of the dense pack's work, its buffers made
once beforehand where the row says so. bf16 activations at 99%, M 16384, K 5632 (the
bias-column trick), tile width 256.
Usage (repository root): PYTHONPATH=. python3 benchmarks/results/2026-12-04-h200-v/pack_floor.py
"""
import sys

sys.path.insert(0, "benchmarks")  # run from the repository root
import _dev  # noqa: E402
import cupy  # noqa: E402
import numpy as np  # noqa: E402

import twell  # noqa: E402
from twell import _cupy_backend as gb  # noqa: E402
from twell import _layout  # noqa: E402

M, K, T, S = 16384, 5632, 256, 13
z = _dev.activations(M, K, 2048, 0.99, np.random.default_rng(0)).astype(twell.bfloat16)
nt = _layout.n_tiles(K, T)
parts = gb._empty_parts(M, nt, S, z.dtype, zeroed=False, overflow=False)
totals = cupy.empty((M, nt), dtype=_layout.COUNT_DTYPE)
both, counter = gb._count_buffer(T)


noop = cupy.RawKernel('extern "C" __global__ void noop(int* a) {}', "noop")


def kernel(t=totals, p=parts, c=counter):
    gb._launch_pack_dense(z, T, S, gb._MODE_SLOTS, t, p, None, c)


def buffers():
    """The buffers pack_dense makes each call: the parts, the totals, the count buffer."""
    p = gb._empty_parts(M, nt, S, z.dtype, zeroed=False, overflow=False)
    t = cupy.empty((M, nt), dtype=_layout.COUNT_DTYPE)
    b, c = gb._count_buffer(T)
    return p, t, b, c


def kernel_counter_read():
    kernel()
    counter.get()


def kernel_histogram_read():
    kernel()
    gb._read_counts(both, totals, T)


def kernel_no_overflow_histogram_read():
    kernel()
    gb._no_overflow(parts)
    gb._read_counts(both, totals, T)


def allocations_kernel_no_overflow_histogram_read():
    p, t, b, c = buffers()
    kernel(t, p, c)
    gb._no_overflow(p)
    gb._read_counts(b, t, T)


def main():
    rows = {
        "a noop kernel + read 8 bytes (the sync floor)": lambda: (noop((1,), (32,), (counter,)),
                                                                  counter.get()),
        "slots pass (buffers made once)": kernel,
        "+ read of its counter (8 bytes)": kernel_counter_read,
        "+ histogram + one read (instead)": kernel_histogram_read,
        "+ the empty overflow part (pack_dense's order)": kernel_no_overflow_histogram_read,
        "+ its buffers made each call": allocations_kernel_no_overflow_histogram_read,
        "gb.pack_dense(z, 256, 13)": lambda: gb.pack_dense(z, T, S),
        "TwELLMatrix(z, slots=13)": lambda: twell.TwELLMatrix(z, slots=S),
    }
    for name, fn in rows.items():
        print(f"{name:<48} {_dev.timed(fn, 60, warm=5) * 1e3:8.1f} us", flush=True)


if __name__ == "__main__":  # read_floor.py imports the setup above
    main()
