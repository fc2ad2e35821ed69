// The engine and service under fleet load (docs/round-engine.md, "Fleets and overload"): liveness judged by when
// a session's messages reached its reactor (an engine that runs late evicts nobody who was heard), Joins shed
// with a retry-after while the engine's queue is too long, and the session limit. The engine runs on a
// ManualClock driven by the test (StartManual + RunUntilIdle): nothing depends on wall-clock time.
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>

#include "fl/rpc/clock.h"
#include "fl/rpc/grpc_server.h"
#include "fl/server/service.h"
#include "fl/testing/scratch_dir.h"
#include "fl/v1/federation.grpc.pb.h"
#include "manual_engine.h"

namespace fl::server {
namespace {

using test_harness::InitialModel;
using test_harness::kParams;

// The server's side of a session, with the reactor's arrival time set by the test (as the reactor sets it
// when a message arrives, before the engine handles it).
class ArrivalChannel final : public SessionChannel {
 public:
  void Send(fl::v1::ServerMessage) override {}
  void Close(const grpc::Status& status) override {
    std::lock_guard lock(mu_);
    if (!closed_.has_value()) closed_ = status;
  }
  int64_t last_received_ns() const override { return arrived_ns.load(); }
  bool closed() const {
    std::lock_guard lock(mu_);
    return closed_.has_value();
  }
  std::atomic<int64_t> arrived_ns{0};

