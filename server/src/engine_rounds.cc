// The round engine's rounds: selection and dispatch, closing a round (aggregate, server step, checkpoint, the
// atomic records commit), evaluations, aborts, and the global model's payload and checkpoints.
#include "fl/server/round_engine.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "absl/strings/str_format.h"
#include "fl/core/checksum.h"
#include "fl/core/log_format.h"
#include "fl/core/str_cat.h"
#include "fl/proto/convert.h"
#include <csignal>
#include <cstdlib>
#include <filesystem>

#include "engine_internal.h"
#include "engine_schedule.h"
#include "engine_secagg.h"

namespace fl::server {

using namespace engine_internal;  // NOLINT: the engine's own helpers

std::unique_ptr<core::Aggregator> RoundEngine::Core::TakeAggregator() {
  std::unique_ptr<core::Aggregator> agg = std::move(spare_aggregator_);
  if (agg != nullptr) {
    agg->Reset();
  } else {
    agg = *core::MakeAggregator(config_.aggregator, model_.spec());  // validated in Start()
  }
  // Norm bounding of the updates (--clip-update-norm, or the strategy's default; validated in Start()); with
  // differential privacy, C of this round (--dp-clip-norm, or adaptive clipping's estimate).
  core::NormClip clip = *config_.UpdateNormClip();
  if (dp_.ServerClips()) clip = core::NormClip{core::NormClip::Mode::kFixed, dp_.clip_norm()};
  if (absl::Status s = agg->SetNormClip(clip); !s.ok()) {
    spdlog::error("--clip-update-norm: {}", s.message());
  }
  // Without a norm bound, the bound on every value of an update (--max-update-value; validated in Start()): one
  // client's 1.8e19 must not move every weight by 1e19. With one, the norm bound scales any update into it.
  const bool unbounded_norm = agg->norm_clip().mode == core::NormClip::Mode::kOff;
  if (absl::Status s = agg->SetMaxAbsValue(unbounded_norm ? config_.max_update_value : core::kMaxUpdateAbsValue,
                                           unbounded_norm ? "--max-update-value, without --clip-update-norm" : "");
      !s.ok()) {
    spdlog::error("--max-update-value: {}", s.message());
  }
  return agg;
}

void RoundEngine::Core::ReleaseRound() {
  if (current_ != nullptr && current_->aggregator != nullptr) spare_aggregator_ = std::move(current_->aggregator);
  current_.reset();
}

void RoundEngine::Core::Dispatch(ClientInfo& client, fl::v1::Task task, uint32_t attempt) {
  client.tasked = true;
  auto info = std::make_unique<TaskInfo>();
  info->id = task.task_id();
  info->client_id = client.id;
  info->kind = task.kind();
  info->round = task.round();
  info->attempt = attempt;
  info->dispatched_ns = current_->started_ns;
  info->dispatched_unix_ms = current_->started_unix_ms;
  info->deadline_ns = current_->deadline_ns;
  info->model_version = model_.version();
  // Link-aware compression: each train task names its client's uplink codec (--uplink-codec-policy).
  // Secure aggregation: the update is masked words, whatever the link.
  if (task.kind() == fl::v1::TASK_KIND_TRAIN) {
    task.set_uplink_codec(task.has_secagg() ? std::string(engine::kSecAggUploadCodec) : UplinkCodecFor(client));
  }
  info->secure = task.has_secagg();
  info->uplink_codec = task.uplink_codec();
  task.set_model_version(model_.version());
  task.set_model_fingerprint(model_.spec()->fingerprint());
  task.set_deadline_server_ns(current_->deadline_ns);
  task.set_downlink_codec(config_.downlink_codec);
  fl::v1::ServerMessage msg;
  msg.set_seq(++client.server_seq);
  *msg.mutable_task() = std::move(task);
  client.open_task = info->id;
  client.session->Send(std::move(msg));
  current_->task_ids.push_back(info->id);
  tasks_[info->id] = std::move(info);
}

bool RoundEngine::Core::CommitGlobalStep(RoundState& r, double aggregation_ms,
                                         std::vector<instrumentation::ClientRoundRecord> folded_rows,
                                         std::string_view unit, std::string_view units) {
  auto checkpoint_row = WriteCheckpointFile();
  if (!checkpoint_row.ok()) {
    round_ = r.round - 1;
    model_.UndoCommit();
    Finish(instrumentation::ExperimentStatus::kFailed,
           fl::StrCat("cannot checkpoint ", unit, " ", r.round, ": ", fl::ToStd(checkpoint_row.status().message()),
                      "; ", units, " up to ", round_,
                      " are committed: run again with --resume once the checkpoint directory is writable"));
    return false;
  }
  MaybeKillForTest("checkpoint-written", r.round);
  instrumentation::RoundRecord rec = RoundRow(r, instrumentation::RoundStatus::kCommitted);
  rec.aggregation_ms = aggregation_ms;
  rec.model_version = static_cast<int64_t>(model_.version());
  rec.secagg_survivors = r.secagg_survivors;
  rec.secagg_dropped = r.secagg_dropped;
  if (r.privacy.has_value()) {
    rec.dp_epsilon = r.privacy->epsilon;
    rec.dp_clip_norm = r.privacy->clip_norm;
    rec.dp_noise_multiplier = r.privacy->noise_multiplier;
  }
  last_round_ = CommittedRound{r.round,         r.attempt,      r.accepted,     rec.train_loss,
                               rec.duration_ms, aggregation_ms, rec.dp_epsilon, nullptr};
  instrumentation::RoundCommitRecord commit;
  commit.round = std::move(rec);
  commit.client_rounds = r.client_rows;
  commit.checkpoint = *std::move(checkpoint_row);
  commit.folded_rows = std::move(folded_rows);
  if (absl::Status s = StoreCommit(std::move(commit)); !s.ok()) {
    round_ = r.round - 1;
    model_.UndoCommit();
    Finish(instrumentation::ExperimentStatus::kFailed,
           fl::StrCat(unit, " ", r.round, " was not committed: its records could not be stored: ",
                      fl::ToStd(s.message()), ". The experiment stopped; ", units, " up to ", round_,
                      " are committed in the records. Fix the records database (disk space, permissions, I/O "
                      "errors) and run fl-server again with --resume"));
    return false;
  }
  MaybeKillForTest("records-committed", r.round);
  PruneOldCheckpoints();
  CommittedRound committed = last_round_;
  committed.client_rows = &r.client_rows;
  Notify([&](EngineObserver& o) { o.OnRoundCommitted(committed); });
  return true;
}

instrumentation::RoundRecord RoundEngine::Core::RoundRow(const RoundState& r,
                                                         instrumentation::RoundStatus status) const {
  instrumentation::RoundRecord rec;
  rec.experiment_id = config_.experiment_id;
  rec.round = static_cast<int64_t>(r.round);
  rec.attempt = r.attempt;
  rec.status = status;
  rec.started_unix_ms = r.started_unix_ms;
  rec.ended_unix_ms = UnixMs();
  rec.duration_ms = static_cast<double>(NowNs() - r.started_ns) / 1e6;
  rec.num_selected = static_cast<int64_t>(r.task_ids.size());
  rec.num_accepted = r.accepted;
  rec.num_late = r.late;
  rec.num_rejected = r.rejected;
  rec.num_dropped = r.dropped;
  rec.num_examples = static_cast<int64_t>(r.train_loss_weight);
  if (r.train_loss_weight > 0) rec.train_loss = r.train_loss_sum / r.train_loss_weight;
  return rec;
}

void RoundEngine::Core::StartEvaluation() {
  std::vector<ClientInfo*> idle = IdleConnectedClients();
  if (idle.empty()) {
    spdlog::warn("no connected client to evaluate round {}", round_);
    return;
  }
  SelectionPolicy policy{config_.fraction_evaluate, config_.min_evaluate_clients, 1};
  auto size = SelectionSize(policy, static_cast<uint32_t>(idle.size()));
  if (!size.ok()) return;
  std::vector<std::string> ids;
  for (ClientInfo* c : idle) ids.push_back(c->id);
  std::vector<std::string> selected = SelectClients(ids, *size, config_.seed ^ 0xE7A1, round_, 0);
  current_ = std::make_unique<RoundState>();
  current_->round = round_;
  current_->evaluation = true;
  current_->started_ns = NowNs();
  current_->started_unix_ms = UnixMs();
  current_->deadline_ns = current_->started_ns + int64_t{config_.evaluate_deadline_ms} * kMsToNs;
  for (const std::string& id : selected) {
    fl::v1::Task t;
    t.set_task_id(fl::StrCat("e", round_, "-", id, "-", ++task_counter_));
    t.set_kind(fl::v1::TASK_KIND_EVALUATE);
    t.set_round(round_);
    t.set_deadline_ms(config_.evaluate_deadline_ms);
    Dispatch(clients_.At(id), std::move(t), committed_attempt_);
  }
  if (!Fire(EngineTrigger::kEvaluationStarted)) return;
  MaybeKillForTest("evaluation-started", round_);
}

void RoundEngine::Core::CloseEvaluation() {
  RoundState& r = *current_;
  for (const std::string& id : r.task_ids) CloseTaskAsDropped(*tasks_.at(id), "no evaluation by the deadline");
  std::optional<instrumentation::ServerMetrics::Evaluation> figures;
  instrumentation::EvaluationCommitRecord evaluation;
  if (r.eval_examples > 0) {
    // Example-weighted means of the accepted results; the task decides which figures exist.
    const core::Task kind = task_.value_or(core::Task::kClassification);
    const double examples = static_cast<double>(r.eval_examples);
    figures.emplace();
    figures->loss = r.eval_loss_sum / examples;
    if (kind == core::Task::kRegression) {
      figures->mae = r.eval_mae_sum / examples;
    } else {
      figures->accuracy = r.eval_accuracy_sum / examples;
    }
    if (kind == core::Task::kNextToken) {
      // exp of the mean token cross-entropy; a loss so large that it overflows has no perplexity to show.
      if (const double ppl = std::exp(figures->loss); std::isfinite(ppl)) figures->perplexity = ppl;
    }
    instrumentation::RoundEvaluationUpdate update;
    update.experiment_id = config_.experiment_id;
    update.round = static_cast<int64_t>(r.round);
    update.attempt = committed_attempt_;
    update.eval_loss = figures->loss;
    update.eval_accuracy = figures->accuracy;
    update.eval_mae = figures->mae;
    update.eval_perplexity = figures->perplexity;
    update.eval_num_examples = static_cast<int64_t>(r.eval_examples);
    evaluation.figures = update;
  }
  // The clients' results and the round's figures land together or not at all: --resume redoes an evaluation
  // the records have nothing of.
  evaluation.experiment_id = config_.experiment_id;
  evaluation.round = static_cast<int64_t>(r.round);
  evaluation.attempt = committed_attempt_;
  evaluation.evaluations = std::move(r.evaluation_rows);
  if (absl::Status s = StoreCommit(std::move(evaluation)); !s.ok()) {
    ReleaseRound();
    Finish(instrumentation::ExperimentStatus::kFailed,
           fl::StrCat("the evaluation of round ", round_, " could not be stored: ", fl::ToStd(s.message()),
                      ". The experiment stopped; rounds up to ", round_,
                      " are committed in the records. "
                      "Fix the records database and run fl-server again with --resume (it redoes this "
                      "evaluation)"));
    return;
  }
  MaybeKillForTest("evaluation-committed", round_);
  if (figures.has_value()) Notify([&](EngineObserver& o) { o.OnEvaluationStored(r.round, *figures); });
  ReleaseRound();
  if (!Fire(EngineTrigger::kEvaluationStored)) return;
  RoundDone(figures);
  // Forget tasks of rounds before this one: a straggler's upload for them is refused as unknown.
  for (auto it = tasks_.begin(); it != tasks_.end();) {
    it = (it->second->closed && it->second->round + 1 < round_) ? tasks_.erase(it) : std::next(it);
  }
}

void RoundEngine::Core::HandleShutdown(const ShutdownEvent& e) {
  if (state_ == EngineState::kFinished) return;
  schedule_->Abort(e.reason);
  if (current_ != nullptr) {
    for (const std::string& id : current_->task_ids) {
      TaskInfo& task = *tasks_.at(id);
      if (task.closed) continue;
      task.closed = true;
      task.outcome = instrumentation::ClientOutcome::kDropped;
      task.closed_why = e.reason;
      if (ClientInfo* c = clients_.Find(task.client_id); c != nullptr && c->session) {
        fl::v1::ServerMessage cancel;
        cancel.set_seq(++c->server_seq);
        cancel.mutable_cancel()->set_task_id(task.id);
        cancel.mutable_cancel()->set_reason(e.reason);
        c->session->Send(std::move(cancel));
        c->open_task.clear();
      }
    }
    if (!current_->evaluation) {
      instrumentation::RoundRecord rec = RoundRow(*current_, instrumentation::RoundStatus::kAborted);
      rec.failure_reason = e.reason;
      Record(rec);
      for (auto& row : current_->client_rows) Record(std::move(row));
    }
    ReleaseRound();
  }
  Finish(instrumentation::ExperimentStatus::kAborted, e.reason);
}

void RoundEngine::Core::CloseTaskAsDropped(TaskInfo& task, std::string_view why, bool at_deadline) {
  if (task.closed) return;
  // A task whose update had started arriving when it was closed is "late"; one that never sent is "dropped".
  const bool late = task.upload_started;
  task.closed = true;
  task.closed_why = std::string(why);
  task.closed_at_deadline = at_deadline;
  const instrumentation::ClientOutcome outcome =
      late ? instrumentation::ClientOutcome::kLate : instrumentation::ClientOutcome::kDropped;
  task.outcome = outcome;
  // The schedule's own record of it (buffered: the row goes to the open step, and the client waits for it).
  if (schedule_->TaskDropped(task, outcome, why)) return;
  if (ClientInfo* c = clients_.Find(task.client_id); c != nullptr && c->open_task == task.id) {
    c->open_task.clear();
  }
  if (current_ != nullptr && current_->round == task.round && current_->attempt == task.attempt) {
    ++(late ? current_->late : current_->dropped);
  }
  spdlog::info("task {} of client '{}' {}: {}", task.id, task.client_id, instrumentation::ClientOutcomeName(outcome),
               why);
  if (current_ == nullptr || current_->evaluation || task.kind != fl::v1::TASK_KIND_TRAIN ||
      current_->round != task.round || current_->attempt != task.attempt) {
    return;
  }
  instrumentation::ClientRoundRecord rec = TaskRow(task);
  rec.outcome = outcome;
  if (ClientInfo* c = clients_.Find(task.client_id); c != nullptr) {
    Notify([&](EngineObserver& o) { o.OnUpdateOutcome(outcome, "", rec, c->join); });
  }
  current_->client_rows.push_back(std::move(rec));
}

absl::Status RoundEngine::Core::AdoptModel(core::ModelSpec spec, std::string model_name, std::vector<float> values,
                                           uint64_t model_version) {
  if (absl::Status s = model_.Adopt(std::move(spec), model_name, std::move(values), model_version, round_); !s.ok()) {
    return s;
  }
  config_.model_name = std::move(model_name);  // recorded with the experiment
  return absl::OkStatus();
}

absl::StatusOr<std::optional<instrumentation::CheckpointRecord>> RoundEngine::Core::WriteCheckpointFile() {
  return model_.WriteCheckpoint(
      engine::CheckpointTarget{config_.checkpoint_dir, config_.experiment_id, round_, task_, UnixMs(), dp_.Ledger()});
}

absl::Status RoundEngine::Core::WriteInitialCheckpoint() {
  auto row = WriteCheckpointFile();
  if (!row.ok()) return row.status();
  if (row->has_value()) Record(**std::move(row));
  return absl::OkStatus();
}

void RoundEngine::Core::PruneOldCheckpoints() {
  if (config_.checkpoint_dir.empty() || round_ + 1 <= config_.keep_checkpoints) return;
  // A file that stays behind costs disk space only; the experiment goes on.
  if (absl::Status s = PruneCheckpoints(config_.checkpoint_dir, round_ + 1 - config_.keep_checkpoints); !s.ok()) {
    spdlog::warn("{}", s.message());
  }
}

absl::Status RoundEngine::Core::StoreCommit(instrumentation::Record record) {
  if (records_ == nullptr) return absl::OkStatus();
  // Errors of records enqueued since the last commit (a client's row, an uplink report) come first: the
  // database failed for them as well, and the commit's rows may reference them.
  absl::Status earlier = records_->Flush();
  if (absl::Status s = records_->Enqueue(std::move(record)); !s.ok()) return s;
  absl::Status s = records_->Flush();
  if (!earlier.ok()) return earlier;
  return s;
}

void RoundEngine::Core::MaybeKillForTest(std::string_view step, uint64_t round) const {
  // Read on every call (a handful per round): tests set it in the child's environment only.
  const char* at = std::getenv("FL_SERVER_TEST_KILL_AT");
  if (at == nullptr || fl::StrCat(step, ":", round) != at) return;
  spdlog::warn("FL_SERVER_TEST_KILL_AT={}: killing fl-server (test hook)", at);
  spdlog::default_logger()->flush();
  std::raise(SIGKILL);
}

}  // namespace fl::server
