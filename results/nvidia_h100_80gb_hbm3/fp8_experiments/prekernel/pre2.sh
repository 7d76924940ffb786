#!/bin/bash
# A/B of the pre-kernel, one call: build = persistent + bulk copies, no branch before the
# shuffles; /tmp/of = one CTA per block (committed form) with that fix only; /tmp/old =
# committed; /tmp/w16 = build with 16 warps at d = 256.
cd "$(dirname "$0")/.."
T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $OUT/run.log
mkdir -p $OUT/t
for v in old of w16; do mkdir -p /tmp/$v; tar --exclude=./build --exclude=./.git -cf - . | tar -xf - -C /tmp/$v; done
cp .scratch/old_fp8_quantize.cuh /tmp/old/06_fa3_hopper/fp8_quantize.cuh
cp .scratch/old_fp8_quantize.cuh /tmp/of/06_fa3_hopper/fp8_quantize.cuh && (cd /tmp/of && patch -p1 < .scratch/oldfix.diff)  # as run: a copy of the patched file
sed -i 's/D == 256 ? 32 :/D == 256 ? 16 :/' /tmp/w16/06_fa3_hopper/fp8_quantize.cuh
grep -c "D == 256 ? 16 :" /tmp/w16/06_fa3_hopper/fp8_quantize.cuh >> $OUT/run.log
( cmake --preset default > /dev/null && cmake --build build -j7 --target gpu_tests fp8_accuracy > $OUT/t/build.txt 2>&1 ) &
for v in old of w16; do ( cd /tmp/$v && cmake --preset default > /dev/null && cmake --build build -j3 --target fp8_accuracy > $OUT/t/build_$v.txt 2>&1 ) & done
wait
echo "built $(( $(date +%s) - T0 )) s" >> $OUT/run.log
ls build/bench/fp8_accuracy /tmp/{old,of,w16}/build/bench/fp8_accuracy >> $OUT/run.log 2>&1
timeout 150 build/tests/gpu_tests --gtest_brief=1 --gtest_filter='*Fp8*:*fp8*' > $OUT/t/tests_fp8.txt 2>&1
echo "tests_fp8 rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
for tool in memcheck racecheck synccheck; do
  timeout 90 compute-sanitizer --tool $tool --error-exitcode 1 build/tests/gpu_tests --gtest_brief=1 \
    --gtest_filter='*SanitizeFp8PreKernel*' > $OUT/t/sanitize_${tool}_prekernel.txt 2>&1
  echo "$tool rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
done
for pass in 1 2; do
  for v in build /tmp/old/build /tmp/of/build /tmp/w16/build; do
    n=$(echo $v | tr '/' '_')
    timeout 100 $v/bench/fp8_accuracy --time-only > $OUT/t/time${n}_p$pass.txt 2>&1
    echo "pass $pass $v rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
  done
done
grep -h "tests ran\|PASSED\|FAILED\|ERROR SUMMARY\|RACECHECK SUMMARY" $OUT/t/*.txt >> $OUT/run.log
cd $OUT && tar czf t.tgz t && rm -rf t
