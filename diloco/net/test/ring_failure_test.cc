// Ring all-reduce failures: bad options, a vanished or silent peer, stale and malformed messages. Every
// failed exchange must leave the caller's values exactly as they were.
#include "fl/diloco/net/ring_allreduce.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <limits>
#include <span>
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

#define EXPECT_ERROR(status, code_, text)                                                       \
  do {                                                                                          \
    const absl::Status _s = (status);                                                           \
    EXPECT_EQ(_s.code(), (code_)) << _s;                                                        \
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

// A member whose own values hold a NaN/Inf fails the exchange and so does every other member, through the
// abort, naming it; nobody's values change. With int8 the member's encoder refuses its own chunk. With fp32
// (raw payloads, no encoder) the check is fused into the additions: a NaN in the chunk m1 sends first is
// found by its successor, which names m1 as the sender of its own values (and the abort reaches m1 too);
// a NaN in a chunk m1 adds (a middle step, or the last one where it also divides) is found by m1 itself.
TEST(RingFailureTest, ANonFiniteInputFailsEveryMemberNamingItsOwner) {
  const size_t m = 3, n = 3000;
  struct Case {
    std::string codec;
    size_t chunk;  // the chunk of m1's values that holds the NaN/Inf
    float bad;
  };
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (const Case& c : {Case{"int8", 1, nan}, Case{"fp32", 1, nan}, Case{"fp32", 0, -inf}, Case{"fp32", 2, nan}}) {
    SCOPED_TRACE(fl::StrCat(c.codec, ", chunk ", c.chunk));
    RingOptions base;
    base.codec = c.codec;
    base.sub_chunk_values = 256;
    auto rings = CreateAll(RingOf(m, base));
    ASSERT_EQ(rings.size(), m);
    std::vector<std::vector<float>> values;
    for (size_t i = 0; i < m; ++i) values.push_back(RandomValues(n, static_cast<uint32_t>(i)));
    values[1][RingChunk(n, m, c.chunk).begin + 300] = c.bad;
    const auto before = values;
    const auto result = RunExchange(rings, 1, values, ReduceOp::kMean);
    for (size_t i = 0; i < m; ++i) {
      EXPECT_ERROR(result.status[i], absl::StatusCode::kInvalidArgument, "member 'm1'");
      EXPECT_NE(Msg(result.status[i]).find("its own values"), std::string::npos) << result.status[i];
      if (c.codec == "fp32") {  // names the value's index in the whole vector
        EXPECT_NE(Msg(result.status[i]).find(fl::StrCat(RingChunk(n, m, c.chunk).begin + 300)), std::string::npos)
            << result.status[i];
      }
      // Bitwise, since NaN != NaN.
      EXPECT_EQ(std::memcmp(values[i].data(), before[i].data(), n * sizeof(float)), 0) << "member " << i;
    }
  }
}

// fp32 values that are finite but whose sum is not: the member that adds them fails with "overflowed" and
// the abort fails the other; values unchanged.
TEST(RingFailureTest, AnFp32SumThatOverflowsFailsTheExchange) {
  auto rings = CreateAll(RingOf(2));
  ASSERT_EQ(rings.size(), 2u);
  std::vector<std::vector<float>> values{RandomValues(100, 1), RandomValues(100, 2)};
  values[0][70] = 3e38f;
  values[1][70] = 3e38f;
  const auto before = values;
  const auto result = RunExchange(rings, 1, values, ReduceOp::kSum);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_ERROR(result.status[i], absl::StatusCode::kInvalidArgument, "overflowed fp32 at index 70");
    EXPECT_TRUE(BitEqual(values[i], before[i])) << "member " << i;
  }
}

