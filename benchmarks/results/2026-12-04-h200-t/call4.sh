#!/usr/bin/env bash
# Call 4: ncu's per-instruction stall samples (SASS) of twell_spmm_sm90 at 95%, to find what
# the builder warps wait for. OUT=dir bash .../call4.sh
set -uo pipefail
export PYTHONPATH=.
D=benchmarks/results/2026-12-04-h200-t
timeout 300 ncu --kernel-name regex:twell_spmm_sm90 --launch-skip 1 --launch-count 1 \
  --section SourceCounters --section WarpStateStats -o /tmp/rep python3 $D/ncu_spmm.py 0.95 > /tmp/ncu.log 2>&1
echo "ncu rc=$?"; tail -3 /tmp/ncu.log
ncu -i /tmp/rep.ncu-rep --page source --print-source sass --csv > /tmp/sass.csv 2>&1
echo "print rc=$? lines $(wc -l < /tmp/sass.csv)"; head -3 /tmp/sass.csv | cut -c1-600
gzip -c /tmp/sass.csv > $OUT/call4_sass.csv.gz; ls -la $OUT
