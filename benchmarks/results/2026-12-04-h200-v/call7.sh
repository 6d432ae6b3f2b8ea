# Call 7 (the machine was taken back during call 6, final2.sh, with no output; too little
# device time was left for the full check): pack_ab.py alone, the shuffled pair setup
# against the starting tree's pack.cu, bits and times.
export PYTHONPATH=.
timeout 220 python3 benchmarks/results/2026-12-04-h200-v/pack_ab.py 2>&1 | tee $OUT/call7_pack_ab.txt
