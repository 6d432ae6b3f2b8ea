#!/bin/bash
export PYTHONPATH=.
rm -rf .hypothesis
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/log.txt
( timeout 200 python -m pytest -q -p no:cacheprovider tests/test_ffn.py -k "sm90 or fused or auto" -x 2>&1 | tail -15 ) >> $OUT/log.txt
( timeout 120 ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats -k regex:"twell_matmul_pack_sm90|twell_reslot" -c 4 python3 benchmarks/ffn_dev.py --once 2>&1 ) > $OUT/ncu.txt
( timeout 120 python3 benchmarks/ffn_dev.py --sparsities 0.99 --stages 2>&1 ) > $OUT/stages.txt
tail -30 $OUT/stages.txt >> $OUT/log.txt
cat $OUT/log.txt
