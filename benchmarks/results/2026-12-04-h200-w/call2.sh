#!/usr/bin/env bash
# Call 2 of the twenty-third GPU session: the gather SpMM's batches across windows (spmm.cu),
# old and new in one process (spmm_ab.py), then the SpMM kernel tests that hold the walks to
# the same bits and every output element to the float64 product.
# Usage on the GPU machine, from the repo root: OUT=dir bash .../call2.sh
set -uo pipefail
export PYTHONPATH=.
D=benchmarks/results/2026-12-04-h200-w
timeout 300 python3 $D/spmm_ab.py 2>&1 | tee $OUT/call2_spmm_ab.txt | grep -v "^  "
timeout 200 python3 -m pytest -q -p no:cacheprovider -x tests/test_cuda_kernels.py tests/test_determinism.py -k "spmm or spmv or listed or gather or walk" 2>&1 | tail -4 | tee $OUT/call2_tests.txt
