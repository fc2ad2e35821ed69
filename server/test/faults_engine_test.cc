// Issue 27, "Faults" and the misleading upload answers, on the round engine driven by an injected ManualClock
// (StartManual + RunUntilIdle): every finding is reproduced as the fault-injection harness met it, each event at
// the instant the test puts it, and judged by what the records, the checkpoints and the answers say. No sleep, no
// gRPC, no timing threshold: the clock moves only when the test moves it.
//   - buffered aggregation: an update accepted while the applied step is evaluated is in the next step's model;
//   - a stalled upload after a fast start loses its slot within its recent window, and the round commits;
//   - a server paused 20 s (or 12 s) evicts nobody and keeps its open round (the stall is the server's own);
//   - a round attempt whose tasks all closed early says so, not "by the deadline";
//   - an upload after CancelTask, after a rejoin, after a revocation is told its real reason; a wrong
//     base_model_version is refused naming both versions.
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "fl/core/codec.h"
#include "fl/instrumentation/record_reader.h"
#include "fl/rpc/clock.h"
#include "fl/server/checkpoint.h"
#include "manual_engine.h"

namespace fl::server {
namespace {

using instrumentation::ClientEventKind;
using instrumentation::ClientOutcome;
using instrumentation::RoundStatus;
using test_harness::kParams;
using test_harness::LastCancel;
using test_harness::LastTask;
using test_harness::TestClient;
using test_harness::TrainTasks;

// An upload's progress as the reactor reports it (bytes, time of its last message); Revoke answers like the
// reactor: an UploadDoneEvent with the status as its transfer error, which frees the slot.
class ProgressHandle final : public UploadHandle {
 public:
  explicit ProgressHandle(RoundEngine* engine) : engine_(engine) {}
  uint64_t bytes_received() const override { return bytes; }
  int64_t last_message_ns() const override { return last_ns; }
  void Revoke(const grpc::Status& status) override {
    if (revoked.has_value()) return;
    revoked = status;
    UploadDoneEvent done;
    done.header = header;
    done.transfer_error = status;
    done.handle = self.lock();
    done.reply = [](const fl::v1::UploadUpdateResponse&) {};
    engine_->Post(std::move(done));
  }
  uint64_t bytes = 0;
  int64_t last_ns = 0;
  fl::v1::UpdateHeader header;
  std::optional<grpc::Status> revoked;
  std::weak_ptr<ProgressHandle> self;

 private:
  RoundEngine* engine_;
};

// An upload whose header was posted: admitted (a slot), refused, or still waiting for a slot.
struct PendingAdmission {
  bool admitted = false;
  std::optional<fl::v1::UploadUpdateResponse> refusal;
};

class FaultsEngineTest : public test_harness::ManualEngineTest {
 protected:
  FaultsEngineTest() : ManualEngineTest("fl_faults_engine") {}

  // Synchronous rounds: both clients selected, a round needs both updates; nobody evicted within a round unless
  // the test says so.
  EngineConfig Config() {
    EngineConfig c = test_harness::SmallConfig(dir_.File("ckpt"));
    c.num_rounds = 2;
    c.fit = {1.0, 2, 2};
    c.evaluate_every = 0;
    c.round_deadline_ms = 8'000;
    c.heartbeat_interval_ms = 5'000;
    c.print_table = false;
    return c;
  }

  static fl::v1::UpdateHeader Header(const TestClient& c, const fl::v1::Task& task, uint64_t examples = 10) {
    return test_harness::DeltaHeader(c.id, c.token, task, examples);
  }

  fl::v1::UploadUpdateResponse Upload(const TestClient& c, const fl::v1::Task& task, float value = 0.001f,
                                      uint64_t examples = 10) {
    const int64_t first = clock_.NowNs();
    if (auto refused = StartUpload(Header(c, task, examples)); refused.has_value()) return *refused;
    return FinishUpload(Header(c, task, examples), Fp32Delta(value), first);
  }

  // Posts an upload's header without running the loop; `admission` tells what became of it.
  void PostUploadStart(const fl::v1::UpdateHeader& header, std::shared_ptr<PendingAdmission> admission,
                       std::shared_ptr<UploadHandle> handle = nullptr) {
    engine_->Post(UploadStartEvent{header, clock_.NowNs(),
                                   [admission](std::optional<fl::v1::UploadUpdateResponse> r, std::vector<uint8_t>) {
                                     admission->admitted = !r.has_value();
                                     admission->refusal = std::move(r);
                                   },
                                   std::move(handle), "test"});
  }

