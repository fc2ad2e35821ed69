// What fl-server's round engine is told: every setting of a run (EngineConfig), its checks, and the form in
// which it is recorded with the experiment. Kept apart from round_engine.h so that the settings' readers (the
// CLI, manifests, fl-experiment) need not see the engine.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fl/core/aggregator.h"
#include "fl/server/selection.h"
#include "fl/v1/federation.pb.h"

namespace fl::server {

struct EngineConfig {
  std::string experiment_id;  // stable id in the records; generated when empty
  std::string experiment_name = "experiment";
  uint32_t num_rounds = 5;
  SelectionPolicy fit;             // fraction_fit, min_fit_clients, min_available_clients
  double fraction_evaluate = 1.0;  // of connected clients, each evaluation
  uint32_t min_evaluate_clients = 1;
  uint32_t evaluate_every = 1;          // evaluate after every k-th committed round; 0: never
  uint32_t round_deadline_ms = 120000;  // dispatch → last accepted update
  uint32_t evaluate_deadline_ms = 60000;
  uint32_t max_round_attempts = 3;  // a round failed this often ends the experiment as failed
  uint64_t seed = 0;
  fl::v1::TrainConfig train;  // sent with every train task
  // fl-server --strategy (ResolveStrategy sets aggregator and optimizer from it); recorded with the experiment.
  std::string strategy = "fedavg";
  std::string aggregator = "mean";        // core::MakeAggregator name
  std::string optimizer = "fedavg";       // core::MakeServerOptimizer spec, e.g. "fedadam:lr=0.03"
  std::string uplink_codec = "fp32";      // core::MakeCodec spec for client updates (deltas)
  std::string downlink_codec = "fp32";    // codec for model downloads
  uint32_t upload_slots = 1;              // uploads buffered at once (bounds server memory)
  uint32_t heartbeat_interval_ms = 5000;  // clients silent for 4 intervals are considered gone
  // The server's own stalls (docs/round-engine.md, "When the server itself stalls"): the engine's loop not running
  // for longer than this (the process stopped or paused, a VM pause, swapping, one step of its own that long) is
  // not the clients' doing: heartbeat, round, task and upload deadlines move on by the stall before anyone is
  // judged. nullopt: 2000 ms on a real clock, off on a ManualClock (a test's jump of that clock is time passing on a
  // healthy server unless the test turns this on); 0: off.
  std::optional<uint32_t> stall_threshold_ms;
  // Limits that keep one client from slowing the others (docs/round-engine.md, "Limits"); 0 turns an upload
  // limit off. The session limits are enforced by the gRPC reactors (service.cc), the upload ones here.
  uint32_t session_max_messages_per_s = 50;    // per Session stream, on average (bursts up to twice that)
  uint32_t session_max_queued_messages = 256;  // server messages waiting for a client that does not read
  uint32_t session_hello_timeout_ms = 10000;   // a Session stream must send its SessionHello within this
  // An admitted upload's average rate since it got its slot, checked once it has held the slot for
  // upload_rate_grace_ms; and its rate over its most recent window (engine::UploadSlots::kProgressWindowNs, or four
  // chunks at its own pace if longer), so that a stream that stops after a fast start loses its slot within that
  // window instead of keeping a high average for minutes (docs/round-engine.md, "Upload slots").
  uint32_t upload_min_bytes_per_s = 4096;
  uint32_t upload_rate_grace_ms = 5000;
  uint32_t upload_message_timeout_ms = 30000;    // longest wait for the next message of an upload (header too)
  uint32_t download_message_timeout_ms = 60000;  // longest a download's chunk may wait for the client to read it
  // Abuse limits per peer address and per certificate identity (docs/security.md, "Abuse limits"), enforced by the
  // gRPC reactors; 0 turns one off. The per-identity ones apply over mutual TLS only: in plaintext a name is a
  // claim. The per-peer defaults leave room for thousands of emulated clients behind one address.
  double join_per_s_per_peer = 2000;       // Joins per second from one address (bursts of twice that)
  double join_per_s_per_identity = 2;      // Joins per second of one certificate (bursts of five)
  uint32_t max_sessions_per_peer = 16384;  // open Session streams from one address
  uint32_t max_sessions_per_identity = 2;  // ... of one certificate (its session and the one replacing it)
  uint32_t max_uploads_per_peer = 4096;    // open UploadUpdate streams from one address
  uint32_t max_uploads_per_identity = 2;   // ... of one certificate
  // Clients that joined but never had a task and hold no place (their session ended, or never opened), kept in
  // memory and in the clients table (docs/security.md, "Abuse limits"): past this many the oldest are forgotten
  // (their row deleted), so that Joins under ever new names cannot grow either without bound. 0: no bound.
  uint32_t max_idle_newcomers = 4096;
  uint32_t max_chunk_bytes = 1u << 20;
  // Fleet limits (docs/round-engine.md, "Fleets and overload"). Clients holding a place (a live session, or
  // admitted and not yet opened it): a Join of a new place beyond this is refused RESOURCE_EXHAUSTED with a
  // retry-after. 0: sized at Start from physical memory (a quarter of it at kSessionBudgetBytes a session).
  uint32_t max_sessions = 0;
  // Events waiting for the engine's loop above which new Joins are shed (RESOURCE_EXHAUSTED, retry-after)
  // instead of queued: a late engine admits no more work until it caught up. 0: never shed.
  uint32_t max_engine_queue = 20000;
  uint32_t join_retry_after_ms = 1000;  // the retry-after of a shed or over-limit Join (trailer retry-after-ms)
  static constexpr uint64_t kSessionBudgetBytes = 64 * 1024;
  std::string checkpoint_dir;  // empty: no checkpoints (and no --resume)
  uint32_t keep_checkpoints = 2;
  std::string model_name;        // informational, from the first client or checkpoint
  std::string software_version;  // recorded with the experiment
  bool print_table = true;       // the per-round table on stdout (an observer, MakeConsoleTable)
  // Bounds on what clients declare and report (docs/round-engine.md, "Limits on what clients send").
  uint64_t max_model_values = uint64_t{1} << 29;  // a model spec above this (2 GiB of fp32) is refused at Join
  uint64_t max_client_examples = 1'000'000'000;   // train / test examples one client may declare at Join
  // The client asked for the initial weights must upload them within this; then another is asked.
  uint32_t initial_model_deadline_ms = 60000;
  // Norm bounding of updates (core::NormClip): "off", "median" or a number; empty: the strategy's default
  // (median for the robust aggregators, off for the weighted mean).
  std::string clip_update_norm;
  // The largest |value| an update (a pseudo-gradient) may carry when no norm bound is in effect (clip_update_norm
  // off: the weighted mean's default; a norm bound scales any update into it), --max-update-value
  // (docs/security.md, "Abuse limits"); an update with a larger value is rejected naming the tensor, element and
  // value. In (0, 2^64] (core::kMaxUpdateAbsValue).
  double max_update_value = 1e8;
  // Link-aware compression (fl/core/codec_policy.h): the uplink codec per client, by link kind or measured
  // uplink rate; empty or "fixed": every client gets uplink_codec.
  std::string uplink_codec_policy;
  // Buffered asynchronous aggregation (FedBuff; engine_buffered.cc, docs/round-engine.md "Buffered aggregation"):
  // "synchronous" (rounds) or "buffered" (clients train on the newest model; every buffer_size updates are one
  // aggregation step, and num_rounds counts steps).
  std::string aggregation = "synchronous";
  uint32_t buffer_size = 2;                     // buffered: updates per aggregation step (B)
  uint32_t concurrency = 2;                     // buffered: clients training at once (C)
  uint32_t max_staleness = 10;                  // buffered: an update more versions behind is refused (S)
  std::string staleness_weight = "poly:a=0.5";  // buffered: s(tau), "constant" or "poly:a=A" = 1/(1+tau)^A
  bool buffered() const { return aggregation == "buffered"; }
  // The buffered settings' checks (engine_buffered.cc), part of Validate().
  absl::Status ValidateBuffered() const;
  // Stragglers in synchronous rounds (engine_overcommit.cc, docs/round-engine.md "Over-commitment and deadline
  // policies"). Over-commitment: a round selects ceil(overcommit * K) clients, K being what it would select
  // without it, commits with the first K accepted updates and cancels the other tasks; 1 = off.
  double overcommit = 1.0;
  // An update that arrives after its round committed: "drop" (recorded late, as before) or "fold" (validated and
  // folded into the next committed round's aggregate with weight n_k * (1 + tau)^-late_discount, tau = model
  // versions between the one it was trained from and the one it is applied to).
  std::string deadline_policy = "drop";
  double late_discount = 1.0;  // the fold's a; 0 = no discount
  bool folds_late_updates() const { return deadline_policy == "fold"; }
  absl::Status ValidateStragglers() const;  // part of Validate()

