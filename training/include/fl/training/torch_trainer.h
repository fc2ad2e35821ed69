// TorchTrainer: the LibTorch implementation of fl::training::Trainer (Fashion-MNIST, CNN or SqueezeNet 1.1).
//
// This header is torch-free on purpose (the state lives behind a pointer): the session and fl-client's
// main include it without paying LibTorch's compile time. The models, the spec extraction and the flat
// copies are in torch_models.h, for code that does want torch types.
//
// A trainer owns:
//  - a model built by name ("cnn" or "squeezenet", see torch_models.h) from a seed, so that every client
//    created with the same model and init_seed starts from bit-identical weights;
//  - its train shard: its part of the 60,000 Fashion-MNIST training images under `partition`
//    ("iid" | "dirichlet:<alpha>" | "shards:<s>", fl::training::data::PartitionSpec::Parse) for
//    (client_index, num_clients, partition_seed);
//  - its test shard: its IID part of the 10,000 test images for (client_index, num_clients,
//    partition_seed), whatever the train partition, so that the example-weighted mean of all clients'
//    Evaluate results is the accuracy on the full test set;
//  - both shards as pre-built normalised float tensors ((x / 255 - 0.2860) / 0.3530) on the device;
//  - the current local parameters (flat fp32): the initial ones, then those of the last completed Train.
//
// Semantics of the Trainer calls:
//  - Train: loads `global`, trains with a fresh optimizer (SGD with momentum / weight decay, or AdamW),
//    local_epochs passes over the shuffled shard (the last batch of an epoch may be short) or exactly
//    local_steps batches of batch_size (epochs chained, reshuffled at each boundary). The shuffle is a pure
//    function of (options.seed, epoch), platform-independent (fl::training::data::Shuffle); torch's generator (dropout)
//    is seeded from options.seed too. FedProx (proximal_mu > 0) adds mu * (w - w_global) to each
//    parameter's gradient, the gradient of mu/2 * ||w - w_global||^2. The result reports:
//      num_examples   = shard size (epochs; McMahan's n_k, the FedAvg weight) or steps * batch_size (steps);
//      train_loss     = mean over batches of the batch-mean cross-entropy (without the proximal term);
//      train_accuracy = correct / examples seen, over all batches of the round.
//    A non-finite loss is not an error here: the update is returned and the server rejects it.
//    options.cancelled is checked between batches: Cancelled, and the local parameters stay as they were
//    before the call.
//  - Evaluate: loads `global` into the model (the local parameters of GetParameters are not changed) and
//    computes the mean cross-entropy and accuracy over the test shard, in batches of eval_batch_size, eval mode,
//    no autograd (the figures do not depend on the batch size).
// A trainer is not thread-safe (one call at a time). torch::set_num_threads and the torch generator seeds
// it sets are process-wide.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fl/training/trainer.h"
#include "fl/core/tensor_spec.h"
#include "fl/training/data/fashion_mnist.h"

namespace fl::training {

struct TorchTrainerOptions {
  std::string model = "cnn";  // "cnn" | "squeezenet" (TorchModelNames())
  uint64_t init_seed = 0;     // torch::manual_seed before the model is built
  std::string data_dir = std::string(data::kDefaultFashionMnistDir);
  std::string partition = "iid";  // fl::training::data::PartitionSpec::Parse syntax
  uint32_t client_index = 0;      // in [0, num_clients)
  uint32_t num_clients = 1;
  uint64_t partition_seed = 0;
  std::string device = "auto";  // "auto" (cuda when available, else cpu) | "cpu" | "cuda"
  int num_threads = 0;          // torch::set_num_threads (process-wide); 0 leaves torch's default
  // Test examples per forward pass in Evaluate (>= 1): bounds the memory, changes no result.
  uint32_t eval_batch_size = kDefaultEvalBatchSize;
  // Device emulation (fl-experiment): train on the first `data_fraction` of this client's shard, and slow
  // training to 1/slowdown of this machine's speed by idling (slowdown - 1) x each batch's compute time
  // after it: a duty cycle, so that train time ratios between emulated devices are realistic.
  double data_fraction = 1.0;  // (0, 1]
  double slowdown = 1.0;       // >= 1
};

class TorchTrainer final : public Trainer {
 public:
  // Reads Fashion-MNIST's labels from options.data_dir, partitions them, reads only this client's images
  // (data::LoadFashionMnistRows: the whole training split is never held) and builds the model.
  static absl::StatusOr<std::unique_ptr<TorchTrainer>> Create(const TorchTrainerOptions& options);
  // The same from whole splits already in memory (several clients in one process share them, tests); the
  // same shard as the call above. `train` and `test` are only read during the call.
  static absl::StatusOr<std::unique_ptr<TorchTrainer>> Create(const TorchTrainerOptions& options,
                                                              const data::Dataset& train, const data::Dataset& test);

  ~TorchTrainer() override;
  TorchTrainer(const TorchTrainer&) = delete;
  TorchTrainer& operator=(const TorchTrainer&) = delete;

  const core::ModelSpec& spec() const override;
  std::string model_name() const override;  // "cnn-fmnist" | "squeezenet1_1-fmnist"
  uint64_t num_train_examples() const override;
  uint64_t num_test_examples() const override;

  absl::Status GetParameters(std::span<float> out) override;
  absl::StatusOr<TrainResult> Train(std::span<const float> global, const TrainOptions& options) override;
  absl::StatusOr<EvalResult> Evaluate(std::span<const float> global) override;

  // Replaces the local parameters (and the model's weights); InvalidArgument on a size mismatch.
  absl::Status SetParameters(std::span<const float> values);

  std::string_view device() const;  // the resolved device: "cpu" or "cuda"
  const TorchTrainerOptions& options() const;

  struct State;  // torch-side state (torch_trainer.cc)

 private:
  explicit TorchTrainer(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// The names CreateTorchModel / TorchTrainerOptions::model accept.
std::vector<std::string> TorchModelNames();

// The GPU a trainer with `device` ("auto" | "cpu" | "cuda", as TorchTrainerOptions::device) trains on, for what
// fl-client reports at Join (DeviceInfo.accelerator): the CUDA runtime's name and memory of the current device
// (only in a build against a CUDA LibTorch; empty and 0 otherwise) and how many devices LibTorch sees.
// nullopt where it trains on the CPU: "cpu", or no CUDA device visible (Debian's LibTorch is CPU-only).
struct CudaDevice {
  std::string name;
  uint64_t memory_bytes = 0;
  uint32_t count = 0;
};
std::optional<CudaDevice> TrainingCudaDevice(std::string_view device);

}  // namespace fl::training
