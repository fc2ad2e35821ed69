// The coordinator's deadlines, retries and late joins, driven deterministically: the coordinator's loop runs on
// the test's thread (own_thread = false, RunUntilIdle) on a ManualClock, and the islands are events the test
// posts (no gRPC, no threads, no sleeps). Each deadline is checked on both sides of its boundary, to the
// nanosecond, and every test asserts the exact transitions the state machines went through.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "fl/core/str_cat.h"
#include "fl/diloco/coord/coordinator.h"
#include "fl/rpc/clock.h"

namespace fl::diloco {
namespace {

constexpr uint64_t kFingerprint = 0x1234abcd5678ef90ULL;

template <class Response>
struct Answer {
  bool answered = false;
  grpc::Status status;
  Response response;
};

template <class Response>
Reply<Response> Into(const std::shared_ptr<Answer<Response>>& answer) {
  return [answer](const grpc::Status& status, const Response& response) {
    EXPECT_FALSE(answer->answered) << "a call answered twice";
    answer->answered = true;
    answer->status = status;
    answer->response = response;
  };
}

class FakeSession final : public IslandSession {
 public:
  void Send(const fl::v1::IslandDown& message) override { sent.push_back(message); }
  void Close(const grpc::Status& status) override {
    if (!closed.has_value()) closed = status;
  }
  std::vector<fl::v1::IslandDown> sent;
  std::optional<grpc::Status> closed;
};

// Every transition of every machine, as "island b: active --heartbeat_lost--> gone".
class TransitionLog final : public CoordinatorObserver {
 public:
  void OnRun(const RunChange& c) override {
    lines.push_back(fl::StrCat("run: ", Name(c.from), " --", Name(c.trigger), "--> ", Name(c.to)));
  }
  void OnIsland(const IslandChange& c) override {
    lines.push_back(
        fl::StrCat("island ", c.island.island_id, ": ", Name(c.from), " --", Name(c.trigger), "--> ", Name(c.to)));
    if (!c.reason.empty()) reasons.push_back(fl::StrCat(c.island.island_id, ": ", c.reason));
  }
  void OnSync(const SyncChange& c) override {
    lines.push_back(fl::StrCat("sync ", c.key.step, "/", c.key.fragment, ": ", Name(c.from), " --", Name(c.trigger),
                               "--> ", Name(c.to)));
    if (c.trigger == SyncTrigger::kBarrierComplete) barrier_ms.push_back(c.epoch->barrier_ms);
  }
  // The lines about `subject` ("island b", "sync 0/0", "run"), in order.
  std::vector<std::string> Of(const std::string& subject) const {
    std::vector<std::string> out;
    for (const std::string& l : lines) {
      if (l.rfind(subject + ":", 0) == 0) out.push_back(l.substr(subject.size() + 2));
    }
    return out;
  }
  std::vector<std::string> lines;
  std::vector<std::string> reasons;
  std::vector<double> barrier_ms;
};

struct TestIsland {
  std::string id;
  std::string token;
  uint64_t join_seq = 0;
  std::shared_ptr<FakeSession> session = std::make_shared<FakeSession>();
};

CoordinatorOptions Options() {
  CoordinatorOptions o;
  o.experiment_id = "deadlines";
  o.schedule.inner_steps = 4;
  o.heartbeat_interval_ms = 1000;
  o.heartbeat_timeout_ms = 3000;
  o.barrier_timeout_ms = 10000;
  o.report_timeout_ms = 20000;
  o.blame_grace_ms = 2000;
  o.max_sync_attempts = 3;
  return o;
}

class Driver {
 public:
  explicit Driver(CoordinatorOptions o) {
    o.clock = &clock;
    o.own_thread = false;
    o.observers = {&log};
    auto c = Coordinator::Create(std::move(o), nullptr, nullptr);
    EXPECT_TRUE(c.ok()) << c.status();
    coordinator = std::move(*c);
  }

  void AdvanceMs(int64_t ms) {
    clock.AdvanceMs(ms);
    coordinator->RunUntilIdle();
  }
  void AdvanceNs(int64_t ns) {
    clock.AdvanceNs(ns);
    coordinator->RunUntilIdle();
  }

