#!/usr/bin/env bash
# The whole test-suite on a GPU machine (every test but the NumPy-backend runs, which CI has),
# then the benchmark suite alone on the card. Logs go to $OUT (or
# ./gpu-logs); the summary comes last.
# Usage on the GPU machine, from the repo root:
#   [JOBS=4] bash scripts/gpu_check.sh [extra arguments for benchmarks/bench.py]
# JOBS pytest processes (default 4) share the GPU, each on every JOBS-th test (TWELL_SHARD, see
# tests/conftest.py): the suite takes over 400 s in one process. TESTS_TIMEOUT (default 420)
# and BENCH_TIMEOUT (default 300) bound the two steps, in seconds. SKIP_BENCH=1 runs the tests
# alone.
set -uo pipefail
out=${OUT:-gpu-logs}
jobs=${JOBS:-4}
mkdir -p "$out"
export PYTHONPATH=. PYTHONUNBUFFERED=1 CI=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee "$out/card.txt"
start=$(date +%s)
for ((j = 0; j < jobs; j++)); do
    (TWELL_SHARD=$j/$jobs TWELL_TEST_LOG="$out/durations.$j.log" \
        timeout "${TESTS_TIMEOUT:-420}" python3 -m pytest -q -p no:cacheprovider -rfE \
        -k "not numpy" tests > "$out/pytest.$j.log" 2>&1
     echo $? > "$out/pytest.$j.rc") &
done
wait
echo "tests took $(( $(date +%s) - start )) s"
if [ -z "${SKIP_BENCH:-}" ]; then
    timeout "${BENCH_TIMEOUT:-300}" python3 benchmarks/bench.py --out "$out/bench.json" \
        --no-progress "$@" > "$out/bench.log" 2>&1
    echo "bench rc=$?"
fi
echo "== summary"
for ((j = 0; j < jobs; j++)); do
    echo "pytest shard $j/$jobs (rc $(cat "$out/pytest.$j.rc")):"
    grep -E "^(FAILED|ERROR)" "$out/pytest.$j.log" | head -10
    tail -n 1 "$out/pytest.$j.log"
done
echo "slowest tests:"
sort -rn "$out"/durations.*.log 2>/dev/null | head -8
[ -z "${SKIP_BENCH:-}" ] && tail -n 45 "$out/bench.log"
exit 0
