// fl-experiment's runner end to end: the real fl-server and fl-client binaries (synthetic model, so it is
// quick), clients behind userspace-emulated WiFi and 5G links, the manifest recorded, replay, Ctrl-C, and a
// client that fails.
#include "fl/experiment/runner.h"

#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "fl/core/str_cat.h"
#include "fl/emulation/tun_device.h"
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

// `text` with its first `from` replaced by `to`: how each test makes its variant of kManifest.
std::string Edit(std::string text, std::string_view from, std::string_view to) {
  text.replace(text.find(from), from.size(), to);
  return text;
}

// kManifest with the wifi group's `count: 2` line replaced by `group` and `min_clients` for selection.
std::string WifiGroup(std::string_view group, int min_clients) {
  return Edit(Edit(kManifest, "count: 2", group), "min_fit_clients: 3, min_available_clients: 3",
              fl::StrCat("min_fit_clients: ", min_clients, ", min_available_clients: ", min_clients));
}

// `text` with one fl-client process per client instead of virtual clients.
std::string PerProcess(const std::string& text) {
  return Edit(text, "emulation: {backend: userspace}", "emulation: {backend: userspace, virtual_clients: false}");
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

// The start of the names of the namespaces this process makes: <prefix><our pid in hex>_ (the kernel backend's
// fle_, the packet backend's flp_).
std::string OurNamespacePrefix(const std::string& prefix) {
  std::ostringstream name;
  name << prefix << std::hex << getpid() << "_";
  return name.str();
}

// Each test in its own scratch folder: the manifest m.yaml, records.db, and a folder of logs per run. The helpers
// that assert return early on a fatal failure, so the tests call them inside ASSERT_NO_FATAL_FAILURE.
class RunnerTest : public ::testing::Test {
 protected:
  absl::StatusOr<Manifest> Load(const std::string& text) {
    const std::string path = dir_.File("m.yaml");
    std::ofstream(path) << text;
    return LoadManifest(path, ManifestOptions{fs::path(FL_EXPERIMENTS_DIR) / "profiles"});
  }

  RunOptions Options(const std::string& sub) {
    RunOptions o;
    o.db_path = dir_.File("records.db");
    o.out_dir = dir_.File(sub);
    o.server_bin = FL_SERVER_BIN;
    o.client_bin = FL_CLIENT_BIN;
    o.software_version = "test";
    o.quiet = true;
    return o;
  }

  // `text` loaded as the manifest; fatal unless it loads.
  void LoadOk(const std::string& text, Manifest* m) {
    absl::StatusOr<Manifest> loaded = Load(text);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    *m = *std::move(loaded);
  }

  // `m` run with `options`: fatal unless the runner returns a result, which is expected to say finished.
  void RunFinished(const Manifest& m, const RunOptions& options, RunResult* r) {
    absl::StatusOr<RunResult> run = RunExperiment(m, options);
    ASSERT_TRUE(run.ok()) << run.status();
    *r = *std::move(run);
    EXPECT_EQ(r->status, "finished") << r->reason;
  }

  // LoadOk, then RunFinished with its logs in `sub`. `check_loaded` sees the manifest before it runs, so its
  // checks report even when the run fails.
  void LoadAndRunFinished(const std::string& text, const std::string& sub, RunResult* r,
                          const std::function<void(const Manifest&)>& check_loaded = nullptr) {
    Manifest m;
    ASSERT_NO_FATAL_FAILURE(LoadOk(text, &m));
    if (check_loaded) check_loaded(m);
    RunFinished(m, Options(sub), r);
  }

  // The records database, fatal unless it opens; with `clients`, also the clients recorded for `experiment_id`,
  // fatal unless they read.
  void OpenRecords(const std::string& experiment_id, std::unique_ptr<RecordReader>* reader,
                   std::vector<instrumentation::ClientRecord>* clients = nullptr) {
    absl::StatusOr<std::unique_ptr<RecordReader>> opened = RecordReader::Open(dir_.File("records.db"));
    ASSERT_TRUE(opened.ok()) << opened.status();
    *reader = *std::move(opened);
    if (clients == nullptr) return;
    auto listed = (*reader)->ListClients(experiment_id);
    ASSERT_TRUE(listed.ok()) << listed.status();
    *clients = *std::move(listed);
  }

  fl::testing::ScratchDir dir_{"fl_runner"};
};

TEST_F(RunnerTest, RunsRecordsTheManifestAndReplays) {
  RunResult r;
  ASSERT_NO_FATAL_FAILURE(LoadAndRunFinished(kManifest, "run", &r));
  EXPECT_EQ(r.backend, "userspace");
  // Mutual TLS by default, with a throwaway CA in the run's folder: a certificate per client. fl-server starts
  // only with the TLS flags or --insecure, and --insecure would have put its warning into the log.
  EXPECT_EQ(r.security, "mtls");
  EXPECT_EQ(r.pki_dir, dir_.File("run") + "/pki");
  for (const char* file :
       {"ca/ca.crt", "server/server.crt", "clients/wifi-0.crt", "clients/wifi-1.key", "clients/cell-0.crt"}) {
    EXPECT_TRUE(fs::exists(fs::path(r.pki_dir) / file)) << file;
  }
  EXPECT_EQ(ReadText(dir_.File("run/server.log")).find("--insecure"), std::string::npos)
      << ReadText(dir_.File("run/server.log"));

  std::unique_ptr<RecordReader> reader;
  std::vector<instrumentation::ClientRecord> clients;
  ASSERT_NO_FATAL_FAILURE(OpenRecords(r.experiment_id, &reader, &clients));
  ASSERT_EQ(clients.size(), 3u);
  std::map<std::string, std::string> kinds;
  for (const auto& c : clients) kinds[c.client_name] = c.link_kind + "/" + c.link_profile + "/" + c.device_class;
  EXPECT_EQ(kinds["wifi-0"], "wifi/wifi/" + kinds["wifi-0"].substr(kinds["wifi-0"].rfind('/') + 1));
  EXPECT_EQ(kinds["cell-0"], "5g/5g-sa/rpi4");
  auto rounds = reader->ListRounds(r.experiment_id);
  ASSERT_TRUE(rounds.ok());
  EXPECT_EQ(rounds->size(), 2u);

  absl::StatusOr<RecordedManifest> rec = ReadRecordedManifest(dir_.File("records.db"), r.experiment_id);
  ASSERT_TRUE(rec.ok()) << rec.status();
  EXPECT_EQ(rec->manifest_yaml, kManifest);
  EXPECT_EQ(rec->seed, 3u);
  EXPECT_EQ(rec->backend, "userspace");
  EXPECT_EQ(rec->software_version, "test");
  EXPECT_NE(rec->resolved_json.find("\"mode\": \"mtls\""), std::string::npos) << rec->resolved_json;

  // Replay from the record alone: the manifest file is gone.
  fs::remove(dir_.File("m.yaml"));
  absl::StatusOr<Manifest> again = ManifestFromResolvedJson(rec->resolved_json, rec->manifest_yaml);
  ASSERT_TRUE(again.ok()) << again.status();
  RunOptions ro = Options("replay");
  ro.replay_of = r.experiment_id;
  RunResult replay;
  ASSERT_NO_FATAL_FAILURE(RunFinished(*again, ro, &replay));
  EXPECT_NE(replay.experiment_id, r.experiment_id);
  EXPECT_EQ(replay.security, "mtls");  // the replay's own throwaway CA
  EXPECT_EQ(replay.pki_dir, dir_.File("replay") + "/pki");
  absl::StatusOr<std::string> cmp = CompareExperiments(dir_.File("records.db"), r.experiment_id, replay.experiment_id);
  ASSERT_TRUE(cmp.ok()) << cmp.status();
  EXPECT_NE(cmp->find(r.experiment_id), std::string::npos);
  EXPECT_NE(cmp->find("client uplink_ms"), std::string::npos);
  auto replay_of = reader->QueryText(
      fl::StrCat("SELECT replay_of FROM experiment_manifests WHERE experiment_id = '", replay.experiment_id, "'"));
  ASSERT_TRUE(replay_of.ok()) << replay_of.status();
  EXPECT_EQ(*replay_of, r.experiment_id);
  EXPECT_EQ(ProcessesMentioning(dir_.path()), 0);
}

// The kernel backend end to end: each client in its own network namespace behind HTB shaping (and the
// userspace delay line where the kernel has no netem); every namespace is gone afterwards.
TEST_F(RunnerTest, KernelBackendRunsClientsInNamespacesAndRemovesThem) {
  if (geteuid() != 0) GTEST_SKIP() << "the kernel link backend needs root (network namespaces, tc)";
  RunResult r;
  ASSERT_NO_FATAL_FAILURE(LoadAndRunFinished(Edit(kManifest, "backend: userspace", "backend: kernel"), "run", &r));
  EXPECT_EQ(r.backend, "kernel");
  std::unique_ptr<RecordReader> reader;
  std::vector<instrumentation::ClientRecord> clients;
  ASSERT_NO_FATAL_FAILURE(OpenRecords(r.experiment_id, &reader, &clients));
  EXPECT_EQ(clients.size(), 3u);
  // Namespaces of this process (fle_<pid in hex>_<n>) are all removed.
  absl::StatusOr<std::string> netns = fl::sys::RunCommand({"ip", "netns", "list"});
  ASSERT_TRUE(netns.ok()) << netns.status();
  EXPECT_EQ(netns->find(OurNamespacePrefix("fle_")), std::string::npos) << *netns;
  EXPECT_EQ(ProcessesMentioning(dir_.path()), 0);
}

// The packet backend end to end: the clients' own TCP crosses packet-level links (TUN devices in namespaces the
// run makes): the virtual clients' process gets one link per instance in one namespace, the 5G client its own;
// every client's packets are counted in packet-links.tsv; every namespace is gone afterwards. Where the machine
// cannot run it, the run is refused before anything starts, naming what is missing.
TEST_F(RunnerTest, PacketBackendCarriesEveryClientsTcpAndRemovesItsNamespaces) {
  const std::string text = Edit(kManifest, "backend: userspace", "backend: packet, tcp_congestion: reno");
  if (absl::Status support = emulation::PacketBackendSupport(); !support.ok()) {
    Manifest m;
    ASSERT_NO_FATAL_FAILURE(LoadOk(text, &m));
    absl::StatusOr<std::string> backend = ResolveBackend(m);
    ASSERT_FALSE(backend.ok());
    EXPECT_NE(backend.status().message().find(support.message()), std::string::npos) << backend.status();
    return;
  }
  RunResult r;
  ASSERT_NO_FATAL_FAILURE(LoadAndRunFinished(text, "run", &r));
  EXPECT_EQ(r.backend, "packet");
  std::unique_ptr<RecordReader> reader;
  std::vector<instrumentation::ClientRecord> clients;
  ASSERT_NO_FATAL_FAILURE(OpenRecords(r.experiment_id, &reader, &clients));
  EXPECT_EQ(clients.size(), 3u);
  // Each client's link carried its traffic both ways: client, process, direction, offered, delivered, ...
  std::istringstream tsv(ReadText(dir_.File("run/packet-links.tsv")));
  std::string line;
  std::getline(tsv, line);
  std::map<std::string, int> directions;
  while (std::getline(tsv, line)) {
    std::istringstream row(line);
    std::string client, process, direction;
    uint64_t offered = 0, delivered = 0;
    row >> client >> process >> direction >> offered >> delivered;
    EXPECT_GT(delivered, 10u) << line;
    EXPECT_LE(delivered, offered) << line;
    ++directions[client];
    if (client.rfind("wifi-", 0) == 0) {
      EXPECT_EQ(process, "wifi-instances") << line;
    }
  }
  EXPECT_EQ(directions, (std::map<std::string, int>{{"cell-0", 2}, {"wifi-0", 2}, {"wifi-1", 2}}));
  absl::StatusOr<std::string> netns = fl::sys::RunCommand({"ip", "netns", "list"});
  ASSERT_TRUE(netns.ok()) << netns.status();
  EXPECT_EQ(netns->find(OurNamespacePrefix("flp_")), std::string::npos) << *netns;
  EXPECT_EQ(ProcessesMentioning(dir_.path()), 0);
}

// A congestion control the host does not let namespaces take is refused before anything starts (cubic on a host
// whose tcp_allowed_congestion_control lacks it, as this one's), naming the sysctl; where allowed it resolves.
TEST_F(RunnerTest, PacketBackendRefusesACongestionControlNamespacesMayNotTake) {
  if (!emulation::PacketBackendSupport().ok()) GTEST_SKIP() << "covered by the packet backend's refusal test";
  Manifest m;
  ASSERT_NO_FATAL_FAILURE(LoadOk(Edit(kManifest, "backend: userspace", "backend: packet, tcp_congestion: cubic"), &m));
  absl::StatusOr<std::string> backend = ResolveBackend(m);
  const std::string allowed = ReadText("/proc/sys/net/ipv4/tcp_allowed_congestion_control");
  if (allowed.find("cubic") != std::string::npos) {
    EXPECT_TRUE(backend.ok()) << backend.status();
    return;
  }
  ASSERT_FALSE(backend.ok());
  EXPECT_NE(backend.status().message().find("emulation.tcp_congestion"), std::string::npos) << backend.status();
  EXPECT_NE(backend.status().message().find("sysctl -w net.ipv4.tcp_allowed_congestion_control"), std::string::npos)
      << backend.status();
  EXPECT_FALSE(fs::exists(dir_.File("run")));
}

// `backend: none` means no link emulation at all: virtual clients dial fl-server itself, not one relay per
// instance (seen in the running fl-client's --server argument: the server's one address, no list of relays).
TEST_F(RunnerTest, BackendNoneStartsNoRelaysForVirtualClients) {
  Manifest m;
  ASSERT_NO_FATAL_FAILURE(LoadOk(Edit(kManifest, "backend: userspace", "backend: none"), &m));
  RunOptions o = Options("run");
  std::set<std::string> dialled;  // every --server value of our fl-client processes, sampled while the run goes on
  o.on_tick = [&](const std::string&) {
    DIR* proc = opendir("/proc");
    while (dirent* e = readdir(proc)) {
      if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
      std::ifstream in(fl::StrCat("/proc/", e->d_name, "/cmdline"));
      std::vector<std::string> argv;
      std::string all;
      for (std::string arg; std::getline(in, arg, '\0');) {
        argv.push_back(arg);
        all += arg + " ";
      }
      if (argv.empty() || argv[0] != FL_CLIENT_BIN || all.find(dir_.path()) == std::string::npos) continue;
      const auto it = std::find(argv.begin(), argv.end(), "--server");
      if (it != argv.end() && it + 1 != argv.end()) dialled.insert(*(it + 1));
    }
    closedir(proc);
  };
  RunResult r;
  ASSERT_NO_FATAL_FAILURE(RunFinished(m, o, &r));
  EXPECT_EQ(r.backend, "none");
  const std::string port = ReadText(dir_.File("run/server.port"));
  ASSERT_FALSE(dialled.empty());
  for (const std::string& addr : dialled) {
    EXPECT_EQ(addr.find(','), std::string::npos) << addr;  // a list would be one relay per instance
    EXPECT_EQ(addr, fl::StrCat("127.0.0.1:", std::stoi(port))) << addr;
  }
}

// `security: {mode: insecure}` opts out: plaintext on both ends, each saying so in its log, no certificates.
TEST_F(RunnerTest, InsecureModeRunsPlaintextAndRecordsIt) {
  RunResult r;
  ASSERT_NO_FATAL_FAILURE(
      LoadAndRunFinished(Edit(kManifest, "emulation:", "security: {mode: insecure}\nemulation:"), "run", &r));
  EXPECT_EQ(r.security, "insecure");
  EXPECT_EQ(r.pki_dir, "");
  EXPECT_FALSE(fs::exists(dir_.File("run/pki")));
  EXPECT_NE(ReadText(dir_.File("run/server.log")).find("--insecure: serving plaintext gRPC"), std::string::npos)
      << ReadText(dir_.File("run/server.log"));
  EXPECT_NE(ReadText(dir_.File("run/cell-0.log")).find("--insecure: connecting to"), std::string::npos)
      << ReadText(dir_.File("run/cell-0.log"));
  absl::StatusOr<RecordedManifest> rec = ReadRecordedManifest(dir_.File("records.db"), r.experiment_id);
  ASSERT_TRUE(rec.ok()) << rec.status();
  absl::StatusOr<Manifest> again = ManifestFromResolvedJson(rec->resolved_json, rec->manifest_yaml);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->security.mode, "insecure");  // a replay runs as the original did
  EXPECT_EQ(ProcessesMentioning(dir_.path()), 0);
}

