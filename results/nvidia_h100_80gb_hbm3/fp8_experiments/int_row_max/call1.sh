#!/bin/bash
# A/B: committed row max (build) vs integer three-input row max (build_im), one call.
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $OUT/run.log
T="gpu_tests fp8_accuracy attn_bench tile_timeline"
( cmake --preset default > /dev/null && cmake --build build -j8 --target $T > $OUT/build_base.txt 2>&1 ) &
( cmake -S . -B build_im -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_CUDA_FLAGS=-DATTN_INT_ROWMAX > /dev/null && cmake --build build_im -j8 --target $T > $OUT/build_im.txt 2>&1 ) &
wait
echo "built $(date +%T)" >> $OUT/run.log
mkdir -p $OUT/t
for pass in 1 2; do
  for v in build build_im; do
    n=${v#build}; n=${n:-_base}
    $v/bench/fp8_accuracy --time-only > $OUT/t/fp8${n}_p$pass.txt 2>&1
    $v/bench/attn_bench --paper-sweep --n 8192,16384 --d 64,128,256 --causal 0 --rungs 06d_fa3 --dtype bf16 --csv $OUT/t/06d${n}_p$pass.csv > $OUT/t/06d${n}_p$pass.txt 2>&1
    echo "pass $pass $v $(date +%T)" >> $OUT/run.log
  done
done
for v in build build_im; do n=${v#build}; n=${n:-_base}; $v/bench/tile_timeline --fp8 --n 8192 > $OUT/t/tl${n}.txt 2>&1; done
echo "timed $(date +%T)" >> $OUT/run.log
timeout 240 build_im/tests/gpu_tests --gtest_brief=1 > $OUT/t/tests_im.txt 2>&1; echo "tests_im rc=$? $(date +%T)" >> $OUT/run.log
timeout 60 build/tests/gpu_tests --gtest_brief=1 --gtest_filter='*NegativeScores*' > $OUT/t/tests_base_neg.txt 2>&1; echo "tests_base_neg rc=$? $(date +%T)" >> $OUT/run.log
cd $OUT && tar czf t.tgz t && rm -rf t
