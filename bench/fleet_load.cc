// fleet_load: one fl-server process (plaintext, --insecure) against N emulated clients of one load-generator
// process (fleet_load.h) speaking the real protocol with a tiny model (docs/performance.md, "Fleets").
//
//   fleet_load --sessions 1000,10000 --mode idle|sampled|all [--sample 100] [--rounds 2]
//
// idle:    no round starts (--min-available-clients above N): the join storm (N Joins spread over
//          --join-window-ms), server RSS before and after, memory per idle session, server CPU per second over
//          --idle-s of heartbeats and clock pings, and sessions the server ended (evictions: must be 0).
// sampled: rounds that sample --sample of the N clients (--fraction-fit = sample / N); time per round.
// all:     one round with every client.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/status/status.h"
#include "fl/core/str_cat.h"
#include "fl/sys/process.h"
#include "fleet_load.h"

namespace {

double Seconds(int64_t ns) { return static_cast<double>(ns) / 1e9; }

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Resident set (KiB) and CPU seconds (user + system) of a process, from /proc.
int64_t RssKb(pid_t pid) {
  std::ifstream in(fl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atoll(line.c_str() + 6);
  }
  return 0;
}
double CpuSeconds(pid_t pid) {
  std::ifstream in(fl::StrCat("/proc/", pid, "/stat"));
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = all.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(all.substr(close + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14 || i == 15) ticks += std::atof(field.c_str());
  }
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

struct Options {
  std::string server_bin = FL_SERVER_PATH;
  std::vector<uint32_t> sessions = {1000};
  std::string mode = "idle";
  uint32_t sample = 100;
  uint32_t rounds = 2;
  uint32_t join_window_ms = 1000;
  uint32_t heartbeat_ms = 5000;
  uint32_t idle_s = 20;
  uint32_t channels = 8;
  uint32_t workers = 2;
  std::string dir = "/tmp/fleet_load";
  std::vector<std::string> server_args;
};

absl::Status RunOne(const Options& o, uint32_t n) {
  const std::string dir = fl::StrCat(o.dir, "/", o.mode, "-", n);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string port_file = dir + "/port";
  std::vector<std::string> argv = {o.server_bin,
                                   "--insecure",
                                   "--listen=127.0.0.1:0",
                                   "--port-file=" + port_file,
                                   "--db=" + dir + "/records.db",
                                   "--log-level=warn",
                                   "--evaluate-every=0",
                                   fl::StrCat("--heartbeat-interval-ms=", o.heartbeat_ms),
                                   "--max-round-attempts=1",
                                   "--round-deadline-ms=600000",
                                   "--local-steps=1"};
  uint64_t expect_updates = 0;
  if (o.mode == "idle") {
    argv.push_back(fl::StrCat("--min-available-clients=", n + 1));
    argv.push_back("--rounds=1");
  } else if (o.mode == "sampled") {
    argv.push_back(fl::StrCat("--min-available-clients=", n));
    argv.push_back(fl::StrCat("--fraction-fit=", static_cast<double>(o.sample) / n));
    argv.push_back(fl::StrCat("--min-fit-clients=", o.sample));
    argv.push_back(fl::StrCat("--rounds=", o.rounds));
    expect_updates = uint64_t{o.sample} * o.rounds;
  } else if (o.mode == "all") {
    argv.push_back(fl::StrCat("--min-available-clients=", n));
    argv.push_back("--fraction-fit=1");
    argv.push_back(fl::StrCat("--min-fit-clients=", n));
    argv.push_back("--rounds=1");
    expect_updates = n;
  } else {
    return absl::InvalidArgumentError(fl::StrCat("--mode ", o.mode, ": expected idle, sampled or all"));
  }
  for (const auto& a : o.server_args) argv.push_back(a);
  fl::sys::SpawnOptions so;
  so.argv = argv;
  so.stdout_to = fl::sys::Stdio::File(dir + "/server.log", true);
  so.stderr_to = fl::sys::Stdio::ToStdout();
  so.death_signal = SIGKILL;
  so.stop_grace = std::chrono::milliseconds(3000);
  auto server = fl::sys::Child::Spawn(so);
  if (!server.ok()) return server.status();
  int port = 0;
  for (int i = 0; i < 6000 && port == 0; ++i) {
    if (server->Poll().has_value()) return absl::InternalError("fl-server exited before listening; see " + dir);
    std::ifstream in(port_file);
    in >> port;
    if (port == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (port == 0) return absl::DeadlineExceededError("fl-server did not listen in 60 s");
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const pid_t pid = server->pid();
  const int64_t rss0 = RssKb(pid);
  const double cpu0 = CpuSeconds(pid);

  fl::bench::FleetOptions fo;
  fo.address = fl::StrCat("127.0.0.1:", port);
  fo.sessions = n;
  fo.join_window_ms = o.join_window_ms;
  fo.channels = o.channels;
  fo.workers = o.workers;
  fl::bench::Fleet fleet(fo);
  if (absl::Status s = fleet.Start(); !s.ok()) return s;
  absl::Status open = fleet.WaitAllOpen(600'000);
  const fl::bench::FleetStats joined = fleet.stats();
  const double cpu_join = CpuSeconds(pid) - cpu0;
  std::printf("N=%u mode=%s: %s\n", n, o.mode.c_str(),
              open.ok() ? "all sessions open" : std::string(open.message()).c_str());
  std::printf(
      "  join storm: %lu admitted in %.2f s (window %u ms), all sessions open at %.2f s; %lu Joins retried "
      "after a retry-after, %lu failed; server CPU %.2f s\n",
      joined.admitted, Seconds(joined.last_admitted_ns - joined.first_join_ns), o.join_window_ms,
      Seconds(joined.last_welcome_ns - joined.first_join_ns), joined.join_retried, joined.join_failed, cpu_join);
  if (o.mode == "idle") {
    const double cpu1 = CpuSeconds(pid);
    const int64_t t1 = NowNs();
    std::this_thread::sleep_for(std::chrono::seconds(o.idle_s));
    const double cpu_idle = (CpuSeconds(pid) - cpu1) / Seconds(NowNs() - t1);
    const int64_t rss1 = RssKb(pid);
    const fl::bench::FleetStats s = fleet.stats();
    std::printf(
        "  idle: server RSS %.1f MB at 0 sessions, %.1f MB at %lu; %.1f KB per idle session; server CPU "
        "%.3f s/s over %u s (%lu heartbeats, %lu pongs); sessions ended by the server: %lu\n",
        rss0 / 1024.0, rss1 / 1024.0, s.sessions_open, (rss1 - rss0) / static_cast<double>(n), cpu_idle, o.idle_s,
        s.heartbeats, s.pongs, s.sessions_ended);
  } else {
    const int64_t t1 = NowNs();
    const double cpu1 = CpuSeconds(pid);
    absl::Status done = fleet.WaitUpdates(expect_updates, 600'000);
    const double wall = Seconds(NowNs() - t1);
    const fl::bench::FleetStats s = fleet.stats();
    const uint32_t rounds = o.mode == "sampled" ? o.rounds : 1;
    std::printf(
        "  %s: %u round(s) of %lu clients in %.2f s (%.2f s a round; server CPU %.2f s); %lu accepted, "
        "%lu not; server RSS %.1f MB; sessions ended by the server: %lu%s\n",
        o.mode.c_str(), rounds, expect_updates / rounds, wall, wall / rounds, CpuSeconds(pid) - cpu1,
        s.updates_accepted, s.updates_other, RssKb(pid) / 1024.0, s.sessions_ended,
        done.ok() ? "" : fl::StrCat(" (", done.message(), ")").c_str());
  }
  std::fflush(stdout);
  fleet.Stop();
  (void)server->Stop(std::chrono::milliseconds(3000));
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app("fleet_load: N emulated clients (one process, the real protocol) against one fl-server");
  app.add_option("--server-bin", o.server_bin, "fl-server binary")->capture_default_str();
  app.add_option("--sessions", o.sessions, "Numbers of clients, one run each")->delimiter(',')->capture_default_str();
  app.add_option("--mode", o.mode, "idle, sampled or all")->capture_default_str();
  app.add_option("--sample", o.sample, "Clients a sampled round takes")->capture_default_str();
  app.add_option("--rounds", o.rounds, "Rounds of the sampled mode")->capture_default_str();
  app.add_option("--join-window-ms", o.join_window_ms, "The Joins are spread over this window")->capture_default_str();
  app.add_option("--heartbeat-ms", o.heartbeat_ms, "fl-server's --heartbeat-interval-ms")->capture_default_str();
  app.add_option("--idle-s", o.idle_s, "Seconds of idle sessions measured (idle mode)")->capture_default_str();
  app.add_option("--channels", o.channels, "HTTP/2 connections of the fleet")->capture_default_str();
  app.add_option("--workers", o.workers, "The fleet's transfer threads")->capture_default_str();
  app.add_option("--dir", o.dir, "Work directory (server logs, records)")->capture_default_str();
  app.add_option("--server-arg", o.server_args, "Extra fl-server argument (repeatable)");
  CLI11_PARSE(app, argc, argv);
  for (uint32_t n : o.sessions) {
    if (absl::Status s = RunOne(o, n); !s.ok()) {
      std::fprintf(stderr, "fleet_load: N=%u: %s\n", n, std::string(s.message()).c_str());
      return 1;
    }
  }
  return 0;
}
