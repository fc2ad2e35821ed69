// fl-client's uplink encoding with error feedback carried across codec changes (uplink_encoder.h).
#include "fl/client/uplink_encoder.h"

#include <bit>

#include "fl/client/update_privacy.h"
#include "fl/privacy/noise_rng.h"

namespace fl::client {

absl::Status UplinkEncoder::Encode(const core::Codec& codec, std::span<const float> update, std::vector<uint8_t>* out,
                                   const core::EncodeOptions& options) {
  const bool lossy = codec.kind() != core::CodecKind::kFp32;
  if (error_feedback_ != nullptr && error_feedback_->residual().size() != update.size()) error_feedback_.reset();
  if (!lossy && error_feedback_ == nullptr) return codec.Encode(update, out, options);  // nothing owed: the plain path
  if (error_feedback_ == nullptr) error_feedback_ = std::make_unique<core::ErrorFeedback>(update.size());
  if (absl::Status s = error_feedback_->Encode(codec, update, out, options); !s.ok()) return s;
  // A lossless encode sent everything owed: its residual is exactly zero, so the buffer can go.
  if (!lossy) error_feedback_.reset();
  return absl::OkStatus();
}

absl::Status UplinkEncoder::EncodeDelta(const core::Codec& codec, std::span<const float> global,
                                        training::Trainer& trainer, const v1::ClientPrivacy& privacy,
                                        std::vector<float>& scratch, std::vector<uint8_t>* out,
                                        const core::EncodeOptions& options) {
  auto apply_privacy = [&](std::span<float> delta) -> absl::Status {
    if (!ChangesDelta(privacy)) return absl::OkStatus();
    privacy::NoiseRng rng = privacy::NoiseRng::FromSystem();  // 32 bytes from the kernel; nothing drawn to clip
    return ApplyClientPrivacy(delta, privacy, rng).status();
  };
  const size_t n = global.size();
  if (codec.kind() == core::CodecKind::kFp32 && residual().empty() && std::endian::native == std::endian::little) {
    out->resize(codec.EncodedSize(n));
    const std::span<float> body(reinterpret_cast<float*>(out->data() + core::kCodecHeaderBytes), n);
    if (absl::Status s = trainer.GetParameters(body); !s.ok()) return s;
    for (size_t i = 0; i < n; ++i) body[i] = global[i] - body[i];
    if (absl::Status s = apply_privacy(body); !s.ok()) return s;
    return core::SealFp32Payload(*out, options);
  }
  scratch.resize(n);
  if (absl::Status s = trainer.GetParameters(scratch); !s.ok()) return s;
  for (size_t i = 0; i < n; ++i) scratch[i] = global[i] - scratch[i];
  if (absl::Status s = apply_privacy(scratch); !s.ok()) return s;
  return Encode(codec, scratch, out, options);
}

std::span<const float> UplinkEncoder::residual() const {
  if (error_feedback_ == nullptr) return {};
  return error_feedback_->residual();
}

}  // namespace fl::client
