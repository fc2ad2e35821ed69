// Ring all-reduce failures: bad options, a vanished or silent peer, stale and malformed messages. Every
// failed exchange must leave the caller's values exactly as they were.
#include "fl/diloco/ring_allreduce.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "fl/core/codec.h"
#include "ring_test_util.h"

namespace fl::diloco {
namespace {

using testing::BitEqual;
using testing::CreateAll;
using testing::FakeMember;
using testing::LoopbackMembers;
using testing::Msg;
using testing::RandomValues;
using testing::RingOf;
using testing::RunExchange;
using wire::MessageType;

#define EXPECT_ERROR(status, code_, text)                                            \
  do {                                                                               \
    const absl::Status _s = (status);                                                \
    EXPECT_EQ(_s.code(), (code_)) << _s;                                             \
    EXPECT_NE(Msg(_s).find(text), std::string::npos) << "wanted '" << (text) << "' in: " << _s; \
  } while (0)

TEST(RingOptionsTest, BadOptionsAreRejectedNamingTheField) {
  RingOptions o;
  EXPECT_ERROR(RingAllReduce::Create(o).status(), absl::StatusCode::kInvalidArgument, "members is empty");
  o.members = LoopbackMembers(2);
  o.self = 2;
  EXPECT_ERROR(RingAllReduce::Create(o).status(), absl::StatusCode::kInvalidArgument, "self is 2");
  o.self = 0;
  o.codec = "int9";
  EXPECT_ERROR(RingAllReduce::Create(o).status(), absl::StatusCode::kInvalidArgument, "codec 'int9'");
  o.codec = "fp32";
  o.connections_per_peer = 0;
  EXPECT_ERROR(RingAllReduce::Create(o).status(), absl::StatusCode::kInvalidArgument, "connections_per_peer");
  o.connections_per_peer = 1;
  o.timeout = absl::ZeroDuration();
  EXPECT_ERROR(RingAllReduce::Create(o).status(), absl::StatusCode::kInvalidArgument, "timeout");
  o.timeout = absl::Seconds(1);
  o.members[1].id = o.members[0].id;
  EXPECT_ERROR(RingAllReduce::Create(o).status(), absl::StatusCode::kInvalidArgument, "appears twice");
  o.members = LoopbackMembers(2);
  o.members[1].endpoint = "inproc://x";
  EXPECT_ERROR(RingAllReduce::Create(o).status(), absl::StatusCode::kInvalidArgument, "inproc");
}

TEST(RingOptionsTest, AnEndpointInUseIsUnavailable) {
  RingOptions o;
  o.members = LoopbackMembers(2);
  o.linger = absl::ZeroDuration();  // m1 never exists: do not wait for the hello to reach it
  auto first = RingAllReduce::Create(o);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_ERROR(RingAllReduce::Create(o).status(), absl::StatusCode::kUnavailable, o.members[0].endpoint);
}

TEST(RingFailureTest, ExchangeIdsMustIncrease) {
  auto rings = CreateAll(RingOf(1));
  ASSERT_EQ(rings.size(), 1u);
  std::vector<float> v = RandomValues(10, 1);
  ASSERT_TRUE(rings[0]->AllReduce(5, 0, v, ReduceOp::kMean, nullptr).ok());
  EXPECT_ERROR(rings[0]->AllReduce(5, 0, v, ReduceOp::kMean, nullptr), absl::StatusCode::kInvalidArgument,
               "exchange_id 5 is not larger");
}

// A member vanishes (its process closes its sockets) while the others are inside the exchange: each of
// them fails fast with Unavailable naming it (its neighbours see the connection close, the rest get the
// abort that goes around the ring), long before the 20 s timeout, and keeps its values.
TEST(RingFailureTest, AVanishedPeerFailsEveryOtherMemberNamingIt) {
  for (size_t vanishing : {size_t{2}, size_t{0}}) {
    SCOPED_TRACE(fl::StrCat("member ", vanishing, " vanishes"));
    const size_t m = 4, n = 50000;
    RingOptions base;
    base.timeout = absl::Seconds(20);
    base.linger = absl::ZeroDuration();
    base.sub_chunk_values = 4096;
    auto rings = CreateAll(RingOf(m, base));
    ASSERT_EQ(rings.size(), m);
    std::vector<std::vector<float>> values;
    for (size_t i = 0; i < m; ++i) values.push_back(RandomValues(n, static_cast<uint32_t>(i)));
    // A first exchange succeeds (so every connection is up and has said hello).
    auto warm = values;
    const auto first = RunExchange(rings, 1, warm, ReduceOp::kMean);
    for (const auto& s : first.status) ASSERT_TRUE(s.ok()) << s;

    const auto before = values;
    std::vector<absl::Status> status(m);
    std::vector<std::thread> threads;
    for (size_t i = 0; i < m; ++i) {
      if (i == vanishing) continue;
      threads.emplace_back([&, i] { status[i] = rings[i]->AllReduce(2, 0, values[i], ReduceOp::kMean, nullptr); });
    }
    // Let the others get into the exchange, then close the vanishing member's sockets.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    rings[vanishing].reset();
    for (auto& t : threads) t.join();
    const std::string name = fl::StrCat("'m", vanishing, "'");
    for (size_t i = 0; i < m; ++i) {
      if (i == vanishing) continue;
      EXPECT_ERROR(status[i], absl::StatusCode::kUnavailable, name);
      EXPECT_TRUE(BitEqual(values[i], before[i])) << "member " << i << " changed its values";
    }
  }
}

// A member whose own values hold a NaN fails the exchange (the codec refuses to encode it) and so does
// every other member, through the abort, naming it; nobody's values change.
TEST(RingFailureTest, ANonFiniteInputFailsEveryMemberNamingItsOwner) {
  const size_t m = 3, n = 3000;
  auto rings = CreateAll(RingOf(m));
  ASSERT_EQ(rings.size(), m);
  std::vector<std::vector<float>> values;
  for (size_t i = 0; i < m; ++i) values.push_back(RandomValues(n, static_cast<uint32_t>(i)));
  values[1][RingChunk(n, m, 1).begin + 5] = std::numeric_limits<float>::quiet_NaN();  // m1's own chunk
  const auto before = values;
  const auto result = RunExchange(rings, 1, values, ReduceOp::kMean);
  for (size_t i = 0; i < m; ++i) {
    EXPECT_ERROR(result.status[i], absl::StatusCode::kInvalidArgument, "member 'm1'");
    EXPECT_NE(Msg(result.status[i]).find("its own values"), std::string::npos) << result.status[i];
    // Bitwise, since NaN != NaN.
    EXPECT_EQ(std::memcmp(values[i].data(), before[i].data(), n * sizeof(float)), 0) << "member " << i;
  }
}

// A member that is connected but never takes part: its successor gives up at the timeout, naming it.
TEST(RingFailureTest, ASilentPeerTimesOutNamingIt) {
  RingOptions base;
  base.timeout = absl::Milliseconds(300);
  base.linger = absl::ZeroDuration();
  auto rings = CreateAll(RingOf(2, base));
  ASSERT_EQ(rings.size(), 2u);
  std::vector<float> v = RandomValues(1000, 3);
  const auto before = v;
  EXPECT_ERROR(rings[0]->AllReduce(1, 0, v, ReduceOp::kMean, nullptr), absl::StatusCode::kDeadlineExceeded,
               "'m1'");
  EXPECT_TRUE(BitEqual(v, before));
}

// The member under test is m1 of a ring of two; the test plays m0 by hand. For M = 2: m1 sends its chunk 1
// (reduce-scatter step 0), receives chunk 0 (which completes it: m1 owns chunk 0), sends the final chunk 0
// (all-gather step 0) and receives the final chunk 1 from m0.
class HandDrivenRingTest : public ::testing::Test {
 public:
  static constexpr size_t kN = 1001;
  static constexpr uint64_t kExchange = 10;

