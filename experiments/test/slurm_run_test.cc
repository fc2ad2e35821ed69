// fl-experiment run --launcher slurm against the real local Slurm (tools/local-slurm.sh; root, slow): a small
// manifest finishes with the same records (rounds, clients, phases) as the same manifest run locally; a client
// step killed mid-run is named, the experiment recorded aborted with its committed rounds intact; and the bad
// inputs (an unknown partition, more nodes than the partition has, a controller that does not answer, no sbatch)
// are refused before submission, each naming what and where.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <utility>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "fl/core/str_cat.h"
#include "fl/instrumentation/record_reader.h"
#include "fl/sys/process.h"
#include "fl/testing/scratch_dir.h"
#include "slurm_local_cluster.h"

namespace fl::experiment {
namespace {

namespace fs = std::filesystem;
using instrumentation::RecordReader;

constexpr char kManifest[] = R"(name: slurm-run
seed: 3
server:
  rounds: 2
  round_deadline_s: 60
  selection: {min_fit_clients: 3, min_available_clients: 3}
  evaluation: {every: 0}
training: {model: "synthetic:20000:30"}
emulation: {backend: userspace, virtual_clients: false}
launcher: {kind: slurm, partition: debug, time: "10:00"}
clients:
  - name: wifi
    count: 2
    link: wifi
    processes_per_node: 1
  - name: cell
    device: rpi4
    link: 5g-sa
)";

std::string Edit(std::string text, const std::string& from, const std::string& to) {
  text.replace(text.find(from), from.size(), to);
  return text;
}

std::string Slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct RunOutput {
  int code = -1;
  std::string out;  // stdout and stderr
};

fl::sys::SpawnOptions Command(const std::vector<std::string>& args, const fs::path& log,
                              std::vector<std::string> env = {}) {
  fl::sys::SpawnOptions o;
  o.argv = {FL_EXPERIMENT_BIN};
  o.argv.insert(o.argv.end(), args.begin(), args.end());
  o.env = std::move(env);
  o.stdout_to = fl::sys::Stdio::File(log.string(), false);
  o.stderr_to = fl::sys::Stdio::ToStdout();
  return o;
}

RunOutput Experiment(const std::vector<std::string>& args, const fs::path& log, std::vector<std::string> env = {}) {
  RunOutput r;
  absl::StatusOr<fl::sys::Child> c = fl::sys::Child::Spawn(Command(args, log, std::move(env)));
  if (!c.ok()) {
    r.out = std::string(c.status().message());
    return r;
  }
  r.code = c->Wait().code;
  r.out = Slurp(log);
  return r;
}

class SlurmRunTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // Two "sites": each node in its own network namespace with its own address, as nodes of a real cluster are
    // (on one host without --sites every NodeAddr is 127.0.0.1, which the server step refuses across nodes).
    cluster_ =
        fl::testing::LocalSlurm::Start(std::string(FL_SOURCE_DIR) + "/tools/local-slurm.sh", /*sites=*/true).release();
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(cluster_->started().ok()) << cluster_->started(); }

  // Writes `text` as <dir>/m.yaml and runs it with --launcher `launcher` into <dir>/<out>.
  RunOutput RunManifest(const fl::testing::ScratchDir& dir, const std::string& text, const std::string& launcher,
                        const std::string& out, std::vector<std::string> env = {}) {
    std::ofstream(dir.path() / "m.yaml") << text;
    return Experiment({"run", (dir.path() / "m.yaml").string(), "--launcher", launcher, "--profiles-dir",
                       std::string(FL_EXPERIMENTS_DIR) + "/profiles", "--out", (dir.path() / out).string()},
                      dir.path() / fl::StrCat(out, ".log"), std::move(env));
  }

  static fl::testing::LocalSlurm* cluster_;
};
fl::testing::LocalSlurm* SlurmRunTest::cluster_ = nullptr;

// The experiment id in a run's last lines: "experiment <id> <status> ...".
std::string ExperimentId(const std::string& out) {
  const size_t at = out.rfind("\nexperiment ");
  if (at == std::string::npos) return "";
  std::istringstream words(out.substr(at + 12));
  std::string id;
  words >> id;
  return id;
}

