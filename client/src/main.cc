// fl-client: trains on its local shard and reports what each phase of a round cost it.
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <iostream>
#include <mutex>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "fl/client/client_metrics.h"
#include "fl/client/device_info.h"
#include "fl/client/instances.h"
#include "fl/client/session.h"
#include "fl/client/settings.h"
#include "fl/client/synthetic_trainer.h"
#include "fl/core/allocator.h"
#include "fl/core/log_format.h"
#include "fl/core/model_file.h"
#include "fl/core/str_cat.h"
#include "fl/proto/convert.h"
#include "fl/rpc/process.h"
#if FL_WITH_TORCH
#include "fl/training/script_trainer.h"
#include "fl/training/torch_trainer.h"
#endif

namespace {

// The settings a manifest sets (model, data, partition, threads, ...: fl/client/settings.h), and the rest.
struct ModelFlags : fl::client::ClientSettings {
  uint32_t client_index = 0;
  uint32_t num_clients = 1;
  uint64_t partition_seed = 0;
  uint64_t init_seed = 0;
  std::string device = "auto";
  uint32_t eval_batch_size = fl::training::kDefaultEvalBatchSize;
  double slowdown = 1.0;
};

// With --instances: Fashion-MNIST read and decoded once for all the instances of a built-in model (each trainer
// keeps only its shard's indices and tensors), instead of once per instance.
struct SharedDatasets {
#if FL_WITH_TORCH
  std::optional<fl::training::data::Dataset> train, test;
#endif
};

absl::StatusOr<std::unique_ptr<fl::training::Trainer>> MakeTrainerUnguarded(const ModelFlags& f,
                                                                            [[maybe_unused]] SharedDatasets* shared) {
  if (f.model.starts_with("synthetic:")) {
    // synthetic:<params>[:<train_ms>]
    const std::string spec = f.model.substr(10);
    char* end = nullptr;
    const unsigned long long params = std::strtoull(spec.c_str(), &end, 10);
    unsigned long train_ms = 0;
    bool ok = !spec.empty() && params > 0;
    if (ok && *end == ':') {
      char* end2 = nullptr;
      train_ms = std::strtoul(end + 1, &end2, 10);
      ok = end2 != end + 1 && *end2 == '\0';
    } else {
      ok = ok && *end == '\0';
    }
    if (!ok) {
      return absl::InvalidArgumentError(
          fl::StrCat("--model=", f.model, ": expected synthetic:<number of parameters>[:<train ms>]"));
    }
    if (f.slowdown < 1) return absl::InvalidArgumentError(fl::StrCat("--slowdown=", f.slowdown, ": must be >= 1"));
    return std::unique_ptr<fl::training::Trainer>(std::make_unique<fl::client::SyntheticTrainer>(
        params, 1000, f.init_seed, static_cast<uint32_t>(static_cast<double>(train_ms) * f.slowdown)));
  }
#if !FL_WITH_TORCH
  return absl::FailedPreconditionError(
      fl::StrCat("--model=", f.model,
                 ": this fl-client was built without LibTorch (FL_WITH_TORCH=OFF); only "
                 "--model synthetic:<P>[:<train_ms>] is available. Build on the device itself for training."));
#else
  if (fl::core::IsTorchScriptModelPath(f.model)) {
    auto task = fl::training::data::ParseTask(f.task);
    if (!task.ok()) return absl::InvalidArgumentError(fl::StrCat("--task: ", task.status().message()));
    fl::training::ScriptTrainerOptions o;
    o.model_path = f.model;
    o.data.path = f.data.empty() ? f.data_dir : f.data;
    o.data.task = *task;
    o.data.partition = f.partition;
    o.data.client_index = f.client_index;
    o.data.num_clients = f.num_clients;
    o.data.partition_seed = f.partition_seed;
    o.data.seq_len = f.seq_len;
    o.data.data_fraction = f.data_fraction;
    o.buffers = f.buffers;
    o.device = f.device;
    o.num_threads = f.threads;
    o.eval_batch_size = f.eval_batch_size;
    o.slowdown = f.slowdown;
    auto trainer = fl::training::ScriptTrainer::Create(o);
    if (!trainer.ok()) return trainer.status();
    return std::unique_ptr<fl::training::Trainer>(std::move(*trainer));
  }
  if (f.task != "classification") {
    return absl::InvalidArgumentError(fl::StrCat("--task=", f.task, ": the built-in model '", f.model,
                                                 "' is a Fashion-MNIST classifier; other tasks need a TorchScript "
                                                 "model (--model PATH.pt)"));
  }
  if (!f.data.empty() && f.data.ends_with(".npz")) {
    return absl::InvalidArgumentError(fl::StrCat("--data=", f.data, ": the built-in model '", f.model,
                                                 "' trains on Fashion-MNIST's IDX files (--data-dir); to train on an "
                                                 ".npz, bring a TorchScript model (--model PATH.pt)"));
  }
  fl::training::TorchTrainerOptions o;
  o.model = f.model;
  o.init_seed = f.init_seed;
  o.data_dir = f.data.empty() ? f.data_dir : f.data;
  o.partition = f.partition;
  o.client_index = f.client_index;
  o.num_clients = f.num_clients;
  o.partition_seed = f.partition_seed;
  o.device = f.device;
  o.num_threads = f.threads;
  o.eval_batch_size = f.eval_batch_size;
  o.data_fraction = f.data_fraction;
  o.slowdown = f.slowdown;
  if (shared != nullptr && !shared->train.has_value()) {
    auto train = fl::training::data::LoadFashionMnist(o.data_dir, fl::training::data::Split::kTrain);
    if (!train.ok()) return train.status();
    auto test = fl::training::data::LoadFashionMnist(o.data_dir, fl::training::data::Split::kTest);
    if (!test.ok()) return test.status();
    shared->train = std::move(*train);
    shared->test = std::move(*test);
  }
  auto trainer = shared != nullptr ? fl::training::TorchTrainer::Create(o, *shared->train, *shared->test)
                                   : fl::training::TorchTrainer::Create(o);
  if (!trainer.ok()) return trainer.status();
  return std::unique_ptr<fl::training::Trainer>(std::move(*trainer));
#endif
}

// MakeTrainerUnguarded with LibTorch's exceptions turned into errors: loading a model, moving its data to the
// device and the probe's forward pass throw c10::Error or std::bad_alloc on what a file declares (a tensor larger
// than memory, an operator the build lacks). fl-client then says which files it was given and exits 2 instead of
// aborting.
absl::StatusOr<std::unique_ptr<fl::training::Trainer>> MakeTrainer(const ModelFlags& f,
                                                                   SharedDatasets* shared = nullptr) {
  const std::string data = f.data.empty() ? f.data_dir : f.data;
  auto first_line = [](std::string_view what) { return std::string(what.substr(0, what.find('\n'))); };
  try {
    return MakeTrainerUnguarded(f, shared);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        fl::StrCat("--model ", f.model, " with --data ", data,
                   ": out of memory while loading the model and its data (a file declares more than this machine "
                   "holds); check both files, or use a smaller model or shard (--data-fraction, --num-clients)"));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        fl::StrCat("--model ", f.model, " with --data ", data,
                   ": LibTorch failed while loading or probing the model: ", first_line(e.what())));
  }
}

