// The round engine's central differential privacy (loop-owned, server/src only; docs/privacy.md): the clip norm
// each round's updates are clipped to, the Gaussian noise on their mean, adaptive clipping's next C, and the RDP
// accountant that says what the run has spent. Off (every call a no-op) without --dp-noise-multiplier. It knows
// nothing of clients or records: the core clips through the aggregator, asks for the noise at the commit and
// records what AfterRound returns.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fl/privacy/accountant.h"
#include "fl/privacy/mechanisms.h"
#include "fl/privacy/noise_rng.h"
#include "fl/server/engine_config.h"
#include "fl/v1/federation.pb.h"

namespace fl::server::engine {

// What one committed round spent, for its record.
struct RoundPrivacy {
  double epsilon = 0;           // ε spent by the run up to and including this round, at --dp-delta
  double order = 0;             // the Rényi order that gave it
  double clip_norm = 0;         // C the round's updates were clipped to
  double noise_multiplier = 0;  // of the noise on its mean (adaptive clipping: σ_Δ)
};

class CentralDp {
 public:
  // Off until Configure.
  CentralDp() : rng_(privacy::NoiseRng::FromSystem()) {}

  // From a validated config (EngineConfig::ValidatePrivacy); an error names the setting. `rng` replaces the
  // system-seeded noise generator (tests only: noise must be unpredictable in a real run).
  absl::Status Configure(const EngineConfig& config, std::optional<privacy::NoiseRng> rng = std::nullopt);
  bool on() const { return sigma_ > 0; }

  // C for the next round's updates (adaptive clipping: the current estimate).
  double clip_norm() const;
  // The multiplier of the noise on the mean: σ, or with adaptive clipping the σ_Δ left after the count's share.
  double noise_multiplier() const;

  // What a train task's `privacy` carries: with secure aggregation the server cannot clip an update it cannot see,
  // so the clients clip to C themselves. (The dp helper extends this with local and distributed DP.)
  void FillClientPrivacy(int64_t /*expected_clients*/, fl::v1::ClientPrivacy* out) const {
    if (on() && clients_clip_) out->set_clip_norm(clip_norm());
  }
  // Whether the server adds the noise (on the mean at the commit).
  bool ServerNoises() const { return on(); }

  // Noise N(0, (σ·C/m)²) on every value of the mean of `updates` clipped updates, in place.
  absl::Status NoiseMean(std::span<float> mean, int64_t updates);

  // Whether a round of `selected` sampled clients keeps ε within --dp-target-epsilon (true without a target); the
  // ε it would reach when it does not.
  absl::StatusOr<std::optional<double>> EpsilonPastTarget(int64_t selected) const;

  // After a committed round that sampled `selected` clients and aggregated `updates`, `at_or_below` of them with a
  // norm at or below C: one accountant step at q = selected / population, and adaptive clipping's next C.
  absl::StatusOr<RoundPrivacy> AfterRound(int64_t selected, int64_t updates, int64_t at_or_below);

 private:
  double SamplingRate(int64_t selected) const;

  double sigma_ = 0;
  double clip_norm_ = 0;
  bool clients_clip_ = false;  // secure aggregation: the clients clip (FillClientPrivacy)
  double delta_ = 0;
  double target_epsilon_ = 0;
  uint32_t population_ = 0;
  std::optional<privacy::AdaptiveClipping> adaptive_;
  privacy::RdpAccountant accountant_;
  privacy::NoiseRng rng_;
};

}  // namespace fl::server::engine
