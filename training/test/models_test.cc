// Fast tests of the LibTorch side: models, their specs, flat copies, dataset tensors, and the trainer's
// mechanics (parameters, seeds, FedProx, cancellation, options) on small synthetic datasets.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <cmath>
#include <iostream>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "fl/training/torch_models.h"
#include "fl/training/torch_trainer.h"
#include "fl/training/data/deterministic_random.h"

namespace fl::training {
namespace {

std::shared_ptr<TorchModel> Make(std::string_view name, uint64_t seed = 0) {
  auto model = CreateTorchModel(name, seed);
  EXPECT_TRUE(model.ok()) << model.status();
  return *model;
}

std::vector<float> Flat(const TorchModel& model) {
  auto spec = ModelSpecOf(model);
  EXPECT_TRUE(spec.ok()) << spec.status();
  auto tensors = BindTensors(model, *spec);
  EXPECT_TRUE(tensors.ok()) << tensors.status();
  std::vector<float> flat(spec->num_elements());
  EXPECT_TRUE(CopyToFlat(*tensors, *spec, flat).ok());
  return flat;
}

// A learnable synthetic dataset: class c has a bright 6x6 block at a class-specific place, plus noise.
data::Dataset Synthetic(uint32_t n, uint64_t seed) {
  data::Dataset d;
  d.name = "synthetic";
  d.num_examples = n;
  d.rows = 28;
  d.cols = 28;
  d.num_classes = 10;
  d.pixels.resize(static_cast<size_t>(n) * 28 * 28);
  d.labels.resize(n);
  data::Engine engine = data::MakeEngine(seed, 0);
  for (uint32_t i = 0; i < n; ++i) {
    const auto label = static_cast<uint8_t>(i % 10);
    d.labels[i] = label;
    uint8_t* image = d.pixels.data() + static_cast<size_t>(i) * 784;
    for (int p = 0; p < 784; ++p) image[p] = static_cast<uint8_t>(data::UniformIndex(engine, 64));
    const int r0 = 2 + (label / 5) * 12;
    const int c0 = 1 + (label % 5) * 5;
    for (int r = r0; r < r0 + 6; ++r) {
      for (int c = c0; c < c0 + 4; ++c) image[r * 28 + c] = 255;
    }
  }
  return d;
}

double Distance(std::span<const float> a, std::span<const float> b) {
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i) sum += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
  return std::sqrt(sum);
}

TEST(TorchModels, CnnSpecMatchesModule) {
  auto model = Make("cnn");
  auto spec = ModelSpecOf(*model);
  ASSERT_TRUE(spec.ok()) << spec.status();
  const auto named = model->named_parameters();
  ASSERT_EQ(spec->num_tensors(), named.size());  // no buffers in the CNN
  uint64_t total = 0;
  for (size_t i = 0; i < named.size(); ++i) {
    const auto& t = spec->tensors()[i];
    EXPECT_EQ(t.name, named[i].key());
    EXPECT_EQ(t.shape, std::vector<int64_t>(named[i].value().sizes().begin(), named[i].value().sizes().end()));
    EXPECT_EQ(t.dtype, core::DType::kFloat32);
    EXPECT_EQ(t.offset, total);
    total += static_cast<uint64_t>(named[i].value().numel());
  }
  EXPECT_EQ(spec->num_elements(), total);
  EXPECT_EQ(total, 225034u);
  ASSERT_NE(spec->Find("conv1.weight"), nullptr);
  EXPECT_EQ(spec->Find("conv1.weight")->shape, (std::vector<int64_t>{32, 1, 3, 3}));
  EXPECT_EQ(spec->Find("fc1.weight")->shape, (std::vector<int64_t>{128, 1600}));
  EXPECT_EQ(spec->Find("fc2.bias")->shape, (std::vector<int64_t>{10}));
  EXPECT_EQ(model->model_name(), "cnn-fmnist");
}

TEST(TorchModels, SqueezeNetSpecUsesTorchvisionNames) {
  auto model = Make("squeezenet");
  auto spec = ModelSpecOf(*model);
  ASSERT_TRUE(spec.ok()) << spec.status();
  uint64_t total = 0;
  for (const auto& p : model->parameters()) total += static_cast<uint64_t>(p.numel());
  EXPECT_EQ(spec->num_elements(), total);
  EXPECT_EQ(spec->num_tensors(), 2u + 8u * 6u + 2u);  // stem, 8 Fire modules of 3 convs, classifier
  ASSERT_NE(spec->Find("features.0.weight"), nullptr);
  EXPECT_EQ(spec->Find("features.0.weight")->shape, (std::vector<int64_t>{64, 1, 3, 3}));
  ASSERT_NE(spec->Find("features.3.squeeze.weight"), nullptr);
  EXPECT_EQ(spec->Find("features.3.expand3x3.weight")->shape, (std::vector<int64_t>{64, 16, 3, 3}));
  EXPECT_EQ(spec->Find("features.12.expand1x1.weight")->shape, (std::vector<int64_t>{256, 64, 1, 1}));
  EXPECT_EQ(spec->Find("classifier.1.weight")->shape, (std::vector<int64_t>{10, 512, 1, 1}));
  EXPECT_EQ(model->model_name(), "squeezenet1_1-fmnist");
  std::cout << "squeezenet parameters: " << total << "\n";
}

TEST(TorchModels, FingerprintStableAcrossInstancesAndDistinctAcrossModels) {
  auto a = ModelSpecOf(*Make("cnn", 1));
  auto b = ModelSpecOf(*Make("cnn", 2));
  auto s1 = ModelSpecOf(*Make("squeezenet", 1));
  auto s2 = ModelSpecOf(*Make("squeezenet", 1));
  ASSERT_TRUE(a.ok() && b.ok() && s1.ok() && s2.ok());
  EXPECT_EQ(a->fingerprint(), b->fingerprint());
  EXPECT_EQ(s1->fingerprint(), s2->fingerprint());
  EXPECT_NE(a->fingerprint(), s1->fingerprint());
}

TEST(TorchModels, SameSeedSameWeightsDifferentSeedDifferent) {
  for (const char* name : {"cnn", "squeezenet"}) {
    const auto a = Flat(*Make(name, 42));
    const auto b = Flat(*Make(name, 42));
    const auto c = Flat(*Make(name, 43));
    EXPECT_EQ(a, b) << name;
    EXPECT_NE(a, c) << name;
  }
}

TEST(TorchModels, UnknownModelListsTheKnownOnes) {
  auto model = CreateTorchModel("resnet", 0);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(model.status().message());
  EXPECT_NE(message.find("resnet"), std::string::npos) << message;
  EXPECT_NE(message.find("cnn"), std::string::npos) << message;
  EXPECT_NE(message.find("squeezenet"), std::string::npos) << message;
}

TEST(TorchModels, FlatRoundTripAndSizeCheck) {
  auto model = Make("cnn", 3);
  auto spec = ModelSpecOf(*model);
  auto tensors = BindTensors(*model, *spec);
  ASSERT_TRUE(tensors.ok());
  std::vector<float> values(spec->num_elements());
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 1000) * 0.001f - 0.5f;
  ASSERT_TRUE(CopyFromFlat(values, *spec, *tensors).ok());
  EXPECT_EQ(Flat(*model), values);
  // The module's own tensors changed, not copies.
  EXPECT_FLOAT_EQ(model->named_parameters()["conv1.weight"].flatten()[1].item<float>(), values[1]);

