// The islands experiment launcher: reads a manifest (experiments/diloco/*.yaml, fields in docs/diloco.md),
// starts fl-coordinator (DiLoCo methods, 1-bit Adam with windows) and every rank of every island as fl-island processes
// on this machine, waits for them, and gathers the islands' summaries into one result. Torch-free: the
// launcher (and fl-experiment) never link LibTorch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fl::experiment {

struct IslandsExperimentConfig {
  std::string name;
  std::string method;                 // label for the table: "data-parallel", "diloco", "streaming", ...
  std::string mode = "diloco";        // fl-island --mode: diloco | data-parallel | onebit-adam
  std::string dp_transport = "gloo";  // data-parallel: gloo | ring
  uint32_t islands = 2;
  uint32_t ranks_per_island = 1;
  uint32_t threads_per_rank = 1;
  // fl-island flags for the model, data and inner optimizer, as "--flag value" pairs (from the manifest's
  // model: and inner: maps), e.g. {"--d-model", "64"}.
  std::vector<std::string> island_args;
  // inner.optimizer (fl-island --inner-optimizer)
  std::string inner_optimizer = "adamw";
  // onebit-adam (docs/diloco.md, "1-bit Adam"): exact Adam warm-up steps W (= total_steps: data-parallel Adam)
  // and values per sign1 scale after it.
  uint64_t onebit_warmup_steps = 100;
  uint32_t onebit_chunk = 256;
  // onebit.window_steps K: > 0 runs onebit-adam through fl-coordinator (--sync-mode onebit-adam) in membership
  // windows of K steps, with churn (docs/diloco.md, "Churn in 1-bit Adam"); 0 = the static ring.
  uint64_t onebit_window_steps = 0;
  // Whether the run has fl-coordinator: DiLoCo always, onebit-adam with membership windows.
  bool UsesCoordinator() const { return mode == "diloco" || (mode == "onebit-adam" && onebit_window_steps > 0); }
  // Outer loop (handed to the coordinator, which hands it to the islands).
  uint64_t total_steps = 600;
  uint64_t inner_steps = 100;  // H
  uint32_t fragments = 1;      // P
  std::string fragment_strategy = "strided";
  uint64_t overlap_steps = 0;  // tau
  double mixing_alpha = -1.0;
  std::string outer_optimizer = "nesterov:lr=0.7,momentum=0.9";
  std::string codec = "fp32";
  bool error_feedback = true;
  uint32_t connections_per_peer = 1;
  uint32_t exchange_timeout_ms = 60000;
  // The emulated WAN between islands: a link profile (a file, or a name in experiments/profiles/links/);
  // each island's ring endpoint is reached through its own shaping relay with it. "" = loopback.
  std::string wan_link;
  // "tls" (default): the launcher provisions a throwaway CA in <out>/pki for the run (a coordinator certificate
  // for the advertised address (LaunchPaths::advertise) and 127.0.0.1/localhost, one island certificate and
  // CurveZMQ key pair per island) and runs everything with
  // mutual TLS and CurveZMQ. "insecure": plaintext, every process started with --insecure.
  std::string security = "tls";

  // Where it runs (docs/cluster.md "Islands on Slurm"): local (this machine) or slurm (fl-islands-run
  // --launcher overrides kind): the partition ("" = the cluster's default), the time limit ("" = the
  // partition's), the nodes (0 = one per island, at most the partition's) and further #SBATCH options.
  struct Launcher {
    std::string kind = "local";
    std::string partition;
    std::string time;
    uint32_t nodes = 0;
    std::vector<std::string> sbatch_args;
  } launcher;

  std::string source;  // manifest path, for errors

  absl::Status Validate() const;
};

// Parses a manifest; errors name the file, the field and what is allowed.
absl::StatusOr<IslandsExperimentConfig> LoadIslandsExperiment(const std::string& path);

struct IslandsExperimentResult {
  std::string name;
  std::string method;
  double final_eval_loss = 0;    // mean over islands of θ_global's (DiLoCo) / the model's eval loss
  uint64_t bytes_sent = 0;       // summed over islands (cross-island traffic)
  uint64_t peak_sync_bytes = 0;  // max over islands of the bytes one island sent in one sync
  double wall_s = 0;             // max over islands
  double wait_s = 0;             // mean over islands of time compute waited on the network
  double wait_share = 0;         // wait_s / wall_s
  uint64_t units = 0;            // tokens (char-lm) or examples (cnn), all islands
  bool hashes_equal = true;      // DiLoCo: every island's final state hash is the same
  std::string ToJson() const;
};

struct LaunchPaths {
  std::string fl_island;       // path of the fl-island binary
  std::string fl_coordinator;  // path of the fl-coordinator binary (the islands coordinator)
  std::string out_dir;         // summaries, logs, metrics, records.db
  // The address every process binds and advertises (the coordinator's gRPC, each island's ring endpoint and
  // state server; the SAN of the coordinator's certificate). Everything runs on this machine, so 127.0.0.1 by
  // default; one of its other addresses makes the processes reachable from elsewhere (islands_addresses.h).
  std::string advertise = "127.0.0.1";
  // Under a batch system (islands_slurm.h) each step runs one part of the experiment on its node through this
  // same launcher: "" = all of it (this machine); "coordinator" = fl-coordinator alone, until it ends, writing
  // its address to <out>/coordinator.address; "island-<i>" = that island's ranks, which dial the address found
  // there. Steps use the CA made before the job was submitted (ProvisionIslandsPki); mode diloco only.
  std::string step;
};

// The run's throwaway CA in <out_dir>/pki (replacing one there): a coordinator certificate naming every host in
// `coordinator_hosts` and 127.0.0.1/localhost, and an island certificate with its CurveZMQ key pair per island.
absl::Status ProvisionIslandsPki(const IslandsExperimentConfig& config, const std::string& out_dir,
                                 const std::vector<std::string>& coordinator_hosts);

// The islands' summaries in out_dir (<out_dir>/island-<i>-rank0.json) gathered into one result, also written to
// <out_dir>/result.json. Errors name the island without a summary.
absl::StatusOr<IslandsExperimentResult> GatherIslandsResult(const IslandsExperimentConfig& config,
                                                            const std::string& out_dir);

// Runs the experiment to the end (blocking). Errors: bad config, a process that fails (its log named).
absl::StatusOr<IslandsExperimentResult> RunIslandsExperiment(const IslandsExperimentConfig& config,
                                                             const LaunchPaths& paths);

}  // namespace fl::experiment
