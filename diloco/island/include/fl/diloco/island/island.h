// An island: R data-parallel ranks that train one model replica together, and whose leader (rank 0) takes
// part in the cross-island exchange. Torch-free header: fl-island's main and the experiment launcher use
// it without compiling LibTorch.
//
// Inside an island, every inner step all-reduces the gradients of the R ranks through LibTorch's c10d
// process group (Gloo on CPU; NCCL when the build has it and a GPU is there), then every rank takes the
// same AdamW step, so the ranks hold identical replicas. Between islands only the leader talks:
//
//   mode "diloco"         DiLoCo (P = 1) and Streaming DiLoCo (P > 1): every H/P inner steps one fragment's
//                         pseudo-gradient is averaged over the islands with the ring all-reduce (on a
//                         background thread), applied τ steps later with the outer optimizer, mixed into
//                         the local replica, and broadcast by the leader to its ranks (c10d broadcast).
//   mode "onebit-adam"    1-bit Adam (onebit_adam.h) over the ring between leaders: every step exact
//                         Adam on fp32-averaged gradients for W steps, then the sign1 momentum with error
//                         feedback on both sides; c10d inside the island. With a coordinator, in membership
//                         windows of K steps (onebit_membership.h); without, over the static `peers` ring.
//   mode "data-parallel"  the baseline: every inner step all-reduces gradients across ALL ranks of ALL
//                         islands. dp_transport "gloo": one c10d process group spanning every rank (bytes
//                         across islands counted as the ring algorithm's 2(W-1)/W of the gradient);
//                         "ring": hierarchical — c10d inside the island, the fp32 ring between leaders
//                         (bytes measured, and they cross the emulated WAN like DiLoCo's).
//
// Membership ("diloco"): with a coordinator address the leader joins fl-coordinator, asks it
// before every sync for the ring's members, retries a failed exchange with the coordinator's new ring
// (never applying a half-done one), reports its state hash after every applied sync, and, when it joins
// late or its hash disagrees, fetches θ_global and the outer optimizer state from a peer. Without a
// coordinator the ring is the static `peers` list (for tests and benchmarks).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fl/diloco/island/onebit_adam.h"
#include "fl/diloco/island/outer_state.h"

namespace fl::diloco {

struct IslandOptions {
  // Identity.
  std::string island_id = "island-0";  // unique among islands
  size_t shard = 0;                    // training shard of this island
  size_t num_shards = 1;
  size_t rank = 0;   // data-parallel rank in the island; 0 = leader
  size_t ranks = 1;  // R
  // Rendezvous of the island's c10d process group: "host:port" of a c10d TCPStore served by rank 0
  // ("data-parallel" + dp_transport gloo: the store of the one global group, served by island 0 rank 0).
  std::string pg_store = "127.0.0.1:29500";
  std::string device = "auto";  // "auto" | "cpu" | "cuda" (see ChooseDevice)
  int cuda_device = -1;         // "cuda": the GPU index; -1 = (shard x ranks + rank) mod visible GPUs
  int threads = 1;              // intra-op threads of this rank

  // Model and data (see src/train_task.h).
  std::string model = "char-lm";        // "char-lm" | "cnn" | a TorchScript .pt file (docs/models-and-data.md)
  std::string data_dir;                 // empty = the task's Debian package directory
  std::string data;                     // TorchScript models: .npz / IDX directory / text corpus
  std::string task = "classification";  // TorchScript models: classification | regression | next-token
  uint64_t seed = 1;
  int64_t batch_size = 32;
  int64_t context = 64;
  int64_t d_model = 64;
  int64_t num_layers = 4;
  int64_t num_heads = 4;

  // Inner optimizer: AdamW (DiLoCo's; betas (0.9, 0.95) as in the paper).
  double inner_lr = 1e-3;
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  uint64_t warmup_steps = 50;   // linear learning-rate warm-up from 0
  uint64_t total_steps = 1000;  // inner steps T (the same for every method: same tokens)
  uint64_t eval_every = 0;      // 0 = evaluate only at the end
  // The inner optimizer: "adamw" (the only one implemented; the field exists so that 1-bit Adam can refuse
  // another by name).
  std::string inner_optimizer = "adamw";

  // Cross-island.
  std::string mode = "diloco";        // "diloco" | "data-parallel" | "onebit-adam"
  std::string dp_transport = "gloo";  // data-parallel only: "gloo" | "ring"
  OuterOptions outer;                 // H, P, strategy, τ, α, outer optimizer
  std::string codec = "fp32";         // ring codec: fp32, bf16, int8, int4, fp4 (any core::MakeCodec spec)
                                      // (onebit-adam: the warm-up's gradient codec; data-parallel ring too)
  // "onebit-adam": W exact Adam steps, then sign1 momentum with `onebit_chunk` values per scale
  // (onebit_adam.h). W = total_steps is plain data-parallel Adam over the ring with `codec`.
  uint64_t onebit_warmup_steps = 100;
  uint32_t onebit_chunk = 256;
  OneBitAdamOptions OneBit() const;
  bool error_feedback = true;  // for lossy codecs
  int connections_per_peer = 1;
  double exchange_timeout_s = 30;
  std::string data_endpoint = "tcp://127.0.0.1:0";  // what the leader binds for the ring
  // The address peers dial for this leader's ring endpoint when it differs from data_endpoint (e.g. the
  // front of an emulated WAN link). Empty = data_endpoint.
  std::string advertised_endpoint;
  // Membership: coordinator "host:port" (fl-coordinator), or a static ring when empty.
  std::string coordinator;
  std::vector<std::string> peers;  // static ring: "id=endpoint" in ring order, this island included
  // Endpoint of the state server (late joiners fetch θ_global + outer state from here); "" = none.
  std::string state_endpoint;

