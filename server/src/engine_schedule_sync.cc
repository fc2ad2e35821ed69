// Synchronous rounds (the default schedule): selection and dispatch from kWaitingForClients, a round's commit at
// its last answer, its deadline, or over-commitment's K updates; late updates folded into the next commit under
// --deadline-policy fold. This file is the whole schedule (engine_schedule.h): the shared engine paths reach it only
// through the AggregationSchedule interface, and its state (the commit target, the foldable tasks, the late
// updates kept) is its own.
//
// Stragglers in synchronous rounds (docs/round-engine.md, "Over-commitment and deadline policies"):
//   - over-commitment: a round selects ceil(F * K) clients, commits with the first K accepted updates and cancels
//     the other tasks (the cancel reaches the client, which stops training between batches and uploads nothing);
//     their client_rounds rows say 'cancelled';
//   - deadline policies: a round commits at its deadline with at least min_fit_clients updates (as it always did);
//     an update that arrives after its round committed is either dropped (recorded 'late', the default) or, with
//     --deadline-policy fold, validated, kept, and folded into the next committed round's aggregate with the
//     weight n_k * (1 + tau)^-a (a = --late-discount, tau = model versions between the update's base and the model
//     it is applied to); its row becomes 'folded' with the round that took it.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "absl/strings/str_format.h"
#include "fl/core/codec.h"
#include "fl/core/str_cat.h"
#include "fl/core/tensor_spec.h"
#include "fl/server/round_engine.h"
#include "engine_internal.h"
#include "engine_schedule.h"
#include "engine_secagg.h"

namespace fl::server {

using namespace engine_internal;  // NOLINT: the engine's own helpers
using instrumentation::ClientOutcome;

class RoundEngine::Core::SyncRounds final : public AggregationSchedule {
 public:
  explicit SyncRounds(Core& core) : AggregationSchedule(core), c_(core) {}

  std::string_view RecordName() const override { return instrumentation::kAggregationSynchronous; }
  bool RowsAreSteps() const override { return false; }

  bool AdvanceWaiting() override {
    if (c_.evaluation_due_) {
      // Resumed after a crash during round_'s evaluation: redo it with as many clients as a round waits for.
      if (c_.clients_.connected() < std::max<uint32_t>(1, c_.config_.fit.min_available) ||
          c_.IdleConnectedClients().size() < std::max<uint32_t>(1, c_.config_.fit.min_available)) {
        return false;
      }
      c_.evaluation_due_ = false;
      spdlog::info("redoing the evaluation of round {} (interrupted before its results were recorded)", c_.round_);
      c_.StartEvaluation();
      if (c_.state_ == EngineState::kEvaluating) return false;
    }
    if (c_.round_ >= c_.config_.num_rounds) return c_.Fire(EngineTrigger::kAllRoundsCommitted);
    StartRound();
    return false;
  }
  void CloseRound() override;
  bool CommitTargetReached() const override;
  bool LateUploadAdmitted(const TaskInfo& task) const override;
  std::optional<fl::v1::UploadUpdateResponse> Accept(UploadDoneEvent& e, TaskInfo& task,
                                                     instrumentation::ClientRoundRecord& rec) override {
    // Over-commitment's cancelled tasks; --deadline-policy fold's late updates.
    return FoldLateUpdate(e, task, rec);
  }
  // Secure aggregation (engine_secagg.h): the key stages and the unmask stage run on the engine's turns.
  void SweepDeadlines(int64_t now) override;
  bool AdvanceOwnState() override;  // kUnmasking
  // The open secure stage's deadline moves on with the others: nobody is dropped for the server's own stall.
  void AfterStall(int64_t stall_ns) override {
    if (secure_ == nullptr) return;
    secure_->MoveOn(stall_ns);
    ArmSecureTimer();
  }
  void Abort(const std::string& reason) override;
  bool TaskDropped(TaskInfo& task, instrumentation::ClientOutcome /*outcome*/, std::string_view /*why*/) override {
    if (secure_ != nullptr && task.secure && c_.current_ != nullptr && task.round == c_.current_->round &&
        task.attempt == c_.current_->attempt) {
      secure_->Gone(task.client_id);
    }
    return false;
  }
  void OnSecureMessage(ClientInfo& client, const fl::v1::ClientMessage& message, int64_t now) override;
  absl::Status MaskedUploadAdmitted(const TaskInfo& task) const override;
  absl::Status AddMasked(const TaskInfo& task, std::span<const uint8_t> payload, int64_t now) override;

