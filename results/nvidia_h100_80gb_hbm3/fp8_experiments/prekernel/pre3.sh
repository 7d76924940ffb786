#!/bin/bash
# build = persistent grid (16 warps at d = 256); /tmp/g1 = the same kernel, one CTA per block.
# Then ncu on the d = 128 pre-kernel (N = 16k).
cd "$(dirname "$0")/.."
T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $OUT/run.log
mkdir -p $OUT/t /tmp/g1
tar --exclude=./build --exclude=./.git -cf - . | tar -xf - -C /tmp/g1
sed -i 's/const unsigned ctas = unsigned(std::min(total, 1LL \* sm_count() \* ctas_per_sm));/const unsigned ctas = unsigned(total); (void)ctas_per_sm;/' /tmp/g1/06_fa3_hopper/fp8_quantize.cuh
grep -c "unsigned(total); (void)" /tmp/g1/06_fa3_hopper/fp8_quantize.cuh >> $OUT/run.log
( cmake --preset default > /dev/null && cmake --build build -j10 --target gpu_tests fp8_accuracy attn_bench > $OUT/t/build.txt 2>&1 ) &
( cd /tmp/g1 && cmake --preset default > /dev/null && cmake --build build -j6 --target fp8_accuracy > $OUT/t/build_g1.txt 2>&1 ) &
wait
echo "built $(( $(date +%s) - T0 )) s" >> $OUT/run.log
timeout 100 build/tests/gpu_tests --gtest_brief=1 --gtest_filter='*Fp8PreKernel*' > $OUT/t/tests_pre.txt 2>&1
echo "tests_pre rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
for pass in 1 2; do
  for v in build /tmp/g1/build; do
    n=$(echo $v | tr '/' '_')
    timeout 100 $v/bench/fp8_accuracy --time-only > $OUT/t/time${n}_p$pass.txt 2>&1
    echo "pass $pass $v rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
  done
done
PROFILE_KERNELS=quantize PROFILE_OUT=$OUT/t/prof timeout 120 scripts/profile.sh 06_fp8 --paper-sweep --d 128 --n 16384 --causal 0 --dtype fp8 > $OUT/t/profile_d128.txt 2>&1
echo "profile rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
grep -h "tests ran\|PASSED\|FAILED" $OUT/t/*.txt >> $OUT/run.log
cd $OUT && tar czf t.tgz t && rm -rf t
