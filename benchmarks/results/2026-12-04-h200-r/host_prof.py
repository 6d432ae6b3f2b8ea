"""cProfile of the D2T launchers' host work (eighteenth session): 200 calls of
matmul_to_twell(x, w, slots=13) and of slots="auto", bf16, 99%, the paper's up projection.
The GPU time hides in the read-back (``get``); everything else is the host's.
Usage (repository root):
PYTHONPATH=. python3 benchmarks/results/2026-12-04-h200-r/host_prof.py"""
import cProfile
import pstats
import sys

sys.path.insert(0, "benchmarks")  # run from the repository root
import _dev  # noqa: E402

import twell  # noqa: E402

x, w0, _, _ = _dev.ffn_operands(16384, 2048, 5632, twell.bfloat16)
w = _dev.gate_weight(w0, 0.99, twell.bfloat16)
for slots in (13, "auto"):
    for _ in range(5):
        twell.matmul_to_twell(x, w, slots=slots)
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(200):
        twell.matmul_to_twell(x, w, slots=slots)
    profile.disable()
    print(f"\n## matmul_to_twell(x, w, slots={slots!r}), 200 calls")
    pstats.Stats(profile).sort_stats("tottime").print_stats(22)
