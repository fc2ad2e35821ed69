#include "fl/server/initial_model.h"

#include <filesystem>
#include <utility>

#include "fl/formats/torchscript_archive.h"

namespace fl::server {

absl::StatusOr<Checkpoint> LoadInitialModel(const std::string& path) {
  if (!path.ends_with(".pt")) return LoadCheckpoint(path);
  absl::StatusOr<formats::ScriptModelFile> model = formats::ReadTorchScriptModel(path);
  if (!model.ok()) return model.status();
  Checkpoint ckpt;
  ckpt.round = 0;
  ckpt.model_version = 0;
  ckpt.spec = std::move(model->spec);
  // fl-client reports a TorchScript model by the file's stem (ScriptTrainer::model_name).
  ckpt.model_name = std::filesystem::path(path).stem().string();
  ckpt.values = std::move(model->values);
  return ckpt;
}

}  // namespace fl::server
