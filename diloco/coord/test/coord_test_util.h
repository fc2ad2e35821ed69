// Test support for diloco/coord: a real coordinator on loopback gRPC and simulated islands (threads with
// plain float vectors as their "global state"). Not a test file itself (the module globs *_test.cc).
#pragma once

#include <cstring>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "fl/core/str_cat.h"
#include "fl/diloco/coord/coordinator.h"
#include "fl/diloco/coord/coordinator_client.h"
#include "fl/diloco/coord/state_transfer.h"
#include "fl/rpc/clock.h"

namespace fl::diloco::testing {

inline constexpr uint64_t kFingerprint = 0x1234abcd5678ef90ULL;

// Options for a coordinator on the harness's ManualClock: no deadline passes unless a test advances the clock
// (CoordinatorHarness::Advance), so no test depends on how fast the machine is.
inline CoordinatorOptions TestOptions(uint32_t min_islands = 1) {
  CoordinatorOptions o;
  o.experiment_id = "coord-test";
  o.schedule.inner_steps = 4;
  o.schedule.num_fragments = 1;
  o.schedule.total_outer_steps = 0;
  o.min_islands = min_islands;
  o.heartbeat_interval_ms = 50;
  o.heartbeat_timeout_ms = 3000;
  o.barrier_timeout_ms = 120000;
  o.report_timeout_ms = 120000;
  o.blame_grace_ms = 300;
  return o;
}

// Polls `done` until it holds: for what travels over gRPC, never for a deadline. False after `max_wait`.
template <class Done>
bool WaitUntil(Done done, std::chrono::milliseconds max_wait = std::chrono::seconds(60)) {
  const auto until = std::chrono::steady_clock::now() + max_wait;
  while (std::chrono::steady_clock::now() < until) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return done();
}

// A coordinator on loopback gRPC, its loop on a thread of its own and its deadlines on a ManualClock.
class CoordinatorHarness {
 public:
  explicit CoordinatorHarness(CoordinatorOptions options, instrumentation::IslandRecordWriter* records = nullptr,
                              instrumentation::IslandMetrics* metrics = nullptr,
                              const std::optional<rpc::ServerTls>& tls = std::nullopt) {
    options.clock = &clock_;
    auto c = Coordinator::Create(std::move(options), records, metrics);
    EXPECT_TRUE(c.ok()) << c.status();
    coordinator_ = std::move(*c);
    auto s = StartCoordinatorServer(coordinator_.get(), "127.0.0.1:0", tls);
    EXPECT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
  }
  ~CoordinatorHarness() { Stop(); }

  void Stop() {
    if (coordinator_ == nullptr) return;
    coordinator_->Shutdown("test over");
    server_.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    server_.server->Wait();
    server_.server.reset();
    coordinator_.reset();
  }

  std::string address() const { return fl::StrCat("127.0.0.1:", server_.port); }
  Coordinator& coordinator() { return *coordinator_; }

  // Moves the coordinator's clock and returns the state once every deadline now due has been handled.
  CoordinatorSnapshot Advance(std::chrono::nanoseconds by) {
    clock_.AdvanceNs(by.count());
    return coordinator_->Snapshot();
  }

  // Waits (polling the coordinator's snapshot) until `pred` holds: for what travels over gRPC (a session that
  // opened or closed), never for a deadline. False after `max_wait` (a generous bound, not an assertion about
  // speed).
  template <class Pred>
  bool WaitFor(Pred pred, std::chrono::milliseconds max_wait = std::chrono::seconds(60)) {
    return WaitUntil([&] { return pred(coordinator_->Snapshot()); }, max_wait);
  }

 private:
  rpc::ManualClock clock_;
  std::unique_ptr<Coordinator> coordinator_;
  RunningCoordinatorServer server_;
};

// A simulated island: a coordinator client, a state server and a global state of float vectors.
struct SimIsland {
  std::string id;
  std::unique_ptr<StateServer> state_server;
  std::unique_ptr<CoordinatorClient> client;
  std::vector<float> params;
  std::vector<float> momentum;

  explicit SimIsland(std::string island_id, CoordinatorClientOptions options = {}) : id(std::move(island_id)) {
    auto s = StateServer::Start("127.0.0.1:0");
    EXPECT_TRUE(s.ok()) << s.status();
    state_server = std::move(*s);
    client = std::make_unique<CoordinatorClient>(options);
    params = {1.0f, 2.0f, 3.0f, 4.0f};
    momentum = {0.0f, 0.0f, 0.0f, 0.0f};
  }