// The parameters of --model synthetic:<P>[:<ms>], 0 for any other model.
uint64_t SyntheticParameters(const std::string& model) {
  if (!model.starts_with("synthetic:")) return 0;
  return std::strtoull(model.c_str() + 10, nullptr, 10);
}

// The memory check at start (fl-client --memory-limit, --no-memory-check).
struct MemoryCheckFlags {
  uint64_t limit_bytes = 0;  // 0: what this machine has (AvailableMemoryBytes)
  bool skip = false;
};

// The check's verdict: 0 to go on, 2 (fl-client's exit status for a client that cannot start) to stop.
int ApplyMemoryCheck(const fl::client::MemoryEstimate& estimate, const MemoryCheckFlags& flags) {
  if (absl::Status s = fl::client::CheckFits(estimate); !s.ok()) {
    if (flags.skip) {
      spdlog::warn("--no-memory-check: starting anyway: {}", s.message());
      return 0;
    }
    std::cerr << "fl-client: " << s.message() << "\n";
    return 2;
  }
  return 0;
}

// What --instances adds to one client's flags.
struct InstanceFlags {
  uint32_t count = 1;
  uint32_t offset = 0;                    // the first instance's number in NAME-<k> (--instance-offset)
  uint32_t train_concurrency = 0;         // 0: the cores
  std::string tls_cert_dir;               // NAME-i.crt / NAME-i.key per instance
  double secagg_drop_fraction = 0;        // --secagg-drop-after-shares: the first ceil(F x N) instances drop
  fl::client::Availability availability;  // always online unless --availability
};

