#include "fl/training/torch_models.h"

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_join.h"
#include "fl/training/torch_trainer.h"
#include "fl/core/str_cat.h"
#include "tensor_checks.h"

namespace fl::training {
namespace {

namespace nn = torch::nn;

// 2x2 / stride 2 max pooling (floor) of a CPU float NCHW tensor, as an autograd function. LibTorch 1.13's
// NCHW max_pool2d kernel is scalar and, in training, cost the CNN about as much as its second convolution;
// this one is several times faster. Values and gradient routing are max_pool2d's: within a window (scanned
// row-major) an element replaces the maximum when it is greater or NaN, and the gradient of an output goes
// to its maximum only. A trailing odd row or column is dropped (and gets a zero gradient).
class MaxPool2x2 : public torch::autograd::Function<MaxPool2x2> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& input_any) {
    const torch::Tensor input = input_any.contiguous();
    const int64_t planes = input.size(0) * input.size(1);
    const int64_t h = input.size(2);
    const int64_t w = input.size(3);
    const int64_t oh = h / 2;
    const int64_t ow = w / 2;
    torch::Tensor output = torch::empty({input.size(0), input.size(1), oh, ow}, input.options());
    torch::Tensor argmax = torch::empty({input.size(0), input.size(1), oh, ow}, input.options().dtype(torch::kByte));
    const float* in = input.data_ptr<float>();
    float* out = output.data_ptr<float>();
    uint8_t* arg = argmax.data_ptr<uint8_t>();
    at::parallel_for(0, planes, 1, [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p) {
        for (int64_t i = 0; i < oh; ++i) {
          const float* r0 = in + p * h * w + 2 * i * w;
          const float* r1 = r0 + w;
          float* o = out + (p * oh + i) * ow;
          uint8_t* a = arg + (p * oh + i) * ow;
          for (int64_t j = 0; j < ow; ++j) {
            // Branch-free (the comparisons are data-dependent and unpredictable); v != v is isnan(v).
            float m = r0[2 * j];
            uint8_t k = 0;
            const float v1 = r0[2 * j + 1];
            const float v2 = r1[2 * j];
            const float v3 = r1[2 * j + 1];
            const bool c1 = (v1 > m) | (v1 != v1);
            m = c1 ? v1 : m;
            k = c1 ? uint8_t{1} : k;
            const bool c2 = (v2 > m) | (v2 != v2);
            m = c2 ? v2 : m;
            k = c2 ? uint8_t{2} : k;
            const bool c3 = (v3 > m) | (v3 != v3);
            m = c3 ? v3 : m;
            k = c3 ? uint8_t{3} : k;
            o[j] = m;
            a[j] = k;
          }
        }
      }
    });
    ctx->save_for_backward({argmax});
    ctx->saved_data["h"] = h;
    ctx->saved_data["w"] = w;
    return output;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const torch::Tensor argmax = ctx->get_saved_variables()[0];
    const torch::Tensor grad_out = grad_outputs[0].contiguous();
    const int64_t h = ctx->saved_data["h"].toInt();
    const int64_t w = ctx->saved_data["w"].toInt();
    const int64_t planes = argmax.size(0) * argmax.size(1);
    const int64_t oh = argmax.size(2);
    const int64_t ow = argmax.size(3);
    torch::Tensor grad_in = (h % 2 != 0 || w % 2 != 0)
                                ? torch::zeros({argmax.size(0), argmax.size(1), h, w}, grad_out.options())
                                : torch::empty({argmax.size(0), argmax.size(1), h, w}, grad_out.options());
    const float* g = grad_out.data_ptr<float>();
    const uint8_t* arg = argmax.data_ptr<uint8_t>();
    float* gi = grad_in.data_ptr<float>();
    at::parallel_for(0, planes, 1, [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p) {
        for (int64_t i = 0; i < oh; ++i) {
          float* r0 = gi + p * h * w + 2 * i * w;
          float* r1 = r0 + w;
          const float* go = g + (p * oh + i) * ow;
          const uint8_t* a = arg + (p * oh + i) * ow;
          for (int64_t j = 0; j < ow; ++j) {
            const float v = go[j];
            const uint8_t k = a[j];
            r0[2 * j] = k == 0 ? v : 0.0f;
            r0[2 * j + 1] = k == 1 ? v : 0.0f;
            r1[2 * j] = k == 2 ? v : 0.0f;
            r1[2 * j + 1] = k == 3 ? v : 0.0f;
          }
        }
      }
    });
    return {grad_in};
  }
};

}  // namespace

