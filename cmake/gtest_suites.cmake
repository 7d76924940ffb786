# attn_add_gtest_suites(<target> [TIMEOUT <seconds>] [RESOURCE_LOCK <name>])
#
# One CTest entry per GoogleTest suite of <target>, named <target>.<suite> and running
# `<target> --gtest_filter=<suite>.*`; the suites are listed (--gtest_list_tests) when ctest
# starts, as gtest_discover_tests(... DISCOVERY_MODE PRE_TEST) does. One process per suite
# rather than per case: every GPU test process pays for a CUDA context, and 452 of them
# would take longer than the tests. A failure names the suite; its output names the case.
#
# Skips: <target> links tests/gtest_main.cpp, which exits 77 when every case it ran skipped
# (GTEST_SKIP: no GPU), and CTest reports 77 as skipped. A suite with passes and skips
# passes; one with a failure fails. Not a SKIP_REGULAR_EXPRESSION: CTest lets a matching
# skip win over a failing exit code (a grouped suite would hide its failures), and CMake 4
# writes a bracket in the pattern as a bracket argument that closes early.
#
# RESOURCE_LOCK: CTest runs no two tests holding the same name at once (the GPU tests hold
# "gpu", so that a parallel ctest overlaps them with CPU-only tests, never with each other).
#
# tests/ctest_skip/ is a small project that uses this function on a passing, a skipping and
# a failing suite; .ci/run checks what CTest reports for each with CMake 3 and 4.
set(attn_gtest_suites_script ${CMAKE_CURRENT_LIST_DIR}/gtest_suites_add.cmake)

function(attn_add_gtest_suites target)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "TIMEOUT;RESOURCE_LOCK" "")
  if(NOT arg_TIMEOUT)
    set(arg_TIMEOUT 1500)
  endif()
  set(include_file ${CMAKE_CURRENT_BINARY_DIR}/${target}_suites.cmake)
  file(GENERATE OUTPUT ${include_file} CONTENT
"set(attn_exe [==[$<TARGET_FILE:${target}>]==])
set(attn_target [==[${target}]==])
set(attn_timeout ${arg_TIMEOUT})
set(attn_lock [==[${arg_RESOURCE_LOCK}]==])
set(attn_workdir [==[${CMAKE_CURRENT_BINARY_DIR}]==])
include([==[${attn_gtest_suites_script}]==])
")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${include_file})
endfunction()
