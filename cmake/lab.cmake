# A lab build: cmake -DATTN_LAB=<exercise> (LABS.md; scripts/lab.py list names them). Builds
# only the rungs the exercise needs (its own, the rung below as the chain's prev, and what
# they include), the harness, attn_bench and the exercise's grader, whose checks are CTest
# tests labelled lab<exercise>: ctest -L lab04. Included by the top-level CMakeLists.txt.
#
# The exercises are declared once, in lab/exercises.json; scripts/lab.py config turns the
# chosen one into what this build needs (lab_config.cmake, lab_exercise.inc).
find_package(Python3 REQUIRED COMPONENTS Interpreter)
set(lab_binary_dir ${PROJECT_BINARY_DIR}/lab)
execute_process(COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/scripts/lab.py config ${ATTN_LAB}
                        --out ${lab_binary_dir}
                RESULT_VARIABLE lab_config_rc ERROR_VARIABLE lab_config_error)
if(NOT lab_config_rc EQUAL 0)
  message(FATAL_ERROR "ATTN_LAB=${ATTN_LAB}: ${lab_config_error}")
endif()
include(${lab_binary_dir}/lab_config.cmake)  # LAB_ID, LAB_STAGE, LAB_RUNGS, LAB_CHECKS, LAB_PROBE
# and LAB_<list> for each list of kernels the exercise replaces (its "build" entry), which
# the rungs' CMakeLists.txt read: 05_fa2_reordered, 06_fa3_hopper.
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS
             ${PROJECT_SOURCE_DIR}/lab/exercises.json ${PROJECT_SOURCE_DIR}/scripts/lab.py)

set(ATTN_RUNGS ${LAB_RUNGS})
set(attn_werror "")  # a student's spill is a warning (-Xptxas=-warn-spills), not a failed build
message(STATUS "lab ${LAB_ID}: builds ${ATTN_RUNGS}; grade with ctest -L lab${LAB_ID} or scripts/lab.py check ${LAB_ID}")

# The grader and its tests, once the top level has defined the libraries and enabled testing.
cmake_language(DEFER CALL include ${PROJECT_SOURCE_DIR}/lab/grader.cmake)
