#include "train_task.h"

#include <cmath>
#include <cstring>

#include "fl/training/script_model.h"
#include "fl/training/torch_models.h"
#include "fl/core/model_file.h"
#include "fl/core/str_cat.h"
#include "fl/training/data/deterministic_random.h"
#include "fl/training/data/fashion_mnist.h"
#include "fl/training/data/partition.h"
#include "fl/diloco/island/text_corpus.h"

namespace fl::diloco {
namespace {

// ---------------------------------------------------------------------------------------------------------
// The character-level transformer (pre-LN GPT block: x += attn(ln1(x)); x += mlp(ln2(x))).

struct CausalSelfAttentionImpl : torch::nn::Module {
  CausalSelfAttentionImpl(int64_t d_model, int64_t heads) : num_heads(heads) {
    qkv = register_module("qkv", torch::nn::Linear(d_model, 3 * d_model));
    proj = register_module("proj", torch::nn::Linear(d_model, d_model));
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask) {
    const int64_t b = x.size(0), t = x.size(1), d = x.size(2), hd = d / num_heads;
    std::vector<torch::Tensor> parts = qkv(x).split(d, /*dim=*/2);
    auto heads = [&](const torch::Tensor& z) { return z.view({b, t, num_heads, hd}).transpose(1, 2); };
    torch::Tensor q = heads(parts[0]), k = heads(parts[1]), v = heads(parts[2]);
    torch::Tensor att = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(hd)));
    att = att.masked_fill(mask.slice(0, 0, t).slice(1, 0, t), -std::numeric_limits<float>::infinity());
    att = torch::softmax(att, -1);
    torch::Tensor y = torch::matmul(att, v).transpose(1, 2).contiguous().view({b, t, d});
    return proj(y);
  }
  int64_t num_heads;
  torch::nn::Linear qkv{nullptr}, proj{nullptr};
};
TORCH_MODULE(CausalSelfAttention);

struct MlpImpl : torch::nn::Module {
  explicit MlpImpl(int64_t d_model) {
    fc = register_module("fc", torch::nn::Linear(d_model, 4 * d_model));
    proj = register_module("proj", torch::nn::Linear(4 * d_model, d_model));
  }
  torch::Tensor forward(const torch::Tensor& x) { return proj(torch::gelu(fc(x))); }
  torch::nn::Linear fc{nullptr}, proj{nullptr};
};
TORCH_MODULE(Mlp);

struct BlockImpl : torch::nn::Module {
  BlockImpl(int64_t d_model, int64_t heads) {
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d_model})));
    attn = register_module("attn", CausalSelfAttention(d_model, heads));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d_model})));
    mlp = register_module("mlp", Mlp(d_model));
  }
  torch::Tensor forward(torch::Tensor x, const torch::Tensor& mask) {
    x = x + attn->forward(ln1(x), mask);
    return x + mlp->forward(ln2(x));
  }
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  CausalSelfAttention attn{nullptr};
  Mlp mlp{nullptr};
};
TORCH_MODULE(Block);

struct CharTransformerImpl : torch::nn::Module {
  CharTransformerImpl(int64_t vocab, int64_t context, int64_t d_model, int64_t layers, int64_t heads) {
    tok_emb = register_parameter("tok_emb", torch::randn({vocab, d_model}) * 0.02);
    pos_emb = register_parameter("pos_emb", torch::randn({context, d_model}) * 0.02);
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (int64_t i = 0; i < layers; ++i) blocks->push_back(Block(d_model, heads));
    ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d_model})));
    head = register_module("head", torch::nn::Linear(d_model, vocab));
    // GPT-2 style init: small normal weights, zero biases.
    for (auto& p : named_parameters()) {
      if (p.key().find("tok_emb") != std::string::npos || p.key().find("pos_emb") != std::string::npos) continue;
      torch::NoGradGuard no_grad;
      if (p.key().ends_with(".bias")) {
        p.value().zero_();
      } else if (p.value().dim() == 2) {
        p.value().normal_(0.0, 0.02);
      }
    }
    mask = torch::triu(torch::ones({context, context}, torch::kBool), /*diagonal=*/1);
  }
  // tokens [B, T] int64 -> logits [B, T, V]
  torch::Tensor forward(const torch::Tensor& tokens) {
    const int64_t t = tokens.size(1);
    torch::Tensor x = torch::embedding(tok_emb, tokens) + pos_emb.slice(0, 0, t);
    for (const auto& block : *blocks) x = block->as<BlockImpl>()->forward(x, mask);
    return head(ln_f(x));
  }
  torch::Tensor tok_emb, pos_emb, mask;
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(CharTransformer);

