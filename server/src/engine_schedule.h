// The aggregation schedule: when updates become a step of the global model, and what the shared paths of the
// round engine do differently for it. The core holds one (EngineConfig::aggregation picks it at construction) and
// calls it where it used to test the mode (`buffered()`, `buffer_ != nullptr`): the shared paths have no mode
// checks left, and a third schedule is one implementation of this interface (docs/architecture.md, "The round
// engine"). Implementations: RoundEngine::Core::SyncRounds (synchronous rounds, with over-commitment and the
// deadline policies drop / fold; engine_schedule_sync.cc) and RoundEngine::Core::BufferedSteps (FedBuff buffered
// steps; engine_buffered.cc). Loop thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>

#include "engine_internal.h"

namespace fl::server {

// Nested in the core, so that an implementation reaches the core's parts (its tasks, clients, model and records).
class RoundEngine::Core::AggregationSchedule {
 public:
  virtual ~AggregationSchedule() = default;

  // experiments.aggregation (instrumentation::kAggregation*), and whether the console table's rows are steps.
  virtual std::string_view RecordName() const = 0;
  virtual bool RowsAreSteps() const = 0;
  // At Prepare, once the model and the records are ready.
  virtual void Prepare() {}
  // One step of Advance in kWaitingForClients, and in the schedule's own state (kBuffering); true: the state
  // moved back to kWaitingForClients and Advance looks again.
  virtual bool AdvanceWaiting() = 0;
  virtual bool AdvanceOwnState() { return false; }
  // EngineEffect::kOpenStep: the schedule's state was entered; open its unit (buffered: the step).
  virtual void OpenStep() {}
  // Before every Advance step (but after the end): deadlines of the schedule's own tasks.
  virtual void SweepDeadlines(int64_t /*now*/) {}
  // After the server's own stall (`stall_ns` long) moved every deadline on: move the schedule's own deadlines on
  // and re-arm its timers.
  virtual void AfterStall(int64_t /*stall_ns*/) {}
  // A shutdown: the schedule's open unit is recorded as aborted.
  virtual void Abort(const std::string& /*reason*/) {}
  // The open round is over (every task closed, its deadline passed, or CommitTargetReached): commit it or record
  // the attempt as failed. Only schedules whose units are rounds (kCollecting) have one.
  virtual void CloseRound() {}
  // The open round has what it commits with (over-commitment's K updates): close it now.
  virtual bool CommitTargetReached() const { return false; }
  // An upload for `task`, closed already, may still come (a late update the schedule folds).
  virtual bool LateUploadAdmitted(const TaskInfo& /*task*/) const { return false; }
  // An older model version that a task out may still download; null when none.
  virtual std::shared_ptr<const ModelPayload> OldPayload(uint64_t /*version*/) const { return nullptr; }
  // A validated train update (its row `rec`): the schedule's own verdict, or nullopt for the shared path (the
  // open round's). The schedule may move from `rec` only when it answers.
  virtual std::optional<fl::v1::UploadUpdateResponse> Accept(UploadDoneEvent& e, TaskInfo& task,
                                                             instrumentation::ClientRoundRecord& rec) = 0;
  // A train task closed without an update (dropped, late, refused at its header): true when the schedule
  // recorded it itself (the shared path stops).
  virtual bool TaskDropped(TaskInfo& /*task*/, instrumentation::ClientOutcome /*outcome*/, std::string_view /*why*/) {
    return false;
  }
  // Secure aggregation (synchronous rounds only; engine_secagg.h). A client's message of a secure stage
  // (ClientMessage.secagg_*): a refusal is recorded as a security event by the schedule.
  virtual void OnSecureMessage(ClientInfo& client, const fl::v1::ClientMessage& /*message*/, int64_t /*now*/) {
    RefuseSecureMessage(client,
                        "no secure round is open (the server runs without --secure-aggregation, or the "
                        "round is over)");
  }
  // Whether a masked upload for `task` may start now.
  virtual absl::Status MaskedUploadAdmitted(const TaskInfo& /*task*/) const {
    return absl::FailedPreconditionError("this server aggregates without secure aggregation");
  }
  // A fully received masked update, into the open round's running sum.
  virtual absl::Status AddMasked(const TaskInfo& /*task*/, std::span<const uint8_t> /*payload*/, int64_t /*now*/) {
    return absl::FailedPreconditionError("this server aggregates without secure aggregation");
  }
  // The client's own uplink time of an answered update: true when the schedule attached it to its row.
  virtual bool RecordUplink(const TaskInfo& /*task*/, double /*uplink_ms*/, std::optional<double> /*start_unix_ms*/,
                            std::optional<double> /*end_unix_ms*/) {
    return false;
  }

 protected:
  explicit AggregationSchedule(Core& core) : core_(core) {}
  // A secure-aggregation message refused: a security event naming the client and `why`.
  void RefuseSecureMessage(const ClientInfo& client, std::string_view why);
  Core& core_;
};

}  // namespace fl::server
