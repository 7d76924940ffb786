#!/bin/bash
# One call: (1) the GPU test of exp2_linear (device bit for bit against the host); (2) two
# microbenchmarks: MUFU.EX2.F16 and F2FP from f16x2 (conversion_pipe/pipe.cu), and the FP8
# softmax beside QGMMA with f16 instead of f32 accumulators (softmax_beside_gemm/); (3) more
# of the d = 128 exponentials on the integer ALU: k = 5 and 6 of every 8 (build_k: the
# committed source with kLinearExps = k at d = 128) against the committed 4, three passes of
# fp8_accuracy --time-only alternating, and each one's accuracy.
cd "$(dirname "$0")/../../../.."
T0=$(date +%s)
R=$OUT/r; mkdir -p $R
trap 'cd $OUT && tar czf r.tgz r && rm -rf r' EXIT
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $OUT/run.log
for k in 5 6; do
  rm -rf /tmp/src_$k && mkdir /tmp/src_$k && cp -r CMakeLists.txt CMakePresets.json cmake common 0* bench tests scripts python /tmp/src_$k/ 2>/dev/null
  sed -i "s/static constexpr int kLinearExps = D <= 128 ? 4 : 0;/static constexpr int kLinearExps = D == 128 ? $k : (D < 128 ? 4 : 0);/" /tmp/src_$k/06_fa3_hopper/fa3_fp8_kernel.cuh
  echo "k=$k sed: $(grep -c "D == 128 ? $k" /tmp/src_$k/06_fa3_hopper/fa3_fp8_kernel.cuh)" >> $OUT/run.log
done
X=results/nvidia_h100_80gb_hbm3/fp8_experiments
NV="nvcc -gencode arch=compute_90a,code=sm_90a -O3 -std=c++17 --expt-relaxed-constexpr -I. -Ibuild/generated"
( cmake --preset default > /dev/null && cmake --build --preset default -j8 --target gpu_tests fp8_accuracy > $R/build.txt 2>&1 \
  && $NV $X/softmax_beside_gemm/softmax_beside_gemm.cu -o /tmp/sbg > $R/build_sbg.txt 2>&1 ) &
for k in 5 6; do
  ( cmake -S /tmp/src_$k -B /tmp/build_$k -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a > /dev/null \
    && cmake --build /tmp/build_$k -j4 --target fp8_accuracy > $R/build_$k.txt 2>&1 ) &
done
nvcc -gencode arch=compute_90a,code=sm_90a -O3 -std=c++17 $X/conversion_pipe/pipe.cu -o /tmp/pipe > $R/build_pipe.txt 2>&1
wait
echo "built $(( $(date +%s) - T0 )) s" >> $OUT/run.log
timeout 60 build/tests/gpu_tests --gtest_filter='*Linear*:*Exp2*' > $R/tests_linear.txt 2>&1; echo "linear test rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
timeout 30 /tmp/pipe > $R/pipe.txt 2>&1; echo "pipe rc=$?" >> $OUT/run.log
for n in 0 192 1192 -192 -1192; do timeout 20 /tmp/sbg $n >> $R/sbg.txt 2>&1; done; echo "sbg $(( $(date +%s) - T0 )) s" >> $OUT/run.log
for pass in 1 2 3; do
  for v in build /tmp/build_5 /tmp/build_6; do
    n=$(basename $v)
    timeout 40 $v/bench/fp8_accuracy --time-only > $R/time_${n}_p$pass.txt 2>&1
    echo "pass $pass $n rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
  done
done
for v in build /tmp/build_5 /tmp/build_6; do n=$(basename $v); timeout 60 $v/bench/fp8_accuracy > $R/accuracy_$n.txt 2>&1; echo "accuracy $n rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log; done
grep -h "tests ran\|PASSED\|FAILED" $R/tests_linear.txt >> $OUT/run.log
