// The trainer interface of fl-client: what the session needs from whatever trains the model.
//
// The session is framework-free (no LibTorch in this header): it moves flat fp32 parameters to and from the
// server, and a Trainer turns them into a model, trains or evaluates it on the client's shard, and hands the
// result back flat. The LibTorch trainer (training) is the real one; SyntheticTrainer exists for
// benchmarks of the transport alone.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fl/core/tensor_spec.h"

namespace fl::training {

// How many test examples the LibTorch trainers (TorchTrainer, ScriptTrainer) run through the model at once when
// evaluating (fl-client --eval-batch-size). The results do not depend on it (losses are summed per example and
// divided once); the memory does: the CNN's first convolution alone holds batch x 32 x 26 x 26 floats (83 MiB
// for 1,000 images). With 100 the quickstart CNN client's evaluation adds 8 MiB to its training's peak resident set
// under qemu-aarch64, 125 MiB with 1,000 (docs/deploy-raspberry-pi.md "Memory"); larger batches only save a little
// time on big machines.
inline constexpr uint32_t kDefaultEvalBatchSize = 100;

struct TrainOptions {
  uint32_t local_epochs = 1;  // ignored when local_steps > 0
  uint32_t local_steps = 0;   // optimizer steps; > 0 overrides local_epochs
  uint32_t batch_size = 32;
  double learning_rate = 0.05;
  std::string optimizer = "sgd";  // "sgd" or "adamw"
  double momentum = 0.0;
  double weight_decay = 0.0;
  double proximal_mu = 0.0;  // FedProx: adds mu/2 * ||w - w_global||^2 to the loss
  uint64_t seed = 0;         // data order and any randomness of this round
  // Set by the session when the server cancels the task; trainers check it between batches and return
  // Cancelled.
  const std::atomic<bool>* cancelled = nullptr;
};

struct TrainResult {
  uint64_t num_examples = 0;  // examples seen (the update's FedAvg weight)
  uint64_t num_steps = 0;
  double train_loss = 0;      // mean over the round's batches
  double train_accuracy = 0;  // fraction, over the round's batches
  // Device emulation (TorchTrainerOptions::slowdown): time spent computing batches, and time idled after them
  // to run at the emulated device's speed (throttled = (slowdown - 1) x compute, up to the sleep's precision).
  double compute_seconds = 0;
  double throttled_seconds = 0;
};

// An evaluation of the model on the local test shard. What the figures mean depends on the trainer's task()
// (fl/core/task.h):
//   classification  loss = mean cross-entropy per example; accuracy = fraction of examples right; mae unused
//   regression      loss = mean squared error per example; mae = mean absolute error; accuracy unused (0)
//   next-token      loss = mean cross-entropy per token (nats; the server reports perplexity = exp(loss));
//                   accuracy = fraction of tokens predicted right; num_examples counts sequences, not tokens
// The server weights every result by num_examples, for next-token too (sequences of one length weigh alike;
// a shard of unequal sequences is weighted by its count of sequences, not of tokens). It refuses a result
// whose loss or MAE is negative or not finite, or whose accuracy is outside [0, 1].
struct EvalResult {
  uint64_t num_examples = 0;
  double loss = 0;
  double accuracy = 0;
  double mae = 0;
};

class Trainer {
 public:
  virtual ~Trainer() = default;

  // The model's layout; its fingerprint is what the server checks every update against.
  virtual const core::ModelSpec& spec() const = 0;
  // "cnn-fmnist", "squeezenet1_1-fmnist", ...
  virtual std::string model_name() const = 0;
  // The learning task: "classification", "regression" or "next-token" (fl::core::TaskName). Sent at Join;
  // the experiment's first client fixes it and clients of another task are refused.
  virtual std::string task() const { return "classification"; }
  virtual uint64_t num_train_examples() const = 0;
  virtual uint64_t num_test_examples() const = 0;

  // The current local parameters (the initial ones before any round), spec().num_elements() values.
  virtual absl::Status GetParameters(std::span<float> out) = 0;
  // Loads `global`, trains on the local train shard, keeps the result as the current local parameters.
  virtual absl::StatusOr<TrainResult> Train(std::span<const float> global, const TrainOptions& options) = 0;
  // Loads `global` and evaluates it on the local test shard.
  virtual absl::StatusOr<EvalResult> Evaluate(std::span<const float> global) = 0;
};

}  // namespace fl::training
