#!/bin/bash
# The byte exponentials on a third machine: passes of fp8_accuracy --time-only alternating
# with the previous kernel (old5, call1's library), then Nsight Compute on the d = 128 kernel
# at N = 8k (one launch, --set full, as profile_5_of_8/ did for the previous kernel).
cd "$(dirname "$0")/../../../.."
T0=$(date +%s)
R=$OUT/r; mkdir -p $R
trap 'cd $OUT && tar czf r.tgz r && rm -rf r' EXIT
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $OUT/run.log
mkdir -p /tmp/v/old5 /tmp/v/new && xz -dc .scratch/variants/old5.so.xz > /tmp/v/old5/libattn_ladder.so
cmake --preset default > /dev/null && cmake --build --preset default -j16 --target fp8_accuracy attn_bench > $R/build.txt 2>&1
echo "built rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
cp build/libattn_ladder.so /tmp/v/new/
for pass in 1 2 3 4; do
  for n in old5 new; do
    LD_LIBRARY_PATH=/tmp/v/$n timeout 30 build/bench/fp8_accuracy --time-only > $R/time_${n}_p$pass.txt 2>&1
    echo "pass $pass $n rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
  done
done
ATTN_NO_CUPTI=1 timeout 200 ncu --clock-control none --set full --import-source yes -k regex:fa3_fp8_forward -c 1 -o /tmp/fp8 \
  build/bench/attn_bench --rungs 06_fp8 --dtype fp8 --d 128 --n 8192 --B 1 --H 16 --causal 0 --repeats 1 --warm-seconds 0 \
  --no-ceilings > $R/ncu_run.txt 2>&1
echo "ncu rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
ncu -i /tmp/fp8.ncu-rep --page source --csv --print-source sass > $R/06_fp8_d128_n8k_source.csv 2> $R/source_err.txt && gzip $R/06_fp8_d128_n8k_source.csv
ncu -i /tmp/fp8.ncu-rep --page details > $R/06_fp8_d128_n8k_details.txt 2>&1
echo "exported $(( $(date +%s) - T0 )) s" >> $OUT/run.log
