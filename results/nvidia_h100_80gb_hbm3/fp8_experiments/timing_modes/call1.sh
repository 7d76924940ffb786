#!/bin/bash
# Why N = 8k reads lower than 16k for the FP8 kernel (and not for 06d): fp8_accuracy
# --time-only in the protocol's flushed mode and back to back (no flush, no idle between
# runs), alternating, two passes each, with nvidia-smi samples of the SM clock and power.
cd "$(dirname "$0")/../../../.."
T0=$(date +%s)
R=$OUT/r; mkdir -p $R
trap 'cd $OUT && tar czf r.tgz r && rm -rf r' EXIT
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $OUT/run.log
cmake --preset default > /dev/null && cmake --build --preset default -j16 --target fp8_accuracy > $R/build.txt 2>&1
echo "built rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
sample() { nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_throttle_reasons.active --format=csv,noheader -lms 20 > $R/clocks_$1.csv & SMI=$!; }
for pass in 1 2; do
  for mode in flushed back-to-back; do
    sample ${mode}_p$pass; timeout 60 build/bench/fp8_accuracy --time-only --timing $mode > $R/time_${mode}_p$pass.txt 2>&1; rc=$?; kill $SMI
    echo "pass $pass $mode rc=$rc $(( $(date +%s) - T0 )) s" >> $OUT/run.log
    grep "^06_fp8" $R/time_${mode}_p$pass.txt >> $OUT/run.log
  done
done
