// fl-island's device resolution end to end, in a build without NCCL (a CPU LibTorch; CMakeLists.txt
// builds this suite only there): `--device auto` resolves to the CPU and logs why, trains exactly as
// `--device cpu` does (same replica and outer-state hashes), and `--device cuda` fails before training with
// an error naming what is missing and what to do.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "fl/testing/scratch_dir.h"
#include "fl/testing/subprocess.h"

namespace {

using fl::testing::FreeLoopbackPort;
using fl::testing::ScratchDir;
using fl::testing::Subprocess;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

bool Has(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

// Runs fl-island with `args` to the end; returns its exit code (-1 if it did not finish) and its output.
int RunIsland(const std::vector<std::string>& args, const std::string& log, std::string* output) {
  std::vector<std::string> argv = {FL_ISLAND_BIN, "--insecure"};  // a static ring of one on loopback
  argv.insert(argv.end(), args.begin(), args.end());
  Subprocess p(argv, log);
  std::optional<int> rc = p.Wait(std::chrono::minutes(3));
  *output = ReadFile(log);
  return rc.has_value() ? *rc : -1;
}

// One island alone (a static ring of one), DiLoCo with 2 fragments over 20 steps of a tiny model.
std::vector<std::string> TinyRun(const std::string& device, const std::string& summary) {
  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(FreeLoopbackPort());
  return {"--device",        device,    "--island-id",    "island-0",
          "--data-endpoint", endpoint,  "--peer",         "island-0=" + endpoint,
          "--inner-steps",   "10",      "--fragments",    "2",
          "--total-steps",   "20",      "--summary",      summary,
          "--model",         "char-lm", "--d-model",      "16",
          "--layers",        "2",       "--heads",        "2",
          "--context",       "16",      "--batch-size",   "4",
          "--threads",       "1",       "--warmup-steps", "5",
          "--inner-lr",      "3e-3"};
}

TEST(IslandDeviceTest, ShowDeviceAutoIsCpuAndSaysWhy) {
  ScratchDir dir("island_device_auto");
  std::string out;
  ASSERT_EQ(RunIsland({"--device", "auto", "--show-device"}, dir.File("log"), &out), 0) << out;
  EXPECT_TRUE(Has(out, "device: cpu\n")) << out;
  EXPECT_TRUE(Has(out, "no CUDA device")) << out;
  EXPECT_TRUE(Has(out, "no c10d NCCL process group")) << out;
}

TEST(IslandDeviceTest, ShowDeviceCudaFailsNamingWhatIsMissing) {
  ScratchDir dir("island_device_cuda");
  std::string out;
  EXPECT_EQ(RunIsland({"--device", "cuda", "--show-device"}, dir.File("log"), &out), 1) << out;
  EXPECT_TRUE(Has(out, "FAILED_PRECONDITION")) << out;
  EXPECT_TRUE(Has(out, "LibTorch sees no CUDA device")) << out;
  EXPECT_TRUE(Has(out, "USE_C10D_NCCL")) << out;
  EXPECT_TRUE(Has(out, "use --device cpu")) << out;
  EXPECT_FALSE(Has(out, "device: ")) << out;
}

TEST(IslandDeviceTest, BadCudaDeviceIsAUsageError) {
  ScratchDir dir("island_device_bad");
  std::string out;
  EXPECT_EQ(RunIsland({"--device", "auto", "--cuda-device", "-3", "--show-device"}, dir.File("log"), &out), 2) << out;
  EXPECT_TRUE(Has(out, "--cuda-device -3")) << out;
}

TEST(IslandDeviceTest, TrainingWithDeviceCudaFailsBeforeItStarts) {
  ScratchDir dir("island_device_cuda_run");
  std::string out;
  EXPECT_EQ(RunIsland(TinyRun("cuda", dir.File("s.json")), dir.File("log"), &out), 1) << out;
  EXPECT_TRUE(Has(out, "--device cuda: LibTorch sees no CUDA device")) << out;
  EXPECT_TRUE(ReadFile(dir.File("s.json")).empty()) << "a summary was written although nothing trained";
}

TEST(IslandDeviceTest, AutoTrainsOnTheCpuBitForBitLikeCpu) {
  ScratchDir dir("island_device_same");
  std::string auto_out, cpu_out;
  ASSERT_EQ(RunIsland(TinyRun("auto", dir.File("auto.json")), dir.File("auto.log"), &auto_out), 0) << auto_out;
  ASSERT_EQ(RunIsland(TinyRun("cpu", dir.File("cpu.json")), dir.File("cpu.log"), &cpu_out), 0) << cpu_out;
  EXPECT_TRUE(Has(auto_out, "rank 0: device cpu")) << auto_out;
  EXPECT_TRUE(Has(auto_out, "--device auto: LibTorch sees no CUDA device")) << auto_out;
  EXPECT_TRUE(Has(cpu_out, "rank 0: device cpu — --device cpu")) << cpu_out;
  const nlohmann::json a = nlohmann::json::parse(ReadFile(dir.File("auto.json")), nullptr, false);
  const nlohmann::json c = nlohmann::json::parse(ReadFile(dir.File("cpu.json")), nullptr, false);
  ASSERT_TRUE(a.is_object() && c.is_object()) << auto_out << cpu_out;
  EXPECT_EQ(a["steps"], 20);
  EXPECT_EQ(a["outer_steps"], 4);  // 20 steps / H 10 = 2 rounds x 2 fragments
  EXPECT_EQ(a["local_model_hash"], c["local_model_hash"]);
  EXPECT_EQ(a["state_hash"], c["state_hash"]);
  EXPECT_EQ(a["final_eval_loss"], c["final_eval_loss"]);
}

}  // namespace