// With fp32 ZeroMQ sends straight from the caller's memory. A successor that stops reading leaves messages
// queued that point into it; AllReduce must still not return before ZeroMQ has let go of them. Here m0 is
// a raw PULL socket that takes one message and then reads nothing (receive high-water mark 1), m1's
// exchange times out, and the test then unmaps m1's values and lets m0 read everything: if ZeroMQ still
// pointed into the unmapped pages, its I/O thread would crash the test.
TEST(RingFailureTest, AFailedExchangeReleasesTheCallersMemoryBeforeItReturns) {
  const std::vector<RingMember> members = LoopbackMembers(2);
  zmq::context_t context;
  zmq::socket_t stalled(context, zmq::socket_type::pull);
  stalled.set(zmq::sockopt::rcvhwm, 1);
  stalled.set(zmq::sockopt::rcvbuf, 64 << 10);
  stalled.set(zmq::sockopt::linger, 0);
  stalled.bind(members[0].endpoint);
  RingOptions o;
  o.members = members;
  o.self = 1;
  o.timeout = absl::Milliseconds(500);
  o.linger = absl::ZeroDuration();
  auto ring = RingAllReduce::Create(o);
  ASSERT_TRUE(ring.ok()) << ring.status();
  const size_t n = size_t{16} << 20;  // 64 MB: far more than socket buffers hold
  const size_t bytes = n * sizeof(float);
  void* mapped = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mapped, MAP_FAILED);
  std::span<float> values(static_cast<float*>(mapped), n);
  std::fill(values.begin(), values.end(), 0.5f);
  std::vector<float> out(n);
  const absl::Status s = (*ring)->AllReduce(1, 0, values, out, ReduceOp::kMean, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  ASSERT_EQ(munmap(mapped, bytes), 0);
  // Now let m0 read whatever m1 still sends (only a new connection's hello if m1 let go of its messages).
  stalled.set(zmq::sockopt::rcvtimeo, 300);
  size_t frames = 0;
  for (zmq::message_t frame; stalled.recv(frame);) ++frames;
  EXPECT_GE(frames, 1u);  // at least the first hello came through
  ring->reset();
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
  EXPECT_ERROR(rings[0]->AllReduce(1, 0, v, ReduceOp::kMean, nullptr), absl::StatusCode::kDeadlineExceeded, "'m1'");
  EXPECT_TRUE(BitEqual(v, before));
}

// The member under test is m1 of a ring of two; the test plays m0 by hand. For M = 2: m1 sends its chunk 1
// (reduce-scatter step 0), receives chunk 0 (which completes it: m1 owns chunk 0), sends the final chunk 0
// (all-gather step 0) and receives the final chunk 1 from m0.
// With codec fp32 (the default here) payloads are raw floats; codec_spec_ = "int8" tests a checksummed codec.
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
    o.codec = codec_spec_;
    o.timeout = absl::Seconds(10);
    o.linger = absl::ZeroDuration();
    auto ring = RingAllReduce::Create(o);
    ASSERT_TRUE(ring.ok()) << ring.status();
    ring_ = std::move(*ring);
    auto codec = fl::core::MakeCodec(codec_spec_);
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

  bool raw() const { return codec_spec_ == "fp32"; }

  // A data header of m0 with the payload kind this ring uses.
  wire::Header DataHeader(MessageType type, uint64_t exchange) const {
    wire::Header h = fake_->Header(type, exchange);
    h.payload = raw() ? wire::PayloadKind::kRawFp32 : wire::PayloadKind::kCodec;
    return h;
  }

  wire::Header ReduceScatterChunk0(uint64_t exchange) const {
    wire::Header h = DataHeader(MessageType::kReduceScatter, exchange);
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
    if (raw()) {
      const auto* p = reinterpret_cast<const uint8_t*>(x.data() + begin);
      return std::vector<uint8_t>(p, p + (end - begin) * sizeof(float));
    }
    EXPECT_TRUE(codec_->Encode(std::span<const float>(x.data() + begin, end - begin), &out).ok());
    return out;
  }
  void Decode(const std::vector<uint8_t>& payload, std::vector<float>& out) const {
    if (raw()) {
      ASSERT_EQ(payload.size(), out.size() * sizeof(float));
      std::memcpy(out.data(), payload.data(), payload.size());
      return;
    }
    ASSERT_TRUE(codec_->Decode(payload, out).ok());
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
    ASSERT_NO_FATAL_FAILURE(Decode(rs->second, mean));
    for (size_t i = 0; i < c1.size(); ++i) mean[i] = (mean[i] + x0_[c1.begin + i]) / 2.0f;  // x1 + x0, / M
    wire::Header h = DataHeader(MessageType::kAllGather, kExchange);
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
    ASSERT_NO_FATAL_FAILURE(Decode(ag->second, chunk0));
    for (size_t i = c0.begin; i < c0.end; ++i) ASSERT_EQ(chunk0[i - c0.begin], values_[i]) << i;
  }

  std::string codec_spec_ = "fp32";
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
  thread_ = std::thread([this] { status_ = ring_->AllReduce(kExchange + 1, 0, values_, ReduceOp::kMean, &stats_); });
  auto rs = fake_->Receive();
  ASSERT_TRUE(rs.has_value());
  EXPECT_EQ(rs->first.exchange_id, kExchange + 1);
  EXPECT_EQ(rs->first.type, MessageType::kReduceScatter);
  auto ag = fake_->Receive();  // m1 completed chunk 0 with the kept message and sent it on
  ASSERT_TRUE(ag.has_value());
  EXPECT_EQ(ag->first.type, MessageType::kAllGather);
  EXPECT_EQ(ag->first.exchange_id, kExchange + 1);
  const ValueRange c1 = RingChunk(kN, 2, 1);
  wire::Header h = DataHeader(MessageType::kAllGather, kExchange + 1);
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