// server.aggregation: buffered reaches fl-server as its flags: the run is FedBuff (aggregation steps with staleness).
TEST_F(RunnerTest, ABufferedManifestRunsAggregationSteps) {
  std::string text = Edit(kManifest, "emulation:", "security: {mode: insecure}\nemulation:");
  text = Edit(text, "  round_deadline_s: 60\n",
              "  aggregation: buffered\n  buffered: {buffer_size: 2, concurrency: 3, max_staleness: 5}\n"
              "  round_deadline_s: 60\n");
  RunResult r;
  ASSERT_NO_FATAL_FAILURE(LoadAndRunFinished(text, "run", &r));
  std::unique_ptr<RecordReader> reader;
  ASSERT_NO_FATAL_FAILURE(OpenRecords(r.experiment_id, &reader));
  EXPECT_EQ(*reader->QueryText("SELECT aggregation FROM experiments"), "buffered");
  EXPECT_EQ(*reader->QueryInt("SELECT count(*) FROM rounds WHERE status = 'committed'"), 2);
  EXPECT_EQ(*reader->QueryInt("SELECT count(*) FROM client_rounds WHERE outcome = 'ok' AND staleness IS NULL"), 0);
  EXPECT_GE(*reader->QueryInt("SELECT count(*) FROM client_rounds WHERE outcome = 'ok'"), 4);
  EXPECT_EQ(ProcessesMentioning(dir_.path()), 0);
}

