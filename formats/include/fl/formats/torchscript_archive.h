// Reading a TorchScript model file (torch.jit.script(m).save(p) / torch.jit.trace(m, x).save(p)) WITHOUT
// LibTorch: fl-server takes its initial model from it, and needs the same spec (names, shapes, dtypes,
// order) as the clients that load the file with torch::jit::load, so that their fingerprints match.
//
// What is read: the archive's `<archive>/data.pkl` (the pickled module tree, see pickle.h), the class
// headers in `<archive>/code/__torch__/....py` (only their `__parameters__ = [...]` and
// `__buffers__ = [...]` lines: which attributes are parameters and which are buffers) and the tensor
// storages `<archive>/data/<key>`. No code is run or parsed beyond those two lines per class.
//
// Tensor order (the documented parameter order of docs/models-and-data.md; equal to the keys of the
// Python module's state_dict()): modules in pre-order from the root, a module's submodules in the order
// of their attributes in its pickled state (the order of the class's attributes); for each module first
// its own parameters, then its own buffers, each in attribute order. A parameter or buffer that is None
// (Linear(bias=False)) is left out; tensor attributes that are neither parameters nor buffers are not part
// of the model. Names are dotted paths: "features.1.running_mean". A module reachable under two names
// (tied weights, a shared submodule) appears under both, as in state_dict().
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fl/core/tensor_spec.h"

namespace fl::formats {

struct ScriptTensor {
  std::string name;
  bool is_parameter = false;  // false: a buffer (BatchNorm's running statistics, counters)
  core::DType dtype = core::DType::kFloat32;
  std::vector<int64_t> shape;
};

struct ScriptModelFile {
  core::ModelSpec spec;               // every parameter and buffer, in the order above
  std::vector<ScriptTensor> tensors;  // same order, with the parameter/buffer role
  // Flat fp32 image in spec order, each tensor in C order whatever its strides in the file;
  // float16/bfloat16/float64/int64/int32/uint8 values converted to float.
  std::vector<float> values;
  std::string root_class;  // the root module's TorchScript class, e.g. "__torch__.Net"
};

// Errors name the file and say what to do: not a regular file, not a ZIP or not a TorchScript archive (a
// torch.save() state_dict, for instance: export with torch.jit.script/trace), a model without parameters, a
// tensor whose storage is missing or shorter than the tensor or its storage record needs (checked arithmetic),
// a dtype other than float32, float16, bfloat16, float64, int64, int32 and uint8 (naming the tensor), quantized
// tensors, a parameter or buffer holding NaN or Inf (in float32, which fl carries), a CRC mismatch in what is
// read, an entry named twice, a big-endian byte order, and anything over the limits of docs/input-limits.md.
// Memory: a bounded multiple of the file's size (the fp32 image, one storage at a time, the pickle's values).
absl::StatusOr<ScriptModelFile> ReadTorchScriptModel(const std::string& path);

// What fl-client runs before LibTorch ever loads the user's archive (torch::jit::load trusts the file: an
// offset past a storage, a short duplicate storage entry or a newline bomb in a code file crash it or load
// heap memory as weights). Checks everything ReadTorchScriptModel checks and, over the whole archive:
//   - every entry's CRC-32 and size (streamed, one chunk in memory);
//   - every tensor LibTorch would rebuild, in data.pkl (attributes that are neither parameters nor buffers
//     included) and in constants.pkl: its storage record exists, holds the element count its reference
//     declares, and the tensor's sizes, strides (none negative) and offset stay inside it (checked
//     arithmetic), one storage never referenced with two types or counts;
//   - the TorchScript sources LibTorch's parser reads (code/**.py): size, line count, consecutive blank
//     lines, bracket nesting and indentation under the limits of docs/input-limits.md (LibTorch 1.13's parser
//     recurses per blank line and per bracket: 60,000 blank lines or 10,000 nested brackets overflow an 8 MiB
//     stack);
//   - the other pickles it reads (constants.pkl, *.debug_pkl) under the pickle limits.
// Errors (InvalidArgument, NotFound, DataLoss...) name the file and, where there is one, the entry or tensor.
// Memory: a bounded multiple of the file's size, as ReadTorchScriptModel.
absl::Status CheckTorchScriptFile(const std::string& path);

}  // namespace fl::formats
