// The islands coordinator's three state machines, as data: their states, what moves them (triggers), what the
// coordinator does on each transition (effects), and the transition tables (from, trigger) -> (to, effect).
//
// The coordinator changes a state only through the one Fire() of each machine (coordinator_core.h), which looks
// the pair up here and refuses a pair that is not in the table (it logs an error naming both and changes
// nothing). docs/diloco-coordinator.md shows these tables row for row; diloco_coord_transitions_test parses the
// page and fails when it no longer equals the code.
//
//   - RunState: the experiment, one per coordinator.
//   - IslandState: one island from its Join to its departure (a rejoin is a new island with a new join_seq).
//   - SyncState: one sync key (step, fragment): its barrier, its epochs, and how it ended.
//
// Effects are what the coordinator does to the outside world (answers, session messages, deadlines); records,
// metrics and log lines are not effects but observers of the transitions (coordinator_observer.h).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

namespace fl::diloco {

// ---- The experiment ----

enum class RunState : uint8_t {
  kGatheringCohort,  // Join answers are held until --min-islands islands asked
  kRunning,          // islands are admitted as they come (late joiners copy the state) and sync
  kFinished,         // the schedule's last sync committed; the coordinator waits for the islands to leave
  kFailed,           // one sync failed --max-sync-attempts times; Joins and BeginSyncs are refused
  kShutDown,         // Shutdown() (a signal, the end of the run, the destructor): every call is refused
};
enum class RunTrigger : uint8_t {
  kCohortComplete,     // --min-islands islands are waiting for their Join answer
  kLastSyncCommitted,  // the sync (outer_steps - 1, fragments - 1) committed
  kSyncGaveUp,         // an epoch that nobody applied was its key's --max-sync-attempts-th
  kShutdown,
};
enum class RunEffect : uint8_t {
  kNone,
  kAdmitWaiting,  // answer the held Joins
  kShutDown,      // tell every session, answer every held call UNAVAILABLE, abandon the open epochs
};

// ---- One island ----

enum class IslandState : uint8_t {
  kWaiting,    // its Join is held: the first cohort is incomplete, or an epoch is in flight
  kLoading,    // admitted late: copying the committed state; in no ring until its StateLoaded
  kActive,     // a member: every barrier from now on waits for it
  kRepairing,  // a member told to repair its state: BeginSync is refused until its StateLoaded
  kGone,       // left, evicted, refused or shut down; calls with its token fail with "rejoin"
};
enum class IslandTrigger : uint8_t {
  kAdmitted,            // answered with a fresh start: nothing has been committed yet
  kAdmittedLate,        // answered with a state source: a sync has been committed
  kNoStateSource,       // refused: no live island holds the committed state
  kRejoin,              // a new Join with the same id replaced this held one
  kStateLoaded,         // StateLoaded with the committed hash of the sync it was sent to copy
  kRepairOrdered,       // a verdict told it to copy the committed state (its hash differed, or its exchange failed)
  kRepaired,            // StateLoaded with the committed hash of the repair's sync
  kLeft,                // Leave
  kSessionClosed,       // its session stream ended
  kHeartbeatLost,       // no heartbeat for --heartbeat-timeout-ms
  kVanished,            // blamed for a failed exchange, and silent for --blame-grace-ms (at once after attempt 0)
  kMissedBarrier,       // not at a barrier --barrier-timeout-ms after its first arrival, or the sync went ahead
  kMissedReport,        // no report --report-timeout-ms after its epoch's first report
  kCertificateRevoked,  // a reload of --tls-crl found the certificate it joined (or opened its session) with
  kShutdown,
};
enum class IslandEffect : uint8_t {
  kNone,
  kAnswerJoin,       // send the held Join's answer; start watching its heartbeats
  kRefuseJoin,       // answer the held Join with the error
  kHoldState,        // it holds the committed state now: a source for late joiners
  kEvict,            // push IslandEvicted on its session, close it, fail its held BeginSyncs ("rejoin")
  kRelease,          // close its session without a message, fail its held BeginSyncs
  kShutdownSession,  // push IslandShutdown on its session and close it
};

// ---- One sync key ----

enum class SyncState : uint8_t {
  kIdle,        // no island asked yet, or the last epoch was retried
  kGathering,   // the barrier: islands asked, waiting for every expected one
  kExchanging,  // an epoch formed: its members exchange and report
  kCommitted,   // an epoch committed it (terminal)
  kFailed,      // --max-sync-attempts epochs failed (terminal; the experiment failed)
  kAbandoned,   // the coordinator shut down during its barrier or epoch (terminal)
};
enum class SyncTrigger : uint8_t {
  kFirstArrival,     // the first BeginSync of this key (or of its next attempt)
  kArrivalsGone,     // every island that had arrived was evicted
  kBarrierComplete,  // every expected island arrived
  kMajorityApplied,  // every member reported or is gone, and a live member applied it
  kNobodyApplied,    // every member reported or is gone, and no live member applied it
  kGaveUp,           // kNobodyApplied on the key's --max-sync-attempts-th epoch
  kShutdown,
};
enum class SyncEffect : uint8_t {
  kNone,
  kArmBarrierDeadline,  // --barrier-timeout-ms from now: evict the expected islands that did not arrive
  kSendPlans,           // answer every arrival with the epoch's plan (members in ring order)
  kSendVerdicts,        // answer every report: COMMIT, REPAIR (with a source), RETRY, or the failure
  kAnswerUnavailable,   // answer the held BeginSyncs and reports UNAVAILABLE
};

template <class State, class Trigger, class Effect>
struct Transition {
  State from;
  Trigger trigger;
  State to;
  Effect effect;
};
using RunTransitionRow = Transition<RunState, RunTrigger, RunEffect>;
using IslandTransitionRow = Transition<IslandState, IslandTrigger, IslandEffect>;
using SyncTransitionRow = Transition<SyncState, SyncTrigger, SyncEffect>;

// clang-format off
inline constexpr std::array kRunTransitions = {
    RunTransitionRow{RunState::kGatheringCohort, RunTrigger::kCohortComplete,    RunState::kRunning,  RunEffect::kAdmitWaiting},
    RunTransitionRow{RunState::kRunning,         RunTrigger::kLastSyncCommitted, RunState::kFinished, RunEffect::kNone},
    RunTransitionRow{RunState::kRunning,         RunTrigger::kSyncGaveUp,        RunState::kFailed,   RunEffect::kNone},
    // Streaming DiLoCo: an earlier key's epoch may still be open when the last key commits.
    RunTransitionRow{RunState::kFinished,        RunTrigger::kSyncGaveUp,        RunState::kFailed,   RunEffect::kNone},
    RunTransitionRow{RunState::kGatheringCohort, RunTrigger::kShutdown,          RunState::kShutDown, RunEffect::kShutDown},
    RunTransitionRow{RunState::kRunning,         RunTrigger::kShutdown,          RunState::kShutDown, RunEffect::kShutDown},
    RunTransitionRow{RunState::kFinished,        RunTrigger::kShutdown,          RunState::kShutDown, RunEffect::kShutDown},
    RunTransitionRow{RunState::kFailed,          RunTrigger::kShutdown,          RunState::kShutDown, RunEffect::kShutDown},
};

// Departures are the same from every live state, except that an island still loading belongs to no epoch
// (so it cannot miss a report or be blamed for an exchange).
inline constexpr std::array kIslandTransitions = {
    IslandTransitionRow{IslandState::kWaiting,   IslandTrigger::kAdmitted,      IslandState::kActive,    IslandEffect::kAnswerJoin},
    IslandTransitionRow{IslandState::kWaiting,   IslandTrigger::kAdmittedLate,  IslandState::kLoading,   IslandEffect::kAnswerJoin},
    IslandTransitionRow{IslandState::kWaiting,   IslandTrigger::kNoStateSource, IslandState::kGone,      IslandEffect::kRefuseJoin},
    IslandTransitionRow{IslandState::kWaiting,   IslandTrigger::kRejoin,        IslandState::kGone,      IslandEffect::kRefuseJoin},
    IslandTransitionRow{IslandState::kWaiting,   IslandTrigger::kCertificateRevoked, IslandState::kGone,  IslandEffect::kRefuseJoin},
    IslandTransitionRow{IslandState::kWaiting,   IslandTrigger::kShutdown,      IslandState::kGone,      IslandEffect::kRefuseJoin},
    IslandTransitionRow{IslandState::kLoading,   IslandTrigger::kStateLoaded,   IslandState::kActive,    IslandEffect::kHoldState},
    IslandTransitionRow{IslandState::kLoading,   IslandTrigger::kLeft,          IslandState::kGone,      IslandEffect::kRelease},
    IslandTransitionRow{IslandState::kLoading,   IslandTrigger::kSessionClosed, IslandState::kGone,      IslandEffect::kRelease},
    IslandTransitionRow{IslandState::kLoading,   IslandTrigger::kHeartbeatLost, IslandState::kGone,      IslandEffect::kEvict},
    IslandTransitionRow{IslandState::kLoading,   IslandTrigger::kMissedBarrier, IslandState::kGone,      IslandEffect::kEvict},
    IslandTransitionRow{IslandState::kLoading,   IslandTrigger::kCertificateRevoked, IslandState::kGone,  IslandEffect::kEvict},
    IslandTransitionRow{IslandState::kLoading,   IslandTrigger::kShutdown,      IslandState::kGone,      IslandEffect::kShutdownSession},
    IslandTransitionRow{IslandState::kActive,    IslandTrigger::kRepairOrdered, IslandState::kRepairing, IslandEffect::kNone},
    IslandTransitionRow{IslandState::kActive,    IslandTrigger::kLeft,          IslandState::kGone,      IslandEffect::kRelease},
    IslandTransitionRow{IslandState::kActive,    IslandTrigger::kSessionClosed, IslandState::kGone,      IslandEffect::kRelease},
    IslandTransitionRow{IslandState::kActive,    IslandTrigger::kHeartbeatLost, IslandState::kGone,      IslandEffect::kEvict},
    IslandTransitionRow{IslandState::kActive,    IslandTrigger::kVanished,      IslandState::kGone,      IslandEffect::kEvict},
    IslandTransitionRow{IslandState::kActive,    IslandTrigger::kMissedBarrier, IslandState::kGone,      IslandEffect::kEvict},
    IslandTransitionRow{IslandState::kActive,    IslandTrigger::kMissedReport,  IslandState::kGone,      IslandEffect::kEvict},
    IslandTransitionRow{IslandState::kActive,    IslandTrigger::kCertificateRevoked, IslandState::kGone,  IslandEffect::kEvict},
    IslandTransitionRow{IslandState::kActive,    IslandTrigger::kShutdown,      IslandState::kGone,      IslandEffect::kShutdownSession},
    // With Streaming DiLoCo's overlap a member may be in a later epoch when an earlier one orders a repair.
    IslandTransitionRow{IslandState::kRepairing, IslandTrigger::kRepairOrdered, IslandState::kRepairing, IslandEffect::kNone},
    IslandTransitionRow{IslandState::kRepairing, IslandTrigger::kRepaired,      IslandState::kActive,    IslandEffect::kHoldState},
    IslandTransitionRow{IslandState::kRepairing, IslandTrigger::kLeft,          IslandState::kGone,      IslandEffect::kRelease},
    IslandTransitionRow{IslandState::kRepairing, IslandTrigger::kSessionClosed, IslandState::kGone,      IslandEffect::kRelease},
    IslandTransitionRow{IslandState::kRepairing, IslandTrigger::kHeartbeatLost, IslandState::kGone,      IslandEffect::kEvict},
    IslandTransitionRow{IslandState::kRepairing, IslandTrigger::kVanished,      IslandState::kGone,      IslandEffect::kEvict},
    IslandTransitionRow{IslandState::kRepairing, IslandTrigger::kMissedBarrier, IslandState::kGone,      IslandEffect::kEvict},
    IslandTransitionRow{IslandState::kRepairing, IslandTrigger::kMissedReport,  IslandState::kGone,      IslandEffect::kEvict},
    IslandTransitionRow{IslandState::kRepairing, IslandTrigger::kCertificateRevoked, IslandState::kGone,  IslandEffect::kEvict},
    IslandTransitionRow{IslandState::kRepairing, IslandTrigger::kShutdown,      IslandState::kGone,      IslandEffect::kShutdownSession},
};

inline constexpr std::array kSyncTransitions = {
    SyncTransitionRow{SyncState::kIdle,       SyncTrigger::kFirstArrival,    SyncState::kGathering,  SyncEffect::kArmBarrierDeadline},
    SyncTransitionRow{SyncState::kGathering,  SyncTrigger::kArrivalsGone,    SyncState::kIdle,       SyncEffect::kNone},
    SyncTransitionRow{SyncState::kGathering,  SyncTrigger::kBarrierComplete, SyncState::kExchanging, SyncEffect::kSendPlans},
    SyncTransitionRow{SyncState::kExchanging, SyncTrigger::kMajorityApplied, SyncState::kCommitted,  SyncEffect::kSendVerdicts},
    SyncTransitionRow{SyncState::kExchanging, SyncTrigger::kNobodyApplied,   SyncState::kIdle,       SyncEffect::kSendVerdicts},
    SyncTransitionRow{SyncState::kExchanging, SyncTrigger::kGaveUp,          SyncState::kFailed,     SyncEffect::kSendVerdicts},
    SyncTransitionRow{SyncState::kGathering,  SyncTrigger::kShutdown,        SyncState::kAbandoned,  SyncEffect::kAnswerUnavailable},
    SyncTransitionRow{SyncState::kExchanging, SyncTrigger::kShutdown,        SyncState::kAbandoned,  SyncEffect::kAnswerUnavailable},
};
// clang-format on

// The row for (from, trigger), or nullopt when the table has none (the transition is refused).
template <class Row, size_t N, class State, class Trigger>
constexpr std::optional<Row> FindTransition(const std::array<Row, N>& table, State from, Trigger trigger) {
  for (const Row& row : table) {
    if (row.from == from && row.trigger == trigger) return row;
  }
  return std::nullopt;
}

// Each (from, trigger) pair appears at most once: a machine is deterministic.
template <class Row, size_t N>
constexpr bool Deterministic(const std::array<Row, N>& table) {
  for (size_t i = 0; i < N; ++i) {
    for (size_t j = i + 1; j < N; ++j) {
      if (table[i].from == table[j].from && table[i].trigger == table[j].trigger) return false;
    }
  }
  return true;
}
static_assert(Deterministic(kRunTransitions));
static_assert(Deterministic(kIslandTransitions));
static_assert(Deterministic(kSyncTransitions));

// snake_case names, as in the docs' tables, the logs and the records (`kHeartbeatLost` -> "heartbeat_lost").
std::string_view Name(RunState v);
std::string_view Name(RunTrigger v);
std::string_view Name(RunEffect v);
std::string_view Name(IslandState v);
std::string_view Name(IslandTrigger v);
std::string_view Name(IslandEffect v);
std::string_view Name(SyncState v);
std::string_view Name(SyncTrigger v);
std::string_view Name(SyncEffect v);

// The departures that count as evictions (Snapshot().evictions, fl_island_departures_total): every trigger
// that ends an island except the refusal for want of a state source and the shutdown.
bool IsEviction(IslandTrigger trigger);
// The `reason` label of fl_island_departures_total for an eviction ("left", "heartbeat", ...).
std::string_view DepartureLabel(IslandTrigger trigger);

// Whether an island in this state is a member (counted live, expected at barriers, sent heartbeats for).
constexpr bool IsLive(IslandState s) {
  return s == IslandState::kLoading || s == IslandState::kActive || s == IslandState::kRepairing;
}

}  // namespace fl::diloco
