#!/usr/bin/env bash
# Call 3 of the twenty-second GPU session: the closing check of the submitted code
# (scripts/session_check.sh: the sharded GPU suite, the bench with the reference kernels, the
# sanitizers), then the dense pack's floor rows (pack_floor.py) and the in-process A/B against
# the session's starting tree (ab_host.py; needs scratch/abpkg).
# Usage on the GPU machine, from the repo root:
# OUT=dir bash benchmarks/results/2026-12-04-h200-v/final.sh COMMIT
set -uo pipefail
export PYTHONPATH=.
bash scripts/session_check.sh "$1"
D=benchmarks/results/2026-12-04-h200-v
{ timeout 60 python3 $D/pack_floor.py; taskset -c 2 timeout 120 python3 $D/ab_host.py; } 2>&1 | tee $OUT/floor_ab.txt
