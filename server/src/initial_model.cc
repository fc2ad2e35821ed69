#include "fl/server/initial_model.h"

#include <filesystem>
#include <utility>
#include <vector>

#include "fl/core/codec.h"
#include "fl/core/str_cat.h"
#include "fl/formats/torchscript_archive.h"

namespace fl::server {

absl::StatusOr<Checkpoint> LoadInitialModel(const std::string& path) {
  if (!path.ends_with(".pt")) return LoadCheckpoint(path);  // refuses NaN/Inf itself
  absl::StatusOr<formats::ScriptModelFile> model = formats::ReadTorchScriptModel(path);
  if (!model.ok()) return model.status();
  Checkpoint ckpt;
  ckpt.round = 0;
  ckpt.model_version = 0;
  ckpt.spec = std::move(model->spec);
  // fl-client reports a TorchScript model by the file's stem (ScriptTrainer::model_name).
  ckpt.model_name = std::filesystem::path(path).stem().string();
  ckpt.values = std::move(model->values);
  // A model that is NaN/Inf from the start would poison every round, and no codec can send it to clients.
  if (std::optional<std::string> bad = FindNonFinite(ckpt.values, &ckpt.spec); bad.has_value()) {
    return absl::InvalidArgumentError(fl::StrCat(
        path, ": ", *bad, "; a model must hold finite values: export it again from a model that did not diverge"));
  }
  return ckpt;
}

absl::Status CheckStartModel(const Checkpoint& model, const std::string& path, std::string_view downlink_codec) {
  if (model.values.size() != model.spec.num_elements()) {
    return absl::InvalidArgumentError(
        fl::StrCat(path, ": ", model.values.size(), " values for a model of ", model.spec.num_elements()));
  }
  if (std::optional<std::string> bad = FindNonFinite(model.values, &model.spec); bad.has_value()) {
    return absl::InvalidArgumentError(fl::StrCat(path, ": ", *bad, "; a model must hold finite values"));
  }
  absl::StatusOr<std::unique_ptr<core::Codec>> codec = core::MakeCodec(downlink_codec);
  if (!codec.ok()) return codec.status();
  // Tensor by tensor, so that the error names the tensor: a value the codec cannot represent (fp16 beyond
  // 65504) would otherwise stop fl-server when it publishes the model to clients.
  std::vector<uint8_t> bytes;
  for (const core::TensorSpec& t : model.spec.tensors()) {
    const std::span<const float> values(model.values.data() + t.offset, t.num_elements());
    if (absl::Status s = (*codec)->Encode(values, &bytes); !s.ok()) {
      return absl::InvalidArgumentError(fl::StrCat(path, ": tensor '", t.name, "': ", fl::ToStd(s.message()),
                                                   "; the downlink codec ", downlink_codec,
                                                   " cannot send this model to clients: choose another "
                                                   "--downlink-codec (bf16 or fp32)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace fl::server
