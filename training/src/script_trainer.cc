#include "fl/training/script_trainer.h"

#include <torch/script.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <utility>

#include "fl/training/script_model.h"
#include "fl/training/torch_models.h"
#include "fl/core/str_cat.h"
#include "fl/training/data/deterministic_random.h"
#include "train_loop.h"

namespace fl::training {
namespace {

using data::Task;

// Examples built by hand (tests, benchmarks) must hold what their shapes say before from_blob reads them.
absl::Status CheckBytes(const data::Examples& e) {
  if (e.x.size() != e.n * e.x_elements() * data::ElementSize(e.x_type) ||
      e.y.size() != e.n * e.y_elements() * data::ElementSize(e.y_type)) {
    return absl::InternalError(fl::StrCat(e.source, ": loaded ", e.x.size(), " x bytes and ", e.y.size(),
                                          " y bytes for ", e.n, " examples, which do not match the shapes"));
  }
  return absl::OkStatus();
}

}  // namespace

struct ScriptTrainer::State {
  ScriptTrainerOptions options;
  Task task = Task::kClassification;
  torch::Device device{torch::kCPU};
  ScriptModel model;
  std::vector<bool> from_global;  // per spec tensor: loaded from the global model (else kept local)
  std::vector<float> local;       // the current local values, flat
  int64_t num_outputs = 0;
  torch::Tensor train_x, train_y, test_x, test_y;

