#include "fl/training/torch_trainer.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <initializer_list>
#include <numeric>
#include <thread>
#include <utility>

#include "absl/strings/str_join.h"
#include "fl/training/torch_models.h"
#include "fl/core/str_cat.h"
#include "fl/training/data/deterministic_random.h"
#include "fl/training/data/partition.h"
#include "train_loop.h"

namespace fl::training {

struct TorchTrainer::State {
  TorchTrainerOptions options;
  torch::Device device{torch::kCPU};
  std::shared_ptr<TorchModel> model;
  core::ModelSpec spec;
  std::vector<torch::Tensor> tensors;     // every parameter and buffer, spec order
  std::vector<torch::Tensor> parameters;  // the trainable ones (optimizer, FedProx)
  std::vector<float> local;               // the current local parameters, flat
  torch::Tensor train_images;             // [n, 1, 28, 28] float, normalised, on `device`
  torch::Tensor train_labels;             // [n] int64
  torch::Tensor test_images;
  torch::Tensor test_labels;

  absl::Status Load(std::span<const float> flat) { return CopyFromFlat(flat, spec, tensors); }
};

TorchTrainer::TorchTrainer(std::unique_ptr<State> state) : state_(std::move(state)) {}
TorchTrainer::~TorchTrainer() = default;

namespace {

// What a trainer is built from, chosen before any image is needed: the device and this client's rows.
struct ShardPlan {
  torch::Device device{torch::kCPU};
  std::vector<uint32_t> train_rows;  // of the training split, the partition's order, cut to data_fraction
  std::vector<uint32_t> test_rows;   // of the test split: this client's IID part
};

// Validates the options and the datasets (those given; none when only the labels have been read) and picks
// this client's rows from the splits' labels.
absl::StatusOr<ShardPlan> PlanShard(const TorchTrainerOptions& options, std::span<const uint8_t> train_labels,
                                    std::span<const uint8_t> test_labels,
                                    std::initializer_list<const data::Dataset*> datasets) {
  if (options.num_clients == 0) return absl::InvalidArgumentError("num_clients must be >= 1");
  if (options.client_index >= options.num_clients) {
    return absl::InvalidArgumentError(fl::StrCat("client_index ", options.client_index, " is out of range for ",
                                                 options.num_clients, " clients (expected 0..", options.num_clients - 1,
                                                 ")"));
  }
  if (options.num_threads < 0) {
    return absl::InvalidArgumentError(fl::StrCat("num_threads must be >= 0, got ", options.num_threads));
  }
  if (absl::Status s = internal::ValidateEvalBatchSize(options.eval_batch_size); !s.ok()) return s;
  for (const data::Dataset* dataset : datasets) {
    if (dataset->rows != data::kFashionMnistRows || dataset->cols != data::kFashionMnistCols ||
        dataset->num_classes != data::kFashionMnistClasses) {
      return absl::InvalidArgumentError(fl::StrCat("dataset ", dataset->name, " is ", dataset->rows, "x", dataset->cols,
                                                   " with ", dataset->num_classes,
                                                   " classes; the models expect 28x28 with 10"));
    }
  }
  auto device = internal::ResolveDevice(options.device);
  if (!device.ok()) return device.status();
  auto partition = data::PartitionSpec::Parse(options.partition);
  if (!partition.ok()) return partition.status();

  auto train_rows =
      data::PartitionFor(options.client_index, *partition, train_labels, options.num_clients, options.partition_seed);
  if (!train_rows.ok()) return train_rows.status();
  if (!(options.data_fraction > 0 && options.data_fraction <= 1)) {
    return absl::InvalidArgumentError(
        fl::StrCat("data fraction ", options.data_fraction, " is outside (0, 1]; give the share of the shard to use"));
  }
  if (!(options.slowdown >= 1)) {
    return absl::InvalidArgumentError(
        fl::StrCat("slowdown ", options.slowdown, " is below 1; a client cannot train faster than its machine"));
  }
  if (options.data_fraction < 1) {
    const size_t keep = std::max<size_t>(
        1, static_cast<size_t>(std::ceil(options.data_fraction * static_cast<double>(train_rows->size()))));
    train_rows->resize(std::min(keep, train_rows->size()));
  }
  auto test_rows = data::PartitionFor(options.client_index, data::PartitionSpec::Iid(), test_labels,
                                      options.num_clients, options.partition_seed);
  if (!test_rows.ok()) return test_rows.status();
  return ShardPlan{*device, std::move(*train_rows), std::move(*test_rows)};
}

std::vector<uint32_t> AllRows(const data::Dataset& dataset) {
  std::vector<uint32_t> rows(dataset.num_examples);
  std::iota(rows.begin(), rows.end(), 0u);
  return rows;
}

// The model, and the tensors of rows `plan.train_rows` of `train` and `plan.test_rows` of `test`.
absl::StatusOr<std::unique_ptr<TorchTrainer::State>> BuildState(const TorchTrainerOptions& options,
                                                                const ShardPlan& plan, const data::Dataset& train,
                                                                const data::Dataset& test) {
  if (options.num_threads > 0) torch::set_num_threads(options.num_threads);
  auto state = std::make_unique<TorchTrainer::State>();
  state->options = options;
  state->device = plan.device;
  auto model = CreateTorchModel(options.model, options.init_seed);
  if (!model.ok()) return model.status();
  state->model = std::move(*model);
  state->model->to(state->device);
  auto spec = ModelSpecOf(*state->model);
  if (!spec.ok()) return spec.status();
  state->spec = std::move(*spec);
  auto tensors = BindTensors(*state->model, state->spec);
  if (!tensors.ok()) return tensors.status();
  state->tensors = std::move(*tensors);
  state->parameters = state->model->parameters();
  state->local.resize(state->spec.num_elements());
  if (auto status = CopyToFlat(state->tensors, state->spec, state->local); !status.ok()) return status;

  state->train_images = ImagesToTensor(train, plan.train_rows).to(state->device);
  state->train_labels = LabelsToTensor(train, plan.train_rows).to(state->device);
  state->test_images = ImagesToTensor(test, plan.test_rows).to(state->device);
  state->test_labels = LabelsToTensor(test, plan.test_rows).to(state->device);
  return state;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TorchTrainer>> TorchTrainer::Create(const TorchTrainerOptions& options) {
  // The labels first (60 KB for the training split), then only this client's images: the whole 47 MB
  // training split was the start-up peak of a client on a small board.
  auto train_labels = data::LoadFashionMnistLabels(options.data_dir, data::Split::kTrain);
  if (!train_labels.ok()) return train_labels.status();
  auto test_labels = data::LoadFashionMnistLabels(options.data_dir, data::Split::kTest);
  if (!test_labels.ok()) return test_labels.status();
  auto plan = PlanShard(options, *train_labels, *test_labels, {});
  if (!plan.ok()) return plan.status();
  auto train = data::LoadFashionMnistRows(options.data_dir, data::Split::kTrain, plan->train_rows);
  if (!train.ok()) return train.status();
  auto test = data::LoadFashionMnistRows(options.data_dir, data::Split::kTest, plan->test_rows);
  if (!test.ok()) return test.status();
  // The datasets now hold exactly the shard, in order: every one of their rows is kept.
  plan->train_rows = AllRows(*train);
  plan->test_rows = AllRows(*test);
  auto state = BuildState(options, *plan, *train, *test);
  if (!state.ok()) return state.status();
  return std::unique_ptr<TorchTrainer>(new TorchTrainer(std::move(*state)));
}

absl::StatusOr<std::unique_ptr<TorchTrainer>> TorchTrainer::Create(const TorchTrainerOptions& options,
                                                                   const data::Dataset& train,
                                                                   const data::Dataset& test) {
  auto plan = PlanShard(options, train.labels, test.labels, {&train, &test});
  if (!plan.ok()) return plan.status();
  auto state = BuildState(options, *plan, train, test);
  if (!state.ok()) return state.status();
  return std::unique_ptr<TorchTrainer>(new TorchTrainer(std::move(*state)));
}

const core::ModelSpec& TorchTrainer::spec() const { return state_->spec; }
std::string TorchTrainer::model_name() const { return state_->model->model_name(); }
uint64_t TorchTrainer::num_train_examples() const { return static_cast<uint64_t>(state_->train_labels.size(0)); }
uint64_t TorchTrainer::num_test_examples() const { return static_cast<uint64_t>(state_->test_labels.size(0)); }
std::string_view TorchTrainer::device() const { return state_->device.is_cuda() ? "cuda" : "cpu"; }
const TorchTrainerOptions& TorchTrainer::options() const { return state_->options; }

absl::Status TorchTrainer::GetParameters(std::span<float> out) {
  if (out.size() != state_->local.size()) {
    return absl::InvalidArgumentError(fl::StrCat("GetParameters: buffer holds ", out.size(), " values; model ",
                                                 model_name(), " has ", state_->local.size()));
  }
  std::copy(state_->local.begin(), state_->local.end(), out.begin());
  return absl::OkStatus();
}

absl::Status TorchTrainer::SetParameters(std::span<const float> values) {
  if (auto status = state_->Load(values); !status.ok()) return status;
  state_->local.assign(values.begin(), values.end());
  return absl::OkStatus();
}

absl::StatusOr<TrainResult> TorchTrainer::Train(std::span<const float> global, const TrainOptions& options) {
  State& s = *state_;
  if (auto status = internal::ValidateTrainOptions(options); !status.ok()) return status;
  const auto n = static_cast<uint32_t>(s.train_labels.size(0));
  if (n == 0) return absl::FailedPreconditionError("the client's train shard is empty");
  if (auto status = s.Load(global); !status.ok()) return status;

  s.model->train();
  torch::manual_seed(data::SplitMix64(options.seed));  // dropout masks

  std::unique_ptr<torch::optim::Optimizer> optimizer = internal::MakeOptimizer(s.parameters, options);
  std::vector<torch::Tensor> global_parameters;
  if (options.proximal_mu > 0) {
    for (const auto& p : s.parameters) global_parameters.push_back(p.detach().clone());
  }

  torch::Tensor loss_sum = torch::zeros({}, torch::TensorOptions().dtype(torch::kDouble).device(s.device));
  torch::Tensor correct = torch::zeros({}, torch::TensorOptions().dtype(torch::kLong).device(s.device));
  auto step = [&](const torch::Tensor& index) -> absl::Status {
    const torch::Tensor images = s.train_images.index_select(0, index);
    const torch::Tensor labels = s.train_labels.index_select(0, index);
    optimizer->zero_grad();
    const torch::Tensor logits = s.model->forward(images);
    const torch::Tensor loss = torch::nn::functional::cross_entropy(logits, labels);
    loss.backward();
    if (options.proximal_mu > 0) internal::AddProximalGradient(s.parameters, global_parameters, options.proximal_mu);
    optimizer->step();
    torch::NoGradGuard no_grad;
    loss_sum += loss.detach().to(torch::kDouble);
    correct += logits.detach().argmax(1).eq(labels).sum();
    return absl::OkStatus();
  };
  auto loop = internal::RunTrainLoop(n, options, s.device, s.options.slowdown, step);
  if (!loop.ok()) return loop.status();

  if (auto status = CopyToFlat(s.tensors, s.spec, s.local); !status.ok()) return status;
  return internal::ToTrainResult(*loop, loss_sum.item<double>(), correct.item<int64_t>(),
                                 static_cast<int64_t>(loop->seen));
}

absl::StatusOr<EvalResult> TorchTrainer::Evaluate(std::span<const float> global) {
  State& s = *state_;
  if (auto status = s.Load(global); !status.ok()) return status;
  s.model->eval();
  torch::NoGradGuard no_grad;
  const int64_t n = s.test_labels.size(0);
  const auto batch = static_cast<int64_t>(s.options.eval_batch_size);
  double loss_sum = 0;
  int64_t correct = 0;
  for (int64_t begin = 0; begin < n; begin += batch) {
    const int64_t end = std::min(begin + batch, n);
    const torch::Tensor labels = s.test_labels.slice(0, begin, end);
    const torch::Tensor logits = s.model->forward(s.test_images.slice(0, begin, end));
    loss_sum += torch::nn::functional::cross_entropy(
                    logits, labels, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                    .item<double>();
    correct += logits.argmax(1).eq(labels).sum().item<int64_t>();
  }
  s.model->train();
  EvalResult result;
  result.num_examples = static_cast<uint64_t>(n);
  if (n > 0) {
    result.loss = loss_sum / static_cast<double>(n);
    result.accuracy = static_cast<double>(correct) / static_cast<double>(n);
  }
  return result;
}

}  // namespace fl::training
