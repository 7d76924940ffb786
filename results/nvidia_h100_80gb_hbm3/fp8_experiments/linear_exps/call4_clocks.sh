#!/bin/bash
# The SM clock and board power of 06d (bf16) and the FP8 kernel each alone, d = 128,
# non-causal, one call: tile_timeline (cycles and microseconds of the same tiles) and
# attn_bench rows with nvidia-smi sampling every 20 ms beside each.
cd "$(dirname "$0")/../../../.."
T0=$(date +%s)
R=$OUT/r; mkdir -p $R
trap 'cd $OUT && tar czf r.tgz r && rm -rf r' EXIT
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $OUT/run.log
cmake --preset default > /dev/null && cmake --build --preset default -j16 --target tile_timeline attn_bench > $R/build.txt 2>&1
echo "built rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
sample() { nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_throttle_reasons.active --format=csv,noheader -lms 20 > $R/clocks_$1.csv & SMI=$!; }
for n in 8192 16384; do
  sample tl_06d_$n; timeout 30 build/bench/tile_timeline --n $n > $R/tl_06d_$n.txt 2>&1; kill $SMI
  sample tl_fp8_$n; timeout 30 build/bench/tile_timeline --fp8 --n $n > $R/tl_fp8_$n.txt 2>&1; kill $SMI
  sample bench_06d_$n; timeout 30 build/bench/attn_bench --rungs 06d_fa3 --dtype bf16 --d 128 --n $n --B $((16384 / n)) --H 16 --causal 0 --warm-seconds 1 --repeats 50 --no-ceilings > $R/bench_06d_$n.txt 2>&1; kill $SMI
  sample bench_fp8_$n; timeout 30 build/bench/attn_bench --rungs 06_fp8 --dtype fp8 --d 128 --n $n --B $((16384 / n)) --H 16 --causal 0 --warm-seconds 1 --repeats 50 --no-ceilings > $R/bench_fp8_$n.txt 2>&1; kill $SMI
  echo "n=$n $(( $(date +%s) - T0 )) s" >> $OUT/run.log
done