absl::StatusOr<core::ModelSpec> SpecOfParameters(const torch::nn::Module& module) {
  std::vector<core::TensorSpec> tensors;
  for (const auto& p : module.named_parameters()) {
    core::TensorSpec t;
    t.name = p.key();
    t.shape = p.value().sizes().vec();
    t.dtype = core::DType::kFloat32;
    tensors.push_back(std::move(t));
  }
  return core::ModelSpec::Create(std::move(tensors));
}

class CharLmTask final : public TrainTask {
 public:
  static absl::StatusOr<std::unique_ptr<TrainTask>> Create(const TaskOptions& o) {
    if (o.d_model % o.num_heads != 0) {
      return absl::InvalidArgumentError(fl::StrCat("d_model ", o.d_model, " is not divisible by num_heads ",
                                                   o.num_heads, "; pick heads that divide it"));
    }
    absl::StatusOr<CharCorpus> corpus =
        LoadCharCorpus(o.data_dir.empty() ? std::string(kDefaultFortunesDir) : o.data_dir);
    if (!corpus.ok()) return corpus.status();
    auto task = std::unique_ptr<CharLmTask>(new CharLmTask(o, std::move(*corpus)));
    absl::StatusOr<std::span<const uint8_t>> shard =
        TrainShard(task->corpus_, o.shard, o.num_shards, static_cast<size_t>(o.context) + 2);
    if (!shard.ok()) return shard.status();
    task->shard_ = *shard;
    if (task->corpus_.eval.size() < static_cast<size_t>(o.context) + 1) {
      return absl::FailedPreconditionError("the evaluation text is shorter than one context window");
    }
    absl::StatusOr<core::ModelSpec> spec = SpecOfParameters(*task->model_);
    if (!spec.ok()) return spec.status();
    task->spec_ = std::move(*spec);
    if (!o.device.is_cpu()) {
      task->model_->to(o.device);
      task->model_->mask = task->model_->mask.to(o.device);  // a plain member, not a registered buffer
    }
    return task;
  }

  std::vector<torch::Tensor> parameters() override { return model_->parameters(); }
  const core::ModelSpec& spec() const override { return spec_; }
  uint64_t units_per_batch() const override { return static_cast<uint64_t>(o_.batch_size * o_.context); }

  torch::Tensor NextTrainLoss() override {
    model_->train();
    const int64_t b = o_.batch_size, t = o_.context;
    std::vector<int64_t> window(static_cast<size_t>(b * (t + 1)));
    const uint64_t starts = shard_.size() - static_cast<size_t>(t);
    for (int64_t i = 0; i < b; ++i) {
      const uint64_t s = training::data::UniformIndex(engine_, starts);
      for (int64_t j = 0; j <= t; ++j)
        window[static_cast<size_t>(i * (t + 1) + j)] = shard_[s + static_cast<size_t>(j)];
    }
    return Loss(OnDevice(torch::from_blob(window.data(), {b, t + 1}, torch::kInt64).clone()));
  }

  double EvalLoss() override {
    torch::NoGradGuard no_grad;
    model_->eval();
    const int64_t t = o_.context;
    const auto& text = corpus_.eval;
    const int64_t available = static_cast<int64_t>((text.size() - 1) / static_cast<size_t>(t));
    const int64_t n = std::min(available, o_.eval_windows);
    double total = 0;
    int64_t count = 0;
    for (int64_t first = 0; first < n; first += 64) {
      const int64_t rows = std::min<int64_t>(64, n - first);
      std::vector<int64_t> window(static_cast<size_t>(rows * (t + 1)));
      for (int64_t i = 0; i < rows; ++i) {
        for (int64_t j = 0; j <= t; ++j) {
          window[static_cast<size_t>(i * (t + 1) + j)] = text[static_cast<size_t>((first + i) * t + j)];
        }
      }
      torch::Tensor w = OnDevice(torch::from_blob(window.data(), {rows, t + 1}, torch::kInt64).clone());
      total += Loss(w).item<double>() * static_cast<double>(rows);
      count += rows;
    }
    return total / static_cast<double>(count);
  }

