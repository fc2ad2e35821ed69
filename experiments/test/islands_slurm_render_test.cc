// Islands on Slurm without Slurm (torch-free, fast): the rendered batch script against its golden file, the
// placement of the coordinator and the islands on the job's nodes, and the refusal of a loopback address across
// nodes, which names the process, its address and its node.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "fl/experiment/islands_addresses.h"
#include "fl/experiment/islands_slurm.h"
#include "fl/sys/user_file.h"
#include "fl/testing/scratch_dir.h"

namespace fl::experiment {
namespace {

// A file's text ("" when missing: the expectations then say what was wanted).
std::string Slurp(const std::string& path) { return fl::sys::ReadUserFile(path, "test output", 1 << 20).value_or(""); }

IslandsExperimentConfig Tiny() {
  IslandsExperimentConfig c;
  c.name = "sites";
  c.islands = 2;
  c.total_steps = 20;
  c.inner_steps = 10;
  c.launcher.kind = "slurm";
  c.launcher.partition = "debug";
  c.launcher.time = "10:00";
  c.launcher.sbatch_args = {"--qos=short"};
  return c;
}

const IslandsJobPaths kPaths{.fl_islands_run = "/opt/fl/bin/fl-islands-run",
                             .fl_island = "/opt/fl/bin/fl-island",
                             .fl_coordinator = "/opt/fl/bin/fl-coordinator",
                             .manifest = "/shared/islands/sites.yaml",
                             .out_dir = "/shared/out/sites"};

// The script a site would submit: the coordinator's step on the first node, island i on node i mod N, each step
// this launcher for its part advertising its node's address. FL_UPDATE_GOLDEN=1 rewrites the golden file.
TEST(IslandsSlurmRenderTest, BatchScriptMatchesTheGoldenFile) {
  absl::StatusOr<std::string> script = RenderIslandsBatchScript(Tiny(), kPaths);
  ASSERT_TRUE(script.ok()) << script.status();
  const std::string golden = std::string(FL_GOLDEN_DIR) + "/islands_slurm.sbatch";
  if (std::getenv("FL_UPDATE_GOLDEN") != nullptr) std::ofstream(golden) << *script;
  EXPECT_EQ(*script, Slurp(golden)) << "rendered:\n" << *script;
  EXPECT_NE(script->find("--step island-1 --advertise node"), std::string::npos) << *script;
  EXPECT_NE(script->find("--relative=1"), std::string::npos) << *script;
}

TEST(IslandsSlurmRenderTest, StaticRingModesAreRefusedWithWhy) {
  IslandsExperimentConfig c = Tiny();
  c.mode = "data-parallel";
  absl::StatusOr<std::string> script = RenderIslandsBatchScript(c, kPaths);
  ASSERT_EQ(script.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(script.status().message()).find("mode data-parallel runs a static ring"), std::string::npos)
      << script.status();
}

TEST(IslandsSlurmRenderTest, RelativePathsAreRefused) {
  IslandsJobPaths p = kPaths;
  p.out_dir = "out/sites";
  absl::StatusOr<std::string> script = RenderIslandsBatchScript(Tiny(), p);
  ASSERT_EQ(script.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(script.status().message()).find("'out/sites' is relative"), std::string::npos)
      << script.status();
}

TEST(IslandsSlurmRenderTest, PlacementPutsTheCoordinatorFirstAndIslandsRoundRobin) {
  IslandsExperimentConfig c = Tiny();
  c.islands = 3;
  const std::vector<ProcessPlacement> p = PlaceIslands(c, {{"n1", "10.0.0.1"}, {"n2", "10.0.0.2"}});
  ASSERT_EQ(p.size(), 4u);
  EXPECT_EQ(p[0].name, "coordinator");
  EXPECT_EQ(p[0].node, "n1");
  EXPECT_EQ(p[2].name, "island-1");
  EXPECT_EQ(p[2].host, "10.0.0.2");
  EXPECT_EQ(p[3].node, "n1");
  EXPECT_TRUE(CheckPeersCanReach(p).ok());
  EXPECT_EQ(IslandsJobNodes(c, 2), 2u);
  EXPECT_EQ(IslandsJobNodes(c, 8), 3u);
}

// An island on another node than its peers that advertises 127.0.0.1 would have them dial themselves: refused,
// naming it, its address and its node. On one node loopback is right.
TEST(IslandsSlurmRenderTest, LoopbackAcrossNodesIsRefusedNamingTheIslandAndAddress) {
  IslandsExperimentConfig c = Tiny();
  absl::Status s = CheckPeersCanReach(PlaceIslands(c, {{"n1", "10.0.0.1"}, {"n2", "127.0.0.1"}}));
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  const std::string msg(s.message());
  EXPECT_NE(msg.find("island-1 on node n2 advertises 127.0.0.1, a loopback address"), std::string::npos) << msg;
  EXPECT_NE(msg.find("coordinator on n1"), std::string::npos) << msg;
  EXPECT_TRUE(CheckPeersCanReach(PlaceIslands(c, {{"n1", "127.0.0.1"}})).ok());
  EXPECT_TRUE(IsLoopbackHost("127.0.1.1"));
  EXPECT_TRUE(IsLoopbackHost("localhost"));
  EXPECT_FALSE(IsLoopbackHost("10.216.1.2"));
  EXPECT_FALSE(IsLoopbackHost("node7.cluster"));
}

TEST(IslandsSlurmRenderTest, AnAddressThatIsNotThisMachinesIsRefusedLocally) {
  EXPECT_TRUE(FreePortOn("127.0.0.1").ok());
  absl::StatusOr<int> port = FreePortOn("192.0.2.1");  // TEST-NET-1: never this machine's
  ASSERT_EQ(port.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(port.status().message()).find("'192.0.2.1'"), std::string::npos) << port.status();
  absl::Status host = CheckAdvertisableHost("island-0", "10.0.0.1:5000");
  ASSERT_EQ(host.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(host.message()).find("island-0 would advertise '10.0.0.1:5000'"), std::string::npos) << host;
  EXPECT_EQ(CheckAdvertisableHost("the coordinator", "0.0.0.0").code(), absl::StatusCode::kInvalidArgument);
}

// The manifest's launcher block: read into the config; sbatch options the launcher writes itself are refused with
// the key to use instead, naming the file and line.
TEST(IslandsSlurmRenderTest, ManifestLauncherBlockIsReadAndItsMistakesNamed) {
  fl::testing::ScratchDir dir("islands-launcher");
  const std::string path = dir.File("m.yaml");
  std::ofstream(path) << "name: x\nislands: 2\ninner:\n  total_steps: 20\nouter:\n  inner_steps: 10\n"
                         "launcher:\n  kind: slurm\n  partition: debug\n  time: \"1:00:00\"\n  nodes: 2\n"
                         "  sbatch_args: [\"--qos=short\"]\n";
  absl::StatusOr<IslandsExperimentConfig> c = LoadIslandsExperiment(path);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->launcher.kind, "slurm");
  EXPECT_EQ(c->launcher.partition, "debug");
  EXPECT_EQ(c->launcher.time, "1:00:00");
  EXPECT_EQ(c->launcher.nodes, 2u);
  EXPECT_EQ(c->launcher.sbatch_args, std::vector<std::string>{"--qos=short"});

  std::ofstream(path) << "name: x\nislands: 2\nlauncher:\n  kind: slurm\n  sbatch_args: [\"--nodes=4\"]\n";
  c = LoadIslandsExperiment(path);
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(c.status().message())
                .find("m.yaml:5: launcher.sbatch_args: \"--nodes=4\": the launcher "
                      "writes --nodes itself"),
            std::string::npos)
      << c.status();

  std::ofstream(path) << "name: x\nislands: 2\nlauncher:\n  kind: kubernetes\n";
  c = LoadIslandsExperiment(path);
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(c.status().message()).find("launcher.kind"), std::string::npos) << c.status();
}

}  // namespace
}  // namespace fl::experiment
