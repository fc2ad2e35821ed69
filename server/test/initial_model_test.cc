// fl-server's --initial-model with a TorchScript file: the model python3-torch exports inside the test becomes
// the experiment's round-0 model (spec and values equal to PyTorch's state_dict), a client with the same model is
// admitted and one with another model is refused naming the first differing tensor; checkpoints still load.
#include "fl/server/initial_model.h"

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "fl/core/str_cat.h"
#include "fl/formats/torchscript_archive.h"
#include "fl/proto/convert.h"
#include "fl/server/round_engine.h"
#include "fl/server/service.h"
#include "fl/rpc/grpc_server.h"
#include "fl/testing/python.h"
#include "fl/testing/scratch_dir.h"
#include "fl/testing/subprocess.h"
#include "fl/v1/federation.grpc.pb.h"

namespace fl::server {
namespace {

using ::testing::HasSubstr;

// sys.argv[1]: output folder. model.pt (a CNN with BatchNorm and Dropout, scripted after a few training-mode
// batches), model.keys (its state_dict keys), model.f32 (its state_dict as float32), other.pt (another head
// size), weights.pt (a torch.save state_dict, which is not TorchScript).
constexpr const char* kExportScript = R"PY(
import os, sys
import torch, torch.nn as nn

out = sys.argv[1]
torch.manual_seed(11)

class Net(nn.Module):
    def __init__(self, classes):
        super().__init__()
        self.conv = nn.Conv2d(1, 3, 3)
        self.bn = nn.BatchNorm2d(3)
        self.drop = nn.Dropout(0.5)
        self.fc = nn.Linear(3 * 26 * 26, classes)
    def forward(self, x):
        return self.fc(torch.flatten(self.drop(torch.relu(self.bn(self.conv(x)))), 1))

net = Net(10)
net.train()
net(torch.randn(4, 1, 28, 28))
torch.jit.script(net).save(os.path.join(out, "model.pt"))
with open(os.path.join(out, "model.keys"), "w") as f:
    f.write("\n".join(net.state_dict().keys()) + "\n")
with open(os.path.join(out, "model.f32"), "wb") as f:
    for v in net.state_dict().values():
        f.write(v.detach().to(torch.float32).contiguous().numpy().tobytes())
torch.jit.script(Net(5)).save(os.path.join(out, "other.pt"))
torch.save(net.state_dict(), os.path.join(out, "weights.pt"))
)PY";

class InitialModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fl::testing::ScratchDir("initial_model_test");
    const std::string dir = dir_->path().string();
    const std::string script = dir + "/export.py";
    std::ofstream(script) << kExportScript;
    auto run = fl::testing::RunPythonFile(script, {dir}, dir + "/export.log");
    if (run.ok()) {
      exported_ = ::testing::AssertionSuccess();
    } else if (absl::Status s = fl::testing::RequirePythonModule("torch", dir + "/require.log"); !s.ok()) {
      exported_ = ::testing::AssertionFailure() << s.message();  // says to run deploy/install-deps.sh
    } else {
      exported_ = ::testing::AssertionFailure() << run.status().message();
    }
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(exported_) << exported_.message(); }
  static std::string File(const std::string& name) { return dir_->File(name); }

  static std::vector<std::string> ExpectedKeys() {
    std::vector<std::string> keys;
    std::ifstream in(File("model.keys"));
    for (std::string line; std::getline(in, line);) keys.push_back(line);
    return keys;
  }
  static std::vector<float> ExpectedValues() {
    std::ifstream in(File("model.f32"), std::ios::binary);
    std::stringstream bytes;
    bytes << in.rdbuf();
    const std::string s = bytes.str();
    std::vector<float> values(s.size() / sizeof(float));
    std::memcpy(values.data(), s.data(), values.size() * sizeof(float));
    return values;
  }

  static fl::testing::ScratchDir* dir_;
  static ::testing::AssertionResult exported_;
};
fl::testing::ScratchDir* InitialModelTest::dir_ = nullptr;
::testing::AssertionResult InitialModelTest::exported_ = ::testing::AssertionFailure();

TEST_F(InitialModelTest, TorchScriptFileBecomesARoundZeroCheckpoint) {
  auto ckpt = LoadInitialModel(File("model.pt"));
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ(ckpt->round, 0u);
  EXPECT_EQ(ckpt->model_version, 0u);
  EXPECT_EQ(ckpt->model_name, "model");  // the file's stem, as fl-client names a TorchScript model
  EXPECT_TRUE(ckpt->optimizer.optimizer.empty());
  std::vector<std::string> names;
  for (const core::TensorSpec& t : ckpt->spec.tensors()) names.push_back(t.name);
  EXPECT_EQ(names, ExpectedKeys());
  EXPECT_EQ(ckpt->spec.Find("bn.num_batches_tracked")->dtype, core::DType::kInt64);
  EXPECT_EQ(ckpt->values, ExpectedValues());
}

TEST_F(InitialModelTest, CheckpointFilesStillLoad) {
  auto from_pt = LoadInitialModel(File("model.pt"));
  ASSERT_TRUE(from_pt.ok()) << from_pt.status();
  from_pt->experiment_id = "exp-1";
  from_pt->round = 4;
  from_pt->model_version = 4;
  const std::string path = File("round-000004.ckpt");
  ASSERT_TRUE(SaveCheckpoint(*from_pt, path).ok());
  auto loaded = LoadInitialModel(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->round, 4u);
  EXPECT_EQ(loaded->spec.fingerprint(), from_pt->spec.fingerprint());
  EXPECT_EQ(loaded->values, from_pt->values);
}

