// fl-link: run, inspect and calibrate emulated links by hand (fl-experiment uses the same library).
//
//   fl-link check PROFILE...                          validate profiles and print what they resolve to
//   fl-link relay PROFILE --target H:P [--listen H:P] userspace shaping relay until Ctrl-C
//   fl-link netns PROFILE --target H:P -- CMD ARGS    kernel link; CMD runs inside its namespace ({target}
//                                                     in ARGS becomes the address to connect to)
//   fl-link packet PROFILE --port P -- CMD ARGS       packet backend; CMD runs inside its namespace and its
//                                                     own TCP crosses the link to a server on this host's
//                                                     0.0.0.0:P ({target} becomes the link's address:P)
//   fl-link cleanup                                   remove namespaces/links left by crashed runs
//   fl-link calibrate PROFILE... [--backend userspace|kernel|packet|both|all] [--write]
//   fl-link fit-trace FILE.mahi [--interval-ms 1000] [--source TEXT]
//                                                     fit a rate process to a measured trace (a profile's
//                                                     rate_process: block) and compare a generated trace
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "fl/core/log_format.h"
#include "fl/core/str_cat.h"
#include "fl/emulation/calibrate.h"
#include "fl/emulation/kernel_link.h"
#include "fl/emulation/link_profile.h"
#include "fl/emulation/packet_network.h"
#include "fl/emulation/rate_process.h"
#include "fl/emulation/shaping_relay.h"
#include "fl/sys/process.h"

namespace fe = fl::emulation;

namespace {

std::string DescribeDirection(const fe::LinkDirection& d) {
  std::string s = d.has_trace ? fl::StrCat("trace ", d.trace.path, " (mean ", fe::FormatRate(d.trace.MeanRateBps()),
                                           ", period ", d.trace.period_ms, " ms)")
                              : fe::FormatRate(d.rate_bps);
  return fl::StrCat(s, ", delay ", d.delay_ms, " ms +- ", d.jitter_ms, " ms, loss ", d.loss, ", queue ",
                    d.EffectiveQueueLimit(), " B");
}

// Blocks SIGINT/SIGTERM in every thread (call before starting any) and waits for one of them.
sigset_t BlockStopSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return set;
}

int Check(const std::vector<std::string>& paths) {
  int rc = 0;
  for (const auto& p : paths) {
    auto profile = fe::LoadLinkProfile(p);
    if (!profile.ok()) {
      std::cerr << profile.status().message() << "\n";
      rc = 1;
      continue;
    }
    std::cout << profile->name << " (" << p << ")\n  uplink:   " << DescribeDirection(profile->uplink)
              << "\n  downlink: " << DescribeDirection(profile->downlink) << "\n";
  }
  return rc;
}

int Relay(const std::string& path, const std::string& listen, const std::string& target, uint64_t seed) {
  auto profile = fe::LoadLinkProfile(path);
  if (!profile.ok()) {
    std::cerr << profile.status().message() << "\n";
    return 1;
  }
  const sigset_t set = BlockStopSignals();
  fe::RelayOptions o;
  o.listen_addr = listen;
  o.target_addr = target;
  o.uplink = profile->uplink;
  o.downlink = profile->downlink;
  o.seed = seed;
  o.name = profile->name;
  auto relay = fe::ShapingRelay::Start(o);
  if (!relay.ok()) {
    std::cerr << relay.status().message() << "\n";
    return 1;
  }
  std::cout << "relay " << profile->name << ": clients connect to " << (*relay)->address() << " -> " << target
            << " (Ctrl-C stops)" << std::endl;
  int sig = 0;
  sigwait(&set, &sig);
  (*relay)->Stop();
  const auto s = (*relay)->stats();
  std::cout << "forwarded " << s.uplink_bytes << " bytes up, " << s.downlink_bytes << " bytes down over "
            << s.connections_accepted << " connections (" << s.connect_failures << " failed to reach the target)\n";
  return 0;
}

void ReplaceTarget(std::vector<std::string>& command, const std::string& target) {
  for (auto& a : command) {
    for (size_t p = a.find("{target}"); p != std::string::npos; p = a.find("{target}")) a.replace(p, 8, target);
  }
}

