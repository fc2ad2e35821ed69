// fl-server: admits clients, runs rounds, aggregates updates, evaluates and records every phase.
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "absl/strings/str_format.h"
#include "fl/core/clock.h"
#include "fl/core/log_format.h"

#include "fl/core/str_cat.h"
#include "fl/instrumentation/record_reader.h"
#include "fl/instrumentation/record_store.h"
#include "fl/server/checkpoint.h"
#include "fl/server/initial_model.h"
#include "fl/server/resume_plan.h"
#include "fl/server/round_engine.h"
#include "fl/server/service.h"
#include "fl/server/settings.h"
#include "fl/rpc/grpc_server.h"
#include "fl/rpc/process.h"
#include "fl/server/strategy.h"

namespace {

using fl::server::EngineConfig;

// SQLite keeps the WAL index of the records database in a memory-mapped file (<db>-shm), shared with the
// readers that watch an experiment live (fl-report, tests), so it cannot be moved to heap memory with
// locking_mode=EXCLUSIVE. When that file is truncated or its file system cannot back the mapping, the next
// access raises SIGBUS, which would kill fl-server without a word. This handler says what happened and exits
// with the failure status; it only calls write(2) and _exit(2) (async-signal-safe) on a message prepared before.
char g_sigbus_message[1536];
size_t g_sigbus_message_len = 0;

void OnSigbus(int) {
  ssize_t ignored = ::write(STDERR_FILENO, g_sigbus_message, g_sigbus_message_len);
  (void)ignored;
  ::_exit(1);
}

void InstallFaultHandlers(const std::string& db_path) {
  const int n = std::snprintf(
      g_sigbus_message, sizeof(g_sigbus_message),
      "fl-server: fatal: bus error (SIGBUS) on a memory-mapped file, most likely the records database's "
      "shared-memory index %s-shm (truncated or replaced, or its file system is full or failing). Rounds committed "
      "in the records are intact; fix the file system and run fl-server again with --resume.\n",
      db_path.c_str());
  g_sigbus_message_len = n < 0 ? 0 : std::min(static_cast<size_t>(n), sizeof(g_sigbus_message) - 1);
  struct sigaction bus {};
  bus.sa_handler = OnSigbus;
  sigemptyset(&bus.sa_mask);
  sigaction(SIGBUS, &bus, nullptr);
  // A file size limit (ulimit -f) makes write(2) fail with EFBIG, which the records and checkpoint code report;
  // the default SIGXFSZ would kill the process before it could.
  signal(SIGXFSZ, SIG_IGN);
}

// `fl-server --mode islands ARGS` is an alias of `fl-coordinator ARGS` (the islands coordinator has its own binary,
// diloco/coord): exec it from this binary's directory (an installation) or the build tree's diloco/coord/.
// How many of argv[i..] spell the islands mode: 1 for "--mode=islands", 2 for "--mode islands", 0 otherwise.
int IslandsModeArgs(int argc, char** argv, int i) {
  if (std::strcmp(argv[i], "--mode=islands") == 0) return 1;
  if (std::strcmp(argv[i], "--mode") == 0 && i + 1 < argc && std::strcmp(argv[i + 1], "islands") == 0) return 2;
  return 0;
}

bool IslandsModeRequested(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (IslandsModeArgs(argc, argv, i) != 0) return true;
  }
  return false;
}