  // Differential privacy (engine_privacy.h, docs/privacy.md), on with σ > 0. central: each update clipped to L2 norm
  // C (by the server, or by its client under secure aggregation), the mean of the round's m updates (uniform
  // weights) noised with N(0, (σ·C/m)²), ε accounted per round (RDP of the Poisson-subsampled Gaussian, q = clients
  // per round / dp_population). local: each client clips to C and adds N(0, (σ·C)²) itself. distributed (with
  // secure aggregation): each client adds its share of a discrete Gaussian central noise of std σ·C.
  std::string dp_mode = "central";     // central, local or distributed
  double dp_noise_multiplier = 0;      // σ
  double dp_clip_norm = 1.0;           // C (adaptive clipping: the initial C)
  std::string dp_clipping = "fixed";   // fixed, or adaptive (Andrew et al. 2021)
  double dp_target_quantile = 0.5;     // adaptive: γ, the fraction of updates at or below C it aims for
  double dp_clip_learning_rate = 0.2;  // adaptive: η of C <- C·exp(-η(b - γ))
  double dp_clipped_count_stddev = 0;  // adaptive: σ_b of the noisy count (must exceed σ/2)
  double dp_delta = 1e-5;              // δ of the (ε, δ) reported
  uint32_t dp_population = 0;          // N, the clients the rounds sample from
  double dp_target_epsilon = 0;        // stop before a round would spend more; 0 = no stop
  bool dp_on() const { return dp_noise_multiplier > 0; }
  absl::Status ValidatePrivacy() const;      // part of Validate()
  absl::Status ValidatePrivacyMode() const;  // part of ValidatePrivacy(): local, distributed, secure aggregation
  // The discrete Gaussian sampler's largest std (fl::privacy::AddDiscreteGaussianShare), in quantisation steps.
  static constexpr double kMaxDistributedShareSteps = 1 << 20;

