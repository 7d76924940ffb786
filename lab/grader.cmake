# The grader of one lab (LABS.md), included at the end of the top-level CMakeLists.txt in a
# lab build (cmake/lab.cmake): lab_grade runs the exercise's named checks on the student's
# rung; each check is a CTest test labelled lab<id>.
add_executable(lab_grade ${PROJECT_SOURCE_DIR}/lab/grader.cpp)
target_link_libraries(lab_grade PRIVATE attn_harness)
target_include_directories(lab_grade PRIVATE ${PROJECT_BINARY_DIR}/lab)  # lab_exercise.inc
set_target_properties(lab_grade PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/lab)
foreach(rung IN LISTS ATTN_RUNGS)  # what the grader may look inside (01's workspace layout)
  string(SUBSTRING ${rung} 0 2 number)
  target_compile_definitions(lab_grade PRIVATE ATTN_HAS_RUNG_${number})
endforeach()

if(ATTN_BUILD_TESTS)
  foreach(check IN LISTS LAB_CHECKS)
    add_test(NAME lab${LAB_ID}.${check} COMMAND lab_grade --check ${check})
    # 77: no GPU (or too old a GPU, or no DRAM counters for the bytes check): skipped, not passed.
    set_tests_properties(lab${LAB_ID}.${check} PROPERTIES LABELS lab${LAB_ID} SKIP_RETURN_CODE 77 TIMEOUT 900)
  endforeach()
endif()
