// How fl-client encodes its update with the codec each task names, with error feedback that survives a change of
// codec between rounds (link-aware compression, fl-server --uplink-codec-policy; docs/stragglers.md).
//
// The residual is what lossy encodes have lost so far and the server has not received. It does not depend on
// the codec that lost it, so it is carried when the codec changes (int4 -> int8 under a by-rate policy, say):
// resetting it would drop that part of earlier updates for good, a bias that error feedback exists to avoid.
// A lossless task (fp32) sends update + residual exactly, which empties the residual; it is then released.
// A model of another size (never within one experiment) starts a fresh residual.
#pragma once

#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "fl/core/codec.h"
#include "fl/training/trainer.h"
#include "fl/v1/federation.pb.h"

namespace fl::client {

class UplinkEncoder {
 public:
  // Encodes `update` (plus the residual, if any) with `codec` into `out`. On error nothing changes.
  absl::Status Encode(const core::Codec& codec, std::span<const float> update, std::vector<uint8_t>* out,
                      const core::EncodeOptions& options = {});

  // The update of a trained model, the pseudo-gradient global - local (UPDATE_KIND_DELTA), with Task.privacy's
  // clip and local noise applied (update_privacy.h; CheckClientPrivacy first), encoded with `codec` into `out`
  // through Encode. fp32 with nothing owed to error feedback (on a little-endian host) is computed straight into
  // `out`'s body and sealed there (core::SealFp32Payload): the same bytes as encoding it, without `scratch` and its
  // copy, privacy applied to that body before the seal. Other codecs form the update in `scratch` (reused from
  // round to round). A non-finite update is refused by the clip or the encode (a diverged training).
  absl::Status EncodeDelta(const core::Codec& codec, std::span<const float> global, training::Trainer& trainer,
                           const v1::ClientPrivacy& privacy, std::vector<float>& scratch, std::vector<uint8_t>* out,
                           const core::EncodeOptions& options = {});

  // The residual carried to the next update; empty when there is none.
  std::span<const float> residual() const;

 private:
  std::unique_ptr<core::ErrorFeedback> error_feedback_;
};

}  // namespace fl::client
