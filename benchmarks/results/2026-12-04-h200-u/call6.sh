# Call 6 (after the check, no code change): initcheck on the dense pack's kernel test alone
# (call 5's ran past its limit), then ncu of the shipped (lean) slots and count passes.
export PYTHONPATH=.
TWELL_NO_MEMORY_POOL=1 timeout 150 compute-sanitizer --tool initcheck --target-processes application-only --kernel-name kns=twell_pack_dense python3 -m pytest -q -p no:cacheprovider tests/test_cuda_kernels.py -k "every_output_element" > /tmp/p.txt 2>&1
echo "== pack initcheck rc=$?: $(grep -E 'ERROR SUMMARY|passed|failed' /tmp/p.txt | tr '\n' ' ')" | tee $OUT/call6_initcheck.txt
S="--section SpeedOfLight --section SchedulerStats --section Occupancy"
timeout 200 ncu $S -k regex:"twell_pack" --launch-skip 2 --launch-count 2 \
  python3 benchmarks/results/2026-12-04-h200-u/pack_ncu.py > $OUT/call6_ncu.txt 2>&1
grep -E "twell_pack_dense|Duration|DRAM Throughput|Compute \(SM\)|Issued Warp|Registers Per|Achieved Occupancy" $OUT/call6_ncu.txt