  // Security (docs/security.md). The leader of an island that talks to a coordinator or a ring needs either the
  // three TLS files (mutual TLS to the coordinator and between the islands' state servers, with this island's
  // certificate from `fl-provision add-island`) or `insecure`. With them the ring runs CurveZMQ with the key pairs
  // in curve_dir: this island's <island_id>.curve.key and every member's <id>.curve.pub.
  std::string tls_ca;     // the CA that issued the coordinator's and the other islands' certificates
  std::string tls_cert;   // this island's certificate (CN and fl-island://<island_id>)
  std::string tls_key;    // its private key
  std::string curve_dir;  // "" = the folder of tls_cert (fl-provision's D/islands/)
  bool insecure = false;  // plaintext gRPC and ZeroMQ (a warning is printed)
  bool secured() const { return !tls_cert.empty(); }
  // The ring's key folder: curve_dir, or the folder of tls_cert.
  std::string CurveDir() const;
  // Whether this process talks to a coordinator or a ring (and so needs TLS material or --insecure).
  bool NeedsTransportSecurity() const;
  // At start, before anything is dialled: with TLS material, libzmq must have CURVE and this island's CurveZMQ key
  // pair must be readable in CurveDir() (and belong together). Errors say what to install or provision.
  absl::Status CheckTransportSecurity() const;

  // Outputs.
  std::string summary_path;  // JSON summary written here at the end by every rank ("" = none)
  std::string metrics_path;  // leader appends one JSON line per sync and per eval ("" = none)

  absl::Status Validate() const;
  // The index ChooseDevice maps onto a GPU (mod the GPU count): ranks counted over the islands, so that
  // the islands the launcher starts on one machine, and the data-parallel baseline's single NCCL group,
  // spread over its GPUs; within an island R consecutive indices stay distinct.
  size_t device_slot() const { return shard * ranks + rank; }
};

// What the leader measured (also written as JSON to summary_path).
struct IslandSummary {
  std::string island_id;
  std::string mode;
  uint64_t steps = 0;                // inner steps this island ran (a late joiner runs fewer)
  uint64_t first_step = 0;           // 0, or the step a late joiner started from
  uint64_t units = 0;                // tokens (char-lm) or examples (cnn) this island trained on
  double final_eval_loss = 0;        // of θ_global ("diloco") or the model ("data-parallel")
  double final_local_eval_loss = 0;  // of this island's local replica at the end
  uint64_t bytes_sent = 0;           // across islands, this island's leader
  uint64_t bytes_received = 0;
  uint64_t peak_sync_bytes = 0;  // most bytes sent in one sync (one fragment exchange / one step)
  uint64_t syncs = 0;            // exchanges applied
  uint64_t retries = 0;          // exchanges retried after a peer failure
  double wall_s = 0;
  double compute_s = 0;      // inner steps (forward, backward, intra-island all-reduce, AdamW)
  double exchange_s = 0;     // ring all-reduce time (background thread)
  double wait_s = 0;         // time compute waited on the cross-island exchange
  uint64_t state_hash = 0;   // OuterState::Hash ("diloco") or OneBitAdam::Hash ("onebit-adam") at the end
  uint64_t outer_steps = 0;  // sum over fragments
  bool late_joined = false;
  // "onebit-adam" with a coordinator: committed states copied from a peer (late join, repair, rejoin), their
  // bytes and the time from the fetch to the report; bytes the windows' residual folds sent.
  uint64_t state_loads = 0;
  uint64_t state_load_bytes = 0;
  double state_load_ms = 0;
  uint64_t fold_bytes_sent = 0;
  uint64_t local_model_hash = 0;  // Checksum64 of this rank's replica at the end (equal on an island's ranks)
  std::string ToJson() const;
};

// Runs one rank of one island to the end. Blocks; returns the leader's summary (other ranks: what they
// know). Errors: bad options, no data, process-group or coordinator failures that retrying cannot fix.
absl::StatusOr<IslandSummary> RunIsland(const IslandOptions& options);

// What a rank's machine and build offer (ProbeDeviceFacts asks LibTorch; tests write their own).
struct DeviceFacts {
  int cuda_devices = 0;  // GPUs LibTorch sees: 0 without a GPU, a driver, or with a CPU-only LibTorch
  bool nccl = false;     // this fl-island was compiled with c10d's NCCL process group (a CUDA LibTorch)
};

// The device one rank trains on, and why it was chosen (fl-island logs the reason).
struct DeviceChoice {
  bool cuda = false;
  int index = -1;  // cuda: the GPU of this rank
  std::string reason;
  std::string Name() const;  // "cpu" | "cuda:1"
};

// The decision, torch-free: "cpu" is the CPU; "auto" is cuda where GPUs and NCCL are both there, else
// the CPU (the reason names what is missing); "cuda" without a GPU or without NCCL is FailedPrecondition
// naming what is missing and what to do. The GPU is `cuda_device`, or (-1) `slot` mod the GPU count
// (fl-island passes IslandOptions::device_slot()).
absl::StatusOr<DeviceChoice> ChooseDevice(const std::string& requested, size_t slot, int cuda_device,
                                          const DeviceFacts& facts);

// LibTorch's answer for this process (island_runtime.cc) and ChooseDevice applied to it.
DeviceFacts ProbeDeviceFacts();
absl::StatusOr<DeviceChoice> ResolveDevice(const std::string& requested, size_t slot = 0, int cuda_device = -1);

}  // namespace fl::diloco
