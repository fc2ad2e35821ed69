// The round engine's differential privacy (engine_privacy.h).
#include "engine_privacy.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "fl/core/str_cat.h"

namespace fl::server::engine {
namespace {

CentralDp::Mode ModeOf(const std::string& name) {
  if (name == "local") return CentralDp::Mode::kLocal;
  if (name == "distributed") return CentralDp::Mode::kDistributed;
  return CentralDp::Mode::kCentral;  // validated before (EngineConfig::ValidatePrivacy)
}

}  // namespace

absl::Status CentralDp::Configure(const EngineConfig& config, std::optional<privacy::NoiseRng> rng) {
  sigma_ = config.dp_noise_multiplier;
  if (!on()) return absl::OkStatus();
  mode_ = ModeOf(config.dp_mode);
  secagg_ = config.secagg_on();
  secagg_scale_ = config.secagg_scale;
  min_commit_ = std::max<int64_t>(1, config.fit.min_clients);
  clip_norm_ = config.dp_clip_norm;
  delta_ = config.dp_delta;
  target_epsilon_ = config.dp_target_epsilon;
  population_ = config.dp_population;
  if (rng.has_value()) rng_ = std::move(*rng);
  settings_.Clear();
  settings_.set_mode(config.dp_mode);
  settings_.set_noise_multiplier(sigma_);
  settings_.set_clip_norm(clip_norm_);
  settings_.set_clipping(config.dp_clipping);
  settings_.set_delta(delta_);
  settings_.set_population(population_);
  settings_.set_order_grid(std::string(privacy::OrderGridName(privacy::OrderGrid::kTfPrivacy)));
  if (config.dp_clipping == "adaptive") {
    settings_.set_target_quantile(config.dp_target_quantile);
    settings_.set_clip_learning_rate(config.dp_clip_learning_rate);
    settings_.set_clipped_count_stddev(config.dp_clipped_count_stddev);
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

void CentralDp::FillClientPrivacy(int64_t expected_clients, fl::v1::ClientPrivacy* out) const {
  if (!on() || ServerClips()) return;
  out->set_clip_norm(clip_norm());
  if (mode_ == Mode::kLocal) out->set_local_noise_stddev(sigma_ * clip_norm());
  if (mode_ == Mode::kDistributed) {
    out->set_central_noise_steps(sigma_ * clip_norm() * secagg_scale_);
    out->set_expected_clients(static_cast<uint64_t>(std::max<int64_t>(1, expected_clients)));
  }
}

absl::Status CentralDp::NoiseMean(std::span<float> mean, int64_t updates) {
  if (!ServerNoises()) return absl::OkStatus();
  return privacy::AddCentralNoiseToMean(mean, noise_multiplier(), clip_norm(), updates, rng_);
}

double CentralDp::SamplingRate(int64_t selected) const {
  // A round that selects more clients than the population claims (a wrong --dp-population) is accounted as
  // sampling everyone: never less ε than was spent.
  return std::min(1.0, static_cast<double>(selected) / static_cast<double>(population_));
}

absl::StatusOr<std::pair<double, double>> CentralDp::Step(int64_t selected, int64_t survivors) const {
  switch (mode_) {
    case Mode::kCentral: return std::pair{SamplingRate(selected), sigma_};
    case Mode::kLocal:
      // The client knows it took part and the server sees its update: no amplification by sampling (q = 1), and
      // the replacement sensitivity 2C halves the multiplier (engine_privacy.h).
      return std::pair{1.0, sigma_ / 2};
    case Mode::kDistributed: {
      // Only the survivors' shares are in the sum; the selected count is what each share was sized for.
      auto sigma = privacy::DistributedNoiseMultiplier(
          sigma_, std::max<int64_t>(1, selected), std::clamp<int64_t>(survivors, 1, std::max<int64_t>(1, selected)));
      if (!sigma.ok()) return sigma.status();
      return std::pair{SamplingRate(selected), *sigma};
    }
  }
  return absl::InternalError("unknown DP mode");
}

absl::StatusOr<std::optional<double>> CentralDp::EpsilonPastTarget(int64_t selected) const {
  if (!on() || target_epsilon_ <= 0) return std::optional<double>();
  // Distributed DP: a round spends more the fewer survive; the fewest it can commit with bound it.
  auto step = Step(selected, std::min(selected, min_commit_));
  if (!step.ok()) return step.status();
  auto next = accountant_.EpsilonIfAdded(step->first, step->second, delta_);
  if (!next.ok()) return next.status();
  if (next->epsilon <= target_epsilon_) return std::optional<double>();
  return std::optional<double>(next->epsilon);
}

absl::StatusOr<RoundPrivacy> CentralDp::AfterRound(int64_t selected, int64_t updates, int64_t at_or_below) {
  RoundPrivacy p;
  p.clip_norm = clip_norm();
  p.noise_multiplier = noise_multiplier();
  auto step = Step(selected, updates);
  if (!step.ok()) return step.status();
  if (mode_ == Mode::kDistributed) p.noise_multiplier = step->second;
  // The whole round's σ is what composes: with adaptive clipping the update's σ_Δ and the count's σ_b together
  // are one Gaussian mechanism of multiplier σ (Andrew et al. 2021, section 3.2).
  if (absl::Status s = accountant_.AddSteps(step->first, step->second); !s.ok()) return s;
  auto spent = accountant_.Epsilon(delta_);
  if (!spent.ok()) return spent.status();
  p.epsilon = spent->epsilon;
  p.order = spent->order;
  if (adaptive_.has_value() && updates > 0) {
    auto next = adaptive_->Update(at_or_below, updates, rng_);
    if (!next.ok()) return next.status();
  }
  return p;
}

std::optional<fl::v1::PrivacyLedger> CentralDp::Ledger() const {
  if (!on()) return std::nullopt;
  fl::v1::PrivacyLedger ledger = settings_;
  for (double a : accountant_.orders()) ledger.add_orders(a);
  for (double r : accountant_.rdp()) ledger.add_rdp(r);
  ledger.set_rounds(static_cast<uint64_t>(accountant_.steps()));
  ledger.set_current_clip_norm(clip_norm());
  return ledger;
}

absl::Status CentralDp::Restore(const std::optional<fl::v1::PrivacyLedger>& ledger, uint64_t round) {
  if (!on()) {
    if (!ledger.has_value()) return absl::OkStatus();
    return absl::FailedPreconditionError(
        fl::StrCat("--resume without --dp-noise-multiplier: the checkpoint of round ", round,
                   " belongs to a differentially private run (--dp-mode=", ledger->mode(),
                   " --dp-noise-multiplier=", ledger->noise_multiplier(),
                   "); resume it with the same DP settings, or start a new experiment to train without DP"));
  }
  if (!ledger.has_value()) {
    if (round == 0) return absl::OkStatus();  // nothing released yet
    return absl::FailedPreconditionError(fl::StrCat(
        "--resume with --dp-noise-multiplier: the checkpoint of round ", round,
        " holds no privacy ledger (its rounds ran without DP, or on a server that did not keep one), so the epsilon "
        "they spent is unknown; start a new experiment"));
  }
  // Every setting the ledger's ε depends on must be the same: name the first that differs.
  struct Field {
    const char* flag;
    std::string had;
    std::string now;
  };
  // The shortest text that reads back as the same double: equal texts are equal values (absl's 6 digits are not).
  auto num = [](double v) {
    char text[32];
    const auto end = std::to_chars(text, text + sizeof(text), v).ptr;
    return std::string(text, end);
  };
  const std::vector<Field> fields = {
      {"--dp-mode", ledger->mode(), settings_.mode()},
      {"--dp-noise-multiplier", num(ledger->noise_multiplier()), num(settings_.noise_multiplier())},
      {"--dp-clip-norm", num(ledger->clip_norm()), num(settings_.clip_norm())},
      {"--dp-clipping", ledger->clipping(), settings_.clipping()},
      {"--dp-delta", num(ledger->delta()), num(settings_.delta())},
      {"--dp-population", num(static_cast<double>(ledger->population())),
       num(static_cast<double>(settings_.population()))},
      {"the accountant's order grid", ledger->order_grid(), settings_.order_grid()},
      {"--dp-target-quantile", num(ledger->target_quantile()), num(settings_.target_quantile())},
      {"--dp-clip-learning-rate", num(ledger->clip_learning_rate()), num(settings_.clip_learning_rate())},
      {"--dp-clipped-count-stddev", num(ledger->clipped_count_stddev()), num(settings_.clipped_count_stddev())},
  };
  for (const Field& f : fields) {
    if (f.had != f.now) {
      return absl::FailedPreconditionError(
          fl::StrCat("--resume with other differential privacy settings: the checkpoint of round ", round,
                     " was accounted with ", f.flag, "=", f.had, ", this run has ", f.now, "; resume with ", f.flag,
                     "=", f.had, " (epsilon composes only over the same mechanism), or start a new experiment"));
    }
  }
  if (ledger->rounds() > round) {
    return absl::FailedPreconditionError(fl::StrCat("the checkpoint of round ", round, " holds a privacy ledger of ",
                                                    ledger->rounds(),
                                                    " rounds, more than were committed; it is damaged"));
  }
  auto restored = privacy::RdpAccountant::Restore({ledger->orders().begin(), ledger->orders().end()},
                                                  {ledger->rdp().begin(), ledger->rdp().end()},
                                                  static_cast<int64_t>(ledger->rounds()));
  if (!restored.ok()) {
    return absl::InvalidArgumentError(
        fl::StrCat("the privacy ledger in the checkpoint of round ", round, ": ", restored.status().message()));
  }
  if (adaptive_.has_value()) {
    if (!(ledger->current_clip_norm() > 0) || !std::isfinite(ledger->current_clip_norm())) {
      return absl::InvalidArgumentError(fl::StrCat("the privacy ledger in the checkpoint of round ", round,
                                                   " holds clip norm ", ledger->current_clip_norm(),
                                                   "; it is damaged"));
    }
    privacy::AdaptiveClippingConfig a;
    a.initial_clip_norm = ledger->current_clip_norm();
    a.target_quantile = settings_.target_quantile();
    a.learning_rate = settings_.clip_learning_rate();
    a.noise_multiplier = sigma_;
    a.clipped_count_stddev = settings_.clipped_count_stddev();
    auto made = privacy::AdaptiveClipping::Create(a);
    if (!made.ok()) return made.status();
    adaptive_ = std::move(*made);
  }
  accountant_ = *std::move(restored);
  return absl::OkStatus();
}

}  // namespace fl::server::engine
