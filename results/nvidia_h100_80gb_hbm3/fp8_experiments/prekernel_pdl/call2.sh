#!/bin/bash
# The tests of the tree with the pre-kernel's launches beside each other (8bd841f): every GPU
# test, then racecheck and synccheck on the Sanitize tests (call1 ran memcheck).
cd "$(dirname "$0")/../../../.."
T0=$(date +%s)
R=$OUT/r; mkdir -p $R
trap 'cd $OUT && tar czf r.tgz r && rm -rf r' EXIT
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/run.log
cmake --preset default > /dev/null && cmake --build --preset default -j16 > $R/build.txt 2>&1
echo "built rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
timeout 110 build/tests/gpu_tests --gtest_brief=1 > $R/gpu_tests.txt 2>&1
echo "gpu tests rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
tail -2 $R/gpu_tests.txt >> $OUT/run.log
for tool in racecheck synccheck; do
  timeout 45 compute-sanitizer --tool $tool build/tests/gpu_tests --gtest_brief=1 --gtest_filter='*Sanitize*' > $R/$tool.txt 2>&1
  echo "$tool rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/run.log
  grep -h "PASSED\|FAILED\|SUMMARY" $R/$tool.txt >> $OUT/run.log
done
