#include "fl/privacy/mechanisms.h"

#include <cmath>
#include <type_traits>

#include "fl/core/str_cat.h"
#include "fl/privacy/accountant.h"
#include "fl/privacy/discrete_gaussian.h"

namespace fl::privacy {
namespace {

absl::Status CheckUpdates(int64_t updates) {
  if (updates < 1) {
    return absl::InvalidArgumentError(
        StrCat("the number of updates aggregated is ", updates, "; noise is added to at least one update"));
  }
  return absl::OkStatus();
}

template <typename Int>
absl::Status AddShare(std::span<Int> quantised, double central_stddev, int64_t clients, NoiseRng& rng) {
  if (!(central_stddev > 0) || !std::isfinite(central_stddev)) {
    return absl::InvalidArgumentError(StrCat("distributed DP: central noise std ", central_stddev,
                                             " gives no privacy; give σ·C times the quantisation scale, > 0"));
  }
  if (clients < 1) {
    return absl::InvalidArgumentError(
        StrCat("distributed DP: ", clients, " clients; the noise is shared by at least one client"));
  }
  const double share = central_stddev / std::sqrt(static_cast<double>(clients));
  auto sampler = DiscreteGaussian::Create(share);
  if (!sampler.ok()) {
    return absl::InvalidArgumentError(StrCat("distributed DP: a client's share std ", share, " (", central_stddev, "/√",
                                             clients, ") is outside (0, 2^20]; use a coarser quantisation"));
  }
  for (Int& x : quantised) {
    const int64_t noise = sampler->Sample(rng);
    if constexpr (std::is_same_v<Int, uint32_t>) {
      x += static_cast<uint32_t>(noise);  // modulo 2^32: two's complement wraps the negative noise
    } else {
      x += noise;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckClipNorm(double clip_norm) {
  if (!(clip_norm > 0) || !std::isfinite(clip_norm)) {
    return absl::InvalidArgumentError(
        StrCat("clipping norm C = ", clip_norm, " gives no privacy (nothing bounds an update); give C > 0, e.g. 1.0"));
  }
  return absl::OkStatus();
}

double L2Norm(std::span<const float> update) {
  // Four accumulators: independent chains the compiler keeps in registers (and vectorises), in double so that a
  // million squares do not lose the small ones.
  double acc[4] = {0, 0, 0, 0};
  size_t i = 0;
  for (; i + 4 <= update.size(); i += 4) {
    for (size_t k = 0; k < 4; ++k) acc[k] += static_cast<double>(update[i + k]) * update[i + k];
  }
  for (; i < update.size(); ++i) acc[0] += static_cast<double>(update[i]) * update[i];
  return std::sqrt((acc[0] + acc[1]) + (acc[2] + acc[3]));
}

absl::StatusOr<ClipResult> ClipToNorm(std::span<float> update, double clip_norm) {
  if (auto s = CheckClipNorm(clip_norm); !s.ok()) return s;
  ClipResult result;
  result.norm = L2Norm(update);
  if (!std::isfinite(result.norm)) {
    return absl::InvalidArgumentError(StrCat("the update's L2 norm is ", result.norm,
                                             " (NaN or Inf in its values); clipping cannot bound it: refuse it"));
  }
  if (result.norm > clip_norm) {
    result.clipped = true;
    result.scale = clip_norm / result.norm;
    const float scale = static_cast<float>(result.scale);
    for (float& x : update) x *= scale;
  }
  return result;
}

absl::Status AddGaussianNoise(std::span<float> values, double stddev, NoiseRng& rng) {
  if (!(stddev >= 0) || !std::isfinite(stddev)) {
    return absl::InvalidArgumentError(StrCat("noise std ", stddev, " is not a finite number ≥ 0"));
  }
  for (float& x : values) x = static_cast<float>(x + stddev * rng.Gaussian());
  return absl::OkStatus();
}

absl::StatusOr<double> CentralNoiseStddevForSum(double noise_multiplier, double clip_norm) {
  if (auto s = CheckNoiseMultiplier(noise_multiplier); !s.ok()) return s;
  if (auto s = CheckClipNorm(clip_norm); !s.ok()) return s;
  return noise_multiplier * clip_norm;
}

absl::StatusOr<double> CentralNoiseStddevForMean(double noise_multiplier, double clip_norm, int64_t updates) {
  if (auto s = CheckUpdates(updates); !s.ok()) return s;
  auto sum = CentralNoiseStddevForSum(noise_multiplier, clip_norm);
  if (!sum.ok()) return sum.status();
  return *sum / static_cast<double>(updates);
}

absl::Status AddCentralNoiseToSum(std::span<float> sum, double noise_multiplier, double clip_norm, NoiseRng& rng) {
  auto stddev = CentralNoiseStddevForSum(noise_multiplier, clip_norm);
  if (!stddev.ok()) return stddev.status();
  return AddGaussianNoise(sum, *stddev, rng);
}

absl::Status AddCentralNoiseToMean(std::span<float> mean, double noise_multiplier, double clip_norm, int64_t updates,
                                   NoiseRng& rng) {
  auto stddev = CentralNoiseStddevForMean(noise_multiplier, clip_norm, updates);
  if (!stddev.ok()) return stddev.status();
  return AddGaussianNoise(mean, *stddev, rng);
}

absl::StatusOr<double> AdaptiveUpdateNoiseMultiplier(double noise_multiplier, double clipped_count_stddev) {
  if (auto s = CheckNoiseMultiplier(noise_multiplier); !s.ok()) return s;
  if (!(clipped_count_stddev > noise_multiplier / 2) || !std::isfinite(clipped_count_stddev)) {
    return absl::InvalidArgumentError(
        StrCat("adaptive clipping: clipped-count std σ_b = ", clipped_count_stddev, " must exceed σ/2 = ",
               noise_multiplier / 2, ", or the count's noise (multiplier 2σ_b) takes all of σ = ", noise_multiplier,
               " and none is left for the update; raise σ_b (Andrew et al. suggest clients per round / 20) or σ"));
  }
  const double count_multiplier = 2 * clipped_count_stddev;
  return 1 / std::sqrt(1 / (noise_multiplier * noise_multiplier) - 1 / (count_multiplier * count_multiplier));
}

absl::StatusOr<AdaptiveClipping> AdaptiveClipping::Create(const AdaptiveClippingConfig& config) {
  if (auto s = CheckClipNorm(config.initial_clip_norm); !s.ok()) return s;
  if (!(config.target_quantile >= 0 && config.target_quantile <= 1)) {
    return absl::InvalidArgumentError(StrCat("adaptive clipping: target quantile γ = ", config.target_quantile,
                                             " is outside [0, 1]; give the fraction of updates to leave unclipped, "
                                             "e.g. 0.5"));
  }
  if (!(config.learning_rate > 0) || !std::isfinite(config.learning_rate)) {
    return absl::InvalidArgumentError(
        StrCat("adaptive clipping: learning rate η = ", config.learning_rate, " is not positive; give e.g. 0.2"));
  }
  auto sigma_update = AdaptiveUpdateNoiseMultiplier(config.noise_multiplier, config.clipped_count_stddev);
  if (!sigma_update.ok()) return sigma_update.status();
  return AdaptiveClipping(config, *sigma_update);
}

absl::StatusOr<AdaptiveClipStep> AdaptiveClipping::Update(int64_t at_or_below, int64_t updates, NoiseRng& rng) {
  if (auto s = CheckUpdates(updates); !s.ok()) return s;
  if (at_or_below < 0 || at_or_below > updates) {
    return absl::InvalidArgumentError(
        StrCat("adaptive clipping: ", at_or_below, " of ", updates, " updates at or below C is not a count"));
  }
  AdaptiveClipStep step;
  step.clip_norm_used = clip_norm_;
  step.noisy_fraction =
      (static_cast<double>(at_or_below) + config_.clipped_count_stddev * rng.Gaussian()) / static_cast<double>(updates);
  clip_norm_ *= std::exp(-config_.learning_rate * (step.noisy_fraction - config_.target_quantile));
  step.clip_norm_next = clip_norm_;
  return step;
}

absl::StatusOr<double> LocalGaussianStddev(double epsilon, double delta, double sensitivity) {
  if (!(epsilon > 0 && epsilon < 1)) {
    return absl::InvalidArgumentError(StrCat("local DP: ε = ", epsilon,
                                             " is outside (0, 1), where the classical Gaussian mechanism's bound "
                                             "σ = Δ·√(2 ln(1.25/δ))/ε holds; give ε < 1 or use central DP"));
  }
  if (auto s = CheckDelta(delta); !s.ok()) return s;
  if (!(sensitivity > 0) || !std::isfinite(sensitivity)) {
    return absl::InvalidArgumentError(StrCat("local DP: sensitivity Δ = ", sensitivity, " is not positive"));
  }
  return sensitivity * std::sqrt(2 * std::log(1.25 / delta)) / epsilon;
}

absl::StatusOr<ClipResult> ApplyLocalDp(std::span<float> update, double clip_norm, double epsilon, double delta,
                                        NoiseRng& rng) {
  if (auto s = CheckClipNorm(clip_norm); !s.ok()) return s;
  auto stddev = LocalGaussianStddev(epsilon, delta, 2 * clip_norm);
  if (!stddev.ok()) return stddev.status();
  auto clip = ClipToNorm(update, clip_norm);
  if (!clip.ok()) return clip.status();
  if (auto s = AddGaussianNoise(update, *stddev, rng); !s.ok()) return s;
  return clip;
}

absl::Status AddDiscreteGaussianShare(std::span<uint32_t> quantised, double central_stddev, int64_t clients,
                                      NoiseRng& rng) {
  return AddShare(quantised, central_stddev, clients, rng);
}

absl::Status AddDiscreteGaussianShare(std::span<int64_t> quantised, double central_stddev, int64_t clients,
                                      NoiseRng& rng) {
  return AddShare(quantised, central_stddev, clients, rng);
}

absl::StatusOr<double> DistributedNoiseMultiplier(double noise_multiplier, int64_t expected, int64_t survivors) {
  if (auto s = CheckNoiseMultiplier(noise_multiplier); !s.ok()) return s;
  if (expected < 1 || survivors < 1 || survivors > expected) {
    return absl::InvalidArgumentError(StrCat("distributed DP: ", survivors, " survivors of ", expected,
                                             " clients; survivors must be in [1, clients]"));
  }
  return noise_multiplier * std::sqrt(static_cast<double>(survivors) / static_cast<double>(expected));
}

}  // namespace fl::privacy
