#!/bin/bash
# The pre-kernel's K and V launches beside the tensor before them (programmatic dependent
# launch: griddepcontrol in quantize_rows, cudaLaunchKernelEx with programmatic stream
# serialization), against the same tree without it (base: the library of aeba0e5, built on
# the workstation, .scratch/variants/base.so.xz, run through LD_LIBRARY_PATH). The build, the
# FP8 GPU tests and memcheck on the Sanitize tests, then passes of fp8_accuracy
# --time-only alternating (quant ms: the pre-kernel's three launches).
cd "$(dirname "$0")/../../../.."
T0=$(date +%s)
R=$OUT/r; mkdir -p $R
trap 'cd $OUT && tar czf r.tgz r && rm -rf r' EXIT
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $OUT/run.log
mkdir -p /tmp/v/base /tmp/v/pdl && xz -dc .scratch/variants/base.so.xz > /tmp/v/base/libattn_ladder.so
cmake --preset default > /dev/null && cmake --build --preset default -j16 > $R/build.txt 2>&1
echo "built rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
cp build/libattn_ladder.so /tmp/v/pdl/
timeout 120 build/tests/gpu_tests --gtest_brief=1 --gtest_filter='*fp8*:*Fp8*' > $R/gpu_tests_fp8.txt 2>&1
echo "fp8 gpu tests rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
tail -3 $R/gpu_tests_fp8.txt >> $OUT/run.log
timeout 100 compute-sanitizer --tool memcheck build/tests/gpu_tests --gtest_brief=1 --gtest_filter='*Sanitize*' > $R/memcheck_fp8.txt 2>&1
echo "memcheck rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
grep -h "PASSED\|FAILED\|ERROR SUMMARY" $R/memcheck_fp8.txt >> $OUT/run.log
for pass in 1 2 3 4; do
  for n in base pdl; do
    [ $(( $(date +%s) - T0 )) -gt 300 ] && break 2
    LD_LIBRARY_PATH=/tmp/v/$n timeout 30 build/bench/fp8_accuracy --time-only > $R/time_${n}_p$pass.txt 2>&1
    echo "pass $pass $n rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
  done
done
