// fl-privacy as a user runs it: the real binary, its output lines and exit codes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "fl/testing/run_tool.h"
#include "fl/testing/scratch_dir.h"

namespace {

using ::testing::HasSubstr;

fl::testing::ToolResult RunPrivacy(std::vector<std::string> args) {
  static fl::testing::ScratchDir dir("fl_privacy_cli");
  args.insert(args.begin(), FL_PRIVACY_BIN);
  return fl::testing::RunTool(args, dir);
}

TEST(PrivacyCliTest, EpsilonPrintsTheReferenceValuesAndOrders) {
  auto r = RunPrivacy(
      {"epsilon", "--noise-multiplier", "1.3", "--sampling-rate", "0.0025", "--steps", "6000", "--delta", "1e-5"});
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("epsilon: 0.72422340261"));
  EXPECT_THAT(r.output, HasSubstr("order: 19\n"));
  r = RunPrivacy(
      {"epsilon", "--noise-multiplier", "1.0", "--sampling-rate", "0.001", "--steps", "30000", "--delta", "1e-7"});
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("epsilon: 1.41549884954"));
  EXPECT_THAT(r.output, HasSubstr("order: 13\n"));
  r = RunPrivacy(
      {"epsilon", "--noise-multiplier", "0.1", "--sampling-rate", "1.024e-5", "--steps", "976563", "--delta", "1e-7"});
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("epsilon: 5907982.31"));
  EXPECT_THAT(r.output, HasSubstr("order: 1.25\n"));
  // dp_accounting's grid: no 1.25, and 1.1 does better on this schedule.
  r = RunPrivacy({"epsilon", "--noise-multiplier", "0.1", "--sampling-rate", "1.024e-5", "--steps", "976563", "--delta",
                  "1e-7", "--orders", "dp-accounting"});
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("order: 1.1\n"));
}

TEST(PrivacyCliTest, NoisePrintsTheSigmaThatReachesTheTarget) {
  auto r = RunPrivacy({"noise", "--target-epsilon", "0.7242234026109595", "--sampling-rate", "0.0025", "--steps",
                       "6000", "--delta", "1e-5"});
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("noise_multiplier: 1.300000"));
  EXPECT_THAT(r.output, HasSubstr("order: 19\n"));
}

TEST(PrivacyCliTest, BadValuesAreRefusedWithWhatToDo) {
  auto r =
      RunPrivacy({"epsilon", "--noise-multiplier", "0", "--sampling-rate", "0.01", "--steps", "10", "--delta", "1e-5"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.output, HasSubstr("fl-privacy: noise multiplier σ = 0 gives no privacy"));
  r = RunPrivacy({"epsilon", "--noise-multiplier", "1", "--sampling-rate", "1.5", "--steps", "10", "--delta", "1e-5"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.output, HasSubstr("q = 1.5 is not a probability"));
  r = RunPrivacy({"epsilon", "--noise-multiplier", "1", "--sampling-rate", "0.01", "--steps", "10", "--delta", "1"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.output, HasSubstr("δ = 1 is outside (0, 1)"));
  r = RunPrivacy({"noise", "--target-epsilon", "0", "--sampling-rate", "0.01", "--steps", "10", "--delta", "1e-5"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.output, HasSubstr("target ε = 0 cannot be met"));
  r = RunPrivacy(
      {"noise", "--target-epsilon", "0.001", "--sampling-rate", "0.01", "--steps", "100", "--delta", "1e-7"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.output, HasSubstr("unreachable"));
  r = RunPrivacy({"epsilon", "--noise-multiplier", "1", "--sampling-rate", "0.01", "--steps", "10", "--delta", "1e-5",
                  "--orders", "opacus"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.output, HasSubstr("'opacus' is unknown"));
}

TEST(PrivacyCliTest, UsageErrorsExitTwo) {
  EXPECT_EQ(RunPrivacy({}).code, 2);
  auto r = RunPrivacy({"epsilon", "--noise-multiplier", "1"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.output, HasSubstr("--sampling-rate"));
  EXPECT_EQ(
      RunPrivacy({"epsilon", "--noise-multiplier", "x", "--sampling-rate", "0.01", "--steps", "1", "--delta", "1e-5"})
          .code,
      2);
}

}  // namespace