 private:
  // The attempt failed (`reason`): its rows, and the next attempt or the end of the run.
  void FailAttempt(RoundState& r, std::string reason);
  // The aggregate (the aggregator's, or the secure round's unmasked mean) stepped, checkpointed and committed.
  void CommitRound(RoundState& r, std::optional<secagg::AggregateResult> secure);
  // Secure aggregation: sends what a stage produced and closes the tasks of the clients it dropped; false when the
  // attempt failed (FailAttempt was called).
  bool Apply(engine::SecureRound::Progress progress);
  // The stage rows of the secure round (records), after its round row; the secure round ends.
  void RecordSecureStages(const RoundState& r);
  void ArmSecureTimer();
  // Selects idle clients (over-committed), dispatches train tasks, and fires round_started.
  void StartRound();
  RoundEngine::Core::Stragglers& StragglerState();
  // The number of clients a round selects: `k` (what the selection policy gives), or ceil(overcommit * k) capped
  // at `available`; remembers k as the round's commit target.
  uint32_t OvercommitSize(uint32_t k, uint32_t available);
  // at the commit: cancel the open round's unanswered tasks, rows 'cancelled'
  void CancelSurplusTasks();
  // fold: a late update of a committed round, validated and kept for the next commit; nullopt = not foldable.
  std::optional<fl::v1::UploadUpdateResponse> FoldLateUpdate(UploadDoneEvent& e, TaskInfo& task,
                                                             const instrumentation::ClientRoundRecord& rec);
  // At a commit: the kept late updates into r's aggregate (discounted); their rows go with the commit.
  std::vector<instrumentation::ClientRoundRecord> FoldPendingInto(RoundState& r);
  // after a commit: r's tasks closed by its deadline may still fold
  void NoteFoldableTasks(const RoundState& r);

