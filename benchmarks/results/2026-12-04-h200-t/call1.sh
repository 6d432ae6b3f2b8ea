#!/usr/bin/env bash
# Call 1 of the twentieth GPU session: the Hopper SpMM's tests, then its timing against the
# other ways (spmm_sm90.py). Usage on the GPU machine: OUT=dir bash .../call1.sh
set -uo pipefail
export PYTHONPATH=.
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 240 python3 -m pytest -x -q -p no:cacheprovider tests/test_spmm_sm90.py 2>&1 | tail -25
timeout 300 python3 benchmarks/results/2026-12-04-h200-t/spmm_sm90.py 2>&1 | tail -40
