// The coordinator's policy for a (state, trigger) pair its tables lack (docs/architecture.md, "Errors and missing
// transitions"): the same as fl-server's round engine. The pair is a bug: logged critical, refused, and the run
// fails with the pair as its reason; the process is not aborted and the run does not carry on. On a ManualClock,
// the loop on the test's thread.
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "../src/coordinator_core.h"
#include "fl/diloco/coord/coordinator.h"
#include "fl/rpc/clock.h"

namespace fl::diloco {

// Reaches the core's run machine, so that a test can fire a trigger that no path of the coordinator fires from
// the state it is in.
class CoordinatorTestPeer {
 public:
  static bool Fire(Coordinator& c, RunTrigger trigger) { return c.core_->Fire(trigger, "test"); }
};

namespace {

TEST(MissingRowTest, AMissingRunRowIsRefusedAndTheRunFailsNamingThePair) {
  rpc::ManualClock clock;
  CoordinatorOptions o;
  o.experiment_id = "missing-row";
  o.schedule.inner_steps = 4;
  o.clock = &clock;
  o.own_thread = false;
  auto c = Coordinator::Create(std::move(o), nullptr, nullptr);
  ASSERT_TRUE(c.ok()) << c.status();
  Coordinator& coordinator = **c;
  coordinator.RunUntilIdle();
  ASSERT_TRUE(coordinator.Snapshot().failure.empty());

  // gathering_cohort has no last_sync_committed row.
  EXPECT_FALSE(CoordinatorTestPeer::Fire(coordinator, RunTrigger::kLastSyncCommitted));
  coordinator.RunUntilIdle();
  const CoordinatorSnapshot snap = coordinator.Snapshot();
  EXPECT_NE(snap.failure.find("no transition from gathering_cohort on last_sync_committed"), std::string::npos)
      << snap.failure;
  EXPECT_FALSE(snap.finished);
  // The run is over: a second bug changes nothing.
  EXPECT_FALSE(CoordinatorTestPeer::Fire(coordinator, RunTrigger::kCohortComplete));
  EXPECT_EQ(coordinator.Snapshot().failure, snap.failure);
}

}  // namespace
}  // namespace fl::diloco
