# The labs in the normal build's tests (LABS.md, "CI"); tests/CMakeLists.txt includes this file.
# lab_verify: the LAB markers balanced, named and declared in lab/exercises.json. lab_audit:
# every exercise's student copy made (seconds, no compiler) and searched for its regions'
# answers (their "forbidden" expressions) in the stubs, in the comments left in the region
# files, in EXERCISE.md and in the copy's table, and its lessons' file:line links checked
# against the reference (the stubs keep every line number). lab_stubs:
# every exercise's student copy made, configured and built (CPU only, each build compiles only
# its lab's rungs), and its grader must report "skipped" where there is no GPU; where a GPU is
# found it skips, since that is the one thing it tests (scripts/lab.py selftest grades there).
find_package(Python3 COMPONENTS Interpreter)
if(Python3_FOUND)
  add_test(NAME lab_verify COMMAND Python3::Interpreter ${PROJECT_SOURCE_DIR}/scripts/lab.py verify)
  add_test(NAME lab_audit COMMAND Python3::Interpreter ${PROJECT_SOURCE_DIR}/scripts/lab.py audit)
  string(REPLACE ";" "," lab_ci_arch "${CMAKE_CUDA_ARCHITECTURES}")
  add_test(NAME lab_stubs COMMAND Python3::Interpreter ${PROJECT_SOURCE_DIR}/scripts/lab.py ci --skip-with-gpu
                                  --work ${PROJECT_BINARY_DIR}/lab-ci --arch ${lab_ci_arch})
  set_tests_properties(lab_verify lab_audit lab_stubs PROPERTIES LABELS lab RESOURCE_LOCK lab)  # one work folder
  # On a GPU machine lab_stubs skips (scripts/lab.py selftest builds and grades there).
  set_tests_properties(lab_stubs PROPERTIES TIMEOUT 1800 SKIP_RETURN_CODE 77)
endif()