// fl-client --instances N: N client identities in this process, each its own FederatedClient and Trainer, the
// trainings bounded by one TrainGate. An instance whose trainer cannot be made, or whose session fails, is
// reported by name; the others go on. Exit: 0 when all finished, 1 when any failed, 130 on a signal, 2 when the
// instances cannot start at all (they do not fit in memory, bad flags).
int RunInstances(const fl::client::ClientOptions& options, const ModelFlags& model, const InstanceFlags& flags,
                 const MemoryCheckFlags& memory, sigset_t signals) {
  const uint32_t n = flags.count;
  const std::string base = options.client_name;
  const std::vector<std::string> names = fl::client::InstanceNames(base, n, flags.offset);
  auto servers = fl::client::InstanceServers(options.server_address, n);
  if (!servers.ok()) {
    std::cerr << "fl-client: " << servers.status().message() << "\n";
    return 2;
  }
  // Trainers of instance i: its own shard client_index + i.
  SharedDatasets shared;
  auto make_trainer = [&](uint32_t i) {
    ModelFlags f = model;
    f.client_index = model.client_index + i;
    return MakeTrainer(f, &shared);
  };
  std::vector<std::unique_ptr<fl::training::Trainer>> trainers(n);
  std::vector<absl::Status> outcome(n, absl::OkStatus());

  // The memory estimate, before more than two instances exist: derived for the synthetic model (its parameters
  // are all it holds), measured for a real one (the resident growth of one more trainer: its shard, model and
  // buffers) plus what training and the session add.
  fl::client::MemoryEstimate estimate;
  estimate.count = n;
  estimate.limit_bytes = memory.limit_bytes > 0 ? memory.limit_bytes : fl::client::AvailableMemoryBytes();
  if (memory.limit_bytes > 0) estimate.limit_source = "--memory-limit";
  if (const uint64_t synthetic = SyntheticParameters(model.model); synthetic > 0) {
    estimate.per_instance_bytes =
        synthetic * sizeof(float) + fl::client::SessionBytesPerInstance(synthetic, options.max_chunk_bytes);
    estimate.how = fl::StrCat("derived: ", synthetic, " synthetic parameters, the session's buffers");
  } else {
    const uint64_t before = fl::client::ResidentBytes();
    uint64_t after_first = before, after_second = before;
    for (uint32_t i = 0; i < std::min<uint32_t>(n, 2); ++i) {
      auto t = make_trainer(i);
      if (t.ok()) {
        trainers[i] = std::move(*t);
      } else {
        outcome[i] = t.status();
      }
      (i == 0 ? after_first : after_second) = fl::client::ResidentBytes();
    }
    uint64_t params = 0;
    for (const auto& t : trainers) {
      if (t != nullptr) params = t->spec().num_elements();
    }
    // The first trainer also pays for what all share (LibTorch's runtime, the dataset's files in the page cache
    // of our reads); the second's growth is what one more costs.
    const uint64_t measured = n >= 2 && trainers[1] != nullptr && after_second > after_first
                                  ? after_second - after_first
                                  : (after_first > before ? after_first - before : 0);
    // Training adds gradients and the optimizer's state (momentum or Adam's two moments): up to three model-sized
    // buffers, held by the trainings that run at once only, but counted for all: a bound, not a mean.
    estimate.per_instance_bytes =
        measured + 3 * params * sizeof(float) + fl::client::SessionBytesPerInstance(params, options.max_chunk_bytes);
    estimate.how = fl::StrCat("measured: a trainer's resident growth ", measured >> 10, " KB; derived: ", params,
                              " parameters' training state and the session's buffers");
  }
  estimate.total_bytes = estimate.per_instance_bytes * n;
  spdlog::info("{} instances ({}..{}), shards {}..{} of {}: memory {}", n, names.front(), names.back(),
               model.client_index, model.client_index + n - 1, model.num_clients, estimate.Describe());
  if (ApplyMemoryCheck(estimate, memory) != 0) return 2;

  const uint32_t concurrency =
      flags.train_concurrency > 0 ? flags.train_concurrency : std::max(1u, std::thread::hardware_concurrency());
  fl::client::TrainGate gate(concurrency);
  std::vector<std::unique_ptr<fl::client::GatedTrainer>> gated(n);
  std::vector<std::unique_ptr<fl::client::FederatedClient>> clients(n);  // the current session of each, under mu
  std::vector<std::optional<fl::client::ClientOptions>> instance_options(n);
  for (uint32_t i = 0; i < n; ++i) {
    if (trainers[i] == nullptr && outcome[i].ok()) {
      auto t = make_trainer(i);
      if (t.ok()) {
        trainers[i] = std::move(*t);
      } else {
        outcome[i] = t.status();
      }
    }
    if (!outcome[i].ok()) {
      std::cerr << "fl-client: instance " << names[i] << " (shard " << model.client_index + i
                << "): " << outcome[i].message() << "\n";
      continue;
    }
    gated[i] = std::make_unique<fl::client::GatedTrainer>(names[i], std::move(trainers[i]), &gate);
    fl::client::ClientOptions o = options;
    o.client_name = names[i];
    o.server_address = (*servers)[i];
    o.seed = model.init_seed ^ (model.client_index + i);
    o.secagg_drop_after_shares = i < fl::client::SecAggDroppingInstances(flags.secagg_drop_fraction, n);
    if (!flags.tls_cert_dir.empty() && o.tls.has_value()) {
      o.tls->cert_file = fl::StrCat(flags.tls_cert_dir, "/", names[i], ".crt");
      o.tls->key_file = fl::StrCat(flags.tls_cert_dir, "/", names[i], ".key");
    }
    instance_options[i] = std::move(o);
  }
  spdlog::info("{} instances started, at most {} training at once", n, concurrency);
  if (const uint32_t dropping = fl::client::SecAggDroppingInstances(flags.secagg_drop_fraction, n); dropping > 0) {
    spdlog::warn(
        "--secagg-drop-after-shares {}: {} of {} instances ({}..{}) drop out of every secure round after "
        "their shares (a test)",
        flags.secagg_drop_fraction, dropping, n, names.front(), names[dropping - 1]);
  }

  std::atomic<bool> exiting{false}, signalled{false};
  // Some instance learnt that the experiment finished: the offline ones need not come back to hear it (the
  // server may be gone by their next window).
  std::atomic<bool> experiment_over{false};
  std::mutex mu;                 // guards clients
  std::condition_variable wake;  // a signal, or an instance's session that ended
  const auto t0 = std::chrono::steady_clock::now();
  auto at = [&](double s) {
    return t0 + std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
  };
  std::thread signal_thread([&] {
    int sig = 0;
    if (sigwait(&signals, &sig) != 0 || exiting.load()) return;
    spdlog::warn("signal {} received: all instances leave", sig);
    std::lock_guard lock(mu);
    signalled.store(true);
    for (auto& c : clients) {
      if (c != nullptr) c->Stop();
    }
    wake.notify_all();
  });
  std::vector<std::thread> runs;
  runs.reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    if (!instance_options[i].has_value()) continue;
    runs.emplace_back([&, i] {
      const uint32_t shard = model.client_index + i;
      // Online windows (--availability): a session per window, stopped when it closes; the experiment's end is
      // learnt from whichever session is open then (or a Join answered "experiment finished").
      for (;;) {
        const double now = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const fl::client::OnlineWindow w = fl::client::NextOnlineWindow(flags.availability, shard, now, names[i]);
        if (std::isinf(w.start_s)) {  // its trace has no window left: it is gone for good, which is no failure
          spdlog::info("instance {} leaves for good: its availability trace has no later window", names[i]);
          outcome[i] = absl::OkStatus();
          return;
        }
        fl::client::FederatedClient* client = nullptr;
        {
          std::unique_lock lock(mu);
          if (w.start_s > now) {
            wake.wait_until(lock, at(w.start_s), [&] { return signalled.load() || experiment_over.load(); });
          }
          if (signalled.load()) {
            outcome[i] = absl::CancelledError("signal");
            return;
          }
          if (experiment_over.load()) {
            outcome[i] = absl::OkStatus();  // away at the end, as a Join answered "experiment finished"
            return;
          }
          clients[i] = std::make_unique<fl::client::FederatedClient>(*instance_options[i], gated[i].get());
          client = clients[i].get();
        }
        std::atomic<bool> offline{false}, ended{false};
        std::thread closer;
        if (std::isfinite(w.end_s)) {
          closer = std::thread([&] {
            std::unique_lock lock(mu);
            if (!wake.wait_until(lock, at(w.end_s), [&] { return ended.load() || signalled.load(); })) {
              offline.store(true);
              client->Stop();
            }
          });
        }
        const absl::Status status = client->Run();
        {
          std::lock_guard lock(mu);
          ended.store(true);
          if (status.ok()) experiment_over.store(true);
          wake.notify_all();
        }
        if (closer.joinable()) closer.join();
        if (offline.load() && status.code() == absl::StatusCode::kCancelled) {
          spdlog::debug("instance {} offline until its next window", names[i]);
          continue;
        }
        outcome[i] = status;
        break;
      }
      if (!outcome[i].ok() && !signalled.load()) {
        // At once, not only at the end: the others may run for long.
        spdlog::error("instance {} (shard {}) failed: {}", names[i], shard, outcome[i].message());
      }
    });
  }
  for (std::thread& t : runs) t.join();
  exiting.store(true);
  pthread_kill(signal_thread.native_handle(), SIGTERM);
  signal_thread.join();

  std::string failed;
  uint32_t finished = 0;
  for (uint32_t i = 0; i < n; ++i) {
    if (outcome[i].ok()) {
      ++finished;
    } else {
      failed = fl::StrCat(failed, failed.empty() ? "" : ", ", names[i]);
    }
  }
  if (finished == n) {
    spdlog::info("experiment finished: all {} instances", n);
    return 0;
  }
  std::cerr << "fl-client: " << finished << " of " << n << " instances finished; failed: " << failed << "\n";
  return signalled.load() ? 130 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  fl::rpc::DisableMutexDeadlockDetection();
  CLI::App app{"fl-client: the federated-learning edge trainer (fl.v1 control plane over gRPC)"};
  app.set_version_flag("--version", std::string("fl-client ") + FL_VERSION);
  fl::client::ClientOptions options;
  ModelFlags model;
  std::string device_class, link_interface, link_profile, log_level = "info";
  uint32_t give_up_s = 120;

  // The settings that manifests set, in their option groups (declared once: fl/client/settings.h).
  fl::client::ClientSettingFlags setting_flags;
  fl::client::AddClientSettingOptions(app, setting_flags);
  app.add_option("--server", options.server_address, "fl-server address host:port")->capture_default_str();
  app.add_option("--name", options.client_name, "Client name, unique in the experiment (default: host name + index)");
  app.add_option("--client-index", model.client_index, "This client's index i in 0..n-1 (which shard it gets)")
      ->capture_default_str();
  app.add_option("--num-clients", model.num_clients, "Number of shards n the data is split into")
      ->capture_default_str();
  app.add_option("--partition-seed", model.partition_seed, "Seed of the partition (same on every client)")
      ->capture_default_str();
  app.add_option("--init-seed", model.init_seed, "Seed of the model's initial weights")->capture_default_str();
  app.add_option("--slowdown", model.slowdown,
                 "Device emulation: train this many times slower than this machine (a duty cycle per batch)")
      ->capture_default_str();
  app.add_option("--device", model.device, "Where to train: auto, cpu or cuda")->capture_default_str();
  app.add_option(
         "--eval-batch-size", model.eval_batch_size,
         "Test examples per forward pass when evaluating (>= 1): the results do not depend on it, the peak memory "
         "does (the CNN client peaks about 240 MB higher with 1000 than with 100; docs/deploy-raspberry-pi.md "
         "\"Memory\")")
      ->capture_default_str();
  int malloc_arenas = -1;
  app.add_option(
      "--malloc-arenas", malloc_arenas,
      "glibc malloc arenas at most (M_ARENA_MAX): freed memory stays in the arena of the thread that "
      "allocated it, and squeezenet's evaluation under qemu-aarch64 peaked at 703 MiB with glibc's default "
      "(8 x cores), 376 MiB with 1 (docs/deploy-raspberry-pi.md \"Memory\"); 0: glibc's default; default: 1, "
      "or glibc's default with --instances (many trainings at once)");
  bool keep_freed_memory = true;
  app.add_option("--keep-freed-memory", keep_freed_memory,
                 "Keep freed memory for the next training step (glibc M_MMAP_THRESHOLD 32 MiB, M_TRIM_THRESHOLD "
                 "1 GiB) instead of glibc's defaults, which hand it back and fault it in again: 4 virtual "
                 "clients' first round took 2-4x their later ones (docs/performance.md, issue 32 item 5); false: "
                 "glibc's defaults (less resident memory, for comparison)")
      ->capture_default_str();
  app.add_option("--device-class", device_class, "Device class recorded with every figure (default: detected)");
  app.add_option("--link-interface", link_interface, "Network interface the link uses (recorded)");
  app.add_option("--link-profile", link_profile, "Emulated link profile name (recorded)");
  app.add_option("--max-chunk-bytes", options.max_chunk_bytes, "Largest chunk of a model upload/download")
      ->capture_default_str();
  app.add_option("--give-up-after-s", give_up_s, "Exit with an error after this long without reaching the server")
      ->capture_default_str();
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error")->capture_default_str();
  int64_t clock_skew_ms = 0;
  app.add_option("--clock-skew-ms", clock_skew_ms,
                 "Test flag: shift every timestamp this client reports by this much (checks the server's "
                 "clock-offset estimate)")
      ->capture_default_str();
  app.add_option("--bind-interface", options.binding.interface,
                 "Network interface every connection to the server uses (SO_BINDTODEVICE), e.g. wlan0, eth0, wwan0");
  app.add_option("--source-address", options.binding.source_address,
                 "Local IP address the connections to the server come from (one of this machine's)");
  std::string metrics_addr;
  uint32_t metrics_linger_s = 0;
  app.add_option("--metrics-addr", metrics_addr,
                 "Serve this client's Prometheus metrics on /metrics at this address (e.g. 0.0.0.0:9465); empty: off");
  app.add_option("--metrics-linger-s", metrics_linger_s,
                 "After the experiment finished, keep /metrics up this long so that Prometheus scrapes the final "
                 "values (a signal ends the wait)")
      ->capture_default_str();
  fl::client::ClientTls tls;
  app.add_option("--tls-ca", tls.ca_file,
                 "Connect with mutual TLS, trusting only this CA certificate (PEM, fl-provision's ca/ca.crt); needs "
                 "--tls-cert and --tls-key. Without the three, fl-client refuses to start unless --insecure "
                 "(docs/security.md)");
  app.add_option("--tls-cert", tls.cert_file,
                 "This client's certificate (PEM, fl-provision issue client NAME); --name must be that NAME");
  app.add_option("--tls-key", tls.key_file, "The private key of --tls-cert (PEM)");
  app.add_option("--tls-server-name", tls.server_name,
                 "Check the server's certificate against this DNS name or IP address instead of --server's host: "
                 "for a --server that is a relay or forwarded port in front of the real server (fl-experiment's "
                 "network-namespace links); needs the other TLS flags");
  bool insecure = false;
  app.add_flag("--insecure", insecure,
               "Connect over plaintext gRPC without any TLS flag: the server is not authenticated and anyone on the "
               "path can read and change the model. Only for a trusted network or a test");
  InstanceFlags instances;
  app.add_option("--instances", instances.count,
                 "Virtual clients: host this many client identities in this process, named NAME-0..NAME-(N-1) "
                 "(--name is NAME), shards --client-index..--client-index+N-1, each its own session; they share "
                 "the LibTorch runtime and --train-concurrency trainings at a time (docs/testbed.md)")
      ->check(CLI::Range(1u, 1u << 20));
  app.add_option("--instance-offset", instances.offset,
                 "With --instances: name the instances NAME-K..NAME-(K+N-1) instead of from 0 (one group's virtual "
                 "clients split over several processes; their shards still start at --client-index)")
      ->check(CLI::Range(0u, 1u << 20));
  app.add_option("--train-concurrency", instances.train_concurrency,
                 "With --instances: at most this many instances train or evaluate at once; 0: the cores")
      ->capture_default_str();
  app.add_option("--tls-cert-dir", instances.tls_cert_dir,
                 "With --instances and --tls-ca: the folder of the instances' certificates, NAME-i.crt and NAME-i.key "
                 "(fl-provision's clients/ folder); replaces --tls-cert/--tls-key");
  MemoryCheckFlags memory_check;
  app.add_option("--memory-limit", memory_check.limit_bytes,
                 "Bytes this client may use in all, standing in for what the machine has (for a test, or to keep room "
                 "for other processes); 0: this process's resident set plus MemAvailable (or the cgroup's memory.max "
                 "left). At start fl-client estimates its peak (docs/deploy-raspberry-pi.md \"Memory\") and refuses "
                 "to start, exit status 2, when it exceeds this")
      ->capture_default_str();
  app.add_flag("--no-memory-check", memory_check.skip,
               "Start even when the memory estimate exceeds the limit (it is logged as a warning)");
  std::string availability;
  app.add_option("--availability", availability,
                 "With --instances: when each instance is online, diurnal:period_s=<s>,online=<fraction>[,seed=<n>] "
                 "(a seeded phase per shard) or trace:<file> (per instance name its online windows, "
                 "docs/testbed.md \"Availability\"); offline, its session is closed and the server cannot select it; "
                 "default: always online");
  app.add_option("--secagg-drop-after-shares", instances.secagg_drop_fraction,
                 "Testing flag (secure aggregation's dropout measurements, docs/testbed.md): this fraction of the "
                 "clients abandons every secure round right after sending its shares (no masked upload, no unmask "
                 "answer; the session stays up). With --instances N: the first ceil(FRACTION x N) instances, by "
                 "index; without: this client when FRACTION > 0")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (absl::Status st = setting_flags.ApplyTo(model); !st.ok()) {
    std::cerr << "fl-client: " << st.message() << "\n";
    return 2;
  }
  const std::string& link_kind = model.link_kind;
  // Before any thread exists (gRPC's, LibTorch's): a thread gets its arena at its first allocation.
  if (malloc_arenas < -1) {
    std::cerr << "fl-client: --malloc-arenas=" << malloc_arenas << ": must be >= 0 (0: glibc's default)\n";
    return 2;
  }
  if (malloc_arenas == -1) malloc_arenas = app.count("--instances") > 0 ? 0 : 1;
  if (malloc_arenas > 0 && mallopt(M_ARENA_MAX, malloc_arenas) != 1) {
    std::cerr << "fl-client: --malloc-arenas=" << malloc_arenas << ": glibc refused M_ARENA_MAX\n";
    return 2;
  }
  // Also before any thread. glibc's defaults make every block of 128 KiB or more its own mmap (the threshold
  // rises only as such blocks are freed, one size at a time) and trim the heap's top once 128 KiB is free there,
  // so LibTorch's per-step activations and gradients come back as fresh pages the kernel faults in and zeroes:
  // with 4 virtual clients round 1 took 0.9-3.2 million page faults and 7-27 s of kernel time. Fixed
  // thresholds keep that memory for the next step; the price is resident memory (up to 1 GiB freed kept per
  // process, heap fragmentation instead of unmapped blocks). Single clients too: their first round faults the
  // same way, only one trainer's worth.
  if (keep_freed_memory) {
    if (absl::Status st = fl::core::KeepFreedMemory(); !st.ok()) {
      std::cerr << "fl-client: --keep-freed-memory: " << st.message()
                << " (--keep-freed-memory=false: glibc's defaults)\n";
      return 2;
    }
  }
  if (model.eval_batch_size < 1) {
    std::cerr << "fl-client: --eval-batch-size=" << model.eval_batch_size
              << ": must be >= 1 (test examples per forward pass when evaluating; default "
              << fl::training::kDefaultEvalBatchSize << ")\n";
    return 2;
  }
  const bool virtual_clients = app.count("--instances") > 0;
  if (!availability.empty()) {
    auto a = fl::client::ParseAvailability(availability);
    if (!a.ok() || !virtual_clients) {
      std::cerr << "fl-client: "
                << (a.ok() ? std::string("--availability goes with --instances N") : std::string(a.status().message()))
                << "\n";
      return 2;
    }
    instances.availability = *a;
  }
  if (!virtual_clients && (!instances.tls_cert_dir.empty() || app.count("--train-concurrency") > 0)) {
    std::cerr << "fl-client: --tls-cert-dir and --train-concurrency go with --instances N (for one client: "
                 "--tls-cert/--tls-key)\n";
    return 2;
  }
  if (!instances.tls_cert_dir.empty()) {
    if (!tls.cert_file.empty() || !tls.key_file.empty()) {
      std::cerr << "fl-client: --tls-cert-dir=" << instances.tls_cert_dir
                << " gives every instance its own certificate: drop --tls-cert/--tls-key\n";
      return 2;
    }
    // Stand-ins that make the TLS checks below count all three; each instance gets its own files.
    tls.cert_file = instances.tls_cert_dir;
    tls.key_file = instances.tls_cert_dir;
  }
  if (virtual_clients && !metrics_addr.empty()) {
    std::cerr << "fl-client: --metrics-addr with --instances: the client metrics carry one client's name; run "
                 "without --metrics-addr (fl-server's /metrics has every client)\n";
    return 2;
  }
  options.clock_skew_ns = clock_skew_ms * 1'000'000;
  // All three or none: TLS with a part missing would only fail later, at every handshake.
  const int tls_given = int{!tls.ca_file.empty()} + int{!tls.cert_file.empty()} + int{!tls.key_file.empty()};
  if (tls_given != 0 && tls_given != 3) {
    std::cerr << "fl-client: --tls-ca, --tls-cert and --tls-key go together: give all three for mutual TLS (or "
                 "none, with --insecure, for plaintext)\n";
    return 2;
  }
  // Secure by default: plaintext only when asked for by name.
  if (tls_given == 3 && insecure) {
    std::cerr << "fl-client: --insecure and --tls-ca/--tls-cert/--tls-key contradict each other: drop --insecure "
                 "to connect with mutual TLS, or the TLS flags to connect in plaintext\n";
    return 2;
  }
  if (tls_given == 0 && !tls.server_name.empty()) {
    std::cerr << "fl-client: --tls-server-name=" << tls.server_name
              << " needs --tls-ca, --tls-cert and --tls-key (it only changes how the server's certificate is "
                 "checked)\n";
    return 2;
  }
  if (tls_given == 0 && !insecure) {
    std::cerr << "fl-client: no transport security configured: give --tls-ca, --tls-cert and --tls-key to connect "
                 "with mutual TLS (make the certificates with fl-provision init/add-client, docs/security.md), or "
                 "pass --insecure to connect in plaintext on a trusted network\n";
    return 2;
  }
  if (insecure) {
    std::cerr << "fl-client: --insecure: connecting to " << options.server_address
              << " over plaintext gRPC: the server is not authenticated and anyone on the path can read and change "
                 "the model; use --tls-ca/--tls-cert/--tls-key (docs/security.md)\n";
  }
  if (tls_given == 3) options.tls = tls;

  spdlog::set_default_logger(spdlog::stderr_color_mt("fl-client"));
  spdlog::info("allocator: {}", keep_freed_memory
                                    ? "keeps freed memory (M_MMAP_THRESHOLD 32 MiB, M_TRIM_THRESHOLD 1 GiB)"
                                    : "glibc's defaults (--keep-freed-memory=false)");
  spdlog::set_level(spdlog::level::from_str(log_level));
  options.device = fl::client::DetectDevice(device_class);
  if (options.client_name.empty()) {
    options.client_name = fl::StrCat(options.device.hostname(), "-", model.client_index);
  }
  auto kind = fl::proto::ParseLinkKind(link_kind);
  if (!kind.ok()) {
    std::cerr << "fl-client: --link-kind: " << kind.status().message() << "\n";
    return 2;
  }
  options.link.set_kind(*kind);
  options.link.set_interface(link_interface);
  options.link.set_profile(link_profile);
  options.software_version = FL_VERSION;
  options.give_up_after_ms = give_up_s * 1000;
  options.seed = model.init_seed ^ model.client_index;
  options.secagg_drop_after_shares = fl::client::SecAggDroppingInstances(instances.secagg_drop_fraction, 1) > 0;
  if (model.num_clients == 0 || model.client_index >= model.num_clients) {
    std::cerr << "fl-client: --client-index=" << model.client_index
              << " must be below --num-clients=" << model.num_clients << "\n";
    return 2;
  }
  if (virtual_clients && uint64_t{model.client_index} + instances.count > model.num_clients) {
    std::cerr << "fl-client: --instances=" << instances.count << " from --client-index=" << model.client_index
              << " needs shards up to " << uint64_t{model.client_index} + instances.count - 1
              << ", beyond --num-clients=" << model.num_clients << "\n";
    return 2;
  }

  if (app.count("--instance-offset") > 0 && !virtual_clients) {
    std::cerr << "fl-client: --instance-offset=" << instances.offset
              << " needs --instances (it numbers the instances)\n";
    return 2;
  }

  if (absl::Status s = fl::client::ValidateSocketBinding(options.binding); !s.ok()) {
    std::cerr << "fl-client: " << s.message() << "\n";
    return 2;
  }
  std::unique_ptr<fl::client::ClientMetrics> metrics;
  if (!metrics_addr.empty()) {
    auto started =
        fl::client::ClientMetrics::Start(metrics_addr, {options.client_name, link_kind, options.device.device_class()});
    if (!started.ok()) {
      std::cerr << "fl-client: " << started.status().message() << "\n";
      return 2;
    }
    metrics = std::move(*started);
    options.metrics = metrics.get();
    spdlog::info("metrics on http://{}/metrics (port {})", metrics_addr, metrics->port());
  }

  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  if (virtual_clients) {
    if (app.count("--name") == 0) options.client_name = options.device.hostname();
    return RunInstances(options, model, instances, memory_check, signals);
  }

  auto trainer = MakeTrainer(model);
  if (!trainer.ok()) {
    std::cerr << "fl-client: " << trainer.status().message() << "\n";
    return 2;
  }
  spdlog::info("model {} ({}): {} tensors, {} values, fingerprint {}; {} train / {} test examples",
               (*trainer)->model_name(), (*trainer)->task(), (*trainer)->spec().num_tensors(),
               (*trainer)->spec().num_elements(), (*trainer)->spec().FingerprintHex(), (*trainer)->num_train_examples(),
               (*trainer)->num_test_examples());
