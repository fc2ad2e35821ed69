// The round engine's transfers: model downloads, upload admission and slots (with revocation of stalled and
// trickling streams), and the validation and aggregation of each update.
#include "fl/server/round_engine.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "absl/strings/str_format.h"
#include "fl/core/log_format.h"
#include "fl/core/str_cat.h"
#include "fl/proto/convert.h"
#include "engine_internal.h"
#include "engine_schedule.h"
#include "engine_secagg.h"

namespace fl::server {

using namespace engine_internal;  // NOLINT: the engine's own helpers

void RoundEngine::Core::HandleDownload(DownloadEvent& e) {
  const auto& req = e.request;
  if (Authenticate(req.client_id(), req.session_token()) == nullptr) {
    RecordBadToken(e.peer, req.client_id(), "DownloadModel: the client id or its session token is not known");
    e.reply(proto::ToGrpcStatus(
                grpc::StatusCode::UNAUTHENTICATED,
                proto::MakeError(fl::v1::ERROR_CODE_UNKNOWN_CLIENT,
                                 fl::StrCat("client '", req.client_id(), "' is not known"), "", "call Join again")),
            nullptr);
    return;
  }
  if (model_.payload() == nullptr) {
    e.reply(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "the server has no global model yet"), nullptr);
    return;
  }
  if (req.model_version() != 0 && req.model_version() != model_.payload()->model_version) {
    // Buffered aggregation: a train task out may still download the older version it was given.
    if (std::shared_ptr<const ModelPayload> old = schedule_->OldPayload(req.model_version()); old != nullptr) {
      e.reply(grpc::Status::OK, std::move(old));
      return;
    }
    e.reply(grpc::Status(grpc::StatusCode::NOT_FOUND,
                         fl::StrCat("model version ", req.model_version(), " is no longer served; the current one is ",
                                    model_.payload()->model_version)),
            nullptr);
    return;
  }
  e.reply(grpc::Status::OK, model_.payload());
}

void RoundEngine::Core::HandleDownloadDone(const DownloadDoneEvent& e) {
  auto t = tasks_.find(e.task_id);
  if (t == tasks_.end() || t->second->client_id != e.client_id) return;  // outside a task, or a stale one
  t->second->downlink_server_start_ns = e.started_server_ns;
  t->second->downlink_server_ns = e.done_server_ns - e.started_server_ns;
  t->second->downlink_server_bytes = e.bytes;
}

instrumentation::ClientRoundRecord RoundEngine::Core::TaskRow(const TaskInfo& task) const {
  instrumentation::ClientRoundRecord rec;
  rec.experiment_id = config_.experiment_id;
  rec.round = static_cast<int64_t>(task.round);
  rec.attempt = task.attempt;
  rec.client_id = task.client_id;
  rec.dispatched_unix_ms = task.dispatched_unix_ms;
  if (task.downlink_server_start_ns != 0) {
    rec.downlink_server_start_unix_ms = timeline_.UnixMsAt(task.downlink_server_start_ns);
    rec.downlink_server_ms = static_cast<double>(task.downlink_server_ns) / 1e6;
    // The server's count, so that a task that ends without the client's report (cancelled by over-commitment,
    // dropped at the deadline) still shows the model it moved; an update's own report replaces it.
    if (task.downlink_server_bytes > 0) rec.downlink_bytes = static_cast<int64_t>(task.downlink_server_bytes);
  }
  return rec;
}

