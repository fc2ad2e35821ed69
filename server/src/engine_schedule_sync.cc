// Synchronous rounds (the default schedule): selection and dispatch from kWaitingForClients, a round's commit at
// its last answer, its deadline, or over-commitment's K updates; late updates folded into the next commit under
// --deadline-policy fold (engine_overcommit.cc, engine_rounds.cc).
#include <algorithm>

#include <spdlog/spdlog.h>

#include "engine_schedule.h"

namespace fl::server {

class RoundEngine::Core::SyncRounds final : public AggregationSchedule {
 public:
  explicit SyncRounds(Core& core) : core_(core) {}

  std::string_view RecordName() const override { return instrumentation::kAggregationSynchronous; }
  bool RowsAreSteps() const override { return false; }

  bool AdvanceWaiting() override {
    Core& c = core_;
    if (c.evaluation_due_) {
      // Resumed after a crash during round_'s evaluation: redo it with as many clients as a round waits for.
      if (c.clients_.connected() < std::max<uint32_t>(1, c.config_.fit.min_available) ||
          c.IdleConnectedClients().size() < std::max<uint32_t>(1, c.config_.fit.min_available)) {
        return false;
      }
      c.evaluation_due_ = false;
      spdlog::info("redoing the evaluation of round {} (interrupted before its results were recorded)", c.round_);
      c.StartEvaluation();
      if (c.state_ == EngineState::kEvaluating) return false;
    }
    if (c.round_ >= c.config_.num_rounds) return c.Fire(EngineTrigger::kAllRoundsCommitted);
    c.StartRound();
    return false;
  }

  bool CommitTargetReached() const override { return core_.CommitTargetReached(); }
  bool LateUploadAdmitted(const TaskInfo& task) const override { return core_.LateUploadAdmitted(task); }
  std::optional<fl::v1::UploadUpdateResponse> Accept(UploadDoneEvent& e, TaskInfo& task,
                                                     instrumentation::ClientRoundRecord& rec) override {
    // Over-commitment's cancelled tasks; --deadline-policy fold's late updates (engine_overcommit.cc).
    return core_.FoldLateUpdate(e, task, rec);
  }

 private:
  Core& core_;
};

std::unique_ptr<RoundEngine::Core::AggregationSchedule> RoundEngine::Core::MakeSyncRounds() {
  return std::make_unique<SyncRounds>(*this);
}

}  // namespace fl::server
