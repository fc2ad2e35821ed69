// What the two LibTorch trainers (TorchTrainer: built-in models; ScriptTrainer: TorchScript models) share:
// device resolution, option checks, the optimizer, and the batch schedule of a round (epochs or steps, the
// seeded shuffle, cancellation, device-emulation throttling). Written once so that a built-in model and the
// same architecture exported from PyTorch see exactly the same batches in the same order.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fl/training/trainer.h"

namespace fl::training::internal {

// "auto" (cuda when LibTorch sees a GPU, else cpu) | "cpu" | "cuda".
absl::StatusOr<torch::Device> ResolveDevice(std::string_view name);

// Evaluate's batch (TorchTrainerOptions/ScriptTrainerOptions::eval_batch_size): InvalidArgument below 1.
absl::Status ValidateEvalBatchSize(uint32_t eval_batch_size);

// batch size, epochs/steps, learning rate, momentum, weight decay, proximal mu, optimizer name.
absl::Status ValidateTrainOptions(const TrainOptions& options);

// A fresh optimizer over `parameters` (SGD with momentum / weight decay, or AdamW).
std::unique_ptr<torch::optim::Optimizer> MakeOptimizer(const std::vector<torch::Tensor>& parameters,
                                                       const TrainOptions& options);

// FedProx: adds mu * (w - w_global) to each parameter's gradient (the gradient of mu/2 * ||w - w_global||^2).
void AddProximalGradient(const std::vector<torch::Tensor>& parameters, const std::vector<torch::Tensor>& global,
                         double mu);

struct LoopResult {
  uint64_t num_examples = 0;  // shard size (epochs) or steps * batch_size (steps): the FedAvg weight
  uint64_t steps = 0;
  uint64_t seen = 0;  // examples in all batches
  double compute_seconds = 0;
  double throttled_seconds = 0;
};

// The round's TrainResult: the loop's counts, the mean batch loss, and `correct` / `predictions` as the train
// accuracy (0 when nothing is counted, e.g. regression).
TrainResult ToTrainResult(const LoopResult& loop, double loss_sum, int64_t correct, int64_t predictions);

// Runs one round's batches over a shard of n examples: local_epochs passes over the shuffled shard (the last
// batch of an epoch may be short) or exactly local_steps batches of batch_size (epochs chained, reshuffled at
// each boundary). Epoch e's order is a Fisher-Yates shuffle drawn from MakeEngine(options.seed, e), so it is
// platform-independent. `step` gets the batch's indices (int64 on `device`); options.cancelled is checked
// before each batch (Cancelled). With slowdown > 1 the loop idles (slowdown - 1) x each batch's compute time.
absl::StatusOr<LoopResult> RunTrainLoop(uint32_t n, const TrainOptions& options, torch::Device device, double slowdown,
                                        const std::function<absl::Status(const torch::Tensor& index)>& step);

}  // namespace fl::training::internal
