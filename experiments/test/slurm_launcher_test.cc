// The Slurm launcher without a cluster (fast): the manifest's launcher block and its refusals, the batch script
// of a small manifest against its golden file (FL_UPDATE_GOLDEN=1 rewrites it), a job's shape against a cluster's
// partitions, and the step agent's refusal outside srun. The real cluster: slurm_run_test.cc.
#include "fl/experiment/slurm_launcher.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "fl/experiment/manifest.h"

namespace fl::experiment::slurm {
namespace {

namespace fs = std::filesystem;

const fs::path kExperiments = FL_EXPERIMENTS_DIR;

constexpr char kSmall[] = R"(name: slurm-small
seed: 3
server:
  rounds: 2
  round_deadline_s: 60
  selection: {min_fit_clients: 3, min_available_clients: 3}
  evaluation: {every: 0}
training: {model: "synthetic:20000:30"}
emulation: {backend: userspace, virtual_clients: false}
launcher: {kind: slurm, partition: debug, time: "10:00", sbatch_args: ["--account=fl", "--qos=short"]}
clients:
  - name: wifi
    count: 2
    link: wifi
    processes_per_node: 1
  - name: cell
    device: rpi4
    link: 5g-sa
)";

absl::StatusOr<Manifest> Parse(const std::string& text) {
  return ParseManifest(text, "small.yaml", kExperiments, ManifestOptions{kExperiments / "profiles"});
}

std::string Replace(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return at == std::string::npos ? text : text.replace(at, from.size(), to);
}

void ExpectRefused(const std::string& text, const std::vector<std::string>& parts) {
  absl::StatusOr<Manifest> m = Parse(text);
  ASSERT_FALSE(m.ok()) << "accepted:\n" << text;
  for (const std::string& p : parts) {
    EXPECT_NE(std::string(m.status().message()).find(p), std::string::npos)
        << "error lacks \"" << p << "\": " << m.status().message();
  }
}

ExperimentJobPaths FixedPaths() {
  return {.fl_experiment = "/opt/fl/bin/fl-experiment",
          .manifest = "/shared/experiments/small.yaml",
          .out_dir = "/shared/out/slurm-small",
          .db_path = "/shared/out/slurm-small/records.db",
          .bin_dir = "/opt/fl/bin",
          .profiles_dir = "",
          .resume_id = ""};
}

TEST(SlurmLauncherTest, LauncherBlockIsReadWithItsDefaults) {
  absl::StatusOr<Manifest> m = Parse(kSmall);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->launcher.kind, "slurm");
  EXPECT_EQ(m->launcher.partition, "debug");
  EXPECT_EQ(m->launcher.time, "10:00");
  EXPECT_EQ(m->launcher.nodes, 0u);
  EXPECT_EQ(m->launcher.sbatch_args, (std::vector<std::string>{"--account=fl", "--qos=short"}));
  EXPECT_EQ(m->launcher.image, "fl-testbed:" FL_PROJECT_VERSION);
  EXPECT_EQ(m->launcher.k8s_namespace, "default");
  EXPECT_EQ(m->launcher.storage, "1Gi");
  EXPECT_EQ(m->clients[0].processes_per_node, 1u);
  // Without a launcher block: local, and the same defaults.
  absl::StatusOr<Manifest> local = Parse(Replace(kSmall,
                                                 "launcher: {kind: slurm, partition: debug, time: \"10:00\", "
                                                 "sbatch_args: [\"--account=fl\", \"--qos=short\"]}\n",
                                                 ""));
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(local->launcher.kind, "local");
  EXPECT_EQ(local->launcher.image, "fl-testbed:" FL_PROJECT_VERSION);
  // Recorded with the experiment, and read back.
  absl::StatusOr<Manifest> back = ManifestFromResolvedJson(ResolvedManifestJson(*m), m->source_yaml);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->launcher, m->launcher);
  EXPECT_EQ(back->clients[0].processes_per_node, 1u);
}

