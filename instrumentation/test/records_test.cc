#include "fl/instrumentation/records.h"

#include <string>
#include <string_view>

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
  for (ClientOutcome o :
       {ClientOutcome::kOk, ClientOutcome::kLate, ClientOutcome::kDropped, ClientOutcome::kRejected}) {
    auto parsed = ParseClientOutcome(ClientOutcomeName(o));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, o);
  }
  for (ClientEventKind k : {ClientEventKind::kReportRefused, ClientEventKind::kUploadRevoked,
                            ClientEventKind::kInitialModelReasked, ClientEventKind::kSessionClosed}) {
    auto parsed = ParseClientEventKind(ClientEventKindName(k));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, k);
  }
  EXPECT_EQ(ClientEventKindName(ClientEventKind::kReportRefused), "report_refused");
  EXPECT_EQ(ClientEventKindName(ClientEventKind::kUploadRevoked), "upload_revoked");
  EXPECT_EQ(ClientEventKindName(ClientEventKind::kInitialModelReasked), "initial_model_reasked");
  EXPECT_EQ(ClientEventKindName(ClientEventKind::kSessionClosed), "session_closed");
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
  ClientEventRecord event;
  event.experiment_id = "e1";
  event.client_id = "pi-7";
  event.kind = ClientEventKind::kUploadRevoked;
  EXPECT_EQ(DescribeRecord(event), "client event (experiment e1, client pi-7, upload_revoked)");
  event.round = 5;
  EXPECT_EQ(DescribeRecord(event), "client event (experiment e1, client pi-7, upload_revoked, round 5)");
}

TEST(RecordsTest, ClientEventReasonIsBoundedAtACharacterBoundary) {
  EXPECT_EQ(BoundClientEventReason("short"), "short");
  const std::string exact(kMaxClientEventReasonBytes, 'x');
  EXPECT_EQ(BoundClientEventReason(exact), exact);
  const std::string bounded = BoundClientEventReason(std::string(5000, 'y'));
  EXPECT_EQ(bounded.size(), kMaxClientEventReasonBytes);
  EXPECT_EQ(bounded.substr(bounded.size() - 3), "...");
  // "é" is two bytes: a cut that would fall between them backs up to before the character.
  std::string accents;
  while (accents.size() < 2 * kMaxClientEventReasonBytes) accents += "\xc3\xa9";
  const std::string cut = BoundClientEventReason(accents);
  ASSERT_LE(cut.size(), kMaxClientEventReasonBytes);
  const std::string body = cut.substr(0, cut.size() - 3);
  EXPECT_EQ(body.size() % 2, 0u) << "a character was split";
  EXPECT_EQ(body, accents.substr(0, body.size()));
  EXPECT_EQ(cut.substr(cut.size() - 3), "...");
}

TEST(RecordsTest, NowIsAPlausibleUnixTimeInMilliseconds) {
  const int64_t now = fl::UnixMs();
  EXPECT_GT(now, 1'600'000'000'000);  // after 2020
  EXPECT_LT(now, 4'102'444'800'000);  // before 2100
}

}  // namespace
}  // namespace fl::instrumentation
