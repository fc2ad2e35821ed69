// The round engine's central differential privacy (engine_privacy.h).
#include "engine_privacy.h"

#include <algorithm>
#include <utility>

#include "fl/core/str_cat.h"

namespace fl::server::engine {

absl::Status CentralDp::Configure(const EngineConfig& config, std::optional<privacy::NoiseRng> rng) {
  sigma_ = config.dp_noise_multiplier;
  if (!on()) return absl::OkStatus();
  clip_norm_ = config.dp_clip_norm;
  clients_clip_ = config.secagg_on();
  delta_ = config.dp_delta;
  target_epsilon_ = config.dp_target_epsilon;
  population_ = config.dp_population;
  if (rng.has_value()) rng_ = std::move(*rng);
  if (config.dp_clipping == "adaptive") {
    privacy::AdaptiveClippingConfig a;
    a.initial_clip_norm = config.dp_clip_norm;
    a.target_quantile = config.dp_target_quantile;
    a.learning_rate = config.dp_clip_learning_rate;
    a.noise_multiplier = config.dp_noise_multiplier;
    a.clipped_count_stddev = config.dp_clipped_count_stddev;
    auto made = privacy::AdaptiveClipping::Create(a);
    if (!made.ok()) {
      return absl::InvalidArgumentError(fl::StrCat("--dp-clipping=adaptive: ", made.status().message()));
    }
    adaptive_ = std::move(*made);
  }
  return absl::OkStatus();
}

double CentralDp::clip_norm() const { return adaptive_.has_value() ? adaptive_->clip_norm() : clip_norm_; }

double CentralDp::noise_multiplier() const {
  return adaptive_.has_value() ? adaptive_->update_noise_multiplier() : sigma_;
}

absl::Status CentralDp::NoiseMean(std::span<float> mean, int64_t updates) {
  if (!on()) return absl::OkStatus();
  return privacy::AddCentralNoiseToMean(mean, noise_multiplier(), clip_norm(), updates, rng_);
}

double CentralDp::SamplingRate(int64_t selected) const {
  // A round that selects more clients than the population claims (a wrong --dp-population) is accounted as
  // sampling everyone: never less ε than was spent.
  return std::min(1.0, static_cast<double>(selected) / static_cast<double>(population_));
}

absl::StatusOr<std::optional<double>> CentralDp::EpsilonPastTarget(int64_t selected) const {
  if (!on() || target_epsilon_ <= 0) return std::optional<double>();
  auto next = accountant_.EpsilonIfAdded(SamplingRate(selected), sigma_, delta_);
  if (!next.ok()) return next.status();
  if (next->epsilon <= target_epsilon_) return std::optional<double>();
  return std::optional<double>(next->epsilon);
}

absl::StatusOr<RoundPrivacy> CentralDp::AfterRound(int64_t selected, int64_t updates, int64_t at_or_below) {
  RoundPrivacy p;
  p.clip_norm = clip_norm();
  p.noise_multiplier = noise_multiplier();
  // The whole round's σ is what composes: with adaptive clipping the update's σ_Δ and the count's σ_b together
  // are one Gaussian mechanism of multiplier σ (Andrew et al. 2021, section 3.2).
  if (absl::Status s = accountant_.AddSteps(SamplingRate(selected), sigma_); !s.ok()) return s;
  auto spent = accountant_.Epsilon(delta_);
  if (!spent.ok()) return spent.status();
  p.epsilon = spent->epsilon;
  p.order = spent->order;
  if (adaptive_.has_value() && updates > 0) {
    auto step = adaptive_->Update(at_or_below, updates, rng_);
    if (!step.ok()) return step.status();
  }
  return p;
}

}  // namespace fl::server::engine
