"""The working tree's dense pack and fused pack against the session's starting tree, in one
process (twenty-second session): the starting tree's ``twell/`` is imported as
``twell_base`` (copied to ``scratch/abpkg/twell_base`` beside its ``cuda_src/``; twell's
imports are relative), so both run on the same inputs, interleaved, with the same clocks.

Each case: the bits of both results compared, then 7 rounds, each timing both (a CUDA event
before the call and one after it returns, median of 40 after 5 warm-ups); the table gives the
median over rounds. bf16 and float32 activations at 99%, M 16384, K 5632 (the bias-column
trick); the fused case's x (16384, 2048) and w (5632, 2048) bf16.
Usage (repository root): PYTHONPATH=. python3 benchmarks/results/2026-12-04-h200-v/ab_host.py
"""
import sys

sys.path.insert(0, "benchmarks")  # run from the repository root
sys.path.insert(0, "scratch/abpkg")
import _dev  # noqa: E402
import numpy as np  # noqa: E402
import twell_base  # noqa: E402

import twell  # noqa: E402

M, K, D = 16384, 5632, 2048
rng = np.random.default_rng(0)
z32 = _dev.activations(M, K, D, 0.99, rng)
z = z32.astype(twell.bfloat16)
x, w0, _, _ = _dev.ffn_operands(M, D, K, twell.bfloat16)
w = _dev.gate_weight(w0, 0.99, twell.bfloat16)
PARTS = ("counts", "data", "indices", "overflow_indptr", "overflow_indices", "overflow_data")


def same_bits(a, b):
    return a.shape == b.shape and all(
        getattr(a, p).dtype == getattr(b, p).dtype
        and bool((getattr(a, p).view(np.uint8) == getattr(b, p).view(np.uint8)).all())
        for p in PARTS)


cases = {
    "TwELLMatrix(z, slots=13)": lambda t: t.TwELLMatrix(z, slots=13),
    "TwELLMatrix(z)": lambda t: t.TwELLMatrix(z),
    "TwELLMatrix(z32, slots=13)": lambda t: t.TwELLMatrix(z32, slots=13),
    "TwELLMatrix(z32)": lambda t: t.TwELLMatrix(z32),
    "matmul_to_twell(x, w, slots=13)": lambda t: t.matmul_to_twell(x, w, slots=13),
    "matmul_to_twell(x, w)": lambda t: t.matmul_to_twell(x, w),
}
print(f"{'case':<34} {'bits':>5} {'base us':>8} {'new us':>8} {'new/base':>8}")
for name, fn in cases.items():
    same = same_bits(fn(twell), fn(twell_base))
    times = {"base": [], "new": []}
    for _ in range(7):
        for label, module in (("base", twell_base), ("new", twell)):
            times[label].append(_dev.timed(lambda m=module, f=fn: f(m), 40, warm=5) * 1e3)
    base, new = np.median(times["base"]), np.median(times["new"])
    print(f"{name:<34} {str(same):>5} {base:8.1f} {new:8.1f} {new / base:8.3f}", flush=True)