  // Secure aggregation, SecAgg+ (engine_secagg.h, docs/privacy.md "Secure aggregation in the rounds"): "off", or
  // "secagg+": the server only ever holds masked updates and the unmasked sum of a round's survivors.
  std::string secure_aggregation = "off";
  uint32_t secagg_stage_deadline_ms = 10000;  // each key stage's and the unmask stage's own deadline
  double secagg_range = 1.0;                  // update values are clipped to [-range, range] ...
  double secagg_scale = 65536;                // ... and quantised to round(x * scale) in Z_2^32
  uint32_t secagg_max_weight = 1;             // 1: uniform mean; > 1: FedAvg weights (examples, capped at this)
  double secagg_log_factor = 3.0;             // neighbourhood k = odd >= c * log2(n) (Bell et al. 2020)
  uint32_t secagg_full_graph_max = 32;        // at most this many clients: every pair (plain SecAgg)
  uint32_t secagg_threshold = 0;              // shares to reconstruct a secret; 0: floor(k / 2) + 1
  bool secagg_on() const { return secure_aggregation == "secagg+"; }
  absl::Status ValidateSecureAggregation() const;  // part of Validate()

  // The aggregator is the (weighted) mean, not fedmedian/fedtrimmedavg: what buffered steps, folding and
  // differential privacy need.
  bool aggregates_by_mean() const;

  // The norm bound in effect (clip_update_norm, or the aggregator's default); errors name the flag.
  absl::StatusOr<core::NormClip> UpdateNormClip() const;

  // Checks every setting's bounds (its declaration in settings.cc), the checks across settings, and parses the
  // codec/aggregator/optimizer names; errors name the flag and the value.
  absl::Status Validate() const;
};

// The default of EngineConfig::max_sessions: a quarter of physical memory at kSessionBudgetBytes a session.
uint32_t DefaultMaxSessions();

// The settings that change what a run does, as the JSON recorded with the experiment (experiments.config_json):
// every setting of the table (settings.h) that is recorded, and the aggregator and optimizer the strategy resolved
// to. Its reader is ConfigFromRecordedJson (settings.h).
std::string RecordedConfigJson(const EngineConfig& config);

}  // namespace fl::server
