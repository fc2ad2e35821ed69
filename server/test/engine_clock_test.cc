// The round engine on an injected ManualClock, driven event by event on the test's thread (StartManual +
// RunUntilIdle): deadlines, stragglers, retries, evictions, re-asking for the initial model and revoking a
// stalled upload happen exactly when the clock says, with no sleep and no gRPC. Records go to a real SQLite
// database and are read back.
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "fl/core/codec.h"
#include "fl/instrumentation/record_reader.h"
#include "fl/rpc/clock.h"
#include "manual_engine.h"

namespace fl::server {
namespace {

using instrumentation::ClientEventKind;
using instrumentation::ClientOutcome;
using instrumentation::RecordStore;
using test_harness::InitialModel;
using test_harness::kParams;

using test_harness::LastTask;
using test_harness::TestClient;

constexpr int64_t kMs = 1'000'000;

// An upload's progress as the reactor would report it; Revoke answers like the reactor (an UploadDoneEvent
// with the status as its transfer error).
class TestUploadHandle final : public UploadHandle {
 public:
  explicit TestUploadHandle(RoundEngine* engine) : engine_(engine) {}
  uint64_t bytes_received() const override { return bytes; }
  int64_t last_message_ns() const override { return last_ns; }
  void Revoke(const grpc::Status& status) override {
    if (revoked.has_value()) return;
    revoked = status;
    UploadDoneEvent done;
    done.header = header;
    done.transfer_error = status;
    done.reply = [](const fl::v1::UploadUpdateResponse&) {};
    engine_->Post(std::move(done));
  }
  uint64_t bytes = 0;
  int64_t last_ns = 0;
  fl::v1::UpdateHeader header;
  std::optional<grpc::Status> revoked;

 private:
  RoundEngine* engine_;
};

class EngineClockTest : public test_harness::ManualEngineTest {
 protected:
  EngineClockTest() : ManualEngineTest("fl_engine_clock") {}

  static EngineConfig Config() {
    EngineConfig c = test_harness::SmallConfig("");
    c.num_rounds = 2;
    c.fit = {1.0, 1, 2};  // both clients are selected; one accepted update commits a round
    c.evaluate_every = 0;
    c.round_deadline_ms = 10'000;
    c.heartbeat_interval_ms = 5'000;  // 20 s of silence before an eviction, unless a test says otherwise
    c.print_table = false;
    return c;
  }

  void Send(const TestClient& c, fl::v1::ClientMessage m) {
    engine_->Post(SessionMessageEvent{c.channel, std::move(m), clock_.NowNs()});
    Run();
  }

  void Heartbeat(const TestClient& c) {
    fl::v1::ClientMessage m;
    m.mutable_heartbeat()->set_state(fl::v1::CLIENT_STATE_IDLE);
    Send(c, m);
  }

  static fl::v1::UpdateHeader Header(const TestClient& c, const fl::v1::Task& task) {
    return test_harness::DeltaHeader(c.id, c.token, task, 10);
  }

  // Starts an upload; true when the engine admitted it (gave it a slot).
  bool StartUpload(const TestClient& c, const fl::v1::Task& task, std::shared_ptr<UploadHandle> handle = nullptr,
                   std::optional<fl::v1::UploadUpdateResponse>* refusal = nullptr) {
    std::optional<fl::v1::UploadUpdateResponse> refused = ManualEngineTest::StartUpload(Header(c, task), handle);
    const bool admitted = !refused.has_value();
    if (refusal != nullptr) *refusal = std::move(refused);
    return admitted;
  }

  // Ends an admitted upload with a small, finite delta; returns the engine's verdict.
  fl::v1::UploadUpdateResponse FinishUpload(const TestClient& c, const fl::v1::Task& task, int64_t first_byte_ns) {
    return ManualEngineTest::FinishUpload(Header(c, task), Fp32Delta(0.001f), first_byte_ns);
  }

