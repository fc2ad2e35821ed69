// The DP mechanisms of a federated round, on updates as flat float spans (the engine's FlatParams) and, for
// distributed DP, on quantised updates in Z_2^32. Engine-independent: the caller decides who clips (the client, so
// that central noise can be added after secure aggregation, or the server) and when noise is added.
//
//   fixed clipping + central noise   each update clipped to L2 norm C; the server adds N(0, (σ·C)²) per coordinate
//                                    to the sum of m updates, i.e. N(0, (σ·C/m)²) to their mean
//   adaptive clipping                Andrew et al. 2021 ("Differentially Private Learning with Adaptive Clipping"),
//                                    as TF Privacy's QuantileAdaptiveClipSumQuery: b̃ = (#{‖Δ_i‖ ≤ C} + N(0, σ_b²))/m,
//                                    C ← C·exp(−η(b̃ − γ)); the noise multiplier σ of the round is split between
//                                    the count (multiplier 2σ_b: the centred indicator has sensitivity 1/2) and the
//                                    update, σ_Δ = (σ^−2 − (2σ_b)^−2)^−1/2
//   local DP                         each client clips to C and adds N(0, s²) itself, s = Δ·√(2 ln(1.25/δ))/ε with
//                                    Δ = 2C (a client's whole update replaced); the classical Gaussian mechanism
//                                    (Dwork and Roth, Theorem A.1), proven for ε < 1 only, so ε ≥ 1 is refused
//   distributed DP (client share)    before masking, each of n clients adds integer discrete Gaussian noise of std
//                                    σ_central/√n to its quantised update (Kairouz et al. 2021): the sum of the
//                                    shares has the central variance (a sum of discrete Gaussians, close to but not
//                                    exactly one: their Theorem 1 bounds the difference); account with the number
//                                    of survivors (DistributedNoiseMultiplier)
//
// Floating-point noise is Gaussian from the NoiseRng's ChaCha20 stream (Marsaglia's polar method in double, added
// to float); only the discrete sampler is exact. Every refusal is an InvalidArgument naming the value.
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fl/privacy/noise_rng.h"

namespace fl::privacy {

// C > 0 and finite; C ≤ 0 gives no privacy (nothing bounds an update's influence).
absl::Status CheckClipNorm(double clip_norm);

// The L2 norm, accumulated in double.
double L2Norm(std::span<const float> update);

struct ClipResult {
  double norm = 0;       // before clipping
  double scale = 1;      // the factor applied: min(1, C/norm)
  bool clipped = false;  // norm > C (an update exactly at C is not clipped and counts as "at or below")
};
// Scales `update` in place to L2 norm at most C (to float rounding: the scaled values are rounded to float, so the
// norm may exceed C by a relative 1e-7 or so, as in TF Privacy's float32 clipping; its effect on ε is far below the
// accountant's digits). A non-finite norm (NaN/Inf in the update) is an InvalidArgument: clipping cannot bound it.
absl::StatusOr<ClipResult> ClipToNorm(std::span<float> update, double clip_norm);

// Adds independent N(0, stddev²) to every value. stddev ≥ 0 and finite.
absl::Status AddGaussianNoise(std::span<float> values, double stddev, NoiseRng& rng);

// The per-coordinate noise std of central DP with fixed clipping: σ·C on the sum of m clipped updates, σ·C/m on
// their mean (m ≥ 1: the denominator of the mean). With Poisson sampling the realised count of updates is itself
// private, so DP-FedAvg (McMahan et al. 2018) and TF Privacy divide by the expected count q·population, which is
// public; with a fixed number of clients per round it is that number.
absl::StatusOr<double> CentralNoiseStddevForSum(double noise_multiplier, double clip_norm);
absl::StatusOr<double> CentralNoiseStddevForMean(double noise_multiplier, double clip_norm, int64_t updates);
// The same noise added in place: to the sum of clipped updates, or to their mean over `updates`.
absl::Status AddCentralNoiseToSum(std::span<float> sum, double noise_multiplier, double clip_norm, NoiseRng& rng);
absl::Status AddCentralNoiseToMean(std::span<float> mean, double noise_multiplier, double clip_norm, int64_t updates,
                                   NoiseRng& rng);

struct AdaptiveClippingConfig {
  double initial_clip_norm = 0.1;   // C_0 (Flower's default)
  double target_quantile = 0.5;     // γ in [0, 1]
  double learning_rate = 0.2;       // η > 0 (geometric update)
  double noise_multiplier = 1.0;    // σ of the whole round (what the accountant composes)
  double clipped_count_stddev = 0;  // σ_b, in counts (Andrew et al. suggest m/20); must exceed σ/2
};

struct AdaptiveClipStep {
  double clip_norm_used = 0;  // C of the round just finished
  double noisy_fraction = 0;  // b̃
  double clip_norm_next = 0;  // C for the next round
};

// Adaptive clipping's state across rounds (one owner: the engine's loop thread).
class AdaptiveClipping {
 public:
  // Refuses C_0 ≤ 0, γ outside [0, 1], η ≤ 0, σ ≤ 0, and σ_b ≤ σ/2 (no noise would be left for the update).
  static absl::StatusOr<AdaptiveClipping> Create(const AdaptiveClippingConfig& config);

