#!/bin/bash
# A/B: the next block's K and this block's V tested early (mbarrier_ready after S lands,
# -DATTN_EARLY_TEST, build_et) vs waited for where they are used (build), one call.
cd "$(dirname "$0")/.."
T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $OUT/run.log
mkdir -p $OUT/t
T="gpu_tests fp8_accuracy tile_timeline"
( cmake --preset default > /dev/null && cmake --build build -j8 --target $T > $OUT/t/build.txt 2>&1 ) &
( cmake -S . -B build_et -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_CUDA_FLAGS=-DATTN_EARLY_TEST > /dev/null && cmake --build build_et -j8 --target $T > $OUT/t/build_et.txt 2>&1 ) &
wait
echo "built $(( $(date +%s) - T0 )) s" >> $OUT/run.log
for pass in 1 2 3; do
  for v in build build_et; do
    timeout 60 $v/bench/fp8_accuracy --time-only > $OUT/t/time_${v}_p$pass.txt 2>&1
    echo "pass $pass $v rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
  done
done
for v in build build_et; do timeout 40 $v/bench/tile_timeline --fp8 --n 8192 > $OUT/t/tl_$v.txt 2>&1; done
echo "timeline $(( $(date +%s) - T0 )) s" >> $OUT/run.log
timeout 150 build_et/tests/gpu_tests --gtest_brief=1 > $OUT/t/tests_et.txt 2>&1
echo "tests_et rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
grep -h "tests ran\|PASSED\|FAILED" $OUT/t/tests_et.txt >> $OUT/run.log
cd $OUT && tar czf t.tgz t && rm -rf t