  IslandJoinRequest Request(uint64_t fingerprint = kFingerprint) const {
    IslandJoinRequest r;
    r.island_id = id;
    r.data_endpoint = fl::StrCat("ipc:///tmp/fl-coord-test-", id);  // unique per id; never bound here
    r.state_endpoint = state_server->endpoint();
    r.num_ranks = 2;
    r.model_fingerprint = fingerprint;
    r.software_version = "test";
    r.device_class = "cpu";
    return r;
  }

  absl::StatusOr<Assignment> Connect(const std::string& address, uint64_t fingerprint = kFingerprint) {
    return client->Connect(address, Request(fingerprint));
  }

  // The serialized state: params then momentum, as raw fp32 bytes; its Checksum64 is the state hash.
  std::vector<uint8_t> Image() const {
    std::vector<uint8_t> image((params.size() + momentum.size()) * sizeof(float));
    std::memcpy(image.data(), params.data(), params.size() * sizeof(float));
    std::memcpy(image.data() + params.size() * sizeof(float), momentum.data(), momentum.size() * sizeof(float));
    return image;
  }
  void Load(const std::vector<uint8_t>& image) {
    std::memcpy(params.data(), image.data(), params.size() * sizeof(float));
    std::memcpy(momentum.data(), image.data() + params.size() * sizeof(float), momentum.size() * sizeof(float));
  }
  uint64_t Hash() const { return PlainStateHash(params, momentum); }

  // A deterministic stand-in for "apply the averaged pseudo-gradient with the outer optimizer": every island
  // that applies the same sync gets the same bits.
  void Apply(const SyncKey& key) {
    for (size_t i = 0; i < params.size(); ++i) {
      momentum[i] = 0.9f * momentum[i] + 0.01f * static_cast<float>(key.step + 1) * static_cast<float>(i + 1);
      params[i] -= 0.7f * momentum[i];
    }
  }
  void Publish(const SyncKey& key) { state_server->Publish({key, Hash(), Image()}); }
};

inline SyncStats SomeStats(double exchange_seconds = 0.25) {
  SyncStats s;
  s.inner_compute_seconds = 1.5;
  s.exchange_seconds = exchange_seconds;
  s.bytes_sent = 1000;
  s.bytes_received = 2000;
  s.wait_seconds = 0.125;
  s.inner_steps = 4;
  return s;
}

// Every island in `islands` asks for `key` at once; returns their plans in the same order.
inline std::vector<absl::StatusOr<SyncPlan>> BeginAll(const std::vector<SimIsland*>& islands, SyncKey key) {
  std::vector<std::future<absl::StatusOr<SyncPlan>>> futures;
  for (SimIsland* island : islands) {
    futures.push_back(std::async(std::launch::async, [island, key] { return island->client->BeginSync(key); }));
  }
  std::vector<absl::StatusOr<SyncPlan>> plans;
  for (auto& f : futures) plans.push_back(f.get());
  return plans;
}

// Every island applies the sync, publishes its snapshot and reports done; returns the verdicts.
inline std::vector<absl::StatusOr<Verdict>> ApplyAndReportAll(const std::vector<SimIsland*>& islands,
                                                              const std::vector<absl::StatusOr<SyncPlan>>& plans) {
  std::vector<std::future<absl::StatusOr<Verdict>>> futures;
  for (size_t i = 0; i < islands.size(); ++i) {
    SimIsland* island = islands[i];
    const SyncPlan plan = *plans[i];
    futures.push_back(std::async(std::launch::async, [island, plan] {
      island->Apply(plan.key);
      island->Publish(plan.key);
      return island->client->ReportSyncDone(plan, island->Hash(), SomeStats());
    }));
  }
  std::vector<absl::StatusOr<Verdict>> verdicts;
  for (auto& f : futures) verdicts.push_back(f.get());
  return verdicts;
}

inline std::vector<std::string> Ids(const SyncPlan& plan) {
  std::vector<std::string> ids;
  for (const auto& m : plan.members) ids.push_back(m.id);
  return ids;
}

}  // namespace fl::diloco::testing
