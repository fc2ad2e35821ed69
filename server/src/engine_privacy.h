// The round engine's differential privacy (loop-owned, server/src only; docs/privacy.md): who clips and who adds
// the noise (--dp-mode), the clip norm, the Gaussian noise on the mean when the server adds it, adaptive clipping's
// next C, and the RDP accountant that says what the run has spent, with its ledger for the checkpoint. Off (every
// call a no-op) without --dp-noise-multiplier. It knows nothing of clients or records: the core asks it what a
// train task tells its client (FillClientPrivacy), clips through the aggregator when ServerClips, noises the mean
// when ServerNoises, and records what AfterRound returns.
//
//   central       the server clips each update to C and noises the mean with N(0, (σ·C/m)²); under secure
//                 aggregation the clients clip (the server cannot see an update) and the server noises the
//                 unmasked mean. Accounted at q = selected / population, multiplier σ.
//   local         every client clips to C and adds N(0, (σ·C)²) per coordinate itself; the server adds nothing.
//                 Accounted per client: a released update is a Gaussian mechanism of sensitivity 2C (the client's
//                 data replaced: two updates of norm ≤ C differ by ≤ 2C) and std σ·C, i.e. multiplier σ/2 at q = 1,
//                 one step per round: the ε of a client that took part in every round so far.
//   distributed   with secure aggregation, every selected client adds integer discrete Gaussian noise of std
//                 σ·C·scale/√n quantisation steps (n = the round's selected clients) before masking; the server
//                 adds nothing. Accounted at q = selected / population with the survivors' multiplier
//                 σ·√(survivors/selected) (fl::privacy::DistributedNoiseMultiplier).
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
#include "fl/v1/checkpoint.pb.h"
#include "fl/v1/federation.pb.h"

namespace fl::server::engine {

// What one committed round spent, for its record.
struct RoundPrivacy {
  double epsilon = 0;           // ε spent by the run up to and including this round, at --dp-delta
  double order = 0;             // the Rényi order that gave it
  double clip_norm = 0;         // C the round's updates were clipped to
  double noise_multiplier = 0;  // of the noise on its mean (adaptive: σ_Δ; distributed: the survivors'; local: σ)
};

// Differential privacy in every mode (the name is historical: it began with central DP only).
class CentralDp {
 public:
  enum class Mode { kCentral, kLocal, kDistributed };

  // Off until Configure.
  CentralDp() : rng_(privacy::NoiseRng::FromSystem()) {}

  // From a validated config (EngineConfig::ValidatePrivacy); an error names the setting. `rng` replaces the
  // system-seeded noise generator (tests only: noise must be unpredictable in a real run).
  absl::Status Configure(const EngineConfig& config, std::optional<privacy::NoiseRng> rng = std::nullopt);
  bool on() const { return sigma_ > 0; }
  Mode mode() const { return mode_; }

  // C for the next round's updates (adaptive clipping: the current estimate).
  double clip_norm() const;
  // The multiplier of the noise on the mean: σ, or with adaptive clipping the σ_Δ left after the count's share.
  double noise_multiplier() const;

  // Whether the server clips each update itself (central DP without secure aggregation); otherwise the clients
  // clip, and a server clip of a locally noised update would cut its noise and its signal together.
  bool ServerClips() const { return on() && mode_ == Mode::kCentral && !secagg_; }
  // Whether the server noises the (unmasked) mean: central DP only.
  bool ServerNoises() const { return on() && mode_ == Mode::kCentral; }
  // What a train task of a round of `expected_clients` selected clients carries in its `privacy` field: nothing
  // when the server clips and noises (central DP without secure aggregation) or DP is off; the clip norm when the
  // clients clip; the local noise std (local); the central noise in quantisation steps and the number of clients
  // sharing it (distributed).
  void FillClientPrivacy(int64_t expected_clients, fl::v1::ClientPrivacy* out) const;

  // Noise N(0, (σ·C/m)²) on every value of the mean of `updates` clipped updates, in place.
  absl::Status NoiseMean(std::span<float> mean, int64_t updates);

  // Whether a round of `selected` sampled clients keeps ε within --dp-target-epsilon (true without a target); the
  // ε it would reach when it does not. Distributed DP counts the fewest survivors a round can commit with.
  absl::StatusOr<std::optional<double>> EpsilonPastTarget(int64_t selected) const;

  // After a committed round that sampled `selected` clients and aggregated `updates` (distributed DP: the
  // survivors whose noise shares reached the sum), `at_or_below` of them with a norm at or below C: one accountant
  // step, and adaptive clipping's next C.
  absl::StatusOr<RoundPrivacy> AfterRound(int64_t selected, int64_t updates, int64_t at_or_below);

  // The ledger a checkpoint keeps (nullopt when off): the accountant's RDP per order and steps, the current C and
  // the settings they depend on.
  std::optional<fl::v1::PrivacyLedger> Ledger() const;
  // After Configure, when resuming from a checkpoint of round `round` that holds `ledger`: the accountant and C
  // continue from it. Refused, naming the difference, when the settings differ from the ledger's, when a private
  // run's checkpoint has no ledger (its rounds' ε would be lost) and when a private checkpoint is resumed without DP.
  absl::Status Restore(const std::optional<fl::v1::PrivacyLedger>& ledger, uint64_t round);

 private:
  double SamplingRate(int64_t selected) const;
  // The (q, σ) of one accountant step for a round.
  absl::StatusOr<std::pair<double, double>> Step(int64_t selected, int64_t survivors) const;

  Mode mode_ = Mode::kCentral;
  bool secagg_ = false;
  double secagg_scale_ = 0;
  int64_t min_commit_ = 1;  // the fewest updates a round commits with (--min-fit-clients)
  double sigma_ = 0;
  double clip_norm_ = 0;
  double delta_ = 0;
  double target_epsilon_ = 0;
  uint32_t population_ = 0;
  fl::v1::PrivacyLedger settings_;  // the settings fields of a ledger: what Restore compares
  std::optional<privacy::AdaptiveClipping> adaptive_;
  privacy::RdpAccountant accountant_;
  privacy::NoiseRng rng_;
};

}  // namespace fl::server::engine