  std::shared_ptr<Answer<fl::v1::IslandJoinResponse>> PostJoin(const std::string& id) {
    fl::v1::IslandJoinRequest r;
    r.set_protocol_version(1);
    r.set_island_id(id);
    r.set_data_endpoint(fl::StrCat("ipc:///tmp/fl-deadlines-", id));
    r.set_state_endpoint(fl::StrCat("state-", id, ":1"));
    r.set_num_ranks(1);
    r.set_model_fingerprint(kFingerprint);
    auto answer = std::make_shared<Answer<fl::v1::IslandJoinResponse>>();
    coordinator->Post(JoinEvent{r, Into(answer)});
    coordinator->RunUntilIdle();
    return answer;
  }
  // The answered Join's island, with its session opened.
  TestIsland Opened(const std::string& id, const Answer<fl::v1::IslandJoinResponse>& join) {
    EXPECT_TRUE(join.answered && join.status.ok()) << id << ": " << join.status.error_message();
    TestIsland island{id, join.response.session_token(), join.response.join_seq()};
    fl::v1::IslandHello hello;
    hello.set_island_id(id);
    hello.set_session_token(island.token);
    coordinator->Post(SessionOpenedEvent{hello, island.session});
    coordinator->RunUntilIdle();
    return island;
  }
  TestIsland Admit(const std::string& id) { return Opened(id, *PostJoin(id)); }

  void Heartbeat(const TestIsland& island) {
    coordinator->Post(HeartbeatEvent{island.id, island.token});
    coordinator->RunUntilIdle();
  }

  std::shared_ptr<Answer<fl::v1::BeginSyncResponse>> BeginSync(const TestIsland& island, SyncKey key) {
    fl::v1::BeginSyncRequest r;
    r.set_island_id(island.id);
    r.set_session_token(island.token);
    r.mutable_key()->set_step(key.step);
    r.mutable_key()->set_fragment(key.fragment);
    auto answer = std::make_shared<Answer<fl::v1::BeginSyncResponse>>();
    coordinator->Post(BeginSyncEvent{r, Into(answer)});
    coordinator->RunUntilIdle();
    return answer;
  }

  std::shared_ptr<Answer<fl::v1::SyncVerdict>> Done(const TestIsland& island, const fl::v1::BeginSyncResponse& plan,
                                                    uint64_t hash) {
    fl::v1::SyncDoneRequest r;
    r.set_island_id(island.id);
    r.set_session_token(island.token);
    r.set_epoch(plan.epoch());
    *r.mutable_key() = plan.key();
    r.set_state_hash(hash);
    auto answer = std::make_shared<Answer<fl::v1::SyncVerdict>>();
    coordinator->Post(SyncDoneEvent{r, Into(answer)});
    coordinator->RunUntilIdle();
    return answer;
  }

  std::shared_ptr<Answer<fl::v1::SyncVerdict>> Failed(const TestIsland& island, const fl::v1::BeginSyncResponse& plan,
                                                      const std::string& vanished = "") {
    fl::v1::SyncFailedRequest r;
    r.set_island_id(island.id);
    r.set_session_token(island.token);
    r.set_epoch(plan.epoch());
    *r.mutable_key() = plan.key();
    r.set_reason("ring broke");
    r.set_vanished_island_id(vanished);
    auto answer = std::make_shared<Answer<fl::v1::SyncVerdict>>();
    coordinator->Post(SyncFailedEvent{r, Into(answer)});
    coordinator->RunUntilIdle();
    return answer;
  }

  std::shared_ptr<Answer<fl::v1::StateLoadedResponse>> StateLoaded(const TestIsland& island, SyncKey key,
                                                                   uint64_t hash) {
    fl::v1::StateLoadedRequest r;
    r.set_island_id(island.id);
    r.set_session_token(island.token);
    r.mutable_key()->set_step(key.step);
    r.mutable_key()->set_fragment(key.fragment);
    r.set_state_hash(hash);
    auto answer = std::make_shared<Answer<fl::v1::StateLoadedResponse>>();
    coordinator->Post(StateLoadedEvent{r, Into(answer)});
    coordinator->RunUntilIdle();
    return answer;
  }