 private:
  CharLmTask(const TaskOptions& o, CharCorpus corpus)
      : o_(o),
        corpus_(std::move(corpus)),
        engine_(training::data::MakeEngine(o.seed, 1000003ull * (o.shard + 1) + o.rank)) {
    torch::manual_seed(static_cast<uint64_t>(o.seed));
    model_ =
        CharTransformer(static_cast<int64_t>(corpus_.vocab_size()), o.context, o.d_model, o.num_layers, o.num_heads);
  }

  // Batches are built on the host; on the CPU they are used as they are (no copy).
  torch::Tensor OnDevice(torch::Tensor host) const { return o_.device.is_cpu() ? host : host.to(o_.device); }

  torch::Tensor Loss(const torch::Tensor& window) {
    const int64_t t = window.size(1) - 1;
    torch::Tensor input = window.slice(1, 0, t);
    torch::Tensor target = window.slice(1, 1, t + 1);
    torch::Tensor logits = model_->forward(input);
    return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), target.reshape({-1}));
  }

  TaskOptions o_;
  CharCorpus corpus_;
  std::span<const uint8_t> shard_;
  training::data::Engine engine_;
  CharTransformer model_{nullptr};
  core::ModelSpec spec_;
};

// ---------------------------------------------------------------------------------------------------------
// Fashion-MNIST with fl-client's CNN.

class CnnTask final : public TrainTask {
 public:
  static absl::StatusOr<std::unique_ptr<TrainTask>> Create(const TaskOptions& o) {
    const std::string dir = o.data_dir.empty() ? std::string(training::data::kDefaultFashionMnistDir) : o.data_dir;
    // Only this shard's images are read (fashion_mnist.h: labels first, then the partition's rows), and only the
    // test images evaluated: an island holds its part of the 47 MB training split, not all of it.
    absl::StatusOr<std::vector<uint8_t>> train_labels =
        training::data::LoadFashionMnistLabels(dir, training::data::Split::kTrain);
    if (!train_labels.ok()) return train_labels.status();
    absl::StatusOr<std::vector<uint8_t>> test_labels =
        training::data::LoadFashionMnistLabels(dir, training::data::Split::kTest);
    if (!test_labels.ok()) return test_labels.status();
    absl::StatusOr<std::vector<uint32_t>> rows =
        training::data::PartitionFor(static_cast<uint32_t>(o.shard), training::data::PartitionSpec::Iid(),
                                     *train_labels, static_cast<uint32_t>(o.num_shards), o.seed);
    if (!rows.ok()) return rows.status();
    absl::StatusOr<training::data::Dataset> train =
        training::data::LoadFashionMnistRows(dir, training::data::Split::kTrain, *rows);
    if (!train.ok()) return train.status();
    std::vector<uint32_t> eval_idx(
        std::min<size_t>(static_cast<size_t>(std::max<int64_t>(o.eval_examples, 0)), test_labels->size()));
    for (size_t i = 0; i < eval_idx.size(); ++i) eval_idx[i] = static_cast<uint32_t>(i);
    absl::StatusOr<training::data::Dataset> test =
        training::data::LoadFashionMnistRows(dir, training::data::Split::kTest, eval_idx);
    if (!test.ok()) return test.status();
    absl::StatusOr<std::shared_ptr<training::TorchModel>> model = training::CreateTorchModel("cnn", o.seed);
    if (!model.ok()) return model.status();
    auto task = std::unique_ptr<CnnTask>(new CnnTask(o));
    task->model_ = std::move(*model);
    absl::StatusOr<core::ModelSpec> spec = SpecOfParameters(*task->model_);
    if (!spec.ok()) return spec.status();
    task->spec_ = std::move(*spec);
    task->train_ = std::move(*train);  // example k is row (*rows)[k] of the split
    for (size_t i = 0; i < eval_idx.size(); ++i) eval_idx[i] = static_cast<uint32_t>(i);  // the rows read, in order
    task->eval_images_ = task->OnDevice(training::ImagesToTensor(*test, eval_idx));
    task->eval_labels_ = task->OnDevice(training::LabelsToTensor(*test, eval_idx));
    if (!o.device.is_cpu()) task->model_->to(o.device);
    return task;
  }

