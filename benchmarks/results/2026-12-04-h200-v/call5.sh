# Call 5 (after the check, no library change): ncu's per-instruction counts of the shipped
# slots pass (SASS; NVRTC builds without -lineinfo), for the next session's kernel work.
export PYTHONPATH=.
timeout 240 ncu --clock-control none --section SourceCounters --section InstructionStats \
  --section WarpStateStats --section SchedulerStats --section SpeedOfLight \
  -k regex:twell_pack_dense --launch-skip 1 --launch-count 1 --import-source yes -o /tmp/rep \
  python3 benchmarks/results/2026-12-04-h200-v/pack_sass.py > /tmp/ncu.txt 2>&1; echo "ncu rc=$?"
tail -3 /tmp/ncu.txt
ncu -i /tmp/rep.ncu-rep --page details > $OUT/call5_ncu_details.txt 2>&1; echo "details rc=$?"
ncu -i /tmp/rep.ncu-rep --page source --csv --print-source sass > $OUT/call5_sass.csv 2>&1; echo "sass rc=$?"
wc -c $OUT/*; head -c 600 $OUT/call5_sass.csv