// A group with count runs as one fl-client --instances process (virtual clients), each instance with its own
// certificate and its own relay; `virtual_clients: false` goes back to one process per client.
TEST_F(RunnerTest, AGroupRunsAsOneProcessOfVirtualClientsUnderTheirOwnNames) {
  const std::string text = WifiGroup("count: 6", 7);
  RunResult r;
  ASSERT_NO_FATAL_FAILURE(
      LoadAndRunFinished(text, "run", &r, [](const Manifest& m) { EXPECT_TRUE(m.emulation.virtual_clients); }));
  EXPECT_TRUE(fs::exists(dir_.File("run/wifi-instances.log")));
  EXPECT_FALSE(fs::exists(dir_.File("run/wifi-0.log")));
  EXPECT_TRUE(fs::exists(dir_.File("run/cell-0.log")));  // a group of one stays one plain client
  std::unique_ptr<RecordReader> reader;
  std::vector<instrumentation::ClientRecord> clients;
  ASSERT_NO_FATAL_FAILURE(OpenRecords(r.experiment_id, &reader, &clients));
  std::set<std::string> names;
  for (const auto& c : clients) {
    names.insert(c.client_name);
    if (c.client_name.starts_with("wifi-")) {
      EXPECT_EQ(c.link_profile, "wifi") << c.client_name;
    }
  }
  EXPECT_EQ(names, (std::set<std::string>{"wifi-0", "wifi-1", "wifi-2", "wifi-3", "wifi-4", "wifi-5", "cell-0"}));
  EXPECT_EQ(ProcessesMentioning(dir_.path()), 0);

  RunResult r2;
  ASSERT_NO_FATAL_FAILURE(LoadAndRunFinished(PerProcess(text), "run2", &r2));
  EXPECT_TRUE(fs::exists(dir_.File("run2/wifi-5.log")));
  EXPECT_FALSE(fs::exists(dir_.File("run2/wifi-instances.log")));
  EXPECT_EQ(ProcessesMentioning(dir_.path()), 0);
}

