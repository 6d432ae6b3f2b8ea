"""A/B of the launchers and the gated FFN (bf16, the paper's up projection; the D2T and pack
at 99%, the gated FFN at 99% and 95%), one process per library version: the eighteenth
session ran ``PYTHONPATH=scratch/old python3 ab.py old`` (4331ae7's twell and cuda_src) and
``PYTHONPATH=. python3 ab.py new`` (the working tree), twice, interleaved. CUDA events around
each synchronising call, median of 40 after 5 warm-ups."""
import sys

sys.path.insert(0, "benchmarks")  # run from the repository root
import _dev  # noqa: E402
import cupy  # noqa: E402

import twell  # noqa: E402

x, w0, wu, wd = _dev.ffn_operands(16384, 2048, 5632, twell.bfloat16)
w, w95 = (_dev.gate_weight(w0, s, twell.bfloat16) for s in (0.99, 0.95))
z = cupy.maximum(x @ w.T, 0)


def timed(fn):
    """Median CUDA-event time of ``fn()`` in microseconds (40 runs after 5 warm-ups)."""
    return 1e3 * _dev.timed(fn, reps=40, warm=5)


r = {"d2t S=13": timed(lambda: twell.matmul_to_twell(x, w, slots=13)),
     "pack S=13": timed(lambda: twell.TwELLMatrix(z, slots=13)),
     "d2t auto": timed(lambda: twell.matmul_to_twell(x, w)),
     "gated 99%": timed(lambda: twell.sparse_ffn(x, w, wu, wd)),
     "gated 95%": timed(lambda: twell.sparse_ffn(x, w95, wu, wd))}
print(sys.argv[1], " ".join(f"{k} {v:.0f}us" for k, v in r.items()), flush=True)
