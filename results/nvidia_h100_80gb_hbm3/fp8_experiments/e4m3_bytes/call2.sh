#!/bin/bash
# The kept kernel (exp2_e4m3_linear, 6 of every 8 pairs at d <= 128) in one call: the build,
# the timelines of the FP8 kernel (d = 128, N = 8k and 16k) and of 06d (8k), the FP8 table
# (fp8_accuracy --time), the FP8 sweep of reproduce.sh, the tests and the sanitizers
# (reproduce.sh --tests), then, in the time left, passes of fp8_accuracy --time-only
# alternating with the previous kernel (old5: exp2_linear as a float, 5 of 8 at d = 128 and
# 4 at d = 64; its library, .scratch/variants/old5.so.xz, is call1's).
cd "$(dirname "$0")/../../../.."
T0=$(date +%s)
R=$OUT/r; mkdir -p $R
trap 'cd $OUT && tar czf r.tgz r && rm -rf r' EXIT
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $OUT/run.log
mkdir -p /tmp/v/old5 && xz -dc .scratch/variants/old5.so.xz > /tmp/v/old5/libattn_ladder.so
mkdir -p /tmp/v/new && cmake --preset default > /dev/null && cmake --build --preset default -j16 > $R/build.txt 2>&1
echo "built rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
cp build/libattn_ladder.so /tmp/v/new/
for n in 8192 16384; do timeout 30 build/bench/tile_timeline --fp8 --n $n > $R/tl_fp8_$n.txt 2>&1; done
timeout 30 build/bench/tile_timeline --n 8192 > $R/tl_06d_8192.txt 2>&1
echo "timelines $(( $(date +%s) - T0 )) s" >> $OUT/run.log
timeout 60 build/bench/fp8_accuracy --time --csv $R/fp8_accuracy.csv > $R/fp8_accuracy.log 2>&1; echo "fp8_accuracy rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
timeout 150 build/bench/attn_bench --paper-sweep --rungs 06d_fa3,06_fp8 --dtype bf16,fp8 --d 64,128,256 --causal 0 --check \
  --csv $R/fp8_speed.csv > $R/fp8_speed.log 2>&1; echo "fp8 sweep rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
left=$(( 520 - ($(date +%s) - T0) ))
TESTS_ONLY=1 SANITIZE_TIMEOUT=120 timeout $left scripts/reproduce.sh --tests --out $R > $R/reproduce_tests.txt 2>&1; echo "tests rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
grep -h "tests ran\|PASSED\|FAILED\|ERROR SUMMARY\|RACECHECK SUMMARY" $R/tests.log $R/sanitize_*.log >> $OUT/run.log
for pass in 1 2 3; do
  for n in old5 new; do
    [ $(( $(date +%s) - T0 )) -gt 570 ] && break 2
    LD_LIBRARY_PATH=/tmp/v/$n timeout 30 build/bench/fp8_accuracy --time-only > $R/time_${n}_p$pass.txt 2>&1
    echo "pass $pass $n rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
  done
done
