#!/bin/bash
# A/B 1 in one call: the P V in two halves (ATTN_FP8_SPLIT_PV, bit per d: 1 = 64, 2 = 128,
# 8 = 256), with and without a branch that keeps the second half's conversion after the
# first half's QGMMA (ATTN_FP8_SPLIT_PV_FENCE). build_b = committed kernel. Three timing
# passes, timelines, accuracy and the GPU tests + sanitizers on the fenced split.
cd "$(dirname "$0")/../../../.."
T0=$(date +%s)
R=$OUT/r; mkdir -p $R
trap 'cd $OUT && tar czf r.tgz r && rm -rf r' EXIT
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $OUT/run.log
cfg() { cmake -S . -B $1 -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a "-DCMAKE_CUDA_FLAGS=$2" > /dev/null; }
( cfg build_b "" && cmake --build build_b -j5 --target fp8_accuracy tile_timeline > $R/build_b.txt 2>&1 ) &
( cfg build_s "-DATTN_FP8_SPLIT_PV=11 -DATTN_FP8_SPLIT_PV_FENCE=1" && cmake --build build_s -j6 --target fp8_accuracy tile_timeline gpu_tests > $R/build_s.txt 2>&1 ) &
( cfg build_n "-DATTN_FP8_SPLIT_PV=11" && cmake --build build_n -j5 --target fp8_accuracy > $R/build_n.txt 2>&1 ) &
wait
echo "built $(( $(date +%s) - T0 )) s" >> $OUT/run.log
for pass in 1 2 3; do
  for v in build_b build_s build_n; do
    timeout 40 $v/bench/fp8_accuracy --time-only > $R/time_${v}_p$pass.txt 2>&1
    echo "pass $pass $v rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
  done
done
for v in build_b build_s; do timeout 30 $v/bench/tile_timeline --fp8 --n 8192 > $R/tl_$v.txt 2>&1; done
echo "timelines $(( $(date +%s) - T0 )) s" >> $OUT/run.log
timeout 60 build_s/bench/fp8_accuracy > $R/accuracy_s.txt 2>&1; echo "accuracy rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
timeout 150 build_s/tests/gpu_tests --gtest_brief=1 > $R/tests_s.txt 2>&1; echo "tests rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
for tool in memcheck racecheck synccheck; do
  left=$(( 560 - ($(date +%s) - T0) )); [ $left -gt 20 ] || break
  timeout $left compute-sanitizer --tool $tool --error-exitcode 1 build_s/tests/gpu_tests --gtest_brief=1 --gtest_filter='*Sanitize*' > $R/sanitize_$tool.txt 2>&1
  echo "$tool rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
done
grep -h "tests ran\|PASSED\|FAILED\|ERROR SUMMARY\|RACECHECK SUMMARY" $R/tests_s.txt $R/sanitize_*.txt >> $OUT/run.log
