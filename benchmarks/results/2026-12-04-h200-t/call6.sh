#!/usr/bin/env bash
# Call 6: twell_unpack_dense reading each lane's first slot with the count: the GPU tests of the conversions, then unpack_ab.py
# (before and after in one process). OUT=dir bash .../call5.sh
set -uo pipefail
export PYTHONPATH=.
timeout 240 python3 -m pytest -x -q -p no:cacheprovider tests/test_cuda_kernels.py -k "dense or written or wide or toarray" 2>&1 | tail -3
timeout 240 python3 benchmarks/results/2026-12-04-h200-t/unpack_ab.py 2>&1 | tail -30
