#!/usr/bin/env bash
# Run GPU tests under compute-sanitizer: memcheck, racecheck and initcheck (or the tools named
# in TOOLS). Needs a GPU machine whose runtime lets compute-sanitizer attach. Prints one summary
# line per tool; logs go to $OUT (or ./sanitize-logs).
#   Usage, from the repository root: [TOOLS="memcheck"] bash scripts/sanitize.sh [PYTEST ARGS]
# Without PYTEST ARGS it runs every GPU test (-m gpu). Under a sanitizer each launch costs
# milliseconds, so the hypothesis profile is "sanitize" (4 examples per property) and CuPy's
# memory pool is off (TWELL_NO_MEMORY_POOL=1): with the pool, an access past an array's end
# that lands in another pooled block would go unseen. TIMEOUT (seconds per tool, default
# none) bounds each tool's run; a run cut short says so in its summary line.
set -uo pipefail
out=${OUT:-sanitize-logs}
mkdir -p "$out"
export PYTHONPATH=. PYTHONUNBUFFERED=1 HYPOTHESIS_PROFILE=sanitize TWELL_NO_MEMORY_POOL=1
if [ $# -eq 0 ]; then set -- tests -m gpu; fi
limit=()
[ -n "${TIMEOUT:-}" ] && limit=(timeout "$TIMEOUT")
status=0
for tool in ${TOOLS:-memcheck racecheck initcheck}; do
    extra=()
    # racecheck: shared-memory hazards; initcheck: reads of never-written device memory.
    [ "$tool" = racecheck ] && extra=(--racecheck-report analysis)
    "${limit[@]}" compute-sanitizer --tool "$tool" "${extra[@]}" --error-exitcode 99 \
        --log-file "$out/$tool.log" python3 -m pytest -q -p no:cacheprovider "$@" \
        > "$out/$tool.pytest.log" 2>&1
    rc=$?
    summary=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/$tool.log" | tail -1)
    [ $rc -eq 124 ] && summary="cut short by TIMEOUT=${TIMEOUT:-}s; $summary"
    echo "$tool: exit $rc; ${summary:-no summary line}; pytest: $(tail -n 1 "$out/$tool.pytest.log")"
    [ $rc -ne 0 ] && status=1
done
exit $status
