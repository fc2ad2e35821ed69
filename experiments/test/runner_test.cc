// fl-experiment's runner end to end: the real fl-server and fl-client binaries (synthetic model, so it is
// quick), clients behind userspace-emulated WiFi and 5G links, the manifest recorded, replay, Ctrl-C, and a
// client that fails.
#include "fl/experiment/runner.h"

#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <thread>

#include "fl/core/str_cat.h"
#include "fl/instrumentation/record_reader.h"
#include "fl/sys/process.h"
#include "fl/testing/scratch_dir.h"

namespace fl::experiment {
namespace {

namespace fs = std::filesystem;
using instrumentation::RecordReader;

constexpr char kManifest[] = R"(name: runner-test
seed: 3
server:
  rounds: 2
  round_deadline_s: 60
  selection: {min_fit_clients: 3, min_available_clients: 3}
  evaluation: {every: 0}
training: {model: "synthetic:20000:30"}
emulation: {backend: userspace}
clients:
  - name: wifi
    count: 2
    link: wifi
  - name: cell
    device: rpi4
    link: 5g-sa
)";

absl::StatusOr<Manifest> Load(const fl::testing::ScratchDir& dir, const std::string& text) {
  const std::string path = dir.File("m.yaml");
  std::ofstream(path) << text;
  return LoadManifest(path, ManifestOptions{fs::path(FL_EXPERIMENTS_DIR) / "profiles"});
}

RunOptions Options(const fl::testing::ScratchDir& dir, const std::string& sub) {
  RunOptions o;
  o.db_path = dir.File("records.db");
  o.out_dir = dir.File(sub);
  o.server_bin = FL_SERVER_BIN;
  o.client_bin = FL_CLIENT_BIN;
  o.software_version = "test";
  o.quiet = true;
  return o;
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// fl-server / fl-client processes whose command line mentions `needle` (our scratch dir): none may be left.
int ProcessesMentioning(const std::string& needle) {
  int n = 0;
  DIR* proc = opendir("/proc");
  while (dirent* e = readdir(proc)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::ifstream in(fl::StrCat("/proc/", e->d_name, "/cmdline"));
    std::string cmd((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (cmd.find(needle) != std::string::npos && cmd.find("fl-") != std::string::npos) ++n;
  }
  closedir(proc);
  return n;
}

TEST(RunnerTest, RunsRecordsTheManifestAndReplays) {
  fl::testing::ScratchDir dir("fl_runner");
  absl::StatusOr<Manifest> m = Load(dir, kManifest);
  ASSERT_TRUE(m.ok()) << m.status();
  absl::StatusOr<RunResult> r = RunExperiment(*m, Options(dir, "run"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, "finished") << r->reason;
  EXPECT_EQ(r->backend, "userspace");
  // Mutual TLS by default, with a throwaway CA in the run's folder: a certificate per client. fl-server starts
  // only with the TLS flags or --insecure, and --insecure would have put its warning into the log.
  EXPECT_EQ(r->security, "mtls");
  EXPECT_EQ(r->pki_dir, dir.File("run") + "/pki");
  for (const char* file :
       {"ca/ca.crt", "server/server.crt", "clients/wifi-0.crt", "clients/wifi-1.key", "clients/cell-0.crt"}) {
    EXPECT_TRUE(fs::exists(fs::path(r->pki_dir) / file)) << file;
  }
  EXPECT_EQ(ReadText(dir.File("run/server.log")).find("--insecure"), std::string::npos)
      << ReadText(dir.File("run/server.log"));

  auto reader = RecordReader::Open(dir.File("records.db"));
  ASSERT_TRUE(reader.ok()) << reader.status();
  auto clients = (*reader)->ListClients(r->experiment_id);
  ASSERT_TRUE(clients.ok());
  ASSERT_EQ(clients->size(), 3u);
  std::map<std::string, std::string> kinds;
  for (const auto& c : *clients) kinds[c.client_name] = c.link_kind + "/" + c.link_profile + "/" + c.device_class;
  EXPECT_EQ(kinds["wifi-0"], "wifi/wifi/" + kinds["wifi-0"].substr(kinds["wifi-0"].rfind('/') + 1));
  EXPECT_EQ(kinds["cell-0"], "5g/5g-sa/rpi4");
  auto rounds = (*reader)->ListRounds(r->experiment_id);
  ASSERT_TRUE(rounds.ok());
  EXPECT_EQ(rounds->size(), 2u);

  absl::StatusOr<RecordedManifest> rec = ReadRecordedManifest(dir.File("records.db"), r->experiment_id);
  ASSERT_TRUE(rec.ok()) << rec.status();
  EXPECT_EQ(rec->manifest_yaml, kManifest);
  EXPECT_EQ(rec->seed, 3u);
  EXPECT_EQ(rec->backend, "userspace");
  EXPECT_EQ(rec->software_version, "test");
  EXPECT_NE(rec->resolved_json.find("\"mode\": \"mtls\""), std::string::npos) << rec->resolved_json;

  // Replay from the record alone: the manifest file is gone.
  fs::remove(dir.File("m.yaml"));
  absl::StatusOr<Manifest> again = ManifestFromResolvedJson(rec->resolved_json, rec->manifest_yaml);
  ASSERT_TRUE(again.ok()) << again.status();
  RunOptions ro = Options(dir, "replay");
  ro.replay_of = r->experiment_id;
  absl::StatusOr<RunResult> replay = RunExperiment(*again, ro);
  ASSERT_TRUE(replay.ok()) << replay.status();
  EXPECT_EQ(replay->status, "finished") << replay->reason;
  EXPECT_NE(replay->experiment_id, r->experiment_id);
  EXPECT_EQ(replay->security, "mtls");  // the replay's own throwaway CA
  EXPECT_EQ(replay->pki_dir, dir.File("replay") + "/pki");
  absl::StatusOr<std::string> cmp = CompareExperiments(dir.File("records.db"), r->experiment_id, replay->experiment_id);
  ASSERT_TRUE(cmp.ok()) << cmp.status();
  EXPECT_NE(cmp->find(r->experiment_id), std::string::npos);
  EXPECT_NE(cmp->find("client uplink_ms"), std::string::npos);
  auto replay_of = (*reader)->QueryText(
      fl::StrCat("SELECT replay_of FROM experiment_manifests WHERE experiment_id = '", replay->experiment_id, "'"));
  ASSERT_TRUE(replay_of.ok()) << replay_of.status();
  EXPECT_EQ(*replay_of, r->experiment_id);
  EXPECT_EQ(ProcessesMentioning(dir.path()), 0);
}

// The kernel backend end to end: each client in its own network namespace behind HTB shaping (and the
// userspace delay line where the kernel has no netem); every namespace is gone afterwards.
TEST(RunnerTest, KernelBackendRunsClientsInNamespacesAndRemovesThem) {
  if (geteuid() != 0) GTEST_SKIP() << "the kernel link backend needs root (network namespaces, tc)";
  fl::testing::ScratchDir dir("fl_runner");
  std::string text = kManifest;
  text.replace(text.find("backend: userspace"), 18, "backend: kernel");
  absl::StatusOr<Manifest> m = Load(dir, text);
  ASSERT_TRUE(m.ok()) << m.status();
  absl::StatusOr<RunResult> r = RunExperiment(*m, Options(dir, "run"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, "finished") << r->reason;
  EXPECT_EQ(r->backend, "kernel");
  auto reader = RecordReader::Open(dir.File("records.db"));
  ASSERT_TRUE(reader.ok());
  auto clients = (*reader)->ListClients(r->experiment_id);
  ASSERT_TRUE(clients.ok());
  EXPECT_EQ(clients->size(), 3u);
  // Namespaces of this process (fle_<pid>_<n>) are all removed.
  absl::StatusOr<std::string> netns = fl::sys::RunCommand({"ip", "netns", "list"});
  ASSERT_TRUE(netns.ok()) << netns.status();
  EXPECT_EQ(netns->find(fl::StrCat("fle_", getpid(), "_")), std::string::npos) << *netns;
  EXPECT_EQ(ProcessesMentioning(dir.path()), 0);
}

// `security: {mode: insecure}` opts out: plaintext on both ends, each saying so in its log, no certificates.
TEST(RunnerTest, InsecureModeRunsPlaintextAndRecordsIt) {
  fl::testing::ScratchDir dir("fl_runner");
  std::string text = kManifest;
  text.replace(text.find("emulation:"), 0, "security: {mode: insecure}\n");
  absl::StatusOr<Manifest> m = Load(dir, text);
  ASSERT_TRUE(m.ok()) << m.status();
  absl::StatusOr<RunResult> r = RunExperiment(*m, Options(dir, "run"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, "finished") << r->reason;
  EXPECT_EQ(r->security, "insecure");
  EXPECT_EQ(r->pki_dir, "");
  EXPECT_FALSE(fs::exists(dir.File("run/pki")));
  EXPECT_NE(ReadText(dir.File("run/server.log")).find("--insecure: serving plaintext gRPC"), std::string::npos)
      << ReadText(dir.File("run/server.log"));
  EXPECT_NE(ReadText(dir.File("run/cell-0.log")).find("--insecure: connecting to"), std::string::npos)
      << ReadText(dir.File("run/cell-0.log"));
  absl::StatusOr<RecordedManifest> rec = ReadRecordedManifest(dir.File("records.db"), r->experiment_id);
  ASSERT_TRUE(rec.ok()) << rec.status();
  absl::StatusOr<Manifest> again = ManifestFromResolvedJson(rec->resolved_json, rec->manifest_yaml);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->security.mode, "insecure");  // a replay runs as the original did
  EXPECT_EQ(ProcessesMentioning(dir.path()), 0);
}

// server.aggregation: buffered reaches fl-server as its flags: the run is FedBuff (aggregation steps with staleness).
TEST(RunnerTest, ABufferedManifestRunsAggregationSteps) {
  fl::testing::ScratchDir dir("fl_runner");
  std::string text = kManifest;
  text.replace(text.find("emulation:"), 0, "security: {mode: insecure}\n");
  text.replace(text.find("  round_deadline_s: 60\n"), 0,
               "  aggregation: buffered\n  buffered: {buffer_size: 2, concurrency: 3, max_staleness: 5}\n");
  absl::StatusOr<Manifest> m = Load(dir, text);
  ASSERT_TRUE(m.ok()) << m.status();
  absl::StatusOr<RunResult> r = RunExperiment(*m, Options(dir, "run"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, "finished") << r->reason;
  auto reader = RecordReader::Open(dir.File("records.db"));
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ(*(*reader)->QueryText("SELECT aggregation FROM experiments"), "buffered");
  EXPECT_EQ(*(*reader)->QueryInt("SELECT count(*) FROM rounds WHERE status = 'committed'"), 2);
  EXPECT_EQ(*(*reader)->QueryInt("SELECT count(*) FROM client_rounds WHERE outcome = 'ok' AND staleness IS NULL"), 0);
  EXPECT_GE(*(*reader)->QueryInt("SELECT count(*) FROM client_rounds WHERE outcome = 'ok'"), 4);
  EXPECT_EQ(ProcessesMentioning(dir.path()), 0);
}

// A group with count runs as one fl-client --instances process (virtual clients), each instance with its own
// certificate and its own relay; `virtual_clients: false` goes back to one process per client.
TEST(RunnerTest, AGroupRunsAsOneProcessOfVirtualClientsUnderTheirOwnNames) {
  fl::testing::ScratchDir dir("fl_runner");
  std::string text = kManifest;
  text.replace(text.find("count: 2"), 8, "count: 6");
  text.replace(text.find("min_fit_clients: 3, min_available_clients: 3"), 44,
               "min_fit_clients: 7, min_available_clients: 7");
  absl::StatusOr<Manifest> m = Load(dir, text);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(m->emulation.virtual_clients);
  absl::StatusOr<RunResult> r = RunExperiment(*m, Options(dir, "run"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, "finished") << r->reason;
  EXPECT_TRUE(fs::exists(dir.File("run/wifi-instances.log")));
  EXPECT_FALSE(fs::exists(dir.File("run/wifi-0.log")));
  EXPECT_TRUE(fs::exists(dir.File("run/cell-0.log")));  // a group of one stays one plain client
  auto reader = RecordReader::Open(dir.File("records.db"));
  ASSERT_TRUE(reader.ok()) << reader.status();
  auto clients = (*reader)->ListClients(r->experiment_id);
  ASSERT_TRUE(clients.ok());
  std::set<std::string> names;
  for (const auto& c : *clients) {
    names.insert(c.client_name);
    if (c.client_name.starts_with("wifi-")) {
      EXPECT_EQ(c.link_profile, "wifi") << c.client_name;
    }
  }
  EXPECT_EQ(names, (std::set<std::string>{"wifi-0", "wifi-1", "wifi-2", "wifi-3", "wifi-4", "wifi-5", "cell-0"}));
  EXPECT_EQ(ProcessesMentioning(dir.path()), 0);

  text.replace(text.find("emulation: {backend: userspace}"), 31,
               "emulation: {backend: userspace, virtual_clients: false}");
  absl::StatusOr<Manifest> per_process = Load(dir, text);
  ASSERT_TRUE(per_process.ok()) << per_process.status();
  absl::StatusOr<RunResult> r2 = RunExperiment(*per_process, Options(dir, "run2"));
  ASSERT_TRUE(r2.ok()) << r2.status();
  EXPECT_EQ(r2->status, "finished") << r2->reason;
  EXPECT_TRUE(fs::exists(dir.File("run2/wifi-5.log")));
  EXPECT_FALSE(fs::exists(dir.File("run2/wifi-instances.log")));
  EXPECT_EQ(ProcessesMentioning(dir.path()), 0);
}

// availability.period_s/online: the group's instances follow a diurnal schedule seeded by the manifest's seed
// (fl-client --availability); without virtual clients the run is refused before anything starts.
TEST(RunnerTest, ADiurnalGroupRunsAsVirtualClientsAndIsRefusedWithoutThem) {
  fl::testing::ScratchDir dir("fl_runner");
  std::string text = kManifest;
  text.replace(text.find("count: 2"), 8, "count: 6\n    availability: {period_s: 2, online: 0.5}");
  text.replace(text.find("min_fit_clients: 3, min_available_clients: 3"), 44,
               "min_fit_clients: 2, min_available_clients: 2");
  absl::StatusOr<Manifest> m = Load(dir, text);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->clients[0].period_s, 2);
  EXPECT_EQ(m->clients[0].online_fraction, 0.5);
  absl::StatusOr<RunResult> r = RunExperiment(*m, Options(dir, "run"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, "finished") << r->reason;
  EXPECT_TRUE(fs::exists(dir.File("run/wifi-instances.log")));
  EXPECT_EQ(ProcessesMentioning(dir.path()), 0);

  text.replace(text.find("emulation: {backend: userspace}"), 31,
               "emulation: {backend: userspace, virtual_clients: false}");
  absl::StatusOr<Manifest> per_process = Load(dir, text);
  ASSERT_TRUE(per_process.ok()) << per_process.status();
  absl::StatusOr<RunResult> refused = RunExperiment(*per_process, Options(dir, "run2"));
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_NE(refused.status().message().find("clients group wifi: availability.period_s needs virtual clients"),
            std::string::npos)
      << refused.status();
  EXPECT_FALSE(fs::exists(dir.File("run2/server.log")));
}

// availability.trace: each named instance is online in its trace's windows only (fl-client --availability
// trace:FILE, the path resolved against the manifest's folder); one whose only window lies after the experiment
// never joins, one the trace does not name is always online. A trace and a diurnal model together, or a missing
// file, are refused at load naming the field.
TEST(RunnerTest, ATraceGroupFollowsItsTraceAndBadTracesAreRefused) {
  fl::testing::ScratchDir dir("fl_runner");
  std::ofstream(dir.File("fleet.trace")) << "# name from_s until_s\n"
                                            "wifi-0 0 inf\n"
                                            "wifi-1 0 inf\n"
                                            "wifi-2 3600 7200   # an hour from now: never during this run\n";
  std::string text = kManifest;
  text.replace(text.find("count: 2"), 8, "count: 4\n    availability: {trace: fleet.trace}");
  absl::StatusOr<Manifest> m = Load(dir, text);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->clients[0].availability_trace, fs::path(dir.File("fleet.trace")).lexically_normal().string());
  absl::StatusOr<RunResult> r = RunExperiment(*m, Options(dir, "run"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, "finished") << r->reason;
  auto reader = RecordReader::Open(dir.File("records.db"));
  ASSERT_TRUE(reader.ok()) << reader.status();
  auto clients = (*reader)->ListClients(r->experiment_id);
  ASSERT_TRUE(clients.ok());
  std::set<std::string> names;
  for (const auto& c : *clients) names.insert(c.client_name);
  EXPECT_EQ(names, (std::set<std::string>{"wifi-0", "wifi-1", "wifi-3", "cell-0"}));
  EXPECT_EQ(ProcessesMentioning(dir.path()), 0);

  std::string both = kManifest;
  both.replace(both.find("count: 2"), 8, "count: 2\n    availability: {period_s: 2, online: 0.5, trace: fleet.trace}");
  absl::StatusOr<Manifest> refused = Load(dir, both);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("either a diurnal model (period_s) or a trace, not both"),
            std::string::npos)
      << refused.status();
  std::string missing = kManifest;
  missing.replace(missing.find("count: 2"), 8, "count: 2\n    availability: {trace: nowhere.trace}");
  refused = Load(dir, missing);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("nowhere.trace\" not found"), std::string::npos) << refused.status();
}

// Link-aware compression end to end with real processes: the manifest's server.uplink_codec_policy reaches
// fl-server, each fl-client encodes with the codec its task names, and every update is recorded in its link's
// codec (5G int4, WiFi int8).
TEST(RunnerTest, ALinkAwareCodecPolicyGivesEachLinkItsCodec) {
  fl::testing::ScratchDir dir("fl_runner");
  std::string text = kManifest;
  text.replace(text.find("  evaluation: {every: 0}"), 24,
               "  evaluation: {every: 0}\n  uplink_codec_policy: \"by-link:5g=int4,wifi=int8,default=fp32\"");
  absl::StatusOr<Manifest> m = Load(dir, text);
  ASSERT_TRUE(m.ok()) << m.status();
  absl::StatusOr<RunResult> r = RunExperiment(*m, Options(dir, "run"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, "finished") << r->reason;
  auto reader = RecordReader::Open(dir.File("records.db"));
  ASSERT_TRUE(reader.ok()) << reader.status();
  auto clients = (*reader)->ListClients(r->experiment_id);
  ASSERT_TRUE(clients.ok());
  std::map<std::string, std::string> name_of;
  for (const auto& c : *clients) name_of[c.client_id] = c.client_name;
  for (int64_t round = 1; round <= 2; ++round) {
    auto rows = (*reader)->ListClientRounds(r->experiment_id, round);
    ASSERT_TRUE(rows.ok()) << rows.status();
    std::map<std::string, std::string> codecs;
    for (const auto& row : *rows) {
      if (row.outcome == instrumentation::ClientOutcome::kOk) codecs[name_of[row.client_id]] = row.codec;
    }
    EXPECT_EQ(codecs, (std::map<std::string, std::string>{{"wifi-0", "int8"}, {"wifi-1", "int8"}, {"cell-0", "int4"}}))
        << "round " << round;
  }
  EXPECT_EQ(ProcessesMentioning(dir.path()), 0);
}

TEST(RunnerTest, InterruptStopsEverythingAndRecordsAborted) {
  fl::testing::ScratchDir dir("fl_runner");
  // Rounds that cannot finish soon: 50 rounds of a 2 s training.
  std::string text = kManifest;
  text.replace(text.find("rounds: 2"), 9, "rounds: 50");
  text.replace(text.find("synthetic:20000:30"), 18, "synthetic:20000:2000");
  absl::StatusOr<Manifest> m = Load(dir, text);
  ASSERT_TRUE(m.ok()) << m.status();
  std::atomic<bool> interrupted{false};
  RunOptions o = Options(dir, "run");
  o.interrupted = &interrupted;
  std::thread ctrl_c([&] {
    std::this_thread::sleep_for(std::chrono::seconds(4));
    interrupted = true;
  });
  absl::StatusOr<RunResult> r = RunExperiment(*m, o);
  ctrl_c.join();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, "aborted");
  auto reader = RecordReader::Open(dir.File("records.db"));
  ASSERT_TRUE(reader.ok());
  auto exp = (*reader)->GetExperiment(r->experiment_id);
  ASSERT_TRUE(exp.ok()) << exp.status();
  EXPECT_EQ(instrumentation::ExperimentStatusName(exp->status), "aborted");  // the server closed its records
  EXPECT_EQ(ProcessesMentioning(dir.path()), 0);
}

TEST(RunnerTest, AFailingClientStopsTheExperimentNamingIt) {
  fl::testing::ScratchDir dir("fl_runner");
  std::string text = kManifest;
  // A dataset folder that does not exist: fl-client exits with an error at start.
  const std::string training = "training: {model: \"synthetic:20000:30\"}";
  text.replace(text.find(training), training.size(), "training: {model: cnn, data_dir: /nonexistent/fmnist}");
  absl::StatusOr<Manifest> m = Load(dir, text);
  ASSERT_TRUE(m.ok()) << m.status();
  absl::StatusOr<RunResult> r = RunExperiment(*m, Options(dir, "run"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, "failed") << r->reason;
  EXPECT_NE(r->reason.find("client "), std::string::npos) << r->reason;
  EXPECT_NE(r->reason.find(".log"), std::string::npos) << r->reason;
  EXPECT_EQ(ProcessesMentioning(dir.path()), 0);
}

}  // namespace
}  // namespace fl::experiment
