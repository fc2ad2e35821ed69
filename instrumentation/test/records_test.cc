#include "fl/instrumentation/records.h"

#include <string>

#include <gtest/gtest.h>

#include "fl/core/clock.h"

namespace fl::instrumentation {
namespace {

TEST(RecordsTest, EnumNamesRoundTrip) {
  for (ExperimentStatus s : {ExperimentStatus::kRunning, ExperimentStatus::kFinished, ExperimentStatus::kFailed,
                             ExperimentStatus::kAborted}) {
    auto parsed = ParseExperimentStatus(ExperimentStatusName(s));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, s);
  }
  for (RoundStatus s : {RoundStatus::kCommitted, RoundStatus::kFailed, RoundStatus::kAborted}) {
    auto parsed = ParseRoundStatus(RoundStatusName(s));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, s);
  }
  for (ClientOutcome o : {ClientOutcome::kOk, ClientOutcome::kLate, ClientOutcome::kDropped, ClientOutcome::kRejected}) {
    auto parsed = ParseClientOutcome(ClientOutcomeName(o));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, o);
  }
  // The spellings are part of the schema (CHECK constraints) and of fl-report's queries.
  EXPECT_EQ(RoundStatusName(RoundStatus::kCommitted), "committed");
  EXPECT_EQ(ClientOutcomeName(ClientOutcome::kDropped), "dropped");
}

TEST(RecordsTest, UnknownNamesListTheValidOnes) {
  auto bad = ParseClientOutcome("timeout");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(bad.status().message()),
            "unknown client outcome 'timeout'; expected one of ok, late, dropped, rejected");
}

TEST(RecordsTest, DescribeNamesTheKindAndKey) {
  RoundRecord r;
  r.experiment_id = "e1";
  r.round = 3;
  r.attempt = 1;
  r.status = RoundStatus::kFailed;
  EXPECT_EQ(DescribeRecord(r), "round (experiment e1, round 3, attempt 1, failed)");
  ClientRoundRecord c;
  c.experiment_id = "e1";
  c.round = 3;
  c.client_id = "pi-7";
  EXPECT_EQ(DescribeRecord(c), "client round (experiment e1, round 3, attempt 0, client pi-7)");
  CheckpointRecord checkpoint;
  checkpoint.experiment_id = "e1";
  checkpoint.round = 4;
  EXPECT_EQ(DescribeRecord(checkpoint), "checkpoint (experiment e1, round 4)");
}

TEST(RecordsTest, NowIsAPlausibleUnixTimeInMilliseconds) {
  const int64_t now = fl::UnixMs();
  EXPECT_GT(now, 1'600'000'000'000);  // after 2020
  EXPECT_LT(now, 4'102'444'800'000);  // before 2100
}

}  // namespace
}  // namespace fl::instrumentation
