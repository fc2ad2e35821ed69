// Over-commitment and the deadline policies (engine_overcommit.cc, docs/round-engine.md "Over-commitment and
// deadline policies") on an injected ManualClock, event by event: who is cancelled and what the cancel says, which
// update is late, a late update's staleness and discount, and the aggregate's exact value for known updates (read
// back from the round's checkpoint), with the records read back from SQLite. And the refusals at start.
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "fl/core/codec.h"
#include "fl/instrumentation/record_reader.h"
#include "fl/server/checkpoint.h"
#include "manual_engine.h"

namespace fl::server {
namespace {

using instrumentation::ClientOutcome;
using instrumentation::ClientRoundRecord;
using test_harness::InitialModel;
using test_harness::kParams;
using test_harness::LastCancel;
using test_harness::LastTask;
using test_harness::TestClient;

class EngineOvercommitTest : public test_harness::ManualEngineTest {
 protected:
  EngineOvercommitTest() : ManualEngineTest("fl_engine_overcommit") {}

  EngineConfig Config() {
    EngineConfig c = test_harness::SmallConfig(dir_.File("ckpt"));
    c.num_rounds = 2;
    c.fit = {1.0, 1, 2};
    c.evaluate_every = 0;
    c.round_deadline_ms = 10'000;
    c.heartbeat_interval_ms = 60'000;
    c.print_table = false;
    return c;
  }

  // Starts an upload of `task`; returns the refusal, if the engine refused it at the header.
  std::optional<fl::v1::UploadUpdateResponse> StartUpload(const TestClient& c, const fl::v1::Task& task,
                                                          uint64_t examples) {
    return ManualEngineTest::StartUpload(test_harness::DeltaHeader(c.id, c.token, task, examples));
  }

  // Ends an admitted upload: a delta of `value` in every coordinate, for `examples` examples.
  fl::v1::UploadUpdateResponse FinishUpload(const TestClient& c, const fl::v1::Task& task, float value,
                                            uint64_t examples, int64_t first_byte_ns) {
    return ManualEngineTest::FinishUpload(test_harness::DeltaHeader(c.id, c.token, task, examples), Fp32Delta(value),
                                          first_byte_ns);
  }

  fl::v1::UploadUpdateResponse Upload(const TestClient& c, const fl::v1::Task& task, float value,
                                      uint64_t examples = 10) {
    const int64_t first = clock_.NowNs();
    if (auto refused = StartUpload(c, task, examples); refused.has_value()) return *refused;
    return FinishUpload(c, task, value, examples, first);
  }

