// e2e_round: the end-to-end round benchmark (docs/performance.md, "End-to-end rounds").
//
// For each point of the matrix K clients x P parameters it runs, in one invocation:
//   1. the raw-TCP limit: one server thread accepting K loopback TCP connections, sending each the bytes of a
//      model download (32-byte codec header + 4P) and receiving from each the bytes of an fp32 update (the same
//      size); K client threads recv, then send. Timed from the first byte sent to the last byte received,
//      repeated, median taken; and the same exchange doing the round's work with its bytes (round_work.h: the
//      product's checksums, checks, synthetic training pass, update, aggregation and commit, no protocol), the
//      second reference (--no-work skips it);
//   2. a real federation: fl-server (a child of this process, reaped with wait4 for its CPU time and peak RSS)
//      and K fl-client processes with `--model synthetic:P` (training = the global model plus a seeded
//      perturbation at memory speed), fp32 both ways, no evaluation, over 127.0.0.1. Round times come from
//      the records database (`rounds.duration_ms`, dispatch -> commit); the first committed round is warm-up
//      and excluded. With --security=both (the default) two federations per point, one after the other:
//      plaintext (--insecure) and mutual TLS (a throwaway CA provisioned with fl::pki in the work dir: a server
//      certificate for 127.0.0.1, one client certificate per client name; fl-server --tls-cert/--tls-key/
//      --tls-client-ca/--tls-crl, fl-client --tls-ca/--tls-cert/--tls-key);
// and prints markdown tables: round time, raw-TCP time, their ratio, server CPU seconds and peak RSS against
// the targets (round time <= 2x the raw-TCP limit; server peak RSS < 4x model + 200 MB, whatever K is), and
// mTLS against plaintext (round time, server and clients' CPU, their ratios; goal: round time ratio <= 1.05).
//
// Not a Google Benchmark binary (its name does not match bench/*_bench.cc): it starts processes and takes
// minutes. Every process it starts (fl::sys::Child) is stopped on every path (SIGTERM then SIGKILL on failure,
// PR_SET_PDEATHSIG if this process dies). MB = 10^6 bytes throughout.
//
// The references themselves (the raw-TCP exchange and the round's work it can do) are the fl_round_work library
// (raw_tcp_round.h, round_work.h), tested on their own; this file runs the matrix and prints the tables, meant to
// be read top to bottom next to its results in docs/performance.md.
#include <malloc.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <iostream>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fl/core/str_cat.h"
#include "fl/instrumentation/record_reader.h"
#include "fl/instrumentation/records.h"
#include "fl/pki/pki.h"
#include "fl/sys/process.h"
#include "raw_tcp_round.h"
#include "round_work.h"

#ifndef FL_SERVER_PATH
#define FL_SERVER_PATH "fl-server"
#endif
#ifndef FL_CLIENT_PATH
#define FL_CLIENT_PATH "fl-client"
#endif

