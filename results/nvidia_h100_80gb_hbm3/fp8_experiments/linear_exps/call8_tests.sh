#!/bin/bash
# The GPU and CPU tests on the session's last commit (d248ae5: after fp8_accuracy --timing and
# parse_timing_mode), one call on an H100: 162 GPU and 34 CPU tests passed.
cd "$(dirname "$0")/../../../.."
mkdir -p $OUT
cmake --preset default > /dev/null && cmake --build --preset default -j16 --target gpu_tests cpu_tests > $OUT/build.txt 2>&1
timeout 200 build/tests/gpu_tests --gtest_brief=1 > $OUT/gpu_tests.txt 2>&1
build/tests/cpu_tests --gtest_brief=1 > $OUT/cpu_tests.txt 2>&1