torch::Tensor MaxPool2d2x2(const torch::Tensor& input) {
  if (input.device().is_cpu() && input.scalar_type() == torch::kFloat && input.dim() == 4 &&
      input.layout() == torch::kStrided) {
    return MaxPool2x2::apply(input);
  }
  return torch::max_pool2d(input, 2);
}

namespace {

// The small CNN: conv(1->32,3)-relu-maxpool, conv(32->64,3)-relu-maxpool, fc(1600->128)-relu-fc(128->10).
// Two exact rewrites make it cheaper without changing what it computes (or its parameters):
//  - relu(maxpool(x)) == maxpool(relu(x)) (ReLU is monotone), so ReLU runs on the 4x smaller pooled map;
//  - fc1 on the flattened 64x5x5 map is computed as a 5x5 convolution with fc1.weight viewed as
//    [128, 64, 5, 5] (flatten is channel-major, the same order): it runs in oneDNN instead of the BLAS
//    that Debian's LibTorch is linked with (the netlib reference BLAS unless OpenBLAS is installed).
class FashionCnn final : public TorchModel {
 public:
  FashionCnn()
      : conv1_(register_module("conv1", nn::Conv2d(nn::Conv2dOptions(1, 32, 3)))),
        conv2_(register_module("conv2", nn::Conv2d(nn::Conv2dOptions(32, 64, 3)))),
        fc1_(register_module("fc1", nn::Linear(64 * 5 * 5, 128))),
        fc2_(register_module("fc2", nn::Linear(128, data::kFashionMnistClasses))) {}

  torch::Tensor forward(torch::Tensor x) override {
    x = torch::relu(MaxPool2d2x2(conv1_->forward(x)));                     // [B, 32, 13, 13]
    x = torch::relu(MaxPool2d2x2(conv2_->forward(x)));                     // [B, 64, 5, 5]
    x = torch::conv2d(x, fc1_->weight.view({128, 64, 5, 5}), fc1_->bias);  // [B, 128, 1, 1]
    return fc2_->forward(torch::relu(x).flatten(1));
  }
  std::string model_name() const override { return "cnn-fmnist"; }

 private:
  nn::Conv2d conv1_;
  nn::Conv2d conv2_;
  nn::Linear fc1_;
  nn::Linear fc2_;
};

// SqueezeNet's Fire module: squeeze 1x1 -> ReLU -> concat(expand 1x1 -> ReLU, expand 3x3 -> ReLU).
class FireImpl : public nn::Module {
 public:
  FireImpl(int64_t in_channels, int64_t squeeze, int64_t expand1x1, int64_t expand3x3)
      : squeeze_(register_module("squeeze", nn::Conv2d(nn::Conv2dOptions(in_channels, squeeze, 1)))),
        expand1x1_(register_module("expand1x1", nn::Conv2d(nn::Conv2dOptions(squeeze, expand1x1, 1)))),
        expand3x3_(register_module("expand3x3", nn::Conv2d(nn::Conv2dOptions(squeeze, expand3x3, 3).padding(1)))) {}

  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(squeeze_->forward(x));
    return torch::cat({torch::relu(expand1x1_->forward(x)), torch::relu(expand3x3_->forward(x))}, 1);
  }

 private:
  nn::Conv2d squeeze_;
  nn::Conv2d expand1x1_;
  nn::Conv2d expand3x3_;
};
TORCH_MODULE(Fire);

