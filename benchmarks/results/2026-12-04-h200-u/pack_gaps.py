"""Where ``TwELLMatrix(z)`` and ``TwELLMatrix(z, slots=13)`` spend their time besides the
kernels (twenty-first session, call 10; the D2T's version is
``results/2026-12-04-h200-r/gaps.py``, whose method this is).

Each step of the dense pack's path (functions of ``twell._twell``, ``twell._convert``,
``twell._cupy_backend`` and ``twell._layout``) is wrapped by ``_dev.StageProfile`` (a CUDA
event and the host clock at its start and end). Medians of 20 calls after 3 warm-ups,
microseconds; bf16 activations at 99%, M 16384, K 5632 (the bias-column trick).
Usage (repository root):
    PYTHONPATH=. python3 benchmarks/results/2026-12-04-h200-u/pack_gaps.py
"""
import sys

sys.path.insert(0, "benchmarks")  # run from the repository root
import _dev  # noqa: E402
import numpy as np  # noqa: E402

import twell  # noqa: E402
from twell import _convert, _layout, _twell  # noqa: E402
from twell import _cupy_backend as gb  # noqa: E402

profile = _dev.StageProfile()
profile.wrap(gb, ("tile_counts_dense", "pack_dense", "_empty_parts", "_count_buffer",
                  "_launch_pack_dense", "_no_overflow", "_read_counts", "_overflow_offsets",
                  "_with_overflow", "count_histogram"))
profile.wrap(_layout, ("auto_choice", "checked_histogram"))
profile.wrap(_convert, ("coerce",))
profile.wrap(_twell, ("_pack", "_tile_counts_histogram"))

z = _dev.activations(16384, 5632, 2048, 0.99, np.random.default_rng(0)).astype(twell.bfloat16)
profile.breakdown("TwELLMatrix(z, slots=13)", lambda: twell.TwELLMatrix(z, slots=13))
profile.breakdown("TwELLMatrix(z) (auto)", lambda: twell.TwELLMatrix(z))