  void SetUp() override {
    members_ = LoopbackMembers(2);
    fake_ = std::make_unique<FakeMember>(members_, 0);
    RingOptions o;
    o.members = members_;
    o.self = 1;
    o.timeout = absl::Seconds(10);
    o.linger = absl::ZeroDuration();
    auto ring = RingAllReduce::Create(o);
    ASSERT_TRUE(ring.ok()) << ring.status();
    ring_ = std::move(*ring);
    auto codec = fl::core::MakeCodec("fp32");
    ASSERT_TRUE(codec.ok());
    codec_ = std::move(*codec);
    x0_ = RandomValues(kN, 100);
    x1_ = RandomValues(kN, 200);
    fake_->SendHello();
  }

  // Starts m1's exchange on a thread.
  void Start() {
    values_ = x1_;
    thread_ = std::thread([this] { status_ = ring_->AllReduce(kExchange, 0, values_, ReduceOp::kMean, &stats_); });
  }
  void Join() { thread_.join(); }

  wire::Header ReduceScatterChunk0(uint64_t exchange) const {
    wire::Header h = fake_->Header(MessageType::kReduceScatter, exchange);
    const ValueRange r = RingChunk(kN, 2, 0);
    h.step = 0;
    h.chunk = 0;
    h.sub = 0;
    h.offset = r.begin;
    h.count = r.size();
    h.total = kN;
    return h;
  }
  std::vector<uint8_t> Encode(size_t begin, size_t end, const std::vector<float>& x) const {
    std::vector<uint8_t> out;
    EXPECT_TRUE(codec_->Encode(std::span<const float>(x.data() + begin, end - begin), &out).ok());
    return out;
  }
  std::vector<uint8_t> Chunk0Payload() const {
    const ValueRange r = RingChunk(kN, 2, 0);
    return Encode(r.begin, r.end, x0_);
  }

