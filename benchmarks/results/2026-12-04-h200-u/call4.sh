# Call 4: the lean pack_pairs_staged in pack.cu: bits and times against v4 (pack_ab.py), then
# the construction, conversion, overflow and kernel GPU tests on it.
export PYTHONPATH=.
timeout 330 python3 benchmarks/results/2026-12-04-h200-u/pack_ab.py 2>&1 | tee $OUT/call4_pack_ab.txt
timeout 240 python3 -m pytest -q -x -p no:cacheprovider tests/test_construction.py \
  tests/test_overflow_stress.py tests/test_determinism.py tests/test_cuda_kernels.py \
  2>&1 | tail -5 | tee $OUT/call4_tests.txt