  std::vector<float> short_buffer(spec->num_elements() - 1);
  const absl::Status status = CopyFromFlat(short_buffer, *spec, *tensors);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CopyToFlat(*tensors, *spec, short_buffer).code(), absl::StatusCode::kInvalidArgument);
}

TEST(TorchModels, BindTensorsRejectsAnotherModel) {
  auto cnn_spec = ModelSpecOf(*Make("cnn"));
  ASSERT_TRUE(cnn_spec.ok());
  auto bound = BindTensors(*Make("squeezenet"), *cnn_spec);
  ASSERT_FALSE(bound.ok());
  EXPECT_EQ(bound.status().code(), absl::StatusCode::kInvalidArgument);
}

// A module with BatchNorm: its buffers follow its parameters, in state_dict order, int64 as kInt64.
struct WithNormImpl : torch::nn::Module {
  WithNormImpl()
      : conv(register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3)))),
        bn(register_module("bn", torch::nn::BatchNorm2d(4))),
        fc(register_module("fc", torch::nn::Linear(4, 2))) {}
  torch::nn::Conv2d conv;
  torch::nn::BatchNorm2d bn;
  torch::nn::Linear fc;
};

TEST(TorchModels, BuffersAreInTheSpecInStateDictOrder) {
  WithNormImpl module;
  auto spec = ModelSpecOf(module);
  ASSERT_TRUE(spec.ok()) << spec.status();
  std::vector<std::string> names;
  for (const auto& t : spec->tensors()) names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{"conv.weight", "conv.bias", "bn.weight", "bn.bias", "bn.running_mean",
                                             "bn.running_var", "bn.num_batches_tracked", "fc.weight", "fc.bias"}));
  EXPECT_EQ(spec->Find("bn.num_batches_tracked")->dtype, core::DType::kInt64);
  EXPECT_EQ(spec->Find("bn.running_var")->dtype, core::DType::kFloat32);

  auto tensors = BindTensors(module, *spec);
  ASSERT_TRUE(tensors.ok());
  std::vector<float> values(spec->num_elements(), 0.25f);
  values[spec->Find("bn.num_batches_tracked")->offset] = 17.0f;
  ASSERT_TRUE(CopyFromFlat(values, *spec, *tensors).ok());
  EXPECT_EQ(module.bn->num_batches_tracked.item<int64_t>(), 17);
  EXPECT_FLOAT_EQ(module.bn->running_mean[0].item<float>(), 0.25f);
  std::vector<float> back(spec->num_elements());
  ASSERT_TRUE(CopyToFlat(*tensors, *spec, back).ok());
  EXPECT_EQ(back, values);
}

