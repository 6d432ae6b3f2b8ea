#!/usr/bin/env bash
# Call 1 of the twenty-third GPU session: the shuffled pair setup of pack_pairs_staged, shipped
# in 0612a58. Bits and times against the twenty-second session's pack.cu (h200-v's
# pack_ab.py, with scratch/base/cuda_src; stops here if any bit differs), then the closing
# check of the submitted code (scripts/session_check.sh: the sharded GPU suite, the bench with
# the reference kernels, the sanitizers), then memcheck on the dense and CSR pack tests
# (twell_pack kernels only).
# Usage on the GPU machine, from the repo root:
# OUT=dir bash benchmarks/results/2026-12-04-h200-w/final.sh COMMIT
set -uo pipefail
export PYTHONPATH=.
timeout 200 python3 benchmarks/results/2026-12-04-h200-v/pack_ab.py 2>&1 | tee $OUT/call1_pack_ab.txt
grep -q "all bits equal" $OUT/call1_pack_ab.txt || { echo "bits differ or the run failed: stop"; exit 1; }
bash scripts/session_check.sh "$1"
HYPOTHESIS_PROFILE=sanitize TWELL_NO_MEMORY_POOL=1 timeout 150 compute-sanitizer --tool memcheck \
  --target-processes application-only --kernel-name kns=twell_pack python3 -m pytest -q \
  -p no:cacheprovider tests/test_cuda_kernels.py tests/test_determinism.py -k "vector_and_scalar or every_output_element or bitwise_deterministic or tile_counts_csr_kernel or every_16_bit_pattern or (staged_pack_of_wide_tiles and 1000-256)" > /tmp/p.txt 2>&1
echo "== pack memcheck rc=$?: $(grep -E 'ERROR SUMMARY|passed|failed' /tmp/p.txt | tr '\n' ' ')" | tee -a $OUT/ffn_sanitizers.txt