// The records' structure: per committed round, each client with its outcome and which phases it recorded.
std::string Structure(const fs::path& db, const std::string& id) {
  absl::StatusOr<std::unique_ptr<RecordReader>> reader = RecordReader::Open(db.string());
  if (!reader.ok()) return std::string(reader.status().message());
  absl::StatusOr<instrumentation::ExperimentRecord> e = (*reader)->GetExperiment(id);
  if (!e.ok()) return std::string(e.status().message());
  std::string s = fl::StrCat("status ", instrumentation::ExperimentStatusName(e->status), "\n");
  absl::StatusOr<std::vector<instrumentation::RoundRecord>> rounds = (*reader)->ListRounds(id);
  if (!rounds.ok()) return std::string(rounds.status().message());
  for (const instrumentation::RoundRecord& r : *rounds) {
    s += fl::StrCat("round ", r.round, " attempt ", r.attempt, "\n");
    absl::StatusOr<std::vector<instrumentation::ClientRoundRecord>> clients = (*reader)->ListClientRounds(id, r.round);
    if (!clients.ok()) return std::string(clients.status().message());
    std::set<std::string> lines;
    for (const instrumentation::ClientRoundRecord& c : *clients) {
      lines.insert(fl::StrCat("  ", c.client_id, " outcome ", static_cast<int>(c.outcome), " downlink ",
                              c.downlink_ms.has_value(), " train ", c.train_ms.has_value(), " uplink ",
                              c.uplink_ms.has_value(), " examples ", c.num_examples.value_or(-1), "\n"));
    }
    for (const std::string& l : lines) s += l;
  }
  return s;
}

TEST_F(SlurmRunTest, SmallManifestFinishesWithTheSameRecordsAsLocally) {
  fl::testing::ScratchDir dir("slurm-same");
  const RunOutput local = RunManifest(dir, kManifest, "local", "local");
  ASSERT_EQ(local.code, 0) << local.out;
  const RunOutput slurm = RunManifest(dir, kManifest, "slurm", "slurm");
  ASSERT_EQ(slurm.code, 0) << slurm.out;
  EXPECT_NE(slurm.out.find("submitted Slurm job"), std::string::npos) << slurm.out;
  const std::string id = ExperimentId(slurm.out);
  ASSERT_TRUE(id.starts_with("slurm-run-slurm-")) << slurm.out;
  const std::string want = Structure(dir.path() / "local" / "records.db", ExperimentId(local.out));
  EXPECT_NE(want.find("status finished"), std::string::npos) << want;
  EXPECT_NE(want.find("round 2"), std::string::npos) << want;
  EXPECT_EQ(Structure(dir.path() / "slurm" / "records.db", id), want);
  // Logs, the CA and the records where a local run puts them; wifi's two processes on the two nodes.
  for (const char* f : {"server.log", "wifi-0.log", "wifi-1.log", "cell-0.log", "pki/ca/ca.crt", "slurm-job.sh"}) {
    EXPECT_TRUE(fs::exists(dir.path() / "slurm" / f)) << f;
  }
}

// A group of virtual clients split by instances_per_process: its two one-instance processes are the two tasks of
// its step, one per node, and the records are those of the same manifest run locally (clients wifi-0, wifi-1).
TEST_F(SlurmRunTest, ASplitGroupOfVirtualClientsSpreadsOverTheNodes) {
  fl::testing::ScratchDir dir("slurm-split");
  const std::string text = Edit(Edit(kManifest, "virtual_clients: false", "virtual_clients: true"), "count: 2",
                                "count: 2\n    instances_per_process: 1");
  const RunOutput local = RunManifest(dir, text, "local", "local");
  ASSERT_EQ(local.code, 0) << local.out;
  const RunOutput slurm = RunManifest(dir, text, "slurm", "slurm");
  ASSERT_EQ(slurm.code, 0) << slurm.out;
  const std::string want = Structure(dir.path() / "local" / "records.db", ExperimentId(local.out));
  EXPECT_NE(want.find("wifi-1"), std::string::npos) << want;
  EXPECT_EQ(Structure(dir.path() / "slurm" / "records.db", ExperimentId(slurm.out)), want);
  for (const char* f : {"wifi-instances-0.log", "wifi-instances-1.log"}) {
    EXPECT_TRUE(fs::exists(dir.path() / "slurm" / f)) << f;
  }
  EXPECT_NE(Slurp(dir.path() / "slurm" / "slurm-job.sh").find("--job-name=clients-wifi --ntasks=2 --nodes=2"),
            std::string::npos)
      << Slurp(dir.path() / "slurm" / "slurm-job.sh");
}

// The manifest with 12 rounds of a 2 s training (about 25 s at least): long enough to outlast a kill after round 1,
// short enough to resume to its end.
std::string LongManifest() {
  return Edit(Edit(kManifest, "rounds: 2", "rounds: 12"), "synthetic:20000:30", "synthetic:20000:2000");
}

