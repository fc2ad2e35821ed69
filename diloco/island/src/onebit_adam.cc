#include "fl/diloco/island/onebit_adam.h"

#include <cmath>
#include <cstring>

#include "fl/core/checksum.h"
#include "fl/core/codec.h"
#include "fl/core/str_cat.h"

namespace fl::diloco {
namespace {

constexpr uint32_t kImageMagic = 0x41424f31;  // "1OBA" little-endian: 1-bit Adam state
// Version 2 added the error-feedback residual after the model (churn: docs/diloco.md).
constexpr uint32_t kImageVersion = 2;

absl::Status CheckValues(std::span<const float> values, size_t n, std::string_view what) {
  if (values.size() != n) {
    return absl::InvalidArgumentError(
        fl::StrCat("1-bit Adam: ", what, " has ", values.size(), " values but the model has ", n));
  }
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) {
      return absl::InvalidArgumentError(fl::StrCat("1-bit Adam: ", what, " is ", values[i], " at index ", i,
                                                   "; lower the learning rate or check the data"));
    }
  }
  return absl::OkStatus();
}

void Append(std::vector<uint8_t>* out, const void* data, size_t n) {
  if (n == 0) return;
  const size_t old = out->size();
  out->resize(old + n);
  std::memcpy(out->data() + old, data, n);
}
template <typename T>
void Put(std::vector<uint8_t>* out, T value) {
  Append(out, &value, sizeof(T));  // the testbed's platforms are little-endian (amd64, arm64)
}

}  // namespace

absl::Status OneBitAdamOptions::Validate() const {
  if (inner_optimizer != "adamw") {
    return absl::InvalidArgumentError(fl::StrCat("1-bit Adam needs the inner optimizer adamw, not '", inner_optimizer,
                                                 "': it is Adam with a frozen variance; use inner.optimizer: adamw, "
                                                 "or another sync mode for ",
                                                 inner_optimizer));
  }
  if (warmup_steps > total_steps) {
    return absl::InvalidArgumentError(
        fl::StrCat("1-bit Adam warm-up of ", warmup_steps, " steps is longer than the run (", total_steps,
                   " steps); use at most ", total_steps, " (equal to the run: plain data-parallel Adam)"));
  }
  if (absl::StatusOr<std::unique_ptr<core::Codec>> codec = core::MakeCodec(CompressedCodec()); !codec.ok()) {
    return absl::InvalidArgumentError(
        fl::StrCat("1-bit Adam chunk of ", chunk, " values cannot be carried by the sign1 codec (",
                   fl::ToStd(codec.status().message()), "); use a positive multiple of 8 up to 1048576, e.g. 256"));
  }
  if (!(beta1 >= 0 && beta1 < 1) || !(beta2 >= 0 && beta2 < 1)) {
    return absl::InvalidArgumentError(
        fl::StrCat("1-bit Adam betas (", beta1, ", ", beta2, ") must be in [0, 1); e.g. 0.9, 0.95"));
  }
  if (!(eps > 0) || !(weight_decay >= 0)) {
    return absl::InvalidArgumentError(
        fl::StrCat("1-bit Adam eps ", eps, " must be > 0 and weight decay ", weight_decay, " >= 0"));
  }
  return absl::OkStatus();
}

std::string OneBitAdamOptions::CompressedCodec() const { return fl::StrCat("sign1:", chunk); }

absl::StatusOr<OneBitAdam> OneBitAdam::Create(size_t num_values, const OneBitAdamOptions& options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  return OneBitAdam(num_values, options);
}

// torch::optim::AdamW's arithmetic (decoupled weight decay, bias corrections), in fp32 per value with the
// scalars computed in double once per step. In the compression stage v and its correction stay at step W.
void OneBitAdam::Update(double lr, std::span<float> params) const {
  const double t = static_cast<double>(step_);
  const double tv = static_cast<double>(std::min(step_, options_.warmup_steps));
  const auto decay = static_cast<float>(1.0 - lr * options_.weight_decay);
  const auto step_size = static_cast<float>(lr / (1.0 - std::pow(options_.beta1, t)));
  const auto sqrt_c2 = static_cast<float>(std::sqrt(1.0 - std::pow(options_.beta2, tv)));
  const auto eps = static_cast<float>(options_.eps);
  for (size_t i = 0; i < params.size(); ++i) {
    const float denom = std::sqrt(v_[i]) / sqrt_c2 + eps;
    params[i] = params[i] * decay - step_size * (m_[i] / denom);
  }
}

