// GoogleTest's main with one change: a run in which every selected case skipped (GTEST_SKIP,
// e.g. no GPU) exits 77, which CTest reports as skipped (cmake/gtest_suites.cmake). A run
// with a failure exits 1 and one with at least one pass exits 0, as with gtest_main.
#include <gtest/gtest.h>

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  const int result = RUN_ALL_TESTS();
  const testing::UnitTest& unit = *testing::UnitTest::GetInstance();
  const bool all_skipped = unit.test_to_run_count() > 0 && unit.skipped_test_count() == unit.test_to_run_count();
  return result == 0 && all_skipped ? 77 : result;
}