// clients[].instances_per_process splits a group of virtual clients: 5 clients at 2 per process are processes of
// 2, 2 and 1 (wifi-instances-0..2), named wifi-0..wifi-4 as one process would name them, each process's fl-client
// told its first instance's number; the plan gives each process its own first shard and offset.
TEST_F(RunnerTest, InstancesPerProcessSplitsAGroupKeepingItsNames) {
  const std::string text = WifiGroup("count: 5\n    instances_per_process: 2", 6);
  Manifest m;
  ASSERT_NO_FATAL_FAILURE(LoadOk(text, &m));
  const std::vector<ClientProcess> plan =
      PlanClientProcesses(m, "userspace", std::vector<DeviceEmulation>(m.clients.size()));
  ASSERT_EQ(plan.size(), 4u);  // three wifi processes and cell-0
  for (uint32_t k = 0; k < 3; ++k) {
    EXPECT_EQ(plan[k].name, fl::StrCat("wifi-instances-", k));
    EXPECT_EQ(plan[k].group_offset, 2 * k);
    EXPECT_EQ(plan[k].index, 2 * k);  // wifi is the first group: its clients hold shards 0..4
    EXPECT_EQ(plan[k].instances, k < 2 ? 2u : 1u);
  }
  const std::vector<std::string> args = ClientProcessArgs(m, plan[1], "fl-client", "127.0.0.1:1", "", false);
  const auto flag = [&](const std::string& name) {
    auto it = std::find(args.begin(), args.end(), name);
    return it == args.end() || it + 1 == args.end() ? std::string("(none)") : *(it + 1);
  };
  EXPECT_EQ(flag("--instance-offset"), "2");
  EXPECT_EQ(flag("--client-index"), "2");
  EXPECT_EQ(flag("--instances"), "2");
  EXPECT_EQ(flag("--name"), "wifi");

  RunResult r;
  ASSERT_NO_FATAL_FAILURE(LoadAndRunFinished(text, "run", &r));
  for (const char* log : {"run/wifi-instances-0.log", "run/wifi-instances-1.log", "run/wifi-instances-2.log"}) {
    EXPECT_TRUE(fs::exists(dir_.File(log))) << log;
  }
  std::unique_ptr<RecordReader> reader;
  std::vector<instrumentation::ClientRecord> clients;
  ASSERT_NO_FATAL_FAILURE(OpenRecords(r.experiment_id, &reader, &clients));
  std::set<std::string> names;
  for (const auto& c : clients) names.insert(c.client_name);
  EXPECT_EQ(names, (std::set<std::string>{"wifi-0", "wifi-1", "wifi-2", "wifi-3", "wifi-4", "cell-0"}));
  EXPECT_EQ(ProcessesMentioning(dir_.path()), 0);

  // SecAgg's planned dropouts pick the group's first clients: a split group would pick each process's.
  absl::StatusOr<Manifest> refused =
      Load(WifiGroup("count: 5\n    instances_per_process: 2\n    secagg_drop_after_shares: 0.2", 6));
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("instances_per_process"), std::string_view::npos) << refused.status();
}

