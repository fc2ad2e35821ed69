#include "fl/training/script_model.h"

#include <torch/script.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <sstream>
#include <vector>
#include <system_error>

#include "absl/strings/str_join.h"
#include "fl/training/torch_models.h"
#include "fl/core/str_cat.h"
#include "fl/formats/torchscript_archive.h"
#include "tensor_checks.h"

namespace fl::training {
namespace {

constexpr std::string_view kExportHint =
    "export the model in PyTorch with torch.jit.script(model).save(PATH) or torch.jit.trace(model, "
    "example_input).save(PATH)";

std::string Join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : fl::StrCat(prefix, ".", name);
}

// The forward's schema and, for traced files that recorded them, the input's sizes.
std::string InputSignature(const torch::jit::Module& module) {
  auto method = module.find_method("forward");
  if (!method.has_value()) return "";
  std::ostringstream schema;
  schema << method->function().getSchema();
  std::string signature = schema.str();
  const auto& inputs = method->graph()->inputs();
  for (size_t i = 1; i < inputs.size(); ++i) {  // input 0 is self
    auto tensor_type = inputs[i]->type()->cast<c10::TensorType>();
    if (tensor_type == nullptr) continue;
    auto sizes = tensor_type->sizes().concrete_sizes();
    if (sizes.has_value()) {
      signature += fl::StrCat("; input ", i - 1, " traced with shape [", absl::StrJoin(*sizes, ", "), "]");
    }
  }
  return signature;
}

}  // namespace

std::string FirstLineOf(const std::exception& error) {
  const std::string message = error.what();
  std::vector<std::string> lines;
  for (size_t begin = 0; begin < message.size();) {
    size_t end = message.find('\n', begin);
    if (end == std::string::npos) end = message.size();
    std::string line = message.substr(begin, end - begin);
    if (line.find_first_not_of(' ') != std::string::npos) lines.push_back(std::move(line));
    begin = end + 1;
  }
  if (lines.empty()) return message;
  // An error inside a TorchScript forward starts with "The following operation failed in the TorchScript
  // interpreter." and ends with the exception itself ("RuntimeError: Expected 4D input ..."); the user's own
  // line is the first frame of the original-code traceback. Say those two things.
  if (lines.front().find("TorchScript interpreter") != std::string::npos && lines.size() > 1) {
    std::string summary = lines.back();
    for (size_t i = 0; i + 1 < lines.size(); ++i) {
      if (lines[i].find("original code") == std::string::npos) continue;
      const std::string& frame = lines[i + 1];
      const size_t file = frame.find("File ");
      if (file != std::string::npos) summary += fl::StrCat(" (at ", frame.substr(file + 5), ")");
      break;
    }
    return summary;
  }
  // c10::Error::what() carries a C++ backtrace after the first line, which users do not need.
  return lines.front();
}

