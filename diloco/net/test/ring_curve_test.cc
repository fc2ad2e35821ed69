// CurveZMQ on the ring (RingOptions::curve): results equal plaintext's bit for bit, a member whose key is not
// in the ring's set cannot deliver (clear errors on both sides, nobody's values touched), bad keys are refused.
#include <zmq.h>

#include <array>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ring_test_util.h"

namespace fl::diloco {
namespace {

using testing::BitEqual;
using testing::CreateAll;
using testing::ExchangeResult;
using ::testing::HasSubstr;
using testing::Msg;
using testing::RandomValues;
using testing::RingOf;
using testing::RunExchange;

struct KeyPair {
  std::string pub, sec;
};

KeyPair NewKeys() {
  std::array<char, 41> pub{}, sec{};
  EXPECT_EQ(zmq_curve_keypair(pub.data(), sec.data()), 0);
  return {std::string(pub.data(), 40), std::string(sec.data(), 40)};
}

// Member i's options with CURVE: its own secret key, everybody's public keys.
std::vector<RingOptions> CurveRing(size_t m, std::vector<KeyPair>* keys, const RingOptions& base = {}) {
  std::vector<RingOptions> all = RingOf(m, base);
  keys->clear();
  std::vector<std::string> pubs;
  for (size_t i = 0; i < m; ++i) {
    keys->push_back(NewKeys());
    pubs.push_back(keys->back().pub);
  }
  for (size_t i = 0; i < m; ++i) all[i].curve = RingCurve{(*keys)[i].sec, pubs};
  return all;
}

TEST(RingCurveTest, ResultsEqualPlaintextBitForBit) {
  ASSERT_TRUE(zmq_has("curve")) << "this libzmq lacks CURVE";
  for (const std::string codec : {"fp32", "int8"}) {
    RingOptions base;
    base.codec = codec;
    base.sub_chunk_values = 1000;
    std::vector<KeyPair> keys;
    auto curve_rings = CreateAll(CurveRing(3, &keys, base));
    auto plain_rings = CreateAll(RingOf(3, base));
    ASSERT_EQ(curve_rings.size(), 3u);
    ASSERT_EQ(plain_rings.size(), 3u);
    std::vector<std::vector<float>> a, b;
    for (uint32_t i = 0; i < 3; ++i) a.push_back(RandomValues(10007, 40 + i));
    b = a;
    ExchangeResult ra = RunExchange(curve_rings, 1, a, ReduceOp::kMean);
    ExchangeResult rb = RunExchange(plain_rings, 1, b, ReduceOp::kMean);
    for (size_t i = 0; i < 3; ++i) {
      ASSERT_TRUE(ra.status[i].ok()) << codec << " member " << i << ": " << ra.status[i];
      ASSERT_TRUE(rb.status[i].ok()) << rb.status[i];
      EXPECT_TRUE(BitEqual(a[i], b[i])) << codec << " member " << i;
    }
  }
}

TEST(RingCurveTest, AMemberWhoseKeyIsNotInTheRingsSetCannotDeliver) {
  RingOptions base;
  base.timeout = absl::Seconds(3);
  std::vector<KeyPair> keys;
  std::vector<RingOptions> options = CurveRing(3, &keys, base);
  // Member 1 holds a key pair of its own that the others were never given (as an island provisioned by another
  // CA's folder would): its own options list its key so that it can start, the others list the provisioned one.
  const KeyPair intruder = NewKeys();
  options[1].curve->secret_key = intruder.sec;
  options[1].curve->public_keys[1] = intruder.pub;
  auto rings = CreateAll(options);
  ASSERT_EQ(rings.size(), 3u);
  std::vector<std::vector<float>> values;
  for (uint32_t i = 0; i < 3; ++i) values.push_back(RandomValues(5000, 7 + i));
  const std::vector<std::vector<float>> before = values;
  ExchangeResult r = RunExchange(rings, 1, values, ReduceOp::kMean);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_FALSE(r.status[i].ok()) << "member " << i;
    EXPECT_TRUE(BitEqual(values[i], before[i])) << "member " << i << "'s values were changed by a failed exchange";
  }
  // The intruder learns at once that its successor refused it.
  EXPECT_EQ(r.status[1].code(), absl::StatusCode::kPermissionDenied) << r.status[1];
  EXPECT_THAT(Msg(r.status[1]), HasSubstr("refused the CurveZMQ handshake"));
  EXPECT_THAT(Msg(r.status[1]), HasSubstr("'m2'"));
  // Its successor saw nothing from it: a timeout that names the refused key (or the abort that started there).
  EXPECT_THAT(Msg(r.status[2]), HasSubstr(intruder.pub)) << r.status[2];
}

TEST(RingCurveTest, BadKeysAreRefusedNamingTheMember) {
  std::vector<KeyPair> keys;
  std::vector<RingOptions> options = CurveRing(2, &keys);
  RingOptions wrong_secret = options[0];
  wrong_secret.curve->secret_key = keys[1].sec;  // member 1's secret key for member 0's public key
  auto a = RingAllReduce::Create(wrong_secret);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(a.status()), HasSubstr("does not belong to the public key of this member 'm0'"));
  RingOptions short_key = options[0];
  short_key.curve->public_keys[1] = "abc";
  auto b = RingAllReduce::Create(short_key);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(b.status()), HasSubstr("public key of member 'm1'"));
  RingOptions missing = options[0];
  missing.curve->public_keys.pop_back();
  auto c = RingAllReduce::Create(missing);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(c.status()), HasSubstr("one per member"));
}

}  // namespace
}  // namespace fl::diloco
