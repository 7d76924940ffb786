#!/bin/bash
# A/B/C: V's scale ratio by IEEE division in rescale (shipped, div0), __fdividef (div1), IEEE division at the block's start behind a scheduling fence (div2).
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/run.log
T="gpu_tests fp8_accuracy tile_timeline"
cfg() { cmake -S . -B $1 -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a "-DCMAKE_CUDA_FLAGS=$2" > /dev/null && cmake --build $1 -j6 --target $T > $OUT/$1.txt 2>&1; }
cfg build_div0 "" & cfg build_div1 "-DFP8_X_DIV=1" & cfg build_div2 "-DFP8_X_DIV=2" & wait
echo "built $(date +%T)" >> $OUT/run.log
mkdir -p $OUT/t
for pass in 1 2 3; do
  for v in build_div0 build_div1 build_div2; do
    $v/bench/fp8_accuracy --time-only > $OUT/t/fp8_${v}_p$pass.txt 2>&1
    echo "$v $pass: $(grep 06_fp8 $OUT/t/fp8_${v}_p$pass.txt | awk '{printf "%s/%s %s  ", $3, $2, $8}')" >> $OUT/run.log
  done
done
for v in build_div0 build_div1 build_div2; do $v/bench/tile_timeline --fp8 --n 8192 > $OUT/t/tl_$v.txt 2>&1; echo "tl $v: $(grep 'each of blocks' $OUT/t/tl_$v.txt)" >> $OUT/run.log; done
for v in build_div1 build_div2; do timeout 100 $v/tests/gpu_tests --gtest_brief=1 --gtest_filter='*fp8*:*Fp8*:*Negative*' > $OUT/t/tests_$v.txt 2>&1; echo "tests $v rc=$? $(tail -1 $OUT/t/tests_$v.txt) $(date +%T)" >> $OUT/run.log; done
cd $OUT && tar czf t.tgz t && rm -rf t
