// Canonne, Kamath, Steinke 2020, with σ² = p/d (d = 1024) and t = floor(σ) + 1:
//   Y ~ discrete Laplace of scale t (Algorithm 2),
//   accept with probability exp(−γ), γ = (|Y| − σ²/t)² / (2σ²) = (|Y|·t·d − p)² / (2·p·d·t²)   (Algorithm 3).
// All Bernoulli trials draw a uniform integer below a denominator and compare it with a numerator.
#include "fl/privacy/discrete_gaussian.h"

#include <cmath>

#include "fl/core/str_cat.h"

namespace fl::privacy {
namespace {

using u128 = unsigned __int128;

// Bernoulli(num/den), 0 ≤ num ≤ den, den < 2^127: a uniform U in [0, 1) drawn bit by bit and compared with the
// binary expansion of p = num/den, stopping at the first bit where they differ (U < p exactly when U's bit is the
// smaller). Exact, and two random bits on average instead of a uniform integer below den (64 or 128 bits).
bool Bernoulli(u128 num, u128 den, NoiseRng& rng) {
  if (num >= den) return true;
  u128 remainder = num;  // p's expansion so far: the next bit is whether 2·remainder ≥ den
  for (;;) {
    remainder <<= 1;  // < 2·den < 2^128
    const bool p_bit = remainder >= den;
    if (p_bit) remainder -= den;
    const bool u_bit = rng.NextBit();
    if (u_bit != p_bit) return p_bit;  // U's bit 0 where p's is 1: U < p
    if (remainder == 0) return false;  // p's expansion ended and U matched it so far: U ≥ p
  }
}

// Bernoulli(exp(−num/den)) for num/den in [0, 1] (Algorithm 1, first part): K = the first k with ¬Bernoulli(x/k);
// return K odd.
bool BernoulliExpAtMostOne(u128 num, u128 den, NoiseRng& rng) {
  u128 k = 1;
  for (;;) {
    // den < 2^102 (Sample), so den·k < 2^126 for k ≤ 2^24; reaching k = 2^24 takes 2^24 successes in a row of
    // probabilities ≤ 1/k (chance below 1/(2^24)!), where k stops growing.
    constexpr u128 kMaxK = static_cast<u128>(1) << 24;
    const u128 den_k = den * (k < kMaxK ? k : kMaxK);
    if (!Bernoulli(num, den_k, rng)) break;
    ++k;
  }
  return (k % 2) == 1;
}

// Bernoulli(exp(−num/den)) for any num/den ≥ 0 (Algorithm 1): one Bernoulli(exp(−1)) per whole unit, then the rest.
bool BernoulliExp(u128 num, u128 den, NoiseRng& rng) {
  while (num > den) {
    if (!BernoulliExpAtMostOne(1, 1, rng)) return false;
    num -= den;
  }
  return BernoulliExpAtMostOne(num, den, rng);
}

// Geometric with parameter 1 − exp(−1/t), in the fast form of Algorithm 2: U uniform below t accepted with
// Bernoulli(exp(−U/t)), V the number of Bernoulli(exp(−1)) successes before a failure; return U + t·V.
uint64_t GeometricExpOverT(uint64_t t, NoiseRng& rng) {
  uint64_t u;
  do {
    u = static_cast<uint64_t>(rng.UniformBelow(t));
  } while (!BernoulliExp(u, t, rng));
  uint64_t v = 0;
  while (BernoulliExpAtMostOne(1, 1, rng)) ++v;
  return u + t * v;
}

// Discrete Laplace of scale t: P(y) ∝ exp(−|y|/t).
int64_t DiscreteLaplace(uint64_t t, NoiseRng& rng) {
  constexpr uint64_t kMaxMagnitude = uint64_t{1} << 32;
  for (;;) {
    const bool negative = rng.NextBit();
    const uint64_t magnitude = GeometricExpOverT(t, rng);
    if (negative && magnitude == 0) continue;  // −0 and +0 are one outcome
    if (magnitude > kMaxMagnitude) continue;   // the stated deviation (header)
    return negative ? -static_cast<int64_t>(magnitude) : static_cast<int64_t>(magnitude);
  }
}

}  // namespace

absl::StatusOr<DiscreteGaussian> DiscreteGaussian::Create(double sigma) {
  if (!(sigma > 0) || !(sigma <= kMaxSigma)) {
    return absl::InvalidArgumentError(StrCat("discrete Gaussian σ = ", sigma, " is outside (0, 2^20]; ",
                                             "give a positive σ in integer units of the quantised update"));
  }
  const double scaled = std::round(sigma * sigma * kVarianceDenominator);
  const uint64_t variance_num = scaled < 1 ? 1 : static_cast<uint64_t>(scaled);
  const uint64_t t = static_cast<uint64_t>(std::floor(sigma)) + 1;
  return DiscreteGaussian(variance_num, t);
}

int64_t DiscreteGaussian::Sample(NoiseRng& rng) const {
  const u128 p = variance_num_;
  const u128 d = kVarianceDenominator;
  const u128 t = t_;
  const u128 den = 2 * p * d * t * t;  // ≤ 2·2^50·2^10·(2^20+1)² < 2^102
  for (;;) {
    const int64_t y = DiscreteLaplace(t_, rng);
    const u128 magnitude = static_cast<u128>(y < 0 ? -y : y);
    const u128 scaled = magnitude * t * d;  // ≤ 2^32·(2^20+1)·2^10 < 2^63
    const u128 diff = scaled > p ? scaled - p : p - scaled;
    if (BernoulliExp(diff * diff, den, rng)) return y;
  }
}

}  // namespace fl::privacy
