// fl-client's uplink encoding when the task's codec changes between rounds (link-aware compression): the
// error-feedback residual is carried across codecs, emptied by a lossless round, and a fixed fp32 uplink is the
// plain encode it always was.
#include "fl/client/uplink_encoder.h"

#include <cmath>
#include <vector>

#include <gtest/gtest.h>

namespace fl::client {
namespace {

std::vector<float> Values(size_t n, float scale, int seed) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * std::sin(0.37f * static_cast<float>(i) + static_cast<float>(seed));
  return v;
}

std::unique_ptr<core::Codec> Codec(const char* spec) { return *core::MakeCodec(spec); }

std::vector<float> Decode(const core::Codec& codec, const std::vector<uint8_t>& payload, size_t n) {
  std::vector<float> out(n);
  EXPECT_TRUE(codec.Decode(payload, out).ok());
  return out;
}

TEST(UplinkEncoder, AFixedFp32UplinkIsThePlainEncodeAndKeepsNoResidual) {
  UplinkEncoder enc;
  auto fp32 = Codec("fp32");
  const std::vector<float> u = Values(1000, 0.01f, 1);
  std::vector<uint8_t> payload, plain;
  ASSERT_TRUE(enc.Encode(*fp32, u, &payload).ok());
  ASSERT_TRUE(fp32->Encode(u, &plain).ok());
  EXPECT_EQ(payload, plain);
  EXPECT_TRUE(enc.residual().empty());
}

TEST(UplinkEncoder, TheResidualIsCarriedWhenTheCodecChangesBetweenLossyCodecs) {
  const size_t n = 1000;
  UplinkEncoder enc;
  auto int4 = Codec("int4");
  auto int8 = Codec("int8");
  const std::vector<float> u1 = Values(n, 0.01f, 1), u2 = Values(n, 0.01f, 2);
  std::vector<uint8_t> p1, p2;
  ASSERT_TRUE(enc.Encode(*int4, u1, &p1).ok());
  const std::vector<float> r1(enc.residual().begin(), enc.residual().end());
  const std::vector<float> d1 = Decode(*int4, p1, n);
  double r1_norm = 0;
  for (size_t i = 0; i < n; ++i) {
    EXPECT_FLOAT_EQ(r1[i], u1[i] - d1[i]) << i;
    r1_norm += std::abs(r1[i]);
  }
  ASSERT_GT(r1_norm, 0) << "int4 loses something of these values";
  // Round 2 names int8: what int4 lost in round 1 goes out with round 2's update, not dropped.
  ASSERT_TRUE(enc.Encode(*int8, u2, &p2).ok());
  const std::vector<float> d2 = Decode(*int8, p2, n);
  for (size_t i = 0; i < n; ++i) {
    EXPECT_FLOAT_EQ(enc.residual()[i], (u2[i] + r1[i]) - d2[i]) << i;
  }
  // The invariant of error feedback across both rounds: decoded sum = input sum - what is still owed.
  for (size_t i = 0; i < n; ++i) {
    EXPECT_NEAR(d1[i] + d2[i], u1[i] + u2[i] - enc.residual()[i], 1e-6) << i;
  }
}

TEST(UplinkEncoder, ALosslessRoundSendsWhatWasOwedExactlyAndEmptiesTheResidual) {
  const size_t n = 1000;
  UplinkEncoder enc;
  auto int4 = Codec("int4");
  auto fp32 = Codec("fp32");
  const std::vector<float> u1 = Values(n, 0.01f, 3), u2 = Values(n, 0.01f, 4);
  std::vector<uint8_t> p1, p2;
  ASSERT_TRUE(enc.Encode(*int4, u1, &p1).ok());
  const std::vector<float> r1(enc.residual().begin(), enc.residual().end());
  ASSERT_TRUE(enc.Encode(*fp32, u2, &p2).ok());
  const std::vector<float> d2 = Decode(*fp32, p2, n);
  for (size_t i = 0; i < n; ++i) EXPECT_FLOAT_EQ(d2[i], u2[i] + r1[i]) << i;
  EXPECT_TRUE(enc.residual().empty());
  // And the round after is the plain fp32 encode again.
  std::vector<uint8_t> p3, plain;
  ASSERT_TRUE(enc.Encode(*fp32, u1, &p3).ok());
  ASSERT_TRUE(fp32->Encode(u1, &plain).ok());
  EXPECT_EQ(p3, plain);
}

TEST(UplinkEncoder, AFailedEncodeLeavesTheResidualAsItWas) {
  const size_t n = 100;
  UplinkEncoder enc;
  auto int8 = Codec("int8");
  std::vector<uint8_t> p;
  ASSERT_TRUE(enc.Encode(*int8, Values(n, 0.01f, 5), &p).ok());
  const std::vector<float> before(enc.residual().begin(), enc.residual().end());
  std::vector<float> bad = Values(n, 0.01f, 6);
  bad[7] = std::nanf("");
  EXPECT_FALSE(enc.Encode(*int8, bad, &p).ok());
  EXPECT_EQ(std::vector<float>(enc.residual().begin(), enc.residual().end()), before);
}

}  // namespace
}  // namespace fl::client