void RoundEngine::Core::HandleUploadStart(UploadStartEvent& e) {
  const fl::v1::UpdateHeader& h = e.header;
  auto refuse = [&](fl::v1::UploadUpdateResponse verdict) { e.admit(std::move(verdict), {}); };
  ClientInfo* client = Authenticate(h.client_id(), h.session_token());
  if (client == nullptr) {
    RecordBadToken(e.peer, h.client_id(), "UploadUpdate: the client id or its session token is not known");
    return refuse(Rejected(h.task_id(), fl::v1::ERROR_CODE_UNKNOWN_CLIENT,
                           fl::StrCat("client '", LogSafe(h.client_id(), 64), "' or its token is not known"),
                           "call Join again"));
  }
  if (state_ == EngineState::kFinished) {
    return refuse(Rejected(h.task_id(), fl::v1::ERROR_CODE_SHUTTING_DOWN, "the experiment has ended"));
  }
  const core::Codec* codec = nullptr;
  std::unique_ptr<core::Codec> initial_codec;
  std::shared_ptr<const core::ModelSpec> expected = model_.spec();
  TaskInfo* train_task = nullptr;
  if (h.kind() == fl::v1::UPDATE_KIND_INITIAL_MODEL) {
    if (state_ != EngineState::kWaitingForModel || client->id != initial_model_client_) {
      return refuse(Rejected("", fl::v1::ERROR_CODE_WRONG_ROUND,
                             "the server did not ask this client for the initial model", "do not send it"));
    }
    auto c = core::MakeCodec(h.codec());
    if (!c.ok()) {
      return refuse(Rejected("", fl::v1::ERROR_CODE_UNSUPPORTED_CODEC, std::string(fl::ToStd(c.status().message()))));
    }
    initial_codec = std::move(*c);
    codec = initial_codec.get();
    expected = pending_spec_;
  } else if (h.kind() == fl::v1::UPDATE_KIND_DELTA || h.kind() == fl::v1::UPDATE_KIND_WEIGHTS) {
    auto t = tasks_.find(h.task_id());
    if (t == tasks_.end() || t->second->client_id != client->id || t->second->kind != fl::v1::TASK_KIND_TRAIN) {
      return refuse(Rejected(h.task_id(), fl::v1::ERROR_CODE_WRONG_ROUND,
                             fl::StrCat("task '", h.task_id(), "' is not a training task of client '", client->id, "'"),
                             "send updates only for tasks the server gave you"));
    }
    TaskInfo& task = *t->second;
    if (h.round() != task.round) {
      return refuse(
          Rejected(h.task_id(), fl::v1::ERROR_CODE_WRONG_ROUND,
                   fl::StrCat("update says round ", h.round(), " but task '", task.id, "' is for round ", task.round)));
    }
    // The model it was trained from, as the round: an update of another model version is a pseudo-gradient
    // against weights the server did not give this task (issue 27: it was accepted without a word).
    if (h.base_model_version() != task.model_version) {
      return refuse(Verdict(
          h.task_id(), fl::v1::UPDATE_OUTCOME_REJECTED,
          proto::MakeError(fl::v1::ERROR_CODE_WRONG_ROUND,
                           fl::StrCat("update says it was trained from model version ", h.base_model_version(),
                                      " but task '", task.id, "' gave model version ", task.model_version),
                           "base_model_version",
                           "train from the model the task names (Task.model_version) and report that version")));
    }
    // One update per task: a second upload (after the verdict, or while the first is still in transit) is a
    // duplicate whatever the deadline, and never changes what the first one got.
    if (task.answered || task.upload_in_flight) {
      return refuse(Rejected(
          h.task_id(), fl::v1::ERROR_CODE_DUPLICATE,
          task.answered
              ? fl::StrCat("task '", task.id, "' was already answered (outcome ",
                           task.outcome ? instrumentation::ClientOutcomeName(*task.outcome) : std::string_view("none"),
                           "): this upload is a duplicate and is ignored")
              : fl::StrCat("an upload for task '", task.id, "' is already in progress: this one is a duplicate"),
          "send each update once"));
    }
    if ((task.closed || NowNs() > task.deadline_ns) && !schedule_->LateUploadAdmitted(task)) {
      // Late, cancelled or dropped, said as such (ClosedTaskVerdict). A late one is recorded as such when the round
      // closes if the upload had begun by then; a round already closed keeps the outcome it recorded.
      return refuse(ClosedTaskVerdict(task, NowNs()));
    }
    if (const std::string& asked = task.uplink_codec.empty() ? config_.uplink_codec : task.uplink_codec;
        h.codec() != asked) {
      return refuse(Rejected(h.task_id(), fl::v1::ERROR_CODE_UNSUPPORTED_CODEC,
                             fl::StrCat("update uses codec '", h.codec(), "' but the task asked for '", asked, "'")));
    }
    // Every number the client reports is checked before a payload byte is read: its weight against what it
    // declared at Join, its metrics, its phase timings against the time since dispatch. A bad report closes
    // the task as rejected, with the reason recorded.
    if (std::optional<InputProblem> p = CheckUpdateReport(h, UpdateReportBounds(*client, task, NowNs()));
        p.has_value()) {
      fl::v1::UploadUpdateResponse verdict =
          Rejected(h.task_id(), fl::v1::ERROR_CODE_MALFORMED, fl::StrCat("update refused: ", p->message),
                   "report the numbers the client measured; docs/round-engine.md, \"Limits on what clients send\"");
      verdict.mutable_error()->set_field(p->field);
      RejectAtHeader(task, verdict);
      return refuse(std::move(verdict));
    }
    if (task.secure) {
      // A masked update: only once the masked-upload stage is open for this client, and only as a delta.
      absl::Status admitted = h.kind() == fl::v1::UPDATE_KIND_DELTA
                                  ? schedule_->MaskedUploadAdmitted(task)
                                  : absl::InvalidArgumentError("a masked update is a delta (UPDATE_KIND_DELTA)");
      if (!admitted.ok()) {
        return refuse(Rejected(h.task_id(), fl::v1::ERROR_CODE_WRONG_ROUND,
                               fl::StrCat("masked update refused: ", fl::ToStd(admitted.message())),
                               "upload the masked update once ServerMessage.secagg_masking_start arrived"));
      }
    } else {
      codec = &UplinkCodecOf(task);
    }
    task.upload_started = true;
    train_task = &task;
  } else {
    return refuse(Rejected(h.task_id(), fl::v1::ERROR_CODE_MALFORMED,
                           fl::StrCat("update kind ", static_cast<int>(h.kind()), " is not known")));
  }
  if (expected == nullptr || h.model_fingerprint() != expected->fingerprint()) {
    return refuse(Rejected(
        h.task_id(), fl::v1::ERROR_CODE_FINGERPRINT_MISMATCH,
        fl::StrCat("update is for model ", core::FingerprintToHex(h.model_fingerprint()), " but the server's model is ",
                   expected ? expected->FingerprintHex() : std::string("(none)"))));
  }
  // A masked update is (parameters + 1) words of 4 bytes: the weighted quantised delta and the weight.
  const uint64_t want_bytes = codec != nullptr ? codec->EncodedSize(expected->num_elements())
                                               : (expected->num_elements() + 1) * sizeof(uint32_t);
  if (h.payload_bytes() != want_bytes) {
    return refuse(Rejected(h.task_id(),
                           h.payload_bytes() > want_bytes ? fl::v1::ERROR_CODE_TOO_LARGE : fl::v1::ERROR_CODE_MALFORMED,
                           fl::StrCat("update announces ", h.payload_bytes(), " payload bytes but a ",
                                      codec != nullptr ? codec->name() : engine::kSecAggUploadCodec,
                                      " payload of this model is exactly ", want_bytes, " bytes")));
  }
  if (h.kind() == fl::v1::UPDATE_KIND_INITIAL_MODEL) initial_model_upload_in_progress_ = true;
  if (train_task != nullptr) train_task->upload_in_flight = true;
  uploads_.Wait(std::move(e));
  GrantUploadSlots();
}