TEST(TorchModels, ForwardShapes) {
  for (const char* name : {"cnn", "squeezenet"}) {
    auto model = Make(name);
    model->eval();
    torch::NoGradGuard no_grad;
    const torch::Tensor out = model->forward(torch::randn({5, 1, 28, 28}));
    EXPECT_EQ(out.sizes(), (std::vector<int64_t>{5, 10})) << name;
  }
}

TEST(TorchModels, FastMaxPoolMatchesTorch) {
  torch::manual_seed(9);
  for (const auto& shape :
       {std::vector<int64_t>{3, 5, 26, 26}, std::vector<int64_t>{2, 4, 11, 11}, std::vector<int64_t>{1, 2, 7, 8}}) {
    // Rounded values make ties (and so the tie-breaking rule) common.
    const torch::Tensor base = torch::round(torch::randn(shape) * 2);
    const torch::Tensor a = base.clone().requires_grad_(true);
    const torch::Tensor b = base.clone().requires_grad_(true);
    const torch::Tensor fast = MaxPool2d2x2(a);
    const torch::Tensor reference = torch::max_pool2d(b, 2);
    ASSERT_EQ(fast.sizes(), reference.sizes());
    EXPECT_TRUE(torch::equal(fast, reference));
    const torch::Tensor upstream = torch::randn(reference.sizes());
    (fast * upstream).sum().backward();
    (reference * upstream).sum().backward();
    EXPECT_TRUE(torch::equal(a.grad(), b.grad())) << shape[2];
  }
  // A non-contiguous input, and NaN propagation.
  torch::Tensor x = torch::randn({2, 3, 8, 8}).transpose(2, 3);
  x.index_put_({0, 0, 1, 1}, std::numeric_limits<float>::quiet_NaN());
  torch::NoGradGuard no_grad;
  const torch::Tensor fast = MaxPool2d2x2(x);
  const torch::Tensor reference = torch::max_pool2d(x, 2);
  EXPECT_TRUE(std::isnan(fast[0][0][0][0].item<float>()));
  EXPECT_TRUE(torch::allclose(fast.nan_to_num(0), reference.nan_to_num(0)));
}

// fl-client's accelerator report at Join (TrainingCudaDevice): nothing for "cpu", nothing for "auto" or "cuda"
// where LibTorch sees no GPU (Debian's LibTorch), and where it sees some, their count.
TEST(TorchModels, TrainingCudaDeviceOnlyWhereLibTorchSeesOne) {
  EXPECT_FALSE(TrainingCudaDevice("cpu").has_value());
  const std::optional<CudaDevice> automatic = TrainingCudaDevice("auto");
  if (!torch::cuda::is_available()) {
    EXPECT_FALSE(automatic.has_value());
    EXPECT_FALSE(TrainingCudaDevice("cuda").has_value());
  } else {
    ASSERT_TRUE(automatic.has_value());
    EXPECT_EQ(automatic->count, static_cast<uint32_t>(torch::cuda::device_count()));
  }
}

