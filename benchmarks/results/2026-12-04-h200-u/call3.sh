# Call 3: the lean pack prototype (fewer instructions a pair) and the streaming one (3 stages)
# against the shipped twell_pack_dense (bits, times).
export PYTHONPATH=.
timeout 540 python benchmarks/prototypes/pack_stream.py 2>&1 | tee $OUT/call3_pack_lean.txt
