#!/bin/bash
# A/B in one call: FP8 eager (-DATTN_FP8_EAGER, = the committed kernel) vs lazy rescaling
# (default) vs lazy + slot carried (-DATTN_SLOT_CARRY); and build_r = lazy + the pre-kernel's
# row layout (row_layout_not_run.diff). Timing passes, accuracy, tests, timelines.
cd "$(dirname "$0")/.."
T0=$(date +%s)
R=$OUT/r; mkdir -p $R
trap 'cd $OUT && tar czf r.tgz r && rm -rf r' EXIT
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $OUT/run.log
rm -rf /tmp/rt && mkdir -p /tmp/rt && tar --exclude=./build --exclude=./.git -cf - . | tar -C /tmp/rt -xf -
( cd /tmp/rt && git apply results/nvidia_h100_80gb_hbm3/fp8_experiments/prekernel/row_layout_not_run.diff > $R/apply.txt 2>&1 )
grep -c "RowLayout" /tmp/rt/06_fa3_hopper/fp8_quantize.cuh >> $R/apply.txt
cfg() { cmake -S $1 -B $2 -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a "-DCMAKE_CUDA_FLAGS=$3" > /dev/null; }
( cfg . build_e -DATTN_FP8_EAGER && cmake --build build_e -j5 --target fp8_accuracy tile_timeline > $R/build_e.txt 2>&1 ) &
( cfg . build_l "" && cmake --build build_l -j5 --target fp8_accuracy tile_timeline > $R/build_l.txt 2>&1 ) &
( cfg . build_ls -DATTN_SLOT_CARRY && cmake --build build_ls -j5 --target fp8_accuracy tile_timeline gpu_tests > $R/build_ls.txt 2>&1 ) &
( cfg /tmp/rt /tmp/rt/build_r "" && cmake --build /tmp/rt/build_r -j5 --target fp8_accuracy gpu_tests > $R/build_r.txt 2>&1 ) &
wait
ln -sfn /tmp/rt/build_r build_r
echo "built $(( $(date +%s) - T0 )) s" >> $OUT/run.log
for pass in 1 2 3; do
  for v in build_e build_l build_ls build_r; do
    timeout 40 $v/bench/fp8_accuracy --time-only > $R/time_${v}_p$pass.txt 2>&1
    echo "pass $pass $v rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
  done
done
timeout 120 build_ls/bench/fp8_accuracy > $R/accuracy_ls.txt 2>&1; echo "accuracy rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
timeout 150 build_ls/tests/gpu_tests --gtest_brief=1 > $R/tests_ls.txt 2>&1; echo "tests_ls rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
grep -h "tests ran\|PASSED\|FAILED" $R/tests_ls.txt >> $OUT/run.log
timeout 60 build_r/tests/gpu_tests --gtest_brief=1 --gtest_filter='*Fp8*:*fp8*' > $R/tests_r.txt 2>&1; echo "tests_r rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
grep -h "tests ran\|PASSED\|FAILED" $R/tests_r.txt >> $OUT/run.log
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 1 build_r/tests/gpu_tests --gtest_brief=1 --gtest_filter='*SanitizeFp8PreKernel*' > $R/memcheck_r.txt 2>&1; echo "memcheck_r rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
for v in build_e build_l build_ls; do timeout 30 $v/bench/tile_timeline --fp8 --n 8192 > $R/tl_$v.txt 2>&1; done
echo "timelines $(( $(date +%s) - T0 )) s" >> $OUT/run.log
