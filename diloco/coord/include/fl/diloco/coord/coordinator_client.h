// CoordinatorClient: the island side of the DiLoCo islands control plane (service fl.v1.Islands, served by
// `fl-coordinator`, see coordinator.h and docs/diloco-coordinator.md). Only the island LEADER
// (rank 0) talks to the coordinator; it relays what its ranks need (schedule, plans, verdicts) over c10d.
// Torch-free: plain values, no tensors.
//
// The protocol in one picture (one island; every call is blocking and returns absl::Status[Or]):
//
//   CoordinatorClient client;                              // one per island leader
//   IslandJoinRequest join{.island_id = "island-a", .data_endpoint = "tcp://10.0.0.1:5555",
//                          .state_endpoint = state_server->endpoint(), .num_ranks = 4,
//                          .model_fingerprint = spec.fingerprint(), .software_version = FL_VERSION};
//   auto assignment = client.Connect("coordinator:50051", join);  // blocks until admitted (see Connect)
//   if (assignment->state_source) {                        // late join: copy the global state from a peer
//     auto snap = FetchState(assignment->state_source->endpoint, assignment->state_source->expected_hash,
//                            {.verify = restore_and_hash});   // restore_and_hash: see state_transfer.h
//     outer_state.Restore(snap->image);                    // and its Hash() == expected_hash, else give up
//     client.ReportStateLoaded(assignment->state_source->key, outer_state.Hash());
//     // continue the schedule AFTER assignment->state_source->key (the state includes that sync)
//   }
//   for each sync key k = (outer step, fragment) of the schedule, in increasing order:
//     ... inner steps ...
//     auto plan = client.BeginSync(k);                     // waits until every current member arrived
//     if (!plan.ok()) -> IsRejoinNeeded(plan.status()) ? client.Rejoin() and go to the late-join path : fail
//     auto ring = RingAllReduce::Create({.members = plan->members, .self = plan->self_index, ...});
//     absl::Status s = ring->AllReduce(plan->exchange_id(), k.fragment, pseudo_grad, kMean, &ring_stats);
//     if (!s.ok()) {                                      // values untouched: nothing applied
//       auto v = client.ReportSyncFailed(*plan, s, VanishedMemberFromError(s, *plan), stats);
//       v->kind == kRetry  -> BeginSync(k) again (a new epoch without the vanished island)
//       v->kind == kRepair -> FetchState(v->source) ... ReportStateLoaded; continue after k
//     } else {
//       apply the outer step (at send step + tau), publish the snapshot to the StateServer, then
//       auto v = client.ReportSyncDone(*plan, outer_state.Hash(), stats);   // waits for all members
//       v->kind == kCommit -> train on
//       v->kind == kRepair -> this island's state differs from the majority: FetchState(v->source...),
//                             Restore, ReportStateLoaded, then train on (never train on a mismatched state)
//     }
//   client.Leave("finished");
//
// Thread-safety: every method may be called from any thread; BeginSync/Report* of different keys may
// overlap (Streaming DiLoCo with overlap reports from a background exchange thread). A heartbeat thread
// started by Connect keeps the session stream alive; if the coordinator evicts the island (missed
// barrier, reported vanished, heartbeat lost), evicted() turns true and the next call fails with
// IsRejoinNeeded.
#pragma once

#include <atomic>
#include <compare>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "fl/diloco/net/ring_allreduce.h"  // fl::diloco::RingMember {id, endpoint}
#include "fl/rpc/tls.h"

