// The mechanisms on real spans with a seeded NoiseRng: every statistical check draws one fixed sample (the seed is
// part of the test), and its bound is derived from the sample size (five standard errors), so the test fails only
// if the mechanism is wrong, never by chance on a rerun.
#include "fl/privacy/mechanisms.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "fl/privacy/noise_rng.h"

namespace fl::privacy {
namespace {

using ::testing::HasSubstr;

std::string Message(const absl::Status& s) { return std::string(s.message()); }

struct Moments {
  double mean = 0, variance = 0;
};
template <typename T>
Moments MomentsOf(const std::vector<T>& xs) {
  Moments m;
  for (T x : xs) m.mean += static_cast<double>(x);
  m.mean /= static_cast<double>(xs.size());
  for (T x : xs) m.variance += (static_cast<double>(x) - m.mean) * (static_cast<double>(x) - m.mean);
  m.variance /= static_cast<double>(xs.size() - 1);
  return m;
}

// Five standard errors of the mean and of the variance of n normal samples of std s.
double MeanBound(double s, size_t n) { return 5 * s / std::sqrt(static_cast<double>(n)); }
double VarianceBound(double s, size_t n) { return 5 * s * s * std::sqrt(2.0 / static_cast<double>(n)); }

TEST(ClipTest, ScalesDownOnlyAboveTheNorm) {
  std::vector<float> update = {3, 4};
  auto clip = ClipToNorm(update, 1.0);
  ASSERT_TRUE(clip.ok());
  EXPECT_TRUE(clip->clipped);
  EXPECT_DOUBLE_EQ(clip->norm, 5);
  EXPECT_DOUBLE_EQ(clip->scale, 0.2);
  EXPECT_FLOAT_EQ(update[0], 0.6f);
  EXPECT_FLOAT_EQ(update[1], 0.8f);
  EXPECT_NEAR(L2Norm(update), 1.0, 1e-6);

  // Exactly at C is "at or below": not clipped (the adaptive rule counts it as unclipped).
  update = {3, 4};
  clip = ClipToNorm(update, 5.0);
  ASSERT_TRUE(clip.ok());
  EXPECT_FALSE(clip->clipped);
  EXPECT_EQ(clip->scale, 1);
  EXPECT_EQ(update, (std::vector<float>{3, 4}));

  std::vector<float> empty;
  EXPECT_EQ(ClipToNorm(empty, 1.0)->norm, 0);
}

TEST(ClipTest, NormOfAMillionSmallValuesKeepsItsDigits) {
  std::vector<float> update(1 << 20, 1.0f / 1024);
  EXPECT_NEAR(L2Norm(update), 1.0, 1e-12);
}

TEST(ClipTest, RefusesNoPrivacyAndNonFiniteUpdates) {
  std::vector<float> update = {1, 2};
  EXPECT_THAT(Message(ClipToNorm(update, 0).status()), HasSubstr("C = 0 gives no privacy"));
  EXPECT_THAT(Message(ClipToNorm(update, -1).status()), HasSubstr("C = -1"));
  EXPECT_THAT(Message(ClipToNorm(update, std::nan("")).status()), HasSubstr("C = nan"));
  update[1] = std::nanf("");
  EXPECT_THAT(Message(ClipToNorm(update, 1).status()), HasSubstr("NaN or Inf"));
}

TEST(NoiseTest, GaussianNoiseHasTheRequestedMeanVarianceAndShape) {
  NoiseRng rng = NoiseRng::FromSeed(20261128);
  const double s = 2.0;
  std::vector<float> values(1 << 20, 0.0f);
  ASSERT_TRUE(AddGaussianNoise(values, s, rng).ok());
  const Moments m = MomentsOf(values);
  EXPECT_LT(std::abs(m.mean), MeanBound(s, values.size()));
  EXPECT_LT(std::abs(m.variance - s * s), VarianceBound(s, values.size()));
  // The shape: the fraction within one std is 0.682689 (±5 binomial standard errors).
  size_t within = 0;
  for (float v : values) within += std::abs(v) <= s;
  const double p = 0.6826894921, n = static_cast<double>(values.size());
  EXPECT_LT(std::abs(static_cast<double>(within) / n - p), 5 * std::sqrt(p * (1 - p) / n));
}

TEST(NoiseTest, SeededNoiseRepeatsAndSystemNoiseDoesNot) {
  auto draw = [](NoiseRng rng) {
    std::vector<float> v(64, 0.0f);
    EXPECT_TRUE(AddGaussianNoise(v, 1.0, rng).ok());
    return v;
  };
  EXPECT_EQ(draw(NoiseRng::FromSeed(1)), draw(NoiseRng::FromSeed(1)));
  EXPECT_NE(draw(NoiseRng::FromSeed(1)), draw(NoiseRng::FromSeed(2)));
  EXPECT_NE(draw(NoiseRng::FromSystem()), draw(NoiseRng::FromSystem()));
  NoiseRng rng = NoiseRng::FromSeed(3);
  std::vector<float> v(4, 0.0f);
  EXPECT_THAT(Message(AddGaussianNoise(v, -1, rng)), HasSubstr("noise std -1"));
}

TEST(CentralDpTest, NoiseStdIsSigmaTimesClipOverUpdates) {
  EXPECT_DOUBLE_EQ(*CentralNoiseStddevForSum(1.2, 0.5), 0.6);
  EXPECT_DOUBLE_EQ(*CentralNoiseStddevForMean(1.2, 0.5, 10), 0.06);
  EXPECT_THAT(Message(CentralNoiseStddevForSum(0, 0.5).status()), HasSubstr("σ = 0 gives no privacy"));
  EXPECT_THAT(Message(CentralNoiseStddevForSum(1, 0).status()), HasSubstr("C = 0 gives no privacy"));
  EXPECT_THAT(Message(CentralNoiseStddevForMean(1, 1, 0).status()), HasSubstr("aggregated is 0"));
  NoiseRng rng = NoiseRng::FromSeed(10);
  std::vector<float> sum(8, 0.0f);
  EXPECT_THAT(Message(AddCentralNoiseToSum(sum, 0, 1, rng)), HasSubstr("σ = 0 gives no privacy"));
  EXPECT_THAT(Message(AddCentralNoiseToMean(sum, 1, -2, 4, rng)), HasSubstr("C = -2"));
  EXPECT_EQ(sum, std::vector<float>(8, 0.0f));  // refused: nothing added
  EXPECT_TRUE(AddCentralNoiseToSum(sum, 1, 1, rng).ok());
  EXPECT_NE(sum, std::vector<float>(8, 0.0f));
}

TEST(CentralDpTest, ClippedMeanPlusNoiseHasTheStatedVariance) {
  // m updates clipped to C and averaged; the noise on the mean has std σ·C/m.
  NoiseRng rng = NoiseRng::FromSeed(5);
  const int m = 10;
  const double sigma = 1.0, c = 0.5;
  const size_t dim = 1 << 18;
  std::vector<float> mean(dim, 0.0f);
  for (int k = 0; k < m; ++k) {
    std::vector<float> update(dim, 1.0f);  // norm 512: clipped to 0.5
    ASSERT_TRUE(ClipToNorm(update, c).ok());
    for (size_t i = 0; i < dim; ++i) mean[i] += update[i] / m;
  }
  const float clean = mean[0];
  const double s = *CentralNoiseStddevForMean(sigma, c, m);
  ASSERT_TRUE(AddCentralNoiseToMean(mean, sigma, c, m, rng).ok());
  for (float& x : mean) x -= clean;
  const Moments got = MomentsOf(mean);
  EXPECT_LT(std::abs(got.mean), MeanBound(s, dim));
  EXPECT_LT(std::abs(got.variance - s * s), VarianceBound(s, dim));
}

TEST(AdaptiveClippingTest, UpdateNoiseMultiplierSplitsTheBudget) {
  // σ_Δ = (σ^−2 − (2σ_b)^−2)^−1/2: σ = 1, σ_b = 5 → (1 − 1/100)^−1/2.
  EXPECT_NEAR(*AdaptiveUpdateNoiseMultiplier(1.0, 5.0), 1 / std::sqrt(0.99), 1e-12);
  EXPECT_THAT(Message(AdaptiveUpdateNoiseMultiplier(1.0, 0.5).status()), HasSubstr("must exceed σ/2 = 0.5"));
  EXPECT_THAT(Message(AdaptiveUpdateNoiseMultiplier(1.0, 0.0).status()), HasSubstr("σ_b = 0"));
  EXPECT_THAT(Message(AdaptiveUpdateNoiseMultiplier(0, 5).status()), HasSubstr("σ = 0 gives no privacy"));
}

TEST(AdaptiveClippingTest, RefusesBadSettings) {
  AdaptiveClippingConfig config;
  config.clipped_count_stddev = 5;
  EXPECT_TRUE(AdaptiveClipping::Create(config).ok());
  AdaptiveClippingConfig bad = config;
  bad.initial_clip_norm = 0;
  EXPECT_THAT(Message(AdaptiveClipping::Create(bad).status()), HasSubstr("C = 0 gives no privacy"));
  bad = config;
  bad.target_quantile = 1.5;
  EXPECT_THAT(Message(AdaptiveClipping::Create(bad).status()), HasSubstr("γ = 1.5"));
  bad = config;
  bad.learning_rate = 0;
  EXPECT_THAT(Message(AdaptiveClipping::Create(bad).status()), HasSubstr("η = 0"));
  bad = config;
  bad.clipped_count_stddev = 0.2;
  EXPECT_THAT(Message(AdaptiveClipping::Create(bad).status()), HasSubstr("σ_b = 0.2"));
  auto clipping = AdaptiveClipping::Create(config);
  NoiseRng rng = NoiseRng::FromSeed(6);
  EXPECT_THAT(Message(clipping->Update(11, 10, rng).status()), HasSubstr("11 of 10"));
  EXPECT_THAT(Message(clipping->Update(0, 0, rng).status()), HasSubstr("aggregated is 0"));
}

// m clients per round whose update norms are uniform on [0, 10]: the γ-quantile of the norms is 10·γ. Each client's
// update is a real vector of that norm, clipped by ClipToNorm at the current C, and the unclipped ones counted.
double RunAdaptiveClipping(double initial_clip, double gamma, int rounds, uint64_t seed, double* mean_of_last) {
  AdaptiveClippingConfig config;
  config.initial_clip_norm = initial_clip;
  config.target_quantile = gamma;
  config.learning_rate = 0.2;
  config.noise_multiplier = 1.0;
  const int m = 100;
  config.clipped_count_stddev = m / 20.0;
  auto clipping = AdaptiveClipping::Create(config);
  EXPECT_TRUE(clipping.ok());
  NoiseRng data = NoiseRng::FromSeed(seed);
  NoiseRng noise = NoiseRng::FromSeed(seed + 1);
  double sum_last = 0;
  const int last = rounds / 4;
  for (int round = 0; round < rounds; ++round) {
    int64_t at_or_below = 0;
    for (int k = 0; k < m; ++k) {
      const double norm = 10 * data.UniformClosedOpen();
      std::vector<float> update = {static_cast<float>(norm * 0.6), static_cast<float>(norm * 0.8)};
      auto clip = ClipToNorm(update, clipping->clip_norm());
      EXPECT_TRUE(clip.ok());
      at_or_below += !clip->clipped;
    }
    auto step = clipping->Update(at_or_below, m, noise);
    EXPECT_TRUE(step.ok());
    if (round >= rounds - last) sum_last += step->clip_norm_next;
  }
  *mean_of_last = sum_last / last;
  return clipping->clip_norm();
}

TEST(AdaptiveClippingTest, ClipNormMovesToTheTargetQuantile) {
  // Band: the fraction at or below C fluctuates by the count noise σ_b/m = 0.05 and the sampling noise
  // √(γ(1−γ)/m) ≈ 0.05 per round, and C's geometric step (η = 0.2) averages over about 1/(η·density) rounds; the
  // final C is asserted within ±1.0 of the true quantile (±0.1 in quantile), the mean of the last quarter within
  // ±0.3 (seed 42 lands within 0.21 and 0.08). Counting the clipped fraction instead (Flower's rule) would settle at
  // the (1 − γ)-quantile and fail for γ = 0.3 and 0.8. From C_0 = 0.1 (below) and C_0 = 100 (above), three targets.
  for (double gamma : {0.3, 0.5, 0.8}) {
    for (double initial : {0.1, 100.0}) {
      double mean_of_last = 0;
      const double final_clip = RunAdaptiveClipping(initial, gamma, 800, 42, &mean_of_last);
      const double quantile = 10 * gamma;
      EXPECT_NEAR(final_clip, quantile, 1.0) << "γ=" << gamma << " C0=" << initial;
      EXPECT_NEAR(mean_of_last, quantile, 0.3) << "γ=" << gamma << " C0=" << initial;
    }
  }
}

TEST(LocalDpTest, StddevIsTheClassicalGaussianMechanism) {
  EXPECT_NEAR(*LocalGaussianStddev(0.5, 1e-5, 2.0), 2.0 * std::sqrt(2 * std::log(1.25e5)) / 0.5, 1e-12);
  EXPECT_THAT(Message(LocalGaussianStddev(1.0, 1e-5, 2.0).status()), HasSubstr("ε = 1 is outside (0, 1)"));
  EXPECT_THAT(Message(LocalGaussianStddev(0, 1e-5, 2.0).status()), HasSubstr("ε = 0"));
  EXPECT_THAT(Message(LocalGaussianStddev(0.5, 0, 2.0).status()), HasSubstr("δ = 0"));
  EXPECT_THAT(Message(LocalGaussianStddev(0.5, 1e-5, 0).status()), HasSubstr("Δ = 0"));
}

TEST(LocalDpTest, ClipsThenAddsNoiseOfSensitivityTwiceTheClip) {
  NoiseRng rng = NoiseRng::FromSeed(8);
  const size_t dim = 1 << 18;
  std::vector<float> update(dim, 1.0f);  // norm 512
  auto clip = ApplyLocalDp(update, 1.0, 0.5, 1e-5, rng);
  ASSERT_TRUE(clip.ok());
  EXPECT_TRUE(clip->clipped);
  const float clipped_value = static_cast<float>(1.0 / 512);
  for (float& x : update) x -= clipped_value;
  const double s = *LocalGaussianStddev(0.5, 1e-5, 2.0);
  const Moments m = MomentsOf(update);
  EXPECT_LT(std::abs(m.mean), MeanBound(s, dim));
  EXPECT_LT(std::abs(m.variance - s * s), VarianceBound(s, dim));
  EXPECT_THAT(Message(ApplyLocalDp(update, 0, 0.5, 1e-5, rng).status()), HasSubstr("C = 0"));
}

TEST(DistributedDpTest, SharesSumToTheCentralNoiseModulo32Bits) {
  // n clients each add a share of std σ_c/√n to a zero update in Z_2^32; the sum (as the server's unmasked sum
  // would be) read back as signed integers has variance σ_c² (the sum of n discrete Gaussians: within the bound).
  const int n = 4;
  const double central = 40;
  const size_t dim = 1 << 16;
  std::vector<uint32_t> sum(dim, 0);
  for (int k = 0; k < n; ++k) {
    NoiseRng rng = NoiseRng::FromSeed(100 + k);
    std::vector<uint32_t> share(dim, 0);
    ASSERT_TRUE(AddDiscreteGaussianShare(share, central, n, rng).ok());
    for (size_t i = 0; i < dim; ++i) sum[i] += share[i];
  }
  std::vector<int64_t> noise(dim);
  bool wrapped = false;
  for (size_t i = 0; i < dim; ++i) {
    noise[i] = static_cast<int32_t>(sum[i]);
    wrapped |= sum[i] > 0x80000000u;  // negative noise wrapped around, as it must
  }
  EXPECT_TRUE(wrapped);
  const Moments m = MomentsOf(noise);
  EXPECT_LT(std::abs(m.mean), MeanBound(central, dim));
  EXPECT_LT(std::abs(m.variance - central * central), VarianceBound(central, dim));
}

TEST(DistributedDpTest, RefusesNoPrivacyAndOutOfRangeShares) {
  NoiseRng rng = NoiseRng::FromSeed(9);
  std::vector<uint32_t> q(4, 0);
  EXPECT_THAT(Message(AddDiscreteGaussianShare(q, 0, 4, rng)), HasSubstr("std 0 gives no privacy"));
  EXPECT_THAT(Message(AddDiscreteGaussianShare(q, 10, 0, rng)), HasSubstr("0 clients"));
  EXPECT_THAT(Message(AddDiscreteGaussianShare(q, 4e6, 1, rng)), HasSubstr("outside (0, 2^20]"));
  std::vector<int64_t> wide(4, 0);
  EXPECT_TRUE(AddDiscreteGaussianShare(wide, 10, 4, rng).ok());
}

TEST(DistributedDpTest, SurvivorsScaleTheAccountedNoise) {
  EXPECT_DOUBLE_EQ(*DistributedNoiseMultiplier(1.0, 100, 81), 0.9);
  EXPECT_DOUBLE_EQ(*DistributedNoiseMultiplier(2.0, 10, 10), 2.0);
  EXPECT_THAT(Message(DistributedNoiseMultiplier(1.0, 10, 11).status()), HasSubstr("11 survivors of 10"));
  EXPECT_THAT(Message(DistributedNoiseMultiplier(1.0, 10, 0).status()), HasSubstr("0 survivors"));
}

}  // namespace
}  // namespace fl::privacy
