// Bring your own model, end to end with the real binaries: models exported by Debian's python3-torch
// (examples/bring-your-own-model/export_models.py), data written by numpy (make_data.py), fl-server and
// fl-client processes over loopback, figures read back from the records.
//
//  - CnnBn (BatchNorm + Dropout, torch.jit.script) on Fashion-MNIST converted to .npz, 4 clients, FedAvg, the
//    server started from the .pt itself (--initial-model), 3 rounds of 250 local steps (about half an epoch of
//    each client's 15,000 images): test accuracy >= 0.80 (measured 0.855 / 0.873 after 2 / 3 full epochs).
//  - TinyLm (GRU, torch.jit.trace), next-token on the fortunes text: perplexity falls round over round.
//  - A client whose model differs from the experiment's is refused at Join, naming the first differing tensor.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <signal.h>

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "fl/core/str_cat.h"
#include "fl/instrumentation/record_reader.h"
#include "fl/testing/python.h"
#include "fl/testing/scratch_dir.h"
#include "fl/testing/subprocess.h"
#include "fl/testing/suite_set_up.h"

namespace fl {
namespace {

using fl::testing::Subprocess;
using ::testing::HasSubstr;

const std::string kExamples = std::string(FL_SOURCE_DIR) + "/examples/bring-your-own-model";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class ByoModelTest : public ::testing::Test {
 protected:
  void SetUp() override { fl::testing::SetUpSuiteOnce<ByoModelTest>(&ByoModelTest::SetUpSuite); }
  // Once, from the first test's SetUp (suite_set_up.h: a failure here fails the tests, not skips them).
  static void SetUpSuite() {
    dir_ = new testing::ScratchDir("byo_model");
    const std::string log = dir_->File("python.log");
    for (const char* script : {"export_models.py", "make_data.py"}) {
      auto done = testing::RunPythonFile(fl::StrCat(kExamples, "/", script), {"--out", dir_->path().string()}, log);
      ASSERT_TRUE(done.ok()) << done.status();
    }
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }

  struct Rounds {
    int server_code = -1;
    std::vector<instrumentation::RoundRecord> committed;
    std::string log;
  };

  // fl-server with `server_args` and one fl-client per entry of `clients` (extra arguments each).
  static Rounds Run(const std::string& name, std::vector<std::string> server_args,
                    const std::vector<std::vector<std::string>>& clients) {
    const int port = testing::FreeLoopbackPort();
    const std::string db = dir_->File(name + ".db");
    const std::string log = dir_->File(name + ".log");
    std::vector<std::string> server = {FL_SERVER_BIN,
                                       "--listen",
                                       fl::StrCat("127.0.0.1:", port),
                                       "--db",
                                       db,
                                       "--round-deadline-ms",
                                       "600000",
                                       "--evaluate-deadline-ms",
                                       "300000",
                                       "--seed",
                                       "1",
                                       "--log-level",
                                       "warn",
                                       "--insecure"};
    server.insert(server.end(), server_args.begin(), server_args.end());
    Subprocess server_process(server, log);
    std::vector<std::unique_ptr<Subprocess>> client_processes;
    for (size_t i = 0; i < clients.size(); ++i) {
      std::vector<std::string> argv = {FL_CLIENT_BIN,
                                       "--server",
                                       fl::StrCat("127.0.0.1:", port),
                                       "--name",
                                       fl::StrCat("client-", i),
                                       "--client-index",
                                       std::to_string(i),
                                       "--num-clients",
                                       std::to_string(clients.size()),
                                       "--partition-seed",
                                       "1",
                                       "--threads",
                                       "1",
                                       "--device",
                                       "cpu",
                                       "--log-level",
                                       "warn",
                                       "--insecure"};
      argv.insert(argv.end(), clients[i].begin(), clients[i].end());
      client_processes.push_back(
          std::make_unique<Subprocess>(argv, dir_->File(fl::StrCat(name, "-client-", i, ".log"))));
    }
    Rounds result;
    result.server_code = server_process.Wait(std::chrono::minutes(25)).value_or(-1);
    for (auto& c : client_processes) c->Wait(std::chrono::seconds(30));
    result.log = ReadFile(log);
    auto reader = instrumentation::RecordReader::Open(db);
    if (!reader.ok()) return result;
    auto experiments = (*reader)->ListExperiments();
    if (!experiments.ok() || experiments->empty()) return result;
    auto rows = (*reader)->ListRounds(experiments->front().id);
    if (!rows.ok()) return result;
    for (const auto& r : *rows) {
      if (r.status == instrumentation::RoundStatus::kCommitted) result.committed.push_back(r);
    }
    return result;
  }

  static testing::ScratchDir* dir_;
};
testing::ScratchDir* ByoModelTest::dir_ = nullptr;

TEST_F(ByoModelTest, BatchNormClassifierTrainsFederatedOnFashionMnistNpz) {
  const std::string model = dir_->File("cnn_bn.pt");
  std::vector<std::vector<std::string>> clients;
  for (int i = 0; i < 4; ++i) {
    clients.push_back({"--model", model, "--data", dir_->File("fashion_mnist.npz"), "--task", "classification"});
  }
  Rounds r = Run("cnn_bn",
                 {"--rounds", "3", "--min-fit-clients", "4", "--min-available-clients", "4", "--local-steps", "250",
                  "--batch-size", "32", "--lr", "0.05", "--momentum", "0.9", "--initial-model", model},
                 clients);
  ASSERT_EQ(r.server_code, 0) << r.log;
  ASSERT_EQ(r.committed.size(), 3u);
  std::string curve;
  for (const auto& row : r.committed) curve += fl::StrCat(" ", row.eval_accuracy.value_or(-1));
  std::printf("CnnBn (TorchScript) FedAvg on Fashion-MNIST .npz, 4 clients: accuracy per round:%s\n", curve.c_str());
  RecordProperty("accuracy_curve", curve);
  ASSERT_TRUE(r.committed.back().eval_accuracy.has_value());
  EXPECT_GE(*r.committed.back().eval_accuracy, 0.80) << curve;
}

TEST_F(ByoModelTest, LanguageModelLowersPerplexityRoundOverRound) {
  std::vector<std::vector<std::string>> clients;
  for (int i = 0; i < 3; ++i) {
    clients.push_back({"--model", dir_->File("tiny_lm.pt"), "--data", "/usr/share/games/fortunes", "--task",
                       "next-token", "--seq-len", "64"});
  }
  Rounds r = Run("tiny_lm",
                 {"--rounds", "3", "--min-fit-clients", "3", "--min-available-clients", "3", "--local-steps", "40",
                  "--batch-size", "32", "--client-optimizer", "adamw", "--lr", "0.003"},
                 clients);
  ASSERT_EQ(r.server_code, 0) << r.log;
  ASSERT_EQ(r.committed.size(), 3u);
  std::vector<double> perplexity;
  std::string curve;
  for (const auto& row : r.committed) {
    ASSERT_TRUE(row.eval_loss.has_value());
    ASSERT_TRUE(row.eval_perplexity.has_value()) << "next-token rounds record their perplexity";
    EXPECT_NEAR(*row.eval_perplexity, std::exp(*row.eval_loss), 1e-9 * *row.eval_perplexity);
    perplexity.push_back(*row.eval_perplexity);
    curve += fl::StrCat(" ", perplexity.back());
  }
  std::printf("TinyLm (TorchScript) FedAvg next-token on fortunes, 3 clients: perplexity per round:%s\n",
              curve.c_str());
  RecordProperty("perplexity_curve", curve);
  EXPECT_LT(perplexity[1], perplexity[0]) << curve;
  EXPECT_LT(perplexity[2], perplexity[1]) << curve;
  EXPECT_LT(perplexity[2], 20.0) << "a byte-level model that learned nothing sits near 256" << curve;
}

TEST_F(ByoModelTest, ClientWithAnotherModelIsRefusedNamingTheTensor) {
  // The experiment's model is CnnBn (first client); the second client brings PlainCnn.
  const int port = testing::FreeLoopbackPort();
  const std::string log = dir_->File("mismatch.log");
  Subprocess server(
      {FL_SERVER_BIN, "--listen", fl::StrCat("127.0.0.1:", port), "--rounds", "1", "--min-fit-clients", "2",
       "--min-available-clients", "2", "--initial-model", dir_->File("cnn_bn.pt"), "--log-level", "warn", "--insecure"},
      log);
  const std::string second_log = dir_->File("mismatch-client.log");
  Subprocess second({FL_CLIENT_BIN, "--server", fl::StrCat("127.0.0.1:", port), "--name", "other-model", "--model",
                     dir_->File("plain_cnn.pt"), "--data", dir_->File("fashion_mnist.npz"), "--threads", "1",
                     "--device", "cpu", "--give-up-after-s", "30", "--insecure"},
                    second_log);
  auto code = second.Wait(std::chrono::seconds(120));
  ASSERT_TRUE(code.has_value()) << "the refused client did not exit";
  EXPECT_NE(*code, 0);
  const std::string message = ReadFile(second_log);
  // CnnBn's tensor 1 is bn1.weight (its convolutions have no bias); PlainCnn has no such tensor.
  EXPECT_THAT(message, HasSubstr("differs")) << message;
  EXPECT_THAT(message, HasSubstr("'bn1.weight'")) << message;
  EXPECT_THAT(message, HasSubstr("refused")) << message;
  server.Kill(SIGTERM);
}

// The example manifests, as a user runs them from the repository root (relative paths "out/byom/..."): every
// one validates, and the regression example runs through fl-experiment (emulated links) and records the MAE.
TEST_F(ByoModelTest, ExampleManifestsValidateAndTheRegressionExampleRuns) {
  // The examples read out/byom/ relative to the directory fl-experiment runs in: make that this scratch dir.
  std::filesystem::create_directories(dir_->File("out"));
  std::filesystem::create_directory_symlink(dir_->path(), dir_->File("out/byom"));
  ASSERT_EQ(chdir(dir_->path().c_str()), 0);
  size_t manifests = 0;
  for (const auto& entry : std::filesystem::directory_iterator(kExamples)) {
    if (entry.path().extension() != ".yaml") continue;
    ++manifests;
    Subprocess validate({FL_EXPERIMENT_BIN, "validate", entry.path().string()},
                        dir_->File(entry.path().stem().string() + ".validate.log"));
    EXPECT_EQ(validate.Wait(std::chrono::seconds(60)).value_or(-1), 0)
        << entry.path() << ": " << ReadFile(dir_->File(entry.path().stem().string() + ".validate.log"));
  }
  EXPECT_GE(manifests, 4u);

  const std::string out = dir_->File("regression-run");
  const std::string log = dir_->File("regression-run.log");
  Subprocess run({FL_EXPERIMENT_BIN, "run", kExamples + "/regression.yaml", "--out", out}, log);
  ASSERT_EQ(run.Wait(std::chrono::minutes(10)).value_or(-1), 0) << ReadFile(log);
  auto reader = instrumentation::RecordReader::Open(out + "/records.db");
  ASSERT_TRUE(reader.ok()) << reader.status();
  auto experiments = (*reader)->ListExperiments();
  ASSERT_TRUE(experiments.ok() && experiments->size() == 1u);
  auto rows = (*reader)->ListRounds(experiments->front().id);
  ASSERT_TRUE(rows.ok());
  std::vector<double> mae;
  for (const auto& row : *rows) {
    if (row.status != instrumentation::RoundStatus::kCommitted) continue;
    ASSERT_TRUE(row.eval_mae.has_value()) << "regression rounds record the MAE";
    EXPECT_FALSE(row.eval_accuracy.has_value()) << "and no accuracy";
    mae.push_back(*row.eval_mae);
  }
  ASSERT_EQ(mae.size(), 3u);
  std::printf("Regressor (TorchScript) via fl-experiment, 3 clients over emulated links: MAE per round: %g %g %g\n",
              mae[0], mae[1], mae[2]);
  EXPECT_LT(mae[2], mae[0]);
}

}  // namespace
}  // namespace fl
