#include "fl/client/synthetic_trainer.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <cmath>
#include <cstring>

#include "fl/core/str_cat.h"

namespace fl::client {
namespace {

// SplitMix64: a cheap, well-mixed sequence; quality is irrelevant here, speed and determinism are not.
inline uint64_t SplitMix(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

inline float UnitFloat(uint64_t bits) { return static_cast<float>(bits >> 40) * (1.0f / 16777216.0f) - 0.5f; }

}  // namespace

SyntheticTrainer::SyntheticTrainer(uint64_t num_params, uint64_t num_examples, uint64_t seed, uint32_t train_ms,
                                   std::string task)
    : num_examples_(num_examples), train_ms_(train_ms), task_(std::move(task)) {
  constexpr uint64_t kTensor = 1u << 20;
  std::vector<core::TensorSpec> tensors;
  for (uint64_t done = 0, i = 0; done < num_params; ++i) {
    const uint64_t n = std::min(kTensor, num_params - done);
    tensors.push_back({fl::StrCat("layers.", i, ".weight"), {static_cast<int64_t>(n)}, core::DType::kFloat32, 0});
    done += n;
  }
  spec_ = *core::ModelSpec::Create(std::move(tensors));
  params_.resize(num_params);
  uint64_t state = seed;
  for (float& p : params_) p = 0.1f * UnitFloat(SplitMix(state));
}

std::string SyntheticTrainer::model_name() const { return fl::StrCat("synthetic-", params_.size()); }

absl::Status SyntheticTrainer::GetParameters(std::span<float> out) {
  if (out.size() != params_.size()) {
    return absl::InvalidArgumentError(
        fl::StrCat("asked for ", out.size(), " parameters; the model has ", params_.size()));
  }
  std::memcpy(out.data(), params_.data(), params_.size() * sizeof(float));
  return absl::OkStatus();
}

absl::StatusOr<training::TrainResult> SyntheticTrainer::Train(std::span<const float> global,
                                                              const training::TrainOptions& options) {
  if (global.size() != params_.size()) {
    return absl::InvalidArgumentError(
        fl::StrCat("global model has ", global.size(), " parameters; expected ", params_.size()));
  }
  if (train_ms_ > 0) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(train_ms_);
    while (std::chrono::steady_clock::now() < end) {
      if (options.cancelled != nullptr && options.cancelled->load()) return absl::CancelledError("task cancelled");
      std::this_thread::sleep_for(std::chrono::milliseconds(std::min<uint32_t>(train_ms_, 10)));
    }
  }
  uint64_t state = options.seed;
  const float scale = static_cast<float>(options.learning_rate) * 1e-2f;
  // Eight values per random draw keep this at memory speed (the point of the synthetic trainer).
  size_t i = 0;
  for (; i + 8 <= params_.size(); i += 8) {
    uint64_t bits = SplitMix(state);
    for (int k = 0; k < 8; ++k) {
      params_[i + k] = global[i + k] + scale * (static_cast<float>((bits >> (8 * k)) & 0xff) / 255.0f - 0.5f);
    }
  }
  for (; i < params_.size(); ++i) params_[i] = global[i] + scale * UnitFloat(SplitMix(state));
  training::TrainResult r;
  r.num_examples = num_examples_;
  r.num_steps = 1;
  r.train_loss = static_cast<double>(scale);
  r.train_accuracy = 0;
  return r;
}

absl::StatusOr<training::EvalResult> SyntheticTrainer::Evaluate(std::span<const float> global) {
  double sum = 0, abs_sum = 0;
  for (float v : global) {
    sum += static_cast<double>(v) * v;
    abs_sum += std::abs(static_cast<double>(v));
  }
  const double n = global.empty() ? 1 : static_cast<double>(global.size());
  training::EvalResult r;
  r.num_examples = num_examples_;
  r.loss = sum / n;
  r.accuracy = 0;
  if (task_ == "next-token") r.accuracy = std::exp(-r.loss);
  if (task_ == "regression") r.mae = abs_sum / n;
  return r;
}

}  // namespace fl::client
