// fl-coordinator: the islands coordinator as a process (flags, records, metrics, signals). `fl-server --mode
// islands ARGS` is an alias that execs `fl-coordinator ARGS`.
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <iostream>
#include <thread>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "fl/core/log_format.h"

#include "fl/core/str_cat.h"
#include "fl/diloco/coord/coordinator.h"
#include "fl/instrumentation/island_metrics.h"
#include "fl/instrumentation/island_records.h"
#include "fl/instrumentation/record_store.h"
#include "fl/pki/revocation.h"
#include "fl/rpc/grpc_server.h"
#include "fl/rpc/process.h"

namespace fl::diloco {
namespace {

std::string ConfigJson(const CoordinatorOptions& o) {
  nlohmann::json j;
  j["mode"] = "islands";
  const IslandSchedule& s = o.schedule;
  j["inner_steps"] = s.inner_steps;
  j["fragments"] = s.num_fragments;
  j["fragment_strategy"] = s.fragment_strategy;
  j["overlap_steps"] = s.overlap_steps;
  j["mixing_alpha"] = s.mixing_alpha;
  j["outer_optimizer"] = s.outer_optimizer;
  j["codec"] = s.codec;
  j["error_feedback"] = s.error_feedback;
  j["connections_per_peer"] = s.connections_per_peer;
  j["outer_steps"] = s.total_outer_steps;
  j["exchange_timeout_ms"] = s.exchange_timeout_ms;
  j["island_options"] = s.options;
  j["min_islands"] = o.min_islands;
  j["max_islands"] = o.max_islands;
  j["heartbeat_interval_ms"] = o.heartbeat_interval_ms;
  j["heartbeat_timeout_ms"] = o.heartbeat_timeout_ms;
  j["barrier_timeout_ms"] = o.barrier_timeout_ms;
  j["report_timeout_ms"] = o.report_timeout_ms;
  j["max_sync_attempts"] = o.max_sync_attempts;
  j["blame_grace_ms"] = o.blame_grace_ms;
  return j.dump();
}

std::string HostName() {
  char buf[256] = {};
  return gethostname(buf, sizeof(buf) - 1) == 0 ? std::string(buf) : std::string();
}

// How the run ended: the experiment's recorded status, the exit code and the last line printed.
struct Ending {
  instrumentation::ExperimentStatus status;
  int exit_code;
  std::string summary;
};

Ending EndingOf(bool signalled, const CoordinatorSnapshot& snap) {
  if (signalled) {
    return {instrumentation::ExperimentStatus::kAborted, 130, snap.failure.empty() ? "signal" : snap.failure};
  }
  if (!snap.failure.empty()) return {instrumentation::ExperimentStatus::kFailed, 1, snap.failure};
  return {instrumentation::ExperimentStatus::kFinished, 0, "schedule complete"};
}

int Run(int argc, char** argv) {
  fl::rpc::DisableMutexDeadlockDetection();
  CLI::App app{"fl-coordinator: the coordinator of cross-site islands (DiLoCo / Streaming DiLoCo)"};
  app.set_version_flag("--version", std::string("fl-coordinator ") + FL_VERSION);
  CoordinatorOptions o;
  std::string mode = "islands";
  std::string listen = "0.0.0.0:50051";
  std::string db_path = "fl-records.db";
  std::string port_file;
  std::string metrics_addr;
  std::string fingerprint_hex;
  std::string log_level = "info";
  std::vector<std::string> island_options;
  IslandSchedule& s = o.schedule;
  // Accepted so that a `fl-server --mode islands ...` command line runs unchanged with this binary's name.
  app.add_option("--mode", mode, "islands (the only mode; accepted for fl-server --mode islands command lines)")
      ->check(CLI::IsMember({"islands"}))
      ->capture_default_str();
  app.add_option("--listen", listen, "Address to serve gRPC on; port 0 picks a free port")->capture_default_str();
  app.add_option("--port-file", port_file, "Write the bound port to this file once listening");
  app.add_option("--db", db_path, "SQLite records database (created if missing); empty: no records")
      ->capture_default_str();
  app.add_option("--metrics-addr", metrics_addr, "Serve Prometheus metrics on /metrics here; empty: off");
  app.add_option("--experiment-name", o.experiment_name, "Name recorded with the experiment")->capture_default_str();
  app.add_option("--experiment-id", o.experiment_id, "Experiment id (default: generated)");
  app.add_option("--sync-mode", s.sync_mode,
                 "How the islands sync: diloco, or onebit-adam (one sync = a membership window of --inner-steps "
                 "steps); an island of the other mode is refused at Join")
      ->capture_default_str();
  app.add_option("--inner-steps", s.inner_steps,
                 "H: inner steps between two syncs of a fragment (onebit-adam: steps per membership window)")
      ->capture_default_str();
  app.add_option("--fragments", s.num_fragments, "P: fragments (1 = DiLoCo; > 1 = Streaming DiLoCo; divides H)")
      ->capture_default_str();
  app.add_option("--fragment-strategy", s.fragment_strategy, "strided or sequential")->capture_default_str();
  app.add_option("--overlap-steps", s.overlap_steps, "tau: inner steps an exchange overlaps (< H/P)")
      ->capture_default_str();
  app.add_option("--mixing-alpha", s.mixing_alpha, "alpha of the local mixing after a sync; negative: default")
      ->capture_default_str();
  app.add_option("--outer-optimizer", s.outer_optimizer, "Outer optimizer spec")->capture_default_str();
  app.add_option("--codec", s.codec, "Data-plane codec: fp32, bf16, fp16, int8, int4, fp4 (core codec spec)")
      ->capture_default_str();
  app.add_flag("--error-feedback", s.error_feedback, "Keep codec residuals per fragment");
  app.add_option("--connections-per-peer", s.connections_per_peer, "ZeroMQ connections per ring neighbour")
      ->capture_default_str();
  app.add_option("--outer-steps", s.total_outer_steps, "Outer steps per fragment to run; 0 = until stopped")
      ->capture_default_str();
  app.add_option("--exchange-timeout-ms", s.exchange_timeout_ms, "Timeout of one ring exchange")->capture_default_str();
  app.add_option("--island-option", island_options, "key=value handed to every island (repeatable)");
  app.add_option("--min-islands", o.min_islands, "Islands that must join before any starts")->capture_default_str();
  app.add_option("--max-islands", o.max_islands, "Most live islands")->capture_default_str();
  app.add_option("--model-fingerprint", fingerprint_hex,
                 "Expected model fingerprint (16 hex digits); default: the first island's");
  app.add_option("--heartbeat-interval-ms", o.heartbeat_interval_ms, "Island heartbeat interval")
      ->capture_default_str();
  app.add_option("--heartbeat-timeout-ms", o.heartbeat_timeout_ms, "Evict an island after this long without heartbeats")
      ->capture_default_str();
  app.add_option("--barrier-timeout-ms", o.barrier_timeout_ms,
                 "Evict islands that have not reached a sync's barrier this long after the first one did")
      ->capture_default_str();
  app.add_option("--report-timeout-ms", o.report_timeout_ms,
                 "Evict members that have not reported an epoch this long after the first report")
      ->capture_default_str();
  app.add_option("--max-sync-attempts", o.max_sync_attempts, "Epochs of one sync before the experiment fails")
      ->capture_default_str();
  app.add_option("--blame-grace-ms", o.blame_grace_ms,
                 "A member blamed for a failed exchange is evicted only if it does not report the epoch itself "
                 "this long after the blame (first attempt of a sync; 0 = evict at once)")
      ->capture_default_str();
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error")->capture_default_str();
  fl::rpc::ServerTls tls;
  app.add_option("--tls-cert", tls.cert_file,
                 "Serve mutual TLS with this server certificate (PEM, fl-provision add-server / init "
                 "--server-name/--server-ip); needs --tls-key and --tls-client-ca. Without the three, fl-coordinator "
                 "refuses to start unless --insecure (docs/security.md)");
  app.add_option("--tls-key", tls.key_file, "The private key of --tls-cert (PEM)");
  app.add_option("--tls-client-ca", tls.client_ca_file,
                 "CA certificate (PEM) that every island's certificate must chain to; an island may only take part "
                 "under the name of its certificate's fl-island://<name>");
  app.add_option("--tls-crl", o.crl_file,
                 "Certificate revocation list (PEM, fl-provision's ca/crl.pem, signed by --tls-client-ca): every call "
                 "of a revoked island certificate is refused and a connected island whose certificate is revoked is "
                 "evicted; the file is reloaded when it changes");
  app.add_option("--tls-crl-reload-ms", o.crl_reload_ms, "How often --tls-crl is checked for a change")
      ->capture_default_str()
      ->check(CLI::Range(50u, 3'600'000u));
  bool insecure = false;
  app.add_flag("--insecure", insecure,
               "Serve plaintext gRPC without any TLS flag: anyone who reaches --listen can join as any island and "
               "steer the experiment. Only for a trusted network or a test");
  CLI11_PARSE(app, argc, argv);

  // The same rules as fl-server's (rpc::ResolveServerSecurity): a forgotten flag must not leave the islands'
  // control plane open to whoever reaches the port.
  absl::StatusOr<std::optional<fl::rpc::ServerTls>> security =
      fl::rpc::ResolveServerSecurity({tls, o.crl_file, insecure}, "fl-provision init/add-server/add-island");
  if (!security.ok()) {
    std::cerr << "fl-coordinator: " << security.status().message() << "\n";
    return 2;
  }
  if (insecure) {
    std::cerr << "fl-coordinator: "
              << fl::rpc::InsecureServerWarning(listen, "join as any island and read or steer the experiment") << "\n";
  }
  o.crl_ca_file = tls.client_ca_file;
  if (!o.crl_file.empty()) {
    // Before anything is recorded: a list that cannot be trusted stops the start (Create loads it again, for good).
    if (auto crl = pki::RevocationList::Load(o.crl_file, o.crl_ca_file); !crl.ok()) {
      std::cerr << "fl-coordinator: --tls-crl: " << crl.status().message() << "\n";
      return 2;
    }
  }
  const std::optional<fl::rpc::ServerTls> server_tls = *security;

  spdlog::set_default_logger(spdlog::stderr_color_mt("fl-coordinator"));
  spdlog::set_level(spdlog::level::from_str(log_level));
  o.software_version = FL_VERSION;
  for (const std::string& kv : island_options) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) {
      std::cerr << "fl-server: --island-option '" << kv << "' is not key=value\n";
      return 2;
    }
    s.options[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  if (!fingerprint_hex.empty()) {
    try {
      size_t used = 0;
      o.model_fingerprint = std::stoull(fingerprint_hex, &used, 16);
      if (used != fingerprint_hex.size()) throw std::invalid_argument("trailing characters");
    } catch (const std::exception&) {
      std::cerr << "fl-server: --model-fingerprint '" << fingerprint_hex << "' is not a hex number\n";
      return 2;
    }
  }
  if (o.experiment_id.empty()) {
    o.experiment_id = fl::StrCat(
        o.experiment_name, "-", o.clock->UnixMs(), "-",
        instrumentation::HashHex(static_cast<uint64_t>(o.clock->NowNs()) * 0x9e3779b97f4a7c15ULL).substr(0, 6));
  }
  if (absl::Status st = o.Validate(); !st.ok()) {
    std::cerr << "fl-coordinator: " << st.message() << "\n";
    return 2;
  }

  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  std::unique_ptr<instrumentation::RecordStore> store;
  std::unique_ptr<instrumentation::IslandRecordWriter> records;
  if (!db_path.empty()) {
    auto opened = instrumentation::RecordStore::Open(db_path);
    if (!opened.ok()) {
      std::cerr << "fl-coordinator: " << opened.status().message() << "\n";
      return 2;
    }
    store = std::move(*opened);
    instrumentation::ExperimentRecord exp;
    exp.id = o.experiment_id;
    exp.name = o.experiment_name;
    exp.started_unix_ms = o.clock->UnixMs();
    exp.config_json = ConfigJson(o);
    exp.software_version = o.software_version;
    exp.host = HostName();
    absl::Status st = store->Enqueue(exp);
    if (st.ok()) st = store->Flush();
    if (!st.ok()) {
      std::cerr << "fl-coordinator: " << st.message() << "\n";
      return 2;
    }
    auto writer = instrumentation::IslandRecordWriter::Open(db_path);
    if (!writer.ok()) {
      std::cerr << "fl-coordinator: " << writer.status().message() << "\n";
      return 2;
    }
    records = std::move(*writer);
  }
  std::unique_ptr<instrumentation::IslandMetrics> metrics;
  if (!metrics_addr.empty()) {
    auto started = instrumentation::IslandMetrics::Start(metrics_addr, o.experiment_id);
    if (!started.ok()) {
      std::cerr << "fl-coordinator: " << started.status().message() << "\n";
      return 2;
    }
    metrics = std::move(*started);
    spdlog::info("metrics on http://{}/metrics (port {})", metrics_addr, metrics->port());
  }
  auto coordinator = Coordinator::Create(o, records.get(), metrics.get());
  if (!coordinator.ok()) {
    // The one error Create has beyond Validate (done above): a revocation list it cannot load or trust.
    std::cerr << "fl-coordinator: " << (o.crl_file.empty() ? "" : "--tls-crl: ") << coordinator.status().message()
              << "\n";
    return 2;
  }
  auto server = StartCoordinatorServer(coordinator->get(), listen, server_tls);
  if (!server.ok()) {
    std::cerr << "fl-coordinator: " << server.status().message() << "\n";
    return 2;
  }
  spdlog::info("islands experiment {} listening on port {} ({}; H={}, P={}, tau={}, codec {}, {} outer steps)",
               o.experiment_id, server->port,
               !server_tls          ? std::string("plaintext")
               : o.crl_file.empty() ? std::string("mutual TLS")
                                    : fl::StrCat("mutual TLS, revocation list ", o.crl_file),
               s.inner_steps, s.num_fragments, s.overlap_steps, s.codec, s.total_outer_steps);
  if (!port_file.empty()) fl::rpc::WritePortFile(port_file, server->port);

  std::atomic<bool> exiting{false};
  std::atomic<bool> signalled{false};
  Coordinator* coord = coordinator->get();
  std::thread signal_thread([coord, &exiting, &signalled, signals] {
    int sig = 0;
    if (sigwait(&signals, &sig) != 0 || exiting.load()) return;
    spdlog::warn("signal {} received: shutting the islands coordinator down", sig);
    signalled.store(true);
    coord->Shutdown(fl::StrCat("fl-coordinator received signal ", sig));
  });
  while (!coord->WaitDone(absl::Seconds(1))) {
  }
  const CoordinatorSnapshot snap = coord->Snapshot();
  coord->Shutdown(snap.failure.empty() ? "the experiment is complete" : snap.failure);
  server->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(3));
  exiting.store(true);
  pthread_kill(signal_thread.native_handle(), SIGTERM);
  signal_thread.join();
  server->server->Wait();
  server->server.reset();  // before the coordinator: the server holds its service
  coordinator->reset();
  const Ending ending = EndingOf(signalled.load(), snap);
  if (records != nullptr) {
    if (absl::Status st = records->Close(); !st.ok()) spdlog::error("island records: {}", st.message());
  }
  if (store != nullptr) {
    instrumentation::ExperimentStatusUpdate update;
    update.experiment_id = o.experiment_id;
    update.status = ending.status;
    update.status_reason = snap.failure;
    update.finished_unix_ms = o.clock->UnixMs();
    (void)store->Enqueue(update);
    if (absl::Status st = store->Close(); !st.ok()) spdlog::error("closing the records: {}", st.message());
  }
  std::cout << "experiment " << o.experiment_id << " " << instrumentation::ExperimentStatusName(ending.status) << ": "
            << ending.summary << std::endl;
  return ending.exit_code;
}

}  // namespace
}  // namespace fl::diloco

int main(int argc, char** argv) { return fl::diloco::Run(argc, argv); }
