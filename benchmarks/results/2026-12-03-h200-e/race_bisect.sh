# Racecheck bisection on the fused kernel's internal sanitizer error.
cs="compute-sanitizer --tool racecheck --racecheck-report analysis --error-exitcode 99"
compute-sanitizer --help | grep -i -A2 racecheck > $OUT/cs_help.txt
for c in full full_s13 cublas k512 n2048 m128; do
  echo "== $c"; timeout 100 $cs --kernel-name kns=twell_ python3 scratch/race_bisect.py $c 2>&1 | grep -vE '^=+ *$' | tail -4
done
echo "== cublas unfiltered"; timeout 100 $cs python3 scratch/race_bisect.py cublas 2>&1 | tail -4
echo "== full_s13 memcpy-async no"; timeout 100 $cs --racecheck-memcpy-async no --kernel-name kns=twell_ python3 scratch/race_bisect.py full_s13 2>&1 | tail -4
