// Buffered asynchronous aggregation (FedBuff; docs/round-engine.md "Buffered aggregation"): with
// --aggregation=buffered the engine keeps --concurrency clients training on the newest model, takes each valid
// update into the open step's buffer with weight n_k * s(tau) (tau = versions between the model it was trained
// from and the current one; above --max-staleness it is refused), and applies the buffer as one aggregation
// step (weighted mean, server optimizer, checkpoint, records) once it holds --buffer-size updates. A step is a
// `rounds` row; its client_rounds rows are the updates applied (or refused, dropped, late) in it.
//
// This file is the whole schedule (engine_schedule.h): the shared engine paths reach it only through the
// AggregationSchedule interface (Advance, CloseTaskAsDropped, RejectAtHeader, AcceptUpdate, HandleDownload,
// RecordClientUplink, HandleShutdown, the open_step effect); its state (the open step, the tasks out, the older
// payloads) is its own. Synchronous rounds never reach this file.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "fl/core/log_format.h"
#include "fl/core/str_cat.h"
#include "fl/proto/convert.h"
#include "fl/server/round_engine.h"
#include "fl/server/staleness.h"
#include "engine_internal.h"
#include "engine_schedule.h"

namespace fl::server {

using namespace engine_internal;  // NOLINT: the engine's own helpers
using instrumentation::ClientOutcome;

class RoundEngine::Core::BufferedSteps final : public AggregationSchedule {
 public:
  explicit BufferedSteps(Core& core) : AggregationSchedule(core), c_(core) {}
  std::string_view RecordName() const override { return instrumentation::kAggregationBuffered; }
  bool RowsAreSteps() const override { return true; }
  void Prepare() override {
    buf_.weight = *ParseStalenessWeight(c_.config_.staleness_weight);  // checked by Validate()
  }
  bool AdvanceWaiting() override { return AdvanceBuffered(); }
  bool AdvanceOwnState() override { return AdvanceBuffered(); }
  void OpenStep() override { OpenBufferedStep(); }
  // Train tasks run through every state (evaluations too): their deadlines are swept before each step.
  void SweepDeadlines(int64_t now) override { CloseExpiredBufferedTasks(now); }
  void AfterStall(int64_t /*stall_ns*/) override { ArmBufferTimer(); }
  void Abort(const std::string& reason) override { AbortBufferedStep(reason); }
  std::shared_ptr<const ModelPayload> OldPayload(uint64_t version) const override {
    auto old = buf_.old_payloads.find(version);
    return old == buf_.old_payloads.end() ? nullptr : old->second;
  }
  std::optional<fl::v1::UploadUpdateResponse> Accept(UploadDoneEvent& e, TaskInfo& task,
                                                     instrumentation::ClientRoundRecord& rec) override {
    return AcceptBufferedUpdate(e, task, std::move(rec));
  }
  // The row goes to the open step, and the client waits for that step.
  bool TaskDropped(TaskInfo& task, instrumentation::ClientOutcome outcome, std::string_view why) override {
    if (task.kind != fl::v1::TASK_KIND_TRAIN) return false;
    BufferedTaskDropped(task, outcome, why);
    return true;
  }
  bool RecordUplink(const TaskInfo& task, double uplink_ms, std::optional<double> start_unix_ms,
                    std::optional<double> end_unix_ms) override {
    return RecordBufferedUplink(task, uplink_ms, start_unix_ms, end_unix_ms);
  }

 private:
  // kWaitingForClients and kBuffering: true when the state moved back and Advance should look again.
  void OpenBufferedStep();  // the next step's buffer (aggregator), counters and start time
  bool AdvanceBuffered();
  void DispatchBuffered(ClientInfo& client);
  void ArmBufferTimer();
  void CloseExpiredBufferedTasks(int64_t now);
  void AppendStepRow(const TaskInfo& task, instrumentation::ClientRoundRecord rec);
  void BufferedTaskDropped(TaskInfo& task, ClientOutcome outcome, std::string_view why);
  fl::v1::UploadUpdateResponse AcceptBufferedUpdate(UploadDoneEvent& e, TaskInfo& task,
                                                    instrumentation::ClientRoundRecord rec);
  void FreeStepClients();
  void ApplyStep();
  bool RecordBufferedUplink(const TaskInfo& task, double uplink_ms, std::optional<double> start_unix_ms,
                            std::optional<double> end_unix_ms);
  void AbortBufferedStep(const std::string& reason);