absl::StatusOr<ScriptModel> LoadScriptModel(const std::string& path, torch::Device device) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    return absl::NotFoundError(
        fl::StrCat("model file ", path, " not found (give the path of a TorchScript .pt file; ", kExportHint, ")"));
  }
  // The vet: the project's own torch-free reader checks the archive before LibTorch parses any of it (a FIFO or
  // device, sizes, strides and storage offsets inside their storages, duplicate entries, byte order, CRCs, finite
  // values, bounded pickles and code files). torch::jit::load trusts what a file declares: it has aborted on a
  // tensor larger than its storage, crashed on a code file of millions of lines, and loaded heap memory as weights
  // from a duplicate storage entry.
  if (absl::Status vetted = formats::CheckTorchScriptFile(path); !vetted.ok()) return vetted;
  ScriptModel model;
  model.path = path;
  try {
    model.module = torch::jit::load(path, device);
  } catch (const std::exception& e) {  // c10::Error, std::bad_alloc among them
    const std::string why = FirstLineOf(e);
    std::string hint(kExportHint);
    if (why.find("constants.pkl") != std::string::npos || why.find("code/") != std::string::npos) {
      hint = fl::StrCat(
          "this looks like a torch.save() file (a state_dict or a pickled nn.Module), which C++ cannot "
          "run; ",
          kExportHint);
    }
    return absl::InvalidArgumentError(
        fl::StrCat(path, " is not a TorchScript model LibTorch can load (", why, "); ", hint));
  }
  if (!model.module.find_method("forward").has_value()) {
    return absl::InvalidArgumentError(
        fl::StrCat(path, ": the TorchScript module has no forward method; ", kExportHint));
  }
  model.input_signature = InputSignature(model.module);

  std::vector<core::TensorSpec> specs;
  for (const auto& named : model.module.named_modules()) {
    auto add = [&](const std::string& name, const torch::Tensor& tensor, bool is_parameter) -> absl::Status {
      // Before anything reads the tensor's memory (the finite check below, CopyToFlat): it must lie in its
      // storage, whatever the file declared.
      if (absl::Status s = internal::CheckTensorInStorage(tensor, fl::StrCat("tensor '", name, "'")); !s.ok()) {
        return absl::InvalidArgumentError(fl::StrCat("model ", path, ": ", s.message(),
                                                     "; the file is corrupt or was altered: export the model again"));
      }
      auto dtype = ToCoreDType(tensor.scalar_type());
      if (!dtype.ok()) {
        return absl::InvalidArgumentError(fl::StrCat(path, ": tensor '", name, "' has dtype ",
                                                     c10::toString(tensor.scalar_type()),
                                                     ", which the flat update cannot carry (", dtype.status().message(),
                                                     "); convert it in PyTorch before exporting"));
      }
      if (absl::Status s = internal::CheckTensorFinite(tensor, fl::StrCat("tensor '", name, "'")); !s.ok()) {
        return absl::InvalidArgumentError(fl::StrCat("model ", path, ": ", s.message(),
                                                     "; a model starts from finite weights: export it again from a "
                                                     "model that has not diverged"));
      }
      core::TensorSpec spec;
      spec.name = name;
      spec.shape.assign(tensor.sizes().begin(), tensor.sizes().end());
      spec.dtype = *dtype;
      specs.push_back(std::move(spec));
      model.tensors.push_back(tensor);
      model.is_parameter.push_back(is_parameter);
      if (is_parameter && tensor.requires_grad()) model.parameters.push_back(tensor);
      return absl::OkStatus();
    };
    for (const auto& p : named.value.named_parameters(/*recurse=*/false)) {
      if (absl::Status s = add(Join(named.name, p.name), p.value, true); !s.ok()) return s;
    }
    for (const auto& b : named.value.named_buffers(/*recurse=*/false)) {
      if (absl::Status s = add(Join(named.name, b.name), b.value, false); !s.ok()) return s;
    }
  }
  if (model.parameters.empty()) {
    return absl::InvalidArgumentError(fl::StrCat(
        path, ": the model has no trainable parameters (", specs.size(),
        " tensors, none a parameter with requires_grad); nothing to train. Check that the layers are registered as "
        "submodules (nn.Module attributes, nn.ModuleList) and not frozen"));
  }
  auto spec = core::ModelSpec::Create(std::move(specs));
  if (!spec.ok()) return absl::InvalidArgumentError(fl::StrCat(path, ": ", spec.status().message()));
  model.spec = std::move(*spec);
  return model;
}

namespace {

std::string ShapeOf(torch::IntArrayRef sizes) { return fl::StrCat("[", absl::StrJoin(sizes, ", "), "]"); }

torch::Tensor ToTensor(const std::vector<uint8_t>& bytes, data::ElementType type, uint64_t n,
                       const std::vector<int64_t>& per_example) {
  std::vector<int64_t> shape{static_cast<int64_t>(n)};
  shape.insert(shape.end(), per_example.begin(), per_example.end());
  auto* data = const_cast<uint8_t*>(bytes.data());
  switch (type) {
    case data::ElementType::kUInt8: return torch::from_blob(data, shape, torch::kUInt8).to(torch::kFloat).div_(255.0);
    case data::ElementType::kFloat32: return torch::from_blob(data, shape, torch::kFloat).clone();
    case data::ElementType::kInt64: return torch::from_blob(data, shape, torch::kLong).clone();
  }
  return {};
}

}  // namespace

torch::Tensor InputsOf(const data::Examples& e) { return ToTensor(e.x, e.x_type, e.n, e.x_shape); }
torch::Tensor TargetsOf(const data::Examples& e) { return ToTensor(e.y, e.y_type, e.n, e.y_shape); }

