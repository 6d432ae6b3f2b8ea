#!/usr/bin/env bash
# One GPU session's full check: the whole test-suite on the GPU (every test but the NumPy-backend
# runs, which CI has), then the benchmark suite alone on the card. Logs go to $OUT (or
# ./gpu-logs); the summary comes last.
# Usage on the GPU machine, from the repo root:
#   [JOBS=4] bash scripts/gpu_check.sh [extra arguments for benchmarks/bench.py]
# JOBS pytest processes (default 4) share the GPU, each on a shard of the test files: the suite
# takes over 400 s in one process. TESTS_TIMEOUT (default 420) and BENCH_TIMEOUT (default 300)
# bound the two steps, in seconds.
set -uo pipefail
out=${OUT:-gpu-logs}
jobs=${JOBS:-4}
mkdir -p "$out"
export PYTHONPATH=. PYTHONUNBUFFERED=1 CI=1
# shellcheck source=scripts/_shards.sh
source "$(dirname "${BASH_SOURCE[0]}")/_shards.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee "$out/card.txt"
test_shards "$jobs"
start=$(date +%s)
for ((j = 0; j < jobs; j++)); do
    # shellcheck disable=SC2086  # the shard's file list splits into words on purpose
    (timeout "${TESTS_TIMEOUT:-420}" python3 -m pytest -q -p no:cacheprovider -rfE \
        -k "not numpy" ${shards[j]} > "$out/pytest.$j.log" 2>&1
     echo $? > "$out/pytest.$j.rc") &
done
wait
echo "tests took $(( $(date +%s) - start )) s"
timeout "${BENCH_TIMEOUT:-300}" python3 benchmarks/bench.py --out "$out/bench.json" \
    --no-progress "$@" > "$out/bench.log" 2>&1
echo "bench rc=$?"
echo "== summary"
for ((j = 0; j < jobs; j++)); do
    echo "pytest shard $j (rc $(cat "$out/pytest.$j.rc")):${shards[j]}"
    grep -E "^(FAILED|ERROR)" "$out/pytest.$j.log" | head -10
    tail -n 1 "$out/pytest.$j.log"
done
tail -n 45 "$out/bench.log"
