#!/usr/bin/env bash
# Run GPU tests under compute-sanitizer: memcheck, racecheck and initcheck (or the tools named
# in TOOLS). Needs a GPU machine whose runtime lets compute-sanitizer attach. Prints one summary
# line per tool (and shard); logs go to $OUT (or ./sanitize-logs).
#   Usage, from the repository root: [TOOLS="memcheck"] [JOBS=4] bash scripts/sanitize.sh [ARGS]
# Without ARGS it runs every test but the NumPy-backend runs and the "slow" ones (-k "not numpy"
# -m "not slow"): the slow tests build a matrix past 2^31 slots, hours of work under a
# sanitizer; the test-suite runs them without one. Under a sanitizer each launch costs
# milliseconds, so the hypothesis profile is "sanitize" (4 examples per property) and CuPy's
# memory pool is off (TWELL_NO_MEMORY_POOL=1): with the pool, an access past an array's end
# that lands in another pooled block would go unseen. TIMEOUT (seconds per process, default
# none) bounds each run; a run cut short says so in its summary line.
# JOBS > 1 deals the tests into JOBS shards (every JOBS-th test, TWELL_SHARD in
# tests/conftest.py) and runs every (tool, shard) pair at once, TOOLS x JOBS processes sharing
# the GPU; SHARDS="1 4" runs only those shards (say, to rerun them). Each process appends its
# tests' durations to $OUT/NAME.durations as they end.
# KERNELS=twell_ instruments only the kernels whose names contain that text (compute-sanitizer
# --kernel-name kns=...) under memcheck and racecheck: twell's own kernels, with CuPy's
# (cumsum, sort, nonzero, ...) at full speed and unchecked. Without it every kernel is
# checked; CuPy's nonzero scan then draws racecheck warnings of its own.
# initcheck ignores KERNELS: it would stop tracking what the skipped kernels write, and report
# their outputs as uninitialised when twell's kernels or a copy read them.
# cuBLAS's Hopper GEMM kernels (nvjet_sm90_*, TMA) and the tools: racecheck with KERNELS dies
# with an illegal address inside such a GEMM (cupy.matmul alone does it), and without KERNELS
# reports hazards inside it; initcheck does not see its stores, so every kernel that reads a
# large bf16 product of cupy.matmul is reported as reading uninitialised memory (the
# auto-slots sample of matmul_to_twell does). Those reports are about cuBLAS, not twell. Each
# process gets TWELL_SANITIZER=<tool> (tests/conftest.py): under initcheck cupy.matmul writes
# into a zeroed output (a memset the tool sees); under racecheck the one test whose auto-slots
# sample is such a GEMM (M = 1000, K = 4096, N = 11008) gives its slots instead, which keeps
# twell's kernels on that shape in view, and cupy.matmul of 16-bit operands runs in float32
# (the dense SpMM path and the tests call it on small shapes too).
# Only the pytest process is instrumented (--target-processes application-only): test_cli's
# `runs` fixture starts ~30 `python -m twell` children at once (host-only file conversions;
# the GPU paths of the CLI run in-process), and the tool attached to all of them can crash.
# PRINT_LIMIT (default 100) caps the reports each process prints (a flood of reports, each
# with a host backtrace, once stalled a run for minutes).
# POOL=1 keeps CuPy's memory pool (faster; an access that lands in another pooled block, or a
# read of a reused block that an earlier array wrote, then goes unseen).
set -uo pipefail
out=${OUT:-sanitize-logs}
jobs=${JOBS:-1}
mkdir -p "$out"
export PYTHONPATH=. PYTHONUNBUFFERED=1 HYPOTHESIS_PROFILE=sanitize
[ -z "${POOL:-}" ] && export TWELL_NO_MEMORY_POOL=1
[ $# -eq 0 ] && set -- tests -k "not numpy" -m "not slow"
limit=()
[ -n "${TIMEOUT:-}" ] && limit=(timeout "$TIMEOUT")

run() {  # run TOOL NAME SHARD PYTEST-ARGS...: one sanitizer process, its exit status in NAME.rc
    local tool=$1 name=$2 shard=$3 extra=()
    shift 3
    # racecheck: shared-memory hazards; initcheck: reads of never-written device memory.
    [ "$tool" = racecheck ] && extra=(--racecheck-report analysis)
    [ -n "${KERNELS:-}" ] && [ "$tool" != initcheck ] && extra+=(--kernel-name "kns=$KERNELS")
    TWELL_SHARD=$shard TWELL_TEST_LOG="$out/$name.durations" TWELL_SANITIZER=$tool \
        "${limit[@]}" compute-sanitizer --tool "$tool" "${extra[@]}" --error-exitcode 99 \
        --print-limit "${PRINT_LIMIT:-100}" --target-processes application-only \
        --log-file "$out/$name.log" python3 -m pytest -q -p no:cacheprovider "$@" \
        > "$out/$name.pytest.log" 2>&1
    echo $? > "$out/$name.rc"
}

names=()
for tool in ${TOOLS:-memcheck racecheck initcheck}; do
    for j in ${SHARDS:-$(seq 0 $((jobs - 1)))}; do
        run "$tool" "$tool.$j" "$j/$jobs" "$@" &
        names+=("$tool.$j")
    done
done
wait

status=0
for name in "${names[@]}"; do
    rc=$(cat "$out/$name.rc")
    summary=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/$name.log" | tail -1)
    [ "$rc" -eq 124 ] && summary="cut short by TIMEOUT=${TIMEOUT:-}s; $summary"
    echo "$name: exit $rc; ${summary:-no summary line}; pytest: $(tail -n 1 "$out/$name.pytest.log")"
    [ "$rc" -ne 0 ] && status=1
done
echo "slowest tests:"
sort -rn "$out"/*.durations 2>/dev/null | head -12
exit $status