// Starts LongManifest() under fl-experiment run in <dir>/out, its output in <dir>/run.log, and waits until a round
// is committed while the wifi group's step runs: {job id, that step's id}.
struct LongRun {
  absl::StatusOr<fl::sys::Child> child = absl::UnknownError("not started");
  std::string job;
  std::string wifi_step;
};
LongRun StartLongRun(const fl::testing::ScratchDir& dir) {
  std::ofstream(dir.path() / "m.yaml") << LongManifest();
  const fs::path out = dir.path() / "out";
  LongRun r;
  r.child = fl::sys::Child::Spawn(Command({"run", (dir.path() / "m.yaml").string(), "--profiles-dir",
                                           std::string(FL_EXPERIMENTS_DIR) + "/profiles", "--out", out.string()},
                                          dir.path() / "run.log"));
  if (!r.child.ok()) return r;
  for (int i = 0; i < 1200 && r.wifi_step.empty() && !r.child->exited(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const std::string job = Slurp(dir.path() / "run.log");
    const size_t at = job.find("submitted Slurm job ");
    if (at == std::string::npos) continue;
    std::istringstream words(job.substr(at + 20));
    words >> r.job;
    absl::StatusOr<std::unique_ptr<RecordReader>> reader = RecordReader::Open((out / "records.db").string());
    if (!reader.ok()) continue;
    absl::StatusOr<int64_t> rounds = (*reader)->CountRounds(fl::StrCat("slurm-run-slurm-", r.job));
    if (!rounds.ok() || *rounds < 1) continue;
    absl::StatusOr<std::string> steps = fl::sys::RunCommand({"squeue", "-s", "-h", "-j", r.job, "-o", "%i %j"});
    if (!steps.ok()) continue;
    std::istringstream lines(*steps);
    for (std::string id, name; lines >> id >> name;) {
      if (name == "clients-wifi") r.wifi_step = id;
    }
  }
  return r;
}

// The experiment `text` names (its last "experiment <id> ..." line) as the records hold it: status, rounds.
std::pair<std::string, int64_t> Recorded(const fs::path& db, const std::string& text) {
  absl::StatusOr<std::unique_ptr<RecordReader>> reader = RecordReader::Open(db.string());
  if (!reader.ok()) return {std::string(reader.status().message()), 0};
  absl::StatusOr<instrumentation::ExperimentRecord> e = (*reader)->GetExperiment(ExperimentId(text));
  if (!e.ok()) return {std::string(e.status().message()), 0};
  absl::StatusOr<int64_t> rounds = (*reader)->CountRounds(ExperimentId(text));
  return {std::string(instrumentation::ExperimentStatusName(e->status)), rounds.ok() ? *rounds : 0};
}

TEST_F(SlurmRunTest, KilledClientStepIsNamedAndTheRecordsStayIntact) {
  fl::testing::ScratchDir dir("slurm-kill");
  LongRun run = StartLongRun(dir);
  ASSERT_TRUE(run.child.ok()) << run.child.status();
  ASSERT_FALSE(run.wifi_step.empty()) << "the wifi step never ran with a committed round: "
                                      << Slurp(dir.path() / "run.log");
  // Killed as a lost node would be.
  ASSERT_TRUE(fl::sys::RunCommand({"scancel", "--signal=KILL", run.wifi_step}).ok());
  const int code = run.child->Wait().code;
  const std::string text = Slurp(dir.path() / "run.log");
  EXPECT_EQ(code, 1) << text;
  EXPECT_NE(text.find("step clients-wifi failed"), std::string::npos) << text;
  // fl-server was stopped, not killed: it recorded the experiment aborted, its committed rounds kept (what
  // fl-server --resume continues from).
  const auto [status, rounds] = Recorded(dir.path() / "out" / "records.db", text);
  EXPECT_EQ(status, "aborted") << text;
  EXPECT_GE(rounds, 1);

  // fl-experiment run --resume through Slurm continues it to its last round: the same experiment, each of its 12
  // rounds committed once (the resumed job started after the last committed one).
  const RunOutput resumed =
      Experiment({"run", (dir.path() / "m.yaml").string(), "--profiles-dir",
                  std::string(FL_EXPERIMENTS_DIR) + "/profiles", "--out", (dir.path() / "out").string(), "--resume"},
                 dir.path() / "resume.log");
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  EXPECT_EQ(ExperimentId(resumed.out), ExperimentId(text)) << resumed.out;
  EXPECT_NE(resumed.out.find("resuming experiment " + ExperimentId(text)), std::string::npos) << resumed.out;
  EXPECT_EQ(Recorded(dir.path() / "out" / "records.db", resumed.out).first, "finished") << resumed.out;
  absl::StatusOr<std::unique_ptr<RecordReader>> reader =
      RecordReader::Open((dir.path() / "out" / "records.db").string());
  ASSERT_TRUE(reader.ok()) << reader.status();
  absl::StatusOr<std::vector<instrumentation::RoundRecord>> all = (*reader)->ListRounds(ExperimentId(text));
  ASSERT_TRUE(all.ok()) << all.status();
  std::vector<int64_t> committed;
  for (const instrumentation::RoundRecord& r : *all) {
    if (r.status == instrumentation::RoundStatus::kCommitted) committed.push_back(r.round);
  }
  std::vector<int64_t> expected;
  for (int64_t round = 1; round <= 12; ++round) expected.push_back(round);
  EXPECT_EQ(committed, expected);  // ListRounds: by (round, attempt)
}

// Ctrl-C on fl-experiment cancels the job (scancel): every step stops, the experiment is recorded aborted.
TEST_F(SlurmRunTest, InterruptCancelsTheJob) {
  fl::testing::ScratchDir dir("slurm-int");
  LongRun run = StartLongRun(dir);
  ASSERT_TRUE(run.child.ok()) << run.child.status();
  ASSERT_FALSE(run.wifi_step.empty()) << Slurp(dir.path() / "run.log");
  ASSERT_TRUE(run.child->Signal(SIGINT).ok());
  const int code = run.child->Wait().code;
  const std::string text = Slurp(dir.path() / "run.log");
  EXPECT_EQ(code, 1) << text;
  EXPECT_NE(text.find(", cancelled)"), std::string::npos) << text;
  EXPECT_EQ(Recorded(dir.path() / "out" / "records.db", text).first, "aborted") << text;
  absl::StatusOr<std::string> left = fl::sys::RunCommand({"squeue", "-h", "-t", "R", "-j", run.job});
  EXPECT_TRUE(!left.ok() || left->empty()) << *left;
}

TEST_F(SlurmRunTest, BadInputIsRefusedBeforeSubmissionNamingWhatAndWhere) {
  fl::testing::ScratchDir dir("slurm-bad");
  RunOutput r = RunManifest(dir, Edit(kManifest, "partition: debug", "partition: nope"), "slurm", "a");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("launcher.partition \"nope\" does not exist on this cluster; it has: debug (default)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("m.yaml"), std::string::npos) << r.out;

  r = RunManifest(dir, Edit(kManifest, "partition: debug", "nodes: 3"), "slurm", "b");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("asks for 3 nodes (launcher.nodes) but partition debug has 2"), std::string::npos) << r.out;

  // A controller that does not answer: the cluster's configuration with a port where nothing listens.
  std::string conf = Slurp(cluster_->slurm_conf());
  const size_t at = conf.find("SlurmctldPort=");
  conf.replace(at, conf.find('\n', at) - at, "SlurmctldPort=1");
  std::ofstream(dir.path() / "dead.conf") << conf;
  r = RunManifest(dir, kManifest, "slurm", "c", {fl::StrCat("SLURM_CONF=", (dir.path() / "dead.conf").string())});
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("the Slurm controller does not answer"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("dead.conf"), std::string::npos) << r.out;

  // No Slurm on the machine: no sbatch on PATH.
  r = RunManifest(dir, kManifest, "slurm", "d", {"PATH=/nonexistent"});
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("no Slurm on this machine: sbatch is not installed"), std::string::npos) << r.out;
}

