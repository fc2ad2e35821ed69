#include "train_loop.h"

#ifdef FL_TORCH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <thread>

#include "fl/core/str_cat.h"
#include "fl/training/data/deterministic_random.h"
#include "fl/training/torch_trainer.h"

namespace fl::training {

std::optional<CudaDevice> TrainingCudaDevice(std::string_view device) {
  if (device == "cpu" || !torch::cuda::is_available()) return std::nullopt;
  CudaDevice d;
  d.count = static_cast<uint32_t>(torch::cuda::device_count());
#ifdef FL_TORCH_CUDA
  // The trainers use the current device (torch::kCUDA without an index).
  const cudaDeviceProp* props = at::cuda::getCurrentDeviceProperties();
  d.name = props->name;
  d.memory_bytes = props->totalGlobalMem;
#endif
  return d;
}

}  // namespace fl::training

namespace fl::training::internal {

absl::StatusOr<torch::Device> ResolveDevice(std::string_view name) {
  if (name == "cpu") return torch::Device(torch::kCPU);
  if (name == "auto") return torch::cuda::is_available() ? torch::Device(torch::kCUDA) : torch::Device(torch::kCPU);
  if (name == "cuda") {
    if (!torch::cuda::is_available()) {
      return absl::FailedPreconditionError(
          "device 'cuda' requested but LibTorch sees no CUDA device (no GPU, no driver, or a CPU-only LibTorch "
          "build); use --device cpu or auto");
    }
    return torch::Device(torch::kCUDA);
  }
  return absl::InvalidArgumentError(fl::StrCat("unknown device '", name, "'; expected auto, cpu or cuda"));
}

absl::Status ValidateEvalBatchSize(uint32_t eval_batch_size) {
  if (eval_batch_size >= 1) return absl::OkStatus();
  return absl::InvalidArgumentError(
      fl::StrCat("evaluation batch size ", eval_batch_size, " must be >= 1 (test examples per forward pass)"));
}

absl::Status ValidateTrainOptions(const TrainOptions& o) {
  if (o.batch_size == 0) return absl::InvalidArgumentError("batch_size must be > 0");
  if (o.local_steps == 0 && o.local_epochs == 0) {
    return absl::InvalidArgumentError("nothing to train: local_epochs and local_steps are both 0");
  }
  if (!std::isfinite(o.learning_rate) || o.learning_rate <= 0) {
    return absl::InvalidArgumentError(fl::StrCat("learning_rate must be finite and > 0, got ", o.learning_rate));
  }
  if (!std::isfinite(o.momentum) || o.momentum < 0) {
    return absl::InvalidArgumentError(fl::StrCat("momentum must be finite and >= 0, got ", o.momentum));
  }
  if (!std::isfinite(o.weight_decay) || o.weight_decay < 0) {
    return absl::InvalidArgumentError(fl::StrCat("weight_decay must be finite and >= 0, got ", o.weight_decay));
  }
  if (!std::isfinite(o.proximal_mu) || o.proximal_mu < 0) {
    return absl::InvalidArgumentError(fl::StrCat("proximal_mu must be finite and >= 0, got ", o.proximal_mu));
  }
  if (o.optimizer != "sgd" && o.optimizer != "adamw") {
    return absl::InvalidArgumentError(fl::StrCat("unknown optimizer '", o.optimizer, "'; expected sgd or adamw"));
  }
  return absl::OkStatus();
}

std::unique_ptr<torch::optim::Optimizer> MakeOptimizer(const std::vector<torch::Tensor>& parameters,
                                                       const TrainOptions& options) {
  if (options.optimizer == "sgd") {
    return std::make_unique<torch::optim::SGD>(
        parameters,
        torch::optim::SGDOptions(options.learning_rate).momentum(options.momentum).weight_decay(options.weight_decay));
  }
  return std::make_unique<torch::optim::AdamW>(
      parameters, torch::optim::AdamWOptions(options.learning_rate).weight_decay(options.weight_decay));
}

void AddProximalGradient(const std::vector<torch::Tensor>& parameters, const std::vector<torch::Tensor>& global,
                         double mu) {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < parameters.size(); ++i) {
    torch::Tensor grad = parameters[i].mutable_grad();
    if (!grad.defined()) continue;
    grad.add_(parameters[i].detach() - global[i], mu);
  }
}