void RoundEngine::Core::GrantUploadSlots() {
  while (uploads_.HasFree() && uploads_.HasWaiting()) {
    UploadStartEvent next = uploads_.NextWaiting();
    const fl::v1::UpdateHeader& h = next.header;
    if (h.kind() != fl::v1::UPDATE_KIND_INITIAL_MODEL) {
      // A slot goes only to an update that can still count: one whose task closed while it waited is late now.
      auto t = tasks_.find(h.task_id());
      if (t == tasks_.end() || (t->second->closed && !schedule_->LateUploadAdmitted(*t->second))) {
        if (t != tasks_.end()) t->second->upload_in_flight = false;
        next.admit(t != tasks_.end() ? ClosedTaskVerdict(*t->second, NowNs())
                                     : Rejected(h.task_id(), fl::v1::ERROR_CODE_WRONG_ROUND,
                                                "the task is no longer known (its round ended long ago)"),
                   {});
        continue;
      }
    }
    uploads_.Take();
    std::vector<uint8_t> buffer = uploads_.TakeBuffer();
    if (next.handle != nullptr) {
      uploads_.Watch(next.handle, h.client_id(), h.task_id(), NowNs(), h.payload_bytes());
      ArmUploadCheck();
    }
    next.admit(std::nullopt, std::move(buffer));
  }
}

