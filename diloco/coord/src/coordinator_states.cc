// Names of the coordinator's states, triggers, effects and outcomes: the spelling of the docs' tables, the
// logs, and (for outcomes and verdicts) the records and metrics, which must not change.
#include "fl/diloco/coord/coordinator_states.h"

#include "fl/diloco/coord/coordinator_observer.h"

namespace fl::diloco {

std::string_view Name(RunState v) {
  switch (v) {
    case RunState::kGatheringCohort: return "gathering_cohort";
    case RunState::kRunning: return "running";
    case RunState::kFinished: return "finished";
    case RunState::kFailed: return "failed";
    case RunState::kShutDown: return "shut_down";
  }
  return "?";
}

std::string_view Name(RunTrigger v) {
  switch (v) {
    case RunTrigger::kCohortComplete: return "cohort_complete";
    case RunTrigger::kLastSyncCommitted: return "last_sync_committed";
    case RunTrigger::kSyncGaveUp: return "sync_gave_up";
    case RunTrigger::kShutdown: return "shutdown";
  }
  return "?";
}

std::string_view Name(RunEffect v) {
  switch (v) {
    case RunEffect::kNone: return "none";
    case RunEffect::kAdmitWaiting: return "admit_waiting";
    case RunEffect::kShutDown: return "shut_down";
  }
  return "?";
}

std::string_view Name(IslandState v) {
  switch (v) {
    case IslandState::kWaiting: return "waiting";
    case IslandState::kLoading: return "loading";
    case IslandState::kActive: return "active";
    case IslandState::kRepairing: return "repairing";
    case IslandState::kGone: return "gone";
  }
  return "?";
}

std::string_view Name(IslandTrigger v) {
  switch (v) {
    case IslandTrigger::kAdmitted: return "admitted";
    case IslandTrigger::kAdmittedLate: return "admitted_late";
    case IslandTrigger::kNoStateSource: return "no_state_source";
    case IslandTrigger::kRejoin: return "rejoin";
    case IslandTrigger::kStateLoaded: return "state_loaded";
    case IslandTrigger::kRepairOrdered: return "repair_ordered";
    case IslandTrigger::kRepaired: return "repaired";
    case IslandTrigger::kLeft: return "left";
    case IslandTrigger::kSessionClosed: return "session_closed";
    case IslandTrigger::kHeartbeatLost: return "heartbeat_lost";
    case IslandTrigger::kVanished: return "vanished";
    case IslandTrigger::kMissedBarrier: return "missed_barrier";
    case IslandTrigger::kMissedReport: return "missed_report";
    case IslandTrigger::kCertificateRevoked: return "certificate_revoked";
    case IslandTrigger::kShutdown: return "shutdown";
  }
  return "?";
}

std::string_view Name(IslandEffect v) {
  switch (v) {
    case IslandEffect::kNone: return "none";
    case IslandEffect::kAnswerJoin: return "answer_join";
    case IslandEffect::kRefuseJoin: return "refuse_join";
    case IslandEffect::kHoldState: return "hold_state";
    case IslandEffect::kEvict: return "evict";
    case IslandEffect::kRelease: return "release";
    case IslandEffect::kShutdownSession: return "shutdown_session";
  }
  return "?";
}

std::string_view Name(SyncState v) {
  switch (v) {
    case SyncState::kIdle: return "idle";
    case SyncState::kGathering: return "gathering";
    case SyncState::kExchanging: return "exchanging";
    case SyncState::kCommitted: return "committed";
    case SyncState::kFailed: return "failed";
    case SyncState::kAbandoned: return "abandoned";
  }
  return "?";
}

std::string_view Name(SyncTrigger v) {
  switch (v) {
    case SyncTrigger::kFirstArrival: return "first_arrival";
    case SyncTrigger::kArrivalsGone: return "arrivals_gone";
    case SyncTrigger::kBarrierComplete: return "barrier_complete";
    case SyncTrigger::kMajorityApplied: return "majority_applied";
    case SyncTrigger::kNobodyApplied: return "nobody_applied";
    case SyncTrigger::kGaveUp: return "gave_up";
    case SyncTrigger::kShutdown: return "shutdown";
  }
  return "?";
}

std::string_view Name(SyncEffect v) {
  switch (v) {
    case SyncEffect::kNone: return "none";
    case SyncEffect::kArmBarrierDeadline: return "arm_barrier_deadline";
    case SyncEffect::kSendPlans: return "send_plans";
    case SyncEffect::kSendVerdicts: return "send_verdicts";
    case SyncEffect::kAnswerUnavailable: return "answer_unavailable";
  }
  return "?";
}

bool IsEviction(IslandTrigger trigger) { return !DepartureLabel(trigger).empty(); }

std::string_view DepartureLabel(IslandTrigger trigger) {
  switch (trigger) {
    case IslandTrigger::kRejoin: return "rejoin";
    case IslandTrigger::kLeft: return "left";
    case IslandTrigger::kSessionClosed: return "session_closed";
    case IslandTrigger::kHeartbeatLost: return "heartbeat";
    case IslandTrigger::kVanished: return "vanished";
    case IslandTrigger::kMissedBarrier: return "missed_barrier";
    case IslandTrigger::kMissedReport: return "missed_report";
    case IslandTrigger::kCertificateRevoked: return "revoked";
    default: return "";
  }
}

std::string_view Name(EpochOutcome v) {
  switch (v) {
    case EpochOutcome::kCommitted: return "committed";
    case EpochOutcome::kRetried: return "retried";
    case EpochOutcome::kAbandoned: return "abandoned";
  }
  return "?";
}

std::string_view Name(MemberOutcome v) {
  switch (v) {
    case MemberOutcome::kApplied: return "applied";
    case MemberOutcome::kMismatch: return "mismatch";
    case MemberOutcome::kFailed: return "failed";
    case MemberOutcome::kMissing: return "missing";
  }
  return "?";
}

std::string_view Name(MemberVerdict v) {
  switch (v) {
    case MemberVerdict::kCommit: return "commit";
    case MemberVerdict::kRepair: return "repair";
    case MemberVerdict::kRetry: return "retry";
    case MemberVerdict::kEvicted: return "evicted";
  }
  return "?";
}

}  // namespace fl::diloco
