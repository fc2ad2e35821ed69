// Slow tests: real Fashion-MNIST training with TorchTrainer (FL_FASHION_MNIST_DIR overrides the dataset
// directory). Timings are printed, not asserted: the build machines are shared.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <numeric>
#include <string>
#include <vector>

#include "fl/training/torch_models.h"
#include "fl/training/torch_trainer.h"
#include "fl/testing/suite_set_up.h"

namespace fl::training {
namespace {

std::string DatasetDir() {
  const char* env = std::getenv("FL_FASHION_MNIST_DIR");
  return env != nullptr && *env != '\0' ? std::string(env) : std::string(data::kDefaultFashionMnistDir);
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

class FashionMnistTraining : public ::testing::Test {
 protected:
  void SetUp() override { fl::testing::SetUpSuiteOnce<FashionMnistTraining>(&FashionMnistTraining::SetUpSuite); }
  // Once, from the first test's SetUp (suite_set_up.h: a failure here fails the tests, not skips them).
  static void SetUpSuite() {
    auto train = data::LoadFashionMnist(DatasetDir(), data::Split::kTrain);
    auto test = data::LoadFashionMnist(DatasetDir(), data::Split::kTest);
    ASSERT_TRUE(train.ok()) << train.status();
    ASSERT_TRUE(test.ok()) << test.status();
    train_ = new data::Dataset(std::move(*train));
    test_ = new data::Dataset(std::move(*test));
  }
  static void TearDownTestSuite() {
    delete train_;
    delete test_;
    train_ = test_ = nullptr;
  }

  static std::unique_ptr<TorchTrainer> Make(std::string model, uint32_t client_index, uint32_t num_clients = 4) {
    TorchTrainerOptions options;
    options.model = std::move(model);
    options.client_index = client_index;
    options.num_clients = num_clients;
    options.partition = "iid";
    options.partition_seed = 1;
    options.init_seed = 7;
    options.num_threads = 1;
    options.device = "cpu";
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
data::Dataset* FashionMnistTraining::train_ = nullptr;
data::Dataset* FashionMnistTraining::test_ = nullptr;

TEST_F(FashionMnistTraining, CnnOneEpochOnQuarterShardReachesSeventyFivePercent) {
  const auto t0 = std::chrono::steady_clock::now();
  TorchTrainerOptions options;
  options.data_dir = DatasetDir();
  options.num_clients = 4;
  options.num_threads = 1;
  auto created = TorchTrainer::Create(options);  // the loading path, from the files
  ASSERT_TRUE(created.ok()) << created.status();
  TorchTrainer& trainer = **created;
  std::cout << "create (load + partition + tensors): " << Seconds(t0) << " s\n";
  EXPECT_EQ(trainer.num_train_examples(), 15000u);
  EXPECT_EQ(trainer.num_test_examples(), 2500u);

  const std::vector<float> global = Params(trainer);
  auto before = trainer.Evaluate(global);
  ASSERT_TRUE(before.ok());
  TrainOptions train_options;
  train_options.local_epochs = 1;
  train_options.batch_size = 32;
  train_options.learning_rate = 0.05;
  train_options.momentum = 0.9;
  train_options.seed = 1;
  const auto t1 = std::chrono::steady_clock::now();
  auto result = trainer.Train(global, train_options);
  const double train_seconds = Seconds(t1);
  ASSERT_TRUE(result.ok()) << result.status();
  const auto t2 = std::chrono::steady_clock::now();
  auto after = trainer.Evaluate(Params(trainer));
  const double eval_seconds = Seconds(t2);
  ASSERT_TRUE(after.ok());
  std::cout << "cnn, 1 thread, 1 epoch over 15000 examples (batch 32): " << train_seconds << " s, " << result->num_steps
            << " steps, train loss " << result->train_loss << ", train accuracy " << result->train_accuracy << "\n"
            << "test shard (2500): accuracy " << before->accuracy << " -> " << after->accuracy << ", loss "
            << before->loss << " -> " << after->loss << " (eval " << eval_seconds << " s)\n";
  EXPECT_EQ(result->num_examples, 15000u);
  EXPECT_EQ(result->num_steps, 469u);
  EXPECT_GT(after->accuracy, 0.75);
  EXPECT_LT(after->loss, before->loss);
}

TEST_F(FashionMnistTraining, WeightedShardEvaluationEqualsFullTestSet) {
  std::vector<std::unique_ptr<TorchTrainer>> clients;
  for (uint32_t i = 0; i < 4; ++i) clients.push_back(Make("cnn", i));
  for (const auto& c : clients) ASSERT_NE(c, nullptr);
  TrainOptions train_options;
  train_options.local_steps = 100;
  train_options.batch_size = 32;
  train_options.learning_rate = 0.05;
  train_options.momentum = 0.9;
  ASSERT_TRUE(clients[0]->Train(Params(*clients[0]), train_options).ok());
  const std::vector<float> trained = Params(*clients[0]);

  double weighted_accuracy = 0;
  double weighted_loss = 0;
  uint64_t total = 0;
  for (const auto& c : clients) {
    auto result = c->Evaluate(trained);
    ASSERT_TRUE(result.ok()) << result.status();
    weighted_accuracy += result->accuracy * static_cast<double>(result->num_examples);
    weighted_loss += result->loss * static_cast<double>(result->num_examples);
    total += result->num_examples;
  }
  ASSERT_EQ(total, 10000u);
  weighted_accuracy /= static_cast<double>(total);
  weighted_loss /= static_cast<double>(total);

  // Directly: the same weights in a fresh model over all 10,000 test images, in their file order.
  auto model = CreateTorchModel("cnn", 0);
  ASSERT_TRUE(model.ok());
  auto spec = ModelSpecOf(**model);
  auto tensors = BindTensors(**model, *spec);
  ASSERT_TRUE(tensors.ok());
  ASSERT_TRUE(CopyFromFlat(trained, *spec, *tensors).ok());
  (*model)->eval();
  torch::NoGradGuard no_grad;
  std::vector<uint32_t> all(test_->num_examples);
  std::iota(all.begin(), all.end(), 0u);
  const torch::Tensor images = ImagesToTensor(*test_, all);
  const torch::Tensor labels = LabelsToTensor(*test_, all);
  int64_t correct = 0;
  double loss_sum = 0;
  for (int64_t begin = 0; begin < 10000; begin += 500) {  // chunks only bound the memory
    const torch::Tensor logits = (*model)->forward(images.slice(0, begin, begin + 500));
    const torch::Tensor y = labels.slice(0, begin, begin + 500);
    correct += logits.argmax(1).eq(y).sum().item<int64_t>();
    loss_sum += torch::nn::functional::cross_entropy(
                    logits, y, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                    .item<double>();
  }
  const double accuracy = static_cast<double>(correct) / 10000.0;
  const double loss = loss_sum / 10000.0;
  std::cout << "full test set: accuracy " << accuracy << " (shards " << weighted_accuracy << "), loss " << loss
            << " (shards " << weighted_loss << ")\n";
  EXPECT_NEAR(weighted_accuracy, accuracy, 1e-6);
  EXPECT_NEAR(weighted_loss, loss, 1e-4);
  EXPECT_GT(accuracy, 0.6);
}

TEST_F(FashionMnistTraining, EvaluationDoesNotDependOnTheBatchSize) {
  // fl-client --eval-batch-size only bounds the memory: a trained CNN on a small real test shard (500 images, so
  // 1000 is one batch and 7 leaves a short last one) gets the same figures from both.
  auto small_batches = Make("cnn", 3, 20);
  ASSERT_NE(small_batches, nullptr);
  TrainOptions train_options;
  train_options.local_steps = 30;
  train_options.batch_size = 32;
  train_options.learning_rate = 0.05;
  train_options.momentum = 0.9;
  ASSERT_TRUE(small_batches->Train(Params(*small_batches), train_options).ok());
  const std::vector<float> trained = Params(*small_batches);

  TorchTrainerOptions options = small_batches->options();
  options.eval_batch_size = 1000;
  auto one_batch = TorchTrainer::Create(options, *train_, *test_);
  ASSERT_TRUE(one_batch.ok()) << one_batch.status();
  ASSERT_EQ(small_batches->options().eval_batch_size, kDefaultEvalBatchSize);
  options.eval_batch_size = 7;
  auto sevens = TorchTrainer::Create(options, *train_, *test_);
  ASSERT_TRUE(sevens.ok()) << sevens.status();

  auto a = (*one_batch)->Evaluate(trained);
  auto b = (*sevens)->Evaluate(trained);
  auto c = small_batches->Evaluate(trained);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->num_examples, 500u);
  EXPECT_EQ(b->num_examples, 500u);
  EXPECT_EQ(a->accuracy, b->accuracy);
  EXPECT_EQ(a->accuracy, c->accuracy);
  // Per-batch sums in float, added in double: the order of additions differs, hence the tolerance.
  EXPECT_NEAR(a->loss, b->loss, 1e-6 * a->loss);
  EXPECT_NEAR(a->loss, c->loss, 1e-6 * a->loss);
  EXPECT_GT(a->accuracy, 0.5) << "30 steps of SGD; an untrained model would make the comparison weak";
}

TEST_F(FashionMnistTraining, ReadingOnlyTheShardTrainsAsCuttingItFromTheWholeSplits) {
  // Create(options) reads the labels, then only its rows of the images (LoadFashionMnistRows); a trainer built
  // from the whole splits in memory cuts the same shard: the same examples in the same order, so training and
  // evaluation give bit-identical results.
  struct Case {
    std::string partition;
    uint32_t client_index, num_clients;
    double data_fraction;
  };
  for (const Case& c : {Case{"iid", 2, 4, 1.0}, Case{"dirichlet:0.5", 3, 10, 0.5}}) {
    SCOPED_TRACE(c.partition);
    TorchTrainerOptions options;
    options.data_dir = DatasetDir();
    options.partition = c.partition;
    options.client_index = c.client_index;
    options.num_clients = c.num_clients;
    options.partition_seed = 2024;
    options.data_fraction = c.data_fraction;
    options.init_seed = 7;
    options.num_threads = 1;
    options.device = "cpu";
    auto by_rows = TorchTrainer::Create(options);
    ASSERT_TRUE(by_rows.ok()) << by_rows.status();
    auto cut = TorchTrainer::Create(options, *train_, *test_);
    ASSERT_TRUE(cut.ok()) << cut.status();
    EXPECT_EQ((*by_rows)->num_train_examples(), (*cut)->num_train_examples());
    EXPECT_EQ((*by_rows)->num_test_examples(), (*cut)->num_test_examples());

    const std::vector<float> global = Params(**cut);
    ASSERT_EQ(Params(**by_rows), global);
    TrainOptions train_options;
    train_options.local_steps = 20;
    train_options.batch_size = 32;
    train_options.learning_rate = 0.05;
    train_options.momentum = 0.9;
    train_options.seed = 5;
    auto a = (*by_rows)->Train(global, train_options);
    auto b = (*cut)->Train(global, train_options);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->train_loss, b->train_loss);
    EXPECT_EQ(a->train_accuracy, b->train_accuracy);
    const std::vector<float> trained = Params(**cut);
    EXPECT_EQ(Params(**by_rows), trained);
    auto ea = (*by_rows)->Evaluate(trained);
    auto eb = (*cut)->Evaluate(trained);
    ASSERT_TRUE(ea.ok() && eb.ok());
    EXPECT_EQ(ea->num_examples, eb->num_examples);
    EXPECT_EQ(ea->loss, eb->loss);
    EXPECT_EQ(ea->accuracy, eb->accuracy);
  }
}

TEST_F(FashionMnistTraining, SqueezeNetFewStepsReduceTheLoss) {
  // The model alone: a few SGD steps on one fixed batch of real images lower that batch's loss (eval mode,
  // so without dropout noise).
  auto model = CreateTorchModel("squeezenet", 7);
  ASSERT_TRUE(model.ok());
  std::vector<uint32_t> indices(64);
  std::iota(indices.begin(), indices.end(), 100u);
  const torch::Tensor images = ImagesToTensor(*train_, indices);
  const torch::Tensor labels = LabelsToTensor(*train_, indices);
  auto eval_loss = [&] {
    torch::NoGradGuard no_grad;
    (*model)->eval();
    const torch::Tensor logits = (*model)->forward(images);
    EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{64, 10}));
    return torch::nn::functional::cross_entropy(logits, labels).item<double>();
  };
  const double before = eval_loss();
  torch::optim::SGD sgd((*model)->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  (*model)->train();
  for (int step = 0; step < 12; ++step) {
    sgd.zero_grad();
    torch::nn::functional::cross_entropy((*model)->forward(images), labels).backward();
    sgd.step();
  }
  const double after = eval_loss();
  std::cout << "squeezenet, 12 steps on one batch of 64: loss " << before << " -> " << after << "\n";
  EXPECT_LT(after, before - 0.1);

  // Through the trainer: the steps run, the loss is finite, the parameters move; the time per step is
  // printed (x 469 for a 15000-example epoch at batch 32).
  auto trainer = Make("squeezenet", 0);
  ASSERT_NE(trainer, nullptr);
  EXPECT_EQ(trainer->model_name(), "squeezenet1_1-fmnist");
  const std::vector<float> global = Params(*trainer);
  TrainOptions options;
  options.local_steps = 10;
  options.batch_size = 32;
  options.learning_rate = 0.01;
  options.momentum = 0.9;
  options.seed = 2;
  const auto t0 = std::chrono::steady_clock::now();
  auto result = trainer->Train(global, options);
  const double seconds = Seconds(t0);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->num_steps, 10u);
  EXPECT_TRUE(std::isfinite(result->train_loss));
  EXPECT_NE(Params(*trainer), global);
  std::cout << "squeezenet, 1 thread: " << seconds / options.local_steps * 1000 << " ms per step of 32 ("
            << seconds / options.local_steps * 469 << " s per 15000-example epoch)\n";
}

}  // namespace
}  // namespace fl::training
