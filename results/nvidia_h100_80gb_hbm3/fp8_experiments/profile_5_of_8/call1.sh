#!/bin/bash
# Nsight Compute on the FP8 attention kernel at d = 128, N = 8k (5 of 8 exponentials by
# exp2_linear): one launch, --set full, the per-instruction (SASS) source page and the
# details page, as profile_d128_source/ did for an earlier kernel.
cd "$(dirname "$0")/../../../.."
T0=$(date +%s)
R=$OUT/r; mkdir -p $R
trap 'cd $OUT && tar czf r.tgz r && rm -rf r' EXIT
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $OUT/run.log
cmake --preset default > /dev/null && cmake --build --preset default -j16 --target attn_bench > $R/build.txt 2>&1
echo "built rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
ATTN_NO_CUPTI=1 timeout 300 ncu --clock-control none --set full --import-source yes -k regex:fa3_fp8_forward -c 1 -o /tmp/fp8 \
  build/bench/attn_bench --rungs 06_fp8 --dtype fp8 --d 128 --n 8192 --B 1 --H 16 --causal 0 --repeats 1 --warm-seconds 0 \
  --no-ceilings > $R/ncu_run.txt 2>&1
echo "ncu rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
ncu -i /tmp/fp8.ncu-rep --page source --csv --print-source sass > $R/06_fp8_d128_n8k_source.csv 2> $R/source_err.txt && gzip $R/06_fp8_d128_n8k_source.csv
ncu -i /tmp/fp8.ncu-rep --page details > $R/06_fp8_d128_n8k_details.txt 2>&1
echo "exported $(( $(date +%s) - T0 )) s" >> $OUT/run.log
