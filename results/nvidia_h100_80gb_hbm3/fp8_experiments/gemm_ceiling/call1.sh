#!/bin/bash
# The board's bf16 and e4m3 GEMM rates (gemm_ceiling.py) with nvidia-smi samples of the SM
# clock, power and throttle reasons beside them, twice, and in the same call two passes of
# fp8_accuracy --time-only (the FP8 attention kernel alone and 06d), so that the attention
# ratios and the GEMM ratio come from one machine.
cd "$(dirname "$0")/../../../.."
T0=$(date +%s)
R=$OUT/r; mkdir -p $R
trap 'cd $OUT && tar czf r.tgz r && rm -rf r' EXIT
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $OUT/run.log
( cmake --preset default > /dev/null && cmake --build --preset default -j14 --target fp8_accuracy > $R/build.txt 2>&1 ) &
G=results/nvidia_h100_80gb_hbm3/fp8_experiments/gemm_ceiling
sample() { nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_throttle_reasons.active --format=csv,noheader -lms 50 > $R/clocks_$1.csv & SMI=$!; }
for run in 1 2; do
  sample gemm_$run; timeout 120 python3 $G/gemm_ceiling.py > $R/gemm_$run.txt 2>&1; echo "gemm $run rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log; kill $SMI
  cat $R/gemm_$run.txt >> $OUT/run.log
done
wait
echo "built $(( $(date +%s) - T0 )) s" >> $OUT/run.log
for pass in 1 2; do
  sample attn_$pass; timeout 40 build/bench/fp8_accuracy --time-only > $R/time_p$pass.txt 2>&1; echo "attn $pass rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log; kill $SMI
  grep "^06_fp8" $R/time_p$pass.txt >> $OUT/run.log
done
sample gemm_3; timeout 120 python3 $G/gemm_ceiling.py > $R/gemm_3.txt 2>&1; echo "gemm 3 rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log; kill $SMI
cat $R/gemm_3.txt >> $OUT/run.log
