# Call 4: compute-sanitizer memcheck on the dense and CSR pack tests (twell_pack kernels only),
# the count passes included: they now get null storage arrays.
export PYTHONPATH=.
HYPOTHESIS_PROFILE=sanitize TWELL_NO_MEMORY_POOL=1 timeout 250 compute-sanitizer --tool memcheck \
  --target-processes application-only --kernel-name kns=twell_pack python3 -m pytest -q \
  -p no:cacheprovider tests/test_cuda_kernels.py tests/test_determinism.py -k "vector_and_scalar or every_output_element or bitwise_deterministic or tile_counts_csr_kernel or every_16_bit_pattern or (staged_pack_of_wide_tiles and 1000-256)" > /tmp/p.txt 2>&1
echo "== pack memcheck rc=$?: $(grep -E 'ERROR SUMMARY|passed|failed' /tmp/p.txt | tr '\n' ' ')" | tee $OUT/call4_memcheck.txt
tail -5 /tmp/p.txt >> $OUT/call4_memcheck.txt
timeout 60 python3 benchmarks/results/2026-12-04-h200-v/read_floor.py 2>&1 | tee $OUT/call4_read_floor.txt
