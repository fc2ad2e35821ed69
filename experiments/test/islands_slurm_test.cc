// Islands on Slurm against the real local Slurm (tools/local-slurm.sh; root, slow): two islands across the two
// namespace "sites" of `start --sites` finish with the same result structure as a local run, every process
// advertising its node's address; on the cluster without sites both nodes' NodeAddr is 127.0.0.1, and spreading
// the islands over them is refused before submission, naming the island and the address.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <set>
#include <string>

#include "fl/core/str_cat.h"
#include "fl/experiment/islands_experiment.h"
#include "fl/experiment/islands_slurm.h"
#include "fl/sys/process.h"
#include "fl/sys/user_file.h"
#include "fl/testing/scratch_dir.h"
#include "slurm_local_cluster.h"

namespace fl::experiment {
namespace {

// A file's text ("" when missing: the expectations then say what was wanted).
std::string Slurp(const std::string& path) { return fl::sys::ReadUserFile(path, "test output", 1 << 20).value_or(""); }

// The tiny manifest of islands_launch_test: 2 islands, DiLoCo H=10, 20 inner steps.
std::string TinyManifest() {
  return "name: slurm-sites\nmethod: diloco\nmode: diloco\nislands: 2\nranks_per_island: 1\nthreads_per_rank: 1\n"
         "model:\n  name: char-lm\n  d_model: 16\n  layers: 2\n  heads: 2\n  context: 16\n  batch_size: 4\n"
         "inner:\n  lr: 3.0e-3\n  warmup_steps: 5\n  total_steps: 20\nouter:\n  inner_steps: 10\n"
         "exchange:\n  codec: int8\n  error_feedback: true\nlauncher:\n  kind: slurm\n  partition: debug\n"
         "  nodes: 2\n  time: \"10:00\"\n";
}

IslandsJobPaths Paths(const fl::testing::ScratchDir& dir) {
  return {.fl_islands_run = FL_ISLANDS_RUN_BIN,
          .fl_island = FL_ISLAND_BIN,
          .fl_coordinator = FL_COORDINATOR_BIN,
          .manifest = dir.File("tiny.yaml"),
          .out_dir = dir.File("out")};
}

TEST(IslandsSlurmTest, TwoIslandsAcrossTwoNamespaceSitesFinishLikeALocalRun) {
  fl::testing::ScratchDir dir("islands-sites");
  std::unique_ptr<fl::testing::LocalSlurm> cluster =
      fl::testing::LocalSlurm::Start(std::string(FL_SOURCE_DIR) + "/tools/local-slurm.sh", /*sites=*/true);
  ASSERT_TRUE(cluster->started().ok()) << cluster->started();
  std::ofstream(dir.File("tiny.yaml")) << TinyManifest();
  absl::StatusOr<IslandsExperimentConfig> config = LoadIslandsExperiment(dir.File("tiny.yaml"));
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<IslandsExperimentResult> result = RunIslandsOnSlurm(*config, Paths(dir));
  ASSERT_TRUE(result.ok()) << result.status();
  // What islands_launch_test checks of a local run.
  EXPECT_TRUE(result->hashes_equal);
  EXPECT_GT(result->bytes_sent, 0u);
  EXPECT_GT(result->final_eval_loss, 0.0);
  EXPECT_EQ(result->units, 2u * 20u * 4u * 16u);
  const std::string out = dir.File("out");
  EXPECT_TRUE(std::filesystem::exists(out + "/result.json"));
  EXPECT_TRUE(std::filesystem::exists(out + "/records.db"));
  // The coordinator ran on n1's site and advertised its namespace's address, not loopback; each island joined
  // from its own site's address (the coordinator logs the endpoint every island joins with).
  const std::string coordinator = Slurp(out + "/coordinator.address");
  EXPECT_EQ(coordinator.rfind("10.216.", 0), 0u) << coordinator;
  const std::string log = Slurp(out + "/coordinator.log");
  std::set<std::string> joined_from;
  const std::regex join(
      R"('(island-\d)' asks to join \(1 ranks, data tcp://(10\.216\.\d+\.2):\d+, state (10\.216\.\d+\.2):)");
  for (std::sregex_iterator it(log.begin(), log.end(), join), end; it != end; ++it) {
    EXPECT_EQ((*it)[2].str(), (*it)[3].str()) << "ring and state server of " << (*it)[1] << " on one address";
    joined_from.insert((*it)[2].str());
  }
  EXPECT_EQ(joined_from.size(), 2u) << "each island from its own site:\n" << log;
  EXPECT_EQ(log.find("127.0.0.1:"), std::string::npos) << log;
}

TEST(IslandsSlurmTest, LoopbackNodeAddressesAcrossNodesAreRefusedBeforeSubmission) {
  fl::testing::ScratchDir dir("islands-loopback");
  std::unique_ptr<fl::testing::LocalSlurm> cluster =
      fl::testing::LocalSlurm::Start(std::string(FL_SOURCE_DIR) + "/tools/local-slurm.sh", /*sites=*/false);
  ASSERT_TRUE(cluster->started().ok()) << cluster->started();
  std::ofstream(dir.File("tiny.yaml")) << TinyManifest();
  absl::StatusOr<IslandsExperimentConfig> config = LoadIslandsExperiment(dir.File("tiny.yaml"));
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<IslandsExperimentResult> result = RunIslandsOnSlurm(*config, Paths(dir));
  ASSERT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << result.status();
  const std::string msg(result.status().message());
  EXPECT_NE(msg.find("on node n1 advertises 127.0.0.1, a loopback address"), std::string::npos) << msg;
  EXPECT_NE(msg.find("island-1 on n2"), std::string::npos) << msg;
  EXPECT_FALSE(std::filesystem::exists(dir.File("out/islands.sbatch"))) << "nothing submitted";

  // A site that submits the rendered script itself (fl-experiment render) gets the same refusal from the steps,
  // which check the node they really got: the job fails and its output names the process and the address.
  absl::StatusOr<std::string> script = RenderIslandsBatchScript(*config, Paths(dir));
  ASSERT_TRUE(script.ok()) << script.status();
  std::filesystem::create_directories(dir.File("out"));
  ASSERT_TRUE(ProvisionIslandsPki(*config, dir.File("out"), {"127.0.0.1"}).ok());
  std::ofstream(dir.File("out/by-hand.sbatch")) << *script;
  absl::StatusOr<slurm::JobOutcome> job = slurm::SubmitAndWait(dir.File("out/by-hand.sbatch"), nullptr);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_NE(job->exit_code, 0);
  const std::string output = Slurp(dir.File(fl::StrCat("out/slurm-", job->job_id, ".out")));
  // Whichever step checks first (every one of them would refuse) fails the job and the others are stopped.
  EXPECT_TRUE(
      std::regex_search(output, std::regex(R"((coordinator|island-[01]) on node n[12] advertises 127\.0\.0\.1, )"
                                           R"(a loopback address \(its NodeAddr\), but the job spans 2 nodes)")))
      << output;
}

}  // namespace
}  // namespace fl::experiment