// SqueezeNet 1.1 for 1x28x28 (see torch_models.h for the adaptation). Layer indices match torchvision's
// so that parameter names do too.
class SqueezeNetFmnist final : public TorchModel {
 public:
  SqueezeNetFmnist() {
    auto pool = [] { return nn::MaxPool2d(nn::MaxPool2dOptions(3).stride(2).ceil_mode(true)); };
    features_ =
        register_module("features", nn::Sequential(nn::Conv2d(nn::Conv2dOptions(1, 64, 3).stride(1).padding(1)),  // 0
                                                   nn::ReLU(nn::ReLUOptions(true)),                               // 1
                                                   pool(),                     // 2: 28 -> 14
                                                   Fire(64, 16, 64, 64),       // 3
                                                   Fire(128, 16, 64, 64),      // 4
                                                   pool(),                     // 5: 14 -> 7
                                                   Fire(128, 32, 128, 128),    // 6
                                                   Fire(256, 32, 128, 128),    // 7
                                                   pool(),                     // 8: 7 -> 3
                                                   Fire(256, 48, 192, 192),    // 9
                                                   Fire(384, 48, 192, 192),    // 10
                                                   Fire(384, 64, 256, 256),    // 11
                                                   Fire(512, 64, 256, 256)));  // 12
    final_conv_ = nn::Conv2d(nn::Conv2dOptions(512, data::kFashionMnistClasses, 1));
    // torchvision: Dropout, final conv, ReLU, average pool. The ReLU is left out (see torch_models.h): with
    // it, logits cannot go below 0 and training collapses to all-zero logits.
    classifier_ = register_module("classifier",
                                  nn::Sequential(nn::Dropout(nn::DropoutOptions(0.5)),  // 0
                                                 final_conv_,                           // 1
                                                 nn::AdaptiveAvgPool2d(nn::AdaptiveAvgPool2dOptions(1))));
    // torchvision's initialisation.
    torch::NoGradGuard no_grad;
    for (auto& module : modules(/*include_self=*/false)) {
      if (auto* conv = module->as<nn::Conv2d>()) {
        if (conv == final_conv_.get()) {
          nn::init::normal_(conv->weight, 0.0, 0.01);
        } else {
          nn::init::kaiming_uniform_(conv->weight);
        }
        nn::init::zeros_(conv->bias);
      }
    }
  }

  torch::Tensor forward(torch::Tensor x) override { return classifier_->forward(features_->forward(x)).flatten(1); }
  std::string model_name() const override { return "squeezenet1_1-fmnist"; }

 private:
  nn::Sequential features_{nullptr};
  nn::Conv2d final_conv_{nullptr};
  nn::Sequential classifier_{nullptr};
};

void AppendOwnTensors(const nn::Module& module, const std::string& prefix,
                      std::vector<std::pair<std::string, torch::Tensor>>& out) {
  for (const auto& item : module.named_parameters(/*recurse=*/false)) {
    out.emplace_back(prefix + item.key(), item.value());
  }
  for (const auto& item : module.named_buffers(/*recurse=*/false)) {
    out.emplace_back(prefix + item.key(), item.value());
  }
}

std::string ShapeString(c10::IntArrayRef sizes) { return fl::StrCat("[", absl::StrJoin(sizes, ", "), "]"); }

}  // namespace

std::vector<std::string> TorchModelNames() { return {"cnn", "squeezenet"}; }

absl::StatusOr<std::shared_ptr<TorchModel>> CreateTorchModel(std::string_view name, uint64_t seed) {
  torch::manual_seed(seed);
  if (name == "cnn") return std::shared_ptr<TorchModel>(std::make_shared<FashionCnn>());
  if (name == "squeezenet") return std::shared_ptr<TorchModel>(std::make_shared<SqueezeNetFmnist>());
  return absl::InvalidArgumentError(
      fl::StrCat("unknown model '", name, "'; known models: ", absl::StrJoin(TorchModelNames(), ", ")));
}

std::vector<std::pair<std::string, torch::Tensor>> StateTensors(const nn::Module& module) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  AppendOwnTensors(module, "", out);
  // named_modules(include_self = false) is pre-order and works for modules not held by a shared_ptr.
  for (const auto& item : module.named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
    AppendOwnTensors(*item.value(), item.key() + ".", out);
  }
  return out;
}

absl::StatusOr<core::DType> ToCoreDType(torch::ScalarType type) {
  switch (type) {
    case torch::kFloat: return core::DType::kFloat32;
    case torch::kHalf: return core::DType::kFloat16;
    case torch::kBFloat16: return core::DType::kBFloat16;
    case torch::kDouble: return core::DType::kFloat64;
    case torch::kLong: return core::DType::kInt64;
    case torch::kInt: return core::DType::kInt32;
    case torch::kByte: return core::DType::kUInt8;
    default:
      return absl::InvalidArgumentError(
          fl::StrCat("tensor dtype ", c10::toString(type), " has no fl::core::DType counterpart"));
  }
}

absl::StatusOr<core::ModelSpec> ModelSpecOf(const nn::Module& module) {
  std::vector<core::TensorSpec> specs;
  for (const auto& [name, tensor] : StateTensors(module)) {
    auto dtype = ToCoreDType(tensor.scalar_type());
    if (!dtype.ok()) return absl::InvalidArgumentError(fl::StrCat(name, ": ", dtype.status().message()));
    core::TensorSpec spec;
    spec.name = name;
    spec.shape.assign(tensor.sizes().begin(), tensor.sizes().end());
    spec.dtype = *dtype;
    specs.push_back(std::move(spec));
  }
  return core::ModelSpec::Create(std::move(specs));
}

