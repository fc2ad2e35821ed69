#include "fl/core/task.h"

#include <gtest/gtest.h>

namespace fl::core {
namespace {

TEST(TaskTest, NamesRoundTripAndEmptyIsClassification) {
  for (Task t : {Task::kClassification, Task::kRegression, Task::kNextToken}) {
    auto parsed = ParseTask(TaskName(t));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, t);
  }
  EXPECT_EQ(TaskName(Task::kNextToken), "next-token");
  // Clients and databases from before tasks existed trained classifiers.
  EXPECT_EQ(*ParseTask(""), Task::kClassification);
}

TEST(TaskTest, UnknownTaskNamesTheValueAndTheChoices) {
  auto t = ParseTask("segmentation");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string m(t.status().message());
  EXPECT_NE(m.find("'segmentation'"), std::string::npos) << m;
  EXPECT_NE(m.find("next-token"), std::string::npos) << m;
  EXPECT_FALSE(ParseTask("Classification").ok());  // spelled exactly, as on the wire
}

TEST(TaskTest, EachTaskHasItsMetric) {
  EXPECT_EQ(TaskMetricName(Task::kClassification), "accuracy");
  EXPECT_EQ(TaskMetricName(Task::kRegression), "mae");
  EXPECT_EQ(TaskMetricName(Task::kNextToken), "perplexity");
}

}  // namespace
}  // namespace fl::core
