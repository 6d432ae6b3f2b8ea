#!/usr/bin/env bash
# Call 3: the third form (rounds of one store per lane) timed against the second and its
# diagnostic forms (spmm_diag.py), ncu of it at 95%, then its tests. OUT=dir bash .../call3.sh
set -uo pipefail
export PYTHONPATH=.
D=benchmarks/results/2026-12-04-h200-t
timeout 300 python3 $D/spmm_diag.py 2>&1 | tail -50
M="smsp__inst_executed_op_shared_st.sum,smsp__inst_executed_op_shared_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed,sm__inst_executed.sum,regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio"
timeout 200 ncu --kernel-name regex:twell_spmm_sm90 --launch-skip 1 --launch-count 1 \
  --section WarpStateStats --section SchedulerStats --section SpeedOfLight --metrics "$M" \
  python3 $D/ncu_spmm.py 0.95 > $OUT/call3_ncu.txt 2>&1
echo "ncu rc=$?"; grep -E "stalled_.*ratio +[0-9.]*[1-9]|shared|inst_executed.sum|Duration|Throughput|Eligible|Issued Warp|No Eligible|Active Warps" $OUT/call3_ncu.txt | grep -v " 0$\| 0,00$" | head -60
timeout 200 python3 -m pytest -x -q -p no:cacheprovider tests/test_spmm_sm90.py 2>&1 | tail -5
