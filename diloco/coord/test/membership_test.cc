// Membership of the islands coordinator over real loopback gRPC: admission, ring order, islands that drop
// (session closed, heartbeats stopped), failed exchanges retried without the vanished island, and the
// fingerprint and sync-mode checks. Islands are threads using the public CoordinatorClient API.
#include <gtest/gtest.h>

#include "coord_test_util.h"

namespace fl::diloco::testing {
namespace {

TEST(MembershipTest, RingOrderIsAdmissionOrderAndIdenticalForEveryMember) {
  CoordinatorHarness h(TestOptions());
  // Admission order c, a, b: the ring order is admission order, not alphabetical.
  SimIsland c("island-c"), a("island-a"), b("island-b");
  for (SimIsland* island : {&c, &a, &b}) {
    auto assignment = island->Connect(h.address());
    ASSERT_TRUE(assignment.ok()) << assignment.status();
    EXPECT_FALSE(assignment->state_source.has_value()) << "no sync committed yet: a fresh start";
    EXPECT_EQ(assignment->schedule.inner_steps, 4u);
  }
  const std::vector<std::string> expected = {"island-c", "island-a", "island-b"};
  uint64_t previous_epoch = 0;
  for (uint64_t step = 0; step < 3; ++step) {
    auto plans = BeginAll({&a, &b, &c}, SyncKey{step, 0});
    for (size_t i = 0; i < plans.size(); ++i) ASSERT_TRUE(plans[i].ok()) << plans[i].status();
    for (const auto& plan : plans) {
      EXPECT_EQ(Ids(*plan), expected) << "step " << step;
      EXPECT_EQ(plan->epoch, plans[0]->epoch);
      EXPECT_EQ(plan->attempt, 0u);
    }
    EXPECT_EQ(Ids(*plans[0])[plans[0]->self_index], "island-a");
    EXPECT_EQ(Ids(*plans[1])[plans[1]->self_index], "island-b");
    EXPECT_EQ(Ids(*plans[2])[plans[2]->self_index], "island-c");
    EXPECT_GT(plans[0]->epoch, previous_epoch);
    previous_epoch = plans[0]->epoch;
    auto verdicts = ApplyAndReportAll({&a, &b, &c}, plans);
    for (const auto& v : verdicts) {
      ASSERT_TRUE(v.ok()) << v.status();
      EXPECT_EQ(v->kind, VerdictKind::kCommit);
      EXPECT_EQ(v->majority_hash, a.Hash());
    }
  }
  const CoordinatorSnapshot snap = h.coordinator().Snapshot();
  EXPECT_EQ(snap.members, expected);
  ASSERT_TRUE(snap.last_committed.has_value());
  EXPECT_EQ(snap.last_committed->step, 2u);
  EXPECT_EQ(snap.hash_mismatches, 0u);
}

TEST(MembershipTest, FirstCohortWaitsForMinIslands) {
  CoordinatorHarness h(TestOptions(/*min_islands=*/3));
  SimIsland a("a"), b("b"), c("c");
  std::vector<std::future<absl::StatusOr<Assignment>>> joins;
  for (SimIsland* island : {&a, &b, &c}) {
    joins.push_back(std::async(std::launch::async, [island, &h] { return island->Connect(h.address()); }));
  }
  for (auto& j : joins) {
    auto assignment = j.get();
    ASSERT_TRUE(assignment.ok()) << assignment.status();
  }
  EXPECT_EQ(h.coordinator().Snapshot().members.size(), 3u);
}

TEST(MembershipTest, IslandWhoseSessionClosesIsLeftOutOfTheNextEpoch) {
  CoordinatorHarness h(TestOptions());
  SimIsland a("a"), b("b"), c("c");
  for (SimIsland* island : {&a, &b, &c}) ASSERT_TRUE(island->Connect(h.address()).ok());
  auto plans = BeginAll({&a, &b, &c}, SyncKey{0, 0});
  for (const auto& p : plans) ASSERT_TRUE(p.ok()) << p.status();
  for (const auto& v : ApplyAndReportAll({&a, &b, &c}, plans)) ASSERT_TRUE(v.ok()) << v.status();

  b.client.reset();  // a crash: the session stream closes without Leave
  ASSERT_TRUE(h.WaitFor([](const CoordinatorSnapshot& s) { return s.members.size() == 2; }));
  auto next = BeginAll({&a, &c}, SyncKey{1, 0});
  for (const auto& p : next) {
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(Ids(*p), (std::vector<std::string>{"a", "c"}));
  }
}

// The heartbeat deadline on the coordinator's (manual) clock; the islands that join after the eviction are never
// at risk, as the clock does not move again. Boundaries to the nanosecond: deadlines_test.
TEST(MembershipTest, IslandWhoseHeartbeatsStopIsEvictedAndMustRejoin) {
  const CoordinatorOptions o = TestOptions();
  CoordinatorHarness h(o);
  CoordinatorClientOptions silent;
  silent.send_heartbeats = false;  // its session stays open, but nothing arrives on it
  SimIsland b("b", silent);
  ASSERT_TRUE(b.Connect(h.address()).ok());
  ASSERT_TRUE(h.WaitFor([](const CoordinatorSnapshot& s) { return s.connected == std::vector<std::string>{"b"}; }));
  EXPECT_EQ(h.Advance(std::chrono::milliseconds(o.heartbeat_timeout_ms)).members, std::vector<std::string>{"b"});
  EXPECT_TRUE(h.Advance(std::chrono::nanoseconds(1)).members.empty());
  ASSERT_TRUE(WaitUntil([&] { return b.client->evicted(); })) << "told on its session stream";
  EXPECT_NE(b.client->eviction_reason().find("no heartbeat for 3000 ms"), std::string::npos)
      << b.client->eviction_reason();

  SimIsland a("a"), c("c");
  for (SimIsland* island : {&a, &c}) ASSERT_TRUE(island->Connect(h.address()).ok());
  auto plans = BeginAll({&a, &c}, SyncKey{0, 0});
  for (const auto& p : plans) {
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(Ids(*p), (std::vector<std::string>{"a", "c"}));
  }
  auto late = b.client->BeginSync(SyncKey{0, 0});
  ASSERT_FALSE(late.ok());
  EXPECT_TRUE(IsRejoinNeeded(late.status())) << late.status();
  EXPECT_TRUE(b.client->evicted());

  // Once a and c committed the sync, b comes back as a late joiner told to copy their state.
  for (const auto& v : ApplyAndReportAll({&a, &c}, plans)) ASSERT_TRUE(v.ok()) << v.status();
  auto again = b.client->Rejoin();
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(b.client->evicted());
  ASSERT_TRUE(again->state_source.has_value());
  EXPECT_EQ(again->state_source->island_id, "a");
  EXPECT_EQ(again->state_source->expected_hash, a.Hash());
  EXPECT_GT(again->join_seq, 3u) << "a rejoin is a new admission, placed after the others in ring order";
}

// Without a blame grace the blamed island is evicted at once (the grace's deadline: deadlines_test and the
// next test).
TEST(MembershipTest, FailedExchangeIsRetriedInANewEpochWithoutTheVanishedIsland) {
  CoordinatorOptions o = TestOptions();
  o.blame_grace_ms = 0;
  CoordinatorHarness h(o);
  SimIsland a("a"), b("b"), c("c");
  for (SimIsland* island : {&a, &b, &c}) ASSERT_TRUE(island->Connect(h.address()).ok());
  auto plans = BeginAll({&a, &b, &c}, SyncKey{0, 0});
  for (const auto& p : plans) ASSERT_TRUE(p.ok()) << p.status();
  const uint64_t first_epoch = plans[0]->epoch;
  const uint64_t hash_before = a.Hash();

  // b vanishes mid-exchange: a and c see the ring break and blame it; nothing is applied.
  const absl::Status ring_error =
      absl::UnavailableError("member 'b' (ipc:///tmp/fl-coord-test-b) disconnected during exchange 1");
  ASSERT_EQ(VanishedMemberFromError(ring_error, *plans[0]), "b");
  auto fa = std::async(std::launch::async, [&] {
    return a.client->ReportSyncFailed(*plans[0], ring_error, VanishedMemberFromError(ring_error, *plans[0]),
                                      SomeStats());
  });
  auto fc = std::async(std::launch::async, [&] {
    return c.client->ReportSyncFailed(*plans[2], ring_error, VanishedMemberFromError(ring_error, *plans[2]),
                                      SomeStats());
  });
  for (auto* f : {&fa, &fc}) {
    auto v = f->get();
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_EQ(v->kind, VerdictKind::kRetry);
  }
  EXPECT_EQ(a.Hash(), hash_before) << "a failed exchange leaves the state untouched";

  auto retry = BeginAll({&a, &c}, SyncKey{0, 0});
  for (const auto& p : retry) {
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(Ids(*p), (std::vector<std::string>{"a", "c"}));
    EXPECT_GT(p->epoch, first_epoch);
    EXPECT_EQ(p->attempt, 1u);
  }
  for (const auto& v : ApplyAndReportAll({&a, &c}, retry)) {
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_EQ(v->kind, VerdictKind::kCommit);
  }
  // The blamed island was evicted; its late report is refused with "rejoin".
  auto stale = b.client->ReportSyncDone(*plans[1], 42, SomeStats());
  ASSERT_FALSE(stale.ok());
  EXPECT_TRUE(IsRejoinNeeded(stale.status())) << stale.status();
}

// A blamed island that reports the failed epoch itself is alive (the connection failed, not the island): on
// the first attempt it is kept, and the sync is retried with every member. From the second attempt on a blame
// evicts at once, so that a pair that keeps failing cannot loop. The grace is on the coordinator's clock, which
// does not move here: whichever report arrives first, and however long the other takes, b is kept.
TEST(MembershipTest, BlamedIslandThatReportsItselfIsKeptOnTheFirstAttempt) {
  CoordinatorHarness h(TestOptions());
  SimIsland a("a"), b("b");
  for (SimIsland* island : {&a, &b}) ASSERT_TRUE(island->Connect(h.address()).ok());
  auto plans = BeginAll({&a, &b}, SyncKey{0, 0});
  for (const auto& p : plans) ASSERT_TRUE(p.ok()) << p.status();
  const absl::Status blames_b = absl::UnavailableError("member 'b' (ipc:///tmp/x) disconnected during exchange 1");
  const absl::Status blames_a = absl::UnavailableError("member 'a' (ipc:///tmp/y) disconnected during exchange 1");
  auto fa =
      std::async(std::launch::async, [&] { return a.client->ReportSyncFailed(*plans[0], blames_b, "b", SomeStats()); });
  auto vb = b.client->ReportSyncFailed(*plans[1], blames_a, "a", SomeStats());
  auto va = fa.get();
  ASSERT_TRUE(va.ok()) << va.status();
  ASSERT_TRUE(vb.ok()) << vb.status();
  EXPECT_EQ(va->kind, VerdictKind::kRetry);
  EXPECT_EQ(vb->kind, VerdictKind::kRetry);
  EXPECT_EQ(h.coordinator().Snapshot().evictions, 0u);

  // Attempt 1 keeps both; its failure with a blame evicts the blamed island at once.
  auto retry = BeginAll({&a, &b}, SyncKey{0, 0});
  for (const auto& p : retry) {
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(Ids(*p), (std::vector<std::string>{"a", "b"}));
    EXPECT_EQ(p->attempt, 1u);
  }
  auto again = a.client->ReportSyncFailed(*retry[0], blames_b, "b", SomeStats());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->kind, VerdictKind::kRetry);
  EXPECT_EQ(h.coordinator().Snapshot().evictions, 1u);
  EXPECT_EQ(h.coordinator().Snapshot().members, (std::vector<std::string>{"a"}));
}

TEST(MembershipTest, MemberWhoseExchangeFailedAfterAnotherCompletedIsToldToRepair) {
  CoordinatorHarness h(TestOptions());
  SimIsland a("a"), b("b");
  for (SimIsland* island : {&a, &b}) ASSERT_TRUE(island->Connect(h.address()).ok());
  auto plans = BeginAll({&a, &b}, SyncKey{0, 0});
  for (const auto& p : plans) ASSERT_TRUE(p.ok()) << p.status();
  // a holds the full result and applies it; b's exchange fails late (no one to blame).
  auto fa = std::async(std::launch::async, [&] {
    a.Apply(plans[0]->key);
    a.Publish(plans[0]->key);
    return a.client->ReportSyncDone(*plans[0], a.Hash(), SomeStats());
  });
  auto vb = b.client->ReportSyncFailed(*plans[1], absl::DeadlineExceededError("timeout"), "", SomeStats());
  auto va = fa.get();
  ASSERT_TRUE(va.ok()) << va.status();
  EXPECT_EQ(va->kind, VerdictKind::kCommit);
  ASSERT_TRUE(vb.ok()) << vb.status();
  ASSERT_EQ(vb->kind, VerdictKind::kRepair);
  ASSERT_TRUE(vb->source.has_value());
  EXPECT_EQ(vb->source->island_id, "a");
  EXPECT_EQ(vb->source->expected_hash, a.Hash());
  auto snap = FetchState(vb->source->endpoint, vb->source->expected_hash);
  ASSERT_TRUE(snap.ok()) << snap.status();
  b.Load(snap->image);
  EXPECT_EQ(b.Hash(), a.Hash());
  ASSERT_TRUE(b.client->ReportStateLoaded(vb->source->key, b.Hash()).ok());
  auto next = BeginAll({&a, &b}, SyncKey{1, 0});
  for (const auto& p : next) ASSERT_TRUE(p.ok()) << p.status();
}

TEST(MembershipTest, FingerprintMismatchIsRefusedNamingBothFingerprints) {
  CoordinatorHarness h(TestOptions());
  SimIsland a("a"), b("b");
  ASSERT_TRUE(a.Connect(h.address()).ok());
  auto refused = b.Connect(h.address(), /*fingerprint=*/0x00000000deadbeefULL);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  const std::string message(refused.status().message());
  EXPECT_NE(message.find("00000000deadbeef"), std::string::npos) << message;
  EXPECT_NE(message.find("1234abcd5678ef90"), std::string::npos) << message;
  EXPECT_EQ(h.coordinator().Snapshot().members, std::vector<std::string>{"a"});
}

// Islands are admitted in the coordinator's sync mode only (issue 33): a 1-bit Adam island at a DiLoCo coordinator
// and a DiLoCo island at a 1-bit Adam one are refused naming both modes; the schedule says the mode.
TEST(MembershipTest, AnIslandOfAnotherSyncModeIsRefusedNamingBothModes) {
  for (const std::string coordinator_mode : {"diloco", "onebit-adam"}) {
    const std::string other = coordinator_mode == "diloco" ? "onebit-adam" : "diloco";
    CoordinatorOptions o = TestOptions();
    o.schedule.sync_mode = coordinator_mode;
    CoordinatorHarness h(o);
    SimIsland a("a"), b("b");
    IslandJoinRequest wrong = b.Request();
    wrong.sync_mode = other;
    auto refused = b.client->Connect(h.address(), wrong);
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
    const std::string message(refused.status().message());
    EXPECT_NE(message.find(fl::StrCat("island 'b' syncs with mode '", other,
                                      "' but this coordinator's islands sync with '", coordinator_mode, "'")),
              std::string::npos)
        << message;
    EXPECT_NE(message.find(fl::StrCat("--sync-mode ", other)), std::string::npos) << message;
    IslandJoinRequest right = a.Request();
    right.sync_mode = coordinator_mode;
    auto admitted = a.client->Connect(h.address(), right);
    ASSERT_TRUE(admitted.ok()) << admitted.status();
    EXPECT_EQ(admitted->schedule.sync_mode, coordinator_mode);
    EXPECT_EQ(h.coordinator().Snapshot().members, std::vector<std::string>{"a"});
  }
}

TEST(MembershipTest, ConfiguredFingerprintRefusesEvenTheFirstIsland) {
  CoordinatorOptions o = TestOptions();
  o.model_fingerprint = 0x1111111111111111ULL;
  CoordinatorHarness h(o);
  SimIsland a("a");
  auto refused = a.Connect(h.address());
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(std::string(refused.status().message()).find("1111111111111111"), std::string::npos);
}

TEST(MembershipTest, BadRequestsAreRefusedNamingTheValue) {
  CoordinatorHarness h(TestOptions());
  SimIsland a("a");
  IslandJoinRequest bad = a.Request();
  bad.island_id = "has space";
  CoordinatorClient client;
  auto refused = client.Connect(h.address(), bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(refused.status().message()).find("has space"), std::string::npos);

  ASSERT_TRUE(a.Connect(h.address()).ok());
  SimIsland again("a");
  auto duplicate = again.Connect(h.address());
  ASSERT_FALSE(duplicate.ok());
  EXPECT_EQ(duplicate.status().code(), absl::StatusCode::kAlreadyExists) << duplicate.status();

  // Keys must increase.
  auto p0 = a.client->BeginSync(SyncKey{0, 0});
  ASSERT_TRUE(p0.ok());
  a.Apply(p0->key);
  ASSERT_TRUE(a.client->ReportSyncDone(*p0, a.Hash(), SomeStats()).ok());
  auto back = a.client->BeginSync(SyncKey{0, 0});
  ASSERT_FALSE(back.ok());
  EXPECT_EQ(back.status().code(), absl::StatusCode::kFailedPrecondition) << back.status();
}

TEST(MembershipTest, ScheduleEndsAfterTheLastSyncAndTheIslandsLeave) {
  CoordinatorOptions o = TestOptions();
  o.schedule.inner_steps = 4;
  o.schedule.num_fragments = 2;
  o.schedule.total_outer_steps = 2;
  CoordinatorHarness h(o);
  SimIsland a("a"), b("b");
  for (SimIsland* island : {&a, &b}) ASSERT_TRUE(island->Connect(h.address()).ok());
  for (uint64_t step = 0; step < 2; ++step) {
    for (uint32_t fragment = 0; fragment < 2; ++fragment) {
      auto plans = BeginAll({&a, &b}, SyncKey{step, fragment});
      for (const auto& p : plans) ASSERT_TRUE(p.ok()) << p.status();
      for (const auto& v : ApplyAndReportAll({&a, &b}, plans)) ASSERT_TRUE(v.ok()) << v.status();
    }
  }
  EXPECT_TRUE(h.coordinator().Snapshot().finished);
  auto past = a.client->BeginSync(SyncKey{2, 0});
  EXPECT_EQ(past.status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(a.client->Leave("finished").ok());
  ASSERT_TRUE(b.client->Leave("finished").ok());
  EXPECT_TRUE(h.coordinator().WaitDone(absl::Seconds(30)));
}

}  // namespace
}  // namespace fl::diloco::testing