void RoundEngine::Core::RevokeSlowUploads(int64_t now) {
  const engine::UploadLimits limits{config_.upload_message_timeout_ms, config_.upload_min_bytes_per_s,
                                    config_.upload_rate_grace_ms, config_.max_chunk_bytes};
  for (engine::UploadSlots::Revocation& up : uploads_.Judge(now, limits)) {
    spdlog::warn("revoking an upload slot: {}", up.status.error_message());
    std::optional<uint64_t> round;
    if (auto t = tasks_.find(up.task_id); t != tasks_.end()) {
      round = t->second->round;
      t->second->revoked_why = up.status.error_message();  // told to a later upload of the task (ClosedTaskVerdict)
    }
    if (clients_.Find(up.client_id) != nullptr) {
      RecordClientEvent(up.client_id, instrumentation::ClientEventKind::kUploadRevoked, round, up.task_id,
                        up.status.error_message());
    }
    up.handle->Revoke(up.status);  // the reactor answers with an UploadDoneEvent that frees the slot
  }
}

fl::v1::UploadUpdateResponse RoundEngine::Core::ClosedTaskVerdict(const TaskInfo& task, int64_t now) const {
  const std::string revoked =
      task.revoked_why.empty() ? "" : fl::StrCat("; an earlier upload of it lost its slot: ", task.revoked_why);
  const std::string name = fl::StrCat("task '", task.id, "' (round ", task.round, ")");
  if (!task.closed || task.closed_at_deadline) {
    const std::string when =
        now > task.deadline_ns ? fl::StrCat(" ", (now - task.deadline_ns) / kMsToNs, " ms ago") : std::string();
    return Verdict(
        task.id, fl::v1::UPDATE_OUTCOME_LATE,
        proto::MakeError(fl::v1::ERROR_CODE_LATE, fl::StrCat("the deadline of ", name, " passed", when, revoked), "",
                         "a faster link or fewer local steps would help"));
  }
  if (task.outcome == instrumentation::ClientOutcome::kCancelled) {
    // The round went on without it (over-commitment, the last buffered step): late for the model, not refused.
    return Verdict(
        task.id, fl::v1::UPDATE_OUTCOME_LATE,
        proto::MakeError(fl::v1::ERROR_CODE_LATE, fl::StrCat(name, " was cancelled: ", task.closed_why, revoked), "",
                         "a cancelled task needs no update; wait for the next task"));
  }
  if (task.answered) {
    return Rejected(task.id, fl::v1::ERROR_CODE_DUPLICATE,
                    fl::StrCat(name, " was already answered (outcome ",
                               task.outcome ? instrumentation::ClientOutcomeName(*task.outcome) : "none",
                               "): ", task.closed_why, "; this upload is a duplicate and is ignored"),
                    "send each update once");
  }
  return Verdict(
      task.id, fl::v1::UPDATE_OUTCOME_REJECTED,
      proto::MakeError(fl::v1::ERROR_CODE_WRONG_ROUND,
                       fl::StrCat(name, " was closed before this upload (",
                                  task.outcome ? instrumentation::ClientOutcomeName(*task.outcome) : "closed",
                                  "): ", task.closed_why, revoked),
                       "", "send updates only for the open task of the current session"));
}

