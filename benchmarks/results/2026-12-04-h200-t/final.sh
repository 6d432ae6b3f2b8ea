#!/usr/bin/env bash
# Call 7 of the twentieth GPU session: the closing check of the submitted code
# (scripts/session_check.sh: the sharded GPU suite, the bench with the reference kernels, the
# sanitizers), memcheck and initcheck on the new to_dense test, then the prototype
# spmm_sm90_build.py. Usage on the GPU machine, from the repo root:
# OUT=dir bash benchmarks/results/2026-12-04-h200-t/final.sh COMMIT
set -uo pipefail
export PYTHONPATH=.
bash scripts/session_check.sh "$1"
for tool in memcheck initcheck; do
  TWELL_NO_MEMORY_POOL=1 timeout 120 compute-sanitizer --tool $tool --target-processes application-only --kernel-name kns=twell_unpack python3 -m pytest -q -p no:cacheprovider tests/test_cuda_kernels.py -k "wide_and_narrow and bfloat16" > /tmp/u.txt 2>&1
  echo "== unpack $tool rc=$?: $(grep -E 'ERROR SUMMARY|passed|failed' /tmp/u.txt | tr '\n' ' ')" | tee -a $OUT/ffn_sanitizers.txt
done
timeout 240 python3 benchmarks/prototypes/spmm_sm90_build.py > $OUT/spmm_sm90_build.txt 2>&1; echo "prototype rc=$?"
tail -32 $OUT/spmm_sm90_build.txt
