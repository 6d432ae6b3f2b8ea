# Call 2: ncu of the dense pack's passes (v4 slots, v4 count, stream count, read only).
export PYTHONPATH=.
S="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis"
timeout 500 ncu $S -k regex:"pack|read_only" --launch-skip 4 --launch-count 4 \
  python3 benchmarks/results/2026-12-04-h200-u/pack_ncu.py > $OUT/call2_ncu.txt 2>&1
tail -c 200 $OUT/call2_ncu.txt
grep -E "twell_pack_dense|proto_|Duration|DRAM Throughput|Memory Throughput|Issue Slots Busy|Issued Warp|No Eligible|Achieved Occupancy|Theoretical Occupancy|Registers Per|Stall|Warp Cycles Per Issued|Active Warps Per|Eligible Warps|L1/TEX Hit|L2 Hit|Block Limit" $OUT/call2_ncu.txt | head -150
