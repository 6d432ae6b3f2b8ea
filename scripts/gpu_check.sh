#!/usr/bin/env bash
# One GPU session's full check: the whole test-suite on the GPU, the SpMM development bench and
# the benchmark suite. Logs go to $OUT (or ./gpu-logs); the summary comes last.
# Usage on the GPU machine, from the repo root:
#   bash scripts/gpu_check.sh [extra arguments for benchmarks/bench.py]
set -uo pipefail
out=${OUT:-gpu-logs}
mkdir -p "$out"
export PYTHONPATH=. PYTHONUNBUFFERED=1 CI=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee "$out/card.txt"
timeout 330 python3 -m pytest tests -q -p no:cacheprovider -rfE > "$out/pytest.log" 2>&1
echo "pytest rc=$?"
timeout 150 python3 benchmarks/spmm_dev.py --reps 10 --sparsities 0.99,0.95 > "$out/spmm_dev.log" 2>&1
echo "spmm_dev rc=$?"
timeout 200 python3 benchmarks/bench.py --out "$out/bench.json" --no-progress "$@" \
  > "$out/bench.log" 2>&1
echo "bench rc=$?"
echo "== summary"
grep -E "^(FAILED|ERROR)" "$out/pytest.log" | head -20
tail -n 1 "$out/pytest.log"
tail -n 4 "$out/spmm_dev.log"
tail -n 30 "$out/bench.log"