  // The global model after `round` (its checkpoint) minus the initial one, coordinate 0 and the largest difference
  // from it over all coordinates (every update is constant, so every coordinate moves alike).
  float ModelMoveAfter(uint64_t round) {
    auto ckpt = LoadCheckpoint(CheckpointPath(dir_.File("ckpt"), round));
    EXPECT_TRUE(ckpt.ok()) << ckpt.status();
    if (!ckpt.ok()) return NAN;
    const float move = initial_[0] - ckpt->values[0];
    for (size_t i = 0; i < kParams; ++i) EXPECT_NEAR(initial_[i] - ckpt->values[i], move, 1e-6) << i;
    return move;
  }
};

// 4 clients, fraction 0.5: K = 2. --overcommit 1.5 selects ceil(1.5 x 2) = 3; the round commits at the second
// accepted update, the third client's task is cancelled (the cancel reaches it, naming why), its row says
// 'cancelled', and the aggregate is the mean of the two that came first.
TEST_F(EngineOvercommitTest, TheFirstKUpdatesCommitAndTheRestAreCancelled) {
  EngineConfig config = Config();
  config.fit = {0.5, 1, 4};
  config.overcommit = 1.5;
  StartEngine(config);
  std::vector<TestClient> clients;
  for (const char* name : {"a", "b", "c", "d"}) clients.push_back(Connect(name));
  ASSERT_EQ(engine_->state(), EngineState::kCollecting);
  std::vector<TestClient*> selected;
  for (TestClient& c : clients) {
    if (LastTask(c).has_value()) selected.push_back(&c);
  }
  ASSERT_EQ(selected.size(), 3u) << "ceil(1.5 x 2) clients selected";
  TestClient& first = *selected[0];
  TestClient& second = *selected[1];
  TestClient& third = *selected[2];
  const fl::v1::Task third_task = *LastTask(third);
  // The third client fetched the model (the server's view of the download: what its cancelled row keeps of the
  // work the task moved, since the client never reports).
  engine_->Post(DownloadDoneEvent{third.id, third_task.task_id(), clock_.NowNs(), clock_.NowNs() + 5'000'000, 12'345});
  Run();

  Advance(1'000);
  EXPECT_EQ(Upload(first, *LastTask(first), 0.002f).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  EXPECT_EQ(engine_->state(), EngineState::kCollecting) << "one of K = 2";
  EXPECT_FALSE(LastCancel(third).has_value());
  Advance(1'000);
  EXPECT_EQ(Upload(second, *LastTask(second), 0.004f, 30).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);

  // Committed at the second update, 2 s after the dispatch, long before the 10 s deadline.
  auto rounds = *Reader()->ListRounds(ExperimentId());
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].status, instrumentation::RoundStatus::kCommitted);
  EXPECT_EQ(rounds[0].num_selected, 3);
  EXPECT_EQ(rounds[0].num_accepted, 2);
  EXPECT_EQ(rounds[0].num_dropped, 0);
  EXPECT_EQ(rounds[0].num_late, 0);
  EXPECT_DOUBLE_EQ(rounds[0].duration_ms, 2'000.0);
  auto cancel = LastCancel(third);
  ASSERT_TRUE(cancel.has_value()) << "the cancel reaches the third client";
  EXPECT_EQ(cancel->task_id(), third_task.task_id());
  EXPECT_NE(cancel->reason().find("committed with its first 2 updates (over-commitment"), std::string::npos)
      << cancel->reason();
  for (TestClient* c : {&first, &second}) EXPECT_FALSE(LastCancel(*c).has_value()) << c->id;
  auto rows = RowsOfRound(1);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[first.id].outcome, ClientOutcome::kOk);
  EXPECT_EQ(rows[second.id].outcome, ClientOutcome::kOk);
  EXPECT_EQ(rows[third.id].outcome, ClientOutcome::kCancelled);
  EXPECT_TRUE(rows[third.id].dispatched_unix_ms.has_value());
  EXPECT_FALSE(rows[third.id].num_examples.has_value()) << "it reported nothing";
  EXPECT_EQ(rows[third.id].downlink_bytes, 12'345) << "the model the server sent it";
  EXPECT_EQ(rows[third.id].downlink_server_ms, 5.0);
  // Weighted by examples: (10 x 0.002 + 30 x 0.004) / 40 = 0.0035 (fedavg, server learning rate 1).
  EXPECT_NEAR(ModelMoveAfter(1), 0.0035f, 1e-7);

  // The cancelled client's update, had it been under way, is refused as late and its row stays 'cancelled'.
  auto refused = Upload(third, third_task, 0.1f);
  EXPECT_EQ(refused.outcome(), fl::v1::UPDATE_OUTCOME_LATE);
  EXPECT_EQ(RowsOfRound(1)[third.id].outcome, ClientOutcome::kCancelled);
}

// Over-commitment does not lower what a round needs at its deadline: 3 selected for K = 2, one answers, the round
// commits at the deadline with min_fit_clients = 1, and the two silent clients are dropped, not cancelled.
TEST_F(EngineOvercommitTest, AtTheDeadlineTheRoundCommitsWithAtLeastTheMinimumAndNobodyIsCancelled) {
  EngineConfig config = Config();
  config.fit = {0.5, 1, 4};
  config.overcommit = 1.5;
  StartEngine(config);
  std::vector<TestClient> clients;
  for (const char* name : {"a", "b", "c", "d"}) clients.push_back(Connect(name));
  TestClient* answering = nullptr;
  for (TestClient& c : clients) {
    if (LastTask(c).has_value() && answering == nullptr) answering = &c;
  }
  ASSERT_NE(answering, nullptr);
  EXPECT_EQ(Upload(*answering, *LastTask(*answering), 0.002f).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  Advance(10'000);
  auto rounds = *Reader()->ListRounds(ExperimentId());
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].status, instrumentation::RoundStatus::kCommitted);
  EXPECT_EQ(rounds[0].num_accepted, 1);
  EXPECT_EQ(rounds[0].num_dropped, 2);
  for (TestClient& c : clients) EXPECT_FALSE(LastCancel(c).has_value()) << c.id;
  int dropped = 0;
  for (const auto& [id, row] : RowsOfRound(1)) dropped += row.outcome == ClientOutcome::kDropped ? 1 : 0;
  EXPECT_EQ(dropped, 2);
}

// --deadline-policy fold: round 1 commits at its deadline with a's update; b's update of round 1 arrives during
// round 2, is accepted and kept, and round 2's aggregate takes it with weight n x (1 + 1)^-1 (staleness 1, one
// version behind): (10 x 0.003 + 10 x 0.005 + 5 x 0.002) / 25 = 0.0036. b's round-1 row becomes 'folded'.
TEST_F(EngineOvercommitTest, ALateUpdateIsFoldedIntoTheNextRoundWithItsStalenessDiscount) {
  EngineConfig config = Config();
  config.deadline_policy = "fold";
  config.late_discount = 1.0;
  StartEngine(config);
  TestClient a = Connect("a");
  TestClient b = Connect("b");
  const fl::v1::Task a1 = *LastTask(a);
  const fl::v1::Task b1 = *LastTask(b);
  EXPECT_EQ(Upload(a, a1, 0.001f).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  Advance(10'000);  // round 1's deadline: committed with a alone; b is 'late' (it had not started its upload)
  auto rounds = *Reader()->ListRounds(ExperimentId());
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].num_accepted, 1);
  EXPECT_EQ(rounds[0].model_version, 1);
  EXPECT_EQ(RowsOfRound(1)["b"].outcome, ClientOutcome::kDropped);
  EXPECT_NEAR(ModelMoveAfter(1), 0.001f, 1e-7);
  ASSERT_EQ(LastTask(a)->round(), 2u);
  ASSERT_EQ(LastTask(b)->round(), 2u);

  Advance(2'000);
  const fl::v1::UploadUpdateResponse late = Upload(b, b1, 0.002f);
  EXPECT_EQ(late.outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED) << late.error().message();
  EXPECT_EQ(RowsOfRound(1)["b"].outcome, ClientOutcome::kDropped) << "until round 2 commits";
  EXPECT_EQ(Upload(a, *LastTask(a), 0.003f).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  EXPECT_EQ(Upload(b, *LastTask(b), 0.005f).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);

  rounds = *Reader()->ListRounds(ExperimentId());
  ASSERT_EQ(rounds.size(), 2u);
  EXPECT_EQ(rounds[1].status, instrumentation::RoundStatus::kCommitted);
  EXPECT_EQ(rounds[1].num_accepted, 2) << "a folded update is not one of the round's own";
  EXPECT_NEAR(ModelMoveAfter(2) - ModelMoveAfter(1), 0.0036f, 1e-7);
  auto rows1 = RowsOfRound(1);
  const ClientRoundRecord& folded = rows1["b"];
  EXPECT_EQ(folded.outcome, ClientOutcome::kFolded);
  EXPECT_EQ(folded.attempt, 1);
  EXPECT_EQ(folded.base_model_version, 0);
  EXPECT_EQ(folded.staleness, 1);
  EXPECT_EQ(folded.staleness_weight, 0.5);
  EXPECT_EQ(folded.folded_into_round, 2);
  EXPECT_EQ(folded.num_examples, 10);
  EXPECT_EQ(folded.uplink_bytes, static_cast<int64_t>((*core::MakeCodec("fp32"))->EncodedSize(kParams)));
  EXPECT_EQ(rows1["a"].outcome, ClientOutcome::kOk);
  EXPECT_FALSE(rows1["a"].staleness.has_value());
  auto rows2 = RowsOfRound(2);
  EXPECT_EQ(rows2.size(), 2u);
  EXPECT_EQ(rows2["b"].outcome, ClientOutcome::kOk);
}

// Two rounds late: b's round-1 update arrives after round 2 committed (round 3 open), so it is applied two
// versions on: staleness 2, discount (1 + 2)^-0.5 with --late-discount 0.5.
TEST_F(EngineOvercommitTest, TheDiscountFollowsTheStalenessInModelVersions) {
  EngineConfig config = Config();
  config.num_rounds = 3;
  config.deadline_policy = "fold";
  config.late_discount = 0.5;
  StartEngine(config);
  TestClient a = Connect("a");
  TestClient b = Connect("b");
  const fl::v1::Task b1 = *LastTask(b);
  EXPECT_EQ(Upload(a, *LastTask(a), 0.001f).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  Advance(10'000);  // round 1 commits with a
  EXPECT_EQ(Upload(a, *LastTask(a), 0.001f).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  Advance(10'000);  // round 2 commits with a; b answered neither
  ASSERT_EQ(LastTask(a)->round(), 3u);
  const fl::v1::Task b3 = *LastTask(b);
  EXPECT_EQ(Upload(b, b1, 0.004f, 12).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  EXPECT_EQ(Upload(a, *LastTask(a), 0.002f, 12).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  EXPECT_EQ(Upload(b, b3, 0.002f, 12).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  const double w = 12.0 / std::sqrt(3.0);
  const double expected = (12 * 0.002 + 12 * 0.002 + w * 0.004) / (24 + w);
  EXPECT_NEAR(ModelMoveAfter(3) - ModelMoveAfter(2), expected, 1e-7);
  auto folded = RowsOfRound(1)["b"];
  EXPECT_EQ(folded.outcome, ClientOutcome::kFolded);
  EXPECT_EQ(folded.staleness, 2);
  EXPECT_DOUBLE_EQ(*folded.staleness_weight, 1.0 / std::sqrt(3.0));
  EXPECT_EQ(folded.folded_into_round, 3);
  EXPECT_EQ(RowsOfRound(2)["b"].outcome, ClientOutcome::kDropped) << "its round-2 task stays unanswered";
}

// --deadline-policy drop (the default): the same late update is refused at its header as late, the round-1 row
// stays 'dropped', and round 2's aggregate is its own updates' mean.
TEST_F(EngineOvercommitTest, WithTheDropPolicyALateUpdateIsRefusedAndNotAggregated) {
  StartEngine(Config());
  TestClient a = Connect("a");
  TestClient b = Connect("b");
  const fl::v1::Task b1 = *LastTask(b);
  EXPECT_EQ(Upload(a, *LastTask(a), 0.001f).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  Advance(10'000);
  Advance(2'000);
  EXPECT_EQ(Upload(b, b1, 0.002f).outcome(), fl::v1::UPDATE_OUTCOME_LATE);
  EXPECT_EQ(Upload(a, *LastTask(a), 0.003f).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  EXPECT_EQ(Upload(b, *LastTask(b), 0.005f).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  EXPECT_NEAR(ModelMoveAfter(2) - ModelMoveAfter(1), 0.004f, 1e-7);
  EXPECT_EQ(RowsOfRound(1)["b"].outcome, ClientOutcome::kDropped);
  EXPECT_FALSE(RowsOfRound(1)["b"].folded_into_round.has_value());
}

// A late update whose upload began before the deadline (in transit when the round closed: 'late') is folded too,
// with the attempt its row has; updates of a failed attempt are not folded (their round never committed).
TEST_F(EngineOvercommitTest, AnUpdateInTransitAtTheDeadlineIsFoldedWithItsAttempt) {
  EngineConfig config = Config();
  config.deadline_policy = "fold";
  StartEngine(config);
  TestClient a = Connect("a");
  TestClient b = Connect("b");
  const fl::v1::Task a1 = *LastTask(a);
  Advance(9'000);
  const int64_t a_first = clock_.NowNs();
  ASSERT_FALSE(StartUpload(a, a1, 10).has_value());
  Advance(1'500);  // the deadline passes with a's update in transit and b silent: attempt 1 fails
  auto rounds = *Reader()->ListRounds(ExperimentId());
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].status, instrumentation::RoundStatus::kFailed);
  EXPECT_EQ(FinishUpload(a, a1, 0.001f, 10, a_first).outcome(), fl::v1::UPDATE_OUTCOME_LATE);

  const fl::v1::Task a2 = *LastTask(a);
  const fl::v1::Task b2 = *LastTask(b);
  ASSERT_EQ(b2.task_id().rfind("r1.2-", 0), 0u) << b2.task_id();
  EXPECT_EQ(Upload(a, a2, 0.001f).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  Advance(9'000);
  const int64_t b_first = clock_.NowNs();
  ASSERT_FALSE(StartUpload(b, b2, 10).has_value());
  Advance(1'000);  // attempt 2 commits at its deadline with a; b's update is in transit: 'late'
  EXPECT_EQ(RowsOfRound(1)["b"].outcome, ClientOutcome::kLate);
  EXPECT_EQ(FinishUpload(b, b2, 0.001f, 10, b_first).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  EXPECT_EQ(Upload(a, *LastTask(a), 0.003f).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  EXPECT_EQ(Upload(b, *LastTask(b), 0.003f).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  auto folded = RowsOfRound(1)["b"];
  EXPECT_EQ(folded.outcome, ClientOutcome::kFolded);
  EXPECT_EQ(folded.attempt, 2);
  EXPECT_EQ(folded.folded_into_round, 2);
  EXPECT_EQ(folded.staleness, 1);
  // (10 x 0.003 + 10 x 0.003 + 5 x 0.001) / 25
  EXPECT_NEAR(ModelMoveAfter(2) - ModelMoveAfter(1), 0.0026f, 1e-7);
}

// A late update that fails validation (a NaN in its payload: a faulty client, past the transfer's checksum) is
// refused, not folded: its row stays as its round's commit wrote it, and the next round's aggregate is its own
// updates' mean.
TEST_F(EngineOvercommitTest, ACorruptLateUpdateIsRefusedAndNotFolded) {
  EngineConfig config = Config();
  config.deadline_policy = "fold";
  StartEngine(config);
  TestClient a = Connect("a");
  TestClient b = Connect("b");
  const fl::v1::Task b1 = *LastTask(b);
  EXPECT_EQ(Upload(a, *LastTask(a), 0.001f).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  Advance(10'000);
  const int64_t first = clock_.NowNs();
  auto refused = StartUpload(b, b1, 10);
  ASSERT_FALSE(refused.has_value()) << "a late upload of a committed round is admitted: " << refused->error().message();
  UploadDoneEvent done;
  done.header = test_harness::DeltaHeader(b.id, b.token, b1, 10);
  ASSERT_TRUE((*core::MakeCodec("fp32"))->Encode(std::vector<float>(kParams, 0.002f), &done.payload).ok());
  const float nan = std::numeric_limits<float>::quiet_NaN();  // the codec refuses to encode it: written by hand
  std::memcpy(done.payload.data() + core::kCodecHeaderBytes + 4 * (kParams / 2), &nan, sizeof nan);
  done.first_byte_server_ns = first;
  done.done_server_ns = clock_.NowNs();
  fl::v1::UploadUpdateResponse verdict;
  done.reply = [&](const fl::v1::UploadUpdateResponse& r) { verdict = r; };
  engine_->Post(std::move(done));
  Run();
  EXPECT_EQ(verdict.outcome(), fl::v1::UPDATE_OUTCOME_REJECTED);
  EXPECT_NE(verdict.error().message().find("late update not folded"), std::string::npos) << verdict.error().message();
  EXPECT_EQ(Upload(a, *LastTask(a), 0.003f).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  EXPECT_EQ(Upload(b, *LastTask(b), 0.005f).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  EXPECT_NEAR(ModelMoveAfter(2) - ModelMoveAfter(1), 0.004f, 1e-7);
  EXPECT_EQ(RowsOfRound(1)["b"].outcome, ClientOutcome::kDropped);
}

// Combinations that make no sense are refused at start, saying why and what works.
TEST(EngineStragglerConfigTest, NonsenseCombinationsAreRefusedSayingWhyAndWhatWorks) {
  auto refusal = [](auto change) {
    EngineConfig c = test_harness::SmallConfig("");
    change(c);
    absl::Status s = c.Validate();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    return std::string(s.message());
  };
  EXPECT_NE(refusal([](EngineConfig& c) { c.overcommit = 0.9; }).find("--overcommit=0.9"), std::string::npos);
  EXPECT_NE(refusal([](EngineConfig& c) { c.overcommit = 0.9; }).find("must be a finite number >= 1"),
            std::string::npos);
  EXPECT_NE(refusal([](EngineConfig& c) { c.overcommit = NAN; }).find(">= 1"), std::string::npos);
  EXPECT_NE(refusal([](EngineConfig& c) { c.deadline_policy = "keep"; }).find("use drop"), std::string::npos);
  EXPECT_NE(refusal([](EngineConfig& c) { c.late_discount = -1; }).find("--late-discount=-1"), std::string::npos);
  const std::string median = refusal([](EngineConfig& c) {
    c.deadline_policy = "fold";
    c.aggregator = "median";
  });
  EXPECT_NE(median.find("--deadline-policy=fold needs the weighted mean"), std::string::npos) << median;
  EXPECT_NE(median.find("use --deadline-policy=drop"), std::string::npos) << median;
  EXPECT_NE(refusal([](EngineConfig& c) {
              c.deadline_policy = "fold";
              c.aggregator = "trimmed_mean:0.2";
            }).find("ignores weights"),
            std::string::npos);

  // With buffered aggregation (checked on their own: the buffered settings have checks of their own).
  EngineConfig buffered = test_harness::SmallConfig("");
  buffered.aggregation = "buffered";
  buffered.overcommit = 1.3;
  absl::Status s = buffered.ValidateStragglers();
  EXPECT_NE(std::string(s.message()).find("Raise --concurrency above --buffer-size"), std::string::npos) << s;
  buffered.overcommit = 1.0;
  buffered.deadline_policy = "fold";
  s = buffered.ValidateStragglers();
  EXPECT_NE(std::string(s.message()).find("already applies every update with its staleness weight"), std::string::npos)
      << s;

  EngineConfig fine = test_harness::SmallConfig("");
  fine.overcommit = 1.3;
  fine.deadline_policy = "fold";
  fine.late_discount = 0.5;
  EXPECT_TRUE(fine.Validate().ok()) << fine.Validate();
}

}  // namespace
}  // namespace fl::server
