# Run by ctest (through the include file attn_add_gtest_suites() writes): adds one test per
# GoogleTest suite of ${attn_exe}. Inputs: attn_exe, attn_target, attn_timeout, attn_workdir,
# attn_lock (a RESOURCE_LOCK name, or empty).
if(NOT EXISTS "${attn_exe}")
  # Not built: one test that fails and says so, rather than no tests at all.
  add_test("${attn_target}_NOT_BUILT" "${attn_target}_NOT_BUILT")
  return()
endif()
execute_process(COMMAND "${attn_exe}" --gtest_list_tests
                WORKING_DIRECTORY "${attn_workdir}"
                OUTPUT_VARIABLE listing ERROR_VARIABLE errors RESULT_VARIABLE result)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "${attn_exe} --gtest_list_tests failed (${result}):\n${listing}${errors}")
endif()
# A suite's line starts in column 0: its name and '.' ("Suite." or "Instance/Suite."), maybe
# "  # TypeParam = ..."; its cases follow, indented. Brackets, ';' and '\' (in the cases'
# parameter comments) are replaced first, so that every line is one element of the CMake list.
string(REGEX REPLACE "[][;]" "_" listing "${listing}")
string(REPLACE "\\" "_" listing "${listing}")
string(REPLACE "\n" ";" lines "${listing}")
set(suites "")
foreach(line IN LISTS lines)
  if(line MATCHES "^([A-Za-z0-9_/]+)\\.( .*)?$")
    set(suite "${CMAKE_MATCH_1}")
    list(APPEND suites "${suite}")
    add_test("${attn_target}.${suite}" "${attn_exe}" "--gtest_filter=${suite}.*")
    set_tests_properties("${attn_target}.${suite}" PROPERTIES
                         SKIP_RETURN_CODE 77 TIMEOUT ${attn_timeout} WORKING_DIRECTORY "${attn_workdir}")
    if(attn_lock)
      set_tests_properties("${attn_target}.${suite}" PROPERTIES RESOURCE_LOCK "${attn_lock}")
    endif()
  endif()
endforeach()
if(NOT suites)
  message(FATAL_ERROR "${attn_exe} --gtest_list_tests listed no suite:\n${listing}")
endif()