// Runs `argv` (already wrapped to enter a namespace) in fl-link's own process group, with the terminal's stdin:
// an interactive command (a shell in the namespace) stays in the terminal's foreground group. SIGINT/SIGTERM sent
// to fl-link itself (blocked in every thread, `set`) are forwarded to it. Returns its exit code.
int RunForwardingSignals(const sigset_t& set, std::vector<std::string> argv, const std::string& target) {
  fl::sys::SpawnOptions spawn;
  spawn.argv = std::move(argv);
  spawn.env = {fl::StrCat("FL_LINK_TARGET=", target)};
  spawn.stdin_from = fl::sys::Stdio::Inherit();
  spawn.new_process_group = false;
  absl::StatusOr<fl::sys::Child> child = fl::sys::Child::Spawn(spawn);
  if (!child.ok()) {
    std::cerr << child.status().message() << "\n";
    return 127;
  }
  while (!child->Poll().has_value()) {
    const timespec tick{0, 50 * 1000 * 1000};
    const int sig = sigtimedwait(&set, nullptr, &tick);
    if (sig > 0) (void)child->Signal(sig);
  }
  return child->exit_status()->code;
}

// Loads the profile of a subcommand that runs `command` inside a namespace: 0, or the exit code after saying why
// it cannot.
int LoadForCommand(const std::string& path, const std::vector<std::string>& command, fe::LinkProfile* profile) {
  auto loaded = fe::LoadLinkProfile(path);
  if (!loaded.ok()) {
    std::cerr << loaded.status().message() << "\n";
    return 1;
  }
  if (command.empty()) {
    std::cerr << "give the command to run inside the namespace after --\n";
    return 2;
  }
  *profile = *std::move(loaded);
  return 0;
}

int Netns(const std::string& path, const std::string& target, uint64_t seed, std::vector<std::string> command) {
  fe::LinkProfile profile;
  if (const int rc = LoadForCommand(path, command, &profile); rc != 0) return rc;
  const sigset_t set = BlockStopSignals();
  fe::KernelLinkOptions o;
  o.profile = profile;
  o.target_addr = target;
  o.seed = seed;
  auto link = fe::KernelLink::Create(o);
  if (!link.ok()) {
    std::cerr << link.status().message() << "\n";
    return 1;
  }
  const std::string client_target = (*link)->client_target();
  ReplaceTarget(command, client_target);
  std::cout << "namespace " << (*link)->netns() << ": connect to " << client_target << " -> " << target << std::endl;
  const int rc = RunForwardingSignals(set, (*link)->WrapCommand(command), client_target);
  const auto stats = (*link)->relay_stats();
  if (auto s = (*link)->Destroy(); !s.ok()) std::cerr << "cleanup: " << s.message() << "\n";
  std::cout << "forwarded " << stats.uplink_bytes << " bytes up, " << stats.downlink_bytes << " bytes down\n";
  return rc;
}

// The packet backend: the command's own kernel TCP crosses the emulated link to a server on this host that
// listens on 0.0.0.0:port (or the link's host address); nothing relays it.
int Packet(const std::string& path, int port, const std::string& congestion, uint64_t seed,
           std::vector<std::string> command) {
  fe::LinkProfile profile;
  if (const int rc = LoadForCommand(path, command, &profile); rc != 0) return rc;
  const sigset_t set = BlockStopSignals();
  auto ns = fe::PacketNamespace::Create({.label = profile.name, .tcp_congestion = congestion, .seed = seed});
  absl::Status s = ns.ok() ? (*ns)->AddLink(profile).status() : ns.status();
  if (s.ok()) s = (*ns)->Start();
  if (!s.ok()) {
    std::cerr << s.message() << "\n";
    return 1;
  }
  const std::string client_target = fl::StrCat((*ns)->host_ip(0), ":", port);
  ReplaceTarget(command, client_target);
  std::cout << "namespace " << (*ns)->netns() << ": connect to " << client_target << " (packet link "
            << (*ns)->netns_ip(0) << " <-> " << (*ns)->host_ip(0) << ")" << std::endl;
  const int rc = RunForwardingSignals(set, (*ns)->WrapCommand(command), client_target);
  for (const bool up : {true, false}) {
    const fe::PacketLinkStats st = (*ns)->stats(0, up);
    std::cout << (up ? "uplink:   " : "downlink: ") << st.delivered << " packets (" << st.delivered_bytes
              << " bytes) delivered of " << st.offered << "; " << st.lost << " lost, " << st.dropped_queue
              << " dropped by the queue; the emulator late by up to " << st.max_late_ns / 1000 << " us ("
              << st.late_over_1ms << " packets over 1 ms)\n";
  }
  if (auto d = (*ns)->Destroy(); !d.ok()) std::cerr << "cleanup: " << d.message() << "\n";
  return rc;
}

