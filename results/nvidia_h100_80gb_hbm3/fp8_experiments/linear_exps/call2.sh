#!/bin/bash
# The kept kernel (exp2_linear for 4 of every 8 exponentials at d <= 128) in one call: the
# build, the FP8 timings with the SM clock and power sampled beside the committed kernel's
# (build_0: the same source with kLinearExps = 0), the FP8 sweep of reproduce.sh, the
# timeline, then the tests and the sanitizers (reproduce.sh --tests).
cd "$(dirname "$0")/../../../.."
T0=$(date +%s)
R=$OUT/r; mkdir -p $R
trap 'cd $OUT && tar czf r.tgz r && rm -rf r' EXIT
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $OUT/run.log
rm -rf /tmp/base && mkdir /tmp/base && cp -r CMakeLists.txt CMakePresets.json cmake common 0* bench tests scripts python /tmp/base/ 2>/dev/null
sed -i 's/static constexpr int kLinearExps = D <= 128 ? 4 : 0;/static constexpr int kLinearExps = 0;/' /tmp/base/06_fa3_hopper/fa3_fp8_kernel.cuh
grep -c "kLinearExps = 0;" /tmp/base/06_fa3_hopper/fa3_fp8_kernel.cuh >> $OUT/run.log
( cmake --preset default > /dev/null && cmake --build --preset default -j10 > $R/build.txt 2>&1 ) &
( cmake -S /tmp/base -B /tmp/build_0 -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a > /dev/null && cmake --build /tmp/build_0 -j6 --target fp8_accuracy > $R/build_0.txt 2>&1 ) &
wait
echo "built $(( $(date +%s) - T0 )) s" >> $OUT/run.log
sample() { nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_throttle_reasons.active --format=csv,noheader -lms 50 > $R/clocks_$1.csv & SMI=$!; }
for pass in 1 2 3; do
  for v in build_0 build; do
    b=$v; [ $v = build_0 ] && b=/tmp/build_0
    sample ${v}_p$pass; timeout 40 $b/bench/fp8_accuracy --time-only > $R/time_${v}_p$pass.txt 2>&1; rc=$?; kill $SMI
    echo "pass $pass $v rc=$rc $(( $(date +%s) - T0 )) s" >> $OUT/run.log
  done
done
timeout 30 build/bench/tile_timeline --fp8 --n 8192 > $R/tl_fp8_8192.txt 2>&1
timeout 60 build/bench/fp8_accuracy --time --csv $R/fp8_accuracy.csv > $R/fp8_accuracy.log 2>&1; echo "fp8_accuracy rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
timeout 150 build/bench/attn_bench --paper-sweep --rungs 06d_fa3,06_fp8 --dtype bf16,fp8 --d 64,128,256 --causal 0 --check \
  --csv $R/fp8_speed.csv > $R/fp8_speed.log 2>&1; echo "fp8 sweep rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
left=$(( 575 - ($(date +%s) - T0) ))
TESTS_ONLY=1 SANITIZE_TIMEOUT=120 timeout $left scripts/reproduce.sh --tests --out $R > $R/reproduce_tests.txt 2>&1; echo "tests rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
grep -h "tests ran\|PASSED\|FAILED\|ERROR SUMMARY\|RACECHECK SUMMARY" $R/tests.log $R/sanitize_*.log >> $OUT/run.log
