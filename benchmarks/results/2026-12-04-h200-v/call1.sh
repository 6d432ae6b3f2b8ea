# Call 1: the dense pack's host costs, the working tree against the session's starting tree
# (scratch/base: 13abff8's twell/ and cuda_src/), then the pack and fused-pack GPU tests.
H=benchmarks/results/2026-12-04-h200-v/host_costs.py
for r in 1 2; do
  for t in scratch/base .; do PYTHONPATH=$t timeout 100 python3 $H e2e; done
done 2>&1 | tee $OUT/call1_e2e.txt
PYTHONPATH=. timeout 60 python3 $H micro 2>&1 | tee $OUT/call1_micro.txt
for t in . scratch/base; do PYTHONPATH=$t timeout 60 python3 $H profile; done 2>&1 | tee $OUT/call1_profile.txt
PYTHONPATH=. timeout 280 python3 -m pytest -q -x -p no:cacheprovider tests/test_construction.py \
  tests/test_overflow_stress.py tests/test_determinism.py tests/test_cuda_kernels.py \
  tests/test_ffn.py 2>&1 | tail -5 | tee $OUT/call1_tests.txt