absl::Status OneBitAdam::AdamStep(std::span<const float> mean_grad, double lr, std::span<float> params) {
  if (NextStepCompressed()) {
    return absl::FailedPreconditionError(fl::StrCat("1-bit Adam: step ", step_ + 1, " is past the warm-up of ",
                                                    options_.warmup_steps, " steps; use CompressedStep"));
  }
  if (absl::Status s = CheckValues(mean_grad, m_.size(), "the mean gradient"); !s.ok()) return s;
  if (params.size() != m_.size()) return CheckValues(params, m_.size(), "the model");
  const auto b1 = static_cast<float>(options_.beta1);
  const auto b2 = static_cast<float>(options_.beta2);
  for (size_t i = 0; i < m_.size(); ++i) {
    const float g = mean_grad[i];
    m_[i] = b1 * m_[i] + (1.0f - b1) * g;
    v_[i] = b2 * v_[i] + (1.0f - b2) * g * g;
  }
  ++step_;
  Update(lr, params);
  return absl::OkStatus();
}

absl::Status OneBitAdam::LocalMomentum(std::span<const float> grad, std::span<float> out) const {
  if (absl::Status s = CheckValues(grad, m_.size(), "the gradient"); !s.ok()) return s;
  if (out.size() != m_.size()) {
    return absl::InvalidArgumentError(
        fl::StrCat("1-bit Adam: the momentum output has ", out.size(), " values but the model has ", m_.size()));
  }
  const auto b1 = static_cast<float>(options_.beta1);
  for (size_t i = 0; i < m_.size(); ++i) out[i] = b1 * m_[i] + (1.0f - b1) * grad[i];
  return absl::OkStatus();
}

absl::Status OneBitAdam::CompressedStep(std::span<const float> mean_momentum, double lr, std::span<float> params) {
  if (!NextStepCompressed()) {
    return absl::FailedPreconditionError(fl::StrCat("1-bit Adam: step ", step_ + 1, " is in the warm-up of ",
                                                    options_.warmup_steps, " steps; use AdamStep"));
  }
  if (absl::Status s = CheckValues(mean_momentum, m_.size(), "the averaged momentum"); !s.ok()) return s;
  if (params.size() != m_.size()) return CheckValues(params, m_.size(), "the model");
  std::copy(mean_momentum.begin(), mean_momentum.end(), m_.begin());
  ++step_;
  Update(lr, params);
  return absl::OkStatus();
}

absl::Status OneBitAdam::FoldIntoMomentum(std::span<const float> mean_residual) {
  if (!NextStepCompressed()) {
    return absl::FailedPreconditionError(fl::StrCat("1-bit Adam: step ", step_, " is in the warm-up of ",
                                                    options_.warmup_steps,
                                                    " steps, which has no momentum residuals to fold"));
  }
  if (absl::Status s = CheckValues(mean_residual, m_.size(), "the averaged residual"); !s.ok()) return s;
  for (size_t i = 0; i < m_.size(); ++i) m_[i] += mean_residual[i];
  return absl::OkStatus();
}

