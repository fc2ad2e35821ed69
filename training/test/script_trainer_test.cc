// ScriptTrainer and LoadScriptModel with real TorchScript files exported by Debian's python3-torch inside the
// test (examples/bring-your-own-model's scripts, and small models written here for the bad cases), on real
// Fashion-MNIST images written to .npz by numpy.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "fl/training/script_model.h"
#include "fl/training/script_trainer.h"
#include "fl/testing/python.h"
#include "fl/testing/scratch_dir.h"
#include "fl/testing/suite_set_up.h"

namespace fl::training {
namespace {

using ::testing::HasSubstr;

const std::string kExamples = std::string(FL_SOURCE_DIR) + "/examples/bring-your-own-model";

// Python that writes the first `n` Fashion-MNIST train and test images as an .npz (x uint8 [n,1,28,28]).
constexpr const char* kSmallFashionMnist = R"PY(
import gzip, sys, numpy as np
def idx(path):
    with gzip.open(path, 'rb') as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], 'big') for i in range(dims)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * dims).reshape(shape)
d = '/usr/share/datasets/fashion-mnist/'
n = int(sys.argv[2])
xtr = idx(d + 'train-images-idx3-ubyte.gz')[:n].reshape(n, 1, 28, 28)
ytr = idx(d + 'train-labels-idx1-ubyte.gz')[:n].astype(np.int64)
xte = idx(d + 't10k-images-idx3-ubyte.gz')[:n].reshape(n, 1, 28, 28)
yte = idx(d + 't10k-labels-idx1-ubyte.gz')[:n].astype(np.int64)
np.savez(sys.argv[1], x_train=xtr, y_train=ytr, x_test=xte, y_test=yte)
)PY";

class ScriptTrainerTest : public ::testing::Test {
 protected:
  void SetUp() override { fl::testing::SetUpSuiteOnce<ScriptTrainerTest>(&ScriptTrainerTest::SetUpSuite); }
  // Once, from the first test's SetUp (suite_set_up.h: a failure here fails the tests, not skips them).
  static void SetUpSuite() {
    dir_ = new testing::ScratchDir("script_trainer");
    const std::string log = dir_->File("python.log");
    ASSERT_TRUE(testing::RequirePythonModule("torch", log).ok()) << testing::RequirePythonModule("torch", log);
    auto exported = testing::RunPythonFile(kExamples + "/export_models.py", {"--out", dir_->path().string()}, log);
    ASSERT_TRUE(exported.ok()) << exported.status();
    export_log_ = new std::string(*exported);
    auto data = testing::RunPython(kSmallFashionMnist, {dir_->File("small.npz"), "512"}, log);
    ASSERT_TRUE(data.ok()) << data.status();
  }
  static void TearDownTestSuite() {
    delete dir_;
    delete export_log_;
    dir_ = nullptr;
    export_log_ = nullptr;
  }

  // Runs Python source with the scratch dir as argv[1], from a file: torch.jit.script reads the source of the
  // classes it compiles, which `python3 -c` does not keep.
  static void Python(const std::string& script) {
    static int counter = 0;
    const std::string file = dir_->File("script_" + std::to_string(counter++) + ".py");
    std::ofstream(file) << script;
    auto result = testing::RunPythonFile(file, {dir_->path().string()}, dir_->File("python.log"));
    ASSERT_TRUE(result.ok()) << result.status();
  }

  static ScriptTrainerOptions Options(const std::string& model, const std::string& data = "small.npz") {
    ScriptTrainerOptions o;
    o.model_path = dir_->File(model);
    o.data.path = dir_->File(data);
    o.data.num_clients = 2;
    o.data.client_index = 0;
    o.device = "cpu";
    o.num_threads = 1;
    return o;
  }

  static TrainOptions Steps(uint32_t steps, double lr = 0.05) {
    TrainOptions t;
    t.local_steps = steps;
    t.batch_size = 32;
    t.learning_rate = lr;
    t.momentum = 0.9;
    t.seed = 3;
    return t;
  }

  static std::vector<float> Params(Trainer& trainer) {
    std::vector<float> values(trainer.spec().num_elements());
    EXPECT_TRUE(trainer.GetParameters(values).ok());
    return values;
  }

  static testing::ScratchDir* dir_;
  static std::string* export_log_;
};
testing::ScratchDir* ScriptTrainerTest::dir_ = nullptr;
std::string* ScriptTrainerTest::export_log_ = nullptr;