TEST(TorchModels, ImagesAreNormalised) {
  data::Dataset d = Synthetic(3, 1);
  d.pixels[784 * 2] = 0;
  d.pixels[784 * 2 + 1] = 255;
  const std::vector<uint32_t> indices = {2, 0};
  const torch::Tensor images = ImagesToTensor(d, indices);
  const torch::Tensor labels = LabelsToTensor(d, indices);
  EXPECT_EQ(images.sizes(), (std::vector<int64_t>{2, 1, 28, 28}));
  EXPECT_EQ(images.scalar_type(), torch::kFloat);
  EXPECT_NEAR(images[0][0][0][0].item<float>(), (0.0 - 0.2860) / 0.3530, 1e-6);
  EXPECT_NEAR(images[0][0][0][1].item<float>(), (1.0 - 0.2860) / 0.3530, 1e-6);
  EXPECT_NEAR(images[1][0][0][5].item<float>(), (d.pixels[5] / 255.0 - 0.2860) / 0.3530, 1e-6);
  EXPECT_EQ(labels.scalar_type(), torch::kLong);
  EXPECT_EQ(labels[0].item<int64_t>(), 2);
  EXPECT_EQ(labels[1].item<int64_t>(), 0);
}

// ---- TorchTrainer on synthetic data ----

class SyntheticTrainer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    train_ = new data::Dataset(Synthetic(800, 7));
    test_ = new data::Dataset(Synthetic(200, 8));
  }
  static void TearDownTestSuite() {
    delete train_;
    delete test_;
  }
  static std::unique_ptr<TorchTrainer> Make(TorchTrainerOptions options = {}) {
    options.num_threads = 1;
    auto trainer = TorchTrainer::Create(options, *train_, *test_);
    EXPECT_TRUE(trainer.ok()) << trainer.status();
    return trainer.ok() ? std::move(*trainer) : nullptr;
  }
  static std::vector<float> Params(TorchTrainer& trainer) {
    std::vector<float> values(trainer.spec().num_elements());
    EXPECT_TRUE(trainer.GetParameters(values).ok());
    return values;
  }
  static data::Dataset* train_;
  static data::Dataset* test_;
};
data::Dataset* SyntheticTrainer::train_ = nullptr;
data::Dataset* SyntheticTrainer::test_ = nullptr;

TEST_F(SyntheticTrainer, ShardsAndNames) {
  TorchTrainerOptions options;
  options.num_clients = 4;
  options.client_index = 1;
  auto trainer = Make(options);
  ASSERT_NE(trainer, nullptr);
  EXPECT_EQ(trainer->num_train_examples(), 200u);
  EXPECT_EQ(trainer->num_test_examples(), 50u);
  EXPECT_EQ(trainer->model_name(), "cnn-fmnist");
  EXPECT_EQ(trainer->device(), "cpu");
  EXPECT_EQ(trainer->spec().num_elements(), 225034u);
}

