# Call 5 (on 2f02f6d): the session's closing check, scripts/session_check.sh (at that time
# written out here, and its gated initcheck filtered to --kernel-name kns=twell_gated, which
# made initcheck miss cuBLAS's writes: call 6), then the gated FFN's steps.
bash scripts/session_check.sh "$1"
timeout 100 python3 benchmarks/ffn_dev.py --gated --sparsities 0.99,0.95 > $OUT/ffn_dev_gated.txt 2>&1; echo "ffn_dev rc=$?"
grep -E "0.9[59] (layer|up,)" $OUT/ffn_dev_gated.txt
