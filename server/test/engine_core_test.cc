// The round engine's core and its one policy for a missing transition (docs/architecture.md, "Errors and
// missing transitions"): a (state, trigger) pair the table lacks is a bug of the engine; it ends the run as failed
// through the table's invariant_broken row, tells every client, records the reason, and never aborts fl-server.
// On an injected ManualClock, driven event by event (StartManual + RunUntilIdle).
#include <memory>
#include <optional>
#include <string>

#include <gtest/gtest.h>

#include "../src/engine_core.h"
#include "fl/instrumentation/record_reader.h"
#include "manual_engine.h"

namespace fl::server {

// The friend of RoundEngine and its core that lets a test fire a trigger the engine's own paths never fire from
// the state it is in: the only way to reach a missing row without planting a bug in the engine.
class RoundEngineTestPeer {
 public:
  static bool Fire(RoundEngine& engine, EngineTrigger on) { return engine.core_->Fire(on); }
};

namespace {

using test_harness::InitialModel;
using test_harness::TestClient;

class EngineCoreTest : public test_harness::ManualEngineTest {
 protected:
  EngineCoreTest() : ManualEngineTest("fl_engine_core") {}

  static EngineConfig Config() {
    EngineConfig c = test_harness::SmallConfig("");
    c.num_rounds = 2;
    c.fit = {1.0, 2, 2};  // a round waits for two clients: one connected client keeps it in waiting_for_clients
    c.evaluate_every = 0;
    c.print_table = false;
    return c;
  }
};

TEST(EngineTransitionsPolicyTest, EveryStateButFinishedHasTheInvariantBrokenRowToFinished) {
  for (EngineState s : {EngineState::kWaitingForModel, EngineState::kWaitingForClients, EngineState::kCollecting,
                        EngineState::kEvaluating, EngineState::kDraining, EngineState::kBuffering}) {
    EXPECT_EQ(NextEngineState(s, EngineTrigger::kInvariantBroken), EngineState::kFinished) << EngineStateName(s);
  }
  EXPECT_EQ(NextEngineState(EngineState::kFinished, EngineTrigger::kInvariantBroken), std::nullopt);
}

TEST(EngineTransitionsPolicyTest, AStartFromACheckpointIsARowOfTheTable) {
  EXPECT_EQ(NextEngineState(EngineState::kWaitingForModel, EngineTrigger::kModelLoaded),
            EngineState::kWaitingForClients);
}

TEST_F(EngineCoreTest, AMissingRowEndsTheRunAsFailedNamingThePairAndTellsEveryClient) {
  StartEngine(Config());
  TestClient a = Connect("a");
  ASSERT_EQ(engine_->state(), EngineState::kWaitingForClients);

  // waiting_for_clients has no round_committed row: the bug is refused, not carried out.
  EXPECT_FALSE(RoundEngineTestPeer::Fire(*engine_, EngineTrigger::kRoundCommitted));
  Run();

  EXPECT_EQ(engine_->state(), EngineState::kFinished);
  const std::optional<EngineResult> result = engine_->result();
  ASSERT_TRUE(result.has_value());
  EXPECT_EQ(result->status, instrumentation::ExperimentStatus::kFailed);
  EXPECT_NE(result->reason.find("no transition from waiting_for_clients on round_committed"), std::string::npos)
      << result->reason;
  // The client was told that the experiment ended (not finished) and its session closed.
  bool told = false;
  for (const fl::v1::ServerMessage& m : a.channel->sent()) {
    if (m.has_shutdown()) {
      told = true;
      EXPECT_FALSE(m.shutdown().experiment_finished());
      EXPECT_EQ(m.shutdown().reason(), result->reason);
    }
  }
  EXPECT_TRUE(told);
  EXPECT_TRUE(a.channel->closed().has_value());
  // The reason is in the records, so that the run's failure is explained after the fact.
  auto experiment = Reader()->GetExperiment(ExperimentId());
  ASSERT_TRUE(experiment.ok()) << experiment.status();
  EXPECT_EQ(experiment->status, instrumentation::ExperimentStatus::kFailed);
  EXPECT_EQ(experiment->status_reason, result->reason);
}

TEST_F(EngineCoreTest, AMissingRowAfterTheEndChangesNothing) {
  StartEngine(Config());
  engine_->Post(ShutdownEvent{"test over"});
  Run();
  ASSERT_EQ(engine_->state(), EngineState::kFinished);
  const EngineResult before = *engine_->result();
  EXPECT_FALSE(RoundEngineTestPeer::Fire(*engine_, EngineTrigger::kRoundStarted));
  EXPECT_EQ(engine_->state(), EngineState::kFinished);
  EXPECT_EQ(engine_->result()->status, before.status);
  EXPECT_EQ(engine_->result()->reason, before.reason);
}

}  // namespace
}  // namespace fl::server
