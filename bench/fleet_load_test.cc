// The fleet load generator's library against a real fl-server (engine, gRPC service, records) in this process:
// a few hundred sessions join in a storm, stay alive on heartbeats and clock pongs, and take part in rounds
// that sample a third of them; nobody is evicted. CI-sized: the 10,000-session runs are the fleet_load
// benchmark (docs/performance.md, "Fleets").
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "fl/core/str_cat.h"
#include "fl/instrumentation/record_store.h"
#include "fl/rpc/grpc_server.h"
#include "fl/server/round_engine.h"
#include "fl/server/service.h"
#include "fl/testing/scratch_dir.h"
#include "fleet_load.h"

namespace fl::bench {
namespace {

TEST(FleetLoadTest, ThreeHundredSessionsJoinStayAliveAndTrainInSampledRounds) {
  constexpr uint32_t kSessions = 300;
  constexpr uint32_t kSampled = 100;
  fl::testing::ScratchDir dir("fl_fleet_load");
  auto records = instrumentation::RecordStore::Open(dir.File("records.db"));
  ASSERT_TRUE(records.ok()) << records.status();
  server::EngineConfig config;
  config.experiment_name = "fleet";
  config.num_rounds = 3;  // the test ends during the third: the sessions must be open when it looks
  config.fit = {static_cast<double>(kSampled) / kSessions, kSampled, kSessions};
  config.evaluate_every = 0;
  config.round_deadline_ms = 120'000;
  config.heartbeat_interval_ms = 1000;
  config.train.set_local_steps(1);
  config.train.set_batch_size(8);
  config.train.set_learning_rate(0.1);
  config.train.set_optimizer("sgd");
  config.print_table = false;
  server::RoundEngine engine(config, records->get(), {});
  ASSERT_TRUE(engine.Start().ok());
  server::FederationService service(&engine);
  auto running = rpc::StartGrpcServer(&service, "127.0.0.1:0", std::nullopt);
  ASSERT_TRUE(running.ok()) << running.status();

  FleetOptions o;
  o.address = fl::StrCat("127.0.0.1:", running->port);
  o.sessions = kSessions;
  o.join_window_ms = 300;
  o.channels = 4;
  o.workers = 2;
  {
    Fleet fleet(o);
    ASSERT_TRUE(fleet.Start().ok());
    ASSERT_TRUE(fleet.WaitAllOpen(120'000).ok()) << fleet.WaitAllOpen(0).message();
    ASSERT_TRUE(fleet.WaitUpdates(2 * kSampled, 240'000).ok());
    const FleetStats s = fleet.stats();
    EXPECT_EQ(s.admitted, kSessions);
    EXPECT_EQ(s.join_failed, 0u);
    EXPECT_EQ(s.sessions_ended, 0u) << "the server ended healthy sessions";
    EXPECT_EQ(s.sessions_open, kSessions);
    EXPECT_EQ(s.updates_other, 0u) << "updates not accepted";
    EXPECT_GE(s.updates_accepted, 2 * kSampled);
    EXPECT_GT(s.pongs, 0u);
    EXPECT_EQ(engine.PlacesHeld(), kSessions);
    fleet.Stop();
  }
  engine.Post(server::ShutdownEvent{"test over"});
  engine.Wait();
  running->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  engine.Stop();
  (void)(*records)->Close();
}

}  // namespace
}  // namespace fl::bench