  // Posts a finished upload stamped `done_ns` (when the reactor saw its trailer) without running the loop.
  void PostUploadDone(const fl::v1::UpdateHeader& header, int64_t first_ns, int64_t done_ns,
                      std::shared_ptr<std::optional<fl::v1::UploadUpdateResponse>> verdict) {
    UploadDoneEvent done;
    done.header = header;
    done.payload = Fp32Delta(0.001f);
    done.first_byte_server_ns = first_ns;
    done.done_server_ns = done_ns;
    done.reply = [verdict](const fl::v1::UploadUpdateResponse& r) { *verdict = r; };
    engine_->Post(std::move(done));
  }

  // A session message as the reactor posts it, stamped `received_ns`, without running the loop.
  void PostHeartbeat(const TestClient& c, int64_t received_ns) {
    fl::v1::ClientMessage m;
    m.mutable_heartbeat()->set_state(fl::v1::CLIENT_STATE_TRAINING);
    engine_->Post(SessionMessageEvent{c.channel, std::move(m), received_ns});
  }

  // Healthy time: `ms` pass in steps of 100 ms, the loop running at each (its timers on time).
  void Pass(int64_t ms) {
    for (int64_t t = 0; t < ms; t += 100) Advance(100);
  }

  std::vector<instrumentation::ClientEventRecord> Events() { return *Reader()->ListClientEvents(ExperimentId()); }
  std::vector<instrumentation::RoundRecord> Rounds() { return *Reader()->ListRounds(ExperimentId()); }
};

// ---- Buffered aggregation: every accepted update is in exactly one step's model ----

TEST_F(FaultsEngineTest, BufferedUpdatesAcceptedWhileTheAppliedStepIsEvaluatedAreInTheNextStepsModel) {
  EngineConfig config = test_harness::SmallConfig(dir_.File("ckpt"));
  config.aggregation = "buffered";
  config.fit = {1.0, 1, 4};
  config.buffer_size = 2;
  config.concurrency = 3;
  config.max_staleness = 5;
  config.staleness_weight = "constant";  // equal weights: the step's aggregate is the plain mean of its updates
  config.num_rounds = 3;
  config.evaluate_every = 1;
  config.fraction_evaluate = 0.5;  // two idle clients are enough to evaluate, while the other two still train
  config.round_deadline_ms = 10'000;
  config.heartbeat_interval_ms = 60'000;
  config.print_table = false;
  StartEngine(config);
  std::vector<TestClient> clients;
  for (const char* name : {"a", "b", "c", "d"}) clients.push_back(Connect(name));
  std::map<std::string, bool> answered;
  auto open_task = [&](const TestClient& c) -> std::optional<fl::v1::Task> {
    auto tasks = TrainTasks(c);
    if (tasks.empty() || answered[tasks.back().task_id()]) return std::nullopt;
    return tasks.back();
  };
  auto upload = [&](TestClient& c, float value) {
    const fl::v1::Task task = *open_task(c);
    answered[task.task_id()] = true;
    return Upload(c, task, value).outcome();
  };
  auto training = [&] {
    std::vector<TestClient*> out;
    for (TestClient& c : clients) {
      if (open_task(c).has_value()) out.push_back(&c);
    }
    return out;
  };
  // Step 1: the first two updates (the fourth client takes the first one's place).
  ASSERT_EQ(training().size(), 3u);
  ASSERT_EQ(upload(*training()[0], 0.1f), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  ASSERT_EQ(upload(*training()[0], 0.1f), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  ASSERT_EQ(Rounds().size(), 1u);
  auto step1 = LoadCheckpoint(CheckpointPath(dir_.File("ckpt"), 1));
  ASSERT_TRUE(step1.ok()) << step1.status();
  // Step 1 is being evaluated by the two idle clients while the other two still train from version 0.
  ASSERT_EQ(engine_->state(), EngineState::kEvaluating);
  std::vector<TestClient*> still = training();
  ASSERT_EQ(still.size(), 2u);
  // Both updates arrive during the evaluation: accepted into the buffer of step 2.
  ASSERT_EQ(upload(*still[0], 0.3f), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  ASSERT_EQ(upload(*still[1], 0.5f), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  ASSERT_EQ(Rounds().size(), 1u) << "step 2 waits for the evaluation";
  for (TestClient& c : clients) {
    std::optional<fl::v1::Task> eval;
    for (const auto& m : c.channel->sent()) {
      if (m.has_task() && m.task().kind() == fl::v1::TASK_KIND_EVALUATE) eval = m.task();
    }
    if (!eval.has_value()) continue;
    fl::v1::ClientMessage m;
    m.mutable_evaluation()->set_task_id(eval->task_id());
    m.mutable_evaluation()->set_num_examples(10);
    m.mutable_evaluation()->set_loss(0.5);
    m.mutable_evaluation()->set_accuracy(0.75);
    engine_->Post(SessionMessageEvent{c.channel, std::move(m), clock_.NowNs()});
    Run();
  }
  // Step 2 is applied after the evaluation with both updates: its records say two ok rows, and its model moved by
  // their mean (0.4), not by one of them.
  auto rounds = Rounds();
  ASSERT_GE(rounds.size(), 2u);
  EXPECT_EQ(rounds[1].num_accepted, 2);
  auto rows = RowsOfRound(2);
  ASSERT_EQ(rows.size(), 2u);
  for (const auto& [id, row] : rows) {
    EXPECT_EQ(row.outcome, ClientOutcome::kOk) << id;
    EXPECT_EQ(row.staleness, 1) << id;
  }
  auto step2 = LoadCheckpoint(CheckpointPath(dir_.File("ckpt"), 2));
  ASSERT_TRUE(step2.ok()) << step2.status();
  for (size_t i : {size_t{0}, size_t{kParams / 2}, size_t{kParams - 1}}) {
    EXPECT_NEAR(step2->values[i], step1->values[i] - 0.4f, 1e-6)
        << "element " << i << ": the step's model must hold both updates its records say it applied";
  }
}

// ---- A stalled upload: revoked within its recent window; the slot goes to the clients waiting for it ----

TEST_F(FaultsEngineTest, AnUploadThatStallsAfterAFastStartLosesItsSlotAndTheWaitingUpdatesCommitTheRound) {
  EngineConfig config = Config();
  config.fit = {1.0, 2, 3};
  config.upload_slots = 1;
  config.upload_message_timeout_ms = 30'000;  // the default: far beyond the round's 8 s
  // The test's model is 20 KB: 1 KB/s plays the part of the default 4 KB/s for the finding's 32 MB update (half of
  // it at a fast start keeps the average above the minimum until long after the round).
  config.upload_min_bytes_per_s = 1'000;
  StartEngine(config);
  TestClient a = Connect("a"), b = Connect("b"), c = Connect("c");
  ASSERT_EQ(engine_->state(), EngineState::kCollecting);
  const fl::v1::Task task_a = *LastTask(a);
  const fl::v1::UpdateHeader header_a = Header(a, task_a);
  Pass(500);
  // a gets the slot and sends half of its update fast, then nothing more (its link died, it was stopped).
  auto handle = std::make_shared<ProgressHandle>(engine_.get());
  handle->self = handle;
  handle->header = header_a;
  auto admission_a = std::make_shared<PendingAdmission>();
  PostUploadStart(header_a, admission_a, handle);
  Run();
  ASSERT_TRUE(admission_a->admitted);
  const uint64_t half = header_a.payload_bytes() / 2;
  for (int i = 1; i <= 5; ++i) {
    Advance(100);
    handle->bytes = half * i / 5;
    handle->last_ns = clock_.NowNs();
  }
  // b and c finished training at 1.8 s: their uploads wait for the slot.
  Pass(800);
  auto admission_b = std::make_shared<PendingAdmission>(), admission_c = std::make_shared<PendingAdmission>();
  const int64_t first_b = clock_.NowNs();
  PostUploadStart(Header(b, *LastTask(b)), admission_b);
  PostUploadStart(Header(c, *LastTask(c)), admission_c);
  Run();
  ASSERT_FALSE(admission_b->admitted || admission_b->refusal.has_value()) << "the one slot is a's";
  // Time passes in 100 ms steps up to the deadline; whoever gets the slot sends its update at once.
  std::optional<fl::v1::UploadUpdateResponse> verdict_b, verdict_c;
  const int64_t deadline = first_b + int64_t{6'200} * 1'000'000;
  while (clock_.NowNs() < deadline && !(verdict_b.has_value() && verdict_c.has_value())) {
    Advance(100);
    if (admission_b->admitted && !verdict_b.has_value()) {
      verdict_b = FinishUpload(Header(b, *LastTask(b)), Fp32Delta(0.001f), first_b);
    }
    if (admission_c->admitted && !verdict_c.has_value()) {
      verdict_c = FinishUpload(Header(c, *LastTask(c)), Fp32Delta(0.001f), first_b);
    }
  }
  ASSERT_TRUE(handle->revoked.has_value()) << "a's stalled upload kept its slot to the round's deadline";
  EXPECT_EQ(handle->revoked->error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(handle->revoked->error_message().find("over its most recent window: it stalled"), std::string::npos)
      << handle->revoked->error_message();
  ASSERT_TRUE(verdict_b.has_value() && verdict_c.has_value()) << "the waiting uploads never got the slot";
  EXPECT_EQ(verdict_b->outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  EXPECT_EQ(verdict_c->outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  Pass(3'000);  // a's task is still open (it may send again): the round commits at its deadline with b and c
  auto rounds = Rounds();
  ASSERT_GE(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].status, RoundStatus::kCommitted) << rounds[0].failure_reason;
  EXPECT_EQ(rounds[0].num_accepted, 2);
  auto events = Events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, ClientEventKind::kUploadRevoked);
  EXPECT_EQ(events[0].client_id, "a");
  EXPECT_NE(events[0].reason.find("--upload-min-bytes-per-s"), std::string::npos) << events[0].reason;

  // a sends its update again after the round closed: it is told why it is late, revocation included, not only
  // "the deadline has passed".
  std::optional<fl::v1::UploadUpdateResponse> again = StartUpload(header_a);
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->outcome(), fl::v1::UPDATE_OUTCOME_LATE);
  EXPECT_NE(again->error().message().find("an earlier upload of it lost its slot"), std::string::npos)
      << again->error().message();
  EXPECT_NE(again->error().message().find("it stalled"), std::string::npos) << again->error().message();
}

// ---- The server's own stall: nobody is blamed for it ----

TEST_F(FaultsEngineTest, AServerPausedFor20SecondsEvictsNobodyAndKeepsItsOpenRound) {
  EngineConfig config = Config();
  config.stall_threshold_ms = 2'000;  // what fl-server uses on its real clock
  config.max_round_attempts = 100;    // the rounds after the first fail (nobody uploads): the run goes on
  StartEngine(config);
  TestClient a = Connect("a"), b = Connect("b");
  ASSERT_EQ(engine_->state(), EngineState::kCollecting);
  for (int s = 1; s <= 3; ++s) {
    Pass(1'000);
    PostHeartbeat(a, clock_.NowNs());
    PostHeartbeat(b, clock_.NowNs());
    Run();
  }
  Pass(1'000);
  // SIGSTOP for 20 s: nothing of the server runs. When it resumes, its loop turns before the reactors have read
  // what arrived meanwhile: the heartbeat check and the round deadline (8 s) are long due.
  clock_.AdvanceMs(20'000);
  Run();
  // Then the reactors read the sockets: the heartbeats and the updates sent during the pause.
  PostHeartbeat(a, clock_.NowNs());
  PostHeartbeat(b, clock_.NowNs());
  Run();
  EXPECT_EQ(Upload(a, *LastTask(a)).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  EXPECT_EQ(Upload(b, *LastTask(b)).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  EXPECT_FALSE(a.channel->closed().has_value()) << a.channel->closed()->error_message();
  EXPECT_FALSE(b.channel->closed().has_value()) << b.channel->closed()->error_message();
  auto rounds = Rounds();
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].status, RoundStatus::kCommitted) << rounds[0].failure_reason;
  EXPECT_EQ(rounds[0].attempt, 1);
  EXPECT_EQ(rounds[0].num_accepted, 2);
  EXPECT_TRUE(Events().empty()) << Events()[0].reason;
  // Liveness goes on as before: silent after the pause, a client is evicted four intervals later.
  for (int s = 1; s <= 5; ++s) {
    Pass(5'000);
    PostHeartbeat(a, clock_.NowNs());
    Run();
  }
  EXPECT_FALSE(a.channel->closed().has_value());
  ASSERT_TRUE(b.channel->closed().has_value()) << "b said nothing for 25 s after the pause";
}

TEST_F(FaultsEngineTest, AServerPaused12SecondsWithEventsQueuedKeepsItsOpenRound) {
  EngineConfig config = Config();
  config.stall_threshold_ms = 2'000;
  StartEngine(config);
  TestClient a = Connect("a"), b = Connect("b");
  const fl::v1::Task task_a = *LastTask(a);
  Pass(5'000);
  const int64_t first_a = clock_.NowNs();
  ASSERT_FALSE(StartUpload(Header(a, task_a)).has_value());
  Pass(200);
  // a's update and b's heartbeat reached the reactors just before the pause: posted, not yet handled.
  auto verdict_a = std::make_shared<std::optional<fl::v1::UploadUpdateResponse>>();
  PostUploadDone(Header(a, task_a), first_a, clock_.NowNs(), verdict_a);
  PostHeartbeat(b, clock_.NowNs());
  clock_.AdvanceMs(12'000);  // paused past the round's 8 s deadline
  Run();
  ASSERT_TRUE(verdict_a->has_value());
  EXPECT_EQ((*verdict_a)->outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  // b's update, sent during the pause, is read after it.
  EXPECT_EQ(Upload(b, *LastTask(b)).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  auto rounds = Rounds();
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].status, RoundStatus::kCommitted) << rounds[0].failure_reason;
  EXPECT_EQ(rounds[0].num_accepted, 2);
  EXPECT_EQ(rounds[0].num_dropped, 0);
  EXPECT_FALSE(a.channel->closed().has_value());
  EXPECT_FALSE(b.channel->closed().has_value());
}

TEST_F(FaultsEngineTest, WithoutAStallTheDeadlinesAreAsBefore) {
  EngineConfig config = Config();
  config.stall_threshold_ms = 2'000;
  StartEngine(config);
  TestClient a = Connect("a"), b = Connect("b");
  ASSERT_EQ(Upload(a, *LastTask(a)).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  Pass(7'900);
  EXPECT_TRUE(Rounds().empty());
  Pass(100);  // the 8 s deadline, on a server that ran all along: b's task is dropped, the attempt fails
  auto rounds = Rounds();
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].status, RoundStatus::kFailed);
  EXPECT_EQ(rounds[0].num_dropped, 1);
}

// ---- An attempt that closed early says so ----

TEST_F(FaultsEngineTest, AnAttemptWhoseTasksAllClosedBeforeTheDeadlineSaysSo) {
  StartEngine(Config());
  TestClient a = Connect("a"), b = Connect("b");
  Pass(1'800);
  ASSERT_EQ(Upload(a, *LastTask(a)).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  fl::v1::ClientMessage failed;
  failed.mutable_status()->set_task_id(LastTask(b)->task_id());
  failed.mutable_status()->set_state(fl::v1::CLIENT_STATE_FAILED);
  failed.mutable_status()->mutable_error()->set_message("out of memory");
  engine_->Post(SessionMessageEvent{b.channel, failed, clock_.NowNs()});
  Run();
  auto rounds = Rounds();
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].status, RoundStatus::kFailed);
  EXPECT_EQ(rounds[0].failure_reason,
            "every task closed 1.8 s into the round, 6.2 s before its deadline, with 1 update(s) accepted; the round "
            "needs 2 (0 late, 0 rejected, 1 dropped)");
}

// ---- Answers that say the real reason ----

TEST_F(FaultsEngineTest, AnUploadAfterCancelTaskIsToldItWasCancelled) {
  EngineConfig config = Config();
  config.fit = {0.5, 1, 2};
  config.overcommit = 2.0;  // K = 1 of 2 selected: the first update commits, the other task is cancelled
  StartEngine(config);
  TestClient a = Connect("a"), b = Connect("b");
  const fl::v1::Task task_a = *LastTask(a), task_b = *LastTask(b);
  Pass(1'000);
  ASSERT_EQ(Upload(a, task_a).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  auto cancel = LastCancel(b);
  ASSERT_TRUE(cancel.has_value());
  ASSERT_EQ(cancel->task_id(), task_b.task_id());
  // b uploads anyway (the cancel crossed its upload, or it ignores cancels): the round has not reached any deadline.
  std::optional<fl::v1::UploadUpdateResponse> refused = StartUpload(Header(b, task_b));
  ASSERT_TRUE(refused.has_value());
  EXPECT_NE(refused->error().message().find("was cancelled: round 1 committed with its first 1 updates"),
            std::string::npos)
      << refused->error().message();
  EXPECT_EQ(refused->error().message().find("deadline"), std::string::npos) << refused->error().message();
}

TEST_F(FaultsEngineTest, AnUploadForATaskDroppedByARejoinIsToldSo) {
  StartEngine(Config());
  TestClient a = Connect("a"), b = Connect("b");
  const fl::v1::Task old_task = *LastTask(a);
  // a joins again on another link with its session's token (fl-client after a reconnect): its old session and
  // its open task are given up.
  fl::v1::JoinRequest req;
  req.set_protocol_version(fl::v1::PROTOCOL_VERSION_3);
  req.set_client_name("a");
  req.set_session_token(a.token);
  req.mutable_link()->set_kind(fl::v1::LINK_KIND_5G);
  req.set_num_train_examples(100);
  req.set_num_test_examples(10);
  *req.mutable_model_spec() = proto::ToProto(client::SyntheticTrainer(kParams, 10, 1).spec(), "synthetic");
  TestClient again;
  again.id = "a";
  engine_->Post(JoinEvent{req, "test",
                          [&](const grpc::Status& s, const fl::v1::JoinResponse& r) {
                            ASSERT_TRUE(s.ok()) << s.error_message();
                            again.token = r.session_token();
                          },
                          ""});
  Run();
  ASSERT_FALSE(again.token.empty());
  Open(again);
  // The update of the old task, sent with the new session's token.
  std::optional<fl::v1::UploadUpdateResponse> refused = StartUpload(Header(again, old_task));
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->outcome(), fl::v1::UPDATE_OUTCOME_REJECTED);
  EXPECT_EQ(refused->error().code(), fl::v1::ERROR_CODE_WRONG_ROUND);
  EXPECT_NE(refused->error().message().find("was closed before this upload (dropped): the client rejoined"),
            std::string::npos)
      << refused->error().message();
  EXPECT_EQ(refused->error().message().find("deadline"), std::string::npos) << refused->error().message();
}

TEST_F(FaultsEngineTest, AnUpdateClaimingAnotherBaseModelVersionIsRefusedNamingBoth) {
  StartEngine(Config());
  TestClient a = Connect("a"), b = Connect("b");
  const fl::v1::Task task_a = *LastTask(a);
  ASSERT_EQ(task_a.model_version(), 0u);
  fl::v1::UpdateHeader wrong = Header(a, task_a);
  wrong.set_base_model_version(7);
  std::optional<fl::v1::UploadUpdateResponse> refused = StartUpload(wrong);
  ASSERT_TRUE(refused.has_value()) << "an update of model version 7 was admitted for a task of version 0";
  EXPECT_EQ(refused->outcome(), fl::v1::UPDATE_OUTCOME_REJECTED);
  EXPECT_EQ(refused->error().code(), fl::v1::ERROR_CODE_WRONG_ROUND);
  EXPECT_EQ(refused->error().field(), "base_model_version");
  EXPECT_NE(refused->error().message().find("trained from model version 7 but task '" + task_a.task_id() +
                                            "' gave model version 0"),
            std::string::npos)
      << refused->error().message();
  // Refused like a wrong round: the task stays open, and the right header is admitted.
  EXPECT_EQ(Upload(a, task_a).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  EXPECT_EQ(Upload(b, *LastTask(b)).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  // Round 2's tasks carry version 1: an update claiming the initial version is refused too.
  const fl::v1::Task task2 = *LastTask(a);
  ASSERT_EQ(task2.round(), 2u);
  ASSERT_EQ(task2.model_version(), 1u);
  fl::v1::UpdateHeader stale = Header(a, task2);
  stale.set_base_model_version(0);
  refused = StartUpload(stale);
  ASSERT_TRUE(refused.has_value());
  EXPECT_NE(refused->error().message().find("trained from model version 0"), std::string::npos)
      << refused->error().message();
}

}  // namespace
}  // namespace fl::server
