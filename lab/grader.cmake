# The grader of one lab (LABS.md), included at the end of the top-level CMakeLists.txt in a
# lab build (cmake/lab.cmake): lab_grade runs the exercise's named checks on the student's
# rung; each check is a CTest test labelled lab<id>.
add_executable(lab_grade ${PROJECT_SOURCE_DIR}/lab/grader.cpp)
target_link_libraries(lab_grade PRIVATE attn_harness)
target_include_directories(lab_grade PRIVATE ${PROJECT_BINARY_DIR}/lab)  # lab_exercise.inc
set_target_properties(lab_grade PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/lab
                                           CUDA_RUNTIME_LIBRARY Shared)  # one CUDA runtime, attn_ladder's
foreach(rung IN LISTS ATTN_RUNGS)  # what the grader may look inside (01's workspace layout)
  string(SUBSTRING ${rung} 0 2 number)
  target_compile_definitions(lab_grade PRIVATE ATTN_HAS_RUNG_${number})
endforeach()
# A probe (lab/probes.h): device code of the graded rung, run by the grader's unit checks.
if(LAB_PROBE)
  target_sources(lab_grade PRIVATE ${PROJECT_SOURCE_DIR}/${LAB_PROBE})
  target_compile_definitions(lab_grade PRIVATE ATTN_LAB_PROBE)
  target_compile_options(lab_grade PRIVATE "$<$<COMPILE_LANGUAGE:CUDA>:${attn_cuda_flags}>")
endif()
# Rung 06 with some of its kernels left out (LAB_fa3_kernels, 06_fa3_hopper/CMakeLists.txt):
# stages.cu still registers every step; the launches of those not compiled refuse to run.
if("06_fa3_hopper" IN_LIST ATTN_RUNGS AND DEFINED LAB_fa3_kernels)
  target_sources(attn_ladder PRIVATE ${PROJECT_SOURCE_DIR}/lab/fa3_absent.cu)
  foreach(kernel IN LISTS LAB_fa3_kernels)
    set_property(SOURCE ${PROJECT_SOURCE_DIR}/lab/fa3_absent.cu APPEND PROPERTY COMPILE_DEFINITIONS
                 LAB_BUILT_${kernel})
  endforeach()
endif()

if(ATTN_BUILD_TESTS)
  foreach(check IN LISTS LAB_CHECKS)
    add_test(NAME lab${LAB_ID}.${check} COMMAND lab_grade --check ${check})
    # 77: no GPU (or too old a GPU, or no DRAM counters for the bytes check): skipped, not passed.
    set_tests_properties(lab${LAB_ID}.${check} PROPERTIES LABELS lab${LAB_ID} SKIP_RETURN_CODE 77 TIMEOUT 900)
  endforeach()
endif()
