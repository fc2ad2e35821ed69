// The round engine's global model (engine_model.h): adopt, step, commit, payload and checkpoint file.
#include "engine_model.h"

#include <cstdlib>
#include <filesystem>
#include <system_error>
#include <utility>

#include <spdlog/spdlog.h>

#include "fl/core/checksum.h"
#include "fl/core/log_format.h"
#include "fl/core/str_cat.h"
#include "fl/proto/convert.h"
#include "fl/server/checkpoint.h"

namespace fl::server::engine {

absl::Status GlobalModel::Configure(std::string_view uplink_codec, std::string_view uplink_codec_policy,
                                    std::string_view downlink_codec, std::string optimizer) {
  GlobalModel& m = *this;
  auto up = core::MakeCodec(uplink_codec);
  if (!up.ok()) return absl::InvalidArgumentError(fl::StrCat("--uplink-codec: ", up.status().message()));
  auto down = core::MakeCodec(downlink_codec);
  if (!down.ok()) return absl::InvalidArgumentError(fl::StrCat("--downlink-codec: ", down.status().message()));
  m.uplink_codec_ = std::move(*up);
  m.downlink_codec_ = std::move(*down);
  auto policy = core::ParseCodecPolicy(uplink_codec_policy, uplink_codec);
  if (!policy.ok()) return policy.status();
  m.codec_policy_ = std::move(*policy);
  for (const std::string& name : m.codec_policy_.Codecs()) {
    auto codec = core::MakeCodec(name);
    if (!codec.ok()) return codec.status();  // ParseCodecPolicy made each once: not reached
    m.uplink_codecs_.emplace(name, std::move(*codec));
  }
  m.optimizer_spec_ = std::move(optimizer);
  return absl::OkStatus();
}

absl::Status GlobalModel::Adopt(core::ModelSpec spec, std::string name, std::vector<float> values, uint64_t version,
                                uint64_t round) {
  if (values.size() != spec.num_elements()) {
    return absl::InvalidArgumentError(
        fl::StrCat("model has ", values.size(), " values but its spec needs ", spec.num_elements()));
  }
  auto opt = core::MakeServerOptimizer(optimizer_spec_, values.size());
  if (!opt.ok()) return opt.status();
  optimizer_ = std::move(*opt);
  spec_ = std::make_shared<const core::ModelSpec>(std::move(spec));
  name_ = std::move(name);
  values_ = std::move(values);
  version_ = version;
  PublishPayload(round);
  return absl::OkStatus();
}

const std::string& GlobalModel::UplinkCodecFor(std::string_view link_kind,
                                               std::optional<double> uplink_bytes_per_s) const {
  return core::ChooseUplinkCodec(codec_policy_, link_kind, uplink_bytes_per_s);
}

const core::Codec& GlobalModel::UplinkCodecOf(std::string_view name) const {
  if (name.empty()) return *uplink_codec_;
  if (auto it = uplink_codecs_.find(name); it != uplink_codecs_.end()) return *it->second;
  return *uplink_codec_;  // every codec a task can name is in uplink_codecs_: not reached
}

absl::Status GlobalModel::PseudoGradientOfWeights(const core::Codec& codec, std::span<const uint8_t> payload,
                                                  std::string_view source, std::vector<float>& out) const {
  out.resize(values_.size());
  absl::Status s = codec.Decode(payload, out, kVerifiedUpload);
  if (s.ok()) s = core::CheckFinite(out, source, spec_.get());
  if (!s.ok()) return s;
  for (size_t i = 0; i < out.size(); ++i) out[i] = values_[i] - out[i];
  return absl::OkStatus();
}

absl::Status GlobalModel::Step(core::Aggregator& aggregator, std::string_view what, const Perturb& perturb) {
  if (aggregator.num_clipped() > 0) {
    spdlog::info("{}: {} of {} updates scaled down to the update norm bound ({})", what, aggregator.num_clipped(),
                 aggregator.num_updates(), aggregator.norm_clip().ToString());
  }
  return StepFrom(aggregator.Finish(), what, perturb);
}

absl::Status GlobalModel::StepFrom(absl::StatusOr<std::vector<float>> pseudo_grad, std::string_view what,
                                   const Perturb& perturb) {
  if (pseudo_grad.ok() && pseudo_grad->size() != values_.size()) {
    return absl::InternalError(
        fl::StrCat(what, ": an aggregate of ", pseudo_grad->size(), " values for a model of ", values_.size()));
  }
  if (pseudo_grad.ok() && perturb) {
    if (absl::Status s = perturb(*pseudo_grad); !s.ok()) return s;
  }
  // Integer tensors are client-local state, never averaged as floats: whatever the aggregator and the server
  // optimizer made of them, they keep the previous global's values.
  absl::StatusOr<std::vector<float>> integer_values = core::SaveIntegerTensors(*spec_, values_);
  absl::Status step = !pseudo_grad.ok()      ? pseudo_grad.status()
                      : !integer_values.ok() ? integer_values.status()
                                             : optimizer_->Step(values_, *pseudo_grad);
  if (step.ok()) step = core::RestoreIntegerTensors(*spec_, *integer_values, values_);
  // Every update value is bounded (--max-update-value), so the mean is, and so each step: a non-finite model can
  // only come from the server's own settings (an absurd learning rate). It is never published nor checkpointed.
  if (step.ok()) step = core::CheckFinite(values_, fl::StrCat("the global model after ", what), spec_.get());
  return step;
}

void GlobalModel::Commit(uint64_t round) {
  ++version_;
  PublishPayload(round);
}

void GlobalModel::PublishPayload(uint64_t round) {
  // Drop our reference to the previous version first: downloads still streaming it keep it alive, and when
  // none are (the usual case at a commit) its memory is reused for the new one.
  payload_.reset();
  auto payload = std::make_shared<ModelPayload>();
  payload->model_version = version_;
  payload->round = round;
  payload->spec = proto::ToProto(*spec_, name_);
  payload->codec = std::string(downlink_codec_->name());
  if (absl::Status s = downlink_codec_->Encode(values_, &payload->bytes); !s.ok()) {
    // The global model is finite by construction (Adopt's callers and Step check it); failing here is a bug.
    spdlog::critical("cannot encode the global model: {}", s.message());
    std::abort();
  }
  payload->checksum = core::TransferChecksum64(payload->bytes);
  payload_ = std::move(payload);
}

absl::StatusOr<std::optional<instrumentation::CheckpointRecord>> GlobalModel::WriteCheckpoint(
    const CheckpointTarget& target) const {
  if (target.dir.empty()) return std::nullopt;
  Checkpoint ckpt;
  ckpt.experiment_id = target.experiment_id;
  ckpt.round = target.round;
  ckpt.model_version = version_;
  ckpt.spec = *spec_;
  ckpt.model_name = name_;
  ckpt.values = values_;
  ckpt.optimizer = optimizer_->ExportState();
  ckpt.created_unix_ms = target.created_unix_ms;
  if (target.task.has_value()) ckpt.task = std::string(core::TaskName(*target.task));
  ckpt.privacy = target.privacy;
  const std::string path = CheckpointPath(target.dir, target.round);
  if (absl::Status s = SaveCheckpoint(ckpt, path); !s.ok()) return s;
  instrumentation::CheckpointRecord rec;
  rec.experiment_id = target.experiment_id;
  rec.round = static_cast<int64_t>(target.round);
  rec.model_version = static_cast<int64_t>(version_);
  rec.path = path;
  std::error_code ec;
  rec.bytes = static_cast<int64_t>(std::filesystem::file_size(path, ec));
  rec.fingerprint = spec_->FingerprintHex();
  rec.created_unix_ms = ckpt.created_unix_ms;
  return rec;
}

}  // namespace fl::server::engine