  // Plays m0 correctly from the reduce-scatter on, and checks m1's result. `before_all_gather` runs just
  // before m0's last message, while m1 is still inside the exchange.
  void PlayTheRestAndCheck(const std::function<void()>& before_all_gather = [] {}) {
    fake_->Send(ReduceScatterChunk0(kExchange), Chunk0Payload());
    auto rs = fake_->Receive();  // m1's chunk 1
    ASSERT_TRUE(rs.has_value());
    ASSERT_EQ(rs->first.type, MessageType::kReduceScatter);
    const ValueRange c1 = RingChunk(kN, 2, 1);
    std::vector<float> mean(c1.size());
    ASSERT_TRUE(codec_->Decode(rs->second, mean).ok());
    for (size_t i = 0; i < c1.size(); ++i) mean[i] = (mean[i] + x0_[c1.begin + i]) / 2.0f;  // x1 + x0, / M
    wire::Header h = fake_->Header(MessageType::kAllGather, kExchange);
    h.chunk = 1;
    h.offset = c1.begin;
    h.count = c1.size();
    h.total = kN;
    before_all_gather();
    fake_->Send(h, Encode(0, mean.size(), mean));
    Join();
    ASSERT_TRUE(status_.ok()) << status_;
    const ValueRange c0 = RingChunk(kN, 2, 0);
    for (size_t i = c0.begin; i < c0.end; ++i) ASSERT_EQ(values_[i], (x0_[i] + x1_[i]) / 2.0f) << i;
    for (size_t i = c1.begin; i < c1.end; ++i) ASSERT_EQ(values_[i], mean[i - c1.begin]) << i;
    // m1's all-gather message carries its final chunk 0.
    auto ag = fake_->Receive();
    ASSERT_TRUE(ag.has_value());
    ASSERT_EQ(ag->first.type, MessageType::kAllGather);
    std::vector<float> chunk0(c0.size());
    ASSERT_TRUE(codec_->Decode(ag->second, chunk0).ok());
    for (size_t i = c0.begin; i < c0.end; ++i) ASSERT_EQ(chunk0[i - c0.begin], values_[i]) << i;
  }

