// Observers of the islands coordinator's state machines (coordinator_states.h). Records (SQLite), metrics
// (Prometheus) and the log lines are observers: the coordinator tells them every transition, on its loop thread,
// before it carries out the transition's effect (so whoever got an answer finds the records, metrics and logs of
// what led to it). An observer must not block and must not call back into the coordinator; a test may add its
// own (CoordinatorOptions::observers) to see the exact sequence of transitions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fl/diloco/coord/coordinator_client.h"
#include "fl/diloco/coord/coordinator_states.h"

namespace fl::diloco {

// The experiment changed state.
struct RunChange {
  RunState from;
  RunState to;
  RunTrigger trigger;
  std::string_view reason;     // kSyncGaveUp: the failure; kShutdown: why; "" otherwise
  size_t cohort = 0;           // kCohortComplete: islands in the first cohort
  std::optional<SyncKey> key;  // kLastSyncCommitted: the last sync
};

// One island changed state.
struct IslandChange {
  const IslandJoinRequest& island;  // what it said when it joined
  uint64_t join_seq = 0;
  IslandState from;
  IslandState to;
  IslandTrigger trigger;
  std::string_view reason;              // departures and refusals: why, in words (kLeft: the island's own reason)
  int64_t unix_ms = 0;                  // when, on the coordinator's clock
  int64_t live_islands = 0;             // members (loading, active, repairing) after the transition
  const StateSource* source = nullptr;  // kAdmittedLate, kRepairOrdered: where it copies the state from
  std::optional<SyncKey> key;           // kStateLoaded, kRepaired, kRepairOrdered: the sync of that state
  uint64_t epoch = 0;                   // kRepaired, kRepairOrdered: the epoch whose verdict ordered the repair
};

// An epoch as it was formed.
struct EpochInfo {
  uint64_t number = 0;  // globally increasing; the ring's exchange id
  SyncKey key;
  uint32_t attempt = 0;              // 0 for the key's first epoch
  std::vector<std::string> members;  // ring order (admission order)
  std::vector<uint64_t> join_seqs;   // of `members`, same order
  double barrier_ms = 0;             // first arrival at the barrier -> formed
  int64_t formed_unix_ms = 0;
};

// How an epoch ended, for the epoch (island_epochs.outcome, fl_island_epochs_total) ...
enum class EpochOutcome : uint8_t { kCommitted, kRetried, kAbandoned };
// ... and for each member: what it reported (island_syncs.outcome, fl_island_syncs_total) ...
enum class MemberOutcome : uint8_t {
  kApplied,   // applied, with the committed hash
  kMismatch,  // applied, with another hash (or nothing was committed)
  kFailed,    // its exchange failed (nothing applied)
  kMissing,   // no report: it was gone before it reported
};
// ... and what it was told (island_syncs.verdict).
enum class MemberVerdict : uint8_t { kCommit, kRepair, kRetry, kEvicted };
// The records' and metrics' spelling: "committed", "mismatch", "evicted", ...
std::string_view Name(EpochOutcome v);
std::string_view Name(MemberOutcome v);
std::string_view Name(MemberVerdict v);

struct MemberResult {
  std::string island_id;
  uint64_t join_seq = 0;
  size_t ring_index = 0;
  bool reported = false;
  bool applied = false;     // reported SyncDone (else SyncFailed, or nothing)
  uint64_t state_hash = 0;  // with `applied`
  SyncStats stats;          // with `reported`
  std::string failure_reason;
  std::string vanished_island;
  int64_t reported_unix_ms = 0;
  MemberOutcome outcome = MemberOutcome::kMissing;
  MemberVerdict verdict = MemberVerdict::kEvicted;
  std::string repair_source;  // with kRepair
  // Applied, but not the majority's hash: a divergence (logged as an error, counted, repaired).
  bool mismatched() const { return applied && verdict == MemberVerdict::kRepair; }
};

struct EpochResolution {
  EpochOutcome outcome = EpochOutcome::kRetried;
  std::optional<uint64_t> committed_hash;
  int agreeing = 0;    // live members that applied the committed hash
  std::string reason;  // retried, abandoned, given up: why
  int64_t resolved_unix_ms = 0;
  std::vector<MemberResult> members;  // ring order; empty when abandoned
};

// One sync key changed state.
struct SyncChange {
  SyncKey key;
  SyncState from;
  SyncState to;
  SyncTrigger trigger;
  const EpochInfo* epoch = nullptr;             // from kBarrierComplete on: the epoch concerned
  const EpochResolution* resolution = nullptr;  // the epoch's end (kMajorityApplied, kNobodyApplied, kGaveUp,
                                                // kShutdown of an open epoch)
  std::optional<SyncKey> last_committed;        // the newest committed sync after the transition
};

class CoordinatorObserver {
 public:
  virtual ~CoordinatorObserver() = default;
  virtual void OnRun(const RunChange& /*change*/) {}
  virtual void OnIsland(const IslandChange& /*change*/) {}
  virtual void OnSync(const SyncChange& /*change*/) {}
};

}  // namespace fl::diloco
