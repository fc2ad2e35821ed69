// The state every island holds bit-identically: the global parameters θ_global and the outer optimizer's
// state, per Streaming DiLoCo fragment (Douillard et al. 2025, arXiv 2501.18512; DiLoCo is P = 1).
//
// One sync of fragment f:
//   1. at the send step, each island forms its pseudo-gradient  Δ_f = θ_global,f − θ_local,f  (PseudoGradient);
//   2. the islands average Δ_f (the ring all-reduce; every island receives the same bytes);
//   3. at the apply step (send + τ) each island applies the outer optimizer to θ_global,f with the averaged
//      Δ_f (ApplyOuterStep) — the core optimizers take exactly this g = θ_global − mean(θ_local);
//   4. and mixes its local copy: θ_local,f ← α·θ_local,f + (1−α)·θ_global,f (MixInto). α = 0 is DiLoCo's
//      "replace by the global model"; the paper uses α = 0.5 with overlap (τ > 0).
// Steps 3 and 4 are deterministic fp32 arithmetic on identical inputs, so θ_global and the optimizer state
// stay bit-identical across islands; Hash() lets the coordinator check it, Serialize() lets a late joiner
// or a repaired island copy it from a peer.
//
// Every fragment has its own outer optimizer (its own momentum buffer and step count): fragments sync at
// different times, so one optimizer over the whole model would step parameters that did not sync.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fl/core/fragment_plan.h"
#include "fl/core/server_optimizer.h"
#include "fl/core/tensor_spec.h"

namespace fl::diloco {

struct OuterOptions {
  uint64_t inner_steps = 100;  // H: inner steps between two syncs of the same fragment
  size_t num_fragments = 1;    // P: 1 = DiLoCo; > 1 = Streaming DiLoCo (must divide H)
  core::FragmentStrategy strategy = core::FragmentStrategy::kStrided;
  uint64_t overlap_steps = 0;  // τ: an exchange started at step t is applied at t + τ (τ < H/P)
  // α in θ_local ← α·θ_local + (1−α)·θ_global. Negative = default: 0 without overlap (DiLoCo replaces the
  // local model), 0.5 with overlap (the paper's choice; torchft's fragment_update_alpha).
  double mixing_alpha = -1.0;
  std::string outer_optimizer = "nesterov:lr=0.7,momentum=0.9";

  // InvalidArgument naming the field, its value and the valid range.
  absl::Status Validate() const;
  double EffectiveAlpha() const { return mixing_alpha >= 0.0 ? mixing_alpha : (overlap_steps > 0 ? 0.5 : 0.0); }
};

// θ_local ← α·θ_local + (1−α)·θ_global elementwise (sizes must match). Exposed for tests.
absl::Status MixLocal(float alpha, std::span<const float> global, std::span<float> local);

class OuterState {
 public:
  // `initial_global` is θ_global at step 0 (the same on every island: same model seed).
  static absl::StatusOr<OuterState> Create(std::shared_ptr<const core::ModelSpec> spec,
                                           std::vector<float> initial_global, const OuterOptions& options);

  OuterState(OuterState&&) = default;
  OuterState& operator=(OuterState&&) = default;

  const core::ModelSpec& spec() const { return *spec_; }
  const core::FragmentPlan& plan() const { return plan_; }
  const core::FragmentSchedule& schedule() const { return schedule_; }
  const OuterOptions& options() const { return options_; }
  float alpha() const { return alpha_; }
  std::span<const float> global() const { return global_; }
  size_t fragment_size(size_t fragment) const { return plan_.fragment(fragment).num_elements; }

  // out = θ_global,f − θ_local,f (fragment layout). `local_model` is the whole flat model.
  absl::Status PseudoGradient(size_t fragment, std::span<const float> local_model, std::span<float> out) const;
  // Outer step on fragment f with the islands' averaged pseudo-gradient (fragment layout). Fails without
  // changing anything on a size mismatch or NaN/Inf.
  absl::Status ApplyOuterStep(size_t fragment, std::span<const float> mean_pseudo_grad);
  // θ_local,f ← α·θ_local,f + (1−α)·θ_global,f in the whole flat model `local_model`.
  absl::Status MixInto(size_t fragment, std::span<float> local_model) const;
  // Writes θ_global,f into `local_model` (what a late joiner and a repaired island start from).
  absl::Status CopyGlobalInto(std::span<float> local_model) const;

  // Outer steps applied to fragment f so far.
  uint64_t outer_steps(size_t fragment) const { return optimizers_.at(fragment)->step_count(); }
  uint64_t total_outer_steps() const;

  // Checksum64 over θ_global and every fragment's optimizer state (name, step count, buffers): equal on two
  // islands iff their states are bit-identical (up to hash collisions).
  uint64_t Hash() const;

  // A self-describing byte image (magic, version, model fingerprint, fragment count, then per fragment its
  // optimizer state, then θ_global, then a checksum) and its inverse. Restore checks the fingerprint, the
  // plan, every size and the checksum; on error nothing changes.
  std::vector<uint8_t> Serialize() const;
  absl::Status Restore(std::span<const uint8_t> image);

 private:
  OuterState(std::shared_ptr<const core::ModelSpec> spec, core::FragmentPlan plan, core::FragmentSchedule schedule,
             OuterOptions options, std::vector<float> global,
             std::vector<std::unique_ptr<core::ServerOptimizer>> optimizers);

  std::shared_ptr<const core::ModelSpec> spec_;
  core::FragmentPlan plan_;
  core::FragmentSchedule schedule_;
  OuterOptions options_;
  float alpha_ = 0.0f;
  std::vector<float> global_;
  std::vector<std::unique_ptr<core::ServerOptimizer>> optimizers_;  // one per fragment
  mutable std::vector<float> scratch_;
};

}  // namespace fl::diloco