  // Every island in `islands` begins `key`; all are answered with the same epoch.
  std::vector<fl::v1::BeginSyncResponse> Barrier(const std::vector<const TestIsland*>& islands, SyncKey key) {
    std::vector<std::shared_ptr<Answer<fl::v1::BeginSyncResponse>>> answers;
    for (const TestIsland* island : islands) answers.push_back(BeginSync(*island, key));
    std::vector<fl::v1::BeginSyncResponse> plans;
    for (const auto& a : answers) {
      EXPECT_TRUE(a->answered && a->status.ok()) << a->status.error_message();
      plans.push_back(a->response);
    }
    return plans;
  }

  rpc::ManualClock clock;
  TransitionLog log;
  std::unique_ptr<Coordinator> coordinator;  // last: destroyed (shut down) first
};

std::vector<std::string> Members(const fl::v1::BeginSyncResponse& plan) {
  std::vector<std::string> ids;
  for (const auto& m : plan.members()) ids.push_back(m.island_id());
  return ids;
}

bool TellsToRejoin(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::ABORTED || s.error_code() == grpc::StatusCode::UNAUTHENTICATED;
}

TEST(DeadlinesTest, AnIslandWithoutHeartbeatsIsEvictedExactlyAfterTheTimeoutAndAHeartbeatMovesTheDeadline) {
  Driver d(Options());
  TestIsland a = d.Admit("a");
  TestIsland b = d.Admit("b");
  d.AdvanceMs(2000);
  d.Heartbeat(a);  // a's deadline moves to 2000 + 3000 ms; b's stays at 3000 ms
  d.AdvanceMs(1000);
  EXPECT_EQ(d.coordinator->Snapshot().members, (std::vector<std::string>{"a", "b"}))
      << "3000 ms without a heartbeat is not more than --heartbeat-timeout-ms";
  d.AdvanceNs(1);
  EXPECT_EQ(d.coordinator->Snapshot().members, std::vector<std::string>{"a"});
  EXPECT_EQ(d.log.Of("island b"),
            (std::vector<std::string>{"waiting --admitted--> active", "active --heartbeat_lost--> gone"}));
  ASSERT_EQ(b.session->sent.size(), 1u);
  EXPECT_EQ(b.session->sent[0].evicted().reason(), "no heartbeat for 3000 ms");
  ASSERT_TRUE(b.session->closed.has_value());
  EXPECT_TRUE(b.session->closed->ok());
  EXPECT_EQ(d.coordinator->Snapshot().evictions, 1u);

  d.AdvanceMs(2000);  // now 5000 ms + 1 ns: a heard from at 2000 ms, 3000 ms + 1 ns ago
  EXPECT_EQ(d.coordinator->Snapshot().members, std::vector<std::string>{}) << "a's deadline was 5000 ms";
  EXPECT_EQ(d.log.Of("island a").back(), "active --heartbeat_lost--> gone");

  // An evicted island's calls tell it to rejoin.
  auto late = d.BeginSync(b, {0, 0});
  ASSERT_TRUE(late->answered);
  EXPECT_TRUE(TellsToRejoin(late->status)) << late->status.error_message();
}

TEST(DeadlinesTest, TheBarrierEvictsTheIslandsThatDidNotArriveWithinItsTimeoutAndFormsWithoutThem) {
  CoordinatorOptions o = Options();
  o.heartbeat_timeout_ms = 600000;  // only the barrier's deadline matters here
  Driver d(o);
  TestIsland a = d.Admit("a");
  TestIsland b = d.Admit("b");
  TestIsland c = d.Admit("c");
  auto pa = d.BeginSync(a, {0, 0});
  d.AdvanceMs(4000);
  auto pb = d.BeginSync(b, {0, 0});  // the deadline counts from the first arrival, not the last
  d.AdvanceMs(6000);
  EXPECT_FALSE(pa->answered || pb->answered) << "exactly --barrier-timeout-ms after the first arrival: still waiting";
  d.AdvanceNs(1);
  ASSERT_TRUE(pa->answered && pb->answered);
  EXPECT_TRUE(pa->status.ok()) << pa->status.error_message();
  EXPECT_EQ(Members(pa->response), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(Members(pb->response), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(pa->response.epoch(), pb->response.epoch());
  EXPECT_EQ(pa->response.attempt(), 0u);
  ASSERT_EQ(d.log.barrier_ms.size(), 1u);
  EXPECT_NEAR(d.log.barrier_ms[0], 10000.0, 1e-3);
  EXPECT_EQ(d.log.Of("island c").back(), "active --missed_barrier--> gone");
  EXPECT_EQ(d.log.Of("sync 0/0"), (std::vector<std::string>{"idle --first_arrival--> gathering",
                                                            "gathering --barrier_complete--> exchanging"}));
  ASSERT_FALSE(c.session->sent.empty());
  EXPECT_NE(c.session->sent.back().evicted().reason().find("did not reach the barrier of sync (step 0, fragment 0)"),
            std::string::npos);
  EXPECT_TRUE(TellsToRejoin(d.BeginSync(c, {0, 0})->status));
}

TEST(DeadlinesTest, MembersSilentPastTheReportDeadlineAreEvictedAndTheEpochCommitsWithTheOthers) {
  CoordinatorOptions o = Options();
  o.heartbeat_timeout_ms = 600000;
  Driver d(o);
  TestIsland a = d.Admit("a");
  TestIsland b = d.Admit("b");
  TestIsland c = d.Admit("c");
  auto plans = d.Barrier({&a, &b, &c}, {0, 0});
  d.AdvanceMs(7000);  // the report deadline counts from the epoch's first report, not from its forming
  auto va = d.Done(a, plans[0], 42);
  d.AdvanceMs(20000);
  EXPECT_FALSE(va->answered) << "exactly --report-timeout-ms after the first report: still waiting";
  d.AdvanceNs(1);
  ASSERT_TRUE(va->answered);
  EXPECT_TRUE(va->status.ok()) << va->status.error_message();
  EXPECT_EQ(va->response.kind(), fl::v1::SYNC_VERDICT_KIND_COMMIT);
  EXPECT_EQ(va->response.majority_hash(), 42u);
  EXPECT_EQ(d.log.Of("island b").back(), "active --missed_report--> gone");
  EXPECT_EQ(d.log.Of("island c").back(), "active --missed_report--> gone");
  EXPECT_EQ(d.log.Of("sync 0/0").back(), "exchanging --majority_applied--> committed");
  const CoordinatorSnapshot snap = d.coordinator->Snapshot();
  EXPECT_EQ(snap.members, std::vector<std::string>{"a"});
  ASSERT_TRUE(snap.last_committed.has_value());
  EXPECT_EQ(*snap.last_committed, (SyncKey{0, 0}));
}

TEST(DeadlinesTest, ABlamedIslandSilentForTheGraceIsEvictedAndTheSyncIsRetriedWithoutIt) {
  CoordinatorOptions o = Options();
  o.heartbeat_timeout_ms = 600000;
  Driver d(o);
  TestIsland a = d.Admit("a");
  TestIsland b = d.Admit("b");
  auto plans = d.Barrier({&a, &b}, {0, 0});
  auto va = d.Failed(a, plans[0], "b");
  d.AdvanceMs(2000);
  EXPECT_FALSE(va->answered) << "exactly --blame-grace-ms after the blame: b may still report";
  EXPECT_EQ(d.coordinator->Snapshot().evictions, 0u);
  d.AdvanceNs(1);
  ASSERT_TRUE(va->answered);
  EXPECT_EQ(va->response.kind(), fl::v1::SYNC_VERDICT_KIND_RETRY);
  EXPECT_EQ(d.log.Of("island b").back(), "active --vanished--> gone");
  EXPECT_EQ(d.log.Of("sync 0/0").back(), "exchanging --nobody_applied--> idle");

  auto retry = d.Barrier({&a}, {0, 0});
  EXPECT_EQ(Members(retry[0]), std::vector<std::string>{"a"});
  EXPECT_EQ(retry[0].attempt(), 1u);
  EXPECT_GT(retry[0].epoch(), plans[0].epoch());
  auto committed = d.Done(a, retry[0], 7);
  ASSERT_TRUE(committed->answered);
  EXPECT_EQ(committed->response.kind(), fl::v1::SYNC_VERDICT_KIND_COMMIT);
  // b's late report on the first epoch is refused with "rejoin".
  EXPECT_TRUE(TellsToRejoin(d.Done(b, plans[1], 7)->status));
}

TEST(DeadlinesTest, ABlamedIslandThatReportsWithinTheGraceIsKeptAndBothRetry) {
  CoordinatorOptions o = Options();
  o.heartbeat_timeout_ms = 600000;
  Driver d(o);
  TestIsland a = d.Admit("a");
  TestIsland b = d.Admit("b");
  auto plans = d.Barrier({&a, &b}, {0, 0});
  auto va = d.Failed(a, plans[0], "b");
  d.AdvanceMs(1999);
  auto vb = d.Failed(b, plans[1], "a");
  ASSERT_TRUE(va->answered && vb->answered);
  EXPECT_EQ(va->response.kind(), fl::v1::SYNC_VERDICT_KIND_RETRY);
  EXPECT_EQ(vb->response.kind(), fl::v1::SYNC_VERDICT_KIND_RETRY);
  d.AdvanceMs(10000);
  EXPECT_EQ(d.coordinator->Snapshot().evictions, 0u) << "the blame's deadline passed with b kept";
  auto retry = d.Barrier({&a, &b}, {0, 0});
  EXPECT_EQ(Members(retry[0]), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(retry[0].attempt(), 1u);
  // On attempt 1 a blame evicts at once: no grace.
  auto again = d.Failed(a, retry[0], "b");
  ASSERT_TRUE(again->answered);
  EXPECT_EQ(again->response.kind(), fl::v1::SYNC_VERDICT_KIND_RETRY);
  EXPECT_EQ(d.log.Of("island b").back(), "active --vanished--> gone");
}

TEST(DeadlinesTest, ASyncThatNobodyAppliesIsRetriedUntilMaxAttemptsThenTheExperimentFails) {
  CoordinatorOptions o = Options();
  o.max_sync_attempts = 2;
  Driver d(o);
  TestIsland a = d.Admit("a");
  auto first = d.Barrier({&a}, {0, 0});
  auto v1 = d.Failed(a, first[0]);
  ASSERT_TRUE(v1->answered);
  EXPECT_EQ(v1->response.kind(), fl::v1::SYNC_VERDICT_KIND_RETRY);
  auto second = d.Barrier({&a}, {0, 0});
  EXPECT_EQ(second[0].attempt(), 1u);
  auto v2 = d.Failed(a, second[0]);
  ASSERT_TRUE(v2->answered);
  EXPECT_EQ(v2->status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(v2->status.error_message().find("sync (step 0, fragment 0) failed in 2 epochs (--max-sync-attempts)"),
            std::string::npos)
      << v2->status.error_message();
  EXPECT_EQ(d.log.Of("sync 0/0"), (std::vector<std::string>{
                                      "idle --first_arrival--> gathering",
                                      "gathering --barrier_complete--> exchanging",
                                      "exchanging --nobody_applied--> idle",
                                      "idle --first_arrival--> gathering",
                                      "gathering --barrier_complete--> exchanging",
                                      "exchanging --gave_up--> failed",
                                  }));
  EXPECT_EQ(d.log.Of("run").back(), "running --sync_gave_up--> failed");
  EXPECT_TRUE(d.coordinator->WaitDone(absl::ZeroDuration()));
  auto refused = d.PostJoin("b");
  ASSERT_TRUE(refused->answered);
  EXPECT_NE(refused->status.error_message().find("is over"), std::string::npos) << refused->status.error_message();
}

TEST(DeadlinesTest, ALateJoinIsHeldWhileAnEpochIsInFlightThenCopiesItsStateAndTheNextBarrierWaitsForIt) {
  CoordinatorOptions o = Options();
  o.heartbeat_timeout_ms = 600000;
  Driver d(o);
  TestIsland a = d.Admit("a");
  auto p0 = d.Barrier({&a}, {0, 0});
  ASSERT_TRUE(d.Done(a, p0[0], 100)->answered);
  auto p1 = d.Barrier({&a}, {1, 0});
  auto join = d.PostJoin("c");
  EXPECT_FALSE(join->answered) << "held: epoch 2 is in flight";
  d.AdvanceMs(60000);
  EXPECT_FALSE(join->answered);
  ASSERT_TRUE(d.Done(a, p1[0], 101)->answered);
  ASSERT_TRUE(join->answered);
  ASSERT_TRUE(join->status.ok()) << join->status.error_message();
  ASSERT_TRUE(join->response.has_state_source());
  EXPECT_EQ(join->response.state_source().island_id(), "a");
  EXPECT_EQ(join->response.state_source().expected_hash(), 101u);
  EXPECT_EQ(join->response.state_source().key().step(), 1u);
  TestIsland c = d.Opened("c", *join);
  EXPECT_EQ(d.coordinator->Snapshot().loading, std::vector<std::string>{"c"});

  auto pa = d.BeginSync(a, {2, 0});
  EXPECT_FALSE(pa->answered) << "the barrier of (2, 0) waits for c, whose state is (1, 0)";
  EXPECT_EQ(d.StateLoaded(c, {1, 0}, 999)->status.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
      << "a wrong hash is refused";
  ASSERT_TRUE(d.StateLoaded(c, {1, 0}, 101)->status.ok());
  auto pc = d.BeginSync(c, {2, 0});
  ASSERT_TRUE(pa->answered && pc->answered);
  EXPECT_EQ(Members(pa->response), (std::vector<std::string>{"a", "c"}));
  EXPECT_EQ(d.log.Of("island c"),
            (std::vector<std::string>{"waiting --admitted_late--> loading", "loading --state_loaded--> active"}));
}

TEST(DeadlinesTest, ALateJoinerThatStopsWhileCopyingIsEvictedByItsHeartbeatDeadline) {
  Driver d(Options());
  TestIsland a = d.Admit("a");
  auto p0 = d.Barrier({&a}, {0, 0});
  ASSERT_TRUE(d.Done(a, p0[0], 5)->answered);
  TestIsland c = d.Admit("c");
  for (int i = 0; i < 3; ++i) {
    d.AdvanceMs(1000);
    d.Heartbeat(a);
  }
  d.AdvanceNs(1);
  EXPECT_EQ(d.log.Of("island c").back(), "loading --heartbeat_lost--> gone");
  EXPECT_TRUE(d.coordinator->Snapshot().loading.empty());
  EXPECT_EQ(d.coordinator->Snapshot().members, std::vector<std::string>{"a"});
}

TEST(DeadlinesTest, ShutdownAnswersEveryHeldCallAndTellsEverySession) {
  Driver d(Options());
  TestIsland a = d.Admit("a");
  TestIsland b = d.Admit("b");
  auto pa = d.BeginSync(a, {0, 0});
  d.coordinator->Shutdown("test over");
  ASSERT_TRUE(pa->answered);
  EXPECT_EQ(pa->status.error_code(), grpc::StatusCode::UNAVAILABLE);
  for (const TestIsland* island : {&a, &b}) {
    ASSERT_FALSE(island->session->sent.empty()) << island->id;
    EXPECT_EQ(island->session->sent.back().shutdown().reason(), "test over");
  }
  EXPECT_EQ(d.log.Of("sync 0/0").back(), "gathering --shutdown--> abandoned");
  EXPECT_EQ(d.log.Of("island b").back(), "active --shutdown--> gone");
  EXPECT_TRUE(d.coordinator->WaitDone(absl::ZeroDuration()));
  auto refused = d.PostJoin("c");
  ASSERT_TRUE(refused->answered);
  EXPECT_EQ(refused->status.error_code(), grpc::StatusCode::UNAVAILABLE);
  d.coordinator->Shutdown("again");  // idempotent
  EXPECT_EQ(d.log.Of("run"), (std::vector<std::string>{"gathering_cohort --cohort_complete--> running",
                                                       "running --shutdown--> shut_down"}));
}

TEST(DeadlinesTest, NoTimerIsLeftBehindWhenTheWatchedThingsEndFirst) {
  // Deadlines whose subject resolved before them fire as no-ops: advancing far past all of them changes nothing.
  CoordinatorOptions o = Options();
  o.heartbeat_timeout_ms = 600000;
  Driver d(o);
  TestIsland a = d.Admit("a");
  TestIsland b = d.Admit("b");
  auto plans = d.Barrier({&a, &b}, {0, 0});
  auto va = d.Failed(a, plans[0], "b");
  auto vb = d.Done(b, plans[1], 9);
  ASSERT_TRUE(va->answered && vb->answered);
  EXPECT_EQ(va->response.kind(), fl::v1::SYNC_VERDICT_KIND_REPAIR);
  const size_t transitions = d.log.lines.size();
  d.AdvanceMs(500000);
  EXPECT_EQ(d.log.lines.size(), transitions) << d.log.lines.back();
  EXPECT_EQ(d.coordinator->Snapshot().members, (std::vector<std::string>{"a", "b"}));
}

}  // namespace
}  // namespace fl::diloco
