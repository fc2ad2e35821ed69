#include "fl/diloco/island/outer_state.h"

#include <cmath>
#include <cstring>
#include <utility>

#include "fl/core/checksum.h"
#include "fl/core/str_cat.h"

namespace fl::diloco {
namespace {

constexpr uint32_t kImageMagic = 0x54534f44;  // "DOST" little-endian: DiLoCo outer state
constexpr uint32_t kImageVersion = 1;

class Writer {
 public:
  explicit Writer(std::vector<uint8_t>* out) : out_(out) {}
  template <typename T>
  void Put(T value) {
    Append(&value, sizeof(T));  // the testbed's platforms are little-endian (amd64, arm64)
  }
  void PutString(const std::string& s) {
    Put<uint32_t>(static_cast<uint32_t>(s.size()));
    Append(s.data(), s.size());
  }
  void PutFloats(std::span<const float> values) {
    Put<uint64_t>(values.size());
    Append(values.data(), values.size_bytes());
  }
  void Append(const void* data, size_t n) {
    if (n == 0) return;
    const size_t old = out_->size();
    out_->resize(old + n);
    std::memcpy(out_->data() + old, data, n);
  }

 private:
  std::vector<uint8_t>* out_;
};

class Reader {
 public:
  explicit Reader(std::span<const uint8_t> in) : in_(in) {}
  template <typename T>
  bool Get(T* value) {
    if (in_.size() - pos_ < sizeof(T)) return false;
    std::memcpy(value, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool GetString(std::string* s) {
    uint32_t n = 0;
    if (!Get(&n) || in_.size() - pos_ < n) return false;
    s->assign(reinterpret_cast<const char*>(in_.data() + pos_), n);
    pos_ += n;
    return true;
  }
  bool GetFloats(std::vector<float>* values) {
    uint64_t n = 0;
    if (!Get(&n) || (in_.size() - pos_) / sizeof(float) < n) return false;
    values->resize(n);
    std::memcpy(values->data(), in_.data() + pos_, n * sizeof(float));
    pos_ += n * sizeof(float);
    return true;
  }
  size_t pos() const { return pos_; }

 private:
  std::span<const uint8_t> in_;
  size_t pos_ = 0;
};

}  // namespace

absl::Status OuterOptions::Validate() const {
  if (inner_steps < 1) {
    return absl::InvalidArgumentError(fl::StrCat("inner_steps (H) is ", inner_steps, "; it must be at least 1"));
  }
  if (num_fragments < 1 || inner_steps % num_fragments != 0) {
    return absl::InvalidArgumentError(fl::StrCat("num_fragments (P) is ", num_fragments,
                                                 "; it must be at least 1 and divide inner_steps (H = ", inner_steps,
                                                 ") so that one fragment syncs every H/P steps"));
  }
  if (overlap_steps >= inner_steps / num_fragments) {
    return absl::InvalidArgumentError(fl::StrCat("overlap_steps (tau) is ", overlap_steps,
                                                 "; it must be below H/P = ", inner_steps / num_fragments,
                                                 " so that an exchange lands before the next one starts"));
  }
  if (!(mixing_alpha < 0.0 || (mixing_alpha >= 0.0 && mixing_alpha <= 1.0))) {
    return absl::InvalidArgumentError(
        fl::StrCat("mixing_alpha is ", mixing_alpha, "; use a value in [0, 1] (or leave it unset for the default)"));
  }
  return absl::OkStatus();
}

absl::Status MixLocal(float alpha, std::span<const float> global, std::span<float> local) {
  if (global.size() != local.size()) {
    return absl::InvalidArgumentError(
        fl::StrCat("mixing: global has ", global.size(), " values but local has ", local.size()));
  }
  const float beta = 1.0f - alpha;
  for (size_t i = 0; i < local.size(); ++i) local[i] = alpha * local[i] + beta * global[i];
  return absl::OkStatus();
}

OuterState::OuterState(std::shared_ptr<const core::ModelSpec> spec, core::FragmentPlan plan,
                       core::FragmentSchedule schedule, OuterOptions options, std::vector<float> global,
                       std::vector<std::unique_ptr<core::ServerOptimizer>> optimizers)
    : spec_(std::move(spec)),
      plan_(std::move(plan)),
      schedule_(std::move(schedule)),
      options_(std::move(options)),
      alpha_(static_cast<float>(options_.EffectiveAlpha())),
      global_(std::move(global)),
      optimizers_(std::move(optimizers)) {}

absl::StatusOr<OuterState> OuterState::Create(std::shared_ptr<const core::ModelSpec> spec,
                                              std::vector<float> initial_global, const OuterOptions& options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  if (spec == nullptr) return absl::InvalidArgumentError("OuterState::Create: no model spec");
  if (initial_global.size() != spec->num_elements()) {
    return absl::InvalidArgumentError(fl::StrCat("initial global model has ", initial_global.size(),
                                                 " values; the model spec has ", spec->num_elements()));
  }
  if (absl::Status s = core::CheckFinite(initial_global, "initial global model", spec.get()); !s.ok()) return s;
  absl::StatusOr<core::FragmentPlan> plan = core::FragmentPlan::Create(*spec, options.num_fragments, options.strategy);
  if (!plan.ok()) return plan.status();
  absl::StatusOr<core::FragmentSchedule> schedule =
      core::FragmentSchedule::Create(options.inner_steps, options.num_fragments, options.overlap_steps);
  if (!schedule.ok()) return schedule.status();
  std::vector<std::unique_ptr<core::ServerOptimizer>> optimizers;
  for (const core::Fragment& fragment : plan->fragments()) {
    absl::StatusOr<std::unique_ptr<core::ServerOptimizer>> opt =
        core::MakeServerOptimizer(options.outer_optimizer, fragment.num_elements);
    if (!opt.ok()) return opt.status();
    optimizers.push_back(std::move(*opt));
  }
  return OuterState(std::move(spec), std::move(*plan), std::move(*schedule), options, std::move(initial_global),
                    std::move(optimizers));
}

absl::Status OuterState::PseudoGradient(size_t fragment, std::span<const float> local_model,
                                        std::span<float> out) const {
  if (fragment >= plan_.num_fragments()) {
    return absl::InvalidArgumentError(
        fl::StrCat("fragment ", fragment, " out of range (P = ", plan_.num_fragments(), ")"));
  }
  if (local_model.size() != global_.size()) {
    return absl::InvalidArgumentError(
        fl::StrCat("local model has ", local_model.size(), " values; expected ", global_.size()));
  }
  if (out.size() != fragment_size(fragment)) {
    return absl::InvalidArgumentError(fl::StrCat("pseudo-gradient buffer for fragment ", fragment, " has ", out.size(),
                                                 " values; expected ", fragment_size(fragment)));
  }
  size_t k = 0;
  for (const core::ElementRange& r : plan_.fragment(fragment).ranges) {
    for (uint64_t i = r.offset; i < r.offset + r.num_elements; ++i) out[k++] = global_[i] - local_model[i];
  }
  return absl::OkStatus();
}

absl::Status OuterState::ApplyOuterStep(size_t fragment, std::span<const float> mean_pseudo_grad) {
  if (fragment >= plan_.num_fragments()) {
    return absl::InvalidArgumentError(
        fl::StrCat("fragment ", fragment, " out of range (P = ", plan_.num_fragments(), ")"));
  }
  scratch_.resize(fragment_size(fragment));
  if (absl::Status s = plan_.Gather(fragment, global_, scratch_); !s.ok()) return s;
  if (absl::Status s = optimizers_[fragment]->Step(scratch_, mean_pseudo_grad); !s.ok()) return s;
  return plan_.Scatter(fragment, scratch_, global_);
}

absl::Status OuterState::MixInto(size_t fragment, std::span<float> local_model) const {
  if (fragment >= plan_.num_fragments()) {
    return absl::InvalidArgumentError(
        fl::StrCat("fragment ", fragment, " out of range (P = ", plan_.num_fragments(), ")"));
  }
  if (local_model.size() != global_.size()) {
    return absl::InvalidArgumentError(
        fl::StrCat("local model has ", local_model.size(), " values; expected ", global_.size()));
  }
  for (const core::ElementRange& r : plan_.fragment(fragment).ranges) {
    absl::Status s = MixLocal(alpha_, std::span<const float>(global_).subspan(r.offset, r.num_elements),
                              local_model.subspan(r.offset, r.num_elements));
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status OuterState::CopyGlobalInto(std::span<float> local_model) const {
  if (local_model.size() != global_.size()) {
    return absl::InvalidArgumentError(
        fl::StrCat("local model has ", local_model.size(), " values; expected ", global_.size()));
  }
  std::copy(global_.begin(), global_.end(), local_model.begin());
  return absl::OkStatus();
}

uint64_t OuterState::total_outer_steps() const {
  uint64_t n = 0;
  for (const auto& opt : optimizers_) n += opt->step_count();
  return n;
}

uint64_t OuterState::Hash() const {
  // The serialized image is exactly "everything that must agree", so hash it (without its own checksum).
  std::vector<uint8_t> image = Serialize();
  return core::Checksum64(std::span<const uint8_t>(image.data(), image.size() - sizeof(uint64_t)));
}

std::vector<uint8_t> OuterState::Serialize() const {
  std::vector<uint8_t> out;
  out.reserve(64 + 2 * global_.size() * sizeof(float));
  Writer w(&out);
  w.Put<uint32_t>(kImageMagic);
  w.Put<uint32_t>(kImageVersion);
  w.Put<uint64_t>(spec_->fingerprint());
  w.Put<uint32_t>(static_cast<uint32_t>(optimizers_.size()));
  for (const auto& opt : optimizers_) {
    core::ServerOptimizerState state = opt->ExportState();
    w.PutString(state.optimizer);
    w.Put<uint64_t>(state.step_count);
    w.Put<uint32_t>(static_cast<uint32_t>(state.buffers.size()));
    for (const core::NamedBuffer& b : state.buffers) {
      w.PutString(b.name);
      w.PutFloats(b.values);
    }
  }
  w.PutFloats(global_);
  const uint64_t checksum = core::Checksum64(out);
  w.Put<uint64_t>(checksum);
  return out;
}

absl::Status OuterState::Restore(std::span<const uint8_t> image) {
  auto corrupt = [&](std::string_view what) {
    return absl::DataLossError(fl::StrCat("outer-state image (", image.size(), " bytes) is corrupt: ", what,
                                          "; fetch it again from another island"));
  };
  if (image.size() < 3 * sizeof(uint64_t)) return corrupt("too short");
  uint64_t stored_checksum = 0;
  std::memcpy(&stored_checksum, image.data() + image.size() - sizeof(uint64_t), sizeof(uint64_t));
  if (core::Checksum64(image.first(image.size() - sizeof(uint64_t))) != stored_checksum) return corrupt("bad checksum");
  Reader r(image.first(image.size() - sizeof(uint64_t)));
  uint32_t magic = 0, version = 0, num_fragments = 0;
  uint64_t fingerprint = 0;
  if (!r.Get(&magic) || magic != kImageMagic) return corrupt("bad magic");
  if (!r.Get(&version) || version != kImageVersion) return corrupt(fl::StrCat("unknown version ", version));
  if (!r.Get(&fingerprint)) return corrupt("truncated header");
  if (fingerprint != spec_->fingerprint()) {
    return absl::FailedPreconditionError(
        fl::StrCat("outer-state image is for model ", core::FingerprintToHex(fingerprint), " but this island runs ",
                   spec_->FingerprintHex(), "; start every island with the same model and options"));
  }
  if (!r.Get(&num_fragments) || num_fragments != optimizers_.size()) {
    return absl::FailedPreconditionError(
        fl::StrCat("outer-state image has ", num_fragments, " fragments but this island uses ", optimizers_.size()));
  }
  std::vector<core::ServerOptimizerState> states(num_fragments);
  for (core::ServerOptimizerState& state : states) {
    uint32_t num_buffers = 0;
    if (!r.GetString(&state.optimizer) || !r.Get(&state.step_count) || !r.Get(&num_buffers)) {
      return corrupt("truncated optimizer state");
    }
    state.buffers.resize(num_buffers);
    for (core::NamedBuffer& b : state.buffers) {
      if (!r.GetString(&b.name) || !r.GetFloats(&b.values)) return corrupt("truncated optimizer buffer");
    }
  }
  std::vector<float> global;
  if (!r.GetFloats(&global)) return corrupt("truncated global parameters");
  if (global.size() != global_.size()) {
    return corrupt(fl::StrCat("global parameters have ", global.size(), " values; expected ", global_.size()));
  }
  // Check every fragment's state on a scratch optimizer before touching ours: all or nothing.
  for (size_t f = 0; f < states.size(); ++f) {
    absl::StatusOr<std::unique_ptr<core::ServerOptimizer>> probe =
        core::MakeServerOptimizer(options_.outer_optimizer, fragment_size(f));
    if (!probe.ok()) return probe.status();
    if (absl::Status s = (*probe)->ImportState(states[f]); !s.ok()) return s;
  }
  for (size_t f = 0; f < states.size(); ++f) {
    if (absl::Status s = optimizers_[f]->ImportState(states[f]); !s.ok()) return s;
  }
  global_ = std::move(global);
  return absl::OkStatus();
}

}  // namespace fl::diloco