  std::vector<torch::Tensor> parameters() override { return model_->parameters(); }
  const core::ModelSpec& spec() const override { return spec_; }
  uint64_t units_per_batch() const override { return static_cast<uint64_t>(o_.batch_size); }

  torch::Tensor NextTrainLoss() override {
    model_->train();
    std::vector<uint32_t> batch(static_cast<size_t>(o_.batch_size));
    // The same draws as over the whole split's partition rows: position k of the shard is its k-th row.
    for (auto& i : batch) i = static_cast<uint32_t>(training::data::UniformIndex(engine_, train_.num_examples));
    torch::Tensor logits = model_->forward(OnDevice(training::ImagesToTensor(train_, batch)));
    return torch::nn::functional::cross_entropy(logits, OnDevice(training::LabelsToTensor(train_, batch)));
  }

  double EvalLoss() override {
    torch::NoGradGuard no_grad;
    model_->eval();
    // In batches of fl-client's evaluation batch: the 2,000 images in one forward held ~470 MB of activations
    // (fl-island's peak was 573 MiB; the losses are summed, so the mean does not depend on the batch).
    const int64_t n = eval_images_.size(0);
    if (n == 0) return std::nan("");  // as the mean of nothing
    constexpr int64_t step = 100;     // fl-client's default evaluation batch (kDefaultEvalBatchSize)
    double sum = 0;
    for (int64_t begin = 0; begin < n; begin += step) {
      const int64_t end = std::min(begin + step, n);
      torch::Tensor logits = model_->forward(eval_images_.slice(0, begin, end));
      sum +=
          torch::nn::functional::cross_entropy(logits, eval_labels_.slice(0, begin, end),
                                               torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
              .item<double>();
    }
    return sum / static_cast<double>(n);
  }

 private:
  explicit CnnTask(const TaskOptions& o)
      : o_(o), engine_(training::data::MakeEngine(o.seed, 1000003ull * (o.shard + 1) + o.rank)) {}
  torch::Tensor OnDevice(torch::Tensor host) const { return o_.device.is_cpu() ? host : host.to(o_.device); }

  TaskOptions o_;
  training::data::Engine engine_;
  std::shared_ptr<training::TorchModel> model_;
  core::ModelSpec spec_;
  training::data::Dataset train_;  // this shard's examples only
  torch::Tensor eval_images_, eval_labels_;
};

// ---------------------------------------------------------------------------------------------------------
// A user's TorchScript model on the user's data.

class ScriptTask final : public TrainTask {
 public:
  static absl::StatusOr<std::unique_ptr<TrainTask>> Create(const TaskOptions& o) {
    auto task_kind = training::data::ParseTask(o.task);
    if (!task_kind.ok()) return task_kind.status();
    training::data::DataOptions d;
    d.path = !o.data.empty()       ? o.data
             : !o.data_dir.empty() ? o.data_dir
                                   : std::string(training::data::kDefaultFashionMnistDir);
    d.task = *task_kind;
    d.partition = "iid";
    d.client_index = static_cast<uint32_t>(o.shard);
    d.num_clients = static_cast<uint32_t>(o.num_shards);
    d.partition_seed = o.seed;
    d.seq_len = static_cast<uint32_t>(o.context);
    absl::StatusOr<training::data::ClientData> shard = training::data::LoadClientData(d);
    if (!shard.ok()) return shard.status();
    // Every island evaluates on the same examples: the start of the whole test split (client 0 of 1; its train
    // share is cut to one example, so the second load costs little).
    training::data::DataOptions whole = d;
    whole.client_index = 0;
    whole.num_clients = 1;
    whole.data_fraction = 1e-9;
    absl::StatusOr<training::data::ClientData> eval = training::data::LoadClientData(whole);
    if (!eval.ok()) return eval.status();

    // Loaded straight onto the device: every island and rank starts from the file's weights.
    absl::StatusOr<training::ScriptModel> model = training::LoadScriptModel(o.model, o.device);
    if (!model.ok()) return model.status();
    auto task = std::unique_ptr<ScriptTask>(new ScriptTask(o, *task_kind));
    task->model_ = std::move(*model);
    task->train_x_ = training::InputsOf(shard->train).to(o.device);
    task->train_y_ = training::TargetsOf(shard->train).to(o.device);
    const int64_t n_eval = std::min<int64_t>(o.eval_examples, static_cast<int64_t>(eval->test.n));
    task->eval_x_ = training::InputsOf(eval->test).slice(0, 0, n_eval).to(o.device);
    task->eval_y_ = training::TargetsOf(eval->test).slice(0, 0, n_eval).to(o.device);
    if (task->train_x_.size(0) == 0) {
      return absl::InvalidArgumentError(
          fl::StrCat(d.path, ": island shard ", o.shard, " of ", o.num_shards, " has no training examples"));
    }
    auto outputs = training::ProbeScriptModel(task->model_, *task_kind, task->train_x_, task->train_y_, d.path);
    if (!outputs.ok()) return outputs.status();
    if (*task_kind != training::data::Task::kRegression) {
      if (absl::Status s = training::data::CheckLabelRange(*shard, *outputs); !s.ok()) return s;
    }
    std::vector<core::TensorSpec> specs;
    for (size_t i = 0; i < task->model_.tensors.size(); ++i) {
      if (!task->model_.is_parameter[i] || !task->model_.tensors[i].requires_grad()) continue;
      specs.push_back(task->model_.spec.tensors()[i]);
    }
    absl::StatusOr<core::ModelSpec> spec = core::ModelSpec::Create(std::move(specs));
    if (!spec.ok()) return spec.status();
    task->spec_ = std::move(*spec);
    // The trainable parameters in spec order (state_dict order, as the flat image and the fragment plan see them).
    task->parameters_ = task->model_.parameters;
    return task;
  }

