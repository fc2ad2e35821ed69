// Expensive set-up shared by a fixture's tests, whose failure fails those tests.
//
// googletest marks every test of a suite whose SetUpTestSuite() failed as *skipped*, and CTest counts a skipped test
// as not failed: a suite whose servers or data could not be set up would leave CI green with its checks never run.
// So fallible shared set-up runs from the fixture's SetUp() instead, once:
//
//   static void SetUpSuite() { ...ASSERT_...; }               // was SetUpTestSuite()
//   void SetUp() override { fl::testing::SetUpSuiteOnce<MyTest>(&MyTest::SetUpSuite); }
//
// The first test runs SetUpSuite() (its ASSERTs fail that test); every later test of the fixture fails at once if it
// failed. TearDownTestSuite() stays as it is (it must cope with a set-up that stopped half way).
#pragma once

#include <gtest/gtest.h>

#include <optional>

namespace fl::testing {

template <typename Fixture>
void SetUpSuiteOnce(void (*set_up)()) {
  static std::optional<bool> succeeded;
  if (!succeeded.has_value()) {
    set_up();
    succeeded = !::testing::Test::HasFailure();
    return;  // a failure was reported in this test already
  }
  ASSERT_TRUE(*succeeded) << "this fixture's shared set-up failed in its first test (see that failure)";
}

}  // namespace fl::testing
