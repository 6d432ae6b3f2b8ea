export PYTHONPATH=.
COMMIT=$1
rm -rf .hypothesis
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
SKIP_BENCH=1 JOBS=4 TESTS_TIMEOUT=230 OUT=/tmp/g bash scripts/gpu_check.sh > $OUT/gpu_check.txt 2>&1; echo "suite rc=$?"; grep -E "[0-9]+ passed|failed|FAILED|Error" $OUT/gpu_check.txt | tail -8
timeout 260 python3 benchmarks/bench.py --out $OUT/bench.json --no-progress --reference reference --time-budget 170 --commit $COMMIT > $OUT/bench.txt 2>&1; echo "bench rc=$?"
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
grep -E "^(gemm\+pack|gated ffn) +ffn +(bf16|fp16) s=0.99|^pack +ffn +bf16 s=0.99" $OUT/bench.txt
grep -A20 "^targets" $OUT/bench.txt
grep -E "^(gemm\+pack|gated ffn|spmm) +hot +bf16 s=0.95" $OUT/bench.txt
# Unfiltered (every kernel instrumented): with --kernel-name kns=twell_gated (as call 5 ran
# it) initcheck does not see cuBLAS write the dense way's float32 product (call 6).
for tool in memcheck initcheck; do
  HYPOTHESIS_PROFILE=sanitize TWELL_NO_MEMORY_POOL=1 timeout 120 compute-sanitizer --tool $tool --target-processes application-only python3 -m pytest -q -p no:cacheprovider tests/test_ffn.py -k "gated_up_kernel and (f16 or bf16)" > /tmp/s.txt 2>&1
  echo "== gated $tool rc=$?: $(grep -E 'ERROR SUMMARY|passed|failed' /tmp/s.txt | tr '\n' ' ')" | tee -a $OUT/ffn_sanitizers.txt
done
timeout 90 python3 benchmarks/prototypes/matmul_pack_sm90_persist.py > $OUT/persist.txt 2>&1; echo "persist rc=$?"; cat $OUT/persist.txt