int ExecCoordinator(int argc, char** argv) {
  std::error_code ec;
  const std::filesystem::path dir = std::filesystem::read_symlink("/proc/self/exe", ec).parent_path();
  const std::filesystem::path installed = dir / "fl-coordinator";
  const std::filesystem::path built = dir.parent_path() / "diloco" / "coord" / "fl-coordinator";
  const std::string coordinator = (std::filesystem::exists(installed) ? installed : built).string();
  std::vector<char*> args = {const_cast<char*>(coordinator.c_str())};
  for (int i = 1; i < argc; ++i) {
    if (const int skip = IslandsModeArgs(argc, argv, i); skip != 0) {
      i += skip - 1;
      continue;
    }
    args.push_back(argv[i]);
  }
  args.push_back(nullptr);
  std::fprintf(stderr, "fl-server: --mode islands is the islands coordinator's old name: running %s\n",
               coordinator.c_str());
  ::execv(coordinator.c_str(), args.data());
  std::fprintf(stderr,
               "fl-server: cannot run %s (%s): install fl-coordinator beside fl-server, or run fl-coordinator "
               "directly with the same flags\n",
               coordinator.c_str(), std::strerror(errno));
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (IslandsModeRequested(argc, argv)) return ExecCoordinator(argc, argv);  // alias: fl-coordinator
  fl::rpc::DisableMutexDeadlockDetection();
  CLI::App app{"fl-server: the federated-learning aggregator (fl.v1 control plane over gRPC)"};
  app.set_version_flag("--version", std::string("fl-server ") + FL_VERSION);
  std::string mode = "fl";
  app.add_option("--mode", mode, "fl: federated rounds; islands: runs fl-coordinator (an alias; fl-coordinator --help)")
      ->check(CLI::IsMember({"fl", "islands"}))
      ->capture_default_str();
  // Every setting of the run is declared once (fl/server/settings.h): its option, in its group, comes from there.
  fl::server::SettingFlags setting_flags;
  fl::server::AddSettingOptions(app, setting_flags);
  std::string manifest_path;
  std::string listen = "0.0.0.0:50051";
  std::string db_path = "fl-records.db";
  std::string port_file;
  std::string initial_model;
  std::string log_level = "info";
  bool resume = false;

  CLI::Option_group* process = app.add_option_group("Server process");
  process
      ->add_option("--manifest", manifest_path,
                   "Read the run's settings from an experiment manifest (its server:, training:, codecs: and seed "
                   "keys; docs/manifests.md); a flag may repeat a setting the manifest gives only with the same value")
      ->check(CLI::ExistingFile);
  process->add_option("--listen", listen, "Address to serve gRPC on; port 0 picks a free port")->capture_default_str();
  process->add_option("--port-file", port_file, "Write the bound port to this file once listening");
  process->add_option("--db", db_path, "SQLite records database (created if missing); empty: no records")
      ->capture_default_str();
  process->add_option(
      "--initial-model", initial_model,
      "Start from this model instead of the first client's: a checkpoint file of ours, or a TorchScript "
      "model (PATH.pt, exported with torch.jit.script/trace; its parameters and buffers, read without "
      "LibTorch); clients must train the same model");
  process->add_flag("--resume", resume,
                    "Continue the experiment after its last committed round (needs --db, --checkpoint-dir)");
  std::optional<uint64_t> resume_from_round;
  process->add_option(
      "--resume-from-round", resume_from_round,
      "With --resume: start from this committed round's checkpoint instead of the last one's (when that "
      "one is damaged); the rounds after it are re-run and their committed records marked aborted");
  process->add_option("--log-level", log_level, "trace, debug, info, warn, error")->capture_default_str();
  std::string metrics_addr;
  process->add_option("--metrics-addr", metrics_addr,
                      "Serve Prometheus metrics on /metrics at this address (e.g. 0.0.0.0:9464); empty: off");
  uint32_t metrics_linger_s = 0;
  process
      ->add_option("--metrics-linger-s", metrics_linger_s,
                   "After the experiment ended, keep /metrics up this long so that Prometheus scrapes the final "
                   "values (a signal ends the wait)")
      ->capture_default_str();
  uint32_t linger_s = 10;
  process
      ->add_option("--linger-s", linger_s,
                   "After the experiment finished or failed, keep answering for up to this long while some client "
                   "that was away at the end (stopped, cut off) has not been told: its Join is answered 'experiment "
                   "finished' and it exits instead of retrying until its give-up time; 0: exit at once")
      ->capture_default_str();
  fl::rpc::ServerTls tls;
  CLI::Option_group* security_group = app.add_option_group("Transport security");
  security_group->add_option(
      "--tls-cert", tls.cert_file,
      "Serve mutual TLS with this server certificate (PEM, fl-provision's server/<name>.crt); needs "
      "--tls-key and --tls-client-ca. Without the three, fl-server refuses to start unless --insecure "
      "(docs/security.md)");
  security_group->add_option("--tls-key", tls.key_file, "The private key of --tls-cert (PEM)");
  security_group->add_option(
      "--tls-client-ca", tls.client_ca_file,
      "CA certificate (PEM) that every client's certificate must chain to; a client may only Join under "
      "the name its certificate carries");
  std::string tls_crl;
  uint32_t tls_crl_reload_ms = 1000;
  security_group->add_option(
      "--tls-crl", tls_crl,
      "Certificate revocation list (PEM, fl-provision's ca/crl.pem, signed by --tls-client-ca): a revoked "
      "client certificate is refused at its next call and its session closed; the file is reloaded when "
      "it changes");
  security_group->add_option("--tls-crl-reload-ms", tls_crl_reload_ms, "How often --tls-crl is checked for a change")
      ->capture_default_str()
      ->check(CLI::Range(50u, 3'600'000u));
  bool insecure = false;
  security_group->add_flag(
      "--insecure", insecure,
      "Serve plaintext gRPC without any TLS flag: anyone who reaches --listen can join under any name and "
      "read the model. Only for a trusted network or a test");
  CLI11_PARSE(app, argc, argv);

  absl::StatusOr<std::optional<fl::rpc::ServerTls>> security =
      fl::rpc::ResolveServerSecurity({tls, tls_crl, insecure}, "fl-provision init/add-client");
  if (!security.ok()) {
    std::cerr << "fl-server: " << security.status().message() << "\n";
    return 2;
  }
  if (insecure) {
    std::cerr << "fl-server: " << fl::rpc::InsecureServerWarning(listen, "join under any name and read the model")
              << "\n";
  }
  const std::optional<fl::rpc::ServerTls> server_tls = *security;

  spdlog::set_default_logger(spdlog::stderr_color_mt("fl-server"));
  spdlog::set_level(spdlog::level::from_str(log_level));
  // The settings: a manifest's, then the flags' (a flag that repeats a manifest's setting with another value is
  // refused naming both), on the declared defaults; then checked as a whole.
  absl::StatusOr<EngineConfig> settings = fl::server::ResolveSettings(setting_flags, manifest_path);
  if (!settings.ok()) {
    std::cerr << "fl-server: " << settings.status().message() << "\n";
    return 2;
  }
  EngineConfig config = *std::move(settings);
  config.software_version = FL_VERSION;
  if (absl::Status s = fl::server::ResolveStrategy(config.strategy, &config); !s.ok()) {
    std::cerr << "fl-server: " << s.message() << "\n";
    return 2;
  }
  if (absl::Status s = config.Validate(); !s.ok()) {
    std::cerr << "fl-server: " << s.message() << "\n";
    return 2;
  }

  fl::server::RoundEngine::StartPoint start;
  if (resume_from_round.has_value() && !resume) {
    std::cerr << "fl-server: --resume-from-round needs --resume\n";
    return 2;
  }
  if (resume) {
    auto plan = fl::server::PlanResume(&config, db_path, resume_from_round);
    if (!plan.ok()) {
      std::cerr << "fl-server: " << plan.status().message() << "\n";
      return 2;
    }
    start = *std::move(plan);
    if (start.checkpoint.has_value()) {
      const std::string path = fl::server::CheckpointPath(config.checkpoint_dir, start.checkpoint->round);
      if (absl::Status s = fl::server::CheckStartModel(*start.checkpoint, path, config.downlink_codec); !s.ok()) {
        std::cerr << "fl-server: --resume: " << s.message() << "\n";
        return 2;
      }
    }
  } else if (!initial_model.empty()) {
    auto ckpt = fl::server::LoadInitialModel(initial_model);
    if (!ckpt.ok()) {
      std::cerr << "fl-server: --initial-model: " << ckpt.status().message() << "\n";
      return 2;
    }
    if (absl::Status s = fl::server::CheckStartModel(*ckpt, initial_model, config.downlink_codec); !s.ok()) {
      std::cerr << "fl-server: --initial-model: " << s.message() << "\n";
      return 2;
    }
    spdlog::info("initial model {} from {}: {} tensors, {} values, fingerprint {}", ckpt->model_name, initial_model,
                 ckpt->spec.num_tensors(), ckpt->spec.num_elements(), ckpt->spec.FingerprintHex());
    start.checkpoint = *std::move(ckpt);
  }

  // Signals are taken by one thread with sigwait, so that the handler can do real work (post an event).
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  InstallFaultHandlers(db_path);
  std::unique_ptr<fl::instrumentation::RecordStore> records;
  if (!db_path.empty()) {
    auto opened = fl::instrumentation::RecordStore::Open(db_path);
    if (!opened.ok()) {
      std::cerr << "fl-server: " << opened.status().message() << "\n";
      return 2;
    }
    records = std::move(*opened);
  }
  std::unique_ptr<fl::instrumentation::ServerMetrics> metrics;
  if (!metrics_addr.empty()) {
    // Every metric carries the experiment id (dashboards select experiments by it), so it is fixed here
    // rather than made up by the engine in Start(); same format as the engine's.
    if (config.experiment_id.empty()) {
      std::random_device rd;
      config.experiment_id = fl::StrCat("exp-", fl::UnixMs(), "-", absl::StrFormat("%06x", rd() & 0xffffff));
    }
    auto started = fl::instrumentation::ServerMetrics::Start(metrics_addr, config.experiment_id);
    if (!started.ok()) {
      std::cerr << "fl-server: " << started.status().message() << "\n";
      return 2;
    }
    metrics = std::move(*started);
    spdlog::info("metrics on http://{}/metrics (port {})", metrics_addr, metrics->port());
  }
  fl::server::RoundEngine engine(config, records.get(), std::move(start));
  engine.SetMetrics(metrics.get());
  if (absl::Status s = engine.Start(); !s.ok()) {
    std::cerr << "fl-server: " << s.message() << "\n";
    return 2;
  }
  std::unique_ptr<fl::pki::RevocationWatcher> revocation;
  if (!tls_crl.empty()) {
    auto watcher = fl::pki::RevocationWatcher::Start({tls_crl, tls.client_ca_file, tls_crl_reload_ms},
                                                     [&engine](const std::set<std::string>& serials) {
                                                       engine.Post(fl::server::CertificatesRevokedEvent{serials});
                                                     });
    if (!watcher.ok()) {
      std::cerr << "fl-server: --tls-crl: " << watcher.status().message() << "\n";
      engine.Post(fl::server::ShutdownEvent{"the revocation list cannot be used"});
      engine.Wait();
      engine.Stop();
      return 2;
    }
    revocation = *std::move(watcher);
  }
  fl::server::FederationService service(&engine, revocation.get());
  auto server = fl::rpc::StartGrpcServer(&service, listen, server_tls);
  if (!server.ok()) {
    std::cerr << "fl-server: " << server.status().message() << "\n";
    engine.Post(fl::server::ShutdownEvent{"could not listen"});
    engine.Wait();
    engine.Stop();
    return 2;
  }
  spdlog::info("experiment {} listening on port {} ({})", engine.config().experiment_id, server->port,
               server_tls.has_value() ? "mutual TLS" : "plaintext");
  if (!port_file.empty()) fl::rpc::WritePortFile(port_file, server->port);

  std::atomic<bool> exiting{false}, signalled{false};
  std::thread signal_thread([&engine, &exiting, &signalled, signals] {
    int sig = 0;
    if (sigwait(&signals, &sig) != 0 || exiting.load()) return;  // woken by main to exit
    signalled.store(true);
    spdlog::warn("signal {} received: aborting the current round and shutting down", sig);
    engine.Post(fl::server::ShutdownEvent{fl::StrCat("fl-server received signal ", sig)});
  });

  const fl::server::EngineResult result = engine.Wait();
  // Prometheus scrapes every few seconds: without this the last round's figures would never be seen.
  const auto linger_until = std::chrono::steady_clock::now() + std::chrono::seconds(metrics_linger_s);
  while (metrics != nullptr && !signalled.load() && std::chrono::steady_clock::now() < linger_until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  // Clients that were away at the end learn it when they come back (Join, hello), for --linger-s at most.
  const auto told_until = std::chrono::steady_clock::now() + std::chrono::seconds(linger_s);
  if (result.status != fl::instrumentation::ExperimentStatus::kAborted && engine.ClientsNotToldOfTheEnd() > 0 &&
      linger_s > 0) {
    spdlog::info("waiting up to {} s for {} client(s) that were away at the end, to tell them", linger_s,
                 engine.ClientsNotToldOfTheEnd());
  }
  while (result.status != fl::instrumentation::ExperimentStatus::kAborted && !signalled.load() &&
         engine.ClientsNotToldOfTheEnd() > 0 && std::chrono::steady_clock::now() < told_until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  // Let in-flight RPCs finish (final verdicts, the Shutdown message), then cut the rest.
  server->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(3));
  engine.Stop();
  exiting.store(true);
  pthread_kill(signal_thread.native_handle(), SIGTERM);
  signal_thread.join();
  if (records != nullptr) {
    if (absl::Status s = records->Close(); !s.ok()) spdlog::error("closing the records: {}", s.message());
  }
  std::cout << "experiment " << result.experiment_id << " " << result.status_name() << ": " << result.reason
            << std::endl;
  if (result.status == fl::instrumentation::ExperimentStatus::kFinished) return 0;
  return result.status == fl::instrumentation::ExperimentStatus::kAborted ? 130 : 1;
}
