# Call 8 (after the check, no library change): pack_stream.py with proto_pack_lean = the shipped
# lean pack_pairs_staged plus a 32-bit tile count ("v4" in its table is the shipped kernel
# as of 6ab1c1d, the lean one).
export PYTHONPATH=.
timeout 280 python benchmarks/prototypes/pack_stream.py 2>&1 | tee $OUT/call8_pack_tiles32.txt
