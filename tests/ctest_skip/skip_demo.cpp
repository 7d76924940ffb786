// One suite per outcome CTest must report (check.sh lists them): a skip must read as
// skipped, and a skip must not hide a failure in the same process.
#include <gtest/gtest.h>

#include <string>

TEST(Passes, One) { EXPECT_EQ(1 + 1, 2); }

TEST(Skips, All) { GTEST_SKIP() << "as a GPU test skips without a GPU"; }
TEST(Skips, AllAgain) { GTEST_SKIP() << "as a GPU test skips without a GPU"; }

TEST(PassesAndSkips, Passes) { EXPECT_EQ(2 * 2, 4); }
TEST(PassesAndSkips, Skips) { GTEST_SKIP() << "one case of the suite skips"; }

TEST(FailsAndSkips, Skips) { GTEST_SKIP() << "skips before the failure below"; }
TEST(FailsAndSkips, Fails) { EXPECT_EQ(1, 2) << "fails on purpose: CTest must report the suite failed"; }

// Parameters whose listing ("  # GetParam() = ...") holds what a CMake list would misread.
class Params : public testing::TestWithParam<std::string> {};
TEST_P(Params, Skips) { GTEST_SKIP() << "parameter " << GetParam(); }
INSTANTIATE_TEST_SUITE_P(Odd, Params, testing::Values("[unbalanced;", "ends\\"));

// Listed after Odd/Params: found only if that suite's brackets did not swallow the lines after them.
class After : public testing::TestWithParam<int> {};
TEST_P(After, Passes) { EXPECT_GT(GetParam(), 0); }
INSTANTIATE_TEST_SUITE_P(Then, After, testing::Values(1));