namespace {

using Clock = std::chrono::steady_clock;
constexpr double kMB = 1e6;
constexpr uint64_t kPayloadHeaderBytes = 32;  // the codec header of every fp32 payload (codec.h)

std::atomic<bool> g_interrupted{false};
extern "C" void OnSignal(int) { g_interrupted.store(true); }

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

int64_t UnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

double Median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double Mean(const std::vector<double>& v) {
  if (v.empty()) return NAN;
  return std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

// A value of /proc/meminfo or /proc/<pid>/status ("VmRSS:   1234 kB"), in kB; nullopt when absent.
std::optional<int64_t> ProcKb(const std::string& file, std::string_view key) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    if (line.size() > key.size() && line.compare(0, key.size(), key) == 0 && line[key.size()] == ':') {
      return std::strtoll(line.c_str() + key.size() + 1, nullptr, 10);
    }
  }
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------------------
// Child processes.

// fl-server or an fl-client (fl::sys::Child): stdout and stderr appended to `log_path`, `env` (NAME=VALUE) added
// to the inherited environment, its own process group, SIGKILL when this process dies. Spawn from the main
// thread: PR_SET_PDEATHSIG fires when the spawning thread exits. Its ExitStatus carries the CPU time and peak
// RSS (wait4); the destructor stops it (SIGTERM, 2 s, SIGKILL).
absl::StatusOr<fl::sys::Child> StartChild(const std::vector<std::string>& argv, const std::string& log_path,
                                          const std::vector<std::string>& env = {}) {
  fl::sys::SpawnOptions o;
  o.argv = argv;
  o.env = env;
  o.stdout_to = fl::sys::Stdio::File(log_path, /*append_to_it=*/true);
  o.stderr_to = fl::sys::Stdio::ToStdout();
  o.death_signal = SIGKILL;
  o.stop_grace = std::chrono::milliseconds(2000);
  return fl::sys::Child::Spawn(o);
}

// ---------------------------------------------------------------------------------------------------------
// One matrix point.

struct Options {
  std::string server_bin = FL_SERVER_PATH;
  std::string client_bin = FL_CLIENT_PATH;
  std::vector<int> clients = {10, 50};
  std::vector<std::string> params = {"1M", "25M"};
  int rounds = 0;  // 0: by model size
  int raw_repeats = 5;
  std::string work_dir;
  bool keep = false;
  bool force = false;
  double memory_headroom = 0.85;  // use at most this fraction of MemAvailable
  uint32_t round_deadline_ms = 600000;
  uint32_t timeout_s = 1800;
  std::vector<std::string> server_args;
  std::vector<std::string> client_args;
  std::vector<std::string> server_env;
  std::vector<std::string> client_env;
  std::string security = "both";
  int repeats = 1;  // federations per security per point, alternated  // plaintext | mtls | both (plaintext first, then
                    // mTLS, at every point)
  uint32_t train_ms = 0;  // synthetic:P:train_ms (separates the download and upload phases; 0 in the table)
  int sample_ms = 20;
  int instances = 1;           // clients per fl-client process (fl-client --instances); 1: one process per client
  bool work_reference = true;  // also time raw TCP doing the round's work (round_work.h)
};

// Clients per fl-client process (--instances), set once from the options before any federation runs.
int g_instances = 1;

// How the federation's channels are secured (--security).
enum class Security { kPlaintext, kMtls };

std::string SecurityName(Security s) { return s == Security::kPlaintext ? "plaintext" : "mTLS"; }

// One federation of a point (plaintext or mutual TLS).
struct FederationResult {
  Security security = Security::kPlaintext;
  int repeat = 0;               // 0-based (--repeats)
  std::vector<double> round_s;  // committed rounds after the first
  double first_round_s = NAN;
  double aggregation_ms = NAN;  // mean over measured rounds
  double server_cpu_s = NAN;
  double server_user_s = NAN;
  double server_sys_s = NAN;
  double server_rss_mb = NAN;
  double client_rss_mb_max = NAN;
  double client_rss_mb_mean = NAN;
  double clients_rss_sum_peak_mb = NAN;  // the sampled peak of the sum over clients
  double clients_cpu_s = NAN;            // sum over clients (wait4), whole run
  // CPU per measured round (/proc/<pid>/stat sampled between the warm-up round's commit and the last commit: no
  // start-up, no Join, no initial model), seconds; the issue's "client CPU per round <= 2x the server's".
  double server_cpu_round_s = NAN, clients_cpu_round_s = NAN;
  int64_t measured_from_unix_ms = 0, measured_to_unix_ms = 0;  // commits of the first and the last round
  // Per-client phases (client view, mean over measured rounds and clients), ms.
  double downlink_ms = NAN, train_ms = NAN, uplink_server_ms = NAN;
  double wall_s = NAN;
};

struct PointResult {
  int k = 0;
  uint64_t p = 0;
  int rounds = 0;
  bool ran = false;
  std::string note;    // why not run / what failed
  double raw_s = NAN;  // median
  std::vector<double> raw_samples;
  // Raw TCP doing the round's work with the bytes (round_work.h), median and samples; NAN with --no-work.
  double work_s = NAN;
  std::vector<double> work_samples;
  std::vector<FederationResult> federations;  // in the order run (--security, --repeats)
  std::vector<const FederationResult*> All(Security s) const {
    std::vector<const FederationResult*> out;
    for (const auto& f : federations) {
      if (f.security == s) out.push_back(&f);
    }
    return out;
  }
};

// "plaintext", or "plaintext #2" when a point ran each security more than once.
std::string FederationName(const FederationResult& f, int repeats) {
  return repeats > 1 ? fl::StrCat(SecurityName(f.security), " #", f.repeat + 1) : SecurityName(f.security);
}

double ModelMb(uint64_t p) { return 4.0 * static_cast<double>(p) / kMB; }
double BudgetMb(uint64_t p) { return 4.0 * ModelMb(p) + 200.0; }

absl::StatusOr<uint64_t> ParseCount(const std::string& s) {
  if (s.empty()) return absl::InvalidArgumentError("empty count");
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  double mult = 1;
  if (*end == 'k' || *end == 'K')
    mult = 1e3, ++end;
  else if (*end == 'm' || *end == 'M')
    mult = 1e6, ++end;
  else if (*end == 'g' || *end == 'G')
    mult = 1e9, ++end;
  if (*end != '\0' || !(v > 0)) return absl::InvalidArgumentError(fl::StrCat("not a count: ", s));
  return static_cast<uint64_t>(std::llround(v * mult));
}

std::string CountName(uint64_t p) {
  if (p % 1000000 == 0) return fl::StrCat(p / 1000000, "M");
  if (p % 1000 == 0) return fl::StrCat(p / 1000, "k");
  return fl::StrCat(p);
}

// Memory a fl-client with the synthetic model needs at its peak: measured 560-580 MB for P = 25M on Debian 12
// (x86_64, LibTorch loaded), about 195 MB for P = 1M: some 4.7 copies of the model plus code and runtime.
double ClientEstimateMb(uint64_t p) { return 4.75 * ModelMb(p) + 180.0; }

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void TailLog(const std::string& path, size_t max_bytes = 2000) {
  auto text = ReadFile(path);
  if (!text.ok() || text->empty()) return;
  const std::string& t = *text;
  std::cerr << "---- " << path << " (tail) ----\n"
            << (t.size() > max_bytes ? t.substr(t.size() - max_bytes) : t) << "\n";
}

// Samples the RSS of the server and (less often) the clients until stopped; writes a CSV timeline.
// utime + stime of a process in seconds (/proc/<pid>/stat fields 14 and 15); nullopt once it is gone.
std::optional<double> ProcCpuSeconds(pid_t pid) {
  std::ifstream in(fl::StrCat("/proc/", pid, "/stat"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t paren = text.rfind(')');  // the command name may hold spaces
  if (paren == std::string::npos) return std::nullopt;
  std::istringstream fields(text.substr(paren + 2));
  std::string field;
  uint64_t utime = 0, stime = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i) {  // field 3 is the state
    if (i == 14) utime = std::strtoull(field.c_str(), nullptr, 10);
    if (i == 15) stime = std::strtoull(field.c_str(), nullptr, 10);
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// Samples the server's and the clients' RSS (rss.csv) and CPU time while a federation runs.
class ProcessSampler {
 public:
  struct CpuSample {
    int64_t unix_ms = 0;
    double server_s = 0, clients_s = 0;
  };
  ProcessSampler(pid_t server, std::vector<pid_t> clients, int period_ms, std::string csv_path)
      : server_(server), clients_(std::move(clients)), period_ms_(period_ms), csv_path_(std::move(csv_path)) {
    thread_ = std::thread([this] { Run(); });
  }
  // CPU seconds per second of the server and of all clients over [from_ms, to_ms]: from the last sample at or
  // before from_ms to the last at or before to_ms (the processes leave right after the last commit, so there is
  // no sample after it). False when those samples cover less than half the window.
  bool CpuRate(int64_t from_ms, int64_t to_ms, double* server_per_s, double* clients_per_s) const {
    const CpuSample* a = nullptr;
    const CpuSample* b = nullptr;
    for (const CpuSample& c : cpu_) {
      if (c.unix_ms <= from_ms) a = &c;
      if (c.unix_ms <= to_ms) b = &c;
    }
    if (a == nullptr || b == nullptr || 2 * (b->unix_ms - a->unix_ms) < to_ms - from_ms) return false;
    const double seconds = static_cast<double>(b->unix_ms - a->unix_ms) / 1e3;
    *server_per_s = (b->server_s - a->server_s) / seconds;
    *clients_per_s = (b->clients_s - a->clients_s) / seconds;
    return true;
  }
  ~ProcessSampler() { Stop(); }
  void Stop() {
    if (thread_.joinable()) {
      stop_.store(true);
      thread_.join();
    }
  }
  int64_t server_peak_kb() const { return server_peak_kb_; }
  int64_t clients_sum_peak_kb() const { return clients_sum_peak_kb_; }

 private:
  void Run() {
    std::ofstream csv(csv_path_);
    csv << "unix_ms,server_rss_kb,server_hwm_kb,clients_rss_sum_kb\n";
    const std::string server_status = fl::StrCat("/proc/", server_, "/status");
    int tick = 0;
    int64_t clients_sum = -1;
    while (!stop_.load()) {
      const auto rss = ProcKb(server_status, "VmRSS");
      const auto hwm = ProcKb(server_status, "VmHWM");
      if (hwm) server_peak_kb_ = std::max(server_peak_kb_, *hwm);
      if (tick % std::max(1, 250 / period_ms_) == 0) {  // clients every ~250 ms: K files to read
        clients_sum = 0;
        for (pid_t c : clients_) clients_sum += ProcKb(fl::StrCat("/proc/", c, "/status"), "VmRSS").value_or(0);
        clients_sum_peak_kb_ = std::max(clients_sum_peak_kb_, clients_sum);
      }
      if (rss) csv << UnixMs() << "," << *rss << "," << hwm.value_or(0) << "," << clients_sum << "\n";
      if (tick % std::max(1, 100 / period_ms_) == 0) {  // CPU every ~100 ms: clock ticks are 10 ms anyway
        CpuSample c;
        c.unix_ms = UnixMs();
        c.server_s = ProcCpuSeconds(server_).value_or(0);
        bool all = true;
        for (pid_t pid : clients_) {
          const std::optional<double> t = ProcCpuSeconds(pid);
          all = all && t.has_value();
          c.clients_s += t.value_or(0);
        }
        if (all) cpu_.push_back(c);  // a client gone (the end) would make the sum drop
      }
      ++tick;
      std::this_thread::sleep_for(std::chrono::milliseconds(period_ms_));
    }
  }

  pid_t server_;
  std::vector<pid_t> clients_;
  int period_ms_;
  std::string csv_path_;
  std::atomic<bool> stop_{false};
  int64_t server_peak_kb_ = 0;
  int64_t clients_sum_peak_kb_ = 0;
  std::vector<CpuSample> cpu_;  // written by the thread, read after Stop
  std::thread thread_;
};

// A throwaway certificate authority for the mutual-TLS federations (fl::pki, the layout of docs/security.md): a
// server certificate for 127.0.0.1 and one client certificate per client name.
struct Pki {
  std::string dir;
  std::string ca_cert, crl, server_cert, server_key;
  std::string ClientCert(const std::string& name) const {
    return fl::pki::Paths{dir}.Cert(fl::pki::Kind::kClient, name);
  }
  std::string ClientKey(const std::string& name) const { return fl::pki::Paths{dir}.Key(fl::pki::Kind::kClient, name); }
};

// Client i's name: e2e-i, or with --instances N the name fl-client gives instance i % N of process i / N
// (--name=e2e-<process> --instances: e2e-<process>-<instance>).
std::string ClientName(int i) {
  return g_instances <= 1 ? fl::StrCat("e2e-", i) : fl::StrCat("e2e-", i / g_instances, "-", i % g_instances);
}

absl::StatusOr<Pki> ProvisionPki(const std::string& dir, int clients) {
  if (absl::Status s = fl::pki::CreateCa(dir, {}); !s.ok()) return s;
  fl::pki::IssueOptions server;
  server.ip_addresses = {"127.0.0.1"};
  if (auto issued = fl::pki::Issue(dir, fl::pki::Kind::kServer, "server", server); !issued.ok()) {
    return issued.status();
  }
  for (int i = 0; i < clients; ++i) {
    if (auto issued = fl::pki::Issue(dir, fl::pki::Kind::kClient, ClientName(i), {}); !issued.ok()) {
      return issued.status();
    }
  }
  const fl::pki::Paths paths{dir};
  return Pki{dir, paths.CaCert(), paths.Crl(), paths.Cert(fl::pki::Kind::kServer, "server"),
             paths.Key(fl::pki::Kind::kServer, "server")};
}

absl::Status ReadRecords(const std::string& db, int k, int rounds, FederationResult* r) {
  auto reader = fl::instrumentation::RecordReader::Open(db);
  if (!reader.ok()) return reader.status();
  auto experiments = (*reader)->ListExperiments();
  if (!experiments.ok()) return experiments.status();
  if (experiments->size() != 1) return absl::InternalError(fl::StrCat(experiments->size(), " experiments in ", db));
  const std::string id = experiments->front().id;
  auto rounds_read = (*reader)->ListRounds(id);
  if (!rounds_read.ok()) return rounds_read.status();
  std::vector<fl::instrumentation::RoundRecord> committed;
  for (const auto& row : *rounds_read) {
    if (row.status == fl::instrumentation::RoundStatus::kCommitted) committed.push_back(row);
  }
  std::sort(committed.begin(), committed.end(), [](const auto& a, const auto& b) { return a.round < b.round; });
  if (static_cast<int>(committed.size()) != rounds) {
    return absl::InternalError(fl::StrCat(committed.size(), " committed rounds of ", rounds, " (", rounds_read->size(),
                                          " attempts recorded)"));
  }
  r->first_round_s = committed.front().duration_ms / 1e3;
  r->measured_from_unix_ms = committed.front().ended_unix_ms;
  r->measured_to_unix_ms = committed.back().ended_unix_ms;
  std::vector<double> agg, down, train, up_server;
  for (size_t i = 1; i < committed.size(); ++i) {
    const auto& row = committed[i];
    if (row.num_accepted != k) {
      return absl::InternalError(
          fl::StrCat("round ", row.round, " aggregated ", row.num_accepted, " of ", k, " updates"));
    }
    r->round_s.push_back(row.duration_ms / 1e3);
    if (row.aggregation_ms) agg.push_back(*row.aggregation_ms);
    auto clients = (*reader)->ListClientRounds(id, row.round);
    if (!clients.ok()) return clients.status();
    for (const auto& c : *clients) {
      if (c.attempt != row.attempt) continue;
      if (c.downlink_ms) down.push_back(*c.downlink_ms);
      if (c.train_ms) train.push_back(*c.train_ms);
      if (c.uplink_server_ms) up_server.push_back(*c.uplink_server_ms);
    }
  }
  r->aggregation_ms = Mean(agg);
  r->downlink_ms = Mean(down);
  r->train_ms = Mean(train);
  r->uplink_server_ms = Mean(up_server);
  return absl::OkStatus();
}

// One federation of K clients x P parameters, `rounds` rounds, its channels secured as `security` says: plaintext
// (--insecure on both sides, as the reference figures were measured, docs/performance.md) or mutual TLS with the
// certificates of `pki` (a client's --name is its certificate's name, as fl-server requires).
absl::Status RunFederation(const Options& o, const Pki& pki, Security security, const std::string& dir, int k,
                           uint64_t p, int rounds, FederationResult* r) {
  r->security = security;
  std::filesystem::create_directories(dir);
  const std::string port_file = dir + "/port";
  const std::string db = dir + "/records.db";
  const std::string server_log = dir + "/server.log";
  std::vector<std::string> server_argv = {o.server_bin,
                                          "--listen=127.0.0.1:0",
                                          "--port-file=" + port_file,
                                          "--db=" + db,
                                          fl::StrCat("--experiment-name=e2e-k", k, "-p", CountName(p)),
                                          fl::StrCat("--rounds=", rounds),
                                          fl::StrCat("--min-fit-clients=", k),
                                          fl::StrCat("--min-available-clients=", k),
                                          "--evaluate-every=0",
                                          fl::StrCat("--round-deadline-ms=", o.round_deadline_ms),
                                          "--max-round-attempts=1",
                                          "--uplink-codec=fp32",
                                          "--downlink-codec=fp32",
                                          "--log-level=warn"};
  if (security == Security::kPlaintext) {
    server_argv.push_back("--insecure");
  } else {
    // What a secured deployment runs, the revocation list (reloaded when it changes) included.
    for (std::string a : {"--tls-cert=" + pki.server_cert, "--tls-key=" + pki.server_key,
                          "--tls-client-ca=" + pki.ca_cert, "--tls-crl=" + pki.crl}) {
      server_argv.push_back(std::move(a));
    }
  }
  for (const auto& a : o.server_args) server_argv.push_back(a);
  const auto started = Clock::now();
  auto server = StartChild(server_argv, server_log, o.server_env);
  if (!server.ok()) return server.status();
  std::vector<fl::sys::Child> clients;
  // Whatever happens below, every process is stopped when `clients` and `server` go out of scope.
  int port = 0;
  while (port == 0) {
    if (g_interrupted.load()) return absl::CancelledError("interrupted");
    if (server->Poll().has_value()) {
      TailLog(server_log);
      return absl::InternalError(fl::StrCat("fl-server ", server->exit_status()->Describe(), " before listening"));
    }
    if (Seconds(Clock::now() - started) > 60) return absl::DeadlineExceededError("fl-server did not listen in 60 s");
    if (auto text = ReadFile(port_file); text.ok() && !text->empty()) port = std::atoi(text->c_str());
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::vector<pid_t> client_pids;
  // One fl-client per client, or (--instances N) ceil(K/N) processes hosting N virtual clients each.
  const int per_process = std::max(1, g_instances);
  for (int first = 0, proc = 0; first < k; first += per_process, ++proc) {
    const int count = std::min(per_process, k - first);
    const std::string name = per_process == 1 ? ClientName(first) : fl::StrCat("e2e-", proc);
    std::vector<std::string> argv = {
        o.client_bin,
        fl::StrCat("--server=127.0.0.1:", port),
        "--name=" + name,
        o.train_ms > 0 ? fl::StrCat("--model=synthetic:", p, ":", o.train_ms) : fl::StrCat("--model=synthetic:", p),
        fl::StrCat("--client-index=", first),
        fl::StrCat("--num-clients=", k),
        "--device=cpu",
        "--link-kind=other",
        "--link-interface=lo",
        "--log-level=warn"};
    if (per_process > 1) argv.push_back(fl::StrCat("--instances=", count));
    if (security == Security::kPlaintext) {
      argv.push_back("--insecure");
    } else if (per_process > 1) {
      argv.push_back("--tls-ca=" + pki.ca_cert);
      // The folder of the client certificates: <name>-<i>.crt/.key, the instances' names.
      const std::string cert = pki.ClientCert(ClientName(first));
      argv.push_back("--tls-cert-dir=" + cert.substr(0, cert.rfind('/')));
    } else {
      argv.push_back("--tls-ca=" + pki.ca_cert);
      argv.push_back("--tls-cert=" + pki.ClientCert(name));
      argv.push_back("--tls-key=" + pki.ClientKey(name));
    }
    for (const auto& a : o.client_args) argv.push_back(a);
    auto c = StartChild(argv, fl::StrCat(dir, "/client-", proc, ".log"), o.client_env);
    if (!c.ok()) return c.status();
    client_pids.push_back(c->pid());
    clients.push_back(std::move(*c));
  }
  ProcessSampler sampler(server->pid(), client_pids, o.sample_ms, dir + "/rss.csv");
  absl::Status status = absl::OkStatus();
  while (!server->Poll().has_value()) {
    if (g_interrupted.load()) {
      status = absl::CancelledError("interrupted");
      break;
    }
    if (Seconds(Clock::now() - started) > o.timeout_s) {
      status = absl::DeadlineExceededError(fl::StrCat("fl-server still running after ", o.timeout_s, " s"));
      break;
    }
    for (size_t i = 0; i < clients.size(); ++i) {
      if (clients[i].Poll().has_value() && !clients[i].exit_status()->success() && status.ok()) {
        TailLog(fl::StrCat(dir, "/client-", i, ".log"));
        status = absl::InternalError(
            fl::StrCat("fl-client ", i, " ", clients[i].exit_status()->Describe(), " while fl-server was running"));
      }
    }
    if (!status.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  sampler.Stop();
  r->wall_s = Seconds(Clock::now() - started);
  if (!status.ok()) {
    TailLog(server_log);
    return status;  // the destructors stop fl-server and every fl-client
  }
  const fl::sys::ExitStatus& se = *server->exit_status();
  if (!se.success()) {
    TailLog(server_log);
    return absl::InternalError(fl::StrCat("fl-server ", se.Describe()));
  }
  r->server_cpu_s = se.cpu_s();
  r->server_user_s = se.user_s;
  r->server_sys_s = se.sys_s;
  r->server_rss_mb = static_cast<double>(std::max(se.max_rss_kb, sampler.server_peak_kb())) * 1024.0 / kMB;
  r->clients_rss_sum_peak_mb = static_cast<double>(sampler.clients_sum_peak_kb()) * 1024.0 / kMB;
  // Clients leave once told the experiment finished.
  std::vector<double> client_rss;
  int bad_clients = 0;
  r->clients_cpu_s = 0;
  for (auto& c : clients) {
    if (!c.Wait(std::chrono::seconds(30)).ok()) (void)c.Stop(std::chrono::seconds(2));
    if (const std::optional<fl::sys::ExitStatus>& e = c.exit_status(); e.has_value()) {
      r->clients_cpu_s += e->cpu_s();
      client_rss.push_back(static_cast<double>(e->max_rss_kb) * 1024.0 / kMB);
      if (!e->success()) ++bad_clients;
    }
  }
  if (bad_clients > 0) std::cerr << "e2e_round: warning: " << bad_clients << " fl-client(s) exited non-zero\n";
  if (!client_rss.empty()) {
    r->client_rss_mb_max = *std::max_element(client_rss.begin(), client_rss.end());
    r->client_rss_mb_mean = Mean(client_rss);
  }
  if (absl::Status s = ReadRecords(db, k, rounds, r); !s.ok()) return s;
  // The measured rounds run back to back: CPU per round = CPU per second x the mean measured round.
  double server_per_s = 0, clients_per_s = 0;
  if (!r->round_s.empty() &&
      sampler.CpuRate(r->measured_from_unix_ms, r->measured_to_unix_ms, &server_per_s, &clients_per_s)) {
    const double round_s = static_cast<double>(r->measured_to_unix_ms - r->measured_from_unix_ms) / 1e3 /
                           static_cast<double>(r->round_s.size());
    r->server_cpu_round_s = server_per_s * round_s;
    r->clients_cpu_round_s = clients_per_s * round_s;
  }
  return absl::OkStatus();
}

PointResult RunPoint(const Options& o, const Pki& pki, const std::vector<Security>& securities, int k, uint64_t p,
                     const std::string& dir) {
  PointResult r;
  r.k = k;
  r.p = p;
  r.rounds = o.rounds > 0 ? o.rounds : (p <= 5000000 ? 11 : 5);
  // Memory guard: K clients at their peak plus the server's budget must fit in what the machine has free.
  const double avail_mb = static_cast<double>(ProcKb("/proc/meminfo", "MemAvailable").value_or(0)) * 1024.0 / kMB;
  const double need_mb = k * ClientEstimateMb(p) + BudgetMb(p) + 2.0 * ModelMb(p);
  if (need_mb > o.memory_headroom * avail_mb && !o.force) {
    r.note = fl::StrCat("not run: ", k, " fl-client processes need about ", std::lround(k * ClientEstimateMb(p)),
                        " MB at their peak (", std::lround(ClientEstimateMb(p)), " MB each) plus the server; ",
                        std::lround(avail_mb), " MB available (--force runs it anyway)");
    return r;
  }
  // The raw-TCP repetitions are split around the federations (half before, half after), so that a change in
  // the machine's load during the point weighs on both sides of the ratio.
  const uint64_t bytes = kPayloadHeaderBytes + 4 * p;
  auto raw = [&](int n) -> bool {
    std::cerr << "e2e_round: K=" << k << " P=" << CountName(p) << ": raw TCP x" << n << "...\n";
    for (int i = 0; i < n && !g_interrupted.load(); ++i) {
      auto s = fl::bench::RawTcpRound(k, bytes, bytes);
      if (!s.ok()) {
        r.note = fl::StrCat("raw TCP failed: ", fl::ToStd(s.status().message()));
        return false;
      }
      r.raw_samples.push_back(*s);
    }
    if (!o.work_reference || n == 0) return true;
    // Its buffers (about 4 payloads per client) exist only while it runs, not during the federations.
    std::cerr << "e2e_round: K=" << k << " P=" << CountName(p) << ": raw TCP with the round's work x" << n << "...\n";
    auto work = fl::bench::NecessaryWork::Create(k, p);
    if (!work.ok()) {
      r.note = fl::StrCat("round work: ", fl::ToStd(work.status().message()));
      return false;
    }
    for (int i = 0; i < n && !g_interrupted.load(); ++i) {
      auto s = fl::bench::RawTcpRound(k, (*work)->payload_bytes(), (*work)->payload_bytes(), work->get());
      if (!s.ok()) {
        r.note = fl::StrCat("raw TCP with the round's work failed: ", fl::ToStd(s.status().message()));
        return false;
      }
      r.work_samples.push_back(*s);
    }
    // Give its memory back before the next fl-server is forked: a child's peak RSS (wait4) starts from this
    // process's resident set at the fork, and glibc keeps freed model-sized buffers mapped.
    work->reset();
    malloc_trim(0);
    return true;
  };
  const int before = (o.raw_repeats + 1) / 2;
  if (!raw(before)) return r;
  // With --repeats the securities alternate (plaintext, mTLS, plaintext, mTLS, ...), so that a change in the
  // neighbours' load weighs on both.
  for (int rep = 0; rep < o.repeats; ++rep) {
    for (Security security : securities) {
      const std::string fed_dir = fl::StrCat(dir, "/", security == Security::kPlaintext ? "plaintext" : "mtls",
                                             o.repeats > 1 ? "-" : "", o.repeats > 1 ? fl::StrCat(rep + 1) : "");
      std::cerr << "e2e_round: K=" << k << " P=" << CountName(p) << ": federation (" << SecurityName(security)
                << (o.repeats > 1 ? fl::StrCat(" #", rep + 1) : "") << "), " << r.rounds << " rounds...\n";
      FederationResult f;
      f.repeat = rep;
      if (absl::Status s = RunFederation(o, pki, security, fed_dir, k, p, r.rounds, &f); !s.ok()) {
        r.note =
            fl::StrCat("failed (", SecurityName(security), "): ", fl::ToStd(s.message()), " (logs in ", fed_dir, ")");
        return r;
      }
      r.federations.push_back(std::move(f));
    }
  }
  if (!raw(o.raw_repeats - before)) return r;
  r.raw_s = Median(r.raw_samples);
  r.work_s = Median(r.work_samples);
  r.ran = true;
  return r;
}

std::string Fixed(double v, int digits) {
  if (std::isnan(v)) return "–";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

std::string Ratio(double num, double den) { return den > 0 ? Fixed(num / den, 3) : "–"; }

void PrintTables(const std::vector<PointResult>& results, int repeats) {
  std::cout
      << "\n| K | P | security | model MB | rounds (measured) | round time s (median) | raw TCP s (median) | ratio | "
         "server CPU s | server peak RSS MB | RSS / model | budget MB | ratio ≤ 2 | RSS within budget |\n"
      << "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|:---:|\n";
  for (const auto& r : results) {
    const double model = ModelMb(r.p);
    if (!r.ran) {
      std::cout << "| " << r.k << " | " << CountName(r.p) << " | – | " << Fixed(model, 0) << " | " << r.rounds
                << " | – | " << Fixed(r.raw_s, 3) << " | – | – | – | – | " << Fixed(BudgetMb(r.p), 0) << " | – | – |\n";
      continue;
    }
    for (const auto& f : r.federations) {
      const double round = Median(f.round_s);
      const double ratio = round / r.raw_s;
      std::cout << "| " << r.k << " | " << CountName(r.p) << " | " << FederationName(f, repeats) << " | "
                << Fixed(model, 0) << " | " << r.rounds << " (" << f.round_s.size() << ") | " << Fixed(round, 3)
                << " | " << Fixed(r.raw_s, 3) << " | " << Fixed(ratio, 1) << " | " << Fixed(f.server_cpu_s, 1) << " | "
                << Fixed(f.server_rss_mb, 0) << " | " << Fixed(f.server_rss_mb / model, 1) << " | "
                << Fixed(BudgetMb(r.p), 0) << " | " << (ratio <= 2.0 ? "yes" : "**no**") << " | "
                << (f.server_rss_mb < BudgetMb(r.p) ? "yes" : "**no**") << " |\n";
    }
  }
  // The second reference: how much of the gap between a round and raw TCP is the round's own work with its bytes
  // (round_work.h), done by the product's kernels without gRPC, the engine or the records.
  bool work = false;
  for (const auto& r : results) work |= r.ran && !r.work_samples.empty();
  if (work) {
    std::cout
        << "\nThe round's work over raw TCP (the same exchange, each byte received where it is used, checksummed, "
           "checked, trained on, aggregated; then the commit's model work; round_work.h):\n\n"
        << "| K | P | raw TCP s | raw TCP + work s | work / raw | round s (median) | round / work | raw TCP + "
           "work samples s |\n"
        << "|---:|---:|---:|---:|---:|---:|---:|---|\n";
    for (const auto& r : results) {
      if (!r.ran || r.work_samples.empty()) continue;
      std::vector<double> rounds;
      for (const auto& f : r.federations) rounds.insert(rounds.end(), f.round_s.begin(), f.round_s.end());
      const double round = Median(rounds);
      std::string samples;
      for (double s : r.work_samples) samples += (samples.empty() ? "" : " ") + Fixed(s, 3);
      std::cout << "| " << r.k << " | " << CountName(r.p) << " | " << Fixed(r.raw_s, 3) << " | " << Fixed(r.work_s, 3)
                << " | " << Fixed(r.work_s / r.raw_s, 2) << " | " << Fixed(round, 3) << " | "
                << Fixed(round / r.work_s, 2) << " | " << samples << " |\n";
    }
  }
  // What mutual TLS costs: each point's mTLS federations against its plaintext ones, measured in the same run.
  // Round times: the median of all measured rounds of each security (pooled over --repeats); CPU: the mean per
  // federation; per repeat: the ratio of the medians of the federations run side by side.
  bool both = false;
  for (const auto& r : results)
    both |= r.ran && !r.All(Security::kPlaintext).empty() && !r.All(Security::kMtls).empty();
  if (both) {
    std::cout
        << "\nmTLS against plaintext (same run; ratio = mTLS / plaintext; goal: round time ratio ≤ 1.05):\n\n"
        << "| K | P | federations each | rounds each (measured) | round s plaintext | round s mTLS | round ratio | "
           "round ratio per repeat | server CPU s plaintext | server CPU s mTLS | server CPU ratio | clients CPU s "
           "plaintext | clients CPU s mTLS | clients CPU ratio | client downlink ms plaintext / mTLS | server "
           "uplink ms plaintext / mTLS | raw TCP s | round ≤ 1.05× |\n"
        << "|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|\n";
    for (const auto& r : results) {
      if (!r.ran) continue;
      const auto pl = r.All(Security::kPlaintext), tls = r.All(Security::kMtls);
      if (pl.empty() || tls.empty()) continue;
      struct Pooled {
        std::vector<double> rounds;
        double server_cpu = 0, clients_cpu = 0, downlink = 0, uplink = 0;
      };
      auto pool = [](const std::vector<const FederationResult*>& feds) {
        Pooled out;
        for (const FederationResult* f : feds) {
          out.rounds.insert(out.rounds.end(), f->round_s.begin(), f->round_s.end());
          out.server_cpu += f->server_cpu_s / static_cast<double>(feds.size());
          out.clients_cpu += f->clients_cpu_s / static_cast<double>(feds.size());
          out.downlink += f->downlink_ms / static_cast<double>(feds.size());
          out.uplink += f->uplink_server_ms / static_cast<double>(feds.size());
        }
        return out;
      };
      const Pooled a = pool(pl), b = pool(tls);
      std::string per_repeat;
      for (size_t i = 0; i < std::min(pl.size(), tls.size()); ++i) {
        per_repeat += (per_repeat.empty() ? "" : " ") + Ratio(Median(tls[i]->round_s), Median(pl[i]->round_s));
      }
      const double round_pl = Median(a.rounds), round_tls = Median(b.rounds);
      std::cout << "| " << r.k << " | " << CountName(r.p) << " | " << std::min(pl.size(), tls.size()) << " | "
                << r.rounds << " (" << r.rounds - 1 << ") | " << Fixed(round_pl, 3) << " | " << Fixed(round_tls, 3)
                << " | " << Ratio(round_tls, round_pl) << " | " << per_repeat << " | " << Fixed(a.server_cpu, 2)
                << " | " << Fixed(b.server_cpu, 2) << " | " << Ratio(b.server_cpu, a.server_cpu) << " | "
                << Fixed(a.clients_cpu, 2) << " | " << Fixed(b.clients_cpu, 2) << " | "
                << Ratio(b.clients_cpu, a.clients_cpu) << " | " << Fixed(a.downlink, 1) << " / " << Fixed(b.downlink, 1)
                << " | " << Fixed(a.uplink, 1) << " / " << Fixed(b.uplink, 1) << " | " << Fixed(r.raw_s, 3) << " | "
                << (round_tls <= 1.05 * round_pl ? "yes" : "**no**") << " |\n";
    }
  }
  std::cout << "\nDetails (means over the measured rounds; client phases are the clients' own timings, ms):\n\n"
            << "| K | P | security | round s mean | min–max | first round s | aggregation ms | client downlink ms | "
               "client train ms | server uplink ms | server CPU user/sys s | clients CPU s (sum) | client peak RSS MB "
               "(max) | all clients RSS MB (peak) | raw TCP samples s |\n"
            << "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n";
  for (const auto& r : results) {
    if (!r.ran) continue;
    std::string raw;
    for (double s : r.raw_samples) raw += (raw.empty() ? "" : " ") + Fixed(s, 3);
    for (const auto& f : r.federations) {
      const auto [mn, mx] = std::minmax_element(f.round_s.begin(), f.round_s.end());
      std::cout << "| " << r.k << " | " << CountName(r.p) << " | " << FederationName(f, repeats) << " | "
                << Fixed(Mean(f.round_s), 3) << " | " << Fixed(*mn, 3) << "–" << Fixed(*mx, 3) << " | "
                << Fixed(f.first_round_s, 3) << " | " << Fixed(f.aggregation_ms, 1) << " | " << Fixed(f.downlink_ms, 1)
                << " | " << Fixed(f.train_ms, 1) << " | " << Fixed(f.uplink_server_ms, 1) << " | "
                << Fixed(f.server_user_s, 1) << "/" << Fixed(f.server_sys_s, 1) << " | " << Fixed(f.clients_cpu_s, 1)
                << " | " << Fixed(f.client_rss_mb_max, 0) << " | " << Fixed(f.clients_rss_sum_peak_mb, 0) << " | "
                << raw << " |\n";
    }
  }
  // The issue's third goal, per round: CPU from /proc between the warm-up round's commit and the last commit, so
  // that start-up (processes, LibTorch-free as they are, Joins, the initial model) is not counted.
  std::cout
      << "\nCPU per measured round (sampled from /proc/<pid>/stat between the first and the last commit; goal: clients "
         "<= 2x the server):\n\n"
      << "| K | P | security | server CPU s / round | clients CPU s / round | clients / server | <= 2 |\n"
      << "|---:|---:|---|---:|---:|---:|:---:|\n";
  for (const auto& r : results) {
    if (!r.ran) continue;
    for (const auto& f : r.federations) {
      const double ratio = f.clients_cpu_round_s / f.server_cpu_round_s;
      std::cout << "| " << r.k << " | " << CountName(r.p) << " | " << FederationName(f, repeats) << " | "
                << Fixed(f.server_cpu_round_s, 3) << " | " << Fixed(f.clients_cpu_round_s, 3) << " | "
                << Fixed(ratio, 2) << " | " << (std::isfinite(ratio) ? (ratio <= 2.0 ? "yes" : "**no**") : "–")
                << " |\n";
    }
  }
  bool notes = false;
  for (const auto& r : results) {
    if (r.note.empty()) continue;
    if (!notes) std::cout << "\n";
    notes = true;
    std::cout << "- K=" << r.k << ", P=" << CountName(r.p) << ": " << r.note << "\n";
  }
}

void PrintMachine() {
  utsname u{};
  uname(&u);
  std::string cpu;
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      cpu = line.substr(line.find(':') + 2);
      break;
    }
  }
  const double total = static_cast<double>(ProcKb("/proc/meminfo", "MemTotal").value_or(0)) * 1024.0 / kMB;
  const double avail = static_cast<double>(ProcKb("/proc/meminfo", "MemAvailable").value_or(0)) * 1024.0 / kMB;
  std::cout << "Machine: " << cpu << ", " << std::thread::hardware_concurrency() << " CPUs online, "
            << Fixed(total / 1e3, 1) << " GB RAM (" << Fixed(avail / 1e3, 1) << " GB available at start), " << u.sysname
            << " " << u.release << " " << u.machine << "\n";
}

std::string LoadAverage() {
  auto text = ReadFile("/proc/loadavg");
  if (!text.ok()) return "?";
  std::string t = *text;
  // "0.52 0.58 0.59 1/467 12345": the three averages.
  size_t cut = 0;
  for (int spaces = 0; cut < t.size() && spaces < 3; ++cut) spaces += t[cut] == ' ';
  return t.substr(0, cut > 0 ? cut - 1 : 0);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "e2e_round: end-to-end federated rounds (fl-server + K fl-client processes, synthetic model, "
      "loopback) against the raw-TCP limit of the same bytes"};
  Options o;
  app.add_option("--clients", o.clients, "Numbers of clients K (one point per value)")->capture_default_str();
  app.add_option("--params", o.params, "Numbers of parameters P (1M, 25M, 250k, ...)")->capture_default_str();
  app.add_option("--rounds", o.rounds, "Rounds per point, the first one is warm-up; 0: 11 for P <= 5M, else 5")
      ->capture_default_str();
  app.add_option("--raw-repeats", o.raw_repeats, "Raw-TCP repetitions per point (median reported)")
      ->capture_default_str();
  app.add_flag("!--no-work", o.work_reference,
               "Skip the second reference: raw TCP doing the round's work with the bytes (checksums, checks, the "
               "synthetic training pass, the update, aggregation, the commit's model work)");
  app.add_option("--work-dir", o.work_dir, "Where logs, records and RSS timelines go (default: a fresh /tmp dir)");
  app.add_flag("--keep", o.keep, "Keep the work directory (kept anyway when a point fails)");
  app.add_flag("--force", o.force, "Run points that the memory guard would skip");
  app.add_option("--memory-headroom", o.memory_headroom, "Fraction of MemAvailable a point may plan to use")
      ->capture_default_str();
  app.add_option("--round-deadline-ms", o.round_deadline_ms, "fl-server --round-deadline-ms")->capture_default_str();
  app.add_option("--timeout-s", o.timeout_s, "Give up on a point after this long")->capture_default_str();
  app.add_option("--server-arg", o.server_args,
                 "Extra fl-server argument (repeatable), e.g. --server-arg=--upload-slots=4");
  app.add_option("--client-arg", o.client_args, "Extra fl-client argument (repeatable)");
  app.add_option("--server-env", o.server_env,
                 "NAME=VALUE added to fl-server's environment (repeatable), "
                 "e.g. --server-env=MALLOC_ARENA_MAX=2");
  app.add_option("--client-env", o.client_env,
                 "NAME=VALUE added to every fl-client's environment (repeatable), e.g. "
                 "--client-env=OPENSSL_CONF=/path/to/openssl.cnf");
  app.add_option("--security", o.security,
                 "How the federation's channels are secured: plaintext (--insecure), mtls (a throwaway CA in the "
                 "work dir, fl-server --tls-*, fl-client --tls-*) or both (plaintext then mTLS at every point, "
                 "compared in a table of their own)")
      ->check(CLI::IsMember({"plaintext", "mtls", "both"}))
      ->capture_default_str();
  app.add_option("--repeats", o.repeats,
                 "Federations per security per point, alternated (plaintext, mTLS, plaintext, ...); the mTLS table "
                 "pools their measured rounds")
      ->check(CLI::Range(1, 20))
      ->capture_default_str();
  app.add_option("--train-ms", o.train_ms, "Simulated training time per round (synthetic:P:ms); 0: none")
      ->capture_default_str();
  app.add_option("--sample-ms", o.sample_ms, "RSS sampling period")->capture_default_str();
  app.add_option("--server-bin", o.server_bin, "fl-server binary")->capture_default_str();
  app.add_option("--client-bin", o.client_bin, "fl-client binary")->capture_default_str();
  app.add_option("--instances", o.instances,
                 "Clients per fl-client process (fl-client --instances: virtual clients sharing one process); 1: a "
                 "process per client")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (o.instances < 1) {
    std::cerr << "e2e_round: --instances must be at least 1 (clients per fl-client process), got " << o.instances
              << "\n";
    return 2;
  }
  g_instances = o.instances;

  if (o.rounds == 1 || o.rounds < 0 || o.raw_repeats < 1 || o.sample_ms < 1 || o.clients.empty()) {
    std::cerr << "e2e_round: --rounds must be 0 or at least 2 (the first is warm-up), --raw-repeats and "
                 "--sample-ms at least 1\n";
    return 2;
  }
  for (int k : o.clients) {
    if (k < 1) {
      std::cerr << "e2e_round: --clients must be positive\n";
      return 2;
    }
  }
  std::vector<uint64_t> params;
  for (const auto& s : o.params) {
    auto p = ParseCount(s);
    if (!p.ok()) {
      std::cerr << "e2e_round: --params: " << p.status().message() << "\n";
      return 2;
    }
    params.push_back(*p);
  }
  for (const std::string& bin : {o.server_bin, o.client_bin}) {
    if (access(bin.c_str(), X_OK) != 0) {
      std::cerr << "e2e_round: " << bin << " is not executable (build fl-server and fl-client)\n";
      return 2;
    }
  }
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  bool made_dir = false;
  if (o.work_dir.empty()) {
    char tmpl[] = "/tmp/e2e_round.XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
      std::cerr << "e2e_round: mkdtemp: " << std::strerror(errno) << "\n";
      return 2;
    }
    o.work_dir = tmpl;
    made_dir = true;
  }
  std::filesystem::create_directories(o.work_dir);

  std::vector<Security> securities;
  if (o.security != "mtls") securities.push_back(Security::kPlaintext);
  if (o.security != "plaintext") securities.push_back(Security::kMtls);
  Pki pki;
  if (o.security != "plaintext") {
    auto provisioned = ProvisionPki(o.work_dir + "/pki", *std::max_element(o.clients.begin(), o.clients.end()));
    if (!provisioned.ok()) {
      std::cerr << "e2e_round: provisioning the throwaway CA in " << o.work_dir << "/pki for --security=" << o.security
                << ": " << provisioned.status().message() << "\n";
      return 2;
    }
    pki = *std::move(provisioned);
  }

  PrintMachine();
  std::cout << "command:";
  for (int i = 0; i < argc; ++i) std::cout << " " << argv[i];
  std::cout << "\nload average at start: " << LoadAverage() << "\n";
  std::cout << "fl-server: " << o.server_bin << "\nfl-client: " << o.client_bin << "\nwork dir: " << o.work_dir << "\n";
  std::vector<PointResult> results;
  bool failed = false;
  for (int k : o.clients) {
    for (uint64_t p : params) {
      if (g_interrupted.load()) break;
      const std::string dir = fl::StrCat(o.work_dir, "/k", k, "-p", CountName(p));
      PointResult r = RunPoint(o, pki, securities, k, p, dir);
      if (r.ran) {
        for (const auto& f : r.federations) {
          std::cerr << "e2e_round: K=" << k << " P=" << CountName(p) << " " << FederationName(f, o.repeats)
                    << ": round " << Fixed(Median(f.round_s), 3) << " s, raw TCP " << Fixed(r.raw_s, 3)
                    << " s, server CPU " << Fixed(f.server_cpu_s, 1) << " s, server RSS " << Fixed(f.server_rss_mb, 0)
                    << " MB\n";
        }
      } else {
        std::cerr << "e2e_round: K=" << k << " P=" << CountName(p) << ": " << r.note << "\n";
        if (r.note.rfind("not run", 0) != 0) failed = true;
      }
      results.push_back(std::move(r));
    }
  }
  PrintTables(results, o.repeats);
  std::cout << "\nload average at end: " << LoadAverage() << "\n";
  if (made_dir && !o.keep && !failed) {
    std::error_code ec;
    std::filesystem::remove_all(o.work_dir, ec);
  }
  if (g_interrupted.load()) return 130;
  return failed ? 1 : 0;
}
