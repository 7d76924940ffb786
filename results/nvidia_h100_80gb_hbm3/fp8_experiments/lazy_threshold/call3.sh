#!/bin/bash
# A/B 3 in one call. build (default) = the candidate: FP8 d = 128 lazy rescaling + P's bytes by
# way of fp16. build_e = eager + cvt e4m3 (= committed kernel), build_ef = eager + fp16 bytes,
# build_l = lazy + cvt e4m3. Two timing passes, accuracy, then reproduce.sh --tests on build.
cd "$(dirname "$0")/.."
T0=$(date +%s)
R=$OUT/r; mkdir -p $R
trap 'cd $OUT && tar czf r.tgz r && rm -rf r' EXIT
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $OUT/run.log
cfg() { cmake -S . -B $1 -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a "-DCMAKE_CUDA_FLAGS=$2" > /dev/null; }
( cmake --preset default > /dev/null && cmake --build --preset default -j8 > $R/build.txt 2>&1 ) &
( cfg build_e "-DATTN_FP8_EAGER -DATTN_NO_CVT_F16" && cmake --build build_e -j3 --target fp8_accuracy > $R/build_e.txt 2>&1 ) &
( cfg build_ef -DATTN_FP8_EAGER && cmake --build build_ef -j3 --target fp8_accuracy > $R/build_ef.txt 2>&1 ) &
( cfg build_l -DATTN_NO_CVT_F16 && cmake --build build_l -j3 --target fp8_accuracy > $R/build_l.txt 2>&1 ) &
wait
echo "built $(( $(date +%s) - T0 )) s" >> $OUT/run.log
for pass in 1 2; do
  for v in build_e build build_ef build_l; do
    timeout 40 $v/bench/fp8_accuracy --time-only > $R/time_${v}_p$pass.txt 2>&1
    echo "pass $pass $v rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
  done
done
timeout 60 build/bench/fp8_accuracy --csv $R/fp8_accuracy.csv > $R/accuracy.txt 2>&1; echo "accuracy rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
left=$(( 470 - ($(date +%s) - T0) ))
TESTS_ONLY=1 timeout $left scripts/reproduce.sh --tests --out $R > $R/reproduce_tests.txt 2>&1; echo "tests rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
grep -h "tests ran\|PASSED\|FAILED\|ERROR SUMMARY\|RACECHECK SUMMARY" $R/*.log >> $OUT/run.log
