// TorchScript models: a user's PyTorch model, exported with torch.jit.script(m) or torch.jit.trace(m, x) and
// .save("model.pt"), loaded with torch::jit::load and trained in C++ (fl-client's ScriptTrainer, fl-island).
//
// The flat layout (the ModelSpec, what travels to the server) is every parameter AND buffer, in this order:
// modules in pre-order from the root (submodules in the order of the module's attributes), and for each module
// first its own parameters, then its own buffers, each in attribute order. That is the order of PyTorch's
// `model.state_dict().keys()`, and the order fl-server's torch-free reader (fl/formats/torchscript_archive.h)
// produces from the same file, so a server started with --initial-model model.pt admits these clients.
// Names are state_dict's dotted names ("features.0.weight", "bn1.num_batches_tracked").
#pragma once

#include <torch/script.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "fl/core/tensor_spec.h"
#include "fl/training/data/client_data.h"

namespace fl::training {

struct ScriptModel {
  std::string path;
  torch::jit::Module module;
  core::ModelSpec spec;
  std::vector<torch::Tensor> tensors;     // spec order: the module's own tensors (writing them changes the model)
  std::vector<bool> is_parameter;         // per spec tensor: a parameter (true) or a buffer (false)
  std::vector<torch::Tensor> parameters;  // the trainable ones (parameters with requires_grad), spec order
  // The forward's declared input ("Tensor x"), and the input sizes the file recorded when it was traced with
  // shapes; empty when unknown. For error messages only.
  std::string input_signature;
};

// Loads `path` onto `device`. Errors name the file: not found, not a TorchScript archive (e.g. a
// torch.save(state_dict) file, a corrupt or truncated file: says how to export), no forward method, a tensor
// dtype the flat buffer cannot carry, no trainable parameter.
absl::StatusOr<ScriptModel> LoadScriptModel(const std::string& path, torch::Device device);

// What went wrong, in one line, from a LibTorch exception: the first line of a C++ error (the rest is a
// backtrace), or for an error inside a TorchScript forward the exception itself and the user's source line.
std::string FirstLineOf(const std::exception& error);

// One split's inputs and targets as CPU tensors [n, ...]: uint8 features become float32 x / 255, float32 stays
// as it is, tokens and labels are int64.
torch::Tensor InputsOf(const data::Examples& examples);
torch::Tensor TargetsOf(const data::Examples& examples);

// model.forward(x), with errors that show the batch's shape, the data's source and the forward's signature; a
// forward that does not return one tensor is an error.
absl::StatusOr<torch::Tensor> ScriptForward(ScriptModel& model, const torch::Tensor& x, std::string_view data_source);

// Runs the first two examples of (x, y) through the model in eval mode without autograd and checks the output
// against the task (see script_trainer.h). Returns the number of classes (classification) or the vocabulary
// size (next-token; the inputs' token ids are checked against it), 0 for regression.
absl::StatusOr<int64_t> ProbeScriptModel(ScriptModel& model, data::Task task, const torch::Tensor& x,
                                         const torch::Tensor& y, std::string_view data_source);

// A task's loss on one batch.
struct TaskLoss {
  torch::Tensor loss;     // mean over the batch's predictions, with autograd
  torch::Tensor sum;      // the summed loss, double, detached (evaluation)
  torch::Tensor correct;  // int64 count of correct predictions (classification, next-token); undefined otherwise
  torch::Tensor abs_sum;  // double summed absolute error (regression); undefined otherwise
  int64_t count = 0;      // predictions: examples (classification), tokens (next-token), target elements (regression)
};
// classification: cross-entropy of logits [B, C] vs labels [B]; next-token: cross-entropy over every position of
// logits [B, T, V] vs tokens [B, T]; regression: mean squared error of predictions reshaped to the targets.
TaskLoss ComputeTaskLoss(data::Task task, const torch::Tensor& output, const torch::Tensor& y);

}  // namespace fl::training
