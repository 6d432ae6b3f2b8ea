#!/usr/bin/env bash
# The first device call for benchmarks/prototypes/spmm_batches_across_windows.patch (written in
# the twenty-third session, whose device was not lent again after call 1): with the patch
# applied and committed, old and new spmm.cu in one process (spmm_ab.py: bits, accuracy
# against torch's cuSPARSE, times; stops here if a case is wrong), then the closing check of
# the submitted code (scripts/session_check.sh: the sharded GPU suite, the bench with the
# reference kernels, the sanitizers).
# Usage on the GPU machine, from the repo root (scratch/base/cuda_src: the tree before the
# patch, carried): OUT=dir bash benchmarks/results/2026-12-04-h200-w/spmm_check.sh COMMIT
set -uo pipefail
export PYTHONPATH=.
timeout 300 python3 benchmarks/results/2026-12-04-h200-w/spmm_ab.py 2>&1 | tee $OUT/spmm_ab.txt | grep -v "^  "
grep -q "all right" $OUT/spmm_ab.txt || { echo "a case is wrong or the run failed: stop"; exit 1; }
bash scripts/session_check.sh "$1"
