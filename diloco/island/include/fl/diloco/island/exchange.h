// The island leader's side of one cross-island sync, run on a background thread so that inner steps go
// on while the bytes travel (Streaming DiLoCo's overlap). Torch-free.
//
// Start(key, Δ) hands the pseudo-gradient of one fragment to the exchange thread, which
//   1. asks the membership for this sync's ring (the coordinator's BeginSync barrier, or a static list),
//   2. runs the ring all-reduce (mean, with the configured codec and error feedback),
//   3. on failure reports it (ReportSyncFailed) and, on kRetry, goes back to 1 for a new epoch without the
//      vanished island — the pseudo-gradient is untouched by a failed exchange, so a retry sends the same
//      values and nothing is ever applied half-done; on kRepair the outcome says where to copy the state.
// Wait() blocks until that is over and says how long the caller was blocked (the "wait" of the overlap).
// The caller applies the outer step and then Commit()s it (ReportSyncDone with its state hash).
//
// 1-bit Adam with a coordinator runs membership WINDOWS instead (onebit_membership.h): BeginWindow(key) asks for
// the ring once, every Start() until the window's report exchanges on that ring without a barrier of its own
// (a failure is returned as kFailed, not reported: the window is), FoldResiduals() ends the window's exchanges,
// and ReportWindowDone / ReportWindowFailed report the window and get its verdict.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fl/core/mutex.h"
#include "absl/time/time.h"
#include "fl/diloco/coord/coordinator_client.h"
#include "fl/diloco/island/onebit_adam.h"
#include "fl/diloco/net/ring_allreduce.h"

namespace fl::diloco {

struct ExchangeConfig {
  std::string self_id;
  std::string bind_endpoint;             // the ring endpoint this leader binds
  std::vector<RingMember> static_peers;  // static ring (no coordinator): every member in ring order
  std::string codec = "fp32";
  bool error_feedback = true;
  int connections_per_peer = 1;
  absl::Duration timeout = absl::Seconds(30);
  // CurveZMQ on the ring: the folder with this island's <self_id>.curve.key and every member's <id>.curve.pub
  // (fl-provision's D/islands/). "" = plaintext ZeroMQ.
  std::string curve_dir;
  // The island's sync mode (fl-island --mode), checked against the ring's other members (RingOptions::sync_mode).
  std::string sync_mode;
};

// The ring's CurveZMQ keys for `members` from `curve_dir`: this member's secret key and every member's public
// key, in ring order. NotFound naming the file and the island when a key is missing.
absl::StatusOr<RingCurve> LoadRingCurve(const std::string& curve_dir, const std::vector<RingMember>& members,
                                        size_t self_index);

struct ExchangeOutcome {
  enum class Kind {
    kAveraged,  // `values` holds the islands' mean pseudo-gradient; apply it, then Commit
    kRepair,    // another island completed this sync: copy the state from `source` (nothing to apply)
    kRejoin,    // this island was evicted: Rejoin and copy the state
    kFailed,    // unrecoverable (`error`)
  };
  Kind kind = Kind::kFailed;
  SyncKey key;
  std::vector<float> values;
  std::optional<SyncPlan> plan;       // the epoch that succeeded (kAveraged)
  std::optional<StateSource> source;  // kRepair
  absl::Status error;
  // Over every attempt of this sync.
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  double exchange_seconds = 0;  // ring time
  double total_seconds = 0;     // Start .. result ready (barrier + ring + retries)
  double wait_seconds = 0;      // how long Wait() blocked
  uint32_t attempts = 0;
  size_t ring_size = 0;  // members of the successful epoch
};

class Exchanger {
 public:
  // `client` (may be null: static ring) must outlive the Exchanger.
  Exchanger(ExchangeConfig config, CoordinatorClient* client);
  ~Exchanger();
  Exchanger(const Exchanger&) = delete;
  Exchanger& operator=(const Exchanger&) = delete;

  // Starts the exchange of `values` for `key`. At most one exchange in flight (FailedPrecondition else).
  absl::Status Start(SyncKey key, std::vector<float> values);
  bool in_flight() const;
  // Blocks until the exchange started last is over.
  ExchangeOutcome Wait();
  // After the outer step of a kAveraged outcome: reports the hash (coordinator) and returns its verdict
  // (always kCommit for a static ring).
  absl::StatusOr<Verdict> Commit(const ExchangeOutcome& outcome, uint64_t state_hash, const SyncStats& stats);

  // Drops the cached ring (its bound endpoint and error-feedback residuals), e.g. after a rejoin.
  void ResetRing();

  // Switches the ring's codec for the exchanges started from now on (1-bit Adam: fp32 warm-up, then sign1).
  // Between exchanges only (FailedPrecondition while one is in flight); InvalidArgument for a bad spec.
  absl::Status SetCodec(const std::string& codec_spec);
  const std::string& codec() const { return config_.codec; }

  // Membership windows (1-bit Adam with a coordinator; between exchanges only). BeginWindow: the barrier of
  // window `key` (BeginSync) and its ring; errors as BeginSync's (IsRejoinNeeded after an eviction).
  absl::StatusOr<SyncPlan> BeginWindow(SyncKey key);
  // The fold of the window's residuals into `adam`'s momentum over the window's ring (FoldResidualsIntoMomentum).
  // On an error the ring is dropped and the window must be reported failed.
  absl::Status FoldResiduals(OneBitAdam& adam, ExchangeStats* stats);
  // Forgets the ring's 1-bit Adam residuals (a window that ends before the compression stage: a lossy warm-up
  // codec's gradient residual cannot be folded exactly, so it is dropped).
  void DropResiduals();
  // This island's momentum residual now (empty without a ring or residual); between exchanges only.
  std::vector<float> MomentumResidual() const;
  // The window's report and its verdict (ReportSyncDone / ReportSyncFailed naming the member the error names);
  // both end the window.
  absl::StatusOr<Verdict> ReportWindowDone(uint64_t state_hash, const SyncStats& stats);
  absl::StatusOr<Verdict> ReportWindowFailed(const absl::Status& error, const SyncStats& stats);

 private:
  void ThreadMain();
  ExchangeOutcome RunExchange(SyncKey key, std::vector<float> values);
  absl::Status EnsureRing(const std::vector<RingMember>& members, size_t self_index);

  ExchangeConfig config_;
  CoordinatorClient* client_;
  // The exchange thread's while an exchange is in flight, the caller's between Wait() and the next Start()
  // (ResetRing): not guarded by mu_, handed over through it (the thread publishes result_ under mu_ after its
  // last use, Start() hands the next job under mu_ after the caller's).
  std::unique_ptr<RingAllReduce> ring_;  // cached while the membership is unchanged
  uint64_t ring_fingerprint_ = 0;
  uint64_t static_exchange_id_ = 0;
  std::optional<SyncPlan> window_;  // the membership window in progress (caller's, like ring_)
  uint64_t window_exchanges_ = 0;   // exchanges started in it

  mutable fl::Mutex mu_;
  fl::CondVar cv_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<std::pair<SyncKey, std::vector<float>>> job_ ABSL_GUARDED_BY(mu_);
  std::optional<ExchangeOutcome> result_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace fl::diloco