TEST(SlurmLauncherTest, BadLauncherValuesAreNamedWithWhatIsAllowed) {
  ExpectRefused(Replace(kSmall, "kind: slurm", "kind: pbs"), {"launcher.kind", "pbs", "local, slurm, kubernetes"});
  ExpectRefused(Replace(kSmall, "time: \"10:00\"", "time: \"1h\""), {"launcher.time", "\"1h\"", "HH:MM:SS"});
  ExpectRefused(Replace(kSmall, "time: \"10:00\"", "time: \"1-2:3:4:5\""), {"launcher.time", "D-HH:MM:SS"});
  ExpectRefused(Replace(kSmall, "partition: debug", "partition: \"de bug\""), {"launcher.partition", "de bug"});
  ExpectRefused(Replace(kSmall, "\"--qos=short\"", "\"--nodes=4\""),
                {"launcher.sbatch_args", "--nodes=4", "launcher.nodes"});
  ExpectRefused(Replace(kSmall, "\"--qos=short\"", "\"-pdebug\""), {"launcher.sbatch_args", "-pdebug"});
  ExpectRefused(Replace(kSmall, "\"--qos=short\"", "\"qos=short\""), {"launcher.sbatch_args", "not one sbatch option"});
  ExpectRefused(Replace(kSmall, "partition: debug", "namespace: Prod"), {"launcher.namespace", "Prod", "lower-case"});
  ExpectRefused(Replace(kSmall, "partition: debug", "storage: 1GB"), {"launcher.storage", "1GB", "1Gi"});
  ExpectRefused(Replace(kSmall, "partition: debug", "nodes: -1"), {"launcher.nodes"});
  ExpectRefused(Replace(kSmall, "partition: debug", "colour: red"), {"launcher.colour", "unknown key"});
}

// The batch script of kSmall, with the paths fixed, against experiments/test/golden/slurm_experiment.sbatch.
TEST(SlurmLauncherTest, BatchScriptMatchesItsGoldenFile) {
  absl::StatusOr<Manifest> m = Parse(kSmall);
  ASSERT_TRUE(m.ok()) << m.status();
  absl::StatusOr<BatchJob> job = ExperimentJob(*m, FixedPaths());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->nodes, 2u);        // wifi: 2 processes, 1 per node
  EXPECT_EQ(TotalTasks(*job), 4u);  // the server and 3 client processes
  const std::string script = RenderBatchScript(*job);
  const fs::path golden = fs::path(FL_GOLDEN_DIR) / "slurm_experiment.sbatch";
  if (std::getenv("FL_UPDATE_GOLDEN") != nullptr) std::ofstream(golden) << script;
  std::ifstream in(golden);
  std::stringstream want;
  want << in.rdbuf();
  EXPECT_EQ(script, want.str()) << "rewrite it with FL_UPDATE_GOLDEN=1 if the change is meant";
}

// fl-experiment run --resume through Slurm: the job carries the resumed experiment's id, not a new one, and every
// step (prepare, server, clients) runs with --resume.
TEST(SlurmLauncherTest, AResumedJobKeepsTheExperimentIdAndResumesEveryStep) {
  absl::StatusOr<Manifest> m = Parse(kSmall);
  ASSERT_TRUE(m.ok()) << m.status();
  ExperimentJobPaths paths = FixedPaths();
  paths.resume_id = "slurm-small-slurm-41";
  absl::StatusOr<BatchJob> job = ExperimentJob(*m, paths);
  ASSERT_TRUE(job.ok()) << job.status();
  const std::string script = RenderBatchScript(*job);
  EXPECT_NE(script.find("\nID=slurm-small-slurm-41\n"), std::string::npos) << script;
  EXPECT_EQ(script.find("FL_EXPERIMENT_ID"), std::string::npos) << script;
  size_t agents = 0, resumed = 0;
  std::istringstream lines(script);
  for (std::string line; std::getline(lines, line);) {
    if (line.find("\"$FL_EXPERIMENT\" step ") == std::string::npos) continue;
    ++agents;
    if (line.find(" --resume") != std::string::npos) ++resumed;
  }
  EXPECT_EQ(agents, 4u);  // prepare, server, clients-wifi, clients-cell
  EXPECT_EQ(resumed, agents);
}

TEST(SlurmLauncherTest, VirtualClientGroupIsOneTask) {
  absl::StatusOr<Manifest> m = Parse(Replace(kSmall, "virtual_clients: false", "virtual_clients: true"));
  ASSERT_TRUE(m.ok()) << m.status();
  absl::StatusOr<std::vector<GroupProcesses>> groups = ClientGroupProcesses(*m);
  ASSERT_TRUE(groups.ok()) << groups.status();
  ASSERT_EQ(groups->size(), 2u);
  EXPECT_EQ((*groups)[0].count, 1u);  // wifi-0..1 in one fl-client --instances 2
  EXPECT_EQ((*groups)[1].first, 1u);

  // instances_per_process 1 splits wifi into two one-instance processes: two tasks of its step, one per node.
  absl::StatusOr<Manifest> split = Parse(Replace(Replace(kSmall, "virtual_clients: false", "virtual_clients: true"),
                                                 "count: 2", "count: 2\n    instances_per_process: 1"));
  ASSERT_TRUE(split.ok()) << split.status();
  groups = ClientGroupProcesses(*split);
  ASSERT_TRUE(groups.ok()) << groups.status();
  EXPECT_EQ((*groups)[0].count, 2u);
  EXPECT_EQ((*groups)[1].first, 2u);
}