// availability.period_s/online: the group's instances follow a diurnal schedule seeded by the manifest's seed
// (fl-client --availability); without virtual clients the run is refused before anything starts.
TEST_F(RunnerTest, ADiurnalGroupRunsAsVirtualClientsAndIsRefusedWithoutThem) {
  const std::string text = WifiGroup("count: 6\n    availability: {period_s: 2, online: 0.5}", 2);
  RunResult r;
  ASSERT_NO_FATAL_FAILURE(LoadAndRunFinished(text, "run", &r, [](const Manifest& m) {
    EXPECT_EQ(m.clients[0].period_s, 2);
    EXPECT_EQ(m.clients[0].online_fraction, 0.5);
  }));
  EXPECT_TRUE(fs::exists(dir_.File("run/wifi-instances.log")));
  EXPECT_EQ(ProcessesMentioning(dir_.path()), 0);

  Manifest per_process;
  ASSERT_NO_FATAL_FAILURE(LoadOk(PerProcess(text), &per_process));
  absl::StatusOr<RunResult> refused = RunExperiment(per_process, Options("run2"));
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_NE(refused.status().message().find("clients group wifi: availability.period_s needs virtual clients"),
            std::string::npos)
      << refused.status();
  EXPECT_FALSE(fs::exists(dir_.File("run2/server.log")));
}

