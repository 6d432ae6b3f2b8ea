#!/usr/bin/env bash
# Run the GPU test-suite under compute-sanitizer: memcheck, racecheck and initcheck.
# Needs a GPU machine whose runtime lets compute-sanitizer attach (the Firecracker H200
# machines do; gVisor ones do not). Prints one summary line per tool; logs go to $OUT (or
# ./sanitize-logs). Usage, from the repository root: bash scripts/sanitize.sh [PYTEST ARGS]
set -uo pipefail
out=${OUT:-sanitize-logs}
mkdir -p "$out"
export PYTHONPATH=. PYTHONUNBUFFERED=1 CI=1
# The GPU tests only (the NumPy half adds nothing under a GPU sanitizer), smallest profile.
args=(-m pytest tests -q -p no:cacheprovider -k "cupy or gpu or cuda" "$@")
status=0
for tool in memcheck racecheck initcheck; do
    # initcheck cannot see reads of stale data in blocks CuPy's pool hands out again; the
    # tests' poison() step covers those (unwritten output shows up as garbage).
    compute-sanitizer --tool "$tool" --error-exitcode 99 \
        --log-file "$out/$tool.log" python3 "${args[@]}" > "$out/$tool.pytest.log" 2>&1
    rc=$?
    echo "$tool: exit $rc; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/$tool.log" | tail -1);" \
         "$(tail -n 1 "$out/$tool.pytest.log")"
    [ $rc -ne 0 ] && status=1
done
exit $status