void RoundEngine::Core::HandleUploadDone(UploadDoneEvent& e) {
  // The slot is given back only once the payload is consumed and freed (end of this function): a slot is a
  // model-sized buffer, and the server's peak memory is bounded by the number of slots, not of clients.
  struct SlotRelease {
    RoundEngine::Core* engine;
    std::vector<uint8_t>* payload;
    ~SlotRelease() {
      // Buffers are kept for the next uploads (at most one per slot): no fresh model-sized allocation, and
      // no page faults, per update.
      engine->uploads_.ReturnBuffer(std::move(*payload));
      engine->uploads_.Give();
      engine->GrantUploadSlots();
    }
  } release{this, &e.payload};
  const fl::v1::UpdateHeader& h = e.header;
  uploads_.Unwatch(e.handle.get());
  if (h.kind() != fl::v1::UPDATE_KIND_INITIAL_MODEL) {
    if (auto t = tasks_.find(h.task_id()); t != tasks_.end() && t->second->client_id == h.client_id()) {
      t->second->upload_in_flight = false;
    }
  }
  if (h.kind() == fl::v1::UPDATE_KIND_INITIAL_MODEL && h.client_id() == initial_model_client_) {
    initial_model_upload_in_progress_ = false;
  }
  if (!e.transfer_error.ok()) {
    spdlog::warn("upload from '{}' for task '{}' failed in transit: {}", LogSafe(h.client_id(), 64),
                 LogSafe(h.task_id(), 64), e.transfer_error.error_message());
    e.reply(Rejected(h.task_id(), fl::v1::ERROR_CODE_MALFORMED, e.transfer_error.error_message()));
    return;
  }
  fl::v1::UploadUpdateResponse verdict;
  if (h.kind() == fl::v1::UPDATE_KIND_INITIAL_MODEL) {
    if (state_ != EngineState::kWaitingForModel || h.client_id() != initial_model_client_ || !pending_spec_) {
      verdict = Rejected("", fl::v1::ERROR_CODE_WRONG_ROUND, "the server no longer needs an initial model");
    } else {
      auto codec = core::MakeCodec(h.codec());
      std::vector<float> values(pending_spec_->num_elements());
      absl::Status s = codec.ok() ? (*codec)->Decode(e.payload, values, kVerifiedUpload) : codec.status();
      if (s.ok()) s = core::CheckFinite(values, "initial model", pending_spec_.get());
      if (s.ok()) s = AdoptModel(*pending_spec_, pending_model_name_, std::move(values), 0);
      if (s.ok()) s = WriteInitialCheckpoint();
      if (s.ok() && !Fire(EngineTrigger::kInitialModelAdopted)) {
        s = absl::InternalError("the round engine failed (a bug; see fl-server's log)");
      }
      if (s.ok()) {
        verdict = Verdict("", fl::v1::UPDATE_OUTCOME_ACCEPTED);
        spdlog::info("initial model ({} tensors, {} parameters, fingerprint {}) from client '{}'",
                     model_.spec()->num_tensors(), model_.spec()->num_elements(), model_.spec()->FingerprintHex(),
                     h.client_id());
      } else {
        verdict = Rejected("", fl::v1::ERROR_CODE_MALFORMED, std::string(fl::ToStd(s.message())));
      }
    }
  } else {
    auto t = tasks_.find(h.task_id());
    if (t == tasks_.end()) {
      verdict = Rejected(h.task_id(), fl::v1::ERROR_CODE_WRONG_ROUND, "the task is no longer known");
    } else {
      NoteUplinkRate(t->second->client_id, e.payload.size(), e.first_byte_server_ns, e.done_server_ns);
      verdict = AcceptUpdate(e, t->second.get());
      t->second->answered = true;  // a later upload for this task is a duplicate
      if (t->second->outcome == instrumentation::ClientOutcome::kOk ||
          t->second->outcome == instrumentation::ClientOutcome::kLate) {
        uplink_reports_due_[t->second->id] = t->second->round;  // the client reports its uplink after the ack
      }
    }
  }
  verdict.set_received_bytes(e.payload.size());
  verdict.set_first_byte_server_ns(e.first_byte_server_ns);
  verdict.set_acked_server_ns(NowNs());
  e.reply(verdict);
}