int Calibrate(const std::vector<std::string>& paths, const std::string& backend, bool write, double seconds, int pings,
              const fe::CalibrationOptions& physics) {
  auto backends = fe::ParseBackends(backend);
  if (!backends.ok()) {
    std::cerr << "--backend: " << backends.status().message() << "\n";
    return 2;
  }
  std::vector<fe::CalibrationResult> all;
  int rc = 0;
  for (const auto& p : paths) {
    auto profile = fe::LoadLinkProfile(p);
    if (!profile.ok()) {
      std::cerr << profile.status().message() << "\n";
      return 1;
    }
    std::vector<fe::CalibrationResult> mine;
    for (const fe::Backend b : *backends) {
      fe::CalibrationOptions o = physics;
      o.backend = b;
      o.bulk_seconds = seconds;
      o.pings = pings;
      auto r = fe::Calibrate(*profile, o);
      if (!r.ok()) {
        std::cerr << profile->name << " (" << fe::BackendName(b) << "): " << r.status().message() << "\n";
        rc = 1;
        continue;
      }
      std::cerr << fe::CalibrationTable({*r});
      mine.push_back(*r);
    }
    if (write && !mine.empty()) {
      auto out = fe::WriteCalibrationYaml(p, mine);
      if (!out.ok()) {
        std::cerr << out.status().message() << "\n";
        rc = 1;
      } else {
        std::cerr << "wrote " << out->string() << "\n";
      }
    }
    all.insert(all.end(), mine.begin(), mine.end());
  }
  std::cout << fe::CalibrationTable(all);
  if (const std::string t = fe::PhysicsTable(all); !t.empty()) std::cout << "\n" << t;
  return rc;
}

std::string StatsRow(const std::string& label, const fe::RateStats& s) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), "#   %-22s %9zu %9.2f %9.2f %9.2f %9.2f %6.3f\n", label.c_str(), s.intervals,
                s.mean_mbit, s.p5_mbit, s.median_mbit, s.p95_mbit, s.lag1);
  return buf;
}