 private:
  mutable std::mutex mu_;
  std::optional<grpc::Status> closed_;
};

fl::v1::JoinRequest JoinRequestFor(const std::string& name, const std::string& token = "") {
  fl::v1::JoinRequest req;
  req.set_protocol_version(fl::v1::PROTOCOL_VERSION_3);
  req.set_client_name(name);
  req.set_num_train_examples(100);
  req.set_num_test_examples(10);
  req.set_session_token(token);
  *req.mutable_model_spec() = proto::ToProto(client::SyntheticTrainer(kParams, 10, 1).spec(), "synthetic");
  return req;
}

EngineConfig FleetConfig() {
  EngineConfig c = test_harness::SmallConfig("");
  c.fit = {1.0, 1, 1000};  // no round starts: these tests are about sessions
  c.evaluate_every = 0;
  c.heartbeat_interval_ms = 5'000;  // evicted after 20 s of silence
  c.print_table = false;
  return c;
}

// Sessions rather than rounds: a Join's status is looked at (refusals are what some tests are about), and a session's
// channel notes when the engine last heard from it.
class EngineFleetTest : public test_harness::ManualEngineTest {
 protected:
  EngineFleetTest() : ManualEngineTest("fl_engine_fleet") {}
  struct Joined {
    grpc::Status status;
    fl::v1::JoinResponse response;
  };
  Joined Join(const std::string& name, const std::string& token = "") {
    Joined j;
    engine_->Post(JoinEvent{JoinRequestFor(name, token), "test",
                            [&](const grpc::Status& s, const fl::v1::JoinResponse& r) {
                              j.status = s;
                              j.response = r;
                            },
                            ""});
    engine_->RunUntilIdle();
    return j;
  }
  std::shared_ptr<ArrivalChannel> Open(const Joined& j) {
    auto channel = std::make_shared<ArrivalChannel>();
    fl::v1::SessionHello hello;
    hello.set_client_id(j.response.client_id());
    hello.set_session_token(j.response.session_token());
    channel->arrived_ns = clock_.NowNs();
    engine_->Post(SessionOpenEvent{hello, channel, "test"});
    engine_->RunUntilIdle();
    return channel;
  }
};

TEST_F(EngineFleetTest, HeartbeatsThatArrivedAreNotEvictedEvenWhenTheEngineHandlesThemLate) {
  StartEngine(FleetConfig());
  auto heard = Open(Join("heard"));
  auto silent = Open(Join("silent"));
  // 40 s pass. The reactor receives a heartbeat of "heard" every 5 s, but the engine is so far behind that
  // none of those messages has been handled (they wait in its queue); "silent" sends nothing.
  for (int i = 0; i < 8; ++i) {
    clock_.AdvanceMs(5'000);
    heard->arrived_ns = clock_.NowNs();
    engine_->RunUntilIdle();  // the heartbeat checks run; no message event is handled
  }
  EXPECT_FALSE(heard->closed()) << "a session whose heartbeats reached the server was evicted";
  EXPECT_TRUE(silent->closed()) << "a session silent for 40 s (4 intervals: 20 s) was not evicted";
  EXPECT_EQ(engine_->PlacesHeld(), 1u);
}

TEST_F(EngineFleetTest, ASessionWhoseLastArrivalIsOlderThanFourIntervalsIsEvictedAtTheCheck) {
  StartEngine(FleetConfig());
  auto c = Open(Join("quiet"));
  clock_.AdvanceMs(10'000);
  c->arrived_ns = clock_.NowNs();  // heard at 10 s, then nothing
  engine_->RunUntilIdle();
  clock_.AdvanceMs(20'000);  // 30 s: 20 s after its last message, not more than four intervals
  engine_->RunUntilIdle();
  EXPECT_FALSE(c->closed());
  clock_.AdvanceMs(5'000);  // 35 s: 25 s of silence
  engine_->RunUntilIdle();
  EXPECT_TRUE(c->closed());
}

TEST_F(EngineFleetTest, TheSessionLimitRefusesNewJoinsWithARetryAfterButAdmitsARejoin) {
  EngineConfig config = FleetConfig();
  config.max_sessions = 2;
  config.join_retry_after_ms = 750;
  StartEngine(config);
  Joined a = Join("a");
  ASSERT_TRUE(a.status.ok());
  auto a_channel = Open(a);
  ASSERT_TRUE(Join("b").status.ok());  // admitted: holds a place until it opens its session
  Joined c = Join("c");
  EXPECT_EQ(c.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(c.response.error().code(), fl::v1::ERROR_CODE_RATE_LIMITED);
  EXPECT_NE(c.response.error().message().find("--max-sessions=2"), std::string::npos) << c.response.error().message();
  EXPECT_NE(c.response.error().hint().find("retry after 750 ms"), std::string::npos) << c.response.error().hint();
  // A client that holds a place (a restart with its token) is not counted twice.
  EXPECT_TRUE(Join("a", a.response.session_token()).status.ok());
  // A place is freed when a session ends: "c" gets in on its retry.
  engine_->Post(SessionClosedEvent{a_channel, ""});
  engine_->RunUntilIdle();
  EXPECT_EQ(engine_->PlacesHeld(), 2u);  // "a" rejoined (awaiting its session) and "b"
  clock_.AdvanceMs(25'000);              // both never opened a session: their places lapse with the liveness check
  engine_->RunUntilIdle();
  EXPECT_EQ(engine_->PlacesHeld(), 0u);
  EXPECT_TRUE(Join("c").status.ok());
}

TEST_F(EngineFleetTest, TheQueueLengthIsVisibleToTheServiceAndDecidesShedding) {
  EngineConfig config = FleetConfig();
  config.max_engine_queue = 3;
  StartEngine(config);
  for (int i = 0; i < 3; ++i) engine_->Post(ShutdownEvent{"never handled in this test"});
  EXPECT_EQ(engine_->QueuedEvents(), 3u);
  EXPECT_FALSE(engine_->ShedJoins());
  engine_->Post(ShutdownEvent{"one more"});
  EXPECT_TRUE(engine_->ShedJoins());
  engine_->RunUntilIdle();
  EXPECT_EQ(engine_->QueuedEvents(), 0u);
  EXPECT_FALSE(engine_->ShedJoins());
}

// Through gRPC: an engine that does not run (its loop is driven by the test) fills its queue with the Joins the
// service posts; beyond --max-engine-queue the service answers at once, RESOURCE_EXHAUSTED with retry-after-ms, and
// counts it in fl_joins_shed_total.
TEST_F(EngineFleetTest, AJoinToAnOverloadedEngineIsShedWithRetryAfterMetadata) {
  EngineConfig config = FleetConfig();
  config.max_engine_queue = 2;
  config.join_retry_after_ms = 1234;
  auto metrics = instrumentation::ServerMetrics::Start("127.0.0.1:0");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  StartEngine(config, InitialModel(1), metrics->get());
  EXPECT_NE(test_harness::HttpGet((*metrics)->port(), "/metrics").find("\nfl_joins_shed_total 0"), std::string::npos);
  FederationService service(engine_.get());
  auto running = rpc::StartGrpcServer(&service, "127.0.0.1:0", std::nullopt);
  ASSERT_TRUE(running.ok()) << running.status();
  auto stub = fl::v1::Federation::NewStub(
      grpc::CreateChannel(fl::StrCat("127.0.0.1:", running->port), grpc::InsecureChannelCredentials()));

  struct Call {
    grpc::ClientContext ctx;
    fl::v1::JoinRequest req;
    fl::v1::JoinResponse resp;
    grpc::Status status;
    bool done = false;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::unique_ptr<Call>> calls;
  auto start = [&](const std::string& name) {
    auto call = std::make_unique<Call>();
    call->req = JoinRequestFor(name);
    call->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    Call* c = call.get();
    stub->async()->Join(&c->ctx, &c->req, &c->resp, [&, c](grpc::Status s) {
      std::lock_guard lock(mu);
      c->status = std::move(s);
      c->done = true;
      cv.notify_all();
    });
    calls.push_back(std::move(call));
    return c;
  };
  // Three Joins reach the queue (the third takes it past the limit), one after the other.
  for (int i = 0; i < 3; ++i) {
    start(fl::StrCat("queued-", i));
    while (engine_->QueuedEvents() < static_cast<size_t>(i + 1)) std::this_thread::yield();
  }
  Call* shed = start("shed");
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return shed->done; }));
  }
  EXPECT_EQ(shed->status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << shed->status.error_message();
  EXPECT_NE(shed->status.error_message().find("--max-engine-queue=2"), std::string::npos);
  const auto& trailers = shed->ctx.GetServerTrailingMetadata();
  auto it = trailers.find("retry-after-ms");
  ASSERT_NE(it, trailers.end());
  EXPECT_EQ(std::string(it->second.data(), it->second.size()), "1234");
  EXPECT_EQ(engine_->QueuedEvents(), 3u) << "a shed Join must not reach the engine";
  EXPECT_EQ(engine_->shed_joins(), 1u);
  const std::string scraped = test_harness::HttpGet((*metrics)->port(), "/metrics");
  EXPECT_NE(scraped.find("\nfl_joins_shed_total 1"), std::string::npos) << scraped;
  // The queued ones are answered once the engine catches up.
  engine_->RunUntilIdle();
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(60), [&] {
      for (auto& c : calls) {
        if (!c->done) return false;
      }
      return true;
    }));
  }
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(calls[i]->status.ok()) << calls[i]->status.error_message();
  engine_->Post(ShutdownEvent{"test over"});
  engine_->RunUntilIdle();
  running->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
}

// fl-client waits the retry-after-ms a refused Join carries, not only its own backoff: a server at its session limit
// (one place, held) refuses "b" with retry-after-ms 60000, and b's next attempt is scheduled that far out.
TEST(FleetClientTest, ARefusedJoinWaitsTheServersRetryAfter) {
  // fl-client logs each retry with its wait ("join failed (...); retrying in N ms"): keep the last log lines
  // (ringbuffer_sink is thread-safe to read). The default logger is swapped before the server's threads start and
  // put back after they end (the guard outlives the server): spdlog::debug and friends read it without a lock, so
  // swapping it while the engine logs frees a logger under it (ThreadSanitizer's report).
  auto sink = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(256);
  struct DefaultLoggerSwap {
    std::shared_ptr<spdlog::logger> previous = spdlog::default_logger();
    explicit DefaultLoggerSwap(std::shared_ptr<spdlog::logger> l) { spdlog::set_default_logger(std::move(l)); }
    ~DefaultLoggerSwap() { spdlog::set_default_logger(previous); }
  } swap(std::make_shared<spdlog::logger>("retry-test", sink));
  fl::testing::ScratchDir dir("fl_fleet_retry");
  EngineConfig config = test_harness::SmallConfig(dir.File("ckpt"));
  config.max_sessions = 1;
  config.join_retry_after_ms = 60'000;
  test_harness::TestServer server(config, dir.File("records.db"), InitialModel(1));
  test_harness::RawClient holder(server.address());
  auto a = holder.Connect("a");  // takes the one place
  ASSERT_NE(a, nullptr);

  auto b = test_harness::StartClient(server.address(), "b", 2);
  bool scheduled = false;
  std::string seen;
  for (int i = 0; i < 3000 && !scheduled; ++i) {
    seen.clear();
    for (const std::string& line : sink->last_formatted()) seen += line;
    scheduled = seen.find("retrying in 60000 ms") != std::string::npos;
    if (!scheduled) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  test_harness::StopClient(*b);  // wakes it from its wait
  EXPECT_TRUE(scheduled) << seen;
  a->ctx.TryCancel();
}

}  // namespace
}  // namespace fl::server