// Raw fp32 all-gather values that hold an Inf: m1 refuses them naming m0, and keeps its values.
TEST_F(HandDrivenRingTest, NonFiniteAllGatherValuesFailTheExchangeNamingTheSender) {
  Start();
  fake_->Send(ReduceScatterChunk0(kExchange), Chunk0Payload());
  ASSERT_TRUE(fake_->Receive().has_value());  // m1's reduce-scatter (chunk 1)
  const ValueRange c1 = RingChunk(kN, 2, 1);
  std::vector<float> final1(x0_.begin() + static_cast<std::ptrdiff_t>(c1.begin),
                            x0_.begin() + static_cast<std::ptrdiff_t>(c1.end));
  final1[17] = std::numeric_limits<float>::infinity();
  wire::Header h = DataHeader(MessageType::kAllGather, kExchange);
  h.chunk = 1;
  h.offset = c1.begin;
  h.count = c1.size();
  h.total = kN;
  fake_->Send(h, Encode(0, final1.size(), final1));
  Join();
  EXPECT_ERROR(status_, absl::StatusCode::kInvalidArgument, "from member 'm0'");
  EXPECT_NE(Msg(status_).find(fl::StrCat("NaN/Inf at index ", c1.begin + 17)), std::string::npos) << status_;
  EXPECT_TRUE(BitEqual(values_, x1_)) << "values changed by a failed exchange";
}

struct Corruption {
  std::string name;
  std::string codec;  // of the ring under test: fp32 (raw payloads) or int8 (checksummed codec payloads)
  absl::StatusCode code;
  std::string message;  // part of the expected error
  // Sends m0's broken reduce-scatter message.
  std::function<void(HandDrivenRingTest&, FakeMember&, wire::Header, std::vector<uint8_t>)> send;
};

std::vector<Corruption> Corruptions();

class MalformedMessageTest : public HandDrivenRingTest, public ::testing::WithParamInterface<int> {
 public:
  void SetUp() override {
    codec_spec_ = Corruptions()[static_cast<size_t>(GetParam())].codec;
    HandDrivenRingTest::SetUp();
  }
};

