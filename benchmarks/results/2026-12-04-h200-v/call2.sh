# Call 2: the working tree's launchers against the session's starting tree in one process
# (ab_host.py), then the GPU tests the first call did not reach.
export PYTHONPATH=.
taskset -c 2 timeout 200 python3 benchmarks/results/2026-12-04-h200-v/ab_host.py 2>&1 | tee $OUT/call2_ab_host.txt
timeout 330 python3 -m pytest -q -p no:cacheprovider tests/test_determinism.py \
  tests/test_cuda_kernels.py tests/test_ffn.py 2>&1 | tail -4 | tee $OUT/call2_tests.txt
