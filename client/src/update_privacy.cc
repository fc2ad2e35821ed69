// Task.privacy on fl-client's update (update_privacy.h).
#include "fl/client/update_privacy.h"

#include <cmath>
#include <string_view>

#include "fl/core/str_cat.h"
#include "fl/privacy/discrete_gaussian.h"

namespace fl::client {
namespace {

// A field that must be finite and >= 0 (0: off).
absl::Status CheckField(std::string_view field, double value, std::string_view what) {
  if (std::isfinite(value) && value >= 0) return absl::OkStatus();
  return absl::InvalidArgumentError(fl::StrCat("Task.privacy.", field, " = ", value, " is not a finite value >= 0 (",
                                               what, "; 0 turns it off): the server's privacy settings are wrong"));
}

}  // namespace

absl::Status CheckClientPrivacy(const v1::ClientPrivacy& p, bool secure_aggregation) {
  if (absl::Status s = CheckField("clip_norm", p.clip_norm(), "the L2 norm the delta is clipped to"); !s.ok()) return s;
  if (absl::Status s = CheckField("local_noise_stddev", p.local_noise_stddev(), "local DP's Gaussian noise std");
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          CheckField("central_noise_steps", p.central_noise_steps(), "distributed DP's central noise std in steps");
      !s.ok()) {
    return s;
  }
  if (p.central_noise_steps() > 0) {
    if (!secure_aggregation) {
      return absl::InvalidArgumentError(fl::StrCat(
          "Task.privacy.central_noise_steps = ", p.central_noise_steps(),
          " without secure aggregation (Task.secagg): distributed DP's noise shares only add up to the central noise "
          "in a secure sum; the server must send it with Task.secagg, or use local_noise_stddev instead"));
    }
    if (p.expected_clients() == 0) {
      return absl::InvalidArgumentError(
          "Task.privacy.central_noise_steps is set but expected_clients = 0: each client's share is "
          "central_noise_steps / sqrt(expected_clients); the server must say how many clients add one");
    }
    const double share = p.central_noise_steps() / std::sqrt(static_cast<double>(p.expected_clients()));
    if (share > privacy::DiscreteGaussian::kMaxSigma) {
      return absl::InvalidArgumentError(fl::StrCat(
          "Task.privacy: a noise share of central_noise_steps / sqrt(expected_clients) = ", p.central_noise_steps(),
          " / sqrt(", p.expected_clients(), ") = ", share,
          " steps is above the discrete Gaussian sampler's 2^20; use a coarser quantisation scale"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<privacy::ClipResult> ApplyClientPrivacy(std::span<float> delta, const v1::ClientPrivacy& p,
                                                       privacy::NoiseRng& rng) {
  privacy::ClipResult clip;
  if (p.clip_norm() > 0) {
    absl::StatusOr<privacy::ClipResult> clipped = privacy::ClipToNorm(delta, p.clip_norm());
    if (!clipped.ok()) {
      return absl::InvalidArgumentError(
          fl::StrCat("clipping the update to Task.privacy.clip_norm: ", clipped.status().message()));
    }
    clip = *clipped;
  }
  if (p.local_noise_stddev() > 0) {
    if (absl::Status s = privacy::AddGaussianNoise(delta, p.local_noise_stddev(), rng); !s.ok()) return s;
  }
  return clip;
}

}  // namespace fl::client