TEST_F(ScriptTrainerTest, SpecIsStateDictOrderWithBuffersAndDtypes) {
  Python(R"PY(
import sys, torch
m = torch.jit.load(sys.argv[1] + '/cnn_bn.pt')
with open(sys.argv[1] + '/cnn_bn.keys', 'w') as f:
    for k, v in m.state_dict().items():
        f.write(f"{k} {list(v.shape)} {v.dtype}\n")
)PY");
  auto model = LoadScriptModel(dir_->File("cnn_bn.pt"), torch::kCPU);
  ASSERT_TRUE(model.ok()) << model.status();
  std::ifstream keys(dir_->File("cnn_bn.keys"));
  std::vector<std::string> python_names;
  for (std::string line; std::getline(keys, line);) python_names.push_back(line.substr(0, line.find(' ')));
  std::vector<std::string> names;
  for (const auto& t : model->spec.tensors()) names.push_back(t.name);
  EXPECT_EQ(names, python_names);
  const core::TensorSpec* counter = model->spec.Find("bn1.num_batches_tracked");
  ASSERT_NE(counter, nullptr);
  EXPECT_EQ(counter->dtype, core::DType::kInt64);
  EXPECT_TRUE(counter->shape.empty());
  const core::TensorSpec* mean = model->spec.Find("bn1.running_mean");
  ASSERT_NE(mean, nullptr);
  EXPECT_EQ(mean->dtype, core::DType::kFloat32);
  // Buffers are in the spec but not among the trainable parameters.
  size_t buffers = 0;
  for (bool p : model->is_parameter) buffers += p ? 0 : 1;
  EXPECT_EQ(buffers, 6u);  // two BatchNorms x (running_mean, running_var, num_batches_tracked)
  EXPECT_EQ(model->parameters.size(), model->spec.num_tensors() - 6);
}

TEST_F(ScriptTrainerTest, ClassifierWithBatchNormLearns) {
  auto trainer = ScriptTrainer::Create(Options("cnn_bn.pt"));
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  EXPECT_EQ((*trainer)->task(), "classification");
  EXPECT_EQ((*trainer)->num_outputs(), 10);
  EXPECT_EQ((*trainer)->model_name(), "cnn_bn");
  EXPECT_EQ((*trainer)->num_train_examples(), 256u);
  std::vector<float> global = Params(**trainer);
  auto before = (*trainer)->Evaluate(global);
  ASSERT_TRUE(before.ok()) << before.status();
  auto result = (*trainer)->Train(global, Steps(40, 0.02));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->num_steps, 40u);
  EXPECT_EQ(result->num_examples, 40u * 32);
  auto after = (*trainer)->Evaluate(Params(**trainer));
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_LT(after->loss, before->loss);
  EXPECT_GT(after->accuracy, before->accuracy);
  EXPECT_GT(after->accuracy, 0.5) << "40 steps of SGD on real Fashion-MNIST images";
}

TEST_F(ScriptTrainerTest, EvaluationUsesEvalModeAndIsDeterministic) {
  // Dropout is active in train(): the same global evaluated twice must give the same figures only because
  // Evaluate switches to eval() (dropout off, BatchNorm on its running statistics).
  auto trainer = ScriptTrainer::Create(Options("cnn_bn.pt"));
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  ASSERT_TRUE((*trainer)->Train(Params(**trainer), Steps(5)).ok());
  const std::vector<float> p = Params(**trainer);
  auto a = (*trainer)->Evaluate(p);
  auto b = (*trainer)->Evaluate(p);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->loss, b->loss);
  EXPECT_EQ(a->accuracy, b->accuracy);
  // Evaluation does not change the local values (running statistics are not updated in eval mode).
  EXPECT_EQ(Params(**trainer), p);
}