namespace fl::diloco {

// Identifies one sync: outer step `step` (the round, from 0) of fragment `fragment` (0 for DiLoCo).
// Keys are totally ordered (step, then fragment), which is the order Streaming DiLoCo's staggered
// schedule starts exchanges in (core::FragmentSchedule::SendStep); every island must use increasing keys.
struct SyncKey {
  uint64_t step = 0;
  uint32_t fragment = 0;
  auto operator<=>(const SyncKey&) const = default;
};

// The outer-step schedule, fixed by the coordinator's flags and identical for every island.
struct IslandSchedule {
  uint64_t inner_steps = 100;                 // H: inner steps between two syncs of the same fragment
  uint32_t num_fragments = 1;                 // P: 1 = DiLoCo, > 1 = Streaming DiLoCo
  std::string fragment_strategy = "strided";  // "strided", "sequential" or "balanced" (core::FragmentStrategy)
  uint64_t overlap_steps = 0;                 // tau: an exchange started at step t is applied at t + tau
  double mixing_alpha = -1.0;                 // alpha of theta_local mixing; negative = OuterOptions' default
  std::string outer_optimizer = "nesterov:lr=0.7,momentum=0.9";  // core::MakeServerOptimizer spec
  std::string codec = "fp32";                                    // data-plane codec, core::MakeCodec spec
  bool error_feedback = false;                                   // keep codec residuals per fragment
  uint32_t connections_per_peer = 1;                             // ZeroMQ connections per ring neighbour
  uint64_t total_outer_steps = 0;              // outer steps (rounds) per fragment to run; 0 = until stopped
  uint32_t exchange_timeout_ms = 30000;        // RingOptions::timeout
  std::map<std::string, std::string> options;  // free-form run options for the islands (--island-option k=v)
  // How the islands sync: "diloco", or "onebit-adam", where one sync is a membership window of inner_steps
  // steps, each with its own exchange (docs/diloco.md, "Churn in 1-bit Adam"). Islands of another mode are
  // refused at Join naming both.
  std::string sync_mode = "diloco";
};

// Where to copy the global state from (late join, repair): the StateServer of island `island_id` serves
// the state after sync `key`, whose hash is `expected_hash`.
struct StateSource {
  std::string island_id;
  std::string endpoint;        // the peer's StateServer address ("host:port", gRPC)
  uint64_t expected_hash = 0;  // the committed state hash (the majority's); verify before training
  SyncKey key;                 // the state includes this sync
};

// What an island says about itself when it joins.
struct IslandJoinRequest {
  std::string island_id;             // unique, stable across restarts ("island-a"); a metric label: keep it short
  std::string data_endpoint;         // ZeroMQ endpoint its leader binds for the ring ("tcp://10.0.0.1:5555")
  std::string state_endpoint;        // its StateServer's gRPC address ("10.0.0.1:6000"), for late joiners/repairs
  uint32_t num_ranks = 1;            // data-parallel ranks in the island
  uint64_t model_fingerprint = 0;    // core::ModelSpec::fingerprint(); must equal the coordinator's
  std::string model_name;            // informational
  std::string software_version;      // fl-island version
  std::string device_class;          // "gpu", "x86", ... (recorded)
  std::string accelerator;           // e.g. "cuda:NVIDIA H100 80GB HBM3"; "" = CPU only (recorded)
  std::string sync_mode = "diloco";  // fl-island --mode; must equal the schedule's (refused at Join, naming both)
};

// The coordinator's answer to Join.
struct Assignment {
  std::string experiment_id;
  uint64_t join_seq = 0;  // admission order; the ring order sorts members by it
  IslandSchedule schedule;
  // Unset: fresh start from the (seeded, identical) initial model at step 0. Set: late join; the island
  // must FetchState from it, verify the hash, ReportStateLoaded, and continue after source->key.
  std::optional<StateSource> state_source;
  uint32_t heartbeat_interval_ms = 1000;
};

// One membership epoch for one sync: who takes part, in ring order (identical for every member).
struct SyncPlan {
  uint64_t epoch = 0;    // globally increasing; a retry of the same key gets a new epoch
  uint32_t attempt = 0;  // 0 for the first epoch of this key, 1 for the first retry, ...
  SyncKey key;
  std::vector<RingMember> members;  // ring order
  size_t self_index = 0;            // this island's index in `members`
  // A RingAllReduce exchange id that grows with every epoch (the ring requires increasing ids).
  uint64_t exchange_id() const { return epoch; }
};

// What an island measured for one sync; recorded per island and exported to Prometheus.
struct SyncStats {
  double inner_compute_seconds = 0;  // inner steps since the previous sync of any fragment
  double exchange_seconds = 0;       // wall time of the all-reduce (ExchangeStats::seconds)
  uint64_t bytes_sent = 0;           // ExchangeStats::bytes_sent
  uint64_t bytes_received = 0;       // ExchangeStats::bytes_received
  double wait_seconds = 0;           // time the compute was blocked waiting for this exchange (0 if hidden)
  uint64_t inner_steps = 0;          // inner steps since the previous sync of any fragment
};

enum class VerdictKind {
  kCommit,  // the state is the majority's: train on
  kRepair,  // copy the state from `source` (FetchState, verify, ReportStateLoaded) before training on
  kRetry,   // the exchange failed for every member: BeginSync(same key) again for a new epoch
};

struct Verdict {
  VerdictKind kind = VerdictKind::kCommit;
  std::optional<StateSource> source;  // set with kRepair
  uint64_t majority_hash = 0;         // the committed hash (0 with kRetry)
};

struct CoordinatorClientOptions {
  absl::Duration connect_timeout = absl::Minutes(10);  // Join may wait for the first cohort / an in-flight sync
  absl::Duration rpc_timeout = absl::Minutes(30);      // BeginSync / Report* wait on the other islands
  bool send_heartbeats = true;                         // false only in tests (an island whose heartbeats stop)
  // fl-island --tls-ca/--tls-cert/--tls-key: mutual TLS to the coordinator with the island's certificate
  // (fl-provision add-island). Unset: plaintext (fl-island --insecure).
  std::optional<rpc::ClientTls> tls;
};

// True for the errors after which the island must Rejoin() and copy the state (it was evicted, or a sync
// went ahead without it): gRPC ABORTED / UNAUTHENTICATED from the coordinator.
bool IsRejoinNeeded(const absl::Status& status);

// The id of the ring member named in a RingAllReduce error ("member 'island-c' (tcp://...) disconnected"),
// "" when the message names none of plan.members (or names this island itself).
std::string VanishedMemberFromError(const absl::Status& ring_error, const SyncPlan& plan);

class CoordinatorClient {
 public:
  explicit CoordinatorClient(CoordinatorClientOptions options = {});
  ~CoordinatorClient();  // stops heartbeats and closes the session WITHOUT Leave (as a crash would)
  CoordinatorClient(const CoordinatorClient&) = delete;
  CoordinatorClient& operator=(const CoordinatorClient&) = delete;

