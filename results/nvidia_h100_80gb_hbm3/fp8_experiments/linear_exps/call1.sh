#!/bin/bash
# A/B 1 in one call: k of every 8 exponentials of the FP8 softmax by exp2_linear (integer
# ALU) instead of MUFU.EX2 (ATTN_FP8_LINEAR_EXPS = k; build_0 = the committed kernel).
# Three timing passes, accuracy of each, timelines, and the GPU tests on k = 4.
cd "$(dirname "$0")/../../../.."
T0=$(date +%s)
R=$OUT/r; mkdir -p $R
trap 'cd $OUT && tar czf r.tgz r && rm -rf r' EXIT
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $OUT/run.log
cfg() { cmake -S . -B $1 -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a "-DCMAKE_CUDA_FLAGS=$2" > /dev/null; }
( cfg build_0 "" && cmake --build build_0 -j4 --target fp8_accuracy tile_timeline > $R/build_0.txt 2>&1 ) &
( cfg build_2 "-DATTN_FP8_LINEAR_EXPS=2" && cmake --build build_2 -j4 --target fp8_accuracy > $R/build_2.txt 2>&1 ) &
( cfg build_3 "-DATTN_FP8_LINEAR_EXPS=3" && cmake --build build_3 -j4 --target fp8_accuracy tile_timeline > $R/build_3.txt 2>&1 ) &
( cfg build_4 "-DATTN_FP8_LINEAR_EXPS=4" && cmake --build build_4 -j4 --target fp8_accuracy tile_timeline gpu_tests > $R/build_4.txt 2>&1 ) &
wait
echo "built $(( $(date +%s) - T0 )) s" >> $OUT/run.log
for pass in 1 2 3; do
  for v in build_0 build_2 build_3 build_4; do
    timeout 40 $v/bench/fp8_accuracy --time-only > $R/time_${v}_p$pass.txt 2>&1
    echo "pass $pass $v rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
  done
done
for v in build_0 build_3 build_4; do timeout 30 $v/bench/tile_timeline --fp8 --n 8192 > $R/tl_$v.txt 2>&1; done
echo "timelines $(( $(date +%s) - T0 )) s" >> $OUT/run.log
for v in build_0 build_2 build_3 build_4; do timeout 60 $v/bench/fp8_accuracy > $R/accuracy_$v.txt 2>&1; echo "accuracy $v rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log; done
timeout 150 build_4/tests/gpu_tests --gtest_brief=1 > $R/tests_4.txt 2>&1; echo "tests rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
grep -h "tests ran\|PASSED\|FAILED" $R/tests_4.txt >> $OUT/run.log
