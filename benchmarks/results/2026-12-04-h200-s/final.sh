#!/usr/bin/env bash
# Call 5 of the nineteenth GPU session: the closing check of the submitted code
# (scripts/session_check.sh: the sharded GPU suite, the bench with the reference kernels, the
# sanitizers) and then the hand-off prototype with its diagnostic forms.
# Usage on the GPU machine, from the repo root: OUT=dir bash benchmarks/results/2026-12-04-h200-s/final.sh COMMIT
set -uo pipefail
export PYTHONPATH=.
bash scripts/session_check.sh "$1"
timeout 300 python3 benchmarks/prototypes/matmul_pack_sm90_handoff.py > $OUT/handoff.txt 2>&1; echo "handoff rc=$?"
grep -v "same bits as the shipped kernels: True" $OUT/handoff.txt