  // The global values into the shared tensors, the local ones into the tensors this client keeps.
  absl::Status Load(std::span<const float> global) {
    const core::ModelSpec& spec = model.spec;
    if (global.size() != spec.num_elements()) {
      return absl::InvalidArgumentError(fl::StrCat("parameter buffer holds ", global.size(), " values; model ",
                                                   model.path, " (spec ", spec.FingerprintHex(), ") has ",
                                                   spec.num_elements()));
    }
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < model.tensors.size(); ++i) {
      const core::TensorSpec& ts = spec.tensors()[i];
      const float* source = (from_global[i] ? global.data() : local.data()) + ts.offset;
      torch::Tensor target = model.tensors[i];
      target.copy_(torch::from_blob(const_cast<float*>(source), target.sizes(), torch::kFloat));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<torch::Tensor> Forward(const torch::Tensor& x) { return ScriptForward(model, x, options.data.path); }
};

ScriptTrainer::ScriptTrainer(std::unique_ptr<State> state) : state_(std::move(state)) {}
ScriptTrainer::~ScriptTrainer() = default;

absl::StatusOr<std::unique_ptr<ScriptTrainer>> ScriptTrainer::Create(const ScriptTrainerOptions& options) {
  auto data = data::LoadClientData(options.data);
  if (!data.ok()) return data.status();
  return Create(options, *data);
}

absl::StatusOr<std::unique_ptr<ScriptTrainer>> ScriptTrainer::Create(const ScriptTrainerOptions& options,
                                                                     const data::ClientData& data) {
  if (options.buffers != "average" && options.buffers != "local") {
    return absl::InvalidArgumentError(
        fl::StrCat("unknown buffers policy '", options.buffers,
                   "'; expected average (FedAvg: float buffers averaged like parameters) or local (every buffer "
                   "stays on the client, FedBN-style)"));
  }
  if (options.num_threads < 0) {
    return absl::InvalidArgumentError(fl::StrCat("num_threads must be >= 0, got ", options.num_threads));
  }
  if (absl::Status s = internal::ValidateEvalBatchSize(options.eval_batch_size); !s.ok()) return s;
  if (!(options.slowdown >= 1)) {
    return absl::InvalidArgumentError(
        fl::StrCat("slowdown ", options.slowdown, " is below 1; a client cannot train faster than its machine"));
  }
  auto device = internal::ResolveDevice(options.device);
  if (!device.ok()) return device.status();
  if (options.num_threads > 0) torch::set_num_threads(options.num_threads);
  for (const data::Examples* e : {&data.train, &data.test}) {
    if (absl::Status s = CheckBytes(*e); !s.ok()) return s;
  }

  auto state = std::make_unique<State>();
  state->options = options;
  state->task = options.data.task;
  state->device = *device;
  auto model = LoadScriptModel(options.model_path, state->device);
  if (!model.ok()) return model.status();
  state->model = std::move(*model);
  const core::ModelSpec& spec = state->model.spec;
  for (size_t i = 0; i < spec.num_tensors(); ++i) {
    const core::DType dtype = spec.tensors()[i].dtype;
    const bool integer = dtype == core::DType::kInt64 || dtype == core::DType::kInt32 || dtype == core::DType::kUInt8;
    const bool buffer = !state->model.is_parameter[i];
    state->from_global.push_back(!integer && !(buffer && options.buffers == "local"));
  }
  state->local.resize(spec.num_elements());
  if (absl::Status s = CopyToFlat(state->model.tensors, spec, state->local); !s.ok()) return s;

  const data::Examples& tr = data.train;
  const data::Examples& te = data.test;
  state->train_x = InputsOf(tr).to(state->device);
  state->train_y = TargetsOf(tr).to(state->device);
  state->test_x = InputsOf(te).to(state->device);
  state->test_y = TargetsOf(te).to(state->device);
  const bool probe_train = tr.n > 0;
  auto outputs = ProbeScriptModel(state->model, state->task, probe_train ? state->train_x : state->test_x,
                                  probe_train ? state->train_y : state->test_y, probe_train ? tr.source : te.source);
  if (!outputs.ok()) return outputs.status();
  state->num_outputs = *outputs;
  if (state->task != Task::kRegression) {
    if (absl::Status s = data::CheckLabelRange(data, state->num_outputs); !s.ok()) return s;
  }
  return std::unique_ptr<ScriptTrainer>(new ScriptTrainer(std::move(state)));
}

const core::ModelSpec& ScriptTrainer::spec() const { return state_->model.spec; }
std::string ScriptTrainer::model_name() const { return std::filesystem::path(state_->model.path).stem().string(); }
std::string ScriptTrainer::task() const { return std::string(data::TaskName(state_->task)); }
uint64_t ScriptTrainer::num_train_examples() const { return static_cast<uint64_t>(state_->train_x.size(0)); }
uint64_t ScriptTrainer::num_test_examples() const { return static_cast<uint64_t>(state_->test_x.size(0)); }
int64_t ScriptTrainer::num_outputs() const { return state_->num_outputs; }
std::string_view ScriptTrainer::device() const { return state_->device.is_cuda() ? "cuda" : "cpu"; }

absl::Status ScriptTrainer::GetParameters(std::span<float> out) {
  if (out.size() != state_->local.size()) {
    return absl::InvalidArgumentError(fl::StrCat("GetParameters: buffer holds ", out.size(), " values; model ",
                                                 model_name(), " has ", state_->local.size()));
  }
  std::copy(state_->local.begin(), state_->local.end(), out.begin());
  return absl::OkStatus();
}

absl::StatusOr<TrainResult> ScriptTrainer::Train(std::span<const float> global, const TrainOptions& options) {
  State& s = *state_;
  if (auto status = internal::ValidateTrainOptions(options); !status.ok()) return status;
  const auto n = static_cast<uint32_t>(s.train_x.size(0));
  if (n == 0) return absl::FailedPreconditionError("the client's train shard is empty");
  if (auto status = s.Load(global); !status.ok()) return status;

  s.model.module.train();
  torch::manual_seed(data::SplitMix64(options.seed));  // dropout masks
  std::unique_ptr<torch::optim::Optimizer> optimizer = internal::MakeOptimizer(s.model.parameters, options);
  std::vector<torch::Tensor> global_parameters;
  if (options.proximal_mu > 0) {
    for (const auto& p : s.model.parameters) global_parameters.push_back(p.detach().clone());
  }

  torch::Tensor loss_sum = torch::zeros({}, torch::TensorOptions().dtype(torch::kDouble).device(s.device));
  torch::Tensor correct = torch::zeros({}, torch::TensorOptions().dtype(torch::kLong).device(s.device));
  int64_t predictions = 0;
  auto step = [&](const torch::Tensor& index) -> absl::Status {
    const torch::Tensor x = s.train_x.index_select(0, index);
    const torch::Tensor y = s.train_y.index_select(0, index);
    optimizer->zero_grad();
    auto out = s.Forward(x);
    if (!out.ok()) return out.status();
    TaskLoss b;
    try {
      b = ComputeTaskLoss(s.task, *out, y);
      b.loss.backward();
    } catch (const std::exception& e) {
      return absl::InvalidArgumentError(fl::StrCat("model ", s.model.path, ": loss/backward failed: ", FirstLineOf(e)));
    }
    if (options.proximal_mu > 0) {
      internal::AddProximalGradient(s.model.parameters, global_parameters, options.proximal_mu);
    }
    optimizer->step();
    torch::NoGradGuard no_grad;
    loss_sum += b.loss.detach().to(torch::kDouble);
    if (b.correct.defined()) correct += b.correct;
    predictions += b.count;
    return absl::OkStatus();
  };
  auto loop = internal::RunTrainLoop(n, options, s.device, s.options.slowdown, step);
  if (!loop.ok()) {
    // Whatever the round did to the model stays out of the local values: the next Load restores them.
    return loop.status();
  }

  if (auto status = CopyToFlat(s.model.tensors, s.model.spec, s.local); !status.ok()) return status;
  const bool counted = s.task != Task::kRegression;
  return internal::ToTrainResult(*loop, loss_sum.item<double>(), counted ? correct.item<int64_t>() : 0,
                                 counted ? predictions : 0);
}

absl::StatusOr<EvalResult> ScriptTrainer::Evaluate(std::span<const float> global) {
  State& s = *state_;
  if (auto status = s.Load(global); !status.ok()) return status;
  s.model.module.eval();
  torch::NoGradGuard no_grad;
  const int64_t n = s.test_x.size(0);
  const auto batch = static_cast<int64_t>(s.options.eval_batch_size);
  double loss_sum = 0, abs_sum = 0;
  int64_t correct = 0, predictions = 0;
  absl::Status failed;
  for (int64_t begin = 0; begin < n && failed.ok(); begin += batch) {
    const int64_t end = std::min(begin + batch, n);
    auto out = s.Forward(s.test_x.slice(0, begin, end));
    if (!out.ok()) {
      failed = out.status();
      break;
    }
    try {
      const TaskLoss b = ComputeTaskLoss(s.task, *out, s.test_y.slice(0, begin, end));
      loss_sum += b.sum.item<double>();
      if (b.correct.defined()) correct += b.correct.item<int64_t>();
      if (b.abs_sum.defined()) abs_sum += b.abs_sum.item<double>();
      predictions += b.count;
    } catch (const std::exception& e) {
      failed = absl::InvalidArgumentError(fl::StrCat("model ", s.model.path, ": evaluation failed: ", FirstLineOf(e)));
    }
  }
  s.model.module.train();
  if (!failed.ok()) return failed;
  EvalResult result;
  result.num_examples = static_cast<uint64_t>(n);
  if (predictions > 0) {
    result.loss = loss_sum / static_cast<double>(predictions);
    if (s.task == Task::kRegression) {
      result.mae = abs_sum / static_cast<double>(predictions);
    } else {
      result.accuracy = static_cast<double>(correct) / static_cast<double>(predictions);
    }
  }
  return result;
}

}  // namespace fl::training
