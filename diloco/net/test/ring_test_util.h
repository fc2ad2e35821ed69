// Test support for the ring all-reduce: rings of real members on loopback, each exchange run with one
// thread per member, and a hand-driven member ("FakeMember") that speaks the wire format with raw ZeroMQ
// sockets so that tests can send what a real member never would (stale, foreign, malformed messages).
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <zmq.hpp>

#include "fl/core/str_cat.h"
#include "fl/diloco/net/ring_allreduce.h"
#include "fl/diloco/net/ring_wire.h"
#include "fl/testing/subprocess.h"

namespace fl::diloco::testing {

inline std::string Msg(const absl::Status& s) { return std::string(fl::ToStd(s.message())); }

inline std::vector<RingMember> LoopbackMembers(size_t m) {
  std::vector<RingMember> members;
  std::set<int> ports;
  // The kernel may hand the same free port out twice in a row (it is released before the next probe).
  while (ports.size() < m) ports.insert(fl::testing::FreeLoopbackPort());
  size_t i = 0;
  for (int port : ports) members.push_back({fl::StrCat("m", i++), fl::StrCat("tcp://127.0.0.1:", port)});
  return members;
}

inline std::vector<RingOptions> RingOf(size_t m, const RingOptions& base = {}) {
  std::vector<RingOptions> all;
  const std::vector<RingMember> members = LoopbackMembers(m);
  for (size_t i = 0; i < m; ++i) {
    RingOptions o = base;
    o.members = members;
    o.self = i;
    all.push_back(o);
  }
  return all;
}

inline std::vector<std::unique_ptr<RingAllReduce>> CreateAll(const std::vector<RingOptions>& options) {
  std::vector<std::unique_ptr<RingAllReduce>> rings;
  for (const RingOptions& o : options) {
    auto ring = RingAllReduce::Create(o);
    EXPECT_TRUE(ring.ok()) << ring.status();
    if (!ring.ok()) return {};
    rings.push_back(std::move(*ring));
  }
  return rings;
}

struct ExchangeResult {
  std::vector<absl::Status> status;
  std::vector<ExchangeStats> stats;
};

// One exchange on every member at once (one thread each); values[i] is member i's vector, reduced in place.
inline ExchangeResult RunExchange(std::vector<std::unique_ptr<RingAllReduce>>& rings, uint64_t exchange_id,
                                  std::vector<std::vector<float>>& values, ReduceOp op, uint64_t residual_key = 0) {
  ExchangeResult result;
  result.status.resize(rings.size());
  result.stats.resize(rings.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < rings.size(); ++i) {
    threads.emplace_back(
        [&, i] { result.status[i] = rings[i]->AllReduce(exchange_id, residual_key, values[i], op, &result.stats[i]); });
  }
  for (auto& t : threads) t.join();
  return result;
}

// Gaussian values whose magnitude changes every 37 values (so that summation order matters in fp32 and
// codec blocks see very different scales).
inline std::vector<float> RandomValues(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> exponent(-3.0f, 3.0f);
  std::vector<float> x(n);
  float magnitude = 1.0f;
  for (size_t i = 0; i < n; ++i) {
    if (i % 37 == 0) magnitude = std::pow(10.0f, exponent(rng));
    x[i] = normal(rng) * magnitude;
  }
  return x;
}

inline bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// Plays member `self` of a ring with raw sockets: binds its endpoint (PULL), connects to the successor
// (PUSH). The test drives the protocol by hand.
class FakeMember {
 public:
  FakeMember(const std::vector<RingMember>& members, size_t self)
      : members_(members), self_(self), ring_(RingFingerprint(members)) {
    pull_.set(zmq::sockopt::linger, 0);
    pull_.set(zmq::sockopt::rcvtimeo, 10000);
    pull_.bind(members[self].endpoint);
    push_.set(zmq::sockopt::linger, 1000);
    push_.connect(members[(self + 1) % members.size()].endpoint);
  }

  uint64_t ring() const { return ring_; }

  wire::Header Header(wire::MessageType type, uint64_t exchange_id) const {
    wire::Header h;
    h.type = type;
    h.ring = ring_;
    h.exchange_id = exchange_id;
    h.sender = static_cast<uint32_t>(self_);
    return h;
  }

  void SendHello() { SendRaw({Bytes(wire::EncodeHeader(Header(wire::MessageType::kHello, 0))), {}}); }

  void Send(const wire::Header& h, const std::vector<uint8_t>& payload) {
    SendRaw({Bytes(wire::EncodeHeader(h)), payload});
  }

  // Sends the given frames as one multipart message.
  void SendRaw(const std::vector<std::vector<uint8_t>>& frames) {
    for (size_t i = 0; i < frames.size(); ++i) {
      const auto flags = i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none;
      ASSERT_TRUE(push_.send(zmq::buffer(frames[i]), flags));
    }
  }

  // The next data message (hellos skipped): header and payload.
  std::optional<std::pair<wire::Header, std::vector<uint8_t>>> Receive() {
    while (true) {
      zmq::message_t head, payload;
      if (!pull_.recv(head)) return std::nullopt;
      if (!head.more() || !pull_.recv(payload)) return std::nullopt;
      auto h = wire::DecodeHeader({static_cast<const uint8_t*>(head.data()), head.size()});
      if (!h.ok()) return std::nullopt;
      if (h->type == wire::MessageType::kHello) continue;
      const auto* p = static_cast<const uint8_t*>(payload.data());
      return std::make_pair(*h, std::vector<uint8_t>(p, p + payload.size()));
    }
  }

 private:
  static std::vector<uint8_t> Bytes(const std::array<uint8_t, wire::kHeaderBytes>& a) {
    return std::vector<uint8_t>(a.begin(), a.end());
  }

  std::vector<RingMember> members_;
  size_t self_;
  uint64_t ring_;
  zmq::context_t context_;
  zmq::socket_t pull_{context_, zmq::socket_type::pull};
  zmq::socket_t push_{context_, zmq::socket_type::push};
};

}  // namespace fl::diloco::testing
