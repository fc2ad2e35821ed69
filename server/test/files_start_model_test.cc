// fl-server's start from a user's file (issue 27), through the real binary and real files: an --initial-model or
// a checkpoint to resume from that holds a NaN/Inf, or a value the downlink codec cannot send, is refused at start
// (exit 2, no signal, the file, the tensor and the element named) where fl-server used to abort with SIGABRT
// ("cannot encode the global model"); a checkpoint that is a FIFO, a link to /dev/zero or larger than its header
// says is refused naming its path where fl-server used to block forever or read until memory ran out; a .pt
// initial model that is a FIFO or /dev/zero likewise (the torch-free reader in formats/).
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "fl/core/tensor_spec.h"
#include "fl/instrumentation/record_store.h"
#include "fl/server/checkpoint.h"
#include "fl/testing/python.h"
#include "fl/testing/run_tool.h"
#include "fl/testing/scratch_dir.h"

namespace fl::server {
namespace {

using ::fl::testing::RunTool;
using ::fl::testing::ScratchDir;
using ::fl::testing::ToolResult;
using ::testing::HasSubstr;

// A small model: fc.weight [2, 3] and fc.bias [2], values 0.1 .. 0.8.
Checkpoint SmallModel(const std::string& experiment_id = "exp-files") {
  Checkpoint c;
  c.experiment_id = experiment_id;
  c.round = 0;
  c.model_version = 0;
  auto spec = core::ModelSpec::Create(
      {{"fc.weight", {2, 3}, core::DType::kFloat32, 0}, {"fc.bias", {2}, core::DType::kFloat32, 0}});
  EXPECT_TRUE(spec.ok()) << spec.status();
  c.spec = *spec;
  c.model_name = "small";
  for (int i = 0; i < 8; ++i) c.values.push_back(0.1f * static_cast<float>(i + 1));
  return c;
}

// fl-server with the given flags (plaintext on loopback, port 0, no records unless given); 30 s at most: every
// case here must be refused at start, in well under a second.
ToolResult Server(const ScratchDir& dir, std::vector<std::string> args) {
  std::vector<std::string> argv = {FL_SERVER_BIN, "--listen", "127.0.0.1:0", "--insecure", "--rounds", "1"};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunTool(argv, dir, std::chrono::seconds(30));
}

// Exit code 2 (not a signal: RunTool's code is 128 + N for a signal, -1 for a hang killed at the timeout).
void ExpectRefused(const ToolResult& r) {
  EXPECT_EQ(r.code, 2) << (r.code == -1 ? "fl-server hung (killed after the timeout)\n" : "") << r.output;
  EXPECT_THAT(r.output, ::testing::Not(HasSubstr("cannot encode the global model"))) << r.output;
}

TEST(FilesStartModelTest, InitialModelCheckpointWithNaNIsRefusedNamingTensorAndElement) {
  ScratchDir dir("files_start_nan");
  Checkpoint c = SmallModel();
  c.values[7] = std::numeric_limits<float>::quiet_NaN();  // fc.bias element 1
  const std::string path = dir.File("nan.ckpt");
  ASSERT_TRUE(SaveCheckpoint(c, path).ok());
  const ToolResult r = Server(dir, {"--db", "", "--initial-model", path});
  ExpectRefused(r);
  EXPECT_THAT(r.output, HasSubstr(path)) << r.output;
  EXPECT_THAT(r.output, HasSubstr("tensor 'fc.bias' element 1 is nan")) << r.output;
}

TEST(FilesStartModelTest, InitialModelCheckpointWithInfInOptimizerStateIsRefused) {
  ScratchDir dir("files_start_inf_state");
  Checkpoint c = SmallModel();
  c.optimizer.optimizer = "fedadam";
  c.optimizer.buffers.push_back({"m", std::vector<float>(8, 0.0f)});
  c.optimizer.buffers.back().values[3] = std::numeric_limits<float>::infinity();
  const std::string path = dir.File("inf-state.ckpt");
  ASSERT_TRUE(SaveCheckpoint(c, path).ok());
  const ToolResult r = Server(dir, {"--db", "", "--initial-model", path});
  ExpectRefused(r);
  EXPECT_THAT(r.output, HasSubstr(path)) << r.output;
  EXPECT_THAT(r.output, HasSubstr("optimizer state 'm' element 3 is inf")) << r.output;
}

// Finite, but beyond what fp16 can carry: the downlink encoding at publish would fail (and abort).
TEST(FilesStartModelTest, InitialModelTheDownlinkCodecCannotSendIsRefusedAtStart) {
  ScratchDir dir("files_start_fp16");
  Checkpoint c = SmallModel();
  c.values[2] = 1e6f;  // fc.weight element 2
  const std::string path = dir.File("big.ckpt");
  ASSERT_TRUE(SaveCheckpoint(c, path).ok());
  const ToolResult r = Server(dir, {"--db", "", "--initial-model", path, "--downlink-codec", "fp16"});
  ExpectRefused(r);
  EXPECT_THAT(r.output, HasSubstr(path)) << r.output;
  EXPECT_THAT(r.output, HasSubstr("tensor 'fc.weight'")) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--downlink-codec")) << r.output;
}

// --resume from a checkpoint whose model holds an Inf: the records hold the experiment (no round committed, so
// round 0's checkpoint is the one to resume from).
TEST(FilesStartModelTest, ResumeFromACheckpointWithInfIsRefusedNamingIt) {
  ScratchDir dir("files_start_resume_inf");
  const std::string db = dir.File("records.db");
  {
    auto store = instrumentation::RecordStore::Open(db);
    ASSERT_TRUE(store.ok()) << store.status();
    instrumentation::ExperimentRecord e;
    e.id = "exp-files";
    e.name = "files";
    e.started_unix_ms = 1;
    ASSERT_TRUE((*store)->Enqueue(e).ok());
    ASSERT_TRUE((*store)->Close().ok());
  }
  const std::string ckpt_dir = dir.File("ckpt");
  Checkpoint c = SmallModel();
  c.values[0] = -std::numeric_limits<float>::infinity();  // fc.weight element 0
  ASSERT_TRUE(SaveCheckpoint(c, CheckpointPath(ckpt_dir, 0)).ok());
  const ToolResult r =
      Server(dir, {"--db", db, "--checkpoint-dir", ckpt_dir, "--resume", "--experiment-id", "exp-files"});
  ExpectRefused(r);
  EXPECT_THAT(r.output, HasSubstr(CheckpointPath(ckpt_dir, 0))) << r.output;
  EXPECT_THAT(r.output, HasSubstr("tensor 'fc.weight' element 0 is -inf")) << r.output;
}

TEST(FilesStartModelTest, CheckpointThatIsAFifoIsRefusedNotWaitedOn) {
  ScratchDir dir("files_start_fifo");
  const std::string path = dir.File("model.ckpt");
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  const ToolResult r = Server(dir, {"--db", "", "--initial-model", path});
  ExpectRefused(r);
  EXPECT_THAT(r.output, HasSubstr("checkpoint " + path + ": is a FIFO")) << r.output;
}

TEST(FilesStartModelTest, CheckpointThatLinksToDevZeroIsRefusedBeforeItIsRead) {
  ScratchDir dir("files_start_devzero");
  const std::string path = dir.File("model.ckpt");
  std::filesystem::create_symlink("/dev/zero", path);
  const ToolResult r = Server(dir, {"--db", "", "--initial-model", path});
  ExpectRefused(r);
  EXPECT_THAT(r.output, HasSubstr("checkpoint " + path + ": is a character device")) << r.output;
}

// --resume over a checkpoint folder whose newest "checkpoint" is a FIFO: skipped as unusable (naming it), never
// opened for a blocking read.
TEST(FilesStartModelTest, ResumeOverAFifoCheckpointDoesNotHang) {
  ScratchDir dir("files_start_resume_fifo");
  const std::string db = dir.File("records.db");
  {
    auto store = instrumentation::RecordStore::Open(db);
    ASSERT_TRUE(store.ok()) << store.status();
    instrumentation::ExperimentRecord e;
    e.id = "exp-files";
    e.name = "files";
    e.started_unix_ms = 1;
    ASSERT_TRUE((*store)->Enqueue(e).ok());
    ASSERT_TRUE((*store)->Close().ok());
  }
  const std::string ckpt_dir = dir.File("ckpt");
  std::filesystem::create_directories(ckpt_dir);
  ASSERT_EQ(::mkfifo(CheckpointPath(ckpt_dir, 0).c_str(), 0600), 0);
  const ToolResult r = Server(dir, {"--db", db, "--checkpoint-dir", ckpt_dir, "--resume"});
  ExpectRefused(r);
  EXPECT_THAT(r.output, HasSubstr("checkpoint " + CheckpointPath(ckpt_dir, 0) + ": is a FIFO")) << r.output;
}

// A checkpoint whose header declares more model values than the file holds: refused from the header and the
// file's size, naming the path (and a valid checksum cannot make it pass).
TEST(FilesStartModelTest, CheckpointShorterThanItsHeaderDeclaresIsRefused) {
  ScratchDir dir("files_start_short");
  const std::string path = dir.File("short.ckpt");
  ASSERT_TRUE(SaveCheckpoint(SmallModel(), path).ok());
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 12);
  const ToolResult r = Server(dir, {"--db", "", "--initial-model", path});
  ExpectRefused(r);
  EXPECT_THAT(r.output, HasSubstr("checkpoint " + path + " is corrupt")) << r.output;
  EXPECT_THAT(r.output, HasSubstr("its header declares")) << r.output;
}

// A TorchScript .pt whose weight holds a NaN (written entry by entry, without torch, by formats' hostile-file
// generator): fl-server aborted with "cannot encode the global model"; now exit 2 naming the file.
TEST(FilesStartModelTest, TorchScriptInitialModelWithNaNOrInfIsRefused) {
  ScratchDir dir("files_start_pt_nan");
  const std::string out = dir.File("hostile");
  auto made = fl::testing::RunPythonFile(std::string(FL_SOURCE_DIR) + "/formats/test/hostile_files.py",
                                         {out, "tensor_attacks"}, dir.File("python.log"));
  ASSERT_TRUE(made.ok()) << made.status();
  for (const char* name : {"nan_weight.pt", "inf_weight.pt"}) {
    const std::string path = out + "/" + name;
    const ToolResult r = Server(dir, {"--db", "", "--initial-model", path});
    ExpectRefused(r);
    EXPECT_THAT(r.output, HasSubstr(path)) << r.output;
    EXPECT_THAT(r.output, ::testing::ContainsRegex("nan|inf|NaN|Inf")) << r.output;
  }
}

// A .pt initial model is read by formats/ (the torch-free TorchScript reader): a FIFO or /dev/zero named
// model.pt must be refused too, naming the file, never waited on or read without end.
TEST(FilesStartModelTest, TorchScriptInitialModelThatIsAFifoOrDevZeroIsRefused) {
  ScratchDir dir("files_start_pt");
  const std::string fifo = dir.File("fifo.pt");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string zero = dir.File("zero.pt");
  std::filesystem::create_symlink("/dev/zero", zero);
  for (const std::string& path : {fifo, zero}) {
    const ToolResult r = Server(dir, {"--db", "", "--initial-model", path});
    ExpectRefused(r);
    EXPECT_THAT(r.output, HasSubstr(path)) << r.output;
  }
}

}  // namespace
}  // namespace fl::server