TEST_F(InitialModelTest, AStateDictFileIsRefusedWithHowToExport) {
  auto ckpt = LoadInitialModel(File("weights.pt"));
  ASSERT_FALSE(ckpt.ok());
  EXPECT_THAT(std::string(ckpt.status().message()), HasSubstr(File("weights.pt")));
  EXPECT_THAT(std::string(ckpt.status().message()), HasSubstr("torch.jit.script(model).save(path)"));
}

grpc::Status Join(fl::v1::Federation::Stub& stub, const std::string& name, const core::ModelSpec& spec,
                  fl::v1::JoinResponse* resp) {
  fl::v1::JoinRequest req;
  req.set_protocol_version(fl::v1::PROTOCOL_VERSION_3);
  req.set_client_name(name);
  *req.mutable_model_spec() = proto::ToProto(spec, name);
  req.set_num_train_examples(10);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  ctx.set_wait_for_ready(true);
  return stub.Join(&ctx, req, resp);
}

// The engine adopts the .pt's model at start (its round-0 checkpoint holds exactly the PyTorch values); a
// client whose model is the same file (the spec fl-client's LibTorch loader builds: the same names, shapes,
// dtypes and order) is admitted; one with another head size is refused, naming the tensor that differs.
TEST_F(InitialModelTest, EngineStartsFromTheTorchScriptModelAndAdmitsItsClients) {
  auto ckpt = LoadInitialModel(File("model.pt"));
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EngineConfig config;
  config.experiment_name = "initial-model-test";
  config.num_rounds = 1;
  config.fit = {1.0, 2, 2};
  config.checkpoint_dir = File("ckpt");
  config.train.set_local_epochs(1);
  config.train.set_batch_size(8);
  config.train.set_learning_rate(0.1);
  config.train.set_optimizer("sgd");
  RoundEngine::StartPoint start;
  start.checkpoint = *ckpt;
  RoundEngine engine(config, nullptr, std::move(start));
  const absl::Status started = engine.Start();
  ASSERT_TRUE(started.ok()) << started;
  FederationService service(&engine);
  auto running = rpc::StartGrpcServer(&service, "127.0.0.1:0");
  ASSERT_TRUE(running.ok()) << running.status();

  auto round0 = LoadCheckpoint(CheckpointPath(File("ckpt"), 0));
  ASSERT_TRUE(round0.ok()) << round0.status();
  EXPECT_EQ(round0->spec.fingerprint(), ckpt->spec.fingerprint());
  EXPECT_EQ(round0->values, ExpectedValues());

  auto stub = fl::v1::Federation::NewStub(
      grpc::CreateChannel(fl::StrCat("127.0.0.1:", running->port), grpc::InsecureChannelCredentials()));
  auto same = formats::ReadTorchScriptModel(File("model.pt"));
  auto other = formats::ReadTorchScriptModel(File("other.pt"));
  ASSERT_TRUE(same.ok() && other.ok());
  fl::v1::JoinResponse resp;
  const grpc::Status admitted = Join(*stub, "same-model", same->spec, &resp);
  EXPECT_TRUE(admitted.ok()) << admitted.error_message();
  const grpc::Status refused = Join(*stub, "other-model", other->spec, &resp);
  ASSERT_FALSE(refused.ok());
  const fl::v1::ErrorDetail detail = proto::ErrorFromGrpcStatus(refused);
  EXPECT_EQ(detail.code(), fl::v1::ERROR_CODE_FINGERPRINT_MISMATCH);
  EXPECT_THAT(detail.message(), HasSubstr("fc.weight"));

  engine.Post(ShutdownEvent{"test over"});
  engine.Wait();
  running->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  engine.Stop();
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The real fl-server binary: `--initial-model model.pt` starts the experiment from the PyTorch weights (its
// round-0 checkpoint), and a torch.save state_dict is refused at start with exit code 2 and how to export.
TEST_F(InitialModelTest, FlServerBinaryStartsFromAPtFile) {
  const std::string ckpt_dir = File("binary_ckpt");
  const std::string log = File("fl-server.log");
  fl::testing::Subprocess server(
      {FL_SERVER_BIN, "--listen", "127.0.0.1:0", "--db", "", "--checkpoint-dir", ckpt_dir, "--initial-model",
       File("model.pt"), "--rounds", "1", "--log-level", "info", "--insecure"},
      log);
  const std::string round0 = CheckpointPath(ckpt_dir, 0);
  // Waits for the file the server writes at start (not a timing assertion: the bound only ends a hung run).
  for (int i = 0; i < 3000 && !std::filesystem::exists(round0) && server.running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(std::filesystem::exists(round0)) << ReadText(log);
  auto loaded = LoadCheckpoint(round0);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->model_name, "model");
  EXPECT_EQ(loaded->values, ExpectedValues());
  server.Kill(SIGTERM);
  EXPECT_TRUE(server.Wait(std::chrono::seconds(30)).has_value());
  EXPECT_THAT(ReadText(log), HasSubstr("initial model model from"));

  const std::string bad_log = File("fl-server-bad.log");
  fl::testing::Subprocess refused(
      {FL_SERVER_BIN, "--listen", "127.0.0.1:0", "--db", "", "--initial-model", File("weights.pt"), "--insecure"},
      bad_log);
  EXPECT_EQ(refused.Wait(std::chrono::seconds(30)), std::optional<int>(2));
  EXPECT_THAT(ReadText(bad_log), HasSubstr(File("weights.pt")));
  EXPECT_THAT(ReadText(bad_log), HasSubstr("torch.jit.script(model).save(path)"));
}

}  // namespace
}  // namespace fl::server