TEST_F(SyntheticTrainer, SetGetRoundTripAndSizeCheck) {
  auto trainer = Make();
  ASSERT_NE(trainer, nullptr);
  std::vector<float> values(trainer->spec().num_elements());
  for (size_t i = 0; i < values.size(); ++i) values[i] = std::sin(static_cast<float>(i)) * 0.1f;
  ASSERT_TRUE(trainer->SetParameters(values).ok());
  EXPECT_EQ(Params(*trainer), values);

  std::vector<float> wrong(values.size() + 1);
  EXPECT_EQ(trainer->SetParameters(wrong).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(trainer->GetParameters(wrong).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(trainer->Train(wrong, TrainOptions{}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(trainer->Evaluate(wrong).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Params(*trainer), values);  // untouched by the failed calls
}

TEST_F(SyntheticTrainer, SameInitSeedSameInitialParameters) {
  TorchTrainerOptions options;
  options.init_seed = 5;
  options.num_clients = 2;
  options.client_index = 0;
  auto a = Make(options);
  options.client_index = 1;
  auto b = Make(options);
  options.init_seed = 6;
  auto c = Make(options);
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(Params(*a), Params(*b));
  EXPECT_NE(Params(*a), Params(*c));
  EXPECT_EQ(a->spec().fingerprint(), c->spec().fingerprint());
}

TEST_F(SyntheticTrainer, TrainingIsDeterministicAndLearns) {
  auto a = Make();
  auto b = Make();
  ASSERT_TRUE(a && b);
  const std::vector<float> global = Params(*a);
  TrainOptions options;
  options.local_epochs = 2;
  options.batch_size = 20;
  options.learning_rate = 0.05;
  options.momentum = 0.9;
  options.seed = 11;
  auto before = a->Evaluate(global);
  auto ra = a->Train(global, options);
  auto rb = b->Train(global, options);
  ASSERT_TRUE(ra.ok() && rb.ok()) << ra.status() << rb.status();
  EXPECT_EQ(ra->num_examples, 800u);
  EXPECT_EQ(ra->num_steps, 80u);
  EXPECT_EQ(ra->train_loss, rb->train_loss);
  EXPECT_EQ(Params(*a), Params(*b));
  const std::vector<float> trained = Params(*a);
  EXPECT_NE(trained, global);
  auto after = a->Evaluate(trained);
  ASSERT_TRUE(before.ok() && after.ok());
  EXPECT_EQ(after->num_examples, 200u);
  EXPECT_GT(after->accuracy, 0.9);
  EXPECT_LT(after->loss, before->loss);
  // Evaluate does not change the local parameters.
  ASSERT_TRUE(a->Evaluate(global).ok());
  EXPECT_EQ(Params(*a), trained);
}

TEST_F(SyntheticTrainer, StepsModeCountsStepsTimesBatch) {
  auto trainer = Make();
  ASSERT_NE(trainer, nullptr);
  TrainOptions options;
  options.local_steps = 7;
  options.local_epochs = 5;  // ignored
  options.batch_size = 300;  // crosses the epoch boundary of the 800-example shard
  options.optimizer = "adamw";
  options.learning_rate = 1e-3;
  options.weight_decay = 0.01;
  auto result = trainer->Train(Params(*trainer), options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->num_steps, 7u);
  EXPECT_EQ(result->num_examples, 2100u);
  EXPECT_TRUE(std::isfinite(result->train_loss));
  EXPECT_GE(result->train_accuracy, 0.0);
  EXPECT_LE(result->train_accuracy, 1.0);
}

// Device emulation: a client slowed 3x idles twice its compute time after its batches (sleep overshoots, never
// undershoots), trains the same numbers as an unthrottled one, and a data share trains on fewer examples.
TEST_F(SyntheticTrainer, SlowdownIdlesInProportionToComputeAndChangesNothingElse) {
  TorchTrainerOptions slow_options;
  slow_options.slowdown = 3.0;
  auto slow = Make(slow_options);
  auto fast = Make();
  ASSERT_NE(slow, nullptr);
  ASSERT_NE(fast, nullptr);
  TrainOptions options;
  options.local_steps = 5;
  options.batch_size = 64;
  auto a = slow->Train(Params(*slow), options);
  auto b = fast->Train(Params(*fast), options);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_GT(a->compute_seconds, 0.0);
  EXPECT_GE(a->throttled_seconds, 2.0 * a->compute_seconds);
  EXPECT_EQ(b->throttled_seconds, 0.0);
  EXPECT_EQ(a->train_loss, b->train_loss);
  EXPECT_EQ(Params(*slow), Params(*fast));
}

TEST_F(SyntheticTrainer, DataShareTrainsOnThatPartOfTheShard) {
  TorchTrainerOptions options;
  options.data_fraction = 0.25;
  auto trainer = Make(options);
  ASSERT_NE(trainer, nullptr);
  EXPECT_EQ(trainer->num_train_examples(), 200u);  // 800 x 0.25
  TorchTrainerOptions bad;
  bad.data_fraction = 0;
  EXPECT_FALSE(TorchTrainer::Create(bad, *train_, *test_).ok());
  bad.data_fraction = 1;
  bad.slowdown = 0.5;
  auto refused = TorchTrainer::Create(bad, *train_, *test_);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(std::string(refused.status().message()).find("slowdown 0.5"), std::string::npos) << refused.status();
}

TEST_F(SyntheticTrainer, FedProxKeepsWeightsCloserToGlobal) {
  auto trainer = Make();
  ASSERT_NE(trainer, nullptr);
  const std::vector<float> global = Params(*trainer);
  TrainOptions options;
  options.local_steps = 30;
  options.batch_size = 32;
  options.learning_rate = 0.05;
  options.seed = 3;
  ASSERT_TRUE(trainer->Train(global, options).ok());
  const double free_distance = Distance(Params(*trainer), global);
  options.proximal_mu = 10.0;
  ASSERT_TRUE(trainer->Train(global, options).ok());
  const double prox_distance = Distance(Params(*trainer), global);
  std::cout << "||w - w_global||: mu=0 " << free_distance << ", mu=10 " << prox_distance << "\n";
  EXPECT_GT(free_distance, 0);
  EXPECT_LT(prox_distance, 0.7 * free_distance);
}

TEST_F(SyntheticTrainer, CancellationReturnsCancelledAndKeepsParameters) {
  auto trainer = Make();
  ASSERT_NE(trainer, nullptr);
  const std::vector<float> initial = Params(*trainer);
  std::atomic<bool> cancelled{true};
  TrainOptions options;
  options.cancelled = &cancelled;
  auto result = trainer->Train(initial, options);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(Params(*trainer), initial);
  cancelled = false;
  EXPECT_TRUE(trainer->Train(initial, options).ok());
}

TEST_F(SyntheticTrainer, RejectsBadOptions) {
  TorchTrainerOptions bad_model;
  bad_model.model = "vgg";
  EXPECT_EQ(TorchTrainer::Create(bad_model, *train_, *test_).status().code(), absl::StatusCode::kInvalidArgument);
  TorchTrainerOptions bad_device;
  bad_device.device = "tpu";
  EXPECT_EQ(TorchTrainer::Create(bad_device, *train_, *test_).status().code(), absl::StatusCode::kInvalidArgument);
  if (!torch::cuda::is_available()) {
    TorchTrainerOptions cuda;
    cuda.device = "cuda";
    auto status = TorchTrainer::Create(cuda, *train_, *test_).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(std::string(status.message()).find("cuda"), std::string::npos);
  }
  TorchTrainerOptions bad_index;
  bad_index.num_clients = 4;
  bad_index.client_index = 4;
  EXPECT_EQ(TorchTrainer::Create(bad_index, *train_, *test_).status().code(), absl::StatusCode::kInvalidArgument);
  TorchTrainerOptions bad_partition;
  bad_partition.partition = "dirichlet:-1";
  EXPECT_FALSE(TorchTrainer::Create(bad_partition, *train_, *test_).ok());
  TorchTrainerOptions zero_eval_batch;
  zero_eval_batch.eval_batch_size = 0;
  const absl::Status zero_eval = TorchTrainer::Create(zero_eval_batch, *train_, *test_).status();
  EXPECT_EQ(zero_eval.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(zero_eval.message()).find("evaluation batch size 0 must be >= 1"), std::string::npos)
      << zero_eval;

  auto trainer = Make();
  ASSERT_NE(trainer, nullptr);
  const std::vector<float> global = Params(*trainer);
  TrainOptions sgd_typo;
  sgd_typo.optimizer = "sdg";
  EXPECT_EQ(trainer->Train(global, sgd_typo).status().code(), absl::StatusCode::kInvalidArgument);
  TrainOptions zero_batch;
  zero_batch.batch_size = 0;
  EXPECT_EQ(trainer->Train(global, zero_batch).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(SyntheticTrainer, NonFiniteLossIsReportedNotAnError) {
  auto trainer = Make();
  ASSERT_NE(trainer, nullptr);
  std::vector<float> global = Params(*trainer);
  global[0] = std::numeric_limits<float>::quiet_NaN();
  TrainOptions options;
  options.local_steps = 2;
  auto result = trainer->Train(global, options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_FALSE(std::isfinite(result->train_loss));
}

}  // namespace
}  // namespace fl::training