fl::v1::UploadUpdateResponse RoundEngine::Core::AcceptUpdate(UploadDoneEvent& e, TaskInfo* task) {
  const fl::v1::UpdateHeader& h = e.header;
  instrumentation::ClientRoundRecord rec = TaskRow(*task);
  rec.num_examples = static_cast<int64_t>(h.num_examples());
  if (auto it = h.metrics().find("num_steps"); it != h.metrics().end() && it->second >= 0) {
    rec.num_steps = static_cast<int64_t>(it->second);
  }
  rec.codec = h.codec();
  rec.downlink_ms = PhaseMs(h.timings(), fl::v1::PHASE_DOWNLINK);
  rec.train_ms = PhaseMs(h.timings(), fl::v1::PHASE_TRAIN);
  rec.eval_ms = PhaseMs(h.timings(), fl::v1::PHASE_EVAL);
  rec.idle_ms = PhaseMs(h.timings(), fl::v1::PHASE_IDLE);
  rec.downlink_bytes = static_cast<int64_t>(PhaseBytes(h.timings(), fl::v1::PHASE_DOWNLINK));
  rec.uplink_bytes = static_cast<int64_t>(e.payload.size());
  rec.uplink_server_ms = static_cast<double>(e.done_server_ns - e.first_byte_server_ns) / 1e6;
  if (auto it = h.metrics().find("train_loss"); it != h.metrics().end() && std::isfinite(it->second)) {
    rec.train_loss = it->second;
  }
  rec.uplink_server_start_unix_ms = timeline_.UnixMsAt(e.first_byte_server_ns);
  if (ClientInfo* c = clients_.Find(task->client_id); c != nullptr) {
    if (auto est = c->clock.Estimate(); est.has_value()) {
      rec.clock_offset_ms = static_cast<double>(est->offset_ns) / 1e6;
      rec.clock_rtt_ms = static_cast<double>(est->rtt_ns) / 1e6;
    }
    rec.downlink_start_unix_ms = PlacePhaseStart(*c, h.timings(), fl::v1::PHASE_DOWNLINK);
    rec.train_start_unix_ms = PlacePhaseStart(*c, h.timings(), fl::v1::PHASE_TRAIN);
    rec.eval_start_unix_ms = PlacePhaseStart(*c, h.timings(), fl::v1::PHASE_EVAL);
  }

  // The schedule's own verdict (buffered: the update into the step's buffer; synchronous: a cancelled task's or a
  // late update to fold), else the open round's below.
  if (auto verdict = schedule_->Accept(e, *task, rec); verdict.has_value()) return *std::move(verdict);
  // Rows of a round are written after the round's own row (foreign keys), so they wait in the round state;
  // an update for a round already closed was recorded with the outcome it had at closing.
  auto finish = [&](instrumentation::ClientOutcome outcome, fl::v1::UploadUpdateResponse verdict) {
    if (ClientInfo* c = clients_.Find(task->client_id); c != nullptr && c->open_task == task->id) {
      c->open_task.clear();
    }
    const bool in_current = current_ != nullptr && !current_->evaluation && current_->round == task->round &&
                            current_->attempt == task->attempt && !task->closed;
    if (!task->closed) task->closed_why = "its update arrived and was answered";
    task->closed = true;
    task->outcome = outcome;
    if (in_current) {
      rec.outcome = outcome;
      if (outcome == instrumentation::ClientOutcome::kRejected) rec.reject_reason = verdict.error().message();
      if (outcome == instrumentation::ClientOutcome::kOk) ++current_->accepted;
      if (outcome == instrumentation::ClientOutcome::kLate) ++current_->late;
      if (outcome == instrumentation::ClientOutcome::kRejected) {
        ++current_->rejected;
      }
      const std::string_view reason =
          outcome == instrumentation::ClientOutcome::kRejected ? ReasonName(verdict.error().code()) : "";
      const fl::v1::JoinRequest& join = clients_.At(task->client_id).join;
      Notify([&](EngineObserver& o) { o.OnUpdateOutcome(outcome, reason, rec, join); });
      current_->client_rows.push_back(std::move(rec));
    }
    return verdict;
  };

  if (task->closed) {
    // Closed while the update was in transit: its deadline passed, or it was dropped (ClosedTaskVerdict says which).
    return finish(instrumentation::ClientOutcome::kLate, ClosedTaskVerdict(*task, NowNs()));
  }
  if (e.done_server_ns > task->deadline_ns) {
    return finish(
        instrumentation::ClientOutcome::kLate,
        Verdict(task->id, fl::v1::UPDATE_OUTCOME_LATE,
                proto::MakeError(fl::v1::ERROR_CODE_LATE, fl::StrCat("the update finished arriving ",
                                                                     (e.done_server_ns - task->deadline_ns) / kMsToNs,
                                                                     " ms after the deadline"))));
  }
  if (current_ == nullptr || current_->evaluation || current_->round != task->round ||
      current_->attempt != task->attempt) {
    return finish(
        instrumentation::ClientOutcome::kLate,
        Verdict(task->id, fl::v1::UPDATE_OUTCOME_LATE, proto::MakeError(fl::v1::ERROR_CODE_LATE, "the round is over")));
  }
  // The phases, placed on the server's clock, must lie between the dispatch and the update's arrival: a
  // client cannot put its training decades away (or before the task existed) in the records.
  if (ClientInfo* c = clients_.Find(task->client_id); c != nullptr) {
    if (std::string w = PhaseWindowProblem(*c, h.timings(), task->dispatched_ns, e.done_server_ns); !w.empty()) {
      spdlog::warn("rejected the update of client '{}' for round {}: {}", task->client_id, task->round, w);
      // None of the client's figures go into the row of a refused report.
      rec.downlink_ms = rec.train_ms = rec.eval_ms = rec.idle_ms = std::nullopt;
      rec.downlink_start_unix_ms = rec.train_start_unix_ms = rec.eval_start_unix_ms = std::nullopt;
      rec.train_loss = std::nullopt;
      rec.num_steps = std::nullopt;
      rec.downlink_bytes = std::nullopt;
      return finish(instrumentation::ClientOutcome::kRejected,
                    Rejected(task->id, fl::v1::ERROR_CODE_MALFORMED, fl::StrCat("update refused: ", w)));
    }
  }
  // The aggregator says "update from <sender>" itself: it gets the sender, the other messages the whole phrase.
  const std::string sender = fl::StrCat("client '", task->client_id, "' for round ", task->round);
  const std::string source = fl::StrCat("update from ", sender);
  // Errors of the payload: the codec validates it fully before anything is written (DataLoss: body checksum;
  // a NaN/Inf value is named as such; anything else is malformed), and the aggregator checks sizes, weight
  // and range before anything touches the aggregate.
  auto reject = [&](const absl::Status& s) {
    const bool non_finite = s.message().find("NaN or Inf") != absl::string_view::npos ||
                            s.message().find("non-finite") != absl::string_view::npos;
    const ErrorCode code = s.code() == absl::StatusCode::kDataLoss ? fl::v1::ERROR_CODE_CHECKSUM_MISMATCH
                           : non_finite                            ? fl::v1::ERROR_CODE_NON_FINITE
                                                                   : fl::v1::ERROR_CODE_MALFORMED;
    spdlog::warn("rejected {}: {}", source, s.message());
    return finish(instrumentation::ClientOutcome::kRejected,
                  Rejected(task->id, code, std::string(fl::ToStd(s.message())),
                           non_finite ? "lower the learning rate; the client's training diverged" : ""));
  };
  // FedAvg weights by examples; differential privacy takes the uniform mean (its noise bounds one update's share of
  // a mean of m, whatever the update claims to stand for).
  const double weight = dp_.on() ? 1.0 : static_cast<double>(h.num_examples());
  if (task->secure) {
    // Secure aggregation: the masked words go into the round's running sum; the server never sees the update.
    if (absl::Status s = schedule_->AddMasked(*task, e.payload, e.done_server_ns); !s.ok()) {
      spdlog::warn("rejected {}: {}", source, fl::ToStd(s.message()));
      return finish(instrumentation::ClientOutcome::kRejected,
                    Rejected(task->id, fl::v1::ERROR_CODE_MALFORMED, std::string(fl::ToStd(s.message()))));
    }
  } else if (h.kind() == fl::v1::UPDATE_KIND_DELTA) {
    // The common path: the payload is the pseudo-gradient itself, decoded straight into the aggregator's
    // own buffer (no extra model-sized copy on the server).
    if (absl::Status s = current_->aggregator->AddEncoded(UplinkCodecOf(*task), e.payload, weight,
                                                          h.model_fingerprint(), sender, kVerifiedUpload);
        !s.ok()) {
      return reject(s);
    }
  } else {
    // Weights: the aggregate is taken over pseudo-gradients theta_global - theta_client.
    absl::Status s = model_.PseudoGradientOfWeights(UplinkCodecOf(*task), e.payload, source, scratch_);
    if (!s.ok()) return reject(s);
    if (s = current_->aggregator->Add(scratch_, weight, h.model_fingerprint(), sender); !s.ok()) return reject(s);
  }
  if (rec.train_loss.has_value()) {
    current_->train_loss_sum += *rec.train_loss * static_cast<double>(h.num_examples());
    current_->train_loss_weight += static_cast<double>(h.num_examples());
  }
  return finish(instrumentation::ClientOutcome::kOk, Verdict(task->id, fl::v1::UPDATE_OUTCOME_ACCEPTED));
}