  fl::v1::UploadUpdateResponse Upload(const TestClient& c, const fl::v1::Task& task) {
    const int64_t first = clock_.NowNs();
    EXPECT_TRUE(StartUpload(c, task));
    return FinishUpload(c, task, first);
  }
};

TEST_F(EngineClockTest, ARoundClosesExactlyAtItsDeadlineAndTheSilentClientIsDropped) {
  StartEngine(Config());
  TestClient a = Connect("a");
  TestClient b = Connect("b");
  ASSERT_EQ(engine_->state(), EngineState::kCollecting);
  const fl::v1::Task task_a = *LastTask(a);
  ASSERT_TRUE(LastTask(b).has_value());
  EXPECT_EQ(Upload(a, task_a).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  Advance(10'000 - 1);  // 1 ms before the deadline (measured from the dispatch): b may still answer
  EXPECT_EQ(engine_->state(), EngineState::kCollecting);
  auto rounds = *Reader()->ListRounds(ExperimentId());
  EXPECT_TRUE(rounds.empty());
  Advance(1);
  // Round 1 committed with a's update; both clients idle again, so round 2 is dispatched at once.
  rounds = *Reader()->ListRounds(ExperimentId());
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].status, instrumentation::RoundStatus::kCommitted);
  EXPECT_EQ(rounds[0].num_accepted, 1);
  EXPECT_EQ(rounds[0].num_dropped, 1);
  EXPECT_DOUBLE_EQ(rounds[0].duration_ms, 10'000.0) << "measured on the injected clock";
  EXPECT_EQ(engine_->state(), EngineState::kCollecting);
  EXPECT_EQ(LastTask(a)->round(), 2u);
}

TEST_F(EngineClockTest, ARoundWithTooFewUpdatesFailsAtTheDeadlineAndTheNextAttemptIsDispatched) {
  EngineConfig config = Config();
  config.fit = {1.0, 2, 2};
  StartEngine(config);
  TestClient a = Connect("a");
  TestClient b = Connect("b");
  EXPECT_EQ(Upload(a, *LastTask(a)).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  Advance(10'000);
  auto rounds = *Reader()->ListRounds(ExperimentId());
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].status, instrumentation::RoundStatus::kFailed);
  EXPECT_EQ(rounds[0].attempt, 1);
  EXPECT_NE(rounds[0].failure_reason.find("1 update(s) accepted by the deadline; the round needs 2"), std::string::npos)
      << rounds[0].failure_reason;
  // Attempt 2 of round 1 went out to both at the same instant.
  ASSERT_EQ(engine_->state(), EngineState::kCollecting);
  EXPECT_EQ(LastTask(a)->round(), 1u);
  EXPECT_EQ(LastTask(b)->task_id().rfind("r1.2-", 0), 0u) << LastTask(b)->task_id();
  // Both answer this time: the round commits at the last answer, before its deadline.
  Advance(3'000);
  EXPECT_EQ(Upload(a, *LastTask(a)).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  EXPECT_EQ(Upload(b, *LastTask(b)).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  rounds = *Reader()->ListRounds(ExperimentId());
  ASSERT_EQ(rounds.size(), 2u);
  EXPECT_EQ(rounds[1].status, instrumentation::RoundStatus::kCommitted);
  EXPECT_EQ(rounds[1].attempt, 2);
  EXPECT_DOUBLE_EQ(rounds[1].duration_ms, 3'000.0);
}

TEST_F(EngineClockTest, AStragglerWhoseUploadBeganBeforeTheDeadlineIsLateNotDropped) {
  StartEngine(Config());
  TestClient a = Connect("a");
  TestClient b = Connect("b");
  const fl::v1::Task task_b = *LastTask(b);
  EXPECT_EQ(Upload(a, *LastTask(a)).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  Advance(9'000);
  const int64_t b_first_byte = clock_.NowNs();
  ASSERT_TRUE(StartUpload(b, task_b));
  Advance(1'500);  // the deadline passes while b's update is in transit
  EXPECT_EQ(FinishUpload(b, task_b, b_first_byte).outcome(), fl::v1::UPDATE_OUTCOME_LATE);
  auto rounds = *Reader()->ListRounds(ExperimentId());
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].num_accepted, 1);
  EXPECT_EQ(rounds[0].num_late, 1);
  EXPECT_EQ(rounds[0].num_dropped, 0);
  auto rows = *Reader()->ListClientRounds(ExperimentId(), 1);
  std::map<std::string, ClientOutcome> outcome;
  for (const auto& r : rows) outcome[r.client_id] = r.outcome;
  EXPECT_EQ(outcome["a"], ClientOutcome::kOk);
  EXPECT_EQ(outcome["b"], ClientOutcome::kLate);
}

TEST_F(EngineClockTest, AClientSilentForFourHeartbeatIntervalsIsEvictedAndTheEvictionIsRecorded) {
  EngineConfig config = Config();
  config.heartbeat_interval_ms = 1'000;
  config.fit = {1.0, 1, 3};  // no round starts with two clients: only liveness is at play
  StartEngine(config);
  TestClient a = Connect("a");
  TestClient b = Connect("b");
  for (int s = 1; s <= 3; ++s) {
    Advance(1'000);
    Heartbeat(a);
  }
  EXPECT_FALSE(b.channel->closed().has_value()) << "3 s of silence is within four 1 s intervals";
  for (int s = 4; s <= 5; ++s) {
    Advance(1'000);
    Heartbeat(a);
  }
  ASSERT_TRUE(b.channel->closed().has_value()) << "b said nothing for five intervals";
  EXPECT_NE(b.channel->closed()->error_message().find("no heartbeat"), std::string::npos);
  EXPECT_FALSE(a.channel->closed().has_value()) << "a heartbeats every interval";
  auto events = *Reader()->ListClientEvents(ExperimentId());
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].client_id, "b");
  EXPECT_EQ(events[0].kind, ClientEventKind::kSessionClosed);
  EXPECT_NE(events[0].reason.find("no heartbeat for four intervals"), std::string::npos) << events[0].reason;
}

TEST_F(EngineClockTest, TheInitialModelIsAskedOfAnotherClientAfterItsDeadlineAndThatIsRecorded) {
  EngineConfig config = Config();
  config.initial_model_deadline_ms = 2'000;
  StartEngine(config, RoundEngine::StartPoint{});
  ASSERT_EQ(engine_->state(), EngineState::kWaitingForModel);
  TestClient a = Join("a");
  EXPECT_TRUE(a.asked_for_initial_model);
  Open(a);  // ... and never uploads
  TestClient b = Connect("b");
  EXPECT_FALSE(b.asked_for_initial_model) << "a still holds the request";
  Advance(1'999);
  EXPECT_FALSE(a.channel->closed().has_value());
  Advance(1);
  ASSERT_TRUE(a.channel->closed().has_value());
  ASSERT_TRUE(b.channel->closed().has_value()) << "b is told to join again, to receive the request";
  EXPECT_NE(b.channel->closed()->error_message().find("asks this client for the initial model"), std::string::npos);
  TestClient b2 = Join("b");
  EXPECT_TRUE(b2.asked_for_initial_model);
  auto events = *Reader()->ListClientEvents(ExperimentId());
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].client_id, "a");
  EXPECT_EQ(events[0].kind, ClientEventKind::kInitialModelReasked);
  EXPECT_NE(events[0].reason.find("--initial-model-deadline-ms=2000"), std::string::npos) << events[0].reason;
  EXPECT_EQ(engine_->state(), EngineState::kWaitingForModel);
}

TEST_F(EngineClockTest, AStalledUploadLosesItsSlotAfterTheMessageTimeoutAndTheRevocationIsRecorded) {
  EngineConfig config = Config();
  config.upload_message_timeout_ms = 3'000;
  config.upload_min_bytes_per_s = 0;
  StartEngine(config);
  TestClient a = Connect("a");
  TestClient b = Connect("b");
  const fl::v1::Task task_a = *LastTask(a);
  auto handle = std::make_shared<TestUploadHandle>(engine_.get());
  handle->header = Header(a, task_a);
  ASSERT_TRUE(StartUpload(a, task_a, handle));
  handle->bytes = 1000;
  handle->last_ns = clock_.NowNs();
  Advance(2'900);
  EXPECT_FALSE(handle->revoked.has_value());
  Advance(300);  // checked every 100 ms: revoked within one check of the timeout
  ASSERT_TRUE(handle->revoked.has_value());
  EXPECT_EQ(handle->revoked->error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  // The slot is free again: b's upload is admitted at once.
  EXPECT_EQ(Upload(b, *LastTask(b)).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  auto events = *Reader()->ListClientEvents(ExperimentId());
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, ClientEventKind::kUploadRevoked);
  EXPECT_EQ(events[0].client_id, "a");
  EXPECT_EQ(events[0].task_id, task_a.task_id());
  EXPECT_EQ(events[0].round, 1);
  EXPECT_NE(events[0].reason.find("--upload-message-timeout-ms"), std::string::npos) << events[0].reason;
}

TEST_F(EngineClockTest, ImpossibleClockPongsAndUplinkReportsAreRefusedWithARecordedReason) {
  StartEngine(Config());
  TestClient a = Connect("a");
  TestClient b = Connect("b");
  std::optional<fl::v1::ClockPing> ping;
  for (const auto& m : a.channel->sent()) {
    if (m.has_ping()) ping = m.ping();
  }
  ASSERT_TRUE(ping.has_value()) << "a ping goes out when the session opens";
  fl::v1::ClientMessage pong;
  pong.mutable_pong()->set_ping_id(ping->ping_id());
  pong.mutable_pong()->set_received_client_ns(INT64_MAX);
  pong.mutable_pong()->set_sent_client_ns(INT64_MIN);
  Send(a, pong);
  // a's update is accepted; then it reports an uplink that lasted longer than the whole task.
  const fl::v1::Task task_a = *LastTask(a);
  Advance(1'000);
  EXPECT_EQ(Upload(a, task_a).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  fl::v1::ClientMessage status;
  status.mutable_status()->set_task_id(task_a.task_id());
  fl::v1::PhaseTiming* uplink = status.mutable_status()->add_timings();
  uplink->set_phase(fl::v1::PHASE_UPLINK);
  uplink->set_duration_ns(int64_t{3600} * 1'000'000'000);
  Send(a, status);
  auto events = *Reader()->ListClientEvents(ExperimentId());
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].kind, ClientEventKind::kReportRefused);
  EXPECT_NE(events[0].reason.find("clock pong refused"), std::string::npos) << events[0].reason;
  EXPECT_EQ(events[1].kind, ClientEventKind::kReportRefused);
  EXPECT_EQ(events[1].task_id, task_a.task_id());
  EXPECT_NE(events[1].reason.find("uplink report refused"), std::string::npos) << events[1].reason;
  // Neither number reached the round's row.
  Advance(10'000);
  auto rows = *Reader()->ListClientRounds(ExperimentId(), 1);
  for (const auto& r : rows) {
    if (r.client_id != "a") continue;
    EXPECT_FALSE(r.uplink_ms.has_value());
    EXPECT_FALSE(r.clock_offset_ms.has_value());
  }
}

TEST_F(EngineClockTest, EveryStateChangeOfARunIsARowOfTheTransitionTable) {
  struct Watcher : EngineObserver {
    std::vector<EngineTransition>* seen;
    void OnTransition(EngineState from, EngineTrigger on, EngineState to) override {
      seen->push_back({from, on, to, EngineEffect::kNone, ""});
    }
  };
  std::vector<EngineTransition> seen;
  EngineConfig config = Config();
  config.num_rounds = 1;
  config.evaluate_every = 1;
  records_ = *RecordStore::Open(dir_.File("records.db"));
  engine_ = std::make_unique<RoundEngine>(config, records_.get(), InitialModel(1), &clock_);
  auto watcher = std::make_unique<Watcher>();
  watcher->seen = &seen;
  engine_->AddObserver(std::move(watcher));
  ASSERT_TRUE(engine_->StartManual().ok());
  TestClient a = Connect("a");
  TestClient b = Connect("b");
  EXPECT_EQ(Upload(a, *LastTask(a)).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  Advance(10'000);  // b silent: the round commits at the deadline, then the evaluation goes out
  ASSERT_EQ(engine_->state(), EngineState::kEvaluating);
  Advance(60'000);  // nobody evaluates: the evaluation closes at its deadline; the run drains and finishes
  ASSERT_EQ(engine_->state(), EngineState::kFinished);
  ASSERT_TRUE(engine_->result().has_value());
  EXPECT_EQ(engine_->result()->status, instrumentation::ExperimentStatus::kFinished);
  const std::vector<std::pair<EngineState, EngineState>> expected = {
      {EngineState::kWaitingForModel, EngineState::kWaitingForClients},  // the initial model adopted at Start
      {EngineState::kWaitingForClients, EngineState::kCollecting},
      {EngineState::kCollecting, EngineState::kWaitingForClients},
      {EngineState::kWaitingForClients, EngineState::kEvaluating},
      {EngineState::kEvaluating, EngineState::kWaitingForClients},
      {EngineState::kWaitingForClients, EngineState::kDraining},
      {EngineState::kDraining, EngineState::kFinished}};
  ASSERT_EQ(seen.size(), expected.size());
  for (size_t i = 0; i < seen.size(); ++i) {
    EXPECT_EQ(seen[i].from, expected[i].first) << i;
    EXPECT_EQ(seen[i].to, expected[i].second) << i;
    EXPECT_EQ(NextEngineState(seen[i].from, seen[i].on), seen[i].to) << i;
  }
}

TEST(EngineTransitionsTest, OnlyTheTablesRowsAreTransitionsAndEveryLiveStateCanBeShutDown) {
  EXPECT_FALSE(NextEngineState(EngineState::kFinished, EngineTrigger::kRoundStarted).has_value());
  EXPECT_FALSE(NextEngineState(EngineState::kCollecting, EngineTrigger::kRoundStarted).has_value());
  EXPECT_FALSE(NextEngineState(EngineState::kWaitingForModel, EngineTrigger::kRoundCommitted).has_value());
  for (EngineState s : {EngineState::kWaitingForModel, EngineState::kWaitingForClients, EngineState::kCollecting,
                        EngineState::kEvaluating, EngineState::kDraining}) {
    EXPECT_EQ(NextEngineState(s, EngineTrigger::kShutdown), EngineState::kFinished) << EngineStateName(s);
  }
  std::set<std::pair<int, int>> pairs;
  for (const EngineTransition& t : EngineTransitions()) {
    EXPECT_TRUE(pairs.insert({static_cast<int>(t.from), static_cast<int>(t.on)}).second)
        << "two rows for " << EngineStateName(t.from) << " on " << EngineTriggerName(t.on);
  }
}

// docs/round-engine.md shows the transition table; it must be the code's, row for row.
TEST(EngineTransitionsTest, TheDocumentedTableIsTheCodesTable) {
  std::ifstream in(FL_SOURCE_DIR "/docs/round-engine.md");
  ASSERT_TRUE(in.good()) << "docs/round-engine.md";
  std::stringstream text;
  text << in.rdbuf();
  const std::string doc = text.str();
  const size_t begin = doc.find("<!-- transitions: begin -->");
  const size_t end = doc.find("<!-- transitions: end -->");
  ASSERT_NE(begin, std::string::npos) << "the table's begin marker";
  ASSERT_NE(end, std::string::npos) << "the table's end marker";
  std::vector<std::string> documented;
  const std::regex row(R"(^\|\s*`(\w+)`\s*\|\s*`(\w+)`\s*\|\s*`(\w+)`\s*\|\s*`(\w+)`\s*\|\s*(.*?)\s*\|\s*$)");
  std::istringstream lines(doc.substr(begin, end - begin));
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (std::regex_match(line, m, row))
      documented.push_back(
          fl::StrCat(m[1].str(), " ", m[2].str(), " ", m[3].str(), " [", m[4].str(), "]: ", m[5].str()));
  }
  std::vector<std::string> code;
  for (const EngineTransition& t : EngineTransitions()) {
    code.push_back(fl::StrCat(EngineStateName(t.from), " ", EngineTriggerName(t.on), " ", EngineStateName(t.to), " [",
                              EngineEffectName(t.effect), "]: ", t.effects));
  }
  EXPECT_EQ(documented, code);
}

}  // namespace
}  // namespace fl::server