  Core& c_;
  std::unique_ptr<Stragglers> st_;  // over-commitment and folding; made on first use (StragglerState)
  // Secure aggregation: the open attempt's secure round (null without --secure-aggregation, and between rounds),
  // the train task of each participant, and the timer of the open stage's deadline.
  std::unique_ptr<engine::SecureRound> secure_;
  std::map<std::string, std::string> secure_tasks_;
  rpc::TimerId secure_timer_ = 0;
  int64_t secure_timer_at_ = 0;
};

void RoundEngine::Core::SyncRounds::StartRound() {
  // Called after every turn while waiting: too few connected clients is known without looking at each of them
  // (idle ones are a subset), so a join storm does not cost a scan of all clients per turn.
  if (!SelectionSize(c_.config_.fit, static_cast<uint32_t>(c_.clients_.connected())).ok()) return;
  // Reports still due from rounds before the last committed one will not come any more.
  std::erase_if(c_.uplink_reports_due_, [&](const auto& due) { return due.second < c_.round_; });
  std::vector<ClientInfo*> idle = c_.IdleConnectedClients();
  auto size = SelectionSize(c_.config_.fit, static_cast<uint32_t>(idle.size()));
  if (!size.ok()) return;  // keep waiting for clients
  // Over-commitment (engine_overcommit.cc): ceil(F x K) selected, K of them commit the round.
  *size = OvercommitSize(*size, static_cast<uint32_t>(idle.size()));
  std::vector<std::string> ids;
  for (ClientInfo* c : idle) ids.push_back(c->id);
  const uint64_t round = c_.round_ + 1;
  if (c_.config_.secagg_on()) {
    // The quantised sum must not wrap: a round masks at most this many clients together (docs/privacy.md).
    const uint64_t most = engine::SecureRound::MaxParticipants(c_.config_);
    if (*size > most) {
      spdlog::warn(
          "round {}: {} clients would be selected; secure aggregation takes at most {} at --secagg-range={} "
          "--secagg-scale={} --secagg-max-weight={} (the quantised sum would wrap): {} selected",
          round, *size, most, c_.config_.secagg_range, c_.config_.secagg_scale, c_.config_.secagg_max_weight, most);
      *size = static_cast<uint32_t>(most);
    }
  }
  std::vector<std::string> selected = SelectClients(ids, *size, c_.config_.seed, round, c_.attempt_);
  // --dp-target-epsilon: no round may spend past it, so the run ends before the one that would.
  auto past = c_.dp_.EpsilonPastTarget(static_cast<int64_t>(selected.size()));
  if (!past.ok() || past->has_value()) {
    c_.stop_reason_ = past.ok() ? absl::StrFormat(
                                      "privacy budget: round %u would bring epsilon to %.4g, past --dp-target-epsilon="
                                      "%g at --dp-delta=%g; rounds up to %u are committed",
                                      round, **past, c_.config_.dp_target_epsilon, c_.config_.dp_delta, c_.round_)
                                : fl::StrCat("privacy accountant: ", fl::ToStd(past.status().message()));
    spdlog::info("{}", c_.stop_reason_);
    (void)c_.Fire(EngineTrigger::kBudgetSpent);  // no row: the run has failed (MissingTransition)
    return;
  }

  c_.current_ = std::make_unique<RoundState>();
  c_.current_->round = round;
  c_.current_->attempt = c_.attempt_;
  c_.current_->started_ns = c_.NowNs();
  c_.current_->started_unix_ms = c_.UnixMs();
  c_.current_->deadline_ns = c_.current_->started_ns + int64_t{c_.config_.round_deadline_ms} * kMsToNs;
  c_.current_->aggregator = c_.TakeAggregator();
  secure_.reset();
  secure_tasks_.clear();
  if (c_.config_.secagg_on()) {
    auto secure = engine::SecureRound::Create(c_.config_, round, selected, c_.model_.spec()->num_elements(),
                                              c_.current_->started_ns);
    if (!secure.ok()) {
      // Settings the checks at start could not rule out for this selection (a threshold above a small round's
      // neighbourhood): the attempt fails with the library's reason, nothing dispatched.
      (void)c_.Fire(EngineTrigger::kRoundStarted);
      FailAttempt(*c_.current_, fl::StrCat("secure aggregation: ", fl::ToStd(secure.status().message())));
      return;
    }
    secure_ = *std::move(secure);
    spdlog::info("round {}: secure aggregation of {} clients, neighbourhoods of {}, threshold {}", round,
                 selected.size(), secure_->neighbourhood_size(), secure_->threshold());
  }

  for (const std::string& id : selected) {
    fl::v1::Task t;
    t.set_task_id(fl::StrCat("r", round, ".", c_.attempt_, "-", id, "-", ++c_.task_counter_));
    t.set_kind(fl::v1::TASK_KIND_TRAIN);
    t.set_round(round);
    *t.mutable_train() = c_.config_.train;
    t.mutable_train()->set_seed(c_.config_.seed ^ (round * 0x9E3779B97F4A7C15ULL) ^ std::hash<std::string>{}(id));
    t.set_deadline_ms(c_.config_.round_deadline_ms);
    c_.dp_.FillClientPrivacy(static_cast<int64_t>(selected.size()), t.mutable_privacy());
    if (secure_ != nullptr) {
      if (absl::Status s = secure_->SetupFor(id, t.mutable_secagg()); !s.ok()) {
        spdlog::critical("round {}: secure aggregation setup of '{}': {}", round, id, fl::ToStd(s.message()));
      }
      secure_tasks_[id] = t.task_id();
    }
    c_.Dispatch(c_.clients_.At(id), std::move(t), c_.attempt_);
  }
  if (!c_.Fire(EngineTrigger::kRoundStarted)) return;
  ArmSecureTimer();
  spdlog::info("round {} (attempt {}): {} of {} idle clients selected", round, c_.attempt_, selected.size(),
               idle.size());
}

void RoundEngine::Core::SyncRounds::CloseRound() {
  RoundState& r = *c_.current_;
  // Before the deadline only when every task had closed (answered, refused, its client gone): the reason must say
  // so, not "by the deadline" (issue 27: an attempt whose clients all failed at 1.8 s of an 8 s round).
  const int64_t closed_at = c_.NowNs();
  const bool early = closed_at < r.deadline_ns;
  CancelSurplusTasks();  // over-commitment: the tasks beyond the first K updates
  for (const std::string& id : r.task_ids) {
    c_.CloseTaskAsDropped(*c_.tasks_.at(id), "no update by the round's deadline", /*at_deadline=*/true);
  }

  if (r.accepted < c_.config_.fit.min_clients) {
    const std::string counts = fl::StrCat("the round needs ", c_.config_.fit.min_clients, " (", r.late, " late, ",
                                          r.rejected, " rejected, ", r.dropped, " dropped)");
    FailAttempt(r, early
                       ? absl::StrFormat("every task closed %.1f s into the round, %.1f s before its deadline, with %u "
                                         "update(s) accepted; %s",
                                         static_cast<double>(closed_at - r.started_ns) / 1e9,
                                         static_cast<double>(r.deadline_ns - closed_at) / 1e9, r.accepted, counts)
                       : fl::StrCat(r.accepted, " update(s) accepted by the deadline; ", counts));
    return;
  }
  if (secure_ != nullptr) {
    // The masked upload is over: the survivors are asked for the shares that remove the masks; the commit waits
    // for the unmask stage (kUnmasking, AdvanceOwnState).
    if (!Apply(secure_->CloseMaskedUpload(c_.NowNs()))) return;
    r.secagg_survivors = static_cast<int64_t>(secure_->survivors());
    if (!c_.Fire(EngineTrigger::kUnmaskStarted)) return;
    spdlog::info("round {}: {} masked updates in the sum; asking the survivors to unmask it", r.round,
                 secure_->survivors());
    ArmSecureTimer();
    return;
  }
  CommitRound(r, std::nullopt);
}

void RoundEngine::Core::SyncRounds::FailAttempt(RoundState& r, std::string reason) {
  instrumentation::RoundRecord rec = c_.RoundRow(r, instrumentation::RoundStatus::kFailed);
  rec.failure_reason = reason;
  spdlog::warn("round {} attempt {} failed: {}", r.round, r.attempt, rec.failure_reason);
  c_.Record(std::move(rec));
  for (auto& row : r.client_rows) c_.Record(std::move(row));
  RecordSecureStages(r);
  c_.ReleaseRound();
  if (c_.attempt_ >= c_.config_.max_round_attempts) {
    c_.Finish(instrumentation::ExperimentStatus::kFailed,
              fl::StrCat("round ", c_.round_ + 1, " failed ", c_.attempt_, " times; last: ", reason));
    return;
  }
  ++c_.attempt_;
  (void)c_.Fire(EngineTrigger::kRoundFailed);  // no row: the run has failed (MissingTransition)
}

void RoundEngine::Core::SyncRounds::CommitRound(RoundState& r, std::optional<secagg::AggregateResult> secure) {
  // Peak memory is at the commit: give back what the next round can rebuild cheaply (the receive buffers,
  // once per round, not per update) before the aggregate and the new download payload are materialised.
  c_.uploads_.DropBuffers();
  const int64_t agg_start = c_.NowNs();
  // --deadline-policy fold: late updates of earlier rounds join this aggregate, discounted.
  std::vector<instrumentation::ClientRoundRecord> folded_rows = FoldPendingInto(r);
  // Secure aggregation: the survivors' updates are in the unmasked sum, each clipped by its client when DP asks.
  const auto updates =
      static_cast<int64_t>(secure.has_value() ? secure->survivors.size() : r.aggregator->num_updates());
  const int64_t at_or_below =
      secure.has_value() ? updates : updates - static_cast<int64_t>(r.aggregator->num_clipped());
  // Central differential privacy: the mean of the clipped updates is noised before the server optimizer sees it.
  engine::GlobalModel::Perturb noise;
  if (c_.dp_.on() && c_.dp_.ServerNoises()) {
    noise = [&](std::span<float> mean) { return c_.dp_.NoiseMean(mean, updates); };
  }
  const std::string what = fl::StrCat("round ", r.round);
  absl::Status step = secure.has_value() ? c_.model_.StepFrom(std::move(secure->mean), what, noise)
                                         : c_.model_.Step(*r.aggregator, what, noise);
  if (!step.ok()) {
    // Inputs were validated one by one; an optimizer failure means the aggregate itself overflowed.
    c_.Finish(instrumentation::ExperimentStatus::kFailed,
              fl::StrCat("round ", r.round, ": the server optimizer step failed: ", fl::ToStd(step.message())));
    return;
  }
  if (c_.dp_.on()) {
    auto spent = c_.dp_.AfterRound(static_cast<int64_t>(r.task_ids.size()), updates, at_or_below);
    if (!spent.ok()) {
      c_.Finish(
          instrumentation::ExperimentStatus::kFailed,
          fl::StrCat("round ", r.round, ": the privacy accountant failed: ", fl::ToStd(spent.status().message())));
      return;
    }
    r.privacy = *spent;
    spdlog::info("round {}: epsilon {:.4g} at delta {:g} (order {:g}), clip norm {:.4g}, noise multiplier {:.4g}",
                 r.round, spent->epsilon, c_.config_.dp_delta, spent->order, spent->clip_norm, spent->noise_multiplier);
  }
  c_.round_ = r.round;
  c_.committed_attempt_ = r.attempt;
  c_.model_.Commit(c_.round_);
  const double aggregation_ms = static_cast<double>(c_.NowNs() - agg_start) / 1e6;
  // Commit order: checkpoint file first, then the round's records (its row, its client rows and the
  // checkpoint's row) as one atomic unit. A round is committed when, and only when, those records are
  // stored: --resume trusts them and loads that round's checkpoint, so a crash before they land re-runs the
  // round (from the previous checkpoint, which is pruned only after the commit) instead of losing or
  // doubling it.
  if (!c_.CommitGlobalStep(r, aggregation_ms, std::move(folded_rows), "round", "rounds")) return;
  RecordSecureStages(r);
  NoteFoldableTasks(r);
  c_.ReleaseRound();
  if (!c_.Fire(EngineTrigger::kRoundCommitted)) return;
  auto first = c_.first_attempts_.find(c_.round_ + 1);
  c_.attempt_ = first == c_.first_attempts_.end() ? 1 : first->second;
  spdlog::info("round {} committed: {} accepted, aggregation {:.1f} ms, round {:.0f} ms", c_.round_,
               c_.last_round_.accepted, aggregation_ms, c_.last_round_.duration_ms);
  const bool evaluate = c_.config_.evaluate_every > 0 && c_.config_.fraction_evaluate > 0 &&
                        (c_.round_ % c_.config_.evaluate_every == 0 || c_.round_ == c_.config_.num_rounds);
  if (evaluate) {
    c_.StartEvaluation();
    if (c_.state_ == EngineState::kEvaluating) return;
  }
  c_.RoundDone(std::nullopt);
}

// ---- secure aggregation (engine_secagg.h) ----

void RoundEngine::Core::SyncRounds::ArmSecureTimer() {
  const int64_t at = secure_ != nullptr ? secure_->stage_deadline_ns() : 0;
  if (at == secure_timer_at_ && (at == 0 || secure_timer_ != 0)) return;
  if (secure_timer_ != 0) c_.loop_.Cancel(secure_timer_);
  secure_timer_ = 0;
  secure_timer_at_ = at;
  if (at != 0) c_.ArmAt(secure_timer_, at);
}

bool RoundEngine::Core::SyncRounds::Apply(engine::SecureRound::Progress progress) {
  for (engine::SecureRound::Outgoing& out : progress.send) {
    ClientInfo* client = c_.clients_.Find(out.client_id);
    if (client == nullptr || client->session == nullptr) continue;  // gone: the stage drops it at its deadline
    out.message.set_seq(++client->server_seq);
    client->session->Send(std::move(out.message));
  }
  for (const auto& [client_id, why] : progress.dropped) {
    auto task_id = secure_tasks_.find(client_id);
    if (task_id == secure_tasks_.end()) continue;
    auto t = c_.tasks_.find(task_id->second);
    if (t == c_.tasks_.end() || t->second->closed) continue;
    // Its update could not be unmasked any more: it stops training (the cancel) and its row says why.
    if (ClientInfo* client = c_.clients_.Find(client_id); client != nullptr && client->session != nullptr) {
      fl::v1::ServerMessage cancel;
      cancel.set_seq(++client->server_seq);
      cancel.mutable_cancel()->set_task_id(t->second->id);
      cancel.mutable_cancel()->set_reason(why);
      client->session->Send(std::move(cancel));
    }
    c_.CloseTaskAsDropped(*t->second, why);
  }
  if (progress.failure.has_value()) {
    if (secure_timer_ != 0) c_.loop_.Cancel(secure_timer_);
    secure_timer_ = 0;
    secure_timer_at_ = 0;
    RoundState& r = *c_.current_;
    // The tasks still open end with the attempt (their updates could not be unmasked).
    for (const std::string& id : r.task_ids) c_.CloseTaskAsDropped(*c_.tasks_.at(id), *progress.failure);
    FailAttempt(r, fl::StrCat(*progress.failure, "; the global model is untouched"));
    return false;
  }
  return true;
}

void RoundEngine::Core::SyncRounds::SweepDeadlines(int64_t now) {
  if (secure_ == nullptr || c_.current_ == nullptr || c_.current_->evaluation) return;
  if (c_.state_ != EngineState::kCollecting && c_.state_ != EngineState::kUnmasking) return;
  if (!Apply(secure_->Advance(now))) return;
  ArmSecureTimer();
}

bool RoundEngine::Core::SyncRounds::AdvanceOwnState() {
  if (c_.state_ != EngineState::kUnmasking || secure_ == nullptr) return false;
  if (!secure_->done()) return false;  // SweepDeadlines closes the unmask stage (a failure ends the attempt there)
  absl::StatusOr<secagg::AggregateResult> result = secure_->Result();
  if (!result.ok()) {
    FailAttempt(*c_.current_, fl::StrCat("secure aggregation: ", fl::ToStd(result.status().message()),
                                         "; the global model is untouched"));
    return c_.state_ == EngineState::kWaitingForClients;
  }
  c_.current_->secagg_survivors = static_cast<int64_t>(result->survivors.size());
  c_.current_->secagg_dropped = static_cast<int64_t>(secure_->participants() - result->survivors.size());
  CommitRound(*c_.current_, *std::move(result));
  return c_.state_ == EngineState::kWaitingForClients;
}

void RoundEngine::Core::SyncRounds::Abort(const std::string& /*reason*/) {
  if (secure_timer_ != 0) c_.loop_.Cancel(secure_timer_);
  secure_timer_ = 0;
  secure_timer_at_ = 0;
  if (secure_ != nullptr && c_.current_ != nullptr) {
    // Recorded with the aborted round (HandleShutdown writes its row after this).
    c_.current_->secagg_dropped = static_cast<int64_t>(secure_->dropped());
  }
}

void RoundEngine::Core::SyncRounds::OnSecureMessage(ClientInfo& client, const fl::v1::ClientMessage& message,
                                                    int64_t now) {
  if (secure_ == nullptr || c_.current_ == nullptr ||
      (c_.state_ != EngineState::kCollecting && c_.state_ != EngineState::kUnmasking)) {
    RefuseSecureMessage(client, "no secure round is open (the round it belongs to is over)");
    return;
  }
  absl::Status s = secure_->OnMessage(client.id, message, now);
  if (!s.ok()) {
    RefuseSecureMessage(client, fl::StrCat("round ", c_.current_->round, ": ", fl::ToStd(s.message())));
    return;
  }
  SweepDeadlines(now);  // the stage may be complete: the next one's messages go out now
}

absl::Status RoundEngine::Core::SyncRounds::MaskedUploadAdmitted(const TaskInfo& task) const {
  if (secure_ == nullptr || c_.current_ == nullptr || task.round != c_.current_->round ||
      task.attempt != c_.current_->attempt) {
    return absl::FailedPreconditionError(fl::StrCat("task '", task.id, "': its round's secure aggregation is over"));
  }
  return secure_->UploadAdmitted(task.client_id);
}

absl::Status RoundEngine::Core::SyncRounds::AddMasked(const TaskInfo& task, std::span<const uint8_t> payload,
                                                      int64_t now) {
  if (absl::Status s = MaskedUploadAdmitted(task); !s.ok()) return s;
  return secure_->OnMaskedUpload(task.client_id, payload, now);
}

void RoundEngine::Core::SyncRounds::RecordSecureStages(const RoundState& r) {
  if (secure_ == nullptr) return;
  if (secure_timer_ != 0) c_.loop_.Cancel(secure_timer_);
  secure_timer_ = 0;
  secure_timer_at_ = 0;
  using instrumentation::SecAggStage;
  using instrumentation::SecAggStageOutcome;
  constexpr SecAggStage kStages[] = {SecAggStage::kAdvertiseKeys, SecAggStage::kShareKeys, SecAggStage::kMaskedUpload,
                                     SecAggStage::kUnmask};
  for (const std::string& id : secure_->participant_ids()) {
    const std::array<engine::SecureStageView, 4>* view = secure_->ViewOf(id);
    const std::array<secagg::StageBytes, 4> bytes = secure_->BytesOf(id);
    for (size_t s = 0; s < 4; ++s) {
      const engine::SecureStageView& v = (*view)[s];
      if (v.sent_ns == 0) continue;  // the stage never reached this client (dropped before, or the round failed)
      instrumentation::SecAggStageRecord row;
      row.experiment_id = c_.config_.experiment_id;
      row.round = static_cast<int64_t>(r.round);
      row.attempt = r.attempt;
      row.client_id = id;
      row.stage = kStages[s];
      row.outcome = v.answered_ns != 0 ? SecAggStageOutcome::kOk
                    : v.refused        ? SecAggStageOutcome::kRefused
                                       : SecAggStageOutcome::kDropped;
      row.started_unix_ms = static_cast<double>(c_.timeline_.UnixMsAt(v.sent_ns));
      if (v.answered_ns != 0) row.duration_ms = static_cast<double>(v.answered_ns - v.sent_ns) / 1e6;
      row.bytes_down = static_cast<int64_t>(bytes[s].down);
      row.bytes_up = static_cast<int64_t>(bytes[s].up);
      if (row.outcome != SecAggStageOutcome::kOk) row.detail = v.detail;
      c_.Record(std::move(row));
    }
  }
  secure_.reset();
  secure_tasks_.clear();
}

void RoundEngine::Core::AggregationSchedule::RefuseSecureMessage(const ClientInfo& client, std::string_view why) {
  instrumentation::SecurityEventRecord event;
  event.reason = instrumentation::SecurityRefusal::kSecAgg;
  event.peer = client.peer;
  event.claimed = client.id;
  event.detail = fl::StrCat("secure aggregation message refused: ", why);
  core_.RecordSecurityRefusal(std::move(event));
}

RoundEngine::Core::Stragglers& RoundEngine::Core::SyncRounds::StragglerState() {
  if (st_ == nullptr) st_ = std::make_unique<Stragglers>();
  return *st_;
}

uint32_t RoundEngine::Core::SyncRounds::OvercommitSize(uint32_t k, uint32_t available) {
  Stragglers& s = StragglerState();
  s.target = {c_.round_ + 1, c_.attempt_, 0};
  if (c_.config_.overcommit <= 1.0) return k;
  // The epsilon keeps 1.3 x 10 (13.000000000000002 in binary) at 13.
  const double by_factor = std::ceil(c_.config_.overcommit * static_cast<double>(k) - 1e-9);
  const auto wanted = static_cast<uint32_t>(std::min<double>(available, by_factor));
  if (wanted <= k) return k;  // every available client is selected anyway: nothing to cancel
  s.target.k = k;
  return wanted;
}

bool RoundEngine::Core::SyncRounds::CommitTargetReached() const {
  if (st_ == nullptr || c_.current_ == nullptr || c_.current_->evaluation) return false;
  const Stragglers::Target& t = st_->target;
  return t.k > 0 && t.round == c_.current_->round && t.attempt == c_.current_->attempt && c_.current_->accepted >= t.k;
}

void RoundEngine::Core::SyncRounds::CancelSurplusTasks() {
  if (!CommitTargetReached()) return;
  RoundState& r = *c_.current_;
  const std::string reason = fl::StrCat("round ", r.round, " committed with its first ", st_->target.k,
                                        " updates (over-commitment, --overcommit ", c_.config_.overcommit, ")");
  uint32_t cancelled = 0;
  for (const std::string& id : r.task_ids) {
    TaskInfo& task = *c_.tasks_.at(id);
    if (task.closed) continue;
    task.closed = true;
    task.outcome = ClientOutcome::kCancelled;
    task.closed_why = reason;
    ++cancelled;
    instrumentation::ClientRoundRecord rec = c_.TaskRow(task);
    rec.outcome = ClientOutcome::kCancelled;
    if (ClientInfo* c = c_.clients_.Find(task.client_id); c != nullptr) {
      ClientInfo& client = *c;
      if (client.open_task == task.id) client.open_task.clear();
      if (client.session != nullptr) {
        fl::v1::ServerMessage cancel;
        cancel.set_seq(++client.server_seq);
        cancel.mutable_cancel()->set_task_id(task.id);
        cancel.mutable_cancel()->set_reason(reason);
        client.session->Send(std::move(cancel));
      }
      c_.Notify([&](EngineObserver& o) { o.OnUpdateOutcome(ClientOutcome::kCancelled, "", rec, client.join); });
    }
    r.client_rows.push_back(std::move(rec));
  }
  if (cancelled > 0) spdlog::info("{}: {} task(s) cancelled", reason, cancelled);
}

bool RoundEngine::Core::SyncRounds::LateUploadAdmitted(const TaskInfo& task) const {
  return c_.config_.folds_late_updates() && st_ != nullptr && task.closed && st_->foldable.contains(task.id);
}

std::optional<fl::v1::UploadUpdateResponse> RoundEngine::Core::SyncRounds::FoldLateUpdate(
    UploadDoneEvent& e, TaskInfo& task, const instrumentation::ClientRoundRecord& rec) {
  if (task.outcome == ClientOutcome::kCancelled) {
    // An upload already under way when over-commitment cancelled its task: the row stays 'cancelled'.
    return Verdict(task.id, fl::v1::UPDATE_OUTCOME_LATE,
                   proto::MakeError(fl::v1::ERROR_CODE_LATE,
                                    fl::StrCat("task '", task.id, "' was cancelled: round ", task.round,
                                               " committed with the updates that came first (over-commitment)")));
  }
  if (!LateUploadAdmitted(task)) return std::nullopt;
  auto f = st_->foldable.find(task.id);
  const uint64_t base = f->second.base_model_version;
  st_->foldable.erase(f);  // one update per task
  const fl::v1::UpdateHeader& h = e.header;
  const std::string source = fl::StrCat("late update from client '", task.client_id, "' for round ", task.round);
  // Refused late updates keep the 'late' row their round's commit wrote; the verdict and the log say why.
  auto refuse = [&](fl::v1::ErrorCode code, std::string_view why) {
    spdlog::warn("{} not folded: {}", source, why);
    return Rejected(task.id, code, fl::StrCat("late update not folded into a later round: ", why));
  };
  if (h.kind() != fl::v1::UPDATE_KIND_DELTA) {
    return refuse(fl::v1::ERROR_CODE_MALFORMED,
                  "only a delta (pseudo-gradient) can be folded: a full model's difference to the model it was "
                  "trained from cannot be formed once the global model moved on");
  }
  if (h.num_examples() == 0) return refuse(fl::v1::ERROR_CODE_MALFORMED, "it covers 0 examples");
  if (h.model_fingerprint() != c_.model_.spec()->fingerprint()) {
    return refuse(fl::v1::ERROR_CODE_FINGERPRINT_MISMATCH, "it is for another model");
  }
  if (ClientInfo* c = c_.clients_.Find(task.client_id); c != nullptr) {
    if (std::string w = c_.PhaseWindowProblem(*c, h.timings(), task.dispatched_ns, e.done_server_ns); !w.empty()) {
      return refuse(fl::v1::ERROR_CODE_MALFORMED, fl::StrCat("update refused: ", w));
    }
  }
  // The codec the header named, which its upload's admission checked against the one the task asked for.
  auto codec = core::MakeCodec(h.codec());
  if (!codec.ok()) return refuse(fl::v1::ERROR_CODE_UNSUPPORTED_CODEC, fl::ToStd(codec.status().message()));
  std::vector<float> values(c_.model_.spec()->num_elements());
  absl::Status s = (*codec)->Decode(e.payload, values, kVerifiedUpload);
  if (s.ok()) s = core::CheckFinite(values, source, c_.model_.spec().get());
  if (!s.ok()) {
    const bool checksum = s.code() == absl::StatusCode::kDataLoss;
    return refuse(checksum ? fl::v1::ERROR_CODE_CHECKSUM_MISMATCH : fl::v1::ERROR_CODE_NON_FINITE,
                  fl::ToStd(s.message()));
  }
  task.outcome = ClientOutcome::kFolded;  // its row is replaced at the commit that takes it
  Stragglers::PendingFold fold;
  fold.task_id = task.id;
  fold.values = std::move(values);
  fold.examples = static_cast<double>(h.num_examples());
  fold.fingerprint = h.model_fingerprint();
  fold.base_model_version = base;
  fold.row = rec;
  st_->pending.push_back(std::move(fold));
  spdlog::info("{}: kept, to be folded into the next committed round (model version {} -> {} so far)", source, base,
               c_.model_.version());
  return Verdict(task.id, fl::v1::UPDATE_OUTCOME_ACCEPTED);
}

std::vector<instrumentation::ClientRoundRecord> RoundEngine::Core::SyncRounds::FoldPendingInto(RoundState& r) {
  std::vector<instrumentation::ClientRoundRecord> rows;
  if (st_ == nullptr) return rows;
  for (Stragglers::PendingFold& p : st_->pending) {
    // tau: model versions between the one the update was trained from and the one this aggregate is applied to.
    const uint64_t tau = c_.model_.version() > p.base_model_version ? c_.model_.version() - p.base_model_version : 0;
    const double discount = std::pow(1.0 + static_cast<double>(tau), -c_.config_.late_discount);
    // The aggregator's errors say "update from <sender>".
    const std::string sender = fl::StrCat("client '", p.row.client_id, "' for round ", p.row.round,
                                          " (late, folded into round ", r.round, ", staleness ", tau, ")");
    const std::string source = fl::StrCat("late update from ", sender);
    if (absl::Status s = r.aggregator->Add(p.values, p.examples * discount, p.fingerprint, sender); !s.ok()) {
      // A weight below the aggregator's least (a very old update, a steep discount) or a value out of range:
      // the row stays 'late'.
      spdlog::warn("{} not folded: {}", source, fl::ToStd(s.message()));
      continue;
    }
    instrumentation::ClientRoundRecord row = std::move(p.row);
    row.outcome = ClientOutcome::kFolded;
    row.base_model_version = static_cast<int64_t>(p.base_model_version);
    row.staleness = static_cast<int64_t>(tau);
    row.staleness_weight = discount;
    row.folded_into_round = static_cast<int64_t>(r.round);
    if (ClientInfo* c = c_.clients_.Find(row.client_id); c != nullptr) {
      c_.Notify([&](EngineObserver& o) { o.OnUpdateOutcome(ClientOutcome::kFolded, "", row, c->join); });
    }
    rows.push_back(std::move(row));
  }
  st_->pending.clear();
  if (!rows.empty()) spdlog::info("round {}: {} late update(s) folded in", r.round, rows.size());
  return rows;
}

void RoundEngine::Core::SyncRounds::NoteFoldableTasks(const RoundState& r) {
  if (!c_.config_.folds_late_updates()) return;
  Stragglers& s = StragglerState();
  // A task the engine forgot (rounds long past) cannot upload any more.
  std::erase_if(s.foldable, [&](const auto& f) { return !c_.tasks_.contains(f.first); });
  for (const std::string& id : r.task_ids) {
    const TaskInfo& t = *c_.tasks_.at(id);
    if (t.kind != fl::v1::TASK_KIND_TRAIN || t.answered || !t.outcome.has_value()) continue;
    if (*t.outcome != ClientOutcome::kLate && *t.outcome != ClientOutcome::kDropped) continue;
    // Called after the commit's version bump: the task was given the version before it.
    s.foldable[id] = {c_.model_.version() - 1};
  }
}

std::unique_ptr<RoundEngine::Core::AggregationSchedule> RoundEngine::Core::MakeSyncRounds() {
  return std::make_unique<SyncRounds>(*this);
}

}  // namespace fl::server
