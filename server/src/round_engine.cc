// The round engine's lifecycle and state machine: configuration, start (fresh, from an initial model, or
// resumed), the event loop and its timers, the transition table, Advance (which moves the machine as far as
// the facts allow after every loop turn), and the end of the run.
#include "fl/server/round_engine.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <unistd.h>

#include <spdlog/spdlog.h>

#include "absl/strings/str_format.h"
#include "fl/core/log_format.h"
#include "fl/core/str_cat.h"
#include "fl/proto/convert.h"
#include <nlohmann/json.hpp>

#include "engine_internal.h"
#include "engine_schedule.h"

namespace fl::server {

using namespace engine_internal;  // NOLINT: the engine's own helpers

std::string_view EngineStateName(EngineState state) {
  switch (state) {
    case EngineState::kWaitingForModel: return "waiting_for_model";
    case EngineState::kWaitingForClients: return "waiting_for_clients";
    case EngineState::kCollecting: return "collecting";
    case EngineState::kEvaluating: return "evaluating";
    case EngineState::kDraining: return "draining";
    case EngineState::kFinished: return "finished";
    case EngineState::kBuffering: return "buffering";
    case EngineState::kUnmasking: return "unmasking";
  }
  return "unknown";
}

std::string_view EngineTriggerName(EngineTrigger trigger) {
  switch (trigger) {
    case EngineTrigger::kInitialModelAdopted: return "initial_model_adopted";
    case EngineTrigger::kRoundStarted: return "round_started";
    case EngineTrigger::kRoundCommitted: return "round_committed";
    case EngineTrigger::kRoundFailed: return "round_failed";
    case EngineTrigger::kEvaluationStarted: return "evaluation_started";
    case EngineTrigger::kEvaluationStored: return "evaluation_stored";
    case EngineTrigger::kAllRoundsCommitted: return "all_rounds_committed";
    case EngineTrigger::kDrained: return "drained";
    case EngineTrigger::kGaveUp: return "gave_up";
    case EngineTrigger::kShutdown: return "shutdown";
    case EngineTrigger::kBufferingStarted: return "buffering_started";
    case EngineTrigger::kStepApplied: return "step_applied";
    case EngineTrigger::kStepFailed: return "step_failed";
    case EngineTrigger::kModelLoaded: return "model_loaded";
    case EngineTrigger::kBudgetSpent: return "budget_spent";
    case EngineTrigger::kUnmaskStarted: return "unmask_started";
    case EngineTrigger::kInvariantBroken: return "invariant_broken";
  }
  return "unknown";
}

namespace {

using S = EngineState;
using T = EngineTrigger;
using E = EngineEffect;

constexpr std::string_view kBrokenEffect = "log critical; the experiment failed; tell every client";

// The round engine's transition table. docs/round-engine.md shows the same rows (a test compares them).
constexpr EngineTransition kTransitions[] = {
    {S::kWaitingForModel, T::kInitialModelAdopted, S::kWaitingForClients, E::kNone,
     "adopt the uploaded weights; write the round-0 checkpoint"},
    {S::kWaitingForModel, T::kModelLoaded, S::kWaitingForClients, E::kNone,
     "adopt the checkpoint's model (--initial-model, or --resume's last committed round)"},
    {S::kWaitingForModel, T::kShutdown, S::kFinished, E::kEndRun, "tell every client; the experiment is aborted"},
    {S::kWaitingForClients, T::kRoundStarted, S::kCollecting, E::kArmDeadline,
     "select idle clients; dispatch train tasks; arm the round deadline"},
    {S::kWaitingForClients, T::kEvaluationStarted, S::kEvaluating, E::kArmDeadline,
     "select idle clients; dispatch evaluate tasks; arm the evaluation deadline"},
    {S::kWaitingForClients, T::kAllRoundsCommitted, S::kDraining, E::kArmDrainGrace,
     "arm the grace for the last uplink reports"},
    {S::kWaitingForClients, T::kShutdown, S::kFinished, E::kEndRun, "tell every client; the experiment is aborted"},
    {S::kWaitingForClients, T::kBudgetSpent, S::kDraining, E::kArmDrainGrace,
     "the next round would spend past --dp-target-epsilon: no round more; arm the grace for the last uplink "
     "reports"},
    {S::kCollecting, T::kRoundCommitted, S::kWaitingForClients, E::kNone,
     "aggregate; server optimizer step; write the checkpoint; store the round's records as one commit"},
    {S::kCollecting, T::kRoundFailed, S::kWaitingForClients, E::kNone,
     "record the attempt as failed with its reason; the next attempt waits for clients"},
    {S::kCollecting, T::kGaveUp, S::kFinished, E::kEndRun,
     "attempts exhausted, or the step, checkpoint or records failed: the experiment failed"},
    {S::kCollecting, T::kShutdown, S::kFinished, E::kEndRun,
     "cancel open tasks; record the attempt as aborted; tell every client"},
    {S::kEvaluating, T::kEvaluationStored, S::kWaitingForClients, E::kNone,
     "store the clients' results and the round's figures as one commit"},
    {S::kEvaluating, T::kGaveUp, S::kFinished, E::kEndRun, "the evaluation's records failed: the experiment failed"},
    {S::kEvaluating, T::kShutdown, S::kFinished, E::kEndRun, "cancel open tasks; tell every client"},
    {S::kDraining, T::kDrained, S::kFinished, E::kEndRun, "the experiment finished; tell every client"},
    {S::kDraining, T::kGaveUp, S::kFinished, E::kEndRun, "the final records failed: the experiment failed"},
    {S::kDraining, T::kShutdown, S::kFinished, E::kEndRun, "tell every client; the experiment is aborted"},
    // Buffered aggregation (engine_buffered.cc); evaluations and the end go through the rows above.
    {S::kWaitingForClients, T::kBufferingStarted, S::kBuffering, E::kOpenStep,
     "keep --concurrency clients training on the newest model; their updates fill the step's buffer"},
    {S::kBuffering, T::kStepApplied, S::kWaitingForClients, E::kNone,
     "staleness-weighted mean of the buffer; server optimizer step; write the checkpoint; store the step's records "
     "as one commit"},
    {S::kBuffering, T::kStepFailed, S::kWaitingForClients, E::kNone,
     "record the step's attempt as failed (no update buffered and no client left to train); train tasks go out "
     "again"},
    {S::kBuffering, T::kGaveUp, S::kFinished, E::kEndRun,
     "attempts exhausted, or the step, checkpoint or records failed: the experiment failed"},
    {S::kBuffering, T::kShutdown, S::kFinished, E::kEndRun,
     "cancel train tasks out; record the open step as aborted; tell every client"},
    // Secure aggregation (engine_secagg.h): a round's commit waits for the unmask stage.
    {S::kCollecting, T::kUnmaskStarted, S::kUnmasking, E::kNone,
     "the masked upload closed with enough survivors: ask them for the shares that remove the masks (the unmask "
     "stage's own deadline)"},
    {S::kUnmasking, T::kRoundCommitted, S::kWaitingForClients, E::kNone,
     "unmask the sum of the survivors' updates; server optimizer step; write the checkpoint; store the round's "
     "records as one commit"},
    {S::kUnmasking, T::kRoundFailed, S::kWaitingForClients, E::kNone,
     "too few shares to remove the masks: record the attempt as failed, the global model untouched; the next "
     "attempt waits for clients"},
    {S::kUnmasking, T::kGaveUp, S::kFinished, E::kEndRun,
     "attempts exhausted, or the step, checkpoint or records failed: the experiment failed"},
    {S::kUnmasking, T::kShutdown, S::kFinished, E::kEndRun, "record the attempt as aborted; tell every client"},
    // A path the rows above lack (a bug): from every state but kFinished, so that the failure is a row too.
    {S::kWaitingForModel, T::kInvariantBroken, S::kFinished, E::kEndRun, kBrokenEffect},
    {S::kWaitingForClients, T::kInvariantBroken, S::kFinished, E::kEndRun, kBrokenEffect},
    {S::kCollecting, T::kInvariantBroken, S::kFinished, E::kEndRun, kBrokenEffect},
    {S::kEvaluating, T::kInvariantBroken, S::kFinished, E::kEndRun, kBrokenEffect},
    {S::kDraining, T::kInvariantBroken, S::kFinished, E::kEndRun, kBrokenEffect},
    {S::kBuffering, T::kInvariantBroken, S::kFinished, E::kEndRun, kBrokenEffect},
    {S::kUnmasking, T::kInvariantBroken, S::kFinished, E::kEndRun, kBrokenEffect},
};

}  // namespace

std::span<const EngineTransition> EngineTransitions() { return kTransitions; }

std::string_view EngineEffectName(EngineEffect effect) {
  switch (effect) {
    case EngineEffect::kNone: return "none";
    case EngineEffect::kArmDeadline: return "arm_deadline";
    case EngineEffect::kOpenStep: return "open_step";
    case EngineEffect::kArmDrainGrace: return "arm_drain_grace";
    case EngineEffect::kEndRun: return "end_run";
  }
  return "unknown";
}

std::optional<EngineState> NextEngineState(EngineState from, EngineTrigger on) {
  for (const EngineTransition& t : kTransitions) {
    if (t.from == from && t.on == on) return t.to;
  }
  return std::nullopt;
}

bool RoundEngine::Core::Fire(EngineTrigger on) {
  const EngineTransition* row = nullptr;
  for (const EngineTransition& t : kTransitions) {
    if (t.from == state_ && t.on == on) row = &t;
  }
  if (row == nullptr) {
    MissingTransition(on);
    return false;
  }
  const EngineState from = state_;
  state_ = row->to;
  Notify([&](EngineObserver& o) { o.OnTransition(from, on, state_); });
  Carry(row->effect);
  return true;
}

void RoundEngine::Core::Carry(EngineEffect effect) {
  switch (effect) {
    case EngineEffect::kNone: break;
    case EngineEffect::kArmDeadline: ArmAt(deadline_timer_, current_->deadline_ns); break;
    case EngineEffect::kOpenStep: schedule_->OpenStep(); break;
    case EngineEffect::kArmDrainGrace:
      drain_deadline_ns_ = NowNs() + kUplinkReportGraceNs;
      ArmAt(drain_timer_, drain_deadline_ns_);
      break;
    case EngineEffect::kEndRun: EndRun(); break;
  }
}

void RoundEngine::Core::MissingTransition(EngineTrigger on) {
  // A path of the engine that the table does not describe: a bug, never a client's doing. fl-server is not
  // aborted (that would end every client's run for one bug, and lose the records' last commit): the run ends as
  // failed, with the reason recorded and every client told (docs/architecture.md, "Errors and missing
  // transitions").
  ++missing_transitions_;
  spdlog::critical("round engine: no transition from {} on {} (server/src/round_engine.cc, kTransitions): a bug",
                   EngineStateName(state_), EngineTriggerName(on));
  if (state_ == EngineState::kFinished) return;  // the run has ended already: nothing is left to fail
  Finish(instrumentation::ExperimentStatus::kFailed,
         fl::StrCat("internal error: the round engine has no transition from ", EngineStateName(state_), " on ",
                    EngineTriggerName(on), " (a bug; see fl-server's log)"),
         EngineTrigger::kInvariantBroken);
}

RoundEngine::Core::Core(EngineConfig config, instrumentation::RecordStore* records, StartPoint start,
                        const rpc::Clock* clock, Published& published)
    : config_(std::move(config)),
      clock_(clock != nullptr ? clock : rpc::SystemClock::Get()),
      timeline_(clock_->NowNs(), clock_->UnixNs()),
      records_(records),
      start_(std::move(start)),
      loop_(
          clock_, [this](EngineEvent& e) { Handle(e); }, [this] { Advance(); }),
      published_(published) {
  // The one place that looks at the mode: every other difference is a call on the schedule.
  schedule_ = config_.buffered() ? MakeBufferedSteps() : MakeSyncRounds();
  if (config_.print_table) observers_.push_back(MakeConsoleTable(schedule_->RowsAreSteps()));
}

void RoundEngine::Core::SetMetrics(instrumentation::ServerMetrics* metrics) {
  if (metrics != nullptr) observers_.push_back(MakeMetricsObserver(metrics));
}

void RoundEngine::Core::Record(instrumentation::Record record) {
  if (records_ == nullptr) return;
  if (absl::Status s = records_->Enqueue(std::move(record)); !s.ok()) {
    spdlog::error("cannot record: {}", s.message());
  }
}

RoundEngine::Core::~Core() {
  Post(ShutdownEvent{"server destroyed"});
  loop_.Stop();
}

absl::Status RoundEngine::Core::Start() {
  if (absl::Status s = Prepare(); !s.ok()) return s;
  loop_.Start([this] { Advance(); });
  return absl::OkStatus();
}

absl::Status RoundEngine::Core::StartManual() {
  if (absl::Status s = Prepare(); !s.ok()) return s;
  Advance();
  return absl::OkStatus();
}

void RoundEngine::Core::Stop() { loop_.Stop(); }

// ---- RoundEngine: the public shell over the core ----

RoundEngine::RoundEngine(EngineConfig config, instrumentation::RecordStore* records, StartPoint start,
                         const rpc::Clock* clock)
    : core_(std::make_unique<Core>(std::move(config), records, std::move(start), clock, published_)) {
  // spdlog's default logger lives in a function-local static of libspdlog, which is not built with ThreadSanitizer:
  // created lazily by the loop thread's first log line while a reactor or client thread logs its own, TSan cannot
  // see the static's guard and reports a race. Created here, on the thread that builds the engine, it happens
  // before every thread the engine or its callers start.
  spdlog::default_logger_raw();
}

RoundEngine::~RoundEngine() = default;

void RoundEngine::SetMetrics(instrumentation::ServerMetrics* metrics) {
  core_->SetMetrics(metrics);
  published_.metrics = metrics;
}
void RoundEngine::AddObserver(std::unique_ptr<EngineObserver> observer) { core_->AddObserver(std::move(observer)); }
absl::Status RoundEngine::Start() { return core_->Start(); }
absl::Status RoundEngine::StartManual() { return core_->StartManual(); }
size_t RoundEngine::RunUntilIdle() { return core_->RunUntilIdle(); }
void RoundEngine::Post(EngineEvent event) { core_->Post(std::move(event)); }
void RoundEngine::Stop() { core_->Stop(); }
size_t RoundEngine::QueuedEvents() const { return core_->QueuedEvents(); }
bool RoundEngine::ShedJoins() const {
  const size_t limit = core_->config().max_engine_queue;
  return limit != 0 && core_->QueuedEvents() > limit;
}
const EngineConfig& RoundEngine::config() const { return core_->config(); }
const rpc::Clock& RoundEngine::clock() const { return core_->clock(); }
EngineState RoundEngine::state() const { return core_->state(); }

EngineResult RoundEngine::Wait() {
  fl::MutexLock lock(published_.mu);
  published_.cv.Wait(published_.mu, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(published_.mu) { return published_.done; });
  return published_.result;
}

std::optional<EngineResult> RoundEngine::result() const {
  fl::MutexLock lock(published_.mu);
  if (!published_.done) return std::nullopt;
  return published_.result;
}

void RoundEngine::Core::ArmAt(rpc::TimerId& timer, int64_t when_ns) {
  if (timer != 0) loop_.Cancel(timer);
  // The timer only wakes the loop: Advance() (after every turn) decides what its deadline means now.
  timer = loop_.At(when_ns, [&timer] { timer = 0; });
}

void RoundEngine::Core::ArmHeartbeatCheck() {
  // Every interval: clients silent for four intervals are gone, and a stalled initial-model holder is replaced.
  heartbeat_timer_ = loop_.After(int64_t{config_.heartbeat_interval_ms} * kMsToNs, [this] {
    heartbeat_timer_ = 0;
    if (state_ == EngineState::kFinished) return;
    CatchUpAfterStall(NowNs());  // a late check after the server's own stall judges nobody for it
    CheckHeartbeats(NowNs());
    ArmHeartbeatCheck();
  });
}

void RoundEngine::Core::ArmUploadCheck() {
  // Uploads holding a slot are checked for stalls and their rate a few times a second, while there are any.
  if (upload_timer_ != 0 || !uploads_.watching()) return;
  upload_timer_ = loop_.After(100 * kMsToNs, [this] {
    upload_timer_ = 0;
    if (state_ == EngineState::kFinished) return;
    CatchUpAfterStall(NowNs());
    RevokeSlowUploads(NowNs());
    ArmUploadCheck();
  });
}

absl::Status RoundEngine::Core::Prepare() {
  if (absl::Status s = config_.Validate(); !s.ok()) return s;
  if (config_.experiment_id.empty()) {
    config_.experiment_id = fl::StrCat("exp-", UnixMs(), "-", RandomHex(3));
  }
  if (config_.max_sessions == 0) config_.max_sessions = DefaultMaxSessions();
  if (absl::Status s = model_.Configure(config_.uplink_codec, config_.uplink_codec_policy, config_.downlink_codec,
                                        config_.optimizer);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = dp_.Configure(config_); !s.ok()) return s;
  // Resuming: the accountant continues from the checkpoint's ledger (refused with other DP settings).
  if (start_.resume && start_.checkpoint.has_value()) {
    if (absl::Status s = dp_.Restore(start_.checkpoint->privacy, start_.checkpoint->round); !s.ok()) return s;
  }
  if (model_.codec_policy().basis != core::CodecPolicy::Basis::kFixed) {
    spdlog::info("uplink codec per client: {}", model_.codec_policy().ToString());
  }
  uploads_ = engine::UploadSlots(config_.upload_slots);

  const bool resumed = start_.resume && start_.checkpoint.has_value();
  if (start_.checkpoint.has_value()) {
    Checkpoint& ckpt = *start_.checkpoint;
    if (resumed) config_.experiment_id = ckpt.experiment_id;
    if (absl::Status s = AdoptModel(ckpt.spec, ckpt.model_name, std::move(ckpt.values), ckpt.model_version); !s.ok()) {
      return s;
    }
    if (resumed && !ckpt.task.empty()) {
      // The resumed experiment keeps its task: clients of another one are refused as before the restart.
      auto task = core::ParseTask(ckpt.task);
      if (!task.ok()) {
        return absl::InvalidArgumentError(
            fl::StrCat("checkpoint of experiment ", ckpt.experiment_id, ": ", fl::ToStd(task.status().message())));
      }
      task_ = *task;
    }
    if (resumed) {
      if (ckpt.optimizer.optimizer == model_.optimizer().name()) {
        if (absl::Status s = model_.optimizer().ImportState(ckpt.optimizer); !s.ok()) return s;
      } else {
        spdlog::warn("checkpoint holds '{}' optimizer state; starting '{}' fresh", ckpt.optimizer.optimizer,
                     model_.optimizer().name());
      }
      round_ = ckpt.round;
      committed_attempt_ = start_.committed_attempt;
      evaluation_due_ = start_.redo_evaluation;
      first_attempts_ = start_.first_attempts;
      last_round_.round = round_;
    }
    start_.checkpoint.reset();
    if (!Fire(EngineTrigger::kModelLoaded)) return absl::InternalError("the round engine could not adopt its model");
  }
  attempt_ = std::max<uint32_t>(1, start_.first_attempt);
  if (resumed) {
    instrumentation::ExperimentStatusUpdate update;
    update.experiment_id = config_.experiment_id;
    update.status = instrumentation::ExperimentStatus::kRunning;
    Record(update);
    if (start_.supersede_later_rounds) {
      instrumentation::RoundsSupersededUpdate superseded;
      superseded.experiment_id = config_.experiment_id;
      superseded.after_round = static_cast<int64_t>(round_);
      superseded.reason = start_.supersede_reason;
      Record(superseded);
    }
    spdlog::info("resuming experiment {} after round {} (model version {}), attempt {}{}", config_.experiment_id,
                 round_, model_.version(), attempt_,
                 evaluation_due_ ? "; its evaluation was interrupted and is redone first" : "");
  } else {
    instrumentation::ExperimentRecord exp;
    exp.id = config_.experiment_id;
    exp.name = config_.experiment_name;
    exp.started_unix_ms = UnixMs();
    exp.config_json = RecordedConfigJson(config_);
    exp.software_version = config_.software_version;
    exp.aggregation = std::string(schedule_->RecordName());
    Record(exp);
    // A fresh experiment from an initial model gets its own round-0 checkpoint, so that --resume before
    // the first commit finds it.
    if (state_ == EngineState::kWaitingForClients) {
      if (absl::Status s = WriteInitialCheckpoint(); !s.ok()) return s;
    }
  }
  if (records_ != nullptr) {
    if (absl::Status s = records_->Flush(); !s.ok()) return s;
  }
  schedule_->Prepare();
  ArmHeartbeatCheck();
  // The server's own stalls (engine_stalls.cc): 2 s on a real clock, off on a ManualClock unless a test sets it.
  stall_threshold_ns_ = int64_t{config_.stall_threshold_ms.value_or(clock_->IsReal() ? 2000 : 0)} * kMsToNs;
  loop_alive_ns_ = NowNs();
  ArmStallWatchdog();
  return absl::OkStatus();
}

void RoundEngine::Core::Handle(EngineEvent& event) {
  // After a stall of the server itself, deadlines move on before this event (stamped maybe before the stall, or
  // just after it) is judged against them.
  CatchUpAfterStall(NowNs());
  std::visit(
      [this](auto& e) {
        using T = std::decay_t<decltype(e)>;
        if constexpr (std::is_same_v<T, JoinEvent>)
          HandleJoin(e);
        else if constexpr (std::is_same_v<T, SessionOpenEvent>)
          HandleSessionOpen(e);
        else if constexpr (std::is_same_v<T, SessionMessageEvent>)
          HandleSessionMessage(e);
        else if constexpr (std::is_same_v<T, SessionClosedEvent>)
          HandleSessionClosed(e);
        else if constexpr (std::is_same_v<T, DownloadEvent>)
          HandleDownload(e);
        else if constexpr (std::is_same_v<T, DownloadDoneEvent>)
          HandleDownloadDone(e);
        else if constexpr (std::is_same_v<T, UploadStartEvent>)
          HandleUploadStart(e);
        else if constexpr (std::is_same_v<T, UploadDoneEvent>)
          HandleUploadDone(e);
        else if constexpr (std::is_same_v<T, LeaveEvent>)
          HandleLeave(e);
        else if constexpr (std::is_same_v<T, ShutdownEvent>)
          HandleShutdown(e);
        else if constexpr (std::is_same_v<T, SecurityRefusalEvent>)
          HandleSecurityRefusal(e);
        else if constexpr (std::is_same_v<T, CertificatesRevokedEvent>)
          HandleCertificatesRevoked(e);
      },
      event);
}

void RoundEngine::Core::Advance() {
  // Each step may end a round and go back to kWaitingForClients, where the next can start at once: a loop, not a
  // recursion, so that a run of empty rounds cannot grow the stack.
  while (AdvanceOnce()) {
  }
}

bool RoundEngine::Core::AdvanceOnce() {
  const int64_t now = NowNs();
  CatchUpAfterStall(now);
  // The schedule's own tasks (buffered: train tasks run through every state) have their deadlines swept first.
  if (state_ != EngineState::kFinished) schedule_->SweepDeadlines(now);
  switch (state_) {
    case EngineState::kWaitingForModel: ReaskInitialModelIfStalled(now); return false;
    case EngineState::kBuffering:
    case EngineState::kUnmasking: return schedule_->AdvanceOwnState();
    case EngineState::kWaitingForClients: return schedule_->AdvanceWaiting();
    case EngineState::kCollecting:
    case EngineState::kEvaluating: {
      // Runs after every turn: look on from the first task not known closed (tasks never reopen), so that a
      // round of 10,000 tasks costs O(1) a turn, not a scan of all of them.
      while (current_->first_open < current_->task_ids.size() &&
             tasks_.at(current_->task_ids[current_->first_open])->closed) {
        ++current_->first_open;
      }
      const bool all_closed = current_->first_open == current_->task_ids.size();
      if (all_closed || now >= current_->deadline_ns || schedule_->CommitTargetReached()) {
        if (deadline_timer_ != 0) loop_.Cancel(deadline_timer_);
        deadline_timer_ = 0;
        if (state_ == EngineState::kCollecting) {
          schedule_->CloseRound();
        } else {
          CloseEvaluation();
        }
        return state_ == EngineState::kWaitingForClients;
      }
      return false;
    }
    case EngineState::kDraining:
      if (Drained(now)) {
        Finish(instrumentation::ExperimentStatus::kFinished,
               stop_reason_.empty() ? fl::StrCat("all ", config_.num_rounds, " rounds committed") : stop_reason_);
      }
      return false;
    case EngineState::kFinished: return false;
  }
  return false;
}

bool RoundEngine::Core::Drained(int64_t now) {
  // The last round's clients report their uplink time only after our ack: give them a moment, so that the
  // final round's records are as complete as the others'.
  std::erase_if(uplink_reports_due_, [&](const auto& due) {
    auto t = tasks_.find(due.first);
    if (t == tasks_.end()) return true;
    ClientInfo* c = clients_.Find(t->second->client_id);
    return c == nullptr || c->session == nullptr;
  });
  if (uplink_reports_due_.empty()) return true;
  // drain_deadline_ns_: armed on entering kDraining (EngineEffect::kArmDrainGrace).
  return now >= drain_deadline_ns_;
}

void RoundEngine::Core::RoundDone(const std::optional<instrumentation::ServerMetrics::Evaluation>& eval) {
  const core::Task task = task_.value_or(core::Task::kClassification);
  Notify([&](EngineObserver& o) { o.OnRoundDone(last_round_, task, eval); });
}

void RoundEngine::Core::Finish(instrumentation::ExperimentStatus status, std::string reason,
                               std::optional<EngineTrigger> via) {
  using instrumentation::ExperimentStatus;
  if (state_ == EngineState::kFinished) return;
  const EngineTrigger on = via.value_or(status == ExperimentStatus::kAborted    ? EngineTrigger::kShutdown
                                        : status == ExperimentStatus::kFinished ? EngineTrigger::kDrained
                                                                                : EngineTrigger::kGaveUp);
  ending_ = Ending{status, std::move(reason)};
  // No row: MissingTransition has finished the run through kInvariantBroken instead (with its own ending_).
  (void)Fire(on);
}

void RoundEngine::Core::EndRun() {
  using instrumentation::ExperimentStatus;
  ExperimentStatus status = ending_.status;
  std::string reason = ending_.reason;
  for (rpc::TimerId* t : {&deadline_timer_, &upload_timer_, &heartbeat_timer_, &initial_model_timer_, &drain_timer_,
                          &buffer_timer_, &stall_timer_}) {
    if (*t != 0) loop_.Cancel(*t);
    *t = 0;
  }
  const bool finished = status == ExperimentStatus::kFinished;
  if (status != ExperimentStatus::kAborted) NoteUntoldClients();  // before the sessions below are told and let go
  for (auto& [id, c] : clients_.all()) {
    if (c->session == nullptr) continue;
    fl::v1::ServerMessage bye;
    bye.set_seq(++c->server_seq);
    bye.mutable_shutdown()->set_reason(reason);
    bye.mutable_shutdown()->set_experiment_finished(finished);
    c->session->Send(std::move(bye));
    c->session->Close(grpc::Status::OK);
    DetachSession(*c);
  }
  while (uploads_.HasWaiting()) {
    UploadStartEvent next = uploads_.NextWaiting();
    next.admit(Rejected(next.header.task_id(), fl::v1::ERROR_CODE_SHUTTING_DOWN, "the experiment has ended"), {});
  }
  WriteRefusalSummaries(/*all=*/true);  // the refusals counted instead of recorded (engine_clients.cc)
  if (records_ != nullptr) {
    instrumentation::ExperimentStatusUpdate update;
    update.experiment_id = config_.experiment_id;
    update.status = status;
    update.status_reason = reason;
    update.finished_unix_ms = UnixMs();
    Record(update);
    if (absl::Status s = records_->Flush(); !s.ok()) {
      spdlog::error("records: {}", s.message());
      if (finished) {
        status = ExperimentStatus::kFailed;
        reason = fl::StrCat("records: ", fl::ToStd(s.message()));
      }
    }
  }
  spdlog::info("experiment {} {}: {}", config_.experiment_id, instrumentation::ExperimentStatusName(status), reason);
  fl::MutexLock lock(published_.mu);
  published_.result = EngineResult{config_.experiment_id, status, reason, round_};
  published_.done = true;
  published_.cv.NotifyAll();
}

void RoundEngine::Core::NoteUntoldClients() {
  // Clients with a live session are told by the Shutdown message; those that left need nothing. The others
  // (disconnected for missed heartbeats, stopped, cut off) learn it at their next Join or hello.
  untold_.clear();
  for (const auto& [id, c] : clients_.all()) {
    if (c->session == nullptr && !c->token.empty()) untold_.insert(id);
  }
  published_.untold = untold_.size();
  if (!untold_.empty()) {
    spdlog::info("{} client(s) were away at the end of the experiment and have not been told yet", untold_.size());
  }
}

void RoundEngine::Core::MarkTold(const std::string& client_id) {
  if (untold_.erase(client_id) != 0) published_.untold = untold_.size();
}

}  // namespace fl::server