absl::StatusOr<std::vector<torch::Tensor>> BindTensors(const nn::Module& module, const core::ModelSpec& spec) {
  auto state = StateTensors(module);
  if (state.size() != spec.num_tensors()) {
    return absl::InvalidArgumentError(
        fl::StrCat("the module has ", state.size(), " tensors, the model spec ", spec.num_tensors()));
  }
  std::vector<torch::Tensor> tensors;
  tensors.reserve(state.size());
  for (size_t i = 0; i < state.size(); ++i) {
    const auto& [name, tensor] = state[i];
    const core::TensorSpec& expected = spec.tensors()[i];
    const std::vector<int64_t> shape(tensor.sizes().begin(), tensor.sizes().end());
    auto dtype = ToCoreDType(tensor.scalar_type());
    if (name != expected.name || shape != expected.shape || !dtype.ok() || *dtype != expected.dtype) {
      return absl::InvalidArgumentError(fl::StrCat("module tensor ", i, " is ", name, " ", ShapeString(tensor.sizes()),
                                                   " ", c10::toString(tensor.scalar_type()),
                                                   " but the model spec says ", expected.name, " ",
                                                   expected.ShapeString(), " ", core::DTypeName(expected.dtype)));
    }
    tensors.push_back(tensor);
  }
  return tensors;
}

namespace internal {

absl::Status CheckTensorInStorage(const torch::Tensor& tensor, std::string_view name) {
  auto refuse = [&](std::string_view why) { return absl::InvalidArgumentError(fl::StrCat(name, ": ", why)); };
  if (!tensor.defined()) return refuse("an undefined tensor");
  if (tensor.layout() != torch::kStrided) return refuse("not a dense (strided) tensor");
  if (!tensor.has_storage()) return refuse("a tensor without a storage");
  const std::string geometry = fl::StrCat("shape ", ShapeString(tensor.sizes()), ", strides ",
                                          ShapeString(tensor.strides()), ", storage offset ", tensor.storage_offset());
  if (tensor.storage_offset() < 0) return refuse(fl::StrCat(geometry, ": a negative storage offset"));
  uint64_t elements = 1;
  uint64_t last = static_cast<uint64_t>(tensor.storage_offset());  // the last element it addresses
  bool overflow = false;
  for (int64_t d = 0; d < tensor.dim(); ++d) {
    const int64_t size = tensor.size(d);
    const int64_t stride = tensor.stride(d);
    if (size < 0) return refuse(fl::StrCat(geometry, ": a negative size"));
    overflow |= __builtin_mul_overflow(elements, static_cast<uint64_t>(size), &elements);
    if (size > 1) {
      if (stride < 0) {
        return refuse(fl::StrCat(geometry, ": a negative stride in dimension ", d,
                                 " (PyTorch never saves one: the file was altered)"));
      }
      uint64_t reach = 0;
      overflow |= __builtin_mul_overflow(static_cast<uint64_t>(size - 1), static_cast<uint64_t>(stride), &reach);
      overflow |= __builtin_add_overflow(last, reach, &last);
    }
  }
  if (elements == 0 && !overflow) return absl::OkStatus();  // addresses nothing
  uint64_t end_byte = 0;
  overflow |= __builtin_add_overflow(last, uint64_t{1}, &end_byte);
  overflow |= __builtin_mul_overflow(end_byte, static_cast<uint64_t>(tensor.element_size()), &end_byte);
  const uint64_t storage_bytes = tensor.storage().nbytes();
  if (overflow) return refuse(fl::StrCat(geometry, ": addresses more than 2^64 bytes"));
  if (end_byte > storage_bytes) {
    return refuse(fl::StrCat(geometry, ": reaches byte ", end_byte, " of a storage of ", storage_bytes, " bytes"));
  }
  if (elements != static_cast<uint64_t>(tensor.numel())) {
    return refuse(fl::StrCat(geometry, ": ", tensor.numel(), " elements, its sizes multiply to ", elements));
  }
  return absl::OkStatus();
}

absl::Status CheckTensorFinite(const torch::Tensor& tensor, std::string_view name) {
  if (!tensor.is_floating_point() || tensor.numel() == 0) return absl::OkStatus();
  torch::NoGradGuard no_grad;
  const torch::Tensor flat = tensor.detach().reshape({-1});
  const torch::Tensor bad = torch::logical_not(torch::isfinite(flat));
  if (!bad.any().item<bool>()) return absl::OkStatus();
  const int64_t first = bad.nonzero()[0][0].item<int64_t>();
  return absl::InvalidArgumentError(
      fl::StrCat(name, ": element ", first, " (C order) is ", flat[first].item<double>(), ", not a finite number"));
}

}  // namespace internal

