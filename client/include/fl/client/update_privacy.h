// What fl-client does to its update before it leaves the device (Task.privacy, fl.v1.ClientPrivacy; issue 29,
// docs/privacy.md): on the delta (global - local), in this order,
//   1. clip to L2 norm clip_norm (fl::privacy::ClipToNorm) when > 0;
//   2. add Gaussian noise of local_noise_stddev per coordinate (local DP; fl::privacy::AddGaussianNoise) when > 0;
//   3. with secure aggregation only: distributed DP's share of discrete Gaussian noise, added to the quantised
//      coordinates before masking (SecureUpdate::MaskInPlace, DistributedNoise).
// Steps 1 and 2 apply to every uplink codec, masked or not; on a lossy codec they come before the encode (and its
// error feedback).
#pragma once

#include <span>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fl/privacy/mechanisms.h"
#include "fl/privacy/noise_rng.h"
#include "fl/v1/federation.pb.h"

namespace fl::client {

// Refuses (InvalidArgument, naming the field, its value and what to do) a value that is NaN, infinite or
// negative; central_noise_steps without secure aggregation (nothing would add up the shares); central noise
// without expected_clients; a share std central_noise_steps / sqrt(expected_clients) above the sampler's 2^20.
absl::Status CheckClientPrivacy(const v1::ClientPrivacy& privacy, bool secure_aggregation);

// Whether steps 1 or 2 change anything (a plain fp32 task without privacy keeps its single pass).
inline bool ChangesDelta(const v1::ClientPrivacy& privacy) {
  return privacy.clip_norm() > 0 || privacy.local_noise_stddev() > 0;
}

// Steps 1 and 2 on `delta` in place (after CheckClientPrivacy). Returns the clip (the norm before it, the scale;
// a default ClipResult without clip_norm). A non-finite delta is an InvalidArgument (a diverged training).
absl::StatusOr<privacy::ClipResult> ApplyClientPrivacy(std::span<float> delta, const v1::ClientPrivacy& privacy,
                                                       privacy::NoiseRng& rng);

}  // namespace fl::client
