# Call 10 (on 36cad2b, the submitted code): the session's closing check,
# scripts/session_check.sh (at that time written out here), then the persistent prototype.
bash scripts/session_check.sh "$1"
timeout 90 python3 benchmarks/prototypes/matmul_pack_sm90_persist.py > $OUT/persist.txt 2>&1; echo "persist rc=$?"; cat $OUT/persist.txt
