#!/bin/bash
# A/B 2 in one call: FP8 eager (= committed kernel) / eager + P's conversion before the
# rescale (-DATTN_CONVERT_FIRST) / lazy / lazy + conversion first. Timing passes, accuracy,
# tests of lazy + conversion first, timelines.
cd "$(dirname "$0")/.."
T0=$(date +%s)
R=$OUT/r; mkdir -p $R
trap 'cd $OUT && tar czf r.tgz r && rm -rf r' EXIT
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $OUT/run.log
cfg() { cmake -S . -B $1 -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a "-DCMAKE_CUDA_FLAGS=$2" > /dev/null; }
( cfg build_e -DATTN_FP8_EAGER && cmake --build build_e -j4 --target fp8_accuracy tile_timeline > $R/build_e.txt 2>&1 ) &
( cfg build_ec "-DATTN_FP8_EAGER -DATTN_CONVERT_FIRST" && cmake --build build_ec -j4 --target fp8_accuracy > $R/build_ec.txt 2>&1 ) &
( cfg build_l "" && cmake --build build_l -j4 --target fp8_accuracy > $R/build_l.txt 2>&1 ) &
( cfg build_lc -DATTN_CONVERT_FIRST && cmake --build build_lc -j4 --target fp8_accuracy tile_timeline gpu_tests > $R/build_lc.txt 2>&1 ) &
wait
echo "built $(( $(date +%s) - T0 )) s" >> $OUT/run.log
for pass in 1 2 3; do
  for v in build_e build_ec build_l build_lc; do
    timeout 40 $v/bench/fp8_accuracy --time-only > $R/time_${v}_p$pass.txt 2>&1
    echo "pass $pass $v rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
  done
done
timeout 60 build_lc/bench/fp8_accuracy > $R/accuracy_lc.txt 2>&1; echo "accuracy rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
timeout 150 build_lc/tests/gpu_tests --gtest_brief=1 > $R/tests_lc.txt 2>&1; echo "tests_lc rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
grep -h "tests ran\|PASSED\|FAILED" $R/tests_lc.txt >> $OUT/run.log
for v in build_e build_lc; do timeout 30 $v/bench/tile_timeline --fp8 --n 8192 > $R/tl_$v.txt 2>&1; done
echo "timelines $(( $(date +%s) - T0 )) s" >> $OUT/run.log
