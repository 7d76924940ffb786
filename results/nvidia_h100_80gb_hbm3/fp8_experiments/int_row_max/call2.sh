#!/bin/bash
# A/B/C: committed (build), integer row max (build_im), integer row max after the P V's wait (build_imw).
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/run.log
T="gpu_tests fp8_accuracy attn_bench tile_timeline"
cfg() { cmake -S . -B $1 -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a "-DCMAKE_CUDA_FLAGS=$2" > /dev/null && cmake --build $1 -j6 --target $T > $OUT/$1.txt 2>&1; }
cfg build "" & cfg build_im "-DATTN_INT_ROWMAX" & cfg build_imw "-DATTN_INT_ROWMAX -DATTN_PV_WAIT_FIRST" & wait
echo "built $(date +%T)" >> $OUT/run.log
mkdir -p $OUT/t
for pass in 1 2; do
  for v in build build_im build_imw; do
    $v/bench/fp8_accuracy --time-only > $OUT/t/fp8_${v}_p$pass.txt 2>&1
    echo "$v $pass: $(grep 06_fp8 $OUT/t/fp8_${v}_p$pass.txt | awk '{printf "%s/%s %s  ", $3, $2, $8}')" >> $OUT/run.log
  done
  for v in build build_imw; do
    $v/bench/attn_bench --paper-sweep --n 8192,16384 --d 64,128 --causal 0 --rungs 06d_fa3 --dtype bf16 --csv $OUT/t/06d_${v}_p$pass.csv > /dev/null 2>&1
    echo "06d $v $pass: $(tail -n +2 $OUT/t/06d_${v}_p$pass.csv | awk -F, '{printf "%s/%s %.1f  ", $9, $7, $14}')" >> $OUT/run.log
  done
done
for v in build build_im build_imw; do $v/bench/tile_timeline --fp8 --n 8192 > $OUT/t/tl_$v.txt 2>&1; echo "tl $v: $(grep 'each of blocks' $OUT/t/tl_$v.txt)" >> $OUT/run.log; done
timeout 200 build_imw/tests/gpu_tests --gtest_brief=1 --gtest_filter='*fp8*:*Fp8*:*Negative*:*Climbing*:*Jumping*' > $OUT/t/tests_imw.txt 2>&1; echo "tests_imw rc=$? $(tail -1 $OUT/t/tests_imw.txt) $(date +%T)" >> $OUT/run.log
cd $OUT && tar czf t.tgz t && rm -rf t
