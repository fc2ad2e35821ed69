// The LibTorch side of an island rank: a model, its training data stream and its evaluation.
//
// Two tasks:
//  "char-lm": a character-level decoder-only transformer (GPT-style, pre-LN) on the fortunes corpus
//    (text_corpus.h). Parameter names: tok_emb, pos_emb, blocks.<i>.{ln1,attn.qkv,attn.proj,ln2,mlp.fc,
//    mlp.proj}.{weight,bias}, ln_f, head — so the fragment plan sees blocks.<i> as layer i and the
//    embeddings, final norm and head as non-layer tensors.
//  "cnn": fl-client's Fashion-MNIST CNN (training, unchanged), 225,034 parameters.
//  a TorchScript file (*.pt, or any path with a '/'): the user's model (fl/training/script_model.h) on `data`
//    (fl/training/data/client_data.h: .npz, IDX directory, text corpus) for `task`. The islands exchange its trainable
//    parameters (spec = those, in state_dict order); buffers (BatchNorm statistics) stay each rank's own.
//    Evaluation: the mean loss over the first eval_examples of the whole test split.
// Every rank draws its own batches: sample windows (or images) uniformly from its island's shard with an
// engine seeded by (seed, island shard, rank), so ranks of an island see different data and a run
// replays exactly.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "fl/core/tensor_spec.h"

namespace fl::diloco {

struct TaskOptions {
  std::string model = "char-lm";        // "char-lm" | "cnn" | a TorchScript .pt path
  std::string data_dir;                 // empty = the task's default (fortunes / Fashion-MNIST package dirs)
  std::string data;                     // TorchScript models: the data path (default: data_dir)
  std::string task = "classification";  // TorchScript models
  size_t shard = 0;                     // which training shard this island trains on
  size_t num_shards = 1;
  size_t rank = 0;    // data-parallel rank inside the island (its own sample stream)
  uint64_t seed = 1;  // model initialisation (equal on every island) and sampling
  // Where the model, its batches and its evaluation live. The model is initialised on the CPU from the
  // seed and then moved, so every device starts from the same weights.
  torch::Device device = torch::kCPU;
  int64_t batch_size = 32;  // per rank
  // char-lm
  int64_t context = 64;
  int64_t d_model = 64;
  int64_t num_layers = 4;
  int64_t num_heads = 4;
  int64_t eval_windows = 256;  // evaluation windows (non-overlapping, from the start of the eval text)
  // cnn and TorchScript models
  int64_t eval_examples = 2000;  // first n test examples
};

class TrainTask {
 public:
  virtual ~TrainTask() = default;
  // Trainable parameters in spec order (for the optimizer and the flat copies).
  virtual std::vector<torch::Tensor> parameters() = 0;
  virtual const core::ModelSpec& spec() const = 0;
  // Loss of the next training batch (autograd graph attached); advances the sample stream.
  virtual torch::Tensor NextTrainLoss() = 0;
  // Mean loss over the fixed evaluation set (no grad, eval mode).
  virtual double EvalLoss() = 0;
  // Tokens (char-lm) or examples (cnn) in one training batch of this rank.
  virtual uint64_t units_per_batch() const = 0;
};

absl::StatusOr<std::unique_ptr<TrainTask>> CreateTrainTask(const TaskOptions& options);

// Flat fp32 copies of CPU parameters (spec order).
void ParamsToFlat(const std::vector<torch::Tensor>& params, std::span<float> out);
void FlatToParams(std::span<const float> flat, const std::vector<torch::Tensor>& params);

// Copies between the parameters, wherever they live, and the flat fp32 host image in spec order that
// the outer loop works on (OuterState, the fragment plan and the ring all take std::span<float>).
// On the CPU it is ParamsToFlat / FlatToParams as before: no staging buffer, no extra copy. On a GPU:
// one gather into a flat device buffer, one device-to-host copy into pinned memory, one memcpy into the
// image (FromHost the reverse), so each sync crosses PCIe once per direction in one transfer.
class ParamStaging {
 public:
  ParamStaging(std::vector<torch::Tensor> params, torch::Device device);
  void ToHost(std::span<float> out);
  void FromHost(std::span<const float> in);

 private:
  std::vector<torch::Tensor> params_;
  torch::Device device_;
  int64_t numel_ = 0;
  torch::Tensor pinned_;       // GPU only: the host side of every transfer
  torch::Tensor device_flat_;  // GPU only: the parameters gathered in spec order
};

}  // namespace fl::diloco