  double clip_norm() const { return clip_norm_; }
  // σ_Δ: the multiplier of the update's noise, std σ_Δ·C on the sum (σ_Δ·C/m on the mean).
  double update_noise_multiplier() const { return update_noise_multiplier_; }

  // After a round of m ≥ 1 updates of which `at_or_below` had norm ≤ clip_norm() (ClipResult::clipped false):
  // the noisy fraction and the geometric step of C. m is the public denominator, as for the mean above (TF
  // Privacy's QuantileAdaptiveClipSumQuery divides by the expected number of records).
  absl::StatusOr<AdaptiveClipStep> Update(int64_t at_or_below, int64_t updates, NoiseRng& rng);

 private:
  AdaptiveClipping(const AdaptiveClippingConfig& config, double update_noise_multiplier)
      : config_(config), clip_norm_(config.initial_clip_norm), update_noise_multiplier_(update_noise_multiplier) {}

  AdaptiveClippingConfig config_;
  double clip_norm_;
  double update_noise_multiplier_;
};

// σ_Δ = (σ^−2 − (2σ_b)^−2)^−1/2, or an InvalidArgument when σ_b ≤ σ/2.
absl::StatusOr<double> AdaptiveUpdateNoiseMultiplier(double noise_multiplier, double clipped_count_stddev);

// Local DP's noise std s = Δ·√(2 ln(1.25/δ))/ε; ε in (0, 1), δ in (0, 1), Δ > 0.
absl::StatusOr<double> LocalGaussianStddev(double epsilon, double delta, double sensitivity);
// Clips `update` to C and adds local noise with Δ = 2C. Returns the clip result.
absl::StatusOr<ClipResult> ApplyLocalDp(std::span<float> update, double clip_norm, double epsilon, double delta,
                                        NoiseRng& rng);

// Distributed DP, one client's share: adds integer discrete Gaussian noise of std central_stddev/√clients (in the
// quantised update's integer units: the secure aggregation's scale times σ·C) to every coordinate, modulo 2^32
// (two's complement, so the shares sum to the central noise modulo 2^32). Refuses central_stddev ≤ 0, clients < 1,
// and a share std above 2^20.
absl::Status AddDiscreteGaussianShare(std::span<uint32_t> quantised, double central_stddev, int64_t clients,
                                      NoiseRng& rng);
// The same on int64 coordinates (no wrap-around).
absl::Status AddDiscreteGaussianShare(std::span<int64_t> quantised, double central_stddev, int64_t clients,
                                      NoiseRng& rng);

// The noise multiplier to account for when `expected` clients each added a share of σ·C/√expected and only
// `survivors` of them reached the sum: the variance is survivors/expected of the central one, σ·√(survivors/
// expected). survivors in [1, expected].
absl::StatusOr<double> DistributedNoiseMultiplier(double noise_multiplier, int64_t expected, int64_t survivors);

}  // namespace fl::privacy
