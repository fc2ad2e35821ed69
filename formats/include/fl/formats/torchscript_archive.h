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

// Errors name the file and say what to do: not a ZIP or not a TorchScript archive (a torch.save()
// state_dict, for instance: export with torch.jit.script/trace), a model without parameters, a tensor
// whose storage is missing or shorter than the tensor needs, a dtype other than float32, float16,
// bfloat16, float64, int64, int32 and uint8 (naming the tensor), quantized tensors.
absl::StatusOr<ScriptModelFile> ReadTorchScriptModel(const std::string& path);

}  // namespace fl::formats
