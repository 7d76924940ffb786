#!/bin/bash
# exp2_e4m3_linear (2^x straight to P's e4m3 byte by one FFMA and a clamp) against the
# shipped exp2_linear (a float, then F2FP), in one device call: the build of this tree and
# its tests, then the libraries of the variants (built on the workstation from the same tree
# with one macro changed, .scratch/variants/NAME.so.xz, run through LD_LIBRARY_PATH ahead of
# the binaries' RUNPATH): old5 = exp2_linear, 5 of 8 (-DATTN_FP8_LINEAR_E4M3=0); newK =
# exp2_e4m3_linear, K of 8 (-DATTN_FP8_LINEAR_EXPS=K). The accuracy table of each, then
# passes of fp8_accuracy --time-only, alternating.
cd "$(dirname "$0")/../../../.."
T0=$(date +%s)
R=$OUT/r; mkdir -p $R
trap 'cd $OUT && tar czf r.tgz r && rm -rf r' EXIT
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $OUT/run.log
names=""
for f in .scratch/variants/*.so.xz; do
  n=$(basename $f .so.xz); names="$names $n"
  mkdir -p /tmp/v/$n && xz -dc $f > /tmp/v/$n/libattn_ladder.so
done
cmake --preset default > /dev/null && cmake --build --preset default -j16 > $R/build.txt 2>&1
echo "built rc=$? $(( $(date +%s) - T0 )) s; variants:$names" >> $OUT/run.log
mkdir -p /tmp/v/dev5 && cp build/libattn_ladder.so /tmp/v/dev5/  # this tree, built here
build/tests/cpu_tests --gtest_brief=1 > $R/cpu_tests.txt 2>&1; echo "cpu_tests rc=$?" >> $OUT/run.log
timeout 240 build/tests/gpu_tests --gtest_brief=1 > $R/gpu_tests.txt 2>&1
echo "gpu_tests rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
grep -h "PASSED\|FAILED" $R/cpu_tests.txt $R/gpu_tests.txt >> $OUT/run.log
timeout 20 build/bench/tile_timeline --fp8 --n 8192 > $R/tl_dev5_8192.txt 2>&1
for n in old5 new5 new6 new8; do
  LD_LIBRARY_PATH=/tmp/v/$n timeout 40 build/bench/fp8_accuracy > $R/acc_$n.txt 2>&1
  echo "accuracy $n rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
done
for pass in 1 2 3 4; do
  for n in old5 new5 new6 new8 dev5; do
    [ $(( $(date +%s) - T0 )) -gt 540 ] && break 2
    LD_LIBRARY_PATH=/tmp/v/$n timeout 40 build/bench/fp8_accuracy --time-only > $R/time_${n}_p$pass.txt 2>&1
    echo "pass $pass $n rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
  done
done
