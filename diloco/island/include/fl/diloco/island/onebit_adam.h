// 1-bit Adam (Tang et al. 2021, DeepSpeed; ../shared/REFERENCES.md) and the exact data-parallel Adam it is
// measured against, as the optimizer arithmetic of an island leader. Torch-free: the islands' exchange is the
// ring all-reduce (fl::diloco::RingAllReduce), the model a flat fp32 vector.
//
// Every island holds the same model x, first moment m, second moment v and step count t. One step t (1-based):
//   warm-up (t <= W, and every step of plain data-parallel Adam): the islands all-reduce their gradients g_i
//     (fp32, or any codec with error feedback) to g, then Adam with decoupled weight decay (torch's AdamW):
//       m ← β1·m + (1−β1)·g,  v ← β2·v + (1−β2)·g²,
//       x ← x·(1 − lr·wd) − lr/(1−β1^t) · m / (√v/√(1−β2^t) + ε)
//   compression (t > W): v stays as it was after step W (frozen, with its bias correction 1−β2^W), and each
//     island forms its local momentum m_i = β1·m + (1−β1)·g_i (LocalMomentum); the islands all-reduce m_i with
//     the sign1 codec, one scale per `chunk` values, error feedback on every island's encodings and on the
//     reducer's re-encoding of each chunk's average (the ring's residuals); every island then sets m to that
//     average and steps x with the frozen v (CompressedStep).
// All of it is fp32 arithmetic on identical inputs (the ring hands every island the same bits), so the state
// is bit-identical on every island; Hash() covers it with the model for the state check.
//
// What is not the paper's: the sign1 scale is the codec's mean |x| of the chunk (fl::core, codec.h), where the
// paper uses ‖x‖₂/√n; both make the decoded chunk's mean magnitude match. The error-feedback residuals are each
// island's own (its encodings' losses; the reducer's loss of the chunks it owns) while a ring runs; at a
// membership window's end they are folded into m (FoldIntoMomentum, onebit_membership.h) and are then zero on
// every island, which the state image and hash include.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fl::diloco {

struct OneBitAdamOptions {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  // W: steps of exact Adam before the variance freezes. W = total_steps is plain data-parallel Adam.
  uint64_t warmup_steps = 100;
  uint64_t total_steps = 1000;  // T, only to refuse a warm-up longer than the run
  // Values per sign1 scale in the compression stage (the codec's block size: a positive multiple of 8, at most
  // 1 << 20).
  uint32_t chunk = 256;
  // The island's inner optimizer: 1-bit Adam is Adam, so only "adamw" (fl-island's inner AdamW) is accepted.
  std::string inner_optimizer = "adamw";

  // InvalidArgument naming the field, its value and what to do.
  absl::Status Validate() const;
  // The compression stage's codec spec: "sign1:<chunk>".
  std::string CompressedCodec() const;
};

class OneBitAdam {
 public:
  static absl::StatusOr<OneBitAdam> Create(size_t num_values, const OneBitAdamOptions& options);

  const OneBitAdamOptions& options() const { return options_; }
  size_t size() const { return m_.size(); }
  uint64_t step() const { return step_; }  // steps taken
  // Whether the next step (step() + 1) is in the compression stage.
  bool NextStepCompressed() const { return step_ >= options_.warmup_steps; }
  std::span<const float> momentum() const { return m_; }
  std::span<const float> variance() const { return v_; }

  // A warm-up step with the islands' mean gradient. FailedPrecondition in the compression stage;
  // InvalidArgument on a size mismatch or a NaN/Inf gradient (nothing changes then).
  absl::Status AdamStep(std::span<const float> mean_grad, double lr, std::span<float> params);
  // out = β1·m + (1−β1)·grad: what this island sends in the compression stage. InvalidArgument on sizes or
  // NaN/Inf.
  absl::Status LocalMomentum(std::span<const float> grad, std::span<float> out) const;
  // A compression-stage step with the islands' averaged momentum: m ← it; x steps with the frozen v.
  // FailedPrecondition during the warm-up; InvalidArgument on sizes or NaN/Inf (nothing changes then).
  absl::Status CompressedStep(std::span<const float> mean_momentum, double lr, std::span<float> params);
  // m ← m + mean_residual: the islands' error-feedback residuals averaged over the ring, delivered into the
  // shared momentum at once instead of through later exchanges (onebit_membership.h). FailedPrecondition during
  // the warm-up (there are no momentum residuals then); InvalidArgument on sizes or NaN/Inf.
  absl::Status FoldIntoMomentum(std::span<const float> mean_residual);

  // Checksum64 of the state image of `params` with this state and the island's error-feedback `residual` of
  // the momentum (empty = zeros): equal on two islands iff model, m, v, step, the options that shape a step and
  // the residuals agree (up to hash collisions). After a fold the residuals are zero on every island.
  uint64_t Hash(std::span<const float> params, std::span<const float> residual = {}) const;
  // The same hash of an image Serialize made (for a caller that needs both: one Serialize, not two).
  static uint64_t ImageHash(std::span<const uint8_t> image);
  // A self-describing image (magic, version 2, options, step, m, v, the model, the residual, checksum) and its
  // inverse. Restore checks everything (options equal to this instance's, sizes, checksum) before it changes
  // anything; on error neither the state, `params` nor `*residual` change. `residual` may be null (ignored).
  std::vector<uint8_t> Serialize(std::span<const float> params, std::span<const float> residual = {}) const;
  absl::Status Restore(std::span<const uint8_t> image, std::span<float> params, std::vector<float>* residual = nullptr);

 private:
  OneBitAdam(size_t n, const OneBitAdamOptions& options) : options_(options), m_(n, 0.0f), v_(n, 0.0f) {}
  void Update(double lr, std::span<float> params) const;

  OneBitAdamOptions options_;
  uint64_t step_ = 0;
  std::vector<float> m_;
  std::vector<float> v_;
};

}  // namespace fl::diloco
