// fl-client's uplink encoding with error feedback carried across codec changes (uplink_encoder.h).
#include "fl/client/uplink_encoder.h"

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

std::span<const float> UplinkEncoder::residual() const {
  if (error_feedback_ == nullptr) return {};
  return error_feedback_->residual();
}

}  // namespace fl::client
