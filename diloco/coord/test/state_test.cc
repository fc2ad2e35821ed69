// Global-state consistency over real loopback gRPC: late joiners are told where to copy the state and its
// hash and get bit-identical bytes; wrong hashes are refused; a state hash that differs from the
// majority's is detected and a repair ordered, and the repaired island trains on only after it reported
// the committed hash.
#include <gtest/gtest.h>

#include "coord_test_util.h"
#include "fl/core/checksum.h"
#include "fl/instrumentation/island_records.h"

namespace fl::diloco::testing {
namespace {

TEST(StateTransferTest, FetchStateReturnsTheExactBytesAndChecksTheHash) {
  auto server = StateServer::Start("127.0.0.1:0");
  ASSERT_TRUE(server.ok()) << server.status();
  std::vector<uint8_t> image(3 * (1 << 20) + 17);  // several chunks and a partial one
  for (size_t i = 0; i < image.size(); ++i) image[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
  const uint64_t hash = core::Checksum64(image);
  (*server)->Publish({SyncKey{7, 1}, hash, image});

  auto snap = FetchState((*server)->endpoint(), hash);
  ASSERT_TRUE(snap.ok()) << snap.status();
  EXPECT_EQ(snap->image, image);
  EXPECT_EQ(snap->key, (SyncKey{7, 1}));
  EXPECT_EQ(snap->state_hash, hash);

  // A hash the server does not hold: NotFound after the (short) wait, naming what it holds.
  FetchOptions quick;
  quick.wait_for_snapshot = absl::Milliseconds(100);
  auto missing = FetchState((*server)->endpoint(), hash ^ 1, quick);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound) << missing.status();
  EXPECT_NE(std::string(missing.status().message()).find(instrumentation::HashHex(hash)), std::string::npos);

  // A verifier that recomputes another hash from the bytes: refused, never handed over.
  FetchOptions lying;
  lying.verify = [](std::span<const uint8_t>) -> absl::StatusOr<uint64_t> { return uint64_t{99}; };
  auto refused = FetchState((*server)->endpoint(), hash, lying);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();

  // An image published under a hash it does not have (a buggy island): the default verifier catches it.
  (*server)->Publish({SyncKey{8, 0}, 12345, image});
  auto bad = FetchState((*server)->endpoint(), 12345);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kFailedPrecondition) << bad.status();
  EXPECT_EQ((*server)->transfers_served(), 3u);
}

TEST(StateTransferTest, FetchWaitsForTheSnapshotToBePublished) {
  auto server = StateServer::Start("127.0.0.1:0");
  ASSERT_TRUE(server.ok());
  const std::vector<uint8_t> image = {1, 2, 3, 4, 5};
  const uint64_t hash = core::Checksum64(image);
  auto fetch = std::async(std::launch::async, [&] { return FetchState((*server)->endpoint(), hash); });
  ASSERT_TRUE(WaitUntil([&] { return (*server)->fetches_waiting() == 1; })) << "the fetch reached the server";
  (*server)->Publish({SyncKey{0, 0}, hash, image});
  auto snap = fetch.get();
  ASSERT_TRUE(snap.ok()) << snap.status();
  EXPECT_EQ(snap->image, image);
}

TEST(LateJoinTest, LateJoinerCopiesVerifiedStateAndJoinsTheNextSync) {
  CoordinatorHarness h(TestOptions());
  SimIsland a("a"), b("b");
  for (SimIsland* island : {&a, &b}) ASSERT_TRUE(island->Connect(h.address()).ok());
  for (uint64_t step = 0; step < 2; ++step) {
    auto plans = BeginAll({&a, &b}, SyncKey{step, 0});
    for (const auto& p : plans) ASSERT_TRUE(p.ok()) << p.status();
    for (const auto& v : ApplyAndReportAll({&a, &b}, plans)) ASSERT_TRUE(v.ok()) << v.status();
  }
  ASSERT_EQ(a.Hash(), b.Hash());

  SimIsland c("c");
  auto assignment = c.Connect(h.address());
  ASSERT_TRUE(assignment.ok()) << assignment.status();
  ASSERT_TRUE(assignment->state_source.has_value());
  const StateSource& source = *assignment->state_source;
  EXPECT_EQ(source.island_id, "a") << "the first holder in ring order";
  EXPECT_EQ(source.endpoint, a.state_server->endpoint());
  EXPECT_EQ(source.expected_hash, a.Hash());
  EXPECT_EQ(source.key, (SyncKey{1, 0}));
  EXPECT_EQ(h.coordinator().Snapshot().loading, std::vector<std::string>{"c"});

  // Not a member until it reported the state: a BeginSync now is refused.
  EXPECT_EQ(c.client->BeginSync(SyncKey{2, 0}).status().code(), absl::StatusCode::kFailedPrecondition);
  // A wrong hash is refused by the fetch and by the coordinator.
  FetchOptions quick;
  quick.wait_for_snapshot = absl::Milliseconds(100);
  EXPECT_FALSE(FetchState(source.endpoint, source.expected_hash + 1, quick).ok());

  auto snap = FetchState(source.endpoint, source.expected_hash);
  ASSERT_TRUE(snap.ok()) << snap.status();
  EXPECT_EQ(snap->image, a.Image()) << "bit-identical state";
  c.Load(snap->image);
  EXPECT_EQ(c.Hash(), source.expected_hash);
  auto wrong = c.client->ReportStateLoaded(source.key, source.expected_hash ^ 0xff);
  EXPECT_EQ(wrong.code(), absl::StatusCode::kFailedPrecondition) << wrong;
  ASSERT_TRUE(c.client->ReportStateLoaded(source.key, c.Hash()).ok());
  EXPECT_TRUE(h.coordinator().Snapshot().loading.empty());

  // Its state includes sync (1, 0): it continues with (2, 0), in ring position by admission.
  EXPECT_EQ(c.client->BeginSync(SyncKey{1, 0}).status().code(), absl::StatusCode::kFailedPrecondition);
  auto plans = BeginAll({&a, &b, &c}, SyncKey{2, 0});
  for (const auto& p : plans) {
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(Ids(*p), (std::vector<std::string>{"a", "b", "c"}));
  }
  for (const auto& v : ApplyAndReportAll({&a, &b, &c}, plans)) {
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_EQ(v->kind, VerdictKind::kCommit);
  }
  EXPECT_EQ(c.Hash(), a.Hash());
}

TEST(LateJoinTest, BarrierWaitsForALateJoinerStillCopyingTheState) {
  CoordinatorHarness h(TestOptions());
  SimIsland a("a"), b("b");
  for (SimIsland* island : {&a, &b}) ASSERT_TRUE(island->Connect(h.address()).ok());
  auto plans = BeginAll({&a, &b}, SyncKey{0, 0});
  for (const auto& p : plans) ASSERT_TRUE(p.ok());
  for (const auto& v : ApplyAndReportAll({&a, &b}, plans)) ASSERT_TRUE(v.ok());

  SimIsland c("c");
  auto assignment = c.Connect(h.address());
  ASSERT_TRUE(assignment.ok() && assignment->state_source.has_value());
  // a and b reach the next barrier before c has even fetched the state: the barrier must wait for c
  // (if it formed without c, c's BeginSync below would be refused and the plans would lack it).
  auto early = std::async(std::launch::async, [&] { return BeginAll({&a, &b}, SyncKey{1, 0}); });
  auto snap = FetchState(assignment->state_source->endpoint, assignment->state_source->expected_hash);
  ASSERT_TRUE(snap.ok()) << snap.status();
  c.Load(snap->image);
  ASSERT_TRUE(c.client->ReportStateLoaded(assignment->state_source->key, c.Hash()).ok());
  auto pc = c.client->BeginSync(SyncKey{1, 0});
  ASSERT_TRUE(pc.ok()) << pc.status();
  auto pab = early.get();
  for (const auto& p : pab) {
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(Ids(*p), (std::vector<std::string>{"a", "b", "c"}));
    EXPECT_EQ(p->epoch, pc->epoch);
  }
}

TEST(HashCheckTest, MinorityHashIsDetectedAndRepairedFromTheMajority) {
  CoordinatorHarness h(TestOptions());
  SimIsland a("a"), b("b"), c("c");
  for (SimIsland* island : {&a, &b, &c}) ASSERT_TRUE(island->Connect(h.address()).ok());
  auto plans = BeginAll({&a, &b, &c}, SyncKey{0, 0});
  for (const auto& p : plans) ASSERT_TRUE(p.ok());
  // c's outer step went wrong (a flipped bit): its state differs.
  std::vector<std::future<absl::StatusOr<Verdict>>> reports;
  for (size_t i = 0; i < 3; ++i) {
    SimIsland* island = std::vector<SimIsland*>{&a, &b, &c}[i];
    const SyncPlan plan = *plans[i];
    reports.push_back(std::async(std::launch::async, [island, plan] {
      island->Apply(plan.key);
      if (island->id == "c") island->params[2] = std::nextafter(island->params[2], 100.0f);
      island->Publish(plan.key);
      return island->client->ReportSyncDone(plan, island->Hash(), SomeStats());
    }));
  }
  auto va = reports[0].get(), vb = reports[1].get(), vc = reports[2].get();
  ASSERT_TRUE(va.ok() && vb.ok() && vc.ok());
  EXPECT_EQ(va->kind, VerdictKind::kCommit);
  EXPECT_EQ(vb->kind, VerdictKind::kCommit);
  ASSERT_EQ(vc->kind, VerdictKind::kRepair);
  ASSERT_TRUE(vc->source.has_value());
  EXPECT_EQ(vc->source->island_id, "a");
  EXPECT_EQ(vc->source->expected_hash, a.Hash());
  EXPECT_EQ(vc->majority_hash, a.Hash());
  EXPECT_NE(c.Hash(), a.Hash());
  EXPECT_EQ(h.coordinator().Snapshot().hash_mismatches, 1u);

  // Never trained on: the next sync is refused until the repair is reported.
  EXPECT_EQ(c.client->BeginSync(SyncKey{1, 0}).status().code(), absl::StatusCode::kFailedPrecondition);
  auto snap = FetchState(vc->source->endpoint, vc->source->expected_hash);
  ASSERT_TRUE(snap.ok()) << snap.status();
  c.Load(snap->image);
  ASSERT_EQ(c.Hash(), a.Hash());
  ASSERT_TRUE(c.client->ReportStateLoaded(vc->source->key, c.Hash()).ok());
  auto next = BeginAll({&a, &b, &c}, SyncKey{1, 0});
  for (const auto& p : next) ASSERT_TRUE(p.ok()) << p.status();
  for (const auto& v : ApplyAndReportAll({&a, &b, &c}, next)) {
    ASSERT_TRUE(v.ok());
    EXPECT_EQ(v->kind, VerdictKind::kCommit);
  }
}

TEST(HashCheckTest, TieGoesToTheMemberFirstInRingOrder) {
  CoordinatorHarness h(TestOptions());
  SimIsland a("a"), b("b");
  for (SimIsland* island : {&a, &b}) ASSERT_TRUE(island->Connect(h.address()).ok());
  auto plans = BeginAll({&a, &b}, SyncKey{0, 0});
  b.params[0] += 1.0f;  // b diverged
  auto verdicts = ApplyAndReportAll({&a, &b}, plans);
  ASSERT_TRUE(verdicts[0].ok() && verdicts[1].ok());
  EXPECT_EQ(verdicts[0]->kind, VerdictKind::kCommit);
  EXPECT_EQ(verdicts[1]->kind, VerdictKind::kRepair);
  EXPECT_EQ(verdicts[1]->source->island_id, "a");
}

}  // namespace
}  // namespace fl::diloco::testing
