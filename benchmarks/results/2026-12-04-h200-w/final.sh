#!/usr/bin/env bash
# Call 1 of the twenty-third GPU session: the shuffled pair setup of pack_pairs_staged, shipped
# in 0612a58. Bits and times against the twenty-second session's pack.cu (h200-v's
# pack_ab.py, with scratch/base/cuda_src; stops here if any bit differs), then the closing
# check of the submitted code (scripts/session_check.sh: the sharded GPU suite, the bench with
# the reference kernels, the sanitizers). Call 1 ran the pack tests' memcheck after the check,
# from this script; it is now the check's last sanitizer run (the same command), so that every
# closing check runs it.
# Usage on the GPU machine, from the repo root:
# OUT=dir bash benchmarks/results/2026-12-04-h200-w/final.sh COMMIT
set -uo pipefail
export PYTHONPATH=.
timeout 200 python3 benchmarks/results/2026-12-04-h200-v/pack_ab.py 2>&1 | tee $OUT/call1_pack_ab.txt
grep -q "all bits equal" $OUT/call1_pack_ab.txt || { echo "bits differ or the run failed: stop"; exit 1; }
bash scripts/session_check.sh "$1"
