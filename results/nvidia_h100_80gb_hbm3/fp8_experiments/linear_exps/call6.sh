#!/bin/bash
# A/B in one call: exp2_linear's clamp as a saturating FFMA (FFMA.SAT + FFMA + LEA: two FMA-pipe
# instructions and one integer-ALU one, where FMNMX + LEA took two on the integer ALU) at
# k = 5 (build: the working tree, k = 5 at d = 64 and 128), 6 and 7 of every 8 (build_s6,
# build_s7: the same with kLinearExps = k at d <= 128), against call5's winner, the FMNMX
# clamp at k = 5 (d = 128; 4 at d = 64: build_c5, the source in .scratch/src_c5). Three passes
# of fp8_accuracy --time-only alternating, timelines, accuracy of each, and the FP8 GPU tests
# of the working tree.
cd "$(dirname "$0")/../../../.."
T0=$(date +%s)
R=$OUT/r; mkdir -p $R
trap 'cd $OUT && tar czf r.tgz r && rm -rf r' EXIT
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $OUT/run.log
for k in 6 7; do
  rm -rf /tmp/src_s$k && mkdir /tmp/src_s$k && cp -r CMakeLists.txt CMakePresets.json cmake common 0* bench tests scripts python /tmp/src_s$k/ 2>/dev/null
  sed -i "s/static constexpr int kLinearExps = D <= 128 ? 5 : 0;/static constexpr int kLinearExps = D <= 128 ? $k : 0;/" /tmp/src_s$k/06_fa3_hopper/fa3_fp8_kernel.cuh
  echo "k=$k sed: $(grep -c "D <= 128 ? $k : 0" /tmp/src_s$k/06_fa3_hopper/fa3_fp8_kernel.cuh)" >> $OUT/run.log
done
cp -r .scratch/src_c5 /tmp/src_c5
cfg() { cmake -S $1 -B $2 -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a > /dev/null; }
( cmake --preset default > /dev/null && cmake --build --preset default -j7 --target gpu_tests fp8_accuracy tile_timeline > $R/build.txt 2>&1 ) &
( cfg /tmp/src_c5 /tmp/build_c5 && cmake --build /tmp/build_c5 -j3 --target fp8_accuracy tile_timeline > $R/build_c5.txt 2>&1 ) &
for k in 6 7; do ( cfg /tmp/src_s$k /tmp/build_s$k && cmake --build /tmp/build_s$k -j3 --target fp8_accuracy > $R/build_s$k.txt 2>&1 ) & done
wait
echo "built $(( $(date +%s) - T0 )) s" >> $OUT/run.log
for pass in 1 2 3; do
  for v in build /tmp/build_c5 /tmp/build_s6 /tmp/build_s7; do
    n=$(basename $v)
    timeout 40 $v/bench/fp8_accuracy --time-only > $R/time_${n}_p$pass.txt 2>&1
    echo "pass $pass $n rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
  done
done
for v in build /tmp/build_c5; do n=$(basename $v); timeout 30 $v/bench/tile_timeline --fp8 --n 8192 > $R/tl_$n.txt 2>&1; done
for v in build /tmp/build_c5 /tmp/build_s6 /tmp/build_s7; do n=$(basename $v); timeout 60 $v/bench/fp8_accuracy > $R/accuracy_$n.txt 2>&1; echo "accuracy $n rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log; done
timeout 120 build/tests/gpu_tests --gtest_filter='*Fp8*:*fp8*:*Linear*' --gtest_brief=1 > $R/tests_fp8.txt 2>&1; echo "fp8 tests rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
grep -h "tests ran\|PASSED\|FAILED" $R/tests_fp8.txt >> $OUT/run.log
