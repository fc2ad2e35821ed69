// The round engine's upload slots (server/src/engine_transfers.h) on an injected ManualClock: slots and receive
// buffers, and which uploads lose their slot (silent, a trickle, a stall after a fast start) and which keep it
// (a steady one, one that only the server's own stall kept silent).
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "../src/engine_transfers.h"
#include "fl/rpc/clock.h"

namespace fl::server::engine {
namespace {

constexpr int64_t kMs = 1'000'000;

class FakeUpload final : public UploadHandle {
 public:
  uint64_t bytes_received() const override { return bytes; }
  int64_t last_message_ns() const override { return last_message; }
  void Revoke(const grpc::Status&) override {}
  uint64_t bytes = 0;
  int64_t last_message = 0;
};

UploadLimits Limits() {
  UploadLimits l;
  l.message_timeout_ms = 3'000;
  l.min_bytes_per_s = 1'000;
  l.rate_grace_ms = 5'000;
  l.max_chunk_bytes = 1'000;
  return l;
}

TEST(UploadSlotsTest, SlotsAreCountedAndAtMostOneBufferPerSlotIsKept) {
  UploadSlots slots(2);
  EXPECT_TRUE(slots.HasFree());
  slots.Take();
  slots.Take();
  EXPECT_FALSE(slots.HasFree());
  slots.Give();
  EXPECT_TRUE(slots.HasFree());
  EXPECT_EQ(slots.busy(), 1u);
  slots.ReturnBuffer(std::vector<uint8_t>(16, 1));
  slots.ReturnBuffer(std::vector<uint8_t>(16, 2));
  slots.ReturnBuffer(std::vector<uint8_t>(16, 3));  // a third is freed, not kept
  EXPECT_EQ(slots.buffers(), 2u);
  const std::vector<uint8_t> reused = slots.TakeBuffer();
  EXPECT_TRUE(reused.empty());        // cleared before reuse ...
  EXPECT_GE(reused.capacity(), 16u);  // ... but its memory kept
  slots.DropBuffers();
  EXPECT_EQ(slots.buffers(), 0u);
}

TEST(UploadSlotsTest, UploadsWaitingForASlotComeOutFirstComeFirstServed) {
  UploadSlots slots(1);
  EXPECT_FALSE(slots.HasWaiting());
  for (const char* task : {"t1", "t2", "t3"}) {
    UploadStartEvent e;
    e.header.set_task_id(task);
    slots.Wait(std::move(e));
  }
  EXPECT_EQ(slots.waiting(), 3u);
  std::vector<std::string> order;
  while (slots.HasWaiting()) order.push_back(slots.NextWaiting().header.task_id());
  EXPECT_EQ(order, (std::vector<std::string>{"t1", "t2", "t3"}));
  EXPECT_EQ(slots.waiting(), 0u);
}

TEST(UploadSlotsTest, ASilentUploadLosesItsSlotOnceAfterTheMessageTimeout) {
  rpc::ManualClock clock;
  UploadSlots slots(1);
  auto up = std::make_shared<FakeUpload>();
  slots.Watch(up, "a", "t1", clock.NowNs(), 10'000);
  clock.AdvanceMs(3'000);
  EXPECT_TRUE(slots.Judge(clock.NowNs(), Limits()).empty());  // exactly the limit: not yet
  clock.AdvanceMs(1);
  auto revoked = slots.Judge(clock.NowNs(), Limits());
  ASSERT_EQ(revoked.size(), 1u);
  EXPECT_EQ(revoked[0].client_id, "a");
  EXPECT_EQ(revoked[0].task_id, "t1");
  EXPECT_EQ(revoked[0].status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_NE(revoked[0].status.error_message().find("--upload-message-timeout-ms"), std::string::npos);
  clock.AdvanceMs(1'000);
  EXPECT_TRUE(slots.Judge(clock.NowNs(), Limits()).empty());  // revoked once
}

TEST(UploadSlotsTest, ATrickleBelowTheMinimumRateLosesItsSlotAfterTheGrace) {
  rpc::ManualClock clock;
  UploadSlots slots(1);
  auto up = std::make_shared<FakeUpload>();
  slots.Watch(up, "a", "t1", clock.NowNs(), 1'000'000);
  for (int s = 1; s <= 5; ++s) {  // 500 bytes/s, messages every second: never silent
    clock.AdvanceMs(1'000);
    up->bytes += 500;
    up->last_message = clock.NowNs();
    EXPECT_TRUE(slots.Judge(clock.NowNs(), Limits()).empty()) << s;  // within the grace
  }
  clock.AdvanceMs(1'000);
  up->bytes += 500;
  up->last_message = clock.NowNs();
  auto revoked = slots.Judge(clock.NowNs(), Limits());
  ASSERT_EQ(revoked.size(), 1u);
  EXPECT_EQ(revoked[0].status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(revoked[0].status.error_message().find("averaged"), std::string::npos);
}

TEST(UploadSlotsTest, AStallAfterAFastStartLosesItsSlotOverItsRecentWindow) {
  rpc::ManualClock clock;
  UploadSlots slots(1);
  auto up = std::make_shared<FakeUpload>();
  slots.Watch(up, "a", "t1", clock.NowNs(), 1'000'000);
  clock.AdvanceMs(1'000);
  up->bytes = 500'000;  // fast: its average stays far above the minimum for minutes
  up->last_message = clock.NowNs();
  EXPECT_TRUE(slots.Judge(clock.NowNs(), Limits()).empty());
  // Then only a few bytes a second: messages keep coming (no timeout), the average stays high, the window does not.
  std::vector<UploadSlots::Revocation> revoked;
  for (int i = 0; i < 10 && revoked.empty(); ++i) {
    clock.AdvanceMs(500);
    up->bytes += 10;
    up->last_message = clock.NowNs();
    revoked = slots.Judge(clock.NowNs(), Limits());
  }
  ASSERT_EQ(revoked.size(), 1u);
  EXPECT_NE(revoked[0].status.error_message().find("most recent window"), std::string::npos);
}

TEST(UploadSlotsTest, ASteadyUploadKeepsItsSlot) {
  rpc::ManualClock clock;
  UploadSlots slots(1);
  auto up = std::make_shared<FakeUpload>();
  slots.Watch(up, "a", "t1", clock.NowNs(), 100'000);
  for (int i = 0; i < 40; ++i) {  // 5,000 bytes/s in 500-byte messages
    clock.AdvanceMs(100);
    up->bytes += 500;
    up->last_message = clock.NowNs();
    EXPECT_TRUE(slots.Judge(clock.NowNs(), Limits()).empty()) << i;
  }
}

TEST(UploadSlotsTest, TheServersOwnStallIsNotTheUploadsSilence) {
  rpc::ManualClock clock;
  UploadSlots slots(1);
  auto up = std::make_shared<FakeUpload>();
  slots.Watch(up, "a", "t1", clock.NowNs(), 10'000);
  clock.AdvanceMs(500);
  up->bytes = 5'000;
  up->last_message = clock.NowNs();
  clock.AdvanceMs(6'000);  // the server was stopped for 6 s
  slots.MoveOn(6'000 * kMs);
  EXPECT_TRUE(slots.Judge(clock.NowNs(), Limits()).empty());
  slots.Unwatch(up.get());
  EXPECT_FALSE(slots.watching());
  clock.AdvanceMs(60'000);
  EXPECT_TRUE(slots.Judge(clock.NowNs(), Limits()).empty());  // no longer watched
}

}  // namespace
}  // namespace fl::server::engine