UpdateBounds RoundEngine::Core::UpdateReportBounds(const ClientInfo& client, const TaskInfo& task,
                                                   int64_t now_ns) const {
  UpdateBounds b;
  // An update's weight is the examples behind it: at most the client's shard (declared at Join), or, with
  // --local-steps, the examples those steps draw (steps x batch, which may revisit a small shard); never more
  // than the server's --max-client-examples.
  const uint64_t declared = client.join.num_train_examples();
  const uint64_t batch = std::max<uint32_t>(1, config_.train.batch_size());
  const uint64_t drawn = uint64_t{config_.train.local_steps()} * batch;
  b.max_examples = std::min(std::max(declared, drawn), config_.max_client_examples);
  if (b.max_examples == config_.max_client_examples && std::max(declared, drawn) > config_.max_client_examples) {
    b.examples_basis = fl::StrCat("the server's --max-client-examples=", config_.max_client_examples);
  } else if (drawn > declared) {
    b.examples_basis = fl::StrCat("--local-steps=", config_.train.local_steps(), " x --batch-size=", batch);
  } else {
    b.examples_basis = fl::StrCat("client '", client.id, "' declared ", declared, " train examples at Join");
  }
  const uint64_t epochs = std::max<uint32_t>(1, config_.train.local_epochs());
  b.max_steps =
      config_.train.local_steps() > 0 ? config_.train.local_steps() : epochs * ((b.max_examples + batch - 1) / batch);
  b.max_phase_ns = PhaseBoundNs(task.dispatched_ns, now_ns);
  // A phase moves at most the model's download (the only transfer reported in the header), with headroom
  // for framing; 1 MiB when there is no model yet.
  const uint64_t model_bytes = model_.payload() != nullptr ? model_.payload()->bytes.size() : 0;
  b.max_phase_bytes = 2 * model_bytes + (uint64_t{1} << 20);
  return b;
}