  std::vector<RingMember> members_;
  std::unique_ptr<FakeMember> fake_;
  std::unique_ptr<RingAllReduce> ring_;
  std::unique_ptr<fl::core::Codec> codec_;
  std::vector<float> x0_, x1_, values_;
  absl::Status status_;
  ExchangeStats stats_;
  std::thread thread_;
};

// Messages of an older exchange or of another ring (an earlier membership) are dropped and counted; the
// exchange completes with the right values.
TEST_F(HandDrivenRingTest, StaleAndForeignMessagesAreDiscarded) {
  Start();
  fake_->Send(ReduceScatterChunk0(kExchange - 1), Chunk0Payload());  // an aborted earlier exchange
  wire::Header foreign = ReduceScatterChunk0(kExchange);
  foreign.ring ^= 1;  // another ring configuration
  fake_->Send(foreign, Chunk0Payload());
  PlayTheRestAndCheck();
  EXPECT_EQ(stats_.stale_discarded, 2u);
}

// A message of the next exchange (a predecessor already ahead) that arrives during this exchange waits
// for the next one, which then completes with it.
TEST_F(HandDrivenRingTest, AMessageOfTheNextExchangeIsKeptForIt) {
  Start();
  // m0 is ahead: its exchange kExchange+1 message comes before its last message of kExchange.
  PlayTheRestAndCheck([this] { fake_->Send(ReduceScatterChunk0(kExchange + 1), Chunk0Payload()); });
  values_ = x1_;
  thread_ = std::thread(
      [this] { status_ = ring_->AllReduce(kExchange + 1, 0, values_, ReduceOp::kMean, &stats_); });
  auto rs = fake_->Receive();
  ASSERT_TRUE(rs.has_value());
  EXPECT_EQ(rs->first.exchange_id, kExchange + 1);
  EXPECT_EQ(rs->first.type, MessageType::kReduceScatter);
  auto ag = fake_->Receive();  // m1 completed chunk 0 with the kept message and sent it on
  ASSERT_TRUE(ag.has_value());
  EXPECT_EQ(ag->first.type, MessageType::kAllGather);
  EXPECT_EQ(ag->first.exchange_id, kExchange + 1);
  const ValueRange c1 = RingChunk(kN, 2, 1);
  wire::Header h = fake_->Header(MessageType::kAllGather, kExchange + 1);
  h.chunk = 1;
  h.offset = c1.begin;
  h.count = c1.size();
  h.total = kN;
  fake_->Send(h, Encode(c1.begin, c1.end, x0_));
  Join();
  ASSERT_TRUE(status_.ok()) << status_;
  const ValueRange c0 = RingChunk(kN, 2, 0);
  for (size_t i = c0.begin; i < c0.end; ++i) ASSERT_EQ(values_[i], (x0_[i] + x1_[i]) / 2.0f) << i;
  for (size_t i = c1.begin; i < c1.end; ++i) ASSERT_EQ(values_[i], x0_[i]) << i;
}

struct Corruption {
  std::string name;
  absl::StatusCode code;
  std::string message;  // part of the expected error
  // Sends m0's broken reduce-scatter message.
  std::function<void(HandDrivenRingTest&, FakeMember&, wire::Header, std::vector<uint8_t>)> send;
};

class MalformedMessageTest : public HandDrivenRingTest, public ::testing::WithParamInterface<int> {};

std::vector<Corruption> Corruptions() {
  using S = absl::StatusCode;
  using H = wire::Header;
  using P = std::vector<uint8_t>;
  return {
      {"short header", S::kInvalidArgument, "header has 10 bytes",
       [](HandDrivenRingTest&, FakeMember& f, H, P p) { f.SendRaw({P(10, 0), p}); }},
      {"bad magic", S::kInvalidArgument, "magic",
       [](HandDrivenRingTest&, FakeMember& f, H h, P p) {
         auto bytes = wire::EncodeHeader(h);
         bytes[0] ^= 0xff;
         f.SendRaw({P(bytes.begin(), bytes.end()), p});
       }},
      {"three frames", S::kInvalidArgument, "3 frames",
       [](HandDrivenRingTest&, FakeMember& f, H h, P p) {
         auto bytes = wire::EncodeHeader(h);
         f.SendRaw({P(bytes.begin(), bytes.end()), p, p});
       }},
      {"wrong count", S::kInvalidArgument, "where [0, +500) was expected",
       [](HandDrivenRingTest&, FakeMember& f, H h, P p) {
         h.count -= 1;
         f.Send(h, p);
       }},
      {"wrong total", S::kInvalidArgument, "a vector of 1000 values",
       [](HandDrivenRingTest&, FakeMember& f, H h, P p) {
         h.total -= 1;
         f.Send(h, p);
       }},
      {"wrong chunk", S::kInvalidArgument, "chunk 1 where step 0 carries chunk 0",
       [](HandDrivenRingTest&, FakeMember& f, H h, P p) {
         h.chunk = 1;
         f.Send(h, p);
       }},
      {"step beyond the last", S::kInvalidArgument, "step 3 is beyond",
       [](HandDrivenRingTest&, FakeMember& f, H h, P p) {
         h.step = 3;
         f.Send(h, p);
       }},
      {"not the predecessor", S::kInvalidArgument, "only its predecessor",
       [](HandDrivenRingTest&, FakeMember& f, H h, P p) {
         h.sender = 7;
         f.Send(h, p);
       }},
      {"other codec", S::kInvalidArgument, "must use the same codec",
       [](HandDrivenRingTest& t, FakeMember& f, H h, P) {
         auto bf16 = fl::core::MakeCodec("bf16");
         P out;
         ASSERT_TRUE((*bf16)->Encode(std::span<const float>(t.x0_.data(), h.count), &out).ok());
         f.Send(h, out);
       }},
      {"payload too short", S::kInvalidArgument, "bad payload",
       [](HandDrivenRingTest&, FakeMember& f, H h, P p) {
         p.resize(p.size() - 4);
         f.Send(h, p);
       }},
      {"corrupt payload", S::kDataLoss, "payload from member 'm0'",
       [](HandDrivenRingTest&, FakeMember& f, H h, P p) {
         p[fl::core::kCodecHeaderBytes + 5] ^= 0x10;  // a flipped bit in the body: the checksum catches it
         f.Send(h, p);
       }},
      {"duplicate", S::kInvalidArgument, "duplicate",
       [](HandDrivenRingTest&, FakeMember& f, H h, P p) {
         h.step = 0;
         h.chunk = 0;
         // An all-gather message for chunk 1, twice, before the reduce-scatter one m1 waits for.
         h.type = MessageType::kAllGather;
         h.chunk = 1;
         f.Send(h, p);
         f.Send(h, p);
       }},
  };
}

TEST_P(MalformedMessageTest, FailsTheExchangeWithAClearErrorAndKeepsTheValues) {
  const Corruption c = Corruptions()[static_cast<size_t>(GetParam())];
  SCOPED_TRACE(c.name);
  Start();
  c.send(*this, *fake_, ReduceScatterChunk0(kExchange), Chunk0Payload());
  Join();
  EXPECT_ERROR(status_, c.code, c.message);
  EXPECT_TRUE(BitEqual(values_, x1_)) << "values changed by a failed exchange";
}

INSTANTIATE_TEST_SUITE_P(All, MalformedMessageTest, ::testing::Range(0, static_cast<int>(Corruptions().size())),
                         [](const ::testing::TestParamInfo<int>& param_info) {
                           std::string name = Corruptions()[static_cast<size_t>(param_info.param)].name;
                           for (char& ch : name) {
                             if (ch == ' ') ch = '_';
                           }
                           return name;
                         });

}  // namespace
}  // namespace fl::diloco