absl::Status CopyToFlat(std::span<const torch::Tensor> tensors, const core::ModelSpec& spec, std::span<float> out) {
  if (tensors.size() != spec.num_tensors()) {
    return absl::InvalidArgumentError(fl::StrCat(tensors.size(), " tensors for a model spec of ", spec.num_tensors()));
  }
  if (out.size() != spec.num_elements()) {
    return absl::InvalidArgumentError(fl::StrCat("parameter buffer holds ", out.size(), " values; the model (spec ",
                                                 spec.FingerprintHex(), ") has ", spec.num_elements()));
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    const core::TensorSpec& ts = spec.tensors()[i];
    // Its memory is read below (contiguous(), memcpy): only within its storage.
    if (absl::Status s = internal::CheckTensorInStorage(tensors[i], ts.name); !s.ok()) return s;
    if (static_cast<uint64_t>(tensors[i].numel()) != ts.num_elements()) {
      return absl::InvalidArgumentError(
          fl::StrCat(ts.name, ": tensor has ", tensors[i].numel(), " elements, the spec ", ts.num_elements()));
    }
    const torch::Tensor host =
        tensors[i].detach().to(torch::kCPU, torch::kFloat, /*non_blocking=*/false, /*copy=*/false).contiguous();
    std::memcpy(out.data() + ts.offset, host.data_ptr<float>(), ts.num_elements() * sizeof(float));
  }
  return absl::OkStatus();
}

absl::Status CopyFromFlat(std::span<const float> flat, const core::ModelSpec& spec,
                          std::span<const torch::Tensor> tensors) {
  if (tensors.size() != spec.num_tensors()) {
    return absl::InvalidArgumentError(fl::StrCat(tensors.size(), " tensors for a model spec of ", spec.num_tensors()));
  }
  if (flat.size() != spec.num_elements()) {
    return absl::InvalidArgumentError(fl::StrCat("parameter buffer holds ", flat.size(), " values; the model (spec ",
                                                 spec.FingerprintHex(), ") has ", spec.num_elements()));
  }
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const core::TensorSpec& ts = spec.tensors()[i];
    torch::Tensor target = tensors[i];
    // Written in place below (copy_): only within its storage.
    if (absl::Status s = internal::CheckTensorInStorage(target, ts.name); !s.ok()) return s;
    if (static_cast<uint64_t>(target.numel()) != ts.num_elements()) {
      return absl::InvalidArgumentError(
          fl::StrCat(ts.name, ": tensor has ", target.numel(), " elements, the spec ", ts.num_elements()));
    }
    // from_blob does not copy; copy_ converts dtype and device and writes in place.
    const torch::Tensor source = torch::from_blob(const_cast<float*>(flat.data() + ts.offset), target.sizes(),
                                                  torch::TensorOptions().dtype(torch::kFloat));
    target.copy_(source);
  }
  return absl::OkStatus();
}

torch::Tensor ImagesToTensor(const data::Dataset& dataset, std::span<const uint32_t> indices) {
  const auto n = static_cast<int64_t>(indices.size());
  torch::Tensor images = torch::empty({n, 1, static_cast<int64_t>(dataset.rows), static_cast<int64_t>(dataset.cols)},
                                      torch::TensorOptions().dtype(torch::kFloat));
  const size_t image_size = dataset.image_size();
  float* out = images.data_ptr<float>();
  // (x / 255 - mean) / std == x * scale + shift, computed in float once per pixel value.
  float lut[256];
  for (int v = 0; v < 256; ++v) {
    lut[v] = static_cast<float>((v / 255.0 - data::kFashionMnistMean) / data::kFashionMnistStd);
  }
  for (size_t i = 0; i < indices.size(); ++i) {
    const std::span<const uint8_t> image = dataset.image(indices[i]);
    float* dst = out + i * image_size;
    for (size_t p = 0; p < image_size; ++p) dst[p] = lut[image[p]];
  }
  return images;
}

torch::Tensor LabelsToTensor(const data::Dataset& dataset, std::span<const uint32_t> indices) {
  torch::Tensor labels =
      torch::empty({static_cast<int64_t>(indices.size())}, torch::TensorOptions().dtype(torch::kLong));
  int64_t* out = labels.data_ptr<int64_t>();
  for (size_t i = 0; i < indices.size(); ++i) out[i] = dataset.labels[indices[i]];
  return labels;
}

}  // namespace fl::training