// fit-trace: the rate_process block a profile ships, and the statistics of the source and of a trace generated
// from the fit (the same figures ../shared/traces/README.md tabulates).
int FitTrace(const std::string& path, uint64_t interval_ms, std::string source) {
  if (path.ends_with(".gz")) {
    std::cerr << path << ": a gzip-compressed trace; decompress it first (gunzip -k " << path
              << ") and fit the plain file\n";
    return 1;
  }
  absl::StatusOr<fe::MahimahiTrace> trace = fe::LoadMahimahiTrace(path);
  if (!trace.ok()) {
    std::cerr << trace.status().message() << "\n";
    return 1;
  }
  if (source.empty()) source = fl::StrCat(path, " (fitted)");
  absl::StatusOr<fe::RateProcess> process = fe::FitRateProcess(*trace, interval_ms, source);
  if (!process.ok()) {
    std::cerr << process.status().message() << "\n";
    return 1;
  }
  absl::StatusOr<fe::MahimahiTrace> generated = fe::GenerateTrace(*process);
  if (!generated.ok()) {
    std::cerr << generated.status().message() << "\n";
    return 1;
  }
  absl::StatusOr<std::vector<double>> source_rates = fe::IntervalRatesMbit(*trace, interval_ms);
  absl::StatusOr<std::vector<double>> generated_rates = fe::IntervalRatesMbit(*generated, interval_ms);
  if (!source_rates.ok() || !generated_rates.ok()) {
    std::cerr << (source_rates.ok() ? generated_rates.status() : source_rates.status()).message() << "\n";
    return 1;
  }
  std::cout << "# fl-link fit-trace " << path << " --interval-ms " << interval_ms << "\n"
            << "rate_process: " << fe::RateProcessToYamlFlow(*process) << "\n"
            << "# per-interval rates in Mbit/s (" << interval_ms
            << " ms intervals; quantiles_mbit at p0, p2.5, ..., p100)\n"
            << "#   " << std::string(22, ' ') << " intervals      mean        p5    median       p95   lag1\n"
            << StatsRow("source", fe::ComputeRateStats(*source_rates))
            << StatsRow(fl::StrCat("generated (seed ", process->seed, ")"), fe::ComputeRateStats(*generated_rates));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  spdlog::set_default_logger(spdlog::stderr_color_mt("fl-link"));
  CLI::App app{"fl-link: emulated network links (profiles, shaping relay, kernel namespaces, calibration)"};
  app.require_subcommand(1);
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error");

  std::vector<std::string> check_paths;
  auto* check = app.add_subcommand("check", "validate link profiles and print what they resolve to");
  check->add_option("profiles", check_paths, "profile YAML files")->required()->check(CLI::ExistingFile);

  std::string relay_path, relay_listen = "127.0.0.1:0", relay_target;
  uint64_t seed = 1;
  auto* relay = app.add_subcommand("relay", "run the userspace shaping relay for one profile until Ctrl-C");
  relay->add_option("profile", relay_path, "profile YAML file")->required()->check(CLI::ExistingFile);
  relay->add_option("--listen", relay_listen, "host:port to accept clients on (port 0: any free)");
  relay->add_option("--target", relay_target, "host:port to forward to (the server)")->required();
  relay->add_option("--seed", seed, "jitter seed");

  std::string ns_path, ns_target;
  std::vector<std::string> ns_command;
  auto* netns = app.add_subcommand(
      "netns", "kernel backend (root): make a namespace with the profile's link and run a command inside it");
  netns->add_option("profile", ns_path, "profile YAML file")->required()->check(CLI::ExistingFile);
  netns->add_option("--target", ns_target, "host:port the link forwards to (the server)")->required();
  netns->add_option("--seed", seed, "jitter seed");
  netns
      ->add_option("command", ns_command,
                   "command and arguments (after --); {target} is replaced by the "
                   "address to connect to")
      ->required();

  std::string packet_path, congestion;
  int packet_port = 0;
  std::vector<std::string> packet_command;
  auto* packet = app.add_subcommand(
      "packet", "packet backend (root): make a namespace whose traffic crosses the profile's packet-level link");
  packet->add_option("profile", packet_path, "profile YAML file")->required()->check(CLI::ExistingFile);
  packet->add_option("--port", packet_port, "the server's port on this host ({target} = link address:port)")
      ->required()
      ->check(CLI::Range(1, 65535));
  packet->add_option("--congestion", congestion, "TCP congestion control inside the namespace (cubic, bbr, reno)");
  packet->add_option("--seed", seed, "loss and jitter seed");
  packet
      ->add_option("command", packet_command,
                   "command and arguments (after --); {target} is replaced by the address to connect to")
      ->required();

  auto* cleanup = app.add_subcommand("cleanup", "remove namespaces and links left behind by crashed runs (root)");

  std::vector<std::string> cal_paths;
  std::string backend = "userspace";
  bool write = false;
  double seconds = 2.5;
  int pings = 100;
  auto* cal = app.add_subcommand("calibrate", "measure what each profile's emulated link delivers");
  cal->add_option("profiles", cal_paths, "profile YAML files")->required()->check(CLI::ExistingFile);
  cal->add_option("--backend", backend, "userspace, kernel, packet, both (userspace and kernel) or all")
      ->default_val("userspace");
  fe::CalibrationOptions physics;
  cal->add_option("--loss-packets", physics.loss_packets,
                  "packet backend: UDP datagrams per direction for the loss check (0: skip)")
      ->check(CLI::Range(int64_t{0}, int64_t{10'000'000}));
  cal->add_option("--mathis-loss", physics.mathis_loss,
                  "packet backend: random loss of the TCP-under-loss check (0: skip)")
      ->check(CLI::Range(0.0, 0.5));
  cal->add_option("--mathis-seconds", physics.mathis_seconds, "its transfer")->check(CLI::Range(1.0, 600.0));
  cal->add_flag("--write", write, "write <profile>.calibration.yaml beside each profile");
  cal->add_option("--seconds", seconds, "bulk transfer length per direction")->check(CLI::Range(0.2, 60.0));
  cal->add_option("--pings", pings, "round trips to measure")->check(CLI::Range(1, 10000));

  std::string fit_path, fit_source;
  uint64_t fit_interval_ms = 1000;
  auto* fit = app.add_subcommand("fit-trace", "fit a rate process (a profile's rate_process: block) to a trace");
  fit->add_option("trace", fit_path, "Mahimahi trace file (plain text; gunzip a .gz first)")
      ->required()
      ->check(CLI::ExistingFile);
  fit->add_option("--interval-ms", fit_interval_ms, "interval of the per-interval rates")->check(CLI::Range(1, 60000));
  fit->add_option("--source", fit_source, "the source: text of the block (default: the path, \"(fitted)\")");

  CLI11_PARSE(app, argc, argv);
  spdlog::set_level(spdlog::level::from_str(log_level));
  if (*check) return Check(check_paths);
  if (*relay) return Relay(relay_path, relay_listen, relay_target, seed);
  if (*netns) return Netns(ns_path, ns_target, seed, ns_command);
  if (*packet) return Packet(packet_path, packet_port, congestion, seed, packet_command);
  if (*cleanup) {
    auto n = fe::CleanupStaleKernelLinks();
    if (!n.ok()) {
      std::cerr << n.status().message() << "\n";
      return 1;
    }
    std::cout << "removed " << *n << " stale namespaces/links\n";
    return 0;
  }
  if (*cal) return Calibrate(cal_paths, backend, write, seconds, pings, physics);
  if (*fit) return FitTrace(fit_path, fit_interval_ms, fit_source);
  return 0;
}
