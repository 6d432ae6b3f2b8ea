"""Calls 9 and 10: the hand-off prototype (v3) and its "no entries" form at 99% (S = 13),
each launched 4 times back to back (3 warm-ups, 1 timed), for ncu to profile the 4th launch
of each (``--launch-skip 3`` and ``--launch-skip 7``): where the packing warps' entries wait.
From the repository root on an H100/H200 (call 10 asked for the metrics
``regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio`` instead):

    ncu --clock-control none -k regex:proto_matmul_pack_sm90_handoff --launch-skip 3 \\
        --launch-count 1 --section WarpStateStats --section SchedulerStats \\
        --section MemoryWorkloadAnalysis python3 benchmarks/results/2026-12-04-h200-s/ncu_handoff.py
"""
import sys

import cupy
import numpy as np

sys.path.insert(0, "benchmarks/prototypes")
import matmul_pack_sm90_cluster as base  # noqa: E402
import matmul_pack_sm90_handoff as handoff  # noqa: E402
import matmul_pack_sm90_ws as ws  # noqa: E402

rng = np.random.default_rng(7)
x, w = base.operands(rng, 16384, 2048, 5632, shift=handoff.SHIFTS["99%"][0])
sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
for diag in (0, 2):  # the kernel, then "no entries"
    t = ws.kernel_alone_ms(handoff.compile_kernel(diag), x, w, (sms,), handoff.THREADS,
                           handoff.SMEM, reps=1)
    print(f"diag {diag}: {t:.3f} ms (under the profiler)", flush=True)