TEST(SlurmLauncherTest, MoreProcessesThanTheAllocationHoldsAreRefused) {
  // wifi: 3 processes at 1 per node on launcher.nodes 2.
  absl::StatusOr<Manifest> m = Parse(Replace(Replace(kSmall, "count: 2", "count: 3"), "partition: debug", "nodes: 2"));
  ASSERT_TRUE(m.ok()) << m.status();
  absl::StatusOr<BatchJob> job = ExperimentJob(*m, FixedPaths());
  ASSERT_FALSE(job.ok());
  EXPECT_NE(std::string(job.status().message()).find("clients group wifi runs 3 processes"), std::string::npos)
      << job.status();
}

TEST(SlurmLauncherTest, JobShapeIsCheckedAgainstThePartitions) {
  absl::StatusOr<Manifest> m = Parse(kSmall);
  ASSERT_TRUE(m.ok()) << m.status();
  absl::StatusOr<BatchJob> job = ExperimentJob(*m, FixedPaths());
  ASSERT_TRUE(job.ok()) << job.status();
  const std::vector<PartitionInfo> cluster = {{.name = "debug", .nodes = 2, .cpus_per_node = 16, .is_default = true},
                                              {.name = "gpu", .nodes = 1, .cpus_per_node = 4, .is_default = false}};
  EXPECT_TRUE(CheckJobFits(*job, cluster).ok()) << CheckJobFits(*job, cluster);

  BatchJob unknown = *job;
  unknown.partition = "nope";
  absl::Status s = CheckJobFits(unknown, cluster);
  EXPECT_NE(std::string(s.message()).find("launcher.partition \"nope\" does not exist"), std::string::npos) << s;
  EXPECT_NE(std::string(s.message()).find("debug (default), gpu"), std::string::npos) << s;

  BatchJob too_many_nodes = *job;
  too_many_nodes.nodes = 3;
  s = CheckJobFits(too_many_nodes, cluster);
  EXPECT_NE(std::string(s.message()).find("asks for 3 nodes (launcher.nodes) but partition debug has 2"),
            std::string::npos)
      << s;

  BatchJob small_nodes = *job;
  small_nodes.partition = "gpu";
  small_nodes.nodes = 1;
  s = CheckJobFits(small_nodes, cluster);  // wifi: 2 processes at 1 per node on 1 node
  EXPECT_NE(std::string(s.message()).find("step clients-wifi runs 2 processes"), std::string::npos) << s;

  BatchJob crowded = *job;
  crowded.partition = "gpu";
  crowded.nodes = 1;
  crowded.steps[1].tasks_per_node = 0;
  crowded.steps[1].tasks = 4;  // 1 + 4 + 1 tasks on 4 CPUs
  s = CheckJobFits(crowded, cluster);
  EXPECT_NE(std::string(s.message()).find("runs 6 processes"), std::string::npos) << s;
  EXPECT_NE(std::string(s.message()).find("hold 4 CPUs"), std::string::npos) << s;
}

TEST(SlurmLauncherTest, PacketBackendIsRefusedNamingWhy) {
  absl::StatusOr<Manifest> m = Parse(Replace(kSmall, "backend: userspace", "backend: packet"));
  ASSERT_TRUE(m.ok()) << m.status();
  absl::StatusOr<BatchJob> job = ExperimentJob(*m, FixedPaths());
  ASSERT_FALSE(job.ok());
  EXPECT_NE(std::string(job.status().message()).find("emulation.backend packet cannot run on Slurm"), std::string::npos)
      << job.status();
}

TEST(SlurmLauncherTest, StepAgentOutsideSrunIsRefused) {
  unsetenv("SLURM_PROCID");
  absl::StatusOr<StepRank> r = StepRankFromEnv();
  ASSERT_FALSE(r.ok());
  EXPECT_NE(std::string(r.status().message()).find("SLURM_PROCID is not set"), std::string::npos) << r.status();
  setenv("SLURM_PROCID", "2", 1);
  setenv("SLURM_LOCALID", "1", 1);
  setenv("SLURMD_NODENAME", "n2", 1);
  r = StepRankFromEnv();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->procid, 2u);
  EXPECT_EQ(r->localid, 1u);
  EXPECT_EQ(r->node, "n2");
  unsetenv("SLURM_PROCID");
}

}  // namespace
}  // namespace fl::experiment::slurm
