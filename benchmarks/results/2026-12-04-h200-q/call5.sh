#!/bin/bash
export PYTHONPATH=.
COMMIT=$1
rm -rf .hypothesis
timeout 260 python3 benchmarks/bench.py --out $OUT/bench.json --no-progress --reference reference --time-budget 170 --commit $COMMIT > $OUT/bench.txt 2>&1; echo "bench rc=$?"
( timeout 100 python3 scratch/ws_ncu.py 2>&1 ) > $OUT/ws_times.txt; cat $OUT/ws_times.txt
( timeout 150 ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section Occupancy -k regex:"proto_matmul_pack_sm90_ws|twell_matmul_pack_sm90_bf16" python3 scratch/ws_ncu.py --profile 2>&1 ) > $OUT/ws_ncu.txt; echo "ncu rc=$?"; grep -E "^  [a-z_]+.*\(|Duration|Issued Warp|Eligible Warps|Warp Cycles Per Issued|Compute \(SM\)|L2 Cache Throughput|SM Frequency" $OUT/ws_ncu.txt | head -60
grep -E "^(gemm\+pack|gated ffn) +(ffn|hot) +(bf16|fp16) s=0.99|^(gemm\+pack|gated ffn) +hot" $OUT/bench.txt
grep -A21 "^targets" $OUT/bench.txt
