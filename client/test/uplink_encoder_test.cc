// fl-client's uplink encoding when the task's codec changes between rounds (link-aware compression): the
// error-feedback residual is carried across codecs, emptied by a lossless round, and a fixed fp32 uplink is the
// plain encode it always was.
#include "fl/client/uplink_encoder.h"

#include "fl/client/synthetic_trainer.h"
#include "fl/privacy/mechanisms.h"

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

// EncodeDelta: the update of a trained model (global - local), Task.privacy applied before the encode, on the
// fp32 path that writes the update straight into the payload as on the others.
struct Trained {
  static constexpr size_t kN = 100'000;
  SyntheticTrainer trainer{kN, 100, 7};
  std::vector<float> global = Values(kN, 1.0f, 3);
  std::vector<float> delta;  // global - local, as the encode must see it
  Trained() {
    training::TrainOptions o;
    o.learning_rate = 10;  // perturbations of about +-0.05
    o.seed = 9;
    EXPECT_TRUE(trainer.Train(global, o).ok());
    std::vector<float> local(kN);
    EXPECT_TRUE(trainer.GetParameters(local).ok());
    for (size_t i = 0; i < kN; ++i) delta.push_back(global[i] - local[i]);
  }
};

TEST(UplinkEncoder, EncodeDeltaWithoutPrivacyIsThePlainEncodeOfTheDelta) {
  Trained t;
  UplinkEncoder enc;
  std::vector<float> scratch;
  std::vector<uint8_t> payload, plain;
  ASSERT_TRUE(enc.EncodeDelta(*Codec("fp32"), t.global, t.trainer, v1::ClientPrivacy(), scratch, &payload).ok());
  ASSERT_TRUE(Codec("fp32")->Encode(t.delta, &plain).ok());
  EXPECT_EQ(std::string(payload.begin(), payload.end()), std::string(plain.begin(), plain.end()));
  EXPECT_TRUE(scratch.empty());  // the fp32 path formed the delta in the payload itself
}

TEST(UplinkEncoder, EncodeDeltaClipsOnTheFp32PathAndBeforeALossyEncode) {
  Trained t;
  const double norm = privacy::L2Norm(t.delta);
  v1::ClientPrivacy p;
  p.set_clip_norm(norm / 4);
  std::vector<float> clipped = t.delta;
  ASSERT_TRUE(privacy::ClipToNorm(clipped, p.clip_norm()).ok());
  // fp32: the very bytes of the clipped delta.
  UplinkEncoder enc;
  std::vector<float> scratch;
  std::vector<uint8_t> payload, expected;
  ASSERT_TRUE(enc.EncodeDelta(*Codec("fp32"), t.global, t.trainer, p, scratch, &payload).ok());
  ASSERT_TRUE(Codec("fp32")->Encode(clipped, &expected).ok());
  EXPECT_EQ(std::string(payload.begin(), payload.end()), std::string(expected.begin(), expected.end()));
  EXPECT_LE(privacy::L2Norm(Decode(*Codec("fp32"), payload, Trained::kN)), p.clip_norm() * (1 + 1e-6));
  // int8: clipped first, then encoded (and what int8 loses is the clipped delta's, carried by error feedback).
  UplinkEncoder lossy, reference;
  std::vector<uint8_t> p8, e8;
  ASSERT_TRUE(lossy.EncodeDelta(*Codec("int8"), t.global, t.trainer, p, scratch, &p8).ok());
  ASSERT_TRUE(reference.Encode(*Codec("int8"), clipped, &e8).ok());
  EXPECT_EQ(std::string(p8.begin(), p8.end()), std::string(e8.begin(), e8.end()));
}

TEST(UplinkEncoder, EncodeDeltaAddsLocalNoiseOnTheFp32Path) {
  Trained t;
  constexpr double kStd = 0.5;
  v1::ClientPrivacy p;
  p.set_local_noise_stddev(kStd);
  UplinkEncoder enc;
  std::vector<float> scratch;
  std::vector<uint8_t> payload;
  ASSERT_TRUE(enc.EncodeDelta(*Codec("fp32"), t.global, t.trainer, p, scratch, &payload).ok());
  const std::vector<float> sent = Decode(*Codec("fp32"), payload, Trained::kN);
  // The system's noise (not a seed): bounds of six standard errors of this sample, a false failure about once in
  // 10^9 runs.
  double sum = 0, sq = 0;
  for (size_t i = 0; i < Trained::kN; ++i) {
    const double e = static_cast<double>(sent[i]) - t.delta[i];
    sum += e;
    sq += e * e;
  }
  const double n = Trained::kN, mean = sum / n, variance = (sq - n * mean * mean) / (n - 1);
  EXPECT_NEAR(mean, 0, 6 * kStd / std::sqrt(n));
  EXPECT_NEAR(variance, kStd * kStd, 6 * kStd * kStd * std::sqrt(2.0 / n));
}

TEST(UplinkEncoder, EncodeDeltaRefusesADivergedUpdate) {
  Trained t;
  t.global[5] = std::nanf("");
  v1::ClientPrivacy p;
  p.set_clip_norm(1);
  UplinkEncoder enc;
  std::vector<float> scratch;
  std::vector<uint8_t> payload;
  EXPECT_EQ(enc.EncodeDelta(*Codec("fp32"), t.global, t.trainer, p, scratch, &payload).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(enc.EncodeDelta(*Codec("fp32"), t.global, t.trainer, v1::ClientPrivacy(), scratch, &payload).ok());
}

}  // namespace
}  // namespace fl::client
