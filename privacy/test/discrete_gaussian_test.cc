// The exact discrete Gaussian sampler: its frequencies against the probability mass function N_Z(0, σ²) itself
// (not the continuous approximation, which differs visibly for σ < 1), its variance for large σ, and its range.
#include "fl/privacy/discrete_gaussian.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>

#include "fl/privacy/noise_rng.h"

namespace fl::privacy {
namespace {

// P(k) = exp(−k²/(2σ²)) / Σ_j exp(−j²/(2σ²)).
double Pmf(double variance, int64_t k) {
  double z = 0;
  for (int64_t j = -2000; j <= 2000; ++j) z += std::exp(-static_cast<double>(j * j) / (2 * variance));
  return std::exp(-static_cast<double>(k * k) / (2 * variance)) / z;
}

TEST(DiscreteGaussianTest, FrequenciesMatchTheMassFunction) {
  // Per value, the empirical frequency within five binomial standard errors of P(k), for a σ where the discrete and
  // continuous laws differ (0.5: P(0) = 0.7870 against the continuous 0.6827 of [−0.5, 0.5]) and for σ = 3.
  for (double sigma : {0.5, 3.0}) {
    auto sampler = DiscreteGaussian::Create(sigma);
    ASSERT_TRUE(sampler.ok());
    NoiseRng rng = NoiseRng::FromSeed(11);
    const int n = 200000;
    std::map<int64_t, int> counts;
    for (int i = 0; i < n; ++i) ++counts[sampler->Sample(rng)];
    for (int64_t k = -4; k <= 4; ++k) {
      const double p = Pmf(sampler->variance(), k);
      const double f = static_cast<double>(counts[k]) / n;
      EXPECT_LT(std::abs(f - p), 5 * std::sqrt(p * (1 - p) / n) + 1e-9) << "σ=" << sigma << " k=" << k;
    }
  }
}

TEST(DiscreteGaussianTest, VarianceOfLargeSigmaIsSigmaSquared) {
  for (double sigma : {25.0, 1000.0}) {
    auto sampler = DiscreteGaussian::Create(sigma);
    ASSERT_TRUE(sampler.ok());
    EXPECT_DOUBLE_EQ(sampler->variance(), sigma * sigma);
    NoiseRng rng = NoiseRng::FromSeed(12);
    const int n = 100000;
    double sum = 0, sum2 = 0;
    for (int i = 0; i < n; ++i) {
      const double y = static_cast<double>(sampler->Sample(rng));
      sum += y;
      sum2 += y * y;
    }
    const double mean = sum / n;
    const double variance = sum2 / n - mean * mean;
    EXPECT_LT(std::abs(mean), 5 * sigma / std::sqrt(n)) << sigma;
    EXPECT_LT(std::abs(variance - sigma * sigma), 5 * sigma * sigma * std::sqrt(2.0 / n)) << sigma;
  }
}

TEST(DiscreteGaussianTest, VarianceIsRoundedToA1024th) {
  EXPECT_DOUBLE_EQ(DiscreteGaussian::Create(0.001)->variance(), 1.0 / 1024);
  EXPECT_DOUBLE_EQ(DiscreteGaussian::Create(1.5)->variance(), 2.25);
}

TEST(DiscreteGaussianTest, RefusesOutOfRangeSigma) {
  EXPECT_FALSE(DiscreteGaussian::Create(0).ok());
  EXPECT_FALSE(DiscreteGaussian::Create(-1).ok());
  EXPECT_FALSE(DiscreteGaussian::Create(std::nan("")).ok());
  EXPECT_THAT(std::string(DiscreteGaussian::Create(2e6).status().message()), ::testing::HasSubstr("σ = 2e+06"));
  EXPECT_TRUE(DiscreteGaussian::Create(1048576).ok());
}

}  // namespace
}  // namespace fl::privacy