  Core& c_;
  BufferState buf_;  // the open step, the train tasks out, the older payloads they download
};

void RoundEngine::Core::BufferedSteps::OpenBufferedStep() {
  BufferState& b = buf_;
  if (b.step_open) return;
  if (b.step.aggregator != nullptr) c_.spare_aggregator_ = std::move(b.step.aggregator);
  b.step = RoundState{};
  b.step.round = c_.round_ + 1;
  b.step.attempt = c_.attempt_;
  b.step.started_ns = c_.NowNs();
  b.step.started_unix_ms = c_.UnixMs();
  b.step.aggregator = c_.TakeAggregator();  // validated in Start(): the weighted mean
  b.step_open = true;
}

bool RoundEngine::Core::BufferedSteps::AdvanceBuffered() {
  BufferState& b = buf_;
  if (c_.state_ == EngineState::kWaitingForClients) {
    if (c_.evaluation_due_ || b.evaluation_due) {
      // An evaluation goes to as many clients as it would in synchronous mode, taken from the idle ones; no new
      // train task goes out meanwhile (the tasks out go on, their updates wait in the buffer, which is applied
      // after the evaluation, so that every evaluated client downloads the evaluated version).
      const auto connected = static_cast<uint32_t>(c_.clients_.connected());
      auto want =
          SelectionSize(SelectionPolicy{c_.config_.fraction_evaluate, c_.config_.min_evaluate_clients, 1}, connected);
      if (!want.ok() || connected == 0 || c_.IdleConnectedClients().size() < *want) return false;
      const bool applied_step = b.evaluation_due;
      c_.evaluation_due_ = b.evaluation_due = false;
      c_.StartEvaluation();
      if (c_.state_ == EngineState::kEvaluating) return false;
      if (applied_step) c_.RoundDone(std::nullopt);
    }
    if (c_.round_ >= c_.config_.num_rounds) return c_.Fire(EngineTrigger::kAllRoundsCommitted);
    // The first step waits for as many clients as a round would; later, whoever is connected trains (a client
    // that left does not stop the others).
    if (!b.started && c_.clients_.connected() < c_.config_.fit.min_available) return false;
    b.started = true;
    if (!c_.Fire(EngineTrigger::kBufferingStarted)) return false;  // opens the step (EngineEffect::kOpenStep)
  }
  if (b.step.accepted >= c_.config_.buffer_size) {
    ApplyStep();
    return c_.state_ == EngineState::kWaitingForClients;
  }
  // Keep --concurrency clients training: idle connected clients without a row in the open step, a seeded choice
  // among them.
  auto trainable = [&] {
    std::vector<std::string> ids;
    for (ClientInfo* c : c_.IdleConnectedClients()) {
      if (!b.waiting.contains(c->id)) ids.push_back(c->id);
    }
    return ids;
  };
  if (b.out.size() < c_.config_.concurrency) {
    std::vector<std::string> ids = trainable();
    if (!ids.empty()) {
      const auto count = static_cast<uint32_t>(std::min<size_t>(c_.config_.concurrency - b.out.size(), ids.size()));
      ++b.dispatches;
      for (const std::string& id :
           SelectClients(ids, count, c_.config_.seed, c_.round_ + 1, static_cast<uint32_t>(b.dispatches))) {
        DispatchBuffered(c_.clients_.At(id));
      }
      ArmBufferTimer();
    }
  }
  // Nobody can fill the buffer any more: no task is out and every connected client waits for this step (its
  // update, refusal or drop is in it). Apply what it holds, or record the attempt as failed when it holds no
  // update; either way the clients are free again.
  if (b.out.empty() && !b.step.task_ids.empty() && trainable().empty()) {
    spdlog::info(
        "aggregation step {}: {} of --buffer-size={} updates buffered and no client left to train (each "
        "connected one waits for this step): applying it now",
        b.step.round, b.step.accepted, c_.config_.buffer_size);
    ApplyStep();
    return c_.state_ == EngineState::kWaitingForClients;
  }
  return false;
}

void RoundEngine::Core::BufferedSteps::DispatchBuffered(ClientInfo& client) {
  BufferState& b = buf_;
  OpenBufferedStep();
  const uint64_t step = c_.round_ + 1;
  const int64_t now = c_.NowNs();
  fl::v1::Task t;
  t.set_task_id(fl::StrCat("s", step, ".", c_.attempt_, "-", client.id, "-", ++c_.task_counter_));
  t.set_kind(fl::v1::TASK_KIND_TRAIN);
  t.set_round(step);
  *t.mutable_train() = c_.config_.train;
  // A client trains at most once per step (it waits for the step its update is in): (step, client) is unique.
  t.mutable_train()->set_seed(c_.config_.seed ^ (step * 0x9E3779B97F4A7C15ULL) ^ std::hash<std::string>{}(client.id));
  t.set_deadline_ms(c_.config_.round_deadline_ms);
  t.set_uplink_codec(c_.UplinkCodecFor(client));  // link-aware compression (--uplink-codec-policy)
  auto info = std::make_unique<TaskInfo>();
  info->id = t.task_id();
  info->client_id = client.id;
  info->kind = fl::v1::TASK_KIND_TRAIN;
  info->round = step;
  info->attempt = c_.attempt_;
  info->dispatched_ns = now;
  info->dispatched_unix_ms = c_.UnixMs();
  info->deadline_ns = now + int64_t{c_.config_.round_deadline_ms} * kMsToNs;
  info->uplink_codec = t.uplink_codec();
  info->model_version = c_.model_.version();
  t.set_model_version(c_.model_.version());
  t.set_model_fingerprint(c_.model_.spec()->fingerprint());
  t.set_deadline_server_ns(info->deadline_ns);
  t.set_downlink_codec(c_.config_.downlink_codec);
  fl::v1::ServerMessage msg;
  msg.set_seq(++client.server_seq);
  *msg.mutable_task() = std::move(t);
  client.open_task = info->id;
  client.session->Send(std::move(msg));
  b.out.insert(info->id);
  b.base_version[info->id] = c_.model_.version();
  c_.tasks_[info->id] = std::move(info);
}

void RoundEngine::Core::BufferedSteps::ArmBufferTimer() {
  int64_t earliest = 0;
  for (const std::string& id : buf_.out) {
    auto t = c_.tasks_.find(id);
    if (t != c_.tasks_.end() && (earliest == 0 || t->second->deadline_ns < earliest)) earliest = t->second->deadline_ns;
  }
  if (earliest != 0) {
    c_.ArmAt(c_.buffer_timer_, earliest);
  } else if (c_.buffer_timer_ != 0) {
    c_.loop_.Cancel(c_.buffer_timer_);
    c_.buffer_timer_ = 0;
  }
}

void RoundEngine::Core::BufferedSteps::CloseExpiredBufferedTasks(int64_t now) {
  std::vector<TaskInfo*> expired;
  for (const std::string& id : buf_.out) {
    auto t = c_.tasks_.find(id);
    if (t != c_.tasks_.end() && now >= t->second->deadline_ns) expired.push_back(t->second.get());
  }
  for (TaskInfo* t : expired) {
    c_.CloseTaskAsDropped(*t, "no update by the task's deadline (--round-deadline-ms)", /*at_deadline=*/true);
  }
  if (!expired.empty()) ArmBufferTimer();
}

void RoundEngine::Core::BufferedSteps::AppendStepRow(const TaskInfo& task, instrumentation::ClientRoundRecord rec) {
  BufferState& b = buf_;
  OpenBufferedStep();
  // The row belongs to the step the update was applied (or refused, dropped) in, not the one it was given for.
  rec.round = static_cast<int64_t>(b.step.round);
  rec.attempt = b.step.attempt;
  if (auto base = b.base_version.find(task.id); base != b.base_version.end()) {
    rec.base_model_version = static_cast<int64_t>(base->second);
  }
  b.step.task_ids.push_back(task.id);
  b.step.client_rows.push_back(std::move(rec));
  // The client waits for this step (no train task; it may evaluate meanwhile).
  b.waiting.insert(task.client_id);
  if (ClientInfo* c = c_.clients_.Find(task.client_id); c != nullptr && c->open_task == task.id) {
    c->open_task.clear();
  }
}

void RoundEngine::Core::BufferedSteps::BufferedTaskDropped(TaskInfo& task, ClientOutcome outcome,
                                                           std::string_view why) {
  // The task is closed and its outcome set; its row goes to the open step, whose end the client waits for.
  BufferState& b = buf_;
  b.out.erase(task.id);
  RoundState& r = (OpenBufferedStep(), b.step);
  ++(outcome == ClientOutcome::kLate ? r.late : outcome == ClientOutcome::kRejected ? r.rejected : r.dropped);
  spdlog::info("task {} of client '{}' {}: {}", task.id, task.client_id, instrumentation::ClientOutcomeName(outcome),
               why);
  instrumentation::ClientRoundRecord rec = c_.TaskRow(task);
  rec.outcome = outcome;
  if (outcome == ClientOutcome::kRejected) rec.reject_reason = std::string(why);
  if (ClientInfo* c = c_.clients_.Find(task.client_id); c != nullptr) {
    c_.Notify([&](EngineObserver& o) {
      o.OnUpdateOutcome(outcome, outcome == ClientOutcome::kRejected ? "malformed" : "", rec, c->join);
    });
  }
  AppendStepRow(task, std::move(rec));
  ArmBufferTimer();
}

fl::v1::UploadUpdateResponse RoundEngine::Core::BufferedSteps::AcceptBufferedUpdate(
    UploadDoneEvent& e, TaskInfo& task, instrumentation::ClientRoundRecord rec) {
  BufferState& b = buf_;
  const fl::v1::UpdateHeader& h = e.header;
  if (task.closed) {
    // Its row (dropped at the deadline, or at a disconnect) is in the step it was closed in; the client is told
    // which it was (ClosedTaskVerdict).
    return c_.ClosedTaskVerdict(task, c_.NowNs());
  }
  // The step this update goes into is opened before anything is added to its buffer: between an applied step and
  // the next dispatch (an evaluation of the applied step, clients it waits for) b.step is still the applied step,
  // whose aggregator the next OpenBufferedStep() resets. An update added there was recorded ok and counted, but
  // was not in any step's model (issue 27).
  OpenBufferedStep();
  auto finish = [&](ClientOutcome outcome, fl::v1::UploadUpdateResponse verdict, std::string_view reason) {
    task.closed = true;
    task.outcome = outcome;
    task.closed_why = "its update arrived and was answered";
    b.out.erase(task.id);
    RoundState& r = (OpenBufferedStep(), b.step);
    rec.outcome = outcome;
    if (outcome == ClientOutcome::kRejected) rec.reject_reason = verdict.error().message();
    ++(outcome == ClientOutcome::kOk ? r.accepted : outcome == ClientOutcome::kLate ? r.late : r.rejected);
    if (ClientInfo* c = c_.clients_.Find(task.client_id); c != nullptr) {
      c_.Notify([&](EngineObserver& o) { o.OnUpdateOutcome(outcome, reason, rec, c->join); });
    }
    AppendStepRow(task, std::move(rec));
    ArmBufferTimer();
    return verdict;
  };
  if (e.done_server_ns > task.deadline_ns) {
    return finish(
        ClientOutcome::kLate,
        Verdict(task.id, fl::v1::UPDATE_OUTCOME_LATE,
                proto::MakeError(fl::v1::ERROR_CODE_LATE, fl::StrCat("the update finished arriving ",
                                                                     (e.done_server_ns - task.deadline_ns) / kMsToNs,
                                                                     " ms after the task's deadline"))),
        "");
  }
  if (ClientInfo* c = c_.clients_.Find(task.client_id); c != nullptr) {
    if (std::string w = c_.PhaseWindowProblem(*c, h.timings(), task.dispatched_ns, e.done_server_ns); !w.empty()) {
      spdlog::warn("rejected the update of client '{}' (task {}): {}", task.client_id, task.id, w);
      rec.downlink_ms = rec.train_ms = rec.eval_ms = rec.idle_ms = std::nullopt;
      rec.downlink_start_unix_ms = rec.train_start_unix_ms = rec.eval_start_unix_ms = std::nullopt;
      rec.train_loss = std::nullopt;
      rec.num_steps = std::nullopt;
      rec.downlink_bytes = std::nullopt;
      return finish(ClientOutcome::kRejected,
                    Rejected(task.id, fl::v1::ERROR_CODE_MALFORMED, fl::StrCat("update refused: ", w)), "malformed");
    }
  }
  // Staleness: the versions applied since the task's model. The version changes only when a step is applied,
  // and a step takes every update buffered before it, so tau is also the distance to the model it is applied to.
  const uint64_t base = b.base_version.at(task.id);
  const uint64_t tau = c_.model_.version() - base;
  rec.staleness = static_cast<int64_t>(tau);
  if (tau > c_.config_.max_staleness) {
    spdlog::info("refused the update of client '{}' (task {}) as stale: trained from version {}, {} behind",
                 task.client_id, task.id, base, tau);
    return finish(ClientOutcome::kRejected,
                  Rejected(task.id, fl::v1::ERROR_CODE_LATE,
                           fl::StrCat("stale: the update was trained from model version ", base, ", ", tau,
                                      " versions behind the current ", c_.model_.version(),
                                      " (--max-staleness=", c_.config_.max_staleness, "); it is refused"),
                           "a faster link or fewer local steps would help"),
                  "stale");
  }
  const double s = b.weight(tau);
  rec.staleness_weight = s;
  const double weight = static_cast<double>(h.num_examples()) * s;
  // The aggregator says "update from <sender>" itself: it gets the sender, the other messages the whole phrase.
  const std::string sender = fl::StrCat("client '", task.client_id, "' (task ", task.id, ")");
  const std::string source = fl::StrCat("update from ", sender);
  auto reject = [&](const absl::Status& st) {
    const bool non_finite = st.message().find("NaN or Inf") != absl::string_view::npos ||
                            st.message().find("non-finite") != absl::string_view::npos;
    const ErrorCode code = st.code() == absl::StatusCode::kDataLoss ? fl::v1::ERROR_CODE_CHECKSUM_MISMATCH
                           : non_finite                             ? fl::v1::ERROR_CODE_NON_FINITE
                                                                    : fl::v1::ERROR_CODE_MALFORMED;
    spdlog::warn("rejected {}: {}", source, st.message());
    return finish(ClientOutcome::kRejected,
                  Rejected(task.id, code, std::string(fl::ToStd(st.message())),
                           non_finite ? "lower the learning rate; the client's training diverged" : ""),
                  ReasonName(code));
  };
  const core::Codec& codec = c_.UplinkCodecOf(task);  // the codec its task named
  if (h.kind() == fl::v1::UPDATE_KIND_DELTA) {
    if (absl::Status st =
            b.step.aggregator->AddEncoded(codec, e.payload, weight, h.model_fingerprint(), sender, kVerifiedUpload);
        !st.ok()) {
      return reject(st);
    }
  } else {
    // Weights: the pseudo-gradient is taken against the model the client was given. Only the current version is
    // kept whole on the server (older ones only as download payloads), so weights must be fresh.
    if (tau != 0) {
      return reject(absl::InvalidArgumentError(
          fl::StrCat("an update of whole weights must be trained from the current model version ", c_.model_.version(),
                     " in buffered mode (it was trained from ", base, "); send a delta")));
    }
    absl::Status st = c_.model_.PseudoGradientOfWeights(codec, e.payload, source, c_.scratch_);
    if (!st.ok()) return reject(st);
    if (st = b.step.aggregator->Add(c_.scratch_, weight, h.model_fingerprint(), sender); !st.ok()) return reject(st);
  }
  if (rec.train_loss.has_value()) {
    b.step.train_loss_sum += *rec.train_loss * static_cast<double>(h.num_examples());
    b.step.train_loss_weight += static_cast<double>(h.num_examples());
  }
  return finish(ClientOutcome::kOk, Verdict(task.id, fl::v1::UPDATE_OUTCOME_ACCEPTED), "");
}

void RoundEngine::Core::BufferedSteps::FreeStepClients() {
  BufferState& b = buf_;
  b.waiting.clear();  // exactly the clients with a row in the open step
  for (const std::string& id : b.step.task_ids) b.applied_in[id] = {b.step.round, b.step.attempt};
}

void RoundEngine::Core::BufferedSteps::ApplyStep() {
  BufferState& b = buf_;
  RoundState& r = b.step;
  if (r.accepted == 0) {
    instrumentation::RoundRecord rec = c_.RoundRow(r, instrumentation::RoundStatus::kFailed);
    rec.failure_reason = fl::StrCat("no update in the buffer while every connected client waited for this step (",
                                    r.late, " late, ", r.rejected, " rejected, ", r.dropped, " dropped)");
    spdlog::warn("aggregation step {} attempt {} failed: {}", r.round, r.attempt, rec.failure_reason);
    const std::string reason = rec.failure_reason;
    c_.Record(std::move(rec));
    for (auto& row : r.client_rows) c_.Record(row);
    FreeStepClients();
    b.step_open = false;
    if (c_.attempt_ >= c_.config_.max_round_attempts) {
      c_.Finish(instrumentation::ExperimentStatus::kFailed,
                fl::StrCat("aggregation step ", c_.round_ + 1, " failed ", c_.attempt_, " times; last: ", reason));
      return;
    }
    ++c_.attempt_;
    (void)c_.Fire(EngineTrigger::kStepFailed);  // no row: the run has failed (MissingTransition)
    return;
  }
  // The last step: the tasks still out can no longer count. They are cancelled (the client stops) and recorded
  // as such in this step (their clients have no other row in it: they were training).
  if (r.round >= c_.config_.num_rounds) {
    for (const std::string& id : std::vector<std::string>(b.out.begin(), b.out.end())) {
      TaskInfo& task = *c_.tasks_.at(id);
      task.closed = true;
      task.outcome = ClientOutcome::kCancelled;
      task.closed_why = "the experiment's last aggregation step was applied";
      if (ClientInfo* c = c_.clients_.Find(task.client_id); c != nullptr && c->session != nullptr) {
        fl::v1::ServerMessage cancel;
        cancel.set_seq(++c->server_seq);
        cancel.mutable_cancel()->set_task_id(task.id);
        cancel.mutable_cancel()->set_reason("the experiment's last aggregation step was applied");
        c->session->Send(std::move(cancel));
      }
      instrumentation::ClientRoundRecord rec = c_.TaskRow(task);
      rec.outcome = ClientOutcome::kCancelled;
      AppendStepRow(task, std::move(rec));
    }
    b.out.clear();
    ArmBufferTimer();
  }
  c_.uploads_.DropBuffers();
  const int64_t agg_start = c_.NowNs();
  if (absl::Status step = c_.model_.Step(*r.aggregator, fl::StrCat("aggregation step ", r.round)); !step.ok()) {
    c_.Finish(
        instrumentation::ExperimentStatus::kFailed,
        fl::StrCat("aggregation step ", r.round, ": the server optimizer step failed: ", fl::ToStd(step.message())));
    return;
  }
  // Tasks out keep downloading the version they were given: keep those payloads (at most --concurrency).
  std::set<uint64_t> needed;
  for (const std::string& id : b.out) needed.insert(b.base_version.at(id));
  if (needed.contains(c_.model_.version())) b.old_payloads[c_.model_.version()] = c_.model_.payload();
  std::erase_if(b.old_payloads, [&](const auto& p) { return !needed.contains(p.first); });
  c_.round_ = r.round;
  c_.committed_attempt_ = r.attempt;
  c_.model_.Commit(c_.round_);
  const double aggregation_ms = static_cast<double>(c_.NowNs() - agg_start) / 1e6;
  // Committed as a round is (docs/round-engine.md, "Commit and resume").
  if (!c_.CommitGlobalStep(r, aggregation_ms, {}, "aggregation step", "steps")) return;
  int64_t max_tau = 0;
  for (const auto& row : r.client_rows) {
    if (row.outcome == ClientOutcome::kOk) max_tau = std::max(max_tau, row.staleness.value_or(0));
  }
  spdlog::info(
      "aggregation step {} applied (model version {}): {} update(s), largest staleness {}, {} refused, {} "
      "dropped, {} late; aggregation {:.1f} ms, step {:.0f} ms",
      c_.round_, c_.model_.version(), r.accepted, max_tau, r.rejected, r.dropped, r.late, aggregation_ms,
      c_.last_round_.duration_ms);
  FreeStepClients();
  b.step_open = false;
  // Tasks and their bookkeeping older than the last two steps: a straggler's upload for them is refused as
  // unknown, and an uplink report finds nothing to attach to.
  for (auto it = c_.tasks_.begin(); it != c_.tasks_.end();) {
    const bool old =
        it->second->closed && it->second->kind == fl::v1::TASK_KIND_TRAIN && it->second->round + 2 < c_.round_;
    it = old ? c_.tasks_.erase(it) : std::next(it);
  }
  // (CloseEvaluation forgets old tasks too.)
  std::erase_if(b.base_version, [&](const auto& e) { return !c_.tasks_.contains(e.first); });
  std::erase_if(b.applied_in, [&](const auto& e) { return !c_.tasks_.contains(e.first); });
  if (!c_.Fire(EngineTrigger::kStepApplied)) return;
  auto first = c_.first_attempts_.find(c_.round_ + 1);
  c_.attempt_ = first == c_.first_attempts_.end() ? 1 : first->second;
  const bool evaluate = c_.config_.evaluate_every > 0 && c_.config_.fraction_evaluate > 0 &&
                        (c_.round_ % c_.config_.evaluate_every == 0 || c_.round_ == c_.config_.num_rounds);
  if (evaluate) {
    b.evaluation_due = true;
  } else {
    c_.RoundDone(std::nullopt);
  }
}

bool RoundEngine::Core::BufferedSteps::RecordBufferedUplink(const TaskInfo& task, double uplink_ms,
                                                            std::optional<double> start_unix_ms,
                                                            std::optional<double> end_unix_ms) {
  BufferState& b = buf_;
  if (auto applied = b.applied_in.find(task.id); applied != b.applied_in.end()) {
    c_.Record(instrumentation::ClientRoundUplinkUpdate{
        c_.config_.experiment_id, static_cast<int64_t>(applied->second.first), applied->second.second, task.client_id,
        uplink_ms, start_unix_ms, end_unix_ms});
    return true;
  }
  for (size_t i = 0; i < b.step.task_ids.size(); ++i) {
    if (b.step.task_ids[i] != task.id) continue;
    auto& row = b.step.client_rows[i];
    row.uplink_ms = uplink_ms;
    row.uplink_start_unix_ms = start_unix_ms;
    row.uplink_end_unix_ms = end_unix_ms;
  }
  return true;
}

void RoundEngine::Core::BufferedSteps::AbortBufferedStep(const std::string& reason) {
  BufferState& b = buf_;
  for (const std::string& id : b.out) {
    TaskInfo& task = *c_.tasks_.at(id);
    task.closed = true;
    task.outcome = ClientOutcome::kDropped;
    task.closed_why = reason;
    if (ClientInfo* c = c_.clients_.Find(task.client_id); c != nullptr && c->session) {
      fl::v1::ServerMessage cancel;
      cancel.set_seq(++c->server_seq);
      cancel.mutable_cancel()->set_task_id(task.id);
      cancel.mutable_cancel()->set_reason(reason);
      c->session->Send(std::move(cancel));
      c->open_task.clear();
    }
  }
  const bool dispatched = !b.out.empty() || !b.step.task_ids.empty();
  b.out.clear();
  if (b.step_open && dispatched) {
    instrumentation::RoundRecord rec = c_.RoundRow(b.step, instrumentation::RoundStatus::kAborted);
    rec.failure_reason = reason;
    c_.Record(rec);
    for (auto& row : b.step.client_rows) c_.Record(row);
    b.step_open = false;
  }
}

std::unique_ptr<RoundEngine::Core::AggregationSchedule> RoundEngine::Core::MakeBufferedSteps() {
  return std::make_unique<BufferedSteps>(*this);
}

}  // namespace fl::server
