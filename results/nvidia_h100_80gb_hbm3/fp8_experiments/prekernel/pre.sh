#!/bin/bash
# A/B of the pre-kernel: persistent + bulk copies (build, 2 stages; /tmp/s3: 3 stages) vs
# one CTA per block (/tmp/old), one call. Tests of the FP8 path and sanitizers on the new one.
cd "$(dirname "$0")/.."
T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $OUT/run.log
mkdir -p $OUT/t /tmp/old /tmp/s3
tar --exclude=./build --exclude=./.git -cf - . | tar -xf - -C /tmp/old
tar --exclude=./build --exclude=./.git -cf - . | tar -xf - -C /tmp/s3
cp .scratch/old_fp8_quantize.cuh /tmp/old/06_fa3_hopper/fp8_quantize.cuh
sed -i 's/constexpr int kQuantStages = 2;/constexpr int kQuantStages = 3;/' /tmp/s3/06_fa3_hopper/fp8_quantize.cuh
grep -c "kQuantStages = 3" /tmp/s3/06_fa3_hopper/fp8_quantize.cuh >> $OUT/run.log
( cmake --preset default > /dev/null && cmake --build build -j8 --target gpu_tests fp8_accuracy > $OUT/t/build.txt 2>&1 ) &
( cd /tmp/old && cmake --preset default > /dev/null && cmake --build build -j4 --target fp8_accuracy > $OUT/t/build_old.txt 2>&1 ) &
( cd /tmp/s3 && cmake --preset default > /dev/null && cmake --build build -j4 --target fp8_accuracy > $OUT/t/build_s3.txt 2>&1 ) &
wait
echo "built $(( $(date +%s) - T0 )) s" >> $OUT/run.log
ls build/bench/fp8_accuracy /tmp/old/build/bench/fp8_accuracy /tmp/s3/build/bench/fp8_accuracy >> $OUT/run.log 2>&1
timeout 150 build/tests/gpu_tests --gtest_brief=1 --gtest_filter='*Fp8*:*fp8*' > $OUT/t/tests_fp8.txt 2>&1
echo "tests_fp8 rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
for tool in memcheck racecheck synccheck; do
  timeout 90 compute-sanitizer --tool $tool --error-exitcode 1 build/tests/gpu_tests --gtest_brief=1 \
    --gtest_filter='*SanitizeFp8PreKernel*' > $OUT/t/sanitize_${tool}_prekernel.txt 2>&1
  echo "$tool rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
done
for pass in 1 2; do
  for v in build /tmp/old/build /tmp/s3/build; do
    [[ $pass == 2 && $v == /tmp/s3/build ]] && continue
    n=$(echo $v | tr '/' '_')
    timeout 100 $v/bench/fp8_accuracy --time-only > $OUT/t/time${n}_p$pass.txt 2>&1
    echo "pass $pass $v rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
  done
done
grep -h "tests ran\|PASSED\|FAILED\|ERROR SUMMARY\|RACECHECK SUMMARY" $OUT/t/*.txt >> $OUT/run.log
cd $OUT && tar czf t.tgz t && rm -rf t