TEST_F(ScriptTrainerTest, EvaluationDoesNotDependOnTheBatchSize) {
  // fl-client --eval-batch-size only bounds the memory: the BatchNorm CNN on real Fashion-MNIST images (a test
  // shard of 128: 1000 is one batch, 5 leaves a short last one) gets the same figures from both.
  ScriptTrainerOptions options = Options("cnn_bn.pt");
  options.eval_batch_size = 1000;
  auto one_batch = ScriptTrainer::Create(options);
  ASSERT_TRUE(one_batch.ok()) << one_batch.status();
  ASSERT_TRUE((*one_batch)->Train(Params(**one_batch), Steps(20, 0.02)).ok());
  const std::vector<float> trained = Params(**one_batch);
  options.eval_batch_size = 5;
  auto fives = ScriptTrainer::Create(options);
  ASSERT_TRUE(fives.ok()) << fives.status();

  auto a = (*one_batch)->Evaluate(trained);
  auto b = (*fives)->Evaluate(trained);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->num_examples, (*one_batch)->num_test_examples());
  EXPECT_GT(a->num_examples, 5u);
  EXPECT_EQ(a->num_examples, b->num_examples);
  EXPECT_EQ(a->accuracy, b->accuracy);
  // Per-batch sums in float, added in double: the order of additions differs, hence the tolerance.
  EXPECT_NEAR(a->loss, b->loss, 1e-6 * a->loss);
  EXPECT_GT(a->accuracy, 0.3) << "20 steps of SGD; an untrained model would make the comparison weak";

  options.eval_batch_size = 0;
  const absl::Status zero = ScriptTrainer::Create(options).status();
  EXPECT_EQ(zero.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(zero.message()).find("evaluation batch size 0 must be >= 1"), std::string::npos) << zero;
}

TEST_F(ScriptTrainerTest, IntegerBuffersStayLocalAndFloatBuffersFollowThePolicy) {
  for (const std::string policy : {"average", "local"}) {
    SCOPED_TRACE(policy);
    ScriptTrainerOptions o = Options("cnn_bn.pt");
    o.buffers = policy;
    auto trainer = ScriptTrainer::Create(o);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    const core::ModelSpec& spec = (*trainer)->spec();
    const uint64_t counter = spec.Find("bn1.num_batches_tracked")->offset;
    const uint64_t mean = spec.Find("bn1.running_mean")->offset;
    const uint64_t weight = spec.Find("conv1.weight")->offset;
    std::vector<float> global = Params(**trainer);
    global[counter] = 1000;  // a global counter that must never be loaded
    global[mean] = 50;       // a global running mean far from anything the data gives
    global[weight] = 0.5f;
    TrainOptions one = Steps(1);
    one.learning_rate = 1e-9;  // the parameters barely move: what we see is what was loaded
    ASSERT_TRUE((*trainer)->Train(global, one).ok());
    const std::vector<float> local = Params(**trainer);
    EXPECT_EQ(local[counter], 1.0f) << "the counter counts this client's own batches";
    EXPECT_NEAR(local[weight], 0.5f, 1e-6) << "parameters always come from the global model";
    // BatchNorm's update: running = 0.9 running + 0.1 batch_mean. From 50 (average) it stays near 45; from the
    // client's own initial 0 (local) it stays small.
    if (policy == "average") {
      EXPECT_GT(local[mean], 40.0f);
    } else {
      EXPECT_LT(std::abs(local[mean]), 5.0f);
    }
  }
}

TEST_F(ScriptTrainerTest, NextTokenLanguageModelLowersPerplexity) {
  ScriptTrainerOptions o = Options("tiny_lm.pt");
  o.data.path = "/usr/share/games/fortunes";
  o.data.task = data::Task::kNextToken;
  o.data.seq_len = 32;
  auto trainer = ScriptTrainer::Create(o);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  EXPECT_EQ((*trainer)->task(), "next-token");
  EXPECT_EQ((*trainer)->num_outputs(), 256);
  std::vector<float> global = Params(**trainer);
  auto before = (*trainer)->Evaluate(global);
  ASSERT_TRUE(before.ok()) << before.status();
  TrainOptions t = Steps(60, 0.003);
  t.optimizer = "adamw";
  t.momentum = 0;
  ASSERT_TRUE((*trainer)->Train(global, t).ok());
  auto after = (*trainer)->Evaluate(Params(**trainer));
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_LT(std::exp(after->loss), 0.8 * std::exp(before->loss))
      << "perplexity " << std::exp(before->loss) << " -> " << std::exp(after->loss);
  EXPECT_GT(after->accuracy, before->accuracy);
}