// On a cluster whose nodes' NodeAddr is loopback (one host, no --sites), a job over two nodes would have the client
// steps dial themselves: the server step refuses, naming itself, its node and the address; fl-experiment names the
// failed step.
TEST(SlurmLoopbackTest, AServerStepAdvertisingLoopbackAcrossNodesIsRefused) {
  std::unique_ptr<fl::testing::LocalSlurm> cluster =
      fl::testing::LocalSlurm::Start(std::string(FL_SOURCE_DIR) + "/tools/local-slurm.sh", /*sites=*/false);
  ASSERT_TRUE(cluster->started().ok()) << cluster->started();
  fl::testing::ScratchDir dir("slurm-loopback");
  std::ofstream(dir.path() / "m.yaml") << kManifest;  // wifi: 2 processes at 1 per node, so 2 nodes
  const RunOutput r =
      Experiment({"run", (dir.path() / "m.yaml").string(), "--launcher", "slurm", "--profiles-dir",
                  std::string(FL_EXPERIMENTS_DIR) + "/profiles", "--out", (dir.path() / "out").string()},
                 dir.path() / "run.log");
  EXPECT_NE(r.code, 0) << r.out;
  const std::string job_out = [&] {
    std::string all = r.out;
    for (const auto& e : fs::directory_iterator(dir.path() / "out")) {
      if (e.path().filename().string().starts_with("slurm-") && e.path().extension() == ".out") all += Slurp(e.path());
    }
    return all;
  }();
  EXPECT_NE(job_out.find("the server step on node n1 advertises 127.0.0.1, a loopback address"), std::string::npos)
      << job_out;
}

}  // namespace
}  // namespace fl::experiment
