// The islands launcher (RunIslandsExperiment, behind fl-experiment and fl-islands-run) with the real fl-coordinator
// and fl-island binaries: a tiny manifest runs to the end with equal hashes and its result file; an island that
// fails stops the experiment at once with an error naming its log, and the coordinator is stopped with it.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>

#include "fl/diloco/islands_experiment.h"
#include "fl/testing/scratch_dir.h"
#include "fl/testing/subprocess.h"

namespace fl::diloco {
namespace {

// A tiny char-lm manifest: 2 islands, DiLoCo H=10, 20 inner steps (2 outer steps).
std::string TinyManifest(const std::string& extra_model_field) {
  return std::string(
             "name: launch-test\nmethod: diloco\nmode: diloco\nislands: 2\nranks_per_island: 1\n"
             "threads_per_rank: 1\nmodel:\n  name: char-lm\n  d_model: 16\n  layers: 2\n  heads: 2\n"
             "  context: 16\n  batch_size: 4\n") +
         extra_model_field +
         "inner:\n  lr: 3.0e-3\n  warmup_steps: 5\n  total_steps: 20\nouter:\n  inner_steps: 10\n"
         "exchange:\n  codec: int8\n  error_feedback: true\n";
}

LaunchPaths Paths(const std::string& out) { return {FL_ISLAND_BIN, FL_COORDINATOR_BIN, out}; }

bool LoopbackPortAcceptsConnections(int port) {
  const int fd = fl::testing::ConnectLoopback(port);
  if (fd >= 0) close(fd);
  return fd >= 0;
}

TEST(IslandsLaunchTest, TinyManifestRunsToTheEndWithEqualHashes) {
  fl::testing::ScratchDir dir("launch-ok");
  const std::string manifest = dir.File("tiny.yaml");
  std::ofstream(manifest) << TinyManifest("");
  absl::StatusOr<IslandsExperimentConfig> config = LoadIslandsExperiment(manifest);
  ASSERT_TRUE(config.ok()) << config.status();
  const std::string out = dir.File("out");
  absl::StatusOr<IslandsExperimentResult> result = RunIslandsExperiment(*config, Paths(out));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(result->hashes_equal);
  EXPECT_GT(result->bytes_sent, 0u);
  EXPECT_GT(result->final_eval_loss, 0.0);
  EXPECT_EQ(result->units, 2u * 20u * 4u * 16u);  // islands x steps x batch x context
  EXPECT_TRUE(std::filesystem::exists(out + "/result.json"));
  EXPECT_TRUE(std::filesystem::exists(out + "/records.db"));
}

TEST(IslandsLaunchTest, FailingIslandStopsTheExperimentAndItsCoordinator) {
  fl::testing::ScratchDir dir("launch-fail");
  const std::string manifest = dir.File("bad-model.yaml");
  // d_model 15 is not divisible by 2 heads: every fl-island refuses the model and exits non-zero, while the
  // coordinator would wait for its islands for ever.
  std::string text = TinyManifest("");
  text.replace(text.find("d_model: 16"), 11, "d_model: 15");
  std::ofstream(manifest) << text;
  absl::StatusOr<IslandsExperimentConfig> config = LoadIslandsExperiment(manifest);
  ASSERT_TRUE(config.ok()) << config.status();
  const std::string out = dir.File("out");
  absl::StatusOr<IslandsExperimentResult> result = RunIslandsExperiment(*config, Paths(out));
  ASSERT_FALSE(result.ok());
  const std::string msg(result.status().message());
  EXPECT_NE(msg.find("fl-island island-"), std::string::npos) << msg;
  EXPECT_NE(msg.find("-rank0.log"), std::string::npos) << msg;
  // The coordinator was stopped: its port no longer accepts connections.
  std::ifstream port_file(out + "/coordinator.port");
  int port = 0;
  ASSERT_TRUE(port_file >> port);
  EXPECT_FALSE(LoopbackPortAcceptsConnections(port)) << "coordinator on port " << port << " still running";
  // The log of the island that failed (named in the error: whichever island failed first; the others are
  // stopped, possibly before they log anything) says why.
  std::smatch failed;
  ASSERT_TRUE(std::regex_search(msg, failed, std::regex(R"(island-\d+-rank\d+\.log)"))) << msg;
  std::ifstream log(out + "/" + failed[0].str());
  const std::string log_text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_NE(log_text.find("heads dividing d_model"), std::string::npos) << log_text;
}

}  // namespace
}  // namespace fl::diloco
