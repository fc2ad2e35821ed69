// The exact sampler of the discrete Gaussian N_Z(0, σ²) of Canonne, Kamath and Steinke 2020 ("The Discrete Gaussian
// for Differential Privacy", Algorithms 1–3): discrete Laplace proposals accepted with Bernoulli(exp(−γ)), every
// probability a rational evaluated with integer arithmetic only, so no floating-point rounding shapes the output
// distribution (the weakness of floating-point noise, Mironov 2012). Each Bernoulli(num/den) compares random bits
// with the binary expansion of num/den until they differ (two bits on average, exact).
//
// Exact for a rational variance: σ² is taken as an integer number of 1/1024ths (`variance_num / 1024`, the variance
// actually sampled, reported by variance()); the rationals then fit unsigned 128-bit integers for σ ≤ 2^20. One
// deviation from exactness, stated: a proposal |Y| > 2^32 (a discrete Laplace of scale ≤ 2^20 exceeding 4096 of its
// scales, probability below e^−4096) is redrawn.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "fl/privacy/noise_rng.h"

namespace fl::privacy {

class DiscreteGaussian {
 public:
  static constexpr int64_t kVarianceDenominator = 1024;
  static constexpr double kMaxSigma = 1048576.0;  // 2^20

  // σ in (0, 2^20]; σ² is rounded to the nearest 1/1024 (at least 1/1024). An InvalidArgument otherwise.
  static absl::StatusOr<DiscreteGaussian> Create(double sigma);

  int64_t Sample(NoiseRng& rng) const;
  // The variance the sampler draws from exactly (σ² after rounding).
  double variance() const { return static_cast<double>(variance_num_) / kVarianceDenominator; }

 private:
  DiscreteGaussian(uint64_t variance_num, uint64_t t) : variance_num_(variance_num), t_(t) {}

  uint64_t variance_num_;  // σ² · 1024
  uint64_t t_;             // the discrete Laplace scale, floor(σ) + 1
};

}  // namespace fl::privacy