absl::StatusOr<torch::Tensor> ScriptForward(ScriptModel& model, const torch::Tensor& x, std::string_view data_source) {
  c10::IValue out;
  try {
    out = model.module.forward({x});
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(fl::StrCat(
        "model ", model.path, ": forward failed on a batch of shape ", ShapeOf(x.sizes()), " (",
        c10::toString(x.scalar_type()), ", from ", data_source, "): ", FirstLineOf(e),
        model.input_signature.empty() ? "" : fl::StrCat(". The model's forward is ", model.input_signature)));
  }
  if (!out.isTensor()) {
    return absl::InvalidArgumentError(fl::StrCat("model ", model.path, ": forward returned ", out.tagKind(),
                                                 "; it must return one tensor (logits or predictions)"));
  }
  return out.toTensor();
}

absl::StatusOr<int64_t> ProbeScriptModel(ScriptModel& model, data::Task task, const torch::Tensor& x,
                                         const torch::Tensor& y, std::string_view data_source) {
  if (x.size(0) == 0) return absl::InvalidArgumentError(fl::StrCat(data_source, ": no examples to run the model on"));
  const int64_t b = std::min<int64_t>(2, x.size(0));
  torch::NoGradGuard no_grad;
  model.module.eval();
  auto out = ScriptForward(model, x.slice(0, 0, b), data_source);
  model.module.train();
  if (!out.ok()) return out.status();
  const torch::Tensor& o = *out;
  const torch::Tensor yb = y.slice(0, 0, b);
  auto misfit = [&](std::string_view expected) {
    return absl::InvalidArgumentError(fl::StrCat("model ", model.path, ": output of shape ", ShapeOf(o.sizes()),
                                                 " for a batch of ", b, " does not fit task ", data::TaskName(task),
                                                 ": expected ", expected, " (the batch's targets are ",
                                                 ShapeOf(yb.sizes()), " from ", data_source, ")"));
  };
  if (!o.is_floating_point()) return misfit("a floating-point output");
  switch (task) {
    case data::Task::kClassification:
      if (o.dim() != 2 || o.size(0) != b) return misfit("logits [B, C] with C >= 2 classes");
      if (o.size(1) < 2)
        return misfit("logits [B, C] with C >= 2 (a single output is a regression: --task regression)");
      return o.size(1);
    case data::Task::kNextToken: {
      if (o.dim() != 3 || o.size(0) != b || yb.dim() != 2 || o.size(1) != yb.size(1)) {
        return misfit("logits [B, T, V] with T the targets' length");
      }
      const int64_t vocab = o.size(2);
      // Input tokens are embedding indices: one >= V would fail inside the forward in the middle of training.
      const int64_t max_token = x.max().item<int64_t>();
      if (max_token >= vocab) {
        return absl::InvalidArgumentError(fl::StrCat(data_source, ": token id ", max_token,
                                                     " in the inputs is outside the model's vocabulary of ", vocab,
                                                     " (the size of its output's last dimension)"));
      }
      return vocab;
    }
    case data::Task::kRegression: {
      const bool same = o.sizes() == yb.sizes();
      const bool column = yb.dim() == 1 && o.dim() == 2 && o.size(0) == b && o.size(1) == 1;
      if (!same && !column) return misfit(fl::StrCat("predictions shaped like the targets ", ShapeOf(yb.sizes())));
      return 0;
    }
  }
  return 0;
}

TaskLoss ComputeTaskLoss(data::Task task, const torch::Tensor& output, const torch::Tensor& y) {
  namespace F = torch::nn::functional;
  TaskLoss b;
  switch (task) {
    case data::Task::kClassification:
      b.loss = F::cross_entropy(output, y);
      b.count = y.size(0);
      b.correct = output.detach().argmax(1).eq(y).sum();
      break;
    case data::Task::kNextToken: {
      const torch::Tensor logits = output.reshape({-1, output.size(-1)});
      const torch::Tensor targets = y.reshape({-1});
      b.loss = F::cross_entropy(logits, targets);
      b.count = targets.size(0);
      b.correct = logits.detach().argmax(1).eq(targets).sum();
      break;
    }
    case data::Task::kRegression: {
      const torch::Tensor pred = output.reshape(y.sizes());
      b.loss = F::mse_loss(pred, y);
      b.count = y.numel();
      b.abs_sum = (pred.detach() - y).abs().sum().to(torch::kDouble);
      break;
    }
  }
  b.sum = b.loss.detach().to(torch::kDouble) * static_cast<double>(b.count);
  return b;
}

}  // namespace fl::training
