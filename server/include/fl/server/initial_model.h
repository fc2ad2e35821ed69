// fl-server's --initial-model: the model an experiment starts from, read from either a checkpoint of ours or a
// TorchScript file exported in PyTorch (read without LibTorch, fl/formats/torchscript_archive.h).
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fl/server/checkpoint.h"

namespace fl::server {

// A path ending in ".pt" is a TorchScript model: the result is a round-0 checkpoint of its parameters and
// buffers (spec and values in the documented state_dict order, so clients loading the same file match its
// fingerprint), named after the file's stem as fl-client names such a model, with no optimizer state.
// Any other path is one of our checkpoints (LoadCheckpoint). Errors name the file.
// A model holding a NaN/Inf is refused (InvalidArgument naming the file, the tensor and the element).
absl::StatusOr<Checkpoint> LoadInitialModel(const std::string& path);

// What fl-server checks of the model it starts from (an --initial-model, or the checkpoint it resumes from)
// before anything starts, so that nothing on the way to the first download can fail on it: values that match
// the spec, all finite, and every tensor encodable by `downlink_codec` (fp16 refuses |x| > 65504). Errors name
// `path`, the tensor and the element, and say what to do.
absl::Status CheckStartModel(const Checkpoint& model, const std::string& path, std::string_view downlink_codec);

}  // namespace fl::server
