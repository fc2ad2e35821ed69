// The ring as 1-bit Adam uses it: sign1 with one scale per chunk and error feedback on both sides (each member's
// encodings at reduce-scatter; each chunk's reducer, its owner, on the re-encoded average), checked bit for bit
// against the same algorithm computed in one process with the core codec, over several exchanges (so that the
// residuals carry over), and the codec switch from the fp32 warm-up.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "fl/core/codec.h"
#include "ring_test_util.h"

namespace fl::diloco {
namespace {

using testing::BitEqual;
using testing::CreateAll;
using testing::RandomValues;
using testing::RingOf;
using testing::RunExchange;

// One exchange of the ring's algorithm (ring_allreduce.h) in one process: for each chunk c, member c encodes
// own + residual and keeps what the codec lost; each next member adds its own values to the decoded partial
// sum and does the same, up to the owner (c - 1), which adds its residual, divides by M, encodes once and
// keeps M times the loss; every member's result is the decoded final chunk. `residuals[i]` is member i's
// residual over the whole vector. One sub-chunk per chunk (the test's vectors are far below 2^20 values).
std::vector<float> ReferenceExchange(const core::Codec& codec, const std::vector<std::vector<float>>& inputs,
                                     std::vector<std::vector<float>>& residuals) {
  const size_t m = inputs.size();
  const size_t n = inputs[0].size();
  std::vector<float> result(n);
  std::vector<uint8_t> payload;
  for (size_t c = 0; c < m; ++c) {
    const ValueRange r = RingChunk(n, m, c);
    if (r.size() == 0) continue;
    std::vector<float> acc(inputs[c].begin() + r.begin, inputs[c].begin() + r.end);
    std::vector<float> decoded(r.size());
    for (size_t hop = 0; hop + 1 < m; ++hop) {
      const size_t sender = (c + hop) % m;
      std::vector<float>& res = residuals[sender];
      for (size_t i = 0; i < r.size(); ++i) acc[i] += res[r.begin + i];
      EXPECT_TRUE(codec.Encode(acc, &payload).ok());
      EXPECT_TRUE(codec.Decode(payload, decoded).ok());
      for (size_t i = 0; i < r.size(); ++i) res[r.begin + i] = acc[i] - decoded[i];
      const size_t receiver = (sender + 1) % m;
      for (size_t i = 0; i < r.size(); ++i) acc[i] = inputs[receiver][r.begin + i] + decoded[i];
    }
    const size_t owner = (c + m - 1) % m;
    std::vector<float>& res = residuals[owner];
    const auto fm = static_cast<float>(m);
    for (size_t i = 0; i < r.size(); ++i) acc[i] = (acc[i] + res[r.begin + i]) / fm;
    EXPECT_TRUE(codec.Encode(acc, &payload).ok());
    EXPECT_TRUE(codec.Decode(payload, decoded).ok());
    for (size_t i = 0; i < r.size(); ++i) {
      res[r.begin + i] = (acc[i] - decoded[i]) * fm;
      result[r.begin + i] = decoded[i];
    }
  }
  return result;
}

std::string Bytes(std::span<const float> v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size_bytes());
}

class OneBitRingTest : public ::testing::TestWithParam<size_t> {};

TEST_P(OneBitRingTest, Sign1WithErrorFeedbackOnBothSidesEqualsTheOneProcessReferenceBitForBit) {
  const size_t m = GetParam();
  const size_t n = 1000;  // chunks of 333-500 values: several 64-value scales each, the last one partial
  RingOptions base;
  base.codec = "sign1:64";
  base.error_feedback = true;
  auto rings = CreateAll(RingOf(m, base));
  ASSERT_EQ(rings.size(), m);
  auto codec = core::MakeCodec("sign1:64");
  ASSERT_TRUE(codec.ok());
  std::vector<std::vector<float>> residuals(m, std::vector<float>(n, 0.0f));
  for (uint64_t exchange = 1; exchange <= 5; ++exchange) {
    std::vector<std::vector<float>> values(m);
    for (size_t i = 0; i < m; ++i) values[i] = RandomValues(n, static_cast<uint32_t>(100 * exchange + i));
    const std::vector<float> expected = ReferenceExchange(**codec, values, residuals);
    testing::ExchangeResult r = RunExchange(rings, exchange, values, ReduceOp::kMean, /*residual_key=*/7);
    for (size_t i = 0; i < m; ++i) {
      ASSERT_TRUE(r.status[i].ok()) << r.status[i];
      EXPECT_TRUE(BitEqual(values[i], expected)) << "member " << i << " exchange " << exchange;
      // The error feedback each member keeps (its encodings' losses and, on the chunk it owns, the reducer's)
      // is the reference's too.
      EXPECT_EQ(Bytes(rings[i]->Residual(7)), Bytes(residuals[i])) << "member " << i << " exchange " << exchange;
    }
  }
  EXPECT_TRUE(rings[0]->Residual(8).empty());
}

INSTANTIATE_TEST_SUITE_P(Members, OneBitRingTest, ::testing::Values(2, 3));

TEST(OneBitRingSwitchTest, Fp32WarmUpThenSign1OnTheSameRing) {
  auto rings = CreateAll(RingOf(2, {}));
  ASSERT_EQ(rings.size(), 2u);
  std::vector<std::vector<float>> values = {RandomValues(100, 1), RandomValues(100, 2)};
  std::vector<float> fp32_mean(100);
  for (size_t i = 0; i < 100; ++i) fp32_mean[i] = (values[0][i] + values[1][i]) / 2.0f;
  testing::ExchangeResult r = RunExchange(rings, 1, values, ReduceOp::kMean);
  ASSERT_TRUE(r.status[0].ok() && r.status[1].ok());
  EXPECT_TRUE(BitEqual(values[0], fp32_mean));
  for (auto& ring : rings) ASSERT_TRUE(ring->SetCodec("sign1:8").ok());
  values = {RandomValues(100, 3), RandomValues(100, 4)};
  r = RunExchange(rings, 2, values, ReduceOp::kMean);
  ASSERT_TRUE(r.status[0].ok() && r.status[1].ok());
  EXPECT_TRUE(BitEqual(values[0], values[1]));
  EXPECT_EQ(rings[0]->options().codec, "sign1:8");
}

TEST(OneBitRingSwitchTest, AMemberLeftOnTheOldCodecFailsTheExchangeNamingBoth) {
  RingOptions base;
  base.timeout = absl::Seconds(10);  // a bound in case the refusal did not travel; it does at once
  auto rings = CreateAll(RingOf(2, base));
  ASSERT_EQ(rings.size(), 2u);
  ASSERT_TRUE(rings[0]->SetCodec("sign1:8").ok());
  std::vector<std::vector<float>> values = {RandomValues(64, 1), RandomValues(64, 2)};
  testing::ExchangeResult r = RunExchange(rings, 1, values, ReduceOp::kMean);
  EXPECT_FALSE(r.status[0].ok() && r.status[1].ok());
  const std::string both = testing::Msg(r.status[0]) + " | " + testing::Msg(r.status[1]);
  EXPECT_NE(both.find("same codec"), std::string::npos) << both;
}

TEST(OneBitRingSwitchTest, ABadSpecIsRefusedAndChangesNothing) {
  auto rings = CreateAll(RingOf(1, {}));
  ASSERT_EQ(rings.size(), 1u);
  absl::Status s = rings[0]->SetCodec("sign1:12");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(testing::Msg(s).find("sign1:12"), std::string::npos) << s;
  EXPECT_EQ(rings[0]->options().codec, "fp32");
}

// Islands that sync differently cannot share a ring: the first exchange fails on every member, naming both modes
// (the hello of each member carries its mode), instead of mixing a sign1 momentum with an fp32 gradient.
TEST(OneBitRingSwitchTest, MembersOfAnotherSyncModeAreRefusedNamingBothModes) {
  RingOptions base;
  base.timeout = absl::Seconds(10);  // a bound in case the refusal did not travel; it does at once
  std::vector<RingOptions> options = RingOf(2, base);
  options[0].sync_mode = "onebit-adam";
  options[1].sync_mode = "diloco";
  auto rings = CreateAll(options);
  ASSERT_EQ(rings.size(), 2u);
  std::vector<std::vector<float>> values = {RandomValues(64, 1), RandomValues(64, 2)};
  testing::ExchangeResult r = RunExchange(rings, 1, values, ReduceOp::kMean);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(r.status[i].code(), absl::StatusCode::kFailedPrecondition) << r.status[i];
    EXPECT_NE(testing::Msg(r.status[i]).find("sync mode"), std::string::npos) << r.status[i];
  }
  const std::string both = testing::Msg(r.status[0]) + " | " + testing::Msg(r.status[1]);
  EXPECT_NE(both.find("runs sync mode 'diloco' but member 'm0'"), std::string::npos) << both;
  EXPECT_NE(both.find("runs 'onebit-adam'"), std::string::npos) << both;
  // The same modes, or one member that does not say: the exchange runs.
  options = RingOf(2, base);
  options[0].sync_mode = "onebit-adam";
  rings = CreateAll(options);
  ASSERT_EQ(rings.size(), 2u);
  r = RunExchange(rings, 1, values, ReduceOp::kMean);
  EXPECT_TRUE(r.status[0].ok() && r.status[1].ok()) << r.status[0] << r.status[1];
}

}  // namespace
}  // namespace fl::diloco
