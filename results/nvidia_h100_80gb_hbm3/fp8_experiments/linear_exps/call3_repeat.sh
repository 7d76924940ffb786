#!/bin/bash
# H200: the FP8 rows of reproduce.sh only (fp8_accuracy --time, the FP8 sweep).
T0=$(date +%s)
R=$OUT/r; mkdir -p $R
trap 'cd $OUT && tar czf r.tgz r && rm -rf r' EXIT
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $OUT/run.log
cmake --preset default > /dev/null && cmake --build --preset default -j16 --target fp8_accuracy attn_bench > $R/build.txt 2>&1
echo "built rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
timeout 60 build/bench/fp8_accuracy --time --csv $R/fp8_accuracy.csv > $R/fp8_accuracy.log 2>&1; echo "fp8_accuracy rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
timeout 150 build/bench/attn_bench --paper-sweep --rungs 06d_fa3,06_fp8 --dtype bf16,fp8 --d 64,128,256 --causal 0 --check \
  --csv $R/fp8_speed.csv > $R/fp8_speed.log 2>&1; echo "fp8 sweep rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