  std::vector<torch::Tensor> parameters() override { return parameters_; }
  const core::ModelSpec& spec() const override { return spec_; }
  uint64_t units_per_batch() const override {
    uint64_t per_example = 1;
    if (kind_ == training::data::Task::kNextToken) per_example = static_cast<uint64_t>(train_y_.size(1));  // tokens
    return static_cast<uint64_t>(o_.batch_size) * per_example;
  }

  torch::Tensor NextTrainLoss() override {
    model_.module.train();
    std::vector<int64_t> batch(static_cast<size_t>(o_.batch_size));
    for (auto& i : batch)
      i = static_cast<int64_t>(training::data::UniformIndex(engine_, static_cast<uint64_t>(train_x_.size(0))));
    const torch::Tensor index = torch::tensor(batch, torch::kLong).to(train_x_.device());
    absl::StatusOr<torch::Tensor> out = training::ScriptForward(model_, train_x_.index_select(0, index), o_.model);
    // The probe ran this forward on the same data at Create; a failure here is a model bug worth a stop.
    if (!out.ok()) throw std::runtime_error(std::string(out.status().message()));
    return training::ComputeTaskLoss(kind_, *out, train_y_.index_select(0, index)).loss;
  }

  double EvalLoss() override {
    torch::NoGradGuard no_grad;
    model_.module.eval();
    double sum = 0;
    int64_t count = 0;
    for (int64_t begin = 0; begin < eval_x_.size(0); begin += 500) {
      const int64_t end = std::min<int64_t>(begin + 500, eval_x_.size(0));
      absl::StatusOr<torch::Tensor> out = training::ScriptForward(model_, eval_x_.slice(0, begin, end), o_.model);
      if (!out.ok()) throw std::runtime_error(std::string(out.status().message()));
      const training::TaskLoss b = training::ComputeTaskLoss(kind_, *out, eval_y_.slice(0, begin, end));
      sum += b.sum.item<double>();
      count += b.count;
    }
    model_.module.train();
    return count > 0 ? sum / static_cast<double>(count) : 0.0;
  }

