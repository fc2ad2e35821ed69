// Buffered steps (FedBuff, --aggregation buffered): clients train continuously on the newest model, their
// updates fill the buffer of the next aggregation step, weighted by staleness (engine_buffered.cc holds the
// step's work; docs/round-engine.md, "Buffered aggregation").
#include "engine_schedule.h"

namespace fl::server {

class RoundEngine::Core::BufferedSteps final : public AggregationSchedule {
 public:
  explicit BufferedSteps(Core& core) : core_(core) {}

  std::string_view RecordName() const override { return instrumentation::kAggregationBuffered; }
  bool RowsAreSteps() const override { return true; }
  void Prepare() override {
    core_.buffer_ = std::make_unique<BufferState>();
    core_.buffer_->weight = *ParseStalenessWeight(core_.config_.staleness_weight);  // checked by Validate()
  }
  bool AdvanceWaiting() override { return core_.AdvanceBuffered(); }
  bool AdvanceOwnState() override { return core_.AdvanceBuffered(); }
  // Train tasks run through every state (evaluations too): their deadlines are swept before each step.
  void SweepDeadlines(int64_t now) override { core_.CloseExpiredBufferedTasks(now); }
  void AfterStall() override { core_.ArmBufferTimer(); }
  void Abort(const std::string& reason) override { core_.AbortBufferedStep(reason); }
  std::shared_ptr<const ModelPayload> OldPayload(uint64_t version) const override {
    auto old = core_.buffer_->old_payloads.find(version);
    return old == core_.buffer_->old_payloads.end() ? nullptr : old->second;
  }
  std::optional<fl::v1::UploadUpdateResponse> Accept(UploadDoneEvent& e, TaskInfo& task,
                                                     instrumentation::ClientRoundRecord& rec) override {
    return core_.AcceptBufferedUpdate(e, task, std::move(rec));
  }
  // The row goes to the open step, and the client waits for that step.
  bool TaskDropped(TaskInfo& task, instrumentation::ClientOutcome outcome, std::string_view why) override {
    if (task.kind != fl::v1::TASK_KIND_TRAIN) return false;
    core_.BufferedTaskDropped(task, outcome, why);
    return true;
  }
  bool RecordUplink(const TaskInfo& task, double uplink_ms, std::optional<double> start_unix_ms,
                    std::optional<double> end_unix_ms) override {
    return core_.RecordBufferedUplink(task, uplink_ms, start_unix_ms, end_unix_ms);
  }

 private:
  Core& core_;
};

std::unique_ptr<RoundEngine::Core::AggregationSchedule> RoundEngine::Core::MakeBufferedSteps() {
  return std::make_unique<BufferedSteps>(*this);
}

}  // namespace fl::server
