#!/usr/bin/env bash
# The GPU release check, on a GPU machine, of the code in this checkout: the whole test-suite on
# the GPU (scripts/gpu_check.sh, 4 shards), the benchmark suite with the reference kernels
# (when ./reference holds a copy of them) and compute-sanitizer over the kernels' tests:
# memcheck and initcheck on the kernel and scan tests (scripts/sanitize.sh); memcheck,
# racecheck and synccheck on the Hopper fused kernel's bit tests; memcheck and initcheck on
# the slots="auto" and gated up-projection tests (unfiltered: with --kernel-name, initcheck
# does not see cuBLAS write the dense way's product); memcheck on the dense and CSR pack tests
# (twell_pack kernels only: their count passes take null storage arrays). Prints a short
# summary; the logs go to $OUT as gpu_check.txt, pytest.log (each failure's report),
# bench.json, bench.txt, sanitizer.txt and ffn_sanitizers.txt. About 6-7 minutes on an H200.
# Usage on the GPU machine, from the repository root: OUT=dir bash scripts/release_check.sh
set -uo pipefail
export PYTHONPATH=.
rm -rf .hypothesis
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
SKIP_BENCH=1 JOBS=4 TESTS_TIMEOUT=230 OUT=/tmp/g bash scripts/gpu_check.sh > $OUT/gpu_check.txt 2>&1; echo "suite rc=$?"; cp /tmp/g/pytest.log $OUT/pytest.log; grep -E "[0-9]+ passed|failed|FAILED|Error" $OUT/gpu_check.txt | tail -8
timeout 260 python3 benchmarks/bench.py --out $OUT/bench.json --no-progress --reference reference --time-budget 170 > $OUT/bench.txt 2>&1; echo "bench rc=$?"
JOBS=2 TOOLS="memcheck initcheck" KERNELS=twell_ TIMEOUT=130 OUT=/tmp/san bash scripts/sanitize.sh tests/test_cuda_kernels.py tests/test_determinism.py -q -p no:cacheprovider -k "spmv_matches or (splits_rows and float32) or (every_spmm_kernel and float32) or (gather_spmm_sums and float32) or (listed_kernels and float32) or exclusive_scan or exclusive_cumsum" > $OUT/sanitizer.txt 2>&1; echo "sanitize rc=$?"; grep -E "exit|SUMMARY" $OUT/sanitizer.txt | tail -4
for tool in memcheck racecheck synccheck; do
  HYPOTHESIS_PROFILE=sanitize TWELL_NO_MEMORY_POOL=1 timeout 170 compute-sanitizer --tool $tool --target-processes application-only --kernel-name kns=twell_matmul_pack python3 -m pytest -q -p no:cacheprovider tests/test_ffn.py -k "sm90_kernel_gives and (128 or 77 or 300)" > /tmp/s.txt 2>&1
  echo "== sm90 $tool rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|passed|failed' /tmp/s.txt | tr '\n' ' ')" | tee -a $OUT/ffn_sanitizers.txt
  tail -5 /tmp/s.txt >> $OUT/ffn_sanitizers.txt
done
for tool in memcheck initcheck; do
  HYPOTHESIS_PROFILE=sanitize TWELL_NO_MEMORY_POOL=1 timeout 170 compute-sanitizer --tool $tool --target-processes application-only python3 -m pytest -q -p no:cacheprovider tests/test_ffn.py -k "auto_packs_once" > /tmp/s.txt 2>&1
  echo "== auto $tool rc=$?: $(grep -E 'ERROR SUMMARY|passed|failed' /tmp/s.txt | tr '\n' ' ')" | tee -a $OUT/ffn_sanitizers.txt
  grep -m5 -B2 -A8 "=========.*\(Invalid\|Uninitialized\)" /tmp/s.txt >> $OUT/ffn_sanitizers.txt; tail -5 /tmp/s.txt >> $OUT/ffn_sanitizers.txt
done
# Unfiltered: every kernel instrumented, cuBLAS's included (see the top).
for tool in memcheck initcheck; do
  HYPOTHESIS_PROFILE=sanitize TWELL_NO_MEMORY_POOL=1 timeout 120 compute-sanitizer --tool $tool --target-processes application-only python3 -m pytest -q -p no:cacheprovider tests/test_ffn.py -k "gated_up_kernel and (f16 or bf16)" > /tmp/s.txt 2>&1
  echo "== gated $tool rc=$?: $(grep -E 'ERROR SUMMARY|passed|failed' /tmp/s.txt | tr '\n' ' ')" | tee -a $OUT/ffn_sanitizers.txt
  tail -5 /tmp/s.txt >> $OUT/ffn_sanitizers.txt
done
HYPOTHESIS_PROFILE=sanitize TWELL_NO_MEMORY_POOL=1 timeout 150 compute-sanitizer --tool memcheck \
  --target-processes application-only --kernel-name kns=twell_pack python3 -m pytest -q \
  -p no:cacheprovider tests/test_cuda_kernels.py tests/test_determinism.py -k "vector_and_scalar or every_output_element or bitwise_deterministic or tile_counts_csr_kernel or every_16_bit_pattern or (every_dense_pack_kernel and 1000-256)" > /tmp/p.txt 2>&1
echo "== pack memcheck rc=$?: $(grep -E 'ERROR SUMMARY|passed|failed' /tmp/p.txt | tr '\n' ' ')" | tee -a $OUT/ffn_sanitizers.txt
# The summary: the feed-forward rows and the targets.
grep -E "^(gemm\+pack|gated ffn) +ffn +(bf16|fp16) s=0.99|^pack +ffn +bf16 s=0.99" $OUT/bench.txt
grep -A20 "^targets" $OUT/bench.txt
grep -E "^(gemm\+pack|gated ffn|spmm) +hot +bf16 s=0.95" $OUT/bench.txt