TrainResult ToTrainResult(const LoopResult& loop, double loss_sum, int64_t correct, int64_t predictions) {
  TrainResult result;
  result.num_examples = loop.num_examples;
  result.num_steps = loop.steps;
  result.compute_seconds = loop.compute_seconds;
  result.throttled_seconds = loop.throttled_seconds;
  result.train_loss = loop.steps > 0 ? loss_sum / static_cast<double>(loop.steps) : 0.0;
  result.train_accuracy = predictions > 0 ? static_cast<double>(correct) / static_cast<double>(predictions) : 0.0;
  return result;
}

absl::StatusOr<LoopResult> RunTrainLoop(uint32_t n, const TrainOptions& options, torch::Device device, double slowdown,
                                        const std::function<absl::Status(const torch::Tensor& index)>& step) {
  std::vector<uint32_t> order(n);
  torch::Tensor permutation;  // `order` as int64 on the device
  uint64_t epoch = 0;
  int64_t position = 0;
  auto shuffle = [&] {
    std::iota(order.begin(), order.end(), 0u);
    data::Engine engine = data::MakeEngine(options.seed, epoch++);
    data::Shuffle(engine, order);
    permutation = torch::from_blob(order.data(), {static_cast<int64_t>(n)}, torch::TensorOptions().dtype(torch::kInt))
                      .to(device, torch::kLong);
    position = 0;
  };

  LoopResult result;
  auto run = [&](const torch::Tensor& index) -> absl::Status {
    if (options.cancelled != nullptr && options.cancelled->load(std::memory_order_relaxed)) {
      return absl::CancelledError(fl::StrCat("training cancelled after ", result.steps, " steps"));
    }
    const auto compute_start = std::chrono::steady_clock::now();
    if (absl::Status s = step(index); !s.ok()) return s;
    result.seen += static_cast<uint64_t>(index.size(0));
    ++result.steps;
    const auto compute = std::chrono::steady_clock::now() - compute_start;
    result.compute_seconds += std::chrono::duration<double>(compute).count();
    if (slowdown > 1) {
      const auto idle_start = std::chrono::steady_clock::now();
      std::this_thread::sleep_for(std::chrono::duration_cast<std::chrono::nanoseconds>(compute * (slowdown - 1)));
      result.throttled_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - idle_start).count();
    }
    return absl::OkStatus();
  };

  if (options.local_steps > 0) {
    // Exactly local_steps full batches; a batch that runs past the end of an epoch continues in the next.
    shuffle();
    for (uint32_t k = 0; k < options.local_steps; ++k) {
      std::vector<torch::Tensor> pieces;
      int64_t remaining = options.batch_size;
      while (remaining > 0) {
        if (position == static_cast<int64_t>(n)) shuffle();
        const int64_t take = std::min<int64_t>(remaining, n - position);
        pieces.push_back(permutation.slice(0, position, position + take));
        position += take;
        remaining -= take;
      }
      const torch::Tensor index = pieces.size() == 1 ? pieces[0] : torch::cat(pieces);
      if (absl::Status s = run(index); !s.ok()) return s;
    }
    result.num_examples = static_cast<uint64_t>(options.local_steps) * options.batch_size;
  } else {
    for (uint32_t e = 0; e < options.local_epochs; ++e) {
      shuffle();
      for (int64_t begin = 0; begin < static_cast<int64_t>(n); begin += options.batch_size) {
        const int64_t end = std::min<int64_t>(begin + options.batch_size, n);
        if (absl::Status s = run(permutation.slice(0, begin, end)); !s.ok()) return s;
      }
    }
    result.num_examples = n;
  }
  return result;
}

}  // namespace fl::training::internal
