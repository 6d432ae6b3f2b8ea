# Call 1: the streaming pack prototype against the shipped twell_pack_dense (bits, times).
export PYTHONPATH=.
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
timeout 540 python benchmarks/prototypes/pack_stream.py 2>&1 | tee $OUT/call1_pack_stream.txt