// availability.trace: each named instance is online in its trace's windows only (fl-client --availability
// trace:FILE, the path resolved against the manifest's folder); one whose only window lies after the experiment
// never joins, one the trace does not name is always online. A trace and a diurnal model together, or a missing
// file, are refused at load naming the field.
TEST_F(RunnerTest, ATraceGroupFollowsItsTraceAndBadTracesAreRefused) {
  std::ofstream(dir_.File("fleet.trace")) << "# name from_s until_s\n"
                                             "wifi-0 0 inf\n"
                                             "wifi-1 0 inf\n"
                                             "wifi-2 3600 7200   # an hour from now: never during this run\n";
  RunResult r;
  // Four of the five can be online (wifi-0, wifi-1, wifi-3 and cell-0), and the rounds need all four: with
  // fewer, a client slow to start on a loaded machine could find the experiment over before it joined.
  ASSERT_NO_FATAL_FAILURE(LoadAndRunFinished(
      WifiGroup("count: 4\n    availability: {trace: fleet.trace}", 4), "run", &r, [&](const Manifest& m) {
        EXPECT_EQ(m.clients[0].availability_trace, fs::path(dir_.File("fleet.trace")).lexically_normal().string());
      }));
  std::unique_ptr<RecordReader> reader;
  std::vector<instrumentation::ClientRecord> clients;
  ASSERT_NO_FATAL_FAILURE(OpenRecords(r.experiment_id, &reader, &clients));
  std::set<std::string> names;
  for (const auto& c : clients) names.insert(c.client_name);
  EXPECT_EQ(names, (std::set<std::string>{"wifi-0", "wifi-1", "wifi-3", "cell-0"}));
  EXPECT_EQ(ProcessesMentioning(dir_.path()), 0);

  absl::StatusOr<Manifest> refused =
      Load(WifiGroup("count: 2\n    availability: {period_s: 2, online: 0.5, trace: fleet.trace}", 3));
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("either a diurnal model (period_s) or a trace, not both"),
            std::string::npos)
      << refused.status();
  refused = Load(WifiGroup("count: 2\n    availability: {trace: nowhere.trace}", 3));
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("nowhere.trace: no such file"), std::string::npos) << refused.status();
}

