#!/usr/bin/env bash
# Call 2: the Hopper SpMM's tests on the second form (predicated stores, overflow prefetch),
# then spmm_diag.py (its diagnostic forms against the first). OUT=dir bash .../call2.sh
set -uo pipefail
export PYTHONPATH=.
timeout 300 python3 benchmarks/results/2026-12-04-h200-t/spmm_diag.py 2>&1 | tail -45
timeout 240 python3 -m pytest -x -q -p no:cacheprovider tests/test_spmm_sm90.py 2>&1 | tail -15