std::vector<uint8_t> OneBitAdam::Serialize(std::span<const float> params, std::span<const float> residual) const {
  std::vector<uint8_t> out;
  out.reserve(104 + (m_.size() * 3 + params.size()) * sizeof(float));
  Put<uint32_t>(&out, kImageMagic);
  Put<uint32_t>(&out, kImageVersion);
  Put<double>(&out, options_.beta1);
  Put<double>(&out, options_.beta2);
  Put<double>(&out, options_.eps);
  Put<double>(&out, options_.weight_decay);
  Put<uint64_t>(&out, options_.warmup_steps);
  Put<uint32_t>(&out, options_.chunk);
  Put<uint64_t>(&out, step_);
  Put<uint64_t>(&out, m_.size());
  Append(&out, m_.data(), m_.size() * sizeof(float));
  Append(&out, v_.data(), v_.size() * sizeof(float));
  Put<uint64_t>(&out, params.size());
  Append(&out, params.data(), params.size() * sizeof(float));
  // The residual always has the model's size (zeros when the island keeps none), so that an island without a
  // ring yet and one whose residuals were folded serialize alike.
  Put<uint64_t>(&out, m_.size());
  if (residual.size() == m_.size()) {
    Append(&out, residual.data(), residual.size() * sizeof(float));
  } else {
    out.resize(out.size() + m_.size() * sizeof(float), 0);
  }
  Put<uint64_t>(&out, core::Checksum64(out));
  return out;
}

uint64_t OneBitAdam::Hash(std::span<const float> params, std::span<const float> residual) const {
  return ImageHash(Serialize(params, residual));
}

uint64_t OneBitAdam::ImageHash(std::span<const uint8_t> image) {
  // The image is exactly "everything that must agree", so hash it (without its own checksum).
  return core::Checksum64(image.first(image.size() - sizeof(uint64_t)));
}

absl::Status OneBitAdam::Restore(std::span<const uint8_t> image, std::span<float> params,
                                 std::vector<float>* residual) {
  const size_t n = m_.size();
  const size_t expected = 2 * sizeof(uint32_t) + 4 * sizeof(double) + sizeof(uint64_t) + sizeof(uint32_t) +
                          4 * sizeof(uint64_t) + 4 * n * sizeof(float) + sizeof(uint64_t);
  auto corrupt = [&](std::string_view what) {
    return absl::DataLossError(
        fl::StrCat("1-bit Adam state image (", image.size(), " bytes) is corrupt: ", what, "; fetch it again"));
  };
  if (params.size() != n) {
    return absl::InvalidArgumentError(
        fl::StrCat("1-bit Adam: the model has ", params.size(), " values but the state ", n));
  }
  if (image.size() != expected) return corrupt(fl::StrCat("expected ", expected, " bytes for ", n, " values"));
  uint64_t stored = 0;
  std::memcpy(&stored, image.data() + image.size() - sizeof(uint64_t), sizeof(uint64_t));
  if (core::Checksum64(image.first(image.size() - sizeof(uint64_t))) != stored) return corrupt("bad checksum");
  // The header must be this instance's own: the same options, the same sizes.
  std::vector<uint8_t> mine = Serialize(std::span<const float>(params));
  const size_t header = 2 * sizeof(uint32_t) + 4 * sizeof(double) + sizeof(uint64_t) + sizeof(uint32_t);
  if (std::memcmp(mine.data(), image.data(), header) != 0) {
    return absl::FailedPreconditionError(
        "1-bit Adam state image was made with other options (betas, eps, weight decay, warm-up or chunk); start "
        "every island with the same ones");
  }
  size_t pos = header;
  uint64_t step = 0, size = 0;
  std::memcpy(&step, image.data() + pos, sizeof(step));
  pos += sizeof(step);
  std::memcpy(&size, image.data() + pos, sizeof(size));
  pos += sizeof(size);
  if (size != n) return corrupt(fl::StrCat("it holds ", size, " values, this island ", n));
  std::memcpy(m_.data(), image.data() + pos, n * sizeof(float));
  pos += n * sizeof(float);
  std::memcpy(v_.data(), image.data() + pos, n * sizeof(float));
  pos += n * sizeof(float) + sizeof(uint64_t);
  std::memcpy(params.data(), image.data() + pos, n * sizeof(float));
  pos += n * sizeof(float) + sizeof(uint64_t);
  if (residual != nullptr) {
    residual->resize(n);
    std::memcpy(residual->data(), image.data() + pos, n * sizeof(float));
  }
  step_ = step;
  return absl::OkStatus();
}

}  // namespace fl::diloco
