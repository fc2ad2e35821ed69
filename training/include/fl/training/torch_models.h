// The LibTorch side of the trainer: the models, their ModelSpec, flat copies in and out, dataset tensors.
//
// Models (1x28x28 grey-scale input, 10 logits out), by name:
//
//  "cnn" (model_name "cnn-fmnist"), 225,034 parameters:
//      conv1 (1->32, 3x3) - ReLU - maxpool 2   28 -> 26 -> 13
//      conv2 (32->64, 3x3) - ReLU - maxpool 2  13 -> 11 -> 5
//      fc1 (64*5*5 -> 128) - ReLU - fc2 (128 -> 10)
//    torch's default initialisation (kaiming-uniform, a = sqrt(5)). For speed on CPU the forward pass
//    pools before the ReLU and computes fc1 as a 5x5 convolution; both are exact rewrites (models.cc).
//
//  "squeezenet" (model_name "squeezenet1_1-fmnist"), SqueezeNet 1.1 (Iandola et al. 2016; torchvision's
//    squeezenet1_1) adapted to 1x28x28, 726,474 parameters. Parameter names are torchvision's
//    (features.<i>.squeeze.weight, classifier.1.bias, ...). The Fire modules (squeeze 1x1 -> ReLU ->
//    concat(expand1x1 -> ReLU, expand3x3 -> ReLU)), their widths and the positions of the max-pools are
//    SqueezeNet 1.1's; the adaptation is:
//      - the stem is Conv2d(1, 64, 3, stride 1, padding 1) instead of Conv2d(3, 64, 3, stride 2): a 28x28
//        image keeps its resolution into the first pool instead of being halved before it;
//      - so the three MaxPool2d(3, stride 2, ceil_mode) take 28 -> 14 -> 7 -> 3, and Fire 5-8 run at 3x3
//        (torchvision: 224 -> 111 -> 55 -> 27 -> 13);
//      - the classifier is Dropout 0.5, Conv2d(512, 10, 1), global average pool: SqueezeNet 1.1's without
//        the ReLU after the final conv. With that ReLU the logits cannot be negative and, from torchvision's
//        initialisation, SGD on Fashion-MNIST collapsed to all-zero logits (loss exactly ln 10) within ~150
//        steps at lr 0.01 (measured, with and without dropout); without it the same run learns.
//      - initialisation as torchvision's (final conv normal(0, 0.01), other convs kaiming-uniform, biases 0).
//    Without batch norm this network starts slowly: SGD lr ~0.01 with momentum 0.9 works, lr 0.05 stalls.
//
// Tensor order (the ModelSpec order) is the state_dict order: modules in pre-order, each module's own
// parameters then its own buffers (e.g. BatchNorm's running_mean, running_var, num_batches_tracked).
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fl/core/tensor_spec.h"
#include "fl/training/data/fashion_mnist.h"

namespace fl::training {

// A Fashion-MNIST classifier: [B, 1, 28, 28] float -> [B, 10] logits.
class TorchModel : public torch::nn::Module {
 public:
  using torch::nn::Module::Module;
  virtual torch::Tensor forward(torch::Tensor images) = 0;
  // "cnn-fmnist", "squeezenet1_1-fmnist".
  virtual std::string model_name() const = 0;
};

// Builds model `name` ("cnn" | "squeezenet") on the CPU after torch::manual_seed(seed): the same (name,
// seed) gives bit-identical weights. An unknown name is InvalidArgument listing the known ones.
absl::StatusOr<std::shared_ptr<TorchModel>> CreateTorchModel(std::string_view name, uint64_t seed);

// Every parameter and buffer of `module`, in state_dict order, with its dotted name.
std::vector<std::pair<std::string, torch::Tensor>> StateTensors(const torch::nn::Module& module);

// torch dtype -> core::DType (float, half, bfloat16, double, int64, int32, uint8); others are errors.
absl::StatusOr<core::DType> ToCoreDType(torch::ScalarType type);

// The ModelSpec of StateTensors(module).
absl::StatusOr<core::ModelSpec> ModelSpecOf(const torch::nn::Module& module);

// The module's tensors in spec order, after checking that the module has exactly the spec's tensors
// (names, order, shapes, dtypes); a mismatch is InvalidArgument naming the first differing tensor.
absl::StatusOr<std::vector<torch::Tensor>> BindTensors(const torch::nn::Module& module, const core::ModelSpec& spec);

// tensors (spec order, any device and dtype) -> flat fp32. `out` must hold spec.num_elements() values.
absl::Status CopyToFlat(std::span<const torch::Tensor> tensors, const core::ModelSpec& spec, std::span<float> out);
// flat fp32 -> tensors, in place (converted to each tensor's dtype and device; no autograd record).
absl::Status CopyFromFlat(std::span<const float> flat, const core::ModelSpec& spec,
                          std::span<const torch::Tensor> tensors);

// max_pool2d(input, 2) (kernel 2, stride 2, floor). For CPU float NCHW tensors a faster kernel than
// LibTorch 1.13's (same values, same gradients); elsewhere torch::max_pool2d.
torch::Tensor MaxPool2d2x2(const torch::Tensor& input);

// Images `indices` of `dataset` as a [n, 1, rows, cols] float tensor on the CPU, normalised
// ((x / 255 - kFashionMnistMean) / kFashionMnistStd); labels as a [n] int64 tensor.
torch::Tensor ImagesToTensor(const data::Dataset& dataset, std::span<const uint32_t> indices);
torch::Tensor LabelsToTensor(const data::Dataset& dataset, std::span<const uint32_t> indices);

}  // namespace fl::training
