// fl-server's --initial-model: the model an experiment starts from, read from either a checkpoint of ours or a
// TorchScript file exported in PyTorch (read without LibTorch, fl/formats/torchscript_archive.h).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "fl/server/checkpoint.h"

namespace fl::server {

// A path ending in ".pt" is a TorchScript model: the result is a round-0 checkpoint of its parameters and
// buffers (spec and values in the documented state_dict order, so clients loading the same file match its
// fingerprint), named after the file's stem as fl-client names such a model, with no optimizer state.
// Any other path is one of our checkpoints (LoadCheckpoint). Errors name the file.
absl::StatusOr<Checkpoint> LoadInitialModel(const std::string& path);

}  // namespace fl::server