#if FL_WITH_TORCH
  // A GPU client says so at Join (DeviceInfo.accelerator, device class "gpu" unless --device-class names one),
  // as fl-island does: the records group its figures apart from the CPU clients'.
  if (SyntheticParameters(model.model) == 0) {
    if (std::optional<fl::training::CudaDevice> cuda = fl::training::TrainingCudaDevice(model.device)) {
      fl::v1::Accelerator* accelerator = options.device.mutable_accelerator();
      accelerator->set_kind(fl::v1::ACCELERATOR_KIND_CUDA);
      accelerator->set_name(cuda->name);
      accelerator->set_memory_bytes(cuda->memory_bytes);
      accelerator->set_count(cuda->count);
      if (device_class.empty()) options.device.set_device_class("gpu");
      spdlog::info("device: cuda ({}, {} MiB; {} CUDA device(s) seen)", cuda->name.empty() ? "?" : cuda->name,
                   cuda->memory_bytes >> 20, cuda->count);
    } else {
      spdlog::info("device: cpu (--device {})", model.device);
    }
  }
#endif
  {
    // With the trainer built (the libraries, the model and the data shard resident): the peak still to come.
    fl::client::OneClientMemory m;
    m.model = model.model;
    m.model_name = (*trainer)->model_name();
    m.resident_bytes = fl::client::ResidentBytes();
    m.parameters = (*trainer)->spec().num_elements();
    m.eval_batch_size = model.eval_batch_size;
    m.max_chunk_bytes = options.max_chunk_bytes;
    // What the machine has for this process is what it holds already plus what is still available.
    const uint64_t available = fl::client::AvailableMemoryBytes();
    const uint64_t limit = memory_check.limit_bytes > 0 ? memory_check.limit_bytes : available + m.resident_bytes;
    fl::client::MemoryEstimate estimate = fl::client::EstimateOneClient(m, limit);
    estimate.limit_source = memory_check.limit_bytes > 0
                                ? "--memory-limit"
                                : "this process's resident set plus MemAvailable, or the cgroup's memory.max left";
    if (memory_check.limit_bytes == 0 && available == 0) {
      spdlog::warn(
          "memory: {}; this machine's available memory could not be read (/proc/meminfo, the cgroup's "
          "memory.max): not checked",
          estimate.Describe());
    } else {
      spdlog::info("memory: {}", estimate.Describe());
      if (ApplyMemoryCheck(estimate, memory_check) != 0) return 2;
    }
  }

  fl::client::FederatedClient client(options, trainer->get());
  std::atomic<bool> exiting{false}, signalled{false};
  std::thread signal_thread([&] {
    int sig = 0;
    if (sigwait(&signals, &sig) != 0 || exiting.load()) return;
    spdlog::warn("signal {} received: leaving", sig);
    signalled.store(true);
    client.Stop();
  });
  const absl::Status status = client.Run();
  if (metrics != nullptr && status.ok()) {
    // Prometheus scrapes every few seconds: without this the last round's figures would never be seen.
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(metrics_linger_s);
    while (!signalled.load() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  exiting.store(true);
  pthread_kill(signal_thread.native_handle(), SIGTERM);
  signal_thread.join();
  if (status.ok()) {
    spdlog::info("experiment finished");
    return 0;
  }
  std::cerr << "fl-client: " << status.message();
  // A plaintext client cannot tell a mutual-TLS server from one that is down: the handshake just fails.
  if (insecure && status.code() == absl::StatusCode::kUnavailable) {
    std::cerr << "; this client connected in plaintext (--insecure): if fl-server serves mutual TLS (its start line "
                 "says so), connect with --tls-ca/--tls-cert/--tls-key";
  } else if (!insecure && status.code() == absl::StatusCode::kUnavailable) {
    std::cerr << "; with mutual TLS, also check that --tls-ca is the CA that issued fl-server's certificate and that "
                 "the certificate names the host of --server (or --tls-server-name)";
  }
  std::cerr << "\n";
  return status.code() == absl::StatusCode::kCancelled ? 130 : 1;
}
