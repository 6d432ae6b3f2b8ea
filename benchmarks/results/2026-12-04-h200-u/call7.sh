# Call 7 (after the check, no code change): initcheck on the dense pack's kernel tests without
# the kernel filter (with --kernel-name, initcheck does not track the writes of CuPy's own
# kernels and reports their outputs as uninitialized: NOTES, fifth session; call 6 hit that).
export PYTHONPATH=.
timeout 240 compute-sanitizer --tool initcheck --target-processes application-only python3 -m pytest -q -p no:cacheprovider tests/test_cuda_kernels.py -k "vector_and_scalar or every_output_element or deterministic" > /tmp/p.txt 2>&1
echo "== pack initcheck (no filter) rc=$?: $(grep -E 'ERROR SUMMARY|passed|failed' /tmp/p.txt | tr '\n' ' ')" | tee $OUT/call7_initcheck.txt
grep -m3 -A6 "Uninitialized" /tmp/p.txt | tee -a $OUT/call7_initcheck.txt