// Link-aware compression end to end with real processes: the manifest's server.uplink_codec_policy reaches
// fl-server, each fl-client encodes with the codec its task names, and every update is recorded in its link's
// codec (5G int4, WiFi int8).
TEST_F(RunnerTest, ALinkAwareCodecPolicyGivesEachLinkItsCodec) {
  RunResult r;
  ASSERT_NO_FATAL_FAILURE(LoadAndRunFinished(
      Edit(kManifest, "  evaluation: {every: 0}",
           "  evaluation: {every: 0}\n  uplink_codec_policy: \"by-link:5g=int4,wifi=int8,default=fp32\""),
      "run", &r));
  std::unique_ptr<RecordReader> reader;
  std::vector<instrumentation::ClientRecord> clients;
  ASSERT_NO_FATAL_FAILURE(OpenRecords(r.experiment_id, &reader, &clients));
  std::map<std::string, std::string> name_of;
  for (const auto& c : clients) name_of[c.client_id] = c.client_name;
  for (int64_t round = 1; round <= 2; ++round) {
    auto rows = reader->ListClientRounds(r.experiment_id, round);
    ASSERT_TRUE(rows.ok()) << rows.status();
    std::map<std::string, std::string> codecs;
    for (const auto& row : *rows) {
      if (row.outcome == instrumentation::ClientOutcome::kOk) codecs[name_of[row.client_id]] = row.codec;
    }
    EXPECT_EQ(codecs, (std::map<std::string, std::string>{{"wifi-0", "int8"}, {"wifi-1", "int8"}, {"cell-0", "int4"}}))
        << "round " << round;
  }
  EXPECT_EQ(ProcessesMentioning(dir_.path()), 0);
}

TEST_F(RunnerTest, InterruptStopsEverythingAndRecordsAborted) {
  // Rounds that cannot finish soon: 50 rounds of a 2 s training.
  Manifest m;
  ASSERT_NO_FATAL_FAILURE(
      LoadOk(Edit(Edit(kManifest, "rounds: 2", "rounds: 50"), "synthetic:20000:30", "synthetic:20000:2000"), &m));
  std::atomic<bool> interrupted{false};
  RunOptions o = Options("run");
  o.interrupted = &interrupted;
  std::thread ctrl_c([&] {
    std::this_thread::sleep_for(std::chrono::seconds(4));
    interrupted = true;
  });
  absl::StatusOr<RunResult> r = RunExperiment(m, o);
  ctrl_c.join();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, "aborted");
  std::unique_ptr<RecordReader> reader;
  ASSERT_NO_FATAL_FAILURE(OpenRecords(r->experiment_id, &reader));
  auto exp = reader->GetExperiment(r->experiment_id);
  ASSERT_TRUE(exp.ok()) << exp.status();
  EXPECT_EQ(instrumentation::ExperimentStatusName(exp->status), "aborted");  // the server closed its records
  EXPECT_EQ(ProcessesMentioning(dir_.path()), 0);
}