  // Joins, opens the session stream and starts heartbeats. Blocks until admitted: the coordinator holds
  // answers until its first cohort (--min-islands) is complete, and a late joiner's answer until no sync
  // is in flight. Errors: FailedPrecondition for a model fingerprint mismatch (naming both fingerprints),
  // InvalidArgument for a bad request (naming the field), Unavailable when the coordinator cannot be
  // reached, AlreadyExists when an island with this id is still connected. With TLS: PermissionDenied when the
  // coordinator refuses the island_id for this certificate, Unavailable naming the TLS handshake when it fails
  // (a certificate from another CA, a plaintext coordinator) and, without TLS, when a coordinator keeps closing
  // the connection (it serves TLS). These are final: retrying would fail the same way.
  absl::StatusOr<Assignment> Connect(const std::string& server_address, const IslandJoinRequest& request);
  // Closes the old session (if any) and joins again with the same request; the answer normally carries a
  // state_source (the island is a late joiner again).
  absl::StatusOr<Assignment> Rejoin();

  // Waits until every current member has asked for `key` (or the coordinator's barrier deadline), then
  // returns the members of this epoch in ring order. Errors: IsRejoinNeeded when the island was evicted
  // or the sync went ahead without it; FailedPrecondition when the key went backwards or the experiment
  // is over.
  absl::StatusOr<SyncPlan> BeginSync(SyncKey key);

  // After a successful exchange and the outer step: `state_hash` is the hash of the global parameters and
  // outer optimizer state (e.g. OuterState::Hash()). Waits until every member reported; kCommit or kRepair.
  absl::StatusOr<Verdict> ReportSyncDone(const SyncPlan& plan, uint64_t state_hash, const SyncStats& stats);
  // After a failed exchange (nothing applied). `vanished_island` may be "" when unknown. Waits until every
  // member reported; kRetry (nobody completed: BeginSync again) or kRepair (someone completed: copy it).
  absl::StatusOr<Verdict> ReportSyncFailed(const SyncPlan& plan, const absl::Status& error,
                                           const std::string& vanished_island, const SyncStats& stats);
  // After a late join or a repair: the state after `key` has been copied and hashes to `state_hash`.
  // FailedPrecondition (naming both hashes) when it is not the committed hash of `key`.
  absl::Status ReportStateLoaded(SyncKey key, uint64_t state_hash);

  // Orderly departure; stops heartbeats and closes the session.
  absl::Status Leave(const std::string& reason);

  // Set when the coordinator evicted this island (session message or a refused call).
  bool evicted() const;
  std::string eviction_reason() const;
  const Assignment& assignment() const;  // the last one from Connect/Rejoin
  const std::string& island_id() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fl::diloco
