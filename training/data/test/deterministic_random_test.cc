// The platform-independent samplers: accuracy of our Log/Exp against libm, the statistical moments of
// each sampler, and pinned bit patterns that a different platform or compiler must reproduce.
#include "fl/training/data/deterministic_random.h"

#include <bit>
#include <cmath>
#include <numeric>
#include <vector>

#include <gtest/gtest.h>

namespace fl::training::data {
namespace {

TEST(DeterministicRandomTest, StandardEngineIsTheStandardOne) {
  // [rand.predef]: the 10000th output of a default-constructed mt19937_64 is 9981545732273789042.
  std::mt19937_64 engine;
  engine.discard(9999);
  EXPECT_EQ(engine(), 9981545732273789042ULL);
}

TEST(DeterministicRandomTest, LogMatchesLibm) {
  Engine engine = MakeEngine(1, 0);
  for (int i = 0; i < 200000; ++i) {
    // Log-uniform over the whole positive range, including subnormals.
    const double x = std::ldexp(1.0 + UniformDouble(engine), static_cast<int>(UniformIndex(engine, 2090)) - 1070);
    const double expected = std::log(x);
    ASSERT_NEAR(Log(x), expected, 4e-16 * std::max(1.0, std::fabs(expected))) << x;
  }
  for (double x : {1.0, 1.0 + 1e-15, 1.0 - 1e-16, 0.5, 2.0, 1e-300, 1e300, 4.9e-324}) {
    EXPECT_NEAR(Log(x), std::log(x), 4e-16 * std::max(1.0, std::fabs(std::log(x)))) << x;
  }
  EXPECT_EQ(Log(1.0), 0.0);
  EXPECT_TRUE(std::isinf(Log(0.0)) && Log(0.0) < 0);
  EXPECT_TRUE(std::isnan(Log(-1.0)));
}

TEST(DeterministicRandomTest, ExpMatchesLibm) {
  Engine engine = MakeEngine(2, 0);
  for (int i = 0; i < 200000; ++i) {
    const double x = -745.0 + 1454.0 * UniformDouble(engine);
    const double expected = std::exp(x);
    if (expected < 1e-300) continue;  // subnormal results have absolute, not relative, precision
    ASSERT_NEAR(Exp(x) / expected, 1.0, 4e-16) << x;
  }
  EXPECT_EQ(Exp(0.0), 1.0);
  EXPECT_EQ(Exp(-800.0), 0.0);
  EXPECT_TRUE(std::isinf(Exp(710.0)));
}

TEST(DeterministicRandomTest, UniformIndexIsInRangeAndUnbiased) {
  Engine engine = MakeEngine(3, 0);
  constexpr uint64_t kBins = 7;
  constexpr int kDraws = 700000;
  std::vector<int> counts(kBins, 0);
  for (int i = 0; i < kDraws; ++i) {
    const uint64_t k = UniformIndex(engine, kBins);
    ASSERT_LT(k, kBins);
    ++counts[k];
  }
  double chi2 = 0;
  for (int c : counts) chi2 += (c - kDraws / 7.0) * (c - kDraws / 7.0) / (kDraws / 7.0);
  EXPECT_LT(chi2, 22.5);  // 6 degrees of freedom, p = 0.001
  EXPECT_EQ(UniformIndex(engine, 1), 0u);
  const uint64_t huge = (uint64_t{1} << 63) + 1;  // rejection rate ~1/2: must still terminate, stay in range
  for (int i = 0; i < 1000; ++i) ASSERT_LT(UniformIndex(engine, huge), huge);
}

TEST(DeterministicRandomTest, UniformDoublesStayInTheirIntervals) {
  Engine engine = MakeEngine(4, 0);
  for (int i = 0; i < 100000; ++i) {
    const double u = UniformDouble(engine);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    const double v = UniformOpenDouble(engine);
    ASSERT_GT(v, 0.0);
    ASSERT_LT(v, 1.0);
  }
}

TEST(DeterministicRandomTest, ShuffleIsAPermutationAndMovesThings) {
  Engine engine = MakeEngine(5, 0);
  std::vector<uint32_t> values(1000);
  std::iota(values.begin(), values.end(), 0u);
  Shuffle(engine, values);
  std::vector<uint32_t> sorted = values;
  std::sort(sorted.begin(), sorted.end());
  for (uint32_t i = 0; i < sorted.size(); ++i) ASSERT_EQ(sorted[i], i);
  int fixed = 0;
  for (uint32_t i = 0; i < values.size(); ++i) fixed += values[i] == i;
  EXPECT_LT(fixed, 10);  // expectation 1
  std::vector<uint32_t> empty;
  Shuffle(engine, empty);
}

TEST(DeterministicRandomTest, NormalHasUnitMoments) {
  Engine engine = MakeEngine(6, 0);
  constexpr int kDraws = 400000;
  double sum = 0, sum2 = 0;
  for (int i = 0; i < kDraws; ++i) {
    const double z = StandardNormal(engine);
    sum += z;
    sum2 += z * z;
  }
  EXPECT_NEAR(sum / kDraws, 0.0, 0.01);
  EXPECT_NEAR(sum2 / kDraws, 1.0, 0.01);
}

TEST(DeterministicRandomTest, GammaHasTheRightMoments) {
  // Gamma(a, 1): mean a, variance a; and E[log X] = digamma(a), checked for the boosted small shapes.
  for (double shape : {0.05, 0.1, 0.5, 1.0, 2.5, 30.0, 1000.0}) {
    Engine engine = MakeEngine(7, static_cast<uint64_t>(shape * 1000));
    constexpr int kDraws = 400000;
    double sum = 0, sum2 = 0;
    for (int i = 0; i < kDraws; ++i) {
      const double x = SampleGamma(engine, shape);
      ASSERT_GE(x, 0.0);
      sum += x;
      sum2 += x * x;
    }
    const double mean = sum / kDraws;
    const double variance = sum2 / kDraws - mean * mean;
    const double standard_error = std::sqrt(shape / kDraws);
    EXPECT_NEAR(mean, shape, 6 * standard_error) << shape;
    EXPECT_NEAR(variance / shape, 1.0, shape < 0.2 ? 0.15 : 0.03) << shape;
  }
}

TEST(DeterministicRandomTest, LogGammaHandlesShapesThatUnderflow) {
  Engine engine = MakeEngine(8, 0);
  for (int i = 0; i < 1000; ++i) {
    const double lg = LogGamma(engine, 1e-4);
    ASSERT_TRUE(std::isfinite(lg));
  }
  EXPECT_TRUE(std::isnan(LogGamma(engine, 0.0)));
  EXPECT_TRUE(std::isnan(LogGamma(engine, -1.0)));
}

TEST(DeterministicRandomTest, PinnedBitPatterns) {
  // PINNED: these bits must come out the same on x86_64, arm64 and any compiler; they pin the streams and
  // samplers that every recorded partition depends on. A change here breaks replay of recorded experiments.
  Engine engine = MakeEngine(42, 7);
  uint64_t first = engine();
  double log_gamma_sum = 0;
  uint64_t index_sum = 0;
  for (int i = 0; i < 1000; ++i) {
    log_gamma_sum += LogGamma(engine, 0.3);
    log_gamma_sum += LogGamma(engine, 4.0);
    index_sum += UniformIndex(engine, 1000003);
  }
  EXPECT_EQ(first, 2416649347308346029ULL);
  EXPECT_EQ(std::bit_cast<uint64_t>(log_gamma_sum), 13880834362757617428ULL);
  EXPECT_EQ(index_sum, 497078744u);
}

}  // namespace
}  // namespace fl::training::data
