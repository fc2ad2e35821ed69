// ScriptTrainer: fl::training::Trainer for a user's TorchScript model on a user's data (bring your own model).
//
// Torch-free header (the state lives behind a pointer), like torch_trainer.h, so fl-client's main and the
// session compile without LibTorch's headers.
//
// A trainer owns:
//  - the TorchScript model (script_model.h: every parameter and buffer, state_dict order, is the flat update);
//  - this client's train shard and its IID share of the test set (fl/training/data/client_data.h: .npz, a Fashion-MNIST
//    IDX directory, or a plain-text corpus for next-token), as tensors on the device: uint8 features become
//    float32 x / 255, float32 features are used as they are, tokens are int64;
//  - the current local values (flat fp32): the model's initial ones, then those of the last completed Train.
//
// The task decides the loss and the metrics:
//   classification  forward(x [B, ...]) -> logits [B, C]; cross-entropy; accuracy. Labels must be < C.
//   regression      forward(x [B, ...]) -> predictions shaped like y ([B] or [B, ...]; [B, 1] for a [B] target is
//                   accepted); mean squared error; mean absolute error (EvalResult::mae).
//   next-token      forward(tokens [B, T] int64) -> logits [B, T, V]; mean per-token cross-entropy (the server
//                   reports perplexity = exp of it); per-token accuracy. Tokens must be < V.
// Create runs the model once on two training examples (eval mode, no grad) to check that the forward accepts
// the data's shape and that the output fits the task, before anything is trained.
//
// Buffers (BatchNorm's running_mean/running_var/num_batches_tracked, any registered buffer):
//   "average" (FedAvg): float buffers are loaded from the global model every round, like parameters;
//   "local" (FedBN-style statistics): every buffer stays this client's own — the global values are never loaded,
//     so training and evaluation use the client's own statistics.
// Integer buffers are always local: they are never overwritten by the global model (and fl-server never
// averages them). Local tensors are restored from the local values at the start of every Train/Evaluate, so a
// cancelled round leaves no trace.
//
// Train and Evaluate follow TorchTrainer's semantics (the same batch schedule: train_loop.h; FedProx; the
// seeded shuffle; cancellation; device-emulation slowdown); train() mode while training (dropout active,
// BatchNorm uses and updates batch statistics) and eval() mode while evaluating, as in PyTorch.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fl/training/trainer.h"
#include "fl/core/tensor_spec.h"
#include "fl/training/data/client_data.h"

namespace fl::training {

struct ScriptTrainerOptions {
  std::string model_path;           // a TorchScript .pt file
  data::DataOptions data;           // where the data is, the task, the partition and this client's shard
  std::string buffers = "average";  // "average" | "local"
  std::string device = "auto";      // "auto" | "cpu" | "cuda"
  int num_threads = 0;              // torch::set_num_threads (process-wide); 0 leaves torch's default
  double slowdown = 1.0;            // device emulation, >= 1 (see TorchTrainerOptions)
  // Test examples per forward pass in Evaluate (>= 1): bounds the memory, changes no result.
  uint32_t eval_batch_size = kDefaultEvalBatchSize;
};

class ScriptTrainer final : public Trainer {
 public:
  // Loads the data (options.data) and the model.
  static absl::StatusOr<std::unique_ptr<ScriptTrainer>> Create(const ScriptTrainerOptions& options);
  // The same with data already loaded (tests, benchmarks); `data` is only read during the call.
  static absl::StatusOr<std::unique_ptr<ScriptTrainer>> Create(const ScriptTrainerOptions& options,
                                                               const data::ClientData& data);

  ~ScriptTrainer() override;
  ScriptTrainer(const ScriptTrainer&) = delete;
  ScriptTrainer& operator=(const ScriptTrainer&) = delete;

  const core::ModelSpec& spec() const override;
  std::string model_name() const override;  // the file's stem: "cnn_bn" for /path/cnn_bn.pt
  std::string task() const override;        // "classification" | "regression" | "next-token"
  uint64_t num_train_examples() const override;
  uint64_t num_test_examples() const override;

  absl::Status GetParameters(std::span<float> out) override;
  absl::StatusOr<TrainResult> Train(std::span<const float> global, const TrainOptions& options) override;
  absl::StatusOr<EvalResult> Evaluate(std::span<const float> global) override;

  // Output classes (classification) or vocabulary (next-token) the model showed on the probe; 0 for regression.
  int64_t num_outputs() const;
  std::string_view device() const;

  struct State;

 private:
  explicit ScriptTrainer(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace fl::training