 private:
  ScriptTask(const TaskOptions& o, training::data::Task kind)
      : o_(o), kind_(kind), engine_(training::data::MakeEngine(o.seed, 1000003ull * (o.shard + 1) + o.rank)) {}

  TaskOptions o_;
  training::data::Task kind_;
  training::data::Engine engine_;
  training::ScriptModel model_;
  core::ModelSpec spec_;
  std::vector<torch::Tensor> parameters_;
  torch::Tensor train_x_, train_y_, eval_x_, eval_y_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<TrainTask>> CreateTrainTask(const TaskOptions& options) {
  if (options.batch_size < 1) {
    return absl::InvalidArgumentError(fl::StrCat("batch_size is ", options.batch_size, "; use at least 1"));
  }
  if (options.model == "char-lm") return CharLmTask::Create(options);
  if (options.model == "cnn") return CnnTask::Create(options);
  if (core::IsTorchScriptModelPath(options.model)) {
    return ScriptTask::Create(options);
  }
  return absl::InvalidArgumentError(fl::StrCat("unknown model '", options.model,
                                               "'; use char-lm (fortunes), cnn (Fashion-MNIST) or the path of a "
                                               "TorchScript .pt file"));
}

void ParamsToFlat(const std::vector<torch::Tensor>& params, std::span<float> out) {
  size_t k = 0;
  for (const torch::Tensor& p : params) {
    torch::Tensor c = p.detach().to(torch::kFloat32).contiguous();
    const size_t n = static_cast<size_t>(c.numel());
    std::memcpy(out.data() + k, c.data_ptr<float>(), n * sizeof(float));
    k += n;
  }
}

void FlatToParams(std::span<const float> flat, const std::vector<torch::Tensor>& params) {
  torch::NoGradGuard no_grad;
  size_t k = 0;
  for (const torch::Tensor& p : params) {
    const size_t n = static_cast<size_t>(p.numel());
    torch::Tensor src = torch::from_blob(const_cast<float*>(flat.data() + k), p.sizes(), torch::kFloat32);
    p.copy_(src);
    k += n;
  }
}

ParamStaging::ParamStaging(std::vector<torch::Tensor> params, torch::Device device)
    : params_(std::move(params)), device_(device) {
  for (const torch::Tensor& p : params_) numel_ += p.numel();
  if (!device_.is_cpu()) {
    pinned_ = torch::empty({numel_}, torch::TensorOptions().dtype(torch::kFloat32).pinned_memory(true));
    device_flat_ = torch::empty({numel_}, torch::TensorOptions().dtype(torch::kFloat32).device(device_));
  }
}

void ParamStaging::ToHost(std::span<float> out) {
  if (device_.is_cpu()) {
    ParamsToFlat(params_, out);
    return;
  }
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> flat_views;
  flat_views.reserve(params_.size());
  for (const torch::Tensor& p : params_) flat_views.push_back(p.detach().to(torch::kFloat32).reshape({-1}));
  torch::cat_out(device_flat_, flat_views);
  pinned_.copy_(device_flat_);  // blocking: the image is read right after
  std::memcpy(out.data(), pinned_.data_ptr<float>(), static_cast<size_t>(numel_) * sizeof(float));
}

void ParamStaging::FromHost(std::span<const float> in) {
  if (device_.is_cpu()) {
    FlatToParams(in, params_);
    return;
  }
  torch::NoGradGuard no_grad;
  std::memcpy(pinned_.data_ptr<float>(), in.data(), static_cast<size_t>(numel_) * sizeof(float));
  device_flat_.copy_(pinned_);  // blocking, so pinned_ may be rewritten as soon as this returns
  int64_t k = 0;
  for (const torch::Tensor& p : params_) {
    const int64_t n = p.numel();
    p.copy_(device_flat_.slice(0, k, k + n).view(p.sizes()));
    k += n;
  }
}

}  // namespace fl::diloco