TEST_F(ScriptTrainerTest, RegressionReportsMeanAbsoluteError) {
  // Targets: each image's mean brightness (x in [0, 1]).
  Python(R"PY(
import sys, numpy as np
d = np.load(sys.argv[1] + '/small.npz')
def xy(x):
    return x, (x.reshape(len(x), -1).astype(np.float32) / 255).mean(axis=1).astype(np.float32)
xtr, ytr = xy(d['x_train']); xte, yte = xy(d['x_test'])
np.savez(sys.argv[1] + '/brightness.npz', x_train=xtr, y_train=ytr, x_test=xte, y_test=yte)
import torch
class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(784, 1)
    def forward(self, x):
        return self.fc(torch.flatten(x, 1)).squeeze(1)
torch.manual_seed(0)
torch.jit.script(M()).save(sys.argv[1] + '/linear_regressor.pt')
)PY");
  ScriptTrainerOptions o = Options("linear_regressor.pt", "brightness.npz");
  o.data.task = data::Task::kRegression;
  auto trainer = ScriptTrainer::Create(o);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  EXPECT_EQ((*trainer)->task(), "regression");
  std::vector<float> global = Params(**trainer);
  auto before = (*trainer)->Evaluate(global);
  ASSERT_TRUE(before.ok()) << before.status();
  auto trained = (*trainer)->Train(global, Steps(80, 0.01));
  ASSERT_TRUE(trained.ok()) << trained.status();
  EXPECT_EQ(trained->train_accuracy, 0.0);
  auto after = (*trainer)->Evaluate(Params(**trainer));
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_GT(before->mae, 0.0);
  EXPECT_LT(after->mae, before->mae);
  EXPECT_LT(after->loss, before->loss);
  EXPECT_EQ(after->accuracy, 0.0);
}

TEST_F(ScriptTrainerTest, CancelledRoundLeavesLocalValuesUnchanged) {
  auto trainer = ScriptTrainer::Create(Options("cnn_bn.pt"));
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  const std::vector<float> before = Params(**trainer);
  std::atomic<bool> cancelled{true};
  TrainOptions t = Steps(5);
  t.cancelled = &cancelled;
  auto result = (*trainer)->Train(before, t);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(Params(**trainer), before);
}

// --- bad input: a clear error naming the file, and nothing trained ---------------------------------------

TEST_F(ScriptTrainerTest, MissingModelFileIsNotFound) {
  auto trainer = ScriptTrainer::Create(Options("does_not_exist.pt"));
  EXPECT_EQ(trainer.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(trainer.status().message()), HasSubstr("does_not_exist.pt"));
}