std::vector<Corruption> Corruptions() {
  using S = absl::StatusCode;
  using H = wire::Header;
  using P = std::vector<uint8_t>;
  return {
      {"short header", "fp32", S::kInvalidArgument, "header has 10 bytes",
       [](HandDrivenRingTest&, FakeMember& f, H, P p) {
         f.SendRaw({P(10, 0), p});
       }},
      {"bad magic", "fp32", S::kInvalidArgument, "magic",
       [](HandDrivenRingTest&, FakeMember& f, H h, P p) {
         auto bytes = wire::EncodeHeader(h);
         bytes[0] ^= 0xff;
         f.SendRaw({P(bytes.begin(), bytes.end()), p});
       }},
      {"three frames", "fp32", S::kInvalidArgument, "3 frames",
       [](HandDrivenRingTest&, FakeMember& f, H h, P p) {
         auto bytes = wire::EncodeHeader(h);
         f.SendRaw({P(bytes.begin(), bytes.end()), p, p});
       }},
      {"wrong count", "fp32", S::kInvalidArgument, "where [0, +500) was expected",
       [](HandDrivenRingTest&, FakeMember& f, H h, P p) {
         h.count -= 1;
         f.Send(h, p);
       }},
      {"wrong total", "fp32", S::kInvalidArgument, "a vector of 1000 values",
       [](HandDrivenRingTest&, FakeMember& f, H h, P p) {
         h.total -= 1;
         f.Send(h, p);
       }},
      {"wrong chunk", "fp32", S::kInvalidArgument, "chunk 1 where step 0 carries chunk 0",
       [](HandDrivenRingTest&, FakeMember& f, H h, P p) {
         h.chunk = 1;
         f.Send(h, p);
       }},
      {"step beyond the last", "fp32", S::kInvalidArgument, "step 3 is beyond",
       [](HandDrivenRingTest&, FakeMember& f, H h, P p) {
         h.step = 3;
         f.Send(h, p);
       }},
      {"not the predecessor", "fp32", S::kInvalidArgument, "only its predecessor",
       [](HandDrivenRingTest&, FakeMember& f, H h, P p) {
         h.sender = 7;
         f.Send(h, p);
       }},
      {"old format version", "fp32", S::kInvalidArgument, "format version 1, this build speaks version 2",
       [](HandDrivenRingTest&, FakeMember& f, H h, P p) {
         auto bytes = wire::EncodeHeader(h);
         bytes[4] = 1;
         f.SendRaw({P(bytes.begin(), bytes.end()), p});
       }},
      {"unknown payload kind", "fp32", S::kInvalidArgument, "unknown payload kind 9",
       [](HandDrivenRingTest&, FakeMember& f, H h, P p) {
         auto bytes = wire::EncodeHeader(h);
         bytes[6] = 9;
         f.SendRaw({P(bytes.begin(), bytes.end()), p});
       }},
      {"other codec", "fp32", S::kInvalidArgument, "must use the same codec",
       [](HandDrivenRingTest& t, FakeMember& f, H h, P) {
         auto bf16 = fl::core::MakeCodec("bf16");
         P out;
         ASSERT_TRUE((*bf16)->Encode(std::span<const float>(t.x0_.data(), h.count), &out).ok());
         h.payload = wire::PayloadKind::kCodec;
         f.Send(h, out);
       }},
      {"raw values to a codec ring", "int8", S::kInvalidArgument, "must use the same codec",
       [](HandDrivenRingTest& t, FakeMember& f, H h, P) {
         h.payload = wire::PayloadKind::kRawFp32;
         const auto* raw = reinterpret_cast<const uint8_t*>(t.x0_.data());
         f.Send(h, P(raw, raw + h.count * sizeof(float)));
       }},
      {"raw payload too short", "fp32", S::kInvalidArgument, "a raw fp32 payload of 1996 bytes where 500 values",
       [](HandDrivenRingTest&, FakeMember& f, H h, P p) {
         p.resize(p.size() - 4);
         f.Send(h, p);
       }},
      {"raw payload too long", "fp32", S::kInvalidArgument, "a raw fp32 payload of 2004 bytes where 500 values",
       [](HandDrivenRingTest&, FakeMember& f, H h, P p) {
         p.resize(p.size() + 4);
         f.Send(h, p);
       }},
      {"raw NaN", "fp32", S::kInvalidArgument, "sent non-finite values: its own values hold NaN/Inf at index 5",
       [](HandDrivenRingTest&, FakeMember& f, H h, P p) {
         const float nan = std::numeric_limits<float>::quiet_NaN();
         std::memcpy(p.data() + 5 * sizeof(float), &nan, sizeof(nan));
         f.Send(h, p);
       }},
      {"codec payload too short", "int8", S::kInvalidArgument, "bad payload",
       [](HandDrivenRingTest&, FakeMember& f, H h, P p) {
         p.resize(p.size() - 4);
         f.Send(h, p);
       }},
      {"corrupt payload", "int8", S::kDataLoss, "payload from member 'm0'",
       [](HandDrivenRingTest&, FakeMember& f, H h, P p) {
         p[fl::core::kCodecHeaderBytes + 5] ^= 0x10;  // a flipped bit in the body: the checksum catches it
         f.Send(h, p);
       }},
      {"duplicate", "fp32", S::kInvalidArgument, "duplicate",
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
