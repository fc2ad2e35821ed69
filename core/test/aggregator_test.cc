#include "fl/core/aggregator.h"

#include <algorithm>
#include <cstring>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "fl/core/codec.h"
#include "fl/core/str_cat.h"

namespace fl::core {
namespace {

// status.message() is an absl::string_view, which Debian's Abseil keeps distinct from std::string_view.
::testing::AssertionResult HasSubstr(absl::string_view haystack, std::string_view needle) {
  if (fl::ToStd(haystack).find(needle) != std::string_view::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << needle << "' not found in: " << haystack;
}

std::shared_ptr<const ModelSpec> Spec(int64_t conv = 24, int64_t fc = 13) {
  auto spec = ModelSpec::Create({{"conv.weight", {conv}, DType::kFloat32, 0},
                                 {"conv.bias", {3}, DType::kFloat32, 0},
                                 {"fc.weight", {fc}, DType::kFloat32, 0}});
  EXPECT_TRUE(spec.ok()) << spec.status();
  return std::make_shared<const ModelSpec>(*std::move(spec));
}

std::vector<std::vector<float>> RandomUpdates(size_t count, size_t size, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::vector<float>> updates(count, std::vector<float>(size));
  for (auto& u : updates) {
    for (float& x : u) x = normal(rng);
  }
  return updates;
}

std::unique_ptr<Aggregator> Make(std::string_view name, std::shared_ptr<const ModelSpec> spec) {
  auto agg = MakeAggregator(name, std::move(spec));
  EXPECT_TRUE(agg.ok()) << agg.status();
  return agg.ok() ? *std::move(agg) : nullptr;
}

// Sort-based references, in double.
double ReferenceMedian(std::vector<float> column) {
  std::sort(column.begin(), column.end());
  const size_t n = column.size();
  return n % 2 == 1 ? column[n / 2] : (static_cast<double>(column[n / 2 - 1]) + column[n / 2]) / 2.0;
}

double ReferenceTrimmedMean(std::vector<float> column, double beta) {
  std::sort(column.begin(), column.end());
  const size_t n = column.size();
  const size_t k = static_cast<size_t>(beta * static_cast<double>(n));
  double sum = 0.0;
  for (size_t i = k; i < n - k; ++i) sum += column[i];
  return sum / static_cast<double>(n - 2 * k);
}

std::vector<float> Column(const std::vector<std::vector<float>>& updates, size_t i) {
  std::vector<float> c;
  for (const auto& u : updates) c.push_back(u[i]);
  return c;
}

TEST(WeightedMeanTest, MatchesDoubleReference) {
  auto spec = Spec();
  const size_t p = spec->num_elements();
  const auto updates = RandomUpdates(37, p, 1);
  std::mt19937 rng(2);
  std::uniform_real_distribution<double> weight_dist(1.0, 5000.0);
  auto agg = Make("mean", spec);
  std::vector<double> weights;
  for (const auto& u : updates) {
    weights.push_back(std::round(weight_dist(rng)));  // example counts
    ASSERT_TRUE(agg->Add(u, weights.back(), spec->fingerprint(), "client").ok());
  }
  EXPECT_EQ(agg->num_updates(), updates.size());
  double total = 0.0;
  for (double w : weights) total += w;
  EXPECT_DOUBLE_EQ(agg->total_weight(), total);

  auto result = agg->Finish();
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->size(), p);
  for (size_t i = 0; i < p; ++i) {
    double sum = 0.0, abs_sum = 0.0;
    for (size_t k = 0; k < updates.size(); ++k) {
      sum += weights[k] * updates[k][i];
      abs_sum += weights[k] * std::fabs(updates[k][i]);
    }
    // The documented bound: n * 2^-24 * sum w|x| / W (plus the final rounding).
    const double bound = (static_cast<double>(updates.size()) + 1) * std::ldexp(1.0, -24) * abs_sum / total;
    EXPECT_NEAR((*result)[i], sum / total, bound) << "element " << i;
  }
}

TEST(WeightedMeanTest, SingleUpdateWithWeightOneIsExact) {
  auto spec = Spec();
  const auto updates = RandomUpdates(1, spec->num_elements(), 3);
  auto agg = Make("fedavg", spec);
  ASSERT_TRUE(agg->Add(updates[0], 1.0, spec->fingerprint(), "c").ok());
  EXPECT_EQ(*agg->Finish(), updates[0]);
}

TEST(WeightedMeanTest, FinishDoesNotResetAndResetDoes) {
  auto spec = Spec();
  const auto updates = RandomUpdates(3, spec->num_elements(), 4);
  auto agg = Make("mean", spec);
  ASSERT_TRUE(agg->Add(updates[0], 2.0, spec->fingerprint(), "a").ok());
  const std::vector<float> first = *agg->Finish();
  EXPECT_EQ(*agg->Finish(), first);
  ASSERT_TRUE(agg->Add(updates[1], 2.0, spec->fingerprint(), "b").ok());
  EXPECT_EQ(agg->num_updates(), 2u);
  agg->Reset();
  EXPECT_EQ(agg->num_updates(), 0u);
  EXPECT_EQ(agg->total_weight(), 0.0);
  auto empty = agg->Finish();
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(HasSubstr(empty.status().message(), "no accepted updates"));
  // After Reset, the same sequence gives the same result as a fresh aggregator.
  ASSERT_TRUE(agg->Add(updates[0], 2.0, spec->fingerprint(), "a").ok());
  EXPECT_EQ(*agg->Finish(), first);
}

TEST(WeightedMeanTest, LargeUpdatesVectorizedPathAndTail) {
  // Sizes around the 16-lane check's block size, so that both its main loop and its tail see the NaN.
  for (int64_t fc : {0, 1, 15, 16, 17, 1000}) {
    auto spec = Spec(16, fc);
    const size_t p = spec->num_elements();
    auto agg = Make("mean", spec);
    std::vector<float> ones(p, 1.0f);
    ASSERT_TRUE(agg->Add(ones, 1.0, spec->fingerprint(), "a").ok());
    for (size_t bad = 0; bad < p; bad += std::max<size_t>(1, p / 7)) {
      std::vector<float> u(p, 3.0f);
      u[bad] = std::numeric_limits<float>::quiet_NaN();
      EXPECT_FALSE(agg->Add(u, 1.0, spec->fingerprint(), "b").ok()) << "p=" << p << " bad=" << bad;
    }
    std::vector<float> last(p, 3.0f);
    last[p - 1] = -std::numeric_limits<float>::infinity();
    EXPECT_FALSE(agg->Add(last, 1.0, spec->fingerprint(), "b").ok());
    EXPECT_EQ(*agg->Finish(), ones);
  }
}

TEST(MedianTest, MatchesSortReferenceForOddAndEvenCounts) {
  auto spec = Spec(300, 7);
  const size_t p = spec->num_elements();
  for (size_t count : {1u, 2u, 3u, 4u, 7u, 10u, 101u}) {
    const auto updates = RandomUpdates(count, p, static_cast<uint32_t>(10 + count));
    auto agg = Make("median", spec);
    for (size_t k = 0; k < count; ++k) {
      // Weights are ignored (unweighted, as Flower's FedMedian).
      ASSERT_TRUE(agg->Add(updates[k], 1.0 + static_cast<double>(k) * 100, spec->fingerprint(), "c").ok());
    }
    auto result = agg->Finish();
    ASSERT_TRUE(result.ok()) << result.status();
    for (size_t i = 0; i < p; ++i) {
      EXPECT_FLOAT_EQ((*result)[i], static_cast<float>(ReferenceMedian(Column(updates, i))))
          << "count " << count << " element " << i;
    }
  }
}

TEST(MedianTest, EvenCountIsMeanOfMiddleValues) {
  auto spec = ModelSpec::Create({{"w", {2}, DType::kFloat32, 0}});
  auto shared = std::make_shared<const ModelSpec>(*spec);
  auto agg = Make("median", shared);
  for (const std::vector<float>& u : std::vector<std::vector<float>>{{1, -5}, {10, 1e19f}, {2, 1.8e19f}, {7, 0}}) {
    ASSERT_TRUE(agg->Add(u, 1.0, shared->fingerprint(), "c").ok());
  }
  // Column 0 sorted: 1 2 7 10 -> (2 + 7) / 2. Column 1: -5 0 1e19 1.8e19 -> (0 + 1e19) / 2.
  const std::vector<float> result = *agg->Finish();
  EXPECT_EQ(result[0], 4.5f);
  EXPECT_FLOAT_EQ(result[1], 5e18f);
}

TEST(TrimmedMeanTest, MatchesSortReference) {
  auto spec = Spec(200, 5);
  const size_t p = spec->num_elements();
  for (double beta : {0.0, 0.1, 0.2, 0.25, 0.49}) {
    for (size_t count : {1u, 2u, 4u, 5u, 10u, 33u}) {
      const auto updates = RandomUpdates(count, p, static_cast<uint32_t>(100 + count));
      auto agg = Make(fl::StrCat("trimmed_mean:", beta), spec);
      for (const auto& u : updates) ASSERT_TRUE(agg->Add(u, 3.0, spec->fingerprint(), "c").ok());
      auto result = agg->Finish();
      ASSERT_TRUE(result.ok()) << result.status();
      for (size_t i = 0; i < p; ++i) {
        EXPECT_FLOAT_EQ((*result)[i], static_cast<float>(ReferenceTrimmedMean(Column(updates, i), beta)))
            << "beta " << beta << " count " << count << " element " << i;
      }
    }
  }
}

TEST(TrimmedMeanTest, TrimsOutliers) {
  auto spec = ModelSpec::Create({{"w", {1}, DType::kFloat32, 0}});
  auto shared = std::make_shared<const ModelSpec>(*spec);
  auto agg = Make("trimmed_mean:0.2", shared);
  // n = 5: int(0.2 * 5) = 1 cut from each end: mean(2, 3, 4) = 3.
  for (float x : {1e6f, 2.0f, 3.0f, 4.0f, -1e6f}) {
    ASSERT_TRUE(agg->Add(std::vector<float>{x}, 1.0, shared->fingerprint(), "c").ok());
  }
  EXPECT_EQ((*agg->Finish())[0], 3.0f);
  EXPECT_EQ(agg->name(), "trimmed_mean:0.2");
  EXPECT_EQ(Make("trimmed_mean", shared)->name(), "trimmed_mean:0.2");  // Flower's default beta
}

// Every way to reject an update, for every aggregator: the error names the source and the value, and
// the aggregate is bit-for-bit what it was.
TEST(AggregatorTest, RejectionsLeaveTheAggregateUnchanged) {
  auto spec = Spec();
  const size_t p = spec->num_elements();
  const uint64_t fp = spec->fingerprint();
  const auto updates = RandomUpdates(3, p, 9);
  for (const char* name : {"mean", "median", "trimmed_mean:0.2"}) {
    SCOPED_TRACE(name);
    auto agg = Make(name, spec);
    ASSERT_TRUE(agg->Add(updates[0], 2.0, fp, "client 1").ok());
    ASSERT_TRUE(agg->Add(updates[1], 3.0, fp, "client 2").ok());
    const std::vector<float> before = *agg->Finish();

    auto expect_rejected = [&](absl::Status s, absl::StatusCode code, std::vector<std::string> needles) {
      EXPECT_EQ(s.code(), code) << s;
      for (const std::string& needle : needles) EXPECT_TRUE(HasSubstr(s.message(), needle));
      EXPECT_EQ(agg->num_updates(), 2u);
      EXPECT_EQ(agg->total_weight(), 5.0);
      EXPECT_EQ(*agg->Finish(), before);
    };

    const auto kInvalid = absl::StatusCode::kInvalidArgument;
    for (double w :
         {0.0, -1.0, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(), 1e13, 1e-13}) {
      expect_rejected(agg->Add(updates[2], w, fp, "client 7"), kInvalid,
                      {"update from client 7 has weight", fl::StrCat(w)});
    }
    expect_rejected(agg->Add(updates[2], 1.0, fp ^ 1, "client 8"), absl::StatusCode::kFailedPrecondition,
                    {"update from client 8", "fingerprint", FingerprintToHex(fp ^ 1)});
    std::vector<float> short_update(updates[2].begin(), updates[2].end() - 1);
    expect_rejected(agg->Add(short_update, 1.0, fp, "client 9"), kInvalid,
                    {"update from client 9", fl::StrCat(p - 1, " parameters")});

    std::vector<float> nan_update = updates[2];
    nan_update[26] = std::numeric_limits<float>::quiet_NaN();  // conv.bias element 2
    expect_rejected(agg->Add(nan_update, 1.0, fp, "client 10"), kInvalid,
                    {"update from client 10", "nan", "tensor 'conv.bias' element 2"});
    std::vector<float> inf_update = updates[2];
    inf_update[p - 1] = -std::numeric_limits<float>::infinity();
    expect_rejected(agg->Add(inf_update, 1.0, fp, "client 11"), kInvalid,
                    {"client 11", "-inf", "tensor 'fc.weight' element 12"});
    std::vector<float> huge_update = updates[2];
    huge_update[0] = 1e20f;
    expect_rejected(agg->Add(huge_update, 1.0, fp, "client 12"), kInvalid,
                    {"client 12", "1e+20", "tensor 'conv.weight' element 0", "diverged"});

    // And a good update is still accepted afterwards, landing as if the refused ones had never come.
    ASSERT_TRUE(agg->Add(updates[2], 1.0, fp, "client 3").ok());
    EXPECT_EQ(agg->num_updates(), 3u);
    auto fresh = Make(name, spec);
    ASSERT_TRUE(fresh->Add(updates[0], 2.0, fp, "a").ok());
    ASSERT_TRUE(fresh->Add(updates[1], 3.0, fp, "b").ok());
    ASSERT_TRUE(fresh->Add(updates[2], 1.0, fp, "c").ok());
    EXPECT_EQ(*agg->Finish(), *fresh->Finish());
  }
}

TEST(AggregatorTest, EncodedFp32EqualsAdd) {
  auto spec = Spec(100, 50);
  const uint64_t fp = spec->fingerprint();
  const auto updates = RandomUpdates(5, spec->num_elements(), 21);
  auto codec = MakeCodec("fp32");
  ASSERT_TRUE(codec.ok()) << codec.status();
  for (const char* name : {"mean", "median", "trimmed_mean:0.2"}) {
    SCOPED_TRACE(name);
    auto plain = Make(name, spec);
    auto encoded = Make(name, spec);
    for (size_t k = 0; k < updates.size(); ++k) {
      const double w = 1.0 + static_cast<double>(k);
      ASSERT_TRUE(plain->Add(updates[k], w, fp, "c").ok());
      std::vector<uint8_t> payload;
      ASSERT_TRUE((*codec)->Encode(updates[k], &payload).ok());
      ASSERT_TRUE(encoded->AddEncoded(**codec, payload, w, fp, "c").ok());
    }
    EXPECT_EQ(encoded->num_updates(), plain->num_updates());
    EXPECT_EQ(encoded->total_weight(), plain->total_weight());
    EXPECT_EQ(*encoded->Finish(), *plain->Finish());
  }
}

TEST(AggregatorTest, EncodedLossyEqualsAddOfDecoded) {
  auto spec = Spec(100, 50);
  const uint64_t fp = spec->fingerprint();
  const auto updates = RandomUpdates(4, spec->num_elements(), 22);
  for (const char* codec_name : {"fp16", "int8", "fp4"}) {
    auto codec = MakeCodec(codec_name);
    ASSERT_TRUE(codec.ok()) << codec.status();
    auto plain = Make("mean", spec);
    auto encoded = Make("mean", spec);
    for (const auto& u : updates) {
      std::vector<uint8_t> payload;
      ASSERT_TRUE((*codec)->Encode(u, &payload).ok());
      std::vector<float> decoded(u.size());
      ASSERT_TRUE((*codec)->Decode(payload, decoded).ok());
      ASSERT_TRUE(plain->Add(decoded, 2.0, fp, "c").ok());
      ASSERT_TRUE(encoded->AddEncoded(**codec, payload, 2.0, fp, "c").ok());
    }
    EXPECT_EQ(*encoded->Finish(), *plain->Finish()) << codec_name;
  }
}

TEST(AggregatorTest, BadPayloadsAreRejectedAndChangeNothing) {
  auto spec = Spec();
  const uint64_t fp = spec->fingerprint();
  const auto updates = RandomUpdates(2, spec->num_elements(), 23);
  auto codec = MakeCodec("int8");
  ASSERT_TRUE(codec.ok()) << codec.status();
  auto fp16 = MakeCodec("fp16");
  ASSERT_TRUE(fp16.ok()) << fp16.status();
  auto agg = Make("mean", spec);
  std::vector<uint8_t> payload;
  ASSERT_TRUE((*codec)->Encode(updates[0], &payload).ok());
  ASSERT_TRUE(agg->AddEncoded(**codec, payload, 1.0, fp, "client 1").ok());
  const std::vector<float> before = *agg->Finish();

  std::vector<uint8_t> good;
  ASSERT_TRUE((*codec)->Encode(updates[1], &good).ok());
  // Truncated, corrupt body, wrong codec, wrong size, wrong weight: all rejected, naming the source.
  std::vector<uint8_t> truncated(good.begin(), good.end() - 3);
  std::vector<uint8_t> corrupt = good;
  corrupt.back() ^= 0x40;
  std::vector<uint8_t> small;
  ASSERT_TRUE((*codec)->Encode(std::vector<float>(5, 1.0f), &small).ok());
  for (const auto& [bytes, c, weight, needle] :
       std::vector<std::tuple<std::vector<uint8_t>, const Codec*, double, std::string>>{
           {truncated, codec->get(), 1.0, "update from client 2"},
           {corrupt, codec->get(), 1.0, "update from client 2"},
           {good, fp16->get(), 1.0, "'int8' payload but was handed to the 'fp16' codec"},
           {small, codec->get(), 1.0, "carries 5 parameters"},
           {good, codec->get(), -2.0, "has weight -2"},
       }) {
    absl::Status s = agg->AddEncoded(*c, bytes, weight, fp, "client 2");
    EXPECT_FALSE(s.ok()) << needle;
    EXPECT_TRUE(HasSubstr(s.message(), needle));
    EXPECT_TRUE(HasSubstr(s.message(), "client 2"));
    EXPECT_EQ(agg->num_updates(), 1u);
    EXPECT_EQ(*agg->Finish(), before);
  }
  EXPECT_EQ(agg->AddEncoded(**codec, good, 1.0, fp + 1, "client 3").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(agg->AddEncoded(**codec, good, 1.0, fp, "client 2").ok());
}

TEST(AggregatorTest, EncodedOutOfRangeValuesAreRejectedAndChangeNothing) {
  // A finite fp32 payload can still carry values beyond kMaxUpdateAbsValue; AddEncoded decodes in place
  // (into the mean's spare accumulator, the median's next row), so this checks that the refusal neither
  // touches the aggregate nor loses the value for the error message.
  auto spec = Spec();
  const uint64_t fp = spec->fingerprint();
  const auto updates = RandomUpdates(2, spec->num_elements(), 24);
  auto codec = MakeCodec("fp32");
  ASSERT_TRUE(codec.ok()) << codec.status();
  for (const char* name : {"mean", "median", "trimmed_mean:0.1"}) {
    SCOPED_TRACE(name);
    auto agg = Make(name, spec);
    std::vector<uint8_t> payload;
    ASSERT_TRUE((*codec)->Encode(updates[0], &payload).ok());
    ASSERT_TRUE(agg->AddEncoded(**codec, payload, 1.0, fp, "client 1").ok());
    const std::vector<float> before = *agg->Finish();

    std::vector<float> huge = updates[1];
    huge[30] = -3e30f;  // fc.weight element 3
    ASSERT_TRUE((*codec)->Encode(huge, &payload).ok());
    absl::Status s = agg->AddEncoded(**codec, payload, 1.0, fp, "client 2");
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(HasSubstr(s.message(), "update from client 2 contains -3e+30 at tensor 'fc.weight' element 3"));
    EXPECT_EQ(agg->num_updates(), 1u);
    EXPECT_EQ(*agg->Finish(), before);

    // The next good update lands as if the refused one had never come.
    auto fresh = Make(name, spec);
    ASSERT_TRUE(fresh->Add(updates[0], 1.0, fp, "a").ok());
    ASSERT_TRUE(fresh->Add(updates[1], 1.0, fp, "b").ok());
    ASSERT_TRUE((*codec)->Encode(updates[1], &payload).ok());
    ASSERT_TRUE(agg->AddEncoded(**codec, payload, 1.0, fp, "client 3").ok());
    EXPECT_EQ(*agg->Finish(), *fresh->Finish());
  }
}

// The server's path (fl-server checked the upload's XXH3 first): an fp32 payload without a body checksum is added
// straight from its bytes. Same aggregate as Add for every aggregator and norm bound; out-of-range and non-finite
// values refused naming the value, the aggregate untouched; a body not aligned for floats takes the decoding path.
TEST(AggregatorTest, AVerifiedFp32PayloadIsAddedFromItsBytesExactlyLikeAdd) {
  auto spec = Spec();
  const uint64_t fp = spec->fingerprint();
  const auto updates = RandomUpdates(4, spec->num_elements(), 25);
  auto codec = MakeCodec("fp32");
  ASSERT_TRUE(codec.ok()) << codec.status();
  const DecodeOptions verified{.transfer_verified = true};
  const EncodeOptions bare{.body_checksum = false};
  for (const char* name : {"mean", "median", "trimmed_mean:0.2"}) {
    for (const char* clip : {"off", "0.5", "median"}) {
      if (std::string(name) == "mean" && std::string(clip) == "median") continue;  // refused by SetNormClip
      SCOPED_TRACE(fl::StrCat(name, " clip ", clip));
      auto plain = Make(name, spec);
      auto encoded = Make(name, spec);
      ASSERT_TRUE(plain->SetNormClip(*NormClip::Parse(clip)).ok());
      ASSERT_TRUE(encoded->SetNormClip(*NormClip::Parse(clip)).ok());
      for (size_t k = 0; k < updates.size(); ++k) {
        const double w = 1.0 + static_cast<double>(k);
        ASSERT_TRUE(plain->Add(updates[k], w, fp, "c").ok());
        std::vector<uint8_t> payload;
        ASSERT_TRUE((*codec)->Encode(updates[k], &payload, bare).ok());
        if (k == 2) {
          // One byte later in memory: the floats are misaligned, decoded into a buffer instead.
          std::vector<uint8_t> shifted(payload.size() + 1);
          std::copy(payload.begin(), payload.end(), shifted.begin() + 1);
          const std::span<const uint8_t> odd(shifted.data() + 1, payload.size());
          ASSERT_TRUE(encoded->AddEncoded(**codec, odd, w, fp, "c", verified).ok());
        } else {
          ASSERT_TRUE(encoded->AddEncoded(**codec, payload, w, fp, "c", verified).ok());
        }
      }
      const std::vector<float> before = *encoded->Finish();
      EXPECT_EQ(before, *plain->Finish());

      for (float bad : {-3e30f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
        std::vector<float> values = updates[0];
        values[30] = bad;  // fc.weight element 3
        std::vector<uint8_t> payload((*codec)->EncodedSize(values.size()));
        // Encode refuses NaN/Inf, so the body is written as a faulty client would: the floats as they are.
        ASSERT_TRUE((*codec)->Encode(updates[0], &payload, bare).ok());
        std::memcpy(payload.data() + kCodecHeaderBytes, values.data(), values.size() * sizeof(float));
        const absl::Status st = encoded->AddEncoded(**codec, payload, 1.0, fp, "client 9", verified);
        EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
        EXPECT_TRUE(HasSubstr(st.message(), "client 9")) << st;
        EXPECT_TRUE(HasSubstr(st.message(), "fc.weight")) << st;
        EXPECT_EQ(encoded->num_updates(), updates.size());
        EXPECT_EQ(*encoded->Finish(), before);
      }
      // Without the option the same bare payload is refused: nothing verified its bytes.
      std::vector<uint8_t> payload;
      ASSERT_TRUE((*codec)->Encode(updates[0], &payload, bare).ok());
      EXPECT_EQ(encoded->AddEncoded(**codec, payload, 1.0, fp, "client 9").code(), absl::StatusCode::kDataLoss);
      // A wrong-sized verified payload is still refused by its header.
      payload.resize(payload.size() - 4);
      EXPECT_FALSE(encoded->AddEncoded(**codec, payload, 1.0, fp, "client 9", verified).ok());
      EXPECT_EQ(*encoded->Finish(), before);
    }
  }
}

// ---- norm bounding (fl-server --clip-update-norm) ----

TEST(NormClipTest, ParsesOffMedianAndNumbersAndRefusesTheRest) {
  EXPECT_EQ(NormClip::Parse("off")->mode, NormClip::Mode::kOff);
  EXPECT_EQ(NormClip::Parse("0")->mode, NormClip::Mode::kOff);
  EXPECT_EQ(NormClip::Parse("median")->mode, NormClip::Mode::kMedian);
  auto fixed = NormClip::Parse("2.5");
  ASSERT_TRUE(fixed.ok());
  EXPECT_EQ(fixed->mode, NormClip::Mode::kFixed);
  EXPECT_EQ(fixed->max_norm, 2.5);
  EXPECT_EQ(fixed->ToString(), "2.5");
  for (const char* bad : {"-1", "inf", "nan", "big", ""}) {
    auto parsed = NormClip::Parse(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_TRUE(HasSubstr(parsed.status().message(), fl::StrCat("'", bad, "'")));
  }
}

TEST(NormClipTest, UpdateNormLeavesIntegerTensorsOut) {
  auto spec = std::make_shared<const ModelSpec>(*ModelSpec::Create(
      {{"w", {2}, DType::kFloat32, 0}, {"steps", {}, DType::kInt64, 0}, {"b", {1}, DType::kFloat32, 0}}));
  EXPECT_DOUBLE_EQ(UpdateNorm(*spec, std::vector<float>{3, 0, 1e6f, 4}), 5.0);
}

TEST(NormClipTest, FixedBoundScalesAnUpdateDownToItAndLeavesSmallOnesAlone) {
  for (const char* name : {"mean", "median", "trimmed_mean:0.2"}) {
    auto spec = std::make_shared<const ModelSpec>(
        *ModelSpec::Create({{"w", {2}, DType::kFloat32, 0}, {"steps", {}, DType::kInt64, 0}}));
    auto agg = Make(name, spec);
    ASSERT_TRUE(agg->SetNormClip(*NormClip::Parse("1")).ok());
    // Norm 5 -> scaled to 1: (0.6, 0.8); the integer counter is not scaled.
    ASSERT_TRUE(agg->Add(std::vector<float>{3, 4, 7}, 1.0, spec->fingerprint(), "big").ok());
    auto out = agg->Finish();
    ASSERT_TRUE(out.ok());
    EXPECT_NEAR((*out)[0], 0.6f, 1e-6) << name;
    EXPECT_NEAR((*out)[1], 0.8f, 1e-6) << name;
    EXPECT_EQ((*out)[2], 7.0f) << name;
    EXPECT_EQ(agg->num_clipped(), 1u);
    // Under the bound: untouched (encoded path too).
    agg->Reset();
    std::vector<uint8_t> payload;
    ASSERT_TRUE((*MakeCodec("fp32"))->Encode(std::vector<float>{0.3f, 0.4f, 2}, &payload).ok());
    ASSERT_TRUE(agg->AddEncoded(**MakeCodec("fp32"), payload, 1.0, spec->fingerprint(), "small").ok());
    out = agg->Finish();
    EXPECT_FLOAT_EQ((*out)[0], 0.3f) << name;
    EXPECT_FLOAT_EQ((*out)[1], 0.4f) << name;
    EXPECT_EQ(agg->num_clipped(), 0u);
  }
}

TEST(NormClipTest, OneHugeUpdateCannotSetTheMeanWhenBounded) {
  // The attack of issue 13: one client sends a delta of 1e18 per value. Unbounded it dominates the mean;
  // bounded at 1 it moves each value by at most 1 / sqrt(n) of its norm share.
  auto spec = Spec();
  const size_t p = spec->num_elements();
  auto agg = Make("mean", spec);
  ASSERT_TRUE(agg->SetNormClip(*NormClip::Parse("1")).ok());
  for (int k = 0; k < 3; ++k) {
    ASSERT_TRUE(agg->Add(std::vector<float>(p, 0.01f), 1.0, spec->fingerprint(), "honest").ok());
  }
  ASSERT_TRUE(agg->Add(std::vector<float>(p, 1e18f), 1.0, spec->fingerprint(), "attacker").ok());
  auto out = agg->Finish();
  ASSERT_TRUE(out.ok());
  for (float v : *out) EXPECT_LT(std::fabs(v), 0.1f);
  EXPECT_EQ(agg->num_clipped(), 1u);
  // A value beyond kMaxUpdateAbsValue is still refused, not scaled into range.
  const absl::Status bad = agg->Add(std::vector<float>(p, 1e30f), 1.0, spec->fingerprint(), "far");
  EXPECT_FALSE(bad.ok());
  EXPECT_EQ(agg->num_updates(), 4u);
}

TEST(NormClipTest, MedianBoundScalesUpdatesAboveTheMedianNorm) {
  auto spec = std::make_shared<const ModelSpec>(
      *ModelSpec::Create({{"w", {1}, DType::kFloat32, 0}, {"steps", {}, DType::kInt64, 0}}));
  auto agg = Make("trimmed_mean:0", spec);  // beta 0: the plain mean of the (scaled) rows
  ASSERT_TRUE(agg->SetNormClip(*NormClip::Parse("median")).ok());
  // Norms 1, 2, 100: the median is 2, so 100 becomes 2; mean (1 + 2 + 2) / 3. Counters are not scaled.
  for (float w : {1.0f, 2.0f, 100.0f}) {
    ASSERT_TRUE(agg->Add(std::vector<float>{w, 9}, 1.0, spec->fingerprint(), "c").ok());
  }
  auto out = agg->Finish();
  ASSERT_TRUE(out.ok());
  EXPECT_NEAR((*out)[0], 5.0f / 3.0f, 1e-6);
  EXPECT_EQ((*out)[1], 9.0f);
  EXPECT_EQ(agg->num_clipped(), 1u);
}

TEST(NormClipTest, TheStreamedMeanRefusesTheMedianBound) {
  auto agg = Make("mean", Spec());
  const absl::Status s = agg->SetNormClip(*NormClip::Parse("median"));
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(HasSubstr(s.message(), "fixed bound"));
  EXPECT_FALSE(agg->SetNormClip(NormClip{NormClip::Mode::kFixed, -1}).ok());
}

TEST(MakeAggregatorTest, NamesAndErrors) {
  auto spec = Spec();
  EXPECT_EQ(Make("mean", spec)->name(), "mean");
  EXPECT_EQ(Make("fedavg", spec)->name(), "mean");
  EXPECT_EQ(Make("median", spec)->name(), "median");
  EXPECT_EQ(Make("fedmedian", spec)->name(), "median");
  EXPECT_EQ(Make("trimmed_mean:0.1", spec)->name(), "trimmed_mean:0.1");
  EXPECT_EQ(Make("fedtrimmedavg:0.3", spec)->name(), "trimmed_mean:0.3");

  auto expect_error = [&](std::string_view name, const char* needle) {
    auto agg = MakeAggregator(name, spec);
    ASSERT_FALSE(agg.ok()) << name;
    EXPECT_EQ(agg.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(HasSubstr(agg.status().message(), needle)) << name;
  };
  expect_error("krum", "unknown aggregator 'krum'; expected one of");
  expect_error("trimmed_mean:0.5", "beta = 0.5 is out of range");
  expect_error("trimmed_mean:-0.1", "beta = -0.1");
  expect_error("trimmed_mean:nan", "beta = nan");
  expect_error("trimmed_mean:abc", "'abc' is not a number");
  expect_error("median:3", "'median' takes no parameter");
  EXPECT_FALSE(MakeAggregator("mean", nullptr).ok());
}

}  // namespace
}  // namespace fl::core