TEST_F(ScriptTrainerTest, CorruptModelFileIsRefused) {
  // The first half of a real file: a truncated download.
  const std::string good = dir_->File("cnn_bn.pt");
  const auto size = std::filesystem::file_size(good);
  std::ifstream in(good, std::ios::binary);
  std::string bytes(size / 2, '\0');
  in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  std::ofstream(dir_->File("truncated.pt"), std::ios::binary) << bytes;
  std::ofstream(dir_->File("text.pt")) << "not a model at all\n";
  for (const std::string name : {"truncated.pt", "text.pt"}) {
    auto trainer = ScriptTrainer::Create(Options(name));
    EXPECT_EQ(trainer.status().code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_THAT(std::string(trainer.status().message()), HasSubstr(name));
    EXPECT_THAT(std::string(trainer.status().message()), HasSubstr("torch.jit.script"));
  }
}

TEST_F(ScriptTrainerTest, StateDictCheckpointIsNotTorchScript) {
  Python(R"PY(
import sys, torch
torch.save(torch.nn.Linear(784, 10).state_dict(), sys.argv[1] + '/state_dict.pt')
)PY");
  auto trainer = ScriptTrainer::Create(Options("state_dict.pt"));
  EXPECT_EQ(trainer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(trainer.status().message()), HasSubstr("state_dict.pt"));
  EXPECT_THAT(std::string(trainer.status().message()), HasSubstr("torch.save()"));
}

TEST_F(ScriptTrainerTest, ModelWithoutTrainableParametersIsRefused) {
  Python(R"PY(
import sys, torch
class Frozen(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(784, 10)
        for p in self.fc.parameters():
            p.requires_grad_(False)
    def forward(self, x):
        return self.fc(torch.flatten(x, 1))
class Empty(torch.nn.Module):
    def forward(self, x):
        return torch.flatten(x, 1)[:, :10]
torch.jit.script(Frozen()).save(sys.argv[1] + '/frozen.pt')
torch.jit.script(Empty()).save(sys.argv[1] + '/empty.pt')
)PY");
  for (const std::string name : {"frozen.pt", "empty.pt"}) {
    auto trainer = ScriptTrainer::Create(Options(name));
    EXPECT_EQ(trainer.status().code(), absl::StatusCode::kInvalidArgument) << name;
    // frozen.pt: fl-client's loader ("no trainable parameters"); empty.pt: already the vet ("has no parameters").
    EXPECT_THAT(std::string(trainer.status().message()), HasSubstr("nothing to train"));
    EXPECT_THAT(std::string(trainer.status().message()), HasSubstr(name));
  }
}

TEST_F(ScriptTrainerTest, ForwardThatFailsOnTheDataShapeShowsBothShapes) {
  Python(R"PY(
import sys, torch
class Rgb(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3)
        self.fc = torch.nn.Linear(8 * 30 * 30, 10)
    def forward(self, x):
        return self.fc(torch.flatten(self.conv(x), 1))
m = Rgb()
torch.jit.trace(m, torch.zeros(2, 3, 32, 32)).save(sys.argv[1] + '/rgb_traced.pt')
torch.jit.script(m).save(sys.argv[1] + '/rgb_scripted.pt')
)PY");
  for (const std::string name : {"rgb_traced.pt", "rgb_scripted.pt"}) {
    auto trainer = ScriptTrainer::Create(Options(name));
    EXPECT_EQ(trainer.status().code(), absl::StatusCode::kInvalidArgument) << name;
    const std::string message(trainer.status().message());
    EXPECT_THAT(message, HasSubstr(name));
    EXPECT_THAT(message, HasSubstr("[2, 1, 28, 28]")) << "the data's batch shape";
    EXPECT_THAT(message, HasSubstr("small.npz"));
    EXPECT_THAT(message, HasSubstr("forward(")) << "the model's signature";
  }
}

TEST_F(ScriptTrainerTest, OutputThatDoesNotFitTheTaskIsRefused) {
  Python(R"PY(
import sys, torch
class One(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(784, 1)
    def forward(self, x):
        return self.fc(torch.flatten(x, 1))
torch.jit.script(One()).save(sys.argv[1] + '/one_output.pt')
)PY");
  // One output for classification.
  auto classifier = ScriptTrainer::Create(Options("one_output.pt"));
  EXPECT_EQ(classifier.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(classifier.status().message()), HasSubstr("does not fit task classification"));
  EXPECT_THAT(std::string(classifier.status().message()), HasSubstr("[2, 1]"));
  // A 10-class classifier as a next-token model on text.
  ScriptTrainerOptions o = Options("cnn_bn.pt");
  o.data.path = "/usr/share/games/fortunes";
  o.data.task = data::Task::kNextToken;
  auto lm = ScriptTrainer::Create(o);
  EXPECT_EQ(lm.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(lm.status().message()), HasSubstr("cnn_bn.pt"));
  // Regression targets [B] and a 10-output model.
  ScriptTrainerOptions r = Options("cnn_bn.pt", "small.npz");
  r.data.task = data::Task::kRegression;
  auto regression = ScriptTrainer::Create(r);
  EXPECT_FALSE(regression.ok());
}

TEST_F(ScriptTrainerTest, LabelsOutsideTheModelsClassesAreRefused) {
  Python(R"PY(
import sys, torch
class Five(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(784, 5)
    def forward(self, x):
        return self.fc(torch.flatten(x, 1))
torch.jit.script(Five()).save(sys.argv[1] + '/five_classes.pt')
)PY");
  auto trainer = ScriptTrainer::Create(Options("five_classes.pt"));
  EXPECT_EQ(trainer.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(trainer.status().message());
  EXPECT_THAT(message, HasSubstr("small.npz"));
  EXPECT_THAT(message, HasSubstr("y_t"));  // y_train or y_test, with the offending index
  EXPECT_THAT(message, HasSubstr("5"));
}

TEST_F(ScriptTrainerTest, UnknownBuffersPolicyIsRefused) {
  ScriptTrainerOptions o = Options("cnn_bn.pt");
  o.buffers = "median";
  auto trainer = ScriptTrainer::Create(o);
  EXPECT_EQ(trainer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(trainer.status().message()), HasSubstr("median"));
}

}  // namespace
}  // namespace fl::training
