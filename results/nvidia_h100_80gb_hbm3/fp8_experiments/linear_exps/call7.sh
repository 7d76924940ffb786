#!/bin/bash
# The kept kernel (5 of every 8 exponentials by exp2_linear at d = 128) in one call: the build,
# the timelines of 06d and the FP8 kernel at d = 128, the FP8 table (fp8_accuracy --time), the
# FP8 sweep of reproduce.sh, the tests and the sanitizers (reproduce.sh --tests), then, in the
# time left, passes of fp8_accuracy --time-only alternating with the previous kernel
# (build_c4: 4 of 8 at d = 128, the source in .scratch/src_c4).
cd "$(dirname "$0")/../../../.."
T0=$(date +%s)
R=$OUT/r; mkdir -p $R
trap 'cd $OUT && tar czf r.tgz r && rm -rf r' EXIT
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $OUT/run.log
rm -rf /tmp/src_c4 && cp -r .scratch/src_c4 /tmp/src_c4
( cmake --preset default > /dev/null && cmake --build --preset default -j11 > $R/build.txt 2>&1 ) &
( cmake -S /tmp/src_c4 -B /tmp/build_c4 -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a > /dev/null \
  && cmake --build /tmp/build_c4 -j5 --target fp8_accuracy > $R/build_c4.txt 2>&1 ) &
wait
echo "built $(( $(date +%s) - T0 )) s" >> $OUT/run.log
for n in 8192 16384; do
  timeout 30 build/bench/tile_timeline --fp8 --n $n > $R/tl_fp8_$n.txt 2>&1
  timeout 30 build/bench/tile_timeline --n $n > $R/tl_06d_$n.txt 2>&1
done
echo "timelines $(( $(date +%s) - T0 )) s" >> $OUT/run.log
timeout 60 build/bench/fp8_accuracy --time --csv $R/fp8_accuracy.csv > $R/fp8_accuracy.log 2>&1; echo "fp8_accuracy rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
timeout 150 build/bench/attn_bench --paper-sweep --rungs 06d_fa3,06_fp8 --dtype bf16,fp8 --d 64,128,256 --causal 0 --check \
  --csv $R/fp8_speed.csv > $R/fp8_speed.log 2>&1; echo "fp8 sweep rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
left=$(( 555 - ($(date +%s) - T0) ))
TESTS_ONLY=1 SANITIZE_TIMEOUT=120 timeout $left scripts/reproduce.sh --tests --out $R > $R/reproduce_tests.txt 2>&1; echo "tests rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
grep -h "tests ran\|PASSED\|FAILED\|ERROR SUMMARY\|RACECHECK SUMMARY" $R/tests.log $R/sanitize_*.log >> $OUT/run.log
for pass in 1 2 3; do
  [ $(( $(date +%s) - T0 )) -gt 560 ] && break
  for v in /tmp/build_c4 build; do
    n=$(basename $v)
    timeout 40 $v/bench/fp8_accuracy --time-only > $R/time_${n}_p$pass.txt 2>&1
    echo "pass $pass $n rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
  done
done