// fl-experiment run --resume: an experiment stopped after a committed round (as a failed node or step leaves
// it) continues from its checkpoint to its last round under the same id, with the first run's CA and manifest
// record; a finished one is refused, and so is a records database that does not exist.
TEST_F(RunnerTest, ResumeContinuesAnAbortedExperimentToItsLastRound) {
  // 12 rounds, stopped once round 1 committed: the ticks come every ~100 ms, so the first run ends with about
  // ten of its rounds left (each round trains three clients).
  Manifest m;
  ASSERT_NO_FATAL_FAILURE(LoadOk(Edit(kManifest, "rounds: 2", "rounds: 12"), &m));
  const std::string db = dir_.File("records.db");
  auto committed_rounds = [&](const std::string& id) {
    std::vector<int64_t> rounds;
    absl::StatusOr<std::unique_ptr<RecordReader>> reader = RecordReader::Open(db);
    if (!reader.ok()) return rounds;
    auto listed = (*reader)->ListRounds(id);
    if (!listed.ok()) return rounds;
    for (const auto& r : *listed) {
      if (r.status == instrumentation::RoundStatus::kCommitted) rounds.push_back(r.round);
    }
    return rounds;
  };
  std::atomic<bool> interrupted{false};
  RunOptions first = Options("run");
  first.interrupted = &interrupted;
  first.on_tick = [&](const std::string& id) {
    if (!committed_rounds(id).empty()) interrupted = true;
  };
  absl::StatusOr<RunResult> r1 = RunExperiment(m, first);
  ASSERT_TRUE(r1.ok()) << r1.status();
  ASSERT_EQ(r1->status, "aborted") << r1->reason;
  const size_t before = committed_rounds(r1->experiment_id).size();
  ASSERT_GE(before, 1u);
  ASSERT_LT(before, 12u);
  const std::string ca_before = ReadText(dir_.File("run/pki/ca/ca.crt"));

  absl::StatusOr<std::string> id = ExperimentToResume(db, "runner-test");
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(*id, r1->experiment_id);
  RunOptions again = Options("run");
  again.resume = true;
  again.experiment_id = *id;
  RunResult r2;
  ASSERT_NO_FATAL_FAILURE(RunFinished(m, again, &r2));
  EXPECT_EQ(r2.experiment_id, r1->experiment_id);
  EXPECT_EQ(ReadText(dir_.File("run/pki/ca/ca.crt")), ca_before);  // the first run's CA, not a new one
  std::vector<int64_t> rounds = committed_rounds(r2.experiment_id);
  std::sort(rounds.begin(), rounds.end());
  std::vector<int64_t> expected(12);
  for (int64_t i = 0; i < 12; ++i) expected[i] = i + 1;
  EXPECT_EQ(rounds, expected);  // every round committed once: the resumed run went on after the first's last
  absl::StatusOr<RecordedManifest> rec = ReadRecordedManifest(db, r2.experiment_id);
  ASSERT_TRUE(rec.ok()) << rec.status();  // the first run's manifest record stands

  absl::StatusOr<std::string> done = ExperimentToResume(db, "runner-test");
  EXPECT_EQ(done.status().code(), absl::StatusCode::kFailedPrecondition) << done.status();
  EXPECT_NE(done.status().message().find("finished"), std::string_view::npos) << done.status();
  absl::StatusOr<RunResult> r3 = RunExperiment(m, again);
  EXPECT_EQ(r3.status().code(), absl::StatusCode::kFailedPrecondition) << r3.status();
  absl::StatusOr<std::string> none = ExperimentToResume(dir_.File("nothing.db"), "runner-test");
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(none.status().message().find("nothing.db"), std::string_view::npos) << none.status();
  EXPECT_EQ(ProcessesMentioning(dir_.path()), 0);
}

TEST_F(RunnerTest, AFailingClientStopsTheExperimentNamingIt) {
  // A dataset folder that does not exist: fl-client exits with an error at start.
  Manifest m;
  ASSERT_NO_FATAL_FAILURE(LoadOk(Edit(kManifest, "training: {model: \"synthetic:20000:30\"}",
                                      "training: {model: cnn, data_dir: /nonexistent/fmnist}"),
                                 &m));
  absl::StatusOr<RunResult> r = RunExperiment(m, Options("run"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, "failed") << r->reason;
  EXPECT_NE(r->reason.find("client "), std::string::npos) << r->reason;
  EXPECT_NE(r->reason.find(".log"), std::string::npos) << r->reason;
  EXPECT_EQ(ProcessesMentioning(dir_.path()), 0);
}

}  // namespace
}  // namespace fl::experiment
