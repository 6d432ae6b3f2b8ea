#!/usr/bin/env bash
# The whole test-suite on a GPU machine (every test but the NumPy-backend runs, which CI has),
# then the benchmark suite alone on the card.
# Usage on the GPU machine, from the repo root:
#   [JOBS=4] bash scripts/gpu_check.sh [extra arguments for benchmarks/bench.py]
# JOBS pytest processes (default 4) share the GPU for the tests not marked slow, each on every
# JOBS-th test (TWELL_SHARD, see tests/conftest.py): the suite takes over 400 s in one process. Each process may hold at most
# its share of the GPU's memory (CUPY_GPU_MEMORY_LIMIT), so that one shard's memory pool cannot
# starve the others into out-of-memory failures; the slow tests then run in one process with
# the whole card (SLOW_TIMEOUT, default 240 s). TESTS_TIMEOUT (default 420) and BENCH_TIMEOUT
# (default 300) bound the two steps, in seconds. SKIP_BENCH=1 runs the tests alone.
#
# Five files go to $OUT (or ./gpu-logs): summary.txt (the card, each shard's exit status,
# failures and last line, the slowest tests, the benchmark's table), pytest.log (every shard's
# log, one after another, with pytest's -rfE report of each failure), durations.log,
# bench.json and bench.log.
set -uo pipefail
out=${OUT:-gpu-logs}
jobs=${JOBS:-4}
work=$(mktemp -d)
mkdir -p "$out"
export PYTHONPATH=. PYTHONUNBUFFERED=1 CI=1
export CUPY_GPU_MEMORY_LIMIT="$((90 / jobs))%"
summary=$out/summary.txt
nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.total --format=csv,noheader \
    | tee "$summary"
start=$(date +%s)
# CuPy's kernel cache filled first, one process per module at once: else every shard compiles
# every module it meets (NVRTC takes 1-40 s a module), all shards at the same time. A module
# that fails here fails again in its tests, which report it.
for key in $(python3 -c "from twell._cuda import _compile as c
print(' '.join(k for k in c.INSTANCES if c.source_file(k) not in c.ARCH_SOURCES))"); do
    python3 -c "import sys; from twell._cuda import _compile as c
c.function(sys.argv[1], c.INSTANCES[sys.argv[1]][0])" "$key" &
done
# The reference extension (bench.py --reference DIR) builds meanwhile, on the CPUs the
# NVRTC compiles leave (about 30 s): torch keeps the build, and the benchmark then loads it.
args=("$@")
for ((i = 0; i + 1 < ${#args[@]}; i++)); do
    if [ "${args[i]}" = --reference ] && [ -z "${SKIP_BENCH:-}" ]; then
        python3 -c "import sys; sys.path.insert(0, 'benchmarks'); import torch
from contenders import Reference; Reference(sys.argv[1], torch)" "${args[i + 1]}" \
            > "$work/reference.log" 2>&1 &
    fi
done
wait
echo "kernel cache filled (and the reference built) in $(( $(date +%s) - start )) s" | tee -a "$summary"
for ((j = 0; j < jobs; j++)); do
    (TWELL_SHARD=$j/$jobs TWELL_TEST_LOG="$work/durations.$j.log" \
        timeout "${TESTS_TIMEOUT:-420}" python3 -m pytest -q -p no:cacheprovider -rfE \
        -k "not numpy" -m "not slow" tests > "$work/pytest.$j.log" 2>&1
     echo $? > "$work/pytest.$j.rc") &
done
wait
# The slow tests (the 2**31-slot matrix needs 48 GiB) run alone, with the whole card.
(TWELL_TEST_LOG="$work/durations.slow.log" env -u CUPY_GPU_MEMORY_LIMIT \
    timeout "${SLOW_TIMEOUT:-240}" python3 -m pytest -q -p no:cacheprovider -rfE \
    -k "not numpy" -m slow tests > "$work/pytest.slow.log" 2>&1
 echo $? > "$work/pytest.slow.rc")
echo "tests took $(( $(date +%s) - start )) s, $jobs shards, CUPY_GPU_MEMORY_LIMIT=$CUPY_GPU_MEMORY_LIMIT" \
    | tee -a "$summary"
shards=($(seq 0 $((jobs - 1))) slow)
for j in "${shards[@]}"; do
    echo "==== shard $j (rc $(cat "$work/pytest.$j.rc"))"
    cat "$work/pytest.$j.log"
done > "$out/pytest.log"
cat "$work"/durations.*.log > "$out/durations.log" 2>/dev/null
if [ -z "${SKIP_BENCH:-}" ]; then
    # The benchmark has the whole card: a capped pool would free and re-allocate inside
    # the timed loops, and the larger sci cases would not fit.
    env -u CUPY_GPU_MEMORY_LIMIT timeout "${BENCH_TIMEOUT:-300}" python3 benchmarks/bench.py --out "$out/bench.json" \
        --no-progress "$@" > "$out/bench.log" 2>&1
    echo "bench rc=$?" | tee -a "$summary"
fi
{
    for j in "${shards[@]}"; do
        echo "pytest shard $j (rc $(cat "$work/pytest.$j.rc")):"
        grep -E "^(FAILED|ERROR)" "$work/pytest.$j.log" | head -40
        tail -n 1 "$work/pytest.$j.log"
    done
    echo "slowest tests:"
    sort -rn "$out/durations.log" 2>/dev/null | head -8
    [ -z "${SKIP_BENCH:-}" ] && tail -n 45 "$out/bench.log"
} | tee -a "$summary"
rm -rf "$work"
exit 0
