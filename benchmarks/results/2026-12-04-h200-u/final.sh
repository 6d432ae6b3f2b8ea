#!/usr/bin/env bash
# Call 5 of the twenty-first GPU session: the closing check of the submitted code
# (scripts/session_check.sh: the sharded GPU suite, the bench with the reference kernels, the
# sanitizers), then memcheck, racecheck and initcheck on the dense pack's kernel tests (the
# lean pack_pairs_staged stages through shared memory between __syncwarp()s).
# Usage on the GPU machine, from the repo root:
# OUT=dir bash benchmarks/results/2026-12-04-h200-u/final.sh COMMIT
set -uo pipefail
export PYTHONPATH=.
bash scripts/session_check.sh "$1"
for tool in memcheck racecheck initcheck; do
  TWELL_NO_MEMORY_POOL=1 timeout 100 compute-sanitizer --tool $tool --target-processes application-only --kernel-name kns=twell_pack_dense python3 -m pytest -q -p no:cacheprovider tests/test_cuda_kernels.py -k "vector_and_scalar or every_output_element or deterministic" > /tmp/p.txt 2>&1
  echo "== pack $tool rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|passed|failed' /tmp/p.txt | tr '\n' ' ')" | tee -a $OUT/ffn_sanitizers.txt
done
