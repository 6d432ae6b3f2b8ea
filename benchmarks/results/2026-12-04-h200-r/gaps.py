"""Where the D2T and the gated FFN spend their time besides the kernels (eighteenth session).

Each of the launcher's steps (functions of ``twell._cupy_backend`` and ``twell._layout``) is
wrapped by ``_dev.StageProfile`` (a CUDA event and the host clock at its start and end; since
the twenty-first session that class holds the code this script ran inline, unchanged). Medians
of 20 calls after 3 warm-ups, microseconds; bf16, the paper's shapes (M 16384, D 2048,
H 5632).
Usage (repository root): PYTHONPATH=. python3 benchmarks/results/2026-12-04-h200-r/gaps.py
"""
import sys

sys.path.insert(0, "benchmarks")  # run from the repository root
import _dev  # noqa: E402

import twell  # noqa: E402
from twell import _cupy_backend as gb  # noqa: E402
from twell import _layout  # noqa: E402

profile = _dev.StageProfile()
profile.wrap(gb, ("matmul_plan", "_empty_parts", "_count_buffer", "_launch_matmul_pack",
                  "_no_overflow", "_read_counts", "_overflow_offsets", "_with_overflow",
                  "matmul_pack", "matmul_pack_auto", "gated_up", "_gemm_nt_float32", "spmm",
                  "to_dense", "_nonfinite"))
profile.wrap(_layout, ("auto_choice", "checked_histogram"))

x, w0, wu, wd = _dev.ffn_operands(16384, 2048, 5632, twell.bfloat16)
w = _dev.gate_weight(w0, 0.99, twell.bfloat16)

profile.breakdown("matmul_to_twell(x, w, slots=13)",
                  lambda: twell.matmul_to_twell(x, w, slots=13))
profile.breakdown("matmul_to_twell(x, w) (auto)", lambda: twell.matmul_to_twell(x, w))
profile.breakdown("sparse_ffn(x, w, wu, wd) at 99%", lambda: twell.sparse_ffn(x, w, wu, wd))