std::string RoundEngine::Core::PhaseWindowProblem(
    const ClientInfo& client, const google::protobuf::RepeatedPtrField<fl::v1::PhaseTiming>& timings, int64_t from_ns,
    int64_t to_ns) const {
  const std::optional<core::ClockSample> est = client.clock.Estimate();
  if (!est.has_value()) return "";  // no offset yet: nothing is placed (the records keep NULL)
  // The offset is good to +- rtt/2; the slack also covers the client's own clock steps around a phase.
  const int64_t slack = est->rtt_ns + InputLimits::kTimingSlackNs;
  for (const fl::v1::PhaseTiming& t : timings) {
    // |start_client_ns| and |offset| are below 2^61 (CheckPhaseTiming, ClockOffsetEstimator): no overflow.
    const int64_t start = t.start_client_ns() - est->offset_ns;
    const int64_t end = start + std::max<int64_t>(0, t.duration_ns());
    if (start < from_ns - slack || end > to_ns + slack) {
      return fl::StrCat("timings (", fl::v1::Phase_Name(t.phase()), ") place the phase from ",
                        static_cast<double>(start - from_ns) / 1e6, " to ", static_cast<double>(end - from_ns) / 1e6,
                        " ms after the task's dispatch on the server's clock (clock offset ",
                        static_cast<double>(est->offset_ns) / 1e6, " ms), outside the ",
                        static_cast<double>(to_ns - from_ns) / 1e6, " ms from the dispatch to the report (+-",
                        static_cast<double>(slack) / 1e6, " ms): the client's timings or clock answers are wrong");
    }
  }
  return "";
}

void RoundEngine::Core::RejectAtHeader(TaskInfo& task, const fl::v1::UploadUpdateResponse& verdict) {
  if (task.closed) return;
  task.closed = true;
  task.answered = true;  // the refusal is its verdict: a later upload is a duplicate, not "late"
  task.outcome = instrumentation::ClientOutcome::kRejected;
  task.closed_why = fl::StrCat("its update was refused at its header: ", verdict.error().message());
  if (schedule_->TaskDropped(task, task.outcome.value(), verdict.error().message())) return;
  if (ClientInfo* c = clients_.Find(task.client_id); c != nullptr && c->open_task == task.id) {
    c->open_task.clear();
  }
  spdlog::warn("rejected the update of client '{}' for round {}: {}", task.client_id, task.round,
               verdict.error().message());
  if (current_ == nullptr || current_->evaluation || current_->round != task.round ||
      current_->attempt != task.attempt) {
    return;
  }
  ++current_->rejected;
  // Only what the server measured: none of the refused report's numbers reach the records.
  instrumentation::ClientRoundRecord rec = TaskRow(task);
  rec.outcome = instrumentation::ClientOutcome::kRejected;
  rec.reject_reason = verdict.error().message();
  if (ClientInfo* c = clients_.Find(task.client_id); c != nullptr) {
    Notify([&](EngineObserver& o) {
      o.OnUpdateOutcome(instrumentation::ClientOutcome::kRejected, ReasonName(verdict.error().code()), rec, c->join);
    });
  }
  current_->client_rows.push_back(std::move(rec));
}

}  // namespace fl::server
