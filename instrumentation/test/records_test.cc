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
  for (ClientOutcome o : {ClientOutcome::kOk, ClientOutcome::kLate, ClientOutcome::kDropped, ClientOutcome::kRejected,
                          ClientOutcome::kCancelled, ClientOutcome::kFolded}) {
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
  for (SecurityRefusal r :
       {SecurityRefusal::kNameMismatch, SecurityRefusal::kWrongIdentity, SecurityRefusal::kRevokedCertificate,
        SecurityRefusal::kBadToken, SecurityRefusal::kJoinRate, SecurityRefusal::kSessionLimit,
        SecurityRefusal::kUploadLimit, SecurityRefusal::kStreamDeadline, SecurityRefusal::kSecAgg}) {
    auto parsed = ParseSecurityRefusal(SecurityRefusalName(r));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, r);
  }
  // Also the Prometheus label of fl-server's refusal counter.
  EXPECT_EQ(SecurityRefusalName(SecurityRefusal::kNameMismatch), "name_mismatch");
  EXPECT_EQ(SecurityRefusalName(SecurityRefusal::kWrongIdentity), "wrong_identity");
  EXPECT_EQ(SecurityRefusalName(SecurityRefusal::kRevokedCertificate), "revoked_certificate");
  EXPECT_EQ(SecurityRefusalName(SecurityRefusal::kBadToken), "bad_token");
  EXPECT_EQ(SecurityRefusalName(SecurityRefusal::kJoinRate), "join_rate");
  EXPECT_EQ(SecurityRefusalName(SecurityRefusal::kSessionLimit), "session_limit");
  EXPECT_EQ(SecurityRefusalName(SecurityRefusal::kUploadLimit), "upload_limit");
  EXPECT_EQ(SecurityRefusalName(SecurityRefusal::kStreamDeadline), "stream_deadline");
  EXPECT_EQ(SecurityRefusalName(SecurityRefusal::kSecAgg), "secagg");
  for (SecAggStage st :
       {SecAggStage::kAdvertiseKeys, SecAggStage::kShareKeys, SecAggStage::kMaskedUpload, SecAggStage::kUnmask}) {
    auto parsed = ParseSecAggStage(SecAggStageName(st));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, st);
  }
  EXPECT_EQ(SecAggStageName(SecAggStage::kAdvertiseKeys), "advertise_keys");
  EXPECT_EQ(SecAggStageName(SecAggStage::kShareKeys), "share_keys");
  EXPECT_EQ(SecAggStageName(SecAggStage::kMaskedUpload), "masked_upload");
  EXPECT_EQ(SecAggStageName(SecAggStage::kUnmask), "unmask");
  for (SecAggStageOutcome o : {SecAggStageOutcome::kOk, SecAggStageOutcome::kDropped, SecAggStageOutcome::kRefused}) {
    auto parsed = ParseSecAggStageOutcome(SecAggStageOutcomeName(o));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, o);
  }
  EXPECT_EQ(SecAggStageOutcomeName(SecAggStageOutcome::kOk), "ok");
  EXPECT_EQ(SecAggStageOutcomeName(SecAggStageOutcome::kDropped), "dropped");
  EXPECT_EQ(SecAggStageOutcomeName(SecAggStageOutcome::kRefused), "refused");
  // The spellings are part of the schema (CHECK constraints) and of fl-report's queries.
  EXPECT_EQ(RoundStatusName(RoundStatus::kCommitted), "committed");
  EXPECT_EQ(ClientOutcomeName(ClientOutcome::kDropped), "dropped");
  EXPECT_EQ(ClientOutcomeName(ClientOutcome::kCancelled), "cancelled");
  EXPECT_EQ(ClientOutcomeName(ClientOutcome::kFolded), "folded");
}

TEST(RecordsTest, UnknownNamesListTheValidOnes) {
  auto bad = ParseClientOutcome("timeout");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(bad.status().message()),
            "unknown client outcome 'timeout'; expected one of ok, late, dropped, rejected, cancelled, folded");
}

TEST(RecordsTest, UnknownSecurityRefusalListsTheNine) {
  auto bad = ParseSecurityRefusal("too_many");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(bad.status().message()),
            "unknown security refusal 'too_many'; expected one of name_mismatch, wrong_identity, revoked_certificate, "
            "bad_token, join_rate, session_limit, upload_limit, stream_deadline, secagg");
}

TEST(RecordsTest, UnknownSecAggNamesListTheValidOnes) {
  auto stage = ParseSecAggStage("upload");
  ASSERT_FALSE(stage.ok());
  EXPECT_EQ(stage.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(stage.status().message()),
            "unknown secure-aggregation stage 'upload'; expected one of advertise_keys, share_keys, masked_upload, "
            "unmask");
  auto outcome = ParseSecAggStageOutcome("late");
  ASSERT_FALSE(outcome.ok());
  EXPECT_EQ(std::string(outcome.status().message()),
            "unknown secure-aggregation stage outcome 'late'; expected one of ok, dropped, refused");
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
  SecurityEventRecord security;
  security.experiment_id = "e1";
  security.reason = SecurityRefusal::kWrongIdentity;
  security.peer = "ipv4:127.0.0.1:50514";
  EXPECT_EQ(DescribeRecord(security), "security event (experiment e1, wrong_identity, peer ipv4:127.0.0.1:50514)");
  SecAggStageRecord stage;
  stage.experiment_id = "e1";
  stage.round = 2;
  stage.client_id = "pi-7";
  stage.stage = SecAggStage::kShareKeys;
  stage.outcome = SecAggStageOutcome::kDropped;
  EXPECT_EQ(DescribeRecord(stage),
            "secure-aggregation stage (experiment e1, round 2, attempt 0, client pi-7, share_keys, dropped)");
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

// The one bounding helper both event kinds' texts go through: the same cut at any bound, never above it.
TEST(RecordsTest, BoundTextCutsAtAnyBoundWithoutSplittingACharacter) {
  EXPECT_EQ(BoundText("short", kMaxSecurityEventPeerBytes), "short");
  EXPECT_EQ(BoundText(std::string(300, 'p'), kMaxSecurityEventPeerBytes),
            std::string(kMaxSecurityEventPeerBytes - 3, 'p') + "...");
  EXPECT_EQ(BoundText(std::string(5000, 'y'), kMaxClientEventReasonBytes),
            BoundClientEventReason(std::string(5000, 'y')));
  // "é" (2 bytes) at a bound of 6: 3 bytes of room before "..." hold one "é" only.
  EXPECT_EQ(BoundText("\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9", 6), "\xc3\xa9...");
  // A bound with no room for the ellipsis is still a bound.
  EXPECT_EQ(BoundText("abcdef", 2), "ab");
  EXPECT_EQ(BoundText("abcdef", 0), "");
}

TEST(RecordsTest, NowIsAPlausibleUnixTimeInMilliseconds) {
  const int64_t now = fl::UnixMs();
  EXPECT_GT(now, 1'600'000'000'000);  // after 2020
  EXPECT_LT(now, 4'102'444'800'000);  // before 2100
}

}  // namespace
}  // namespace fl::instrumentation
