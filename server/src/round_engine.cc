#include "fl/server/round_engine.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>

#include <nlohmann/json.hpp>
#include "absl/strings/str_format.h"
#include <spdlog/spdlog.h>

#include "fl/core/log_format.h"

#include "fl/core/checksum.h"
#include "fl/core/clock_sync.h"
#include "fl/core/str_cat.h"
#include "fl/core/task.h"
#include "fl/proto/convert.h"
#include "fl/core/clock.h"
#include "fl/server/client_input.h"

namespace fl::server {

using fl::v1::ErrorCode;

struct RoundEngine::ClientInfo {
  std::string id;
  std::string token;
  fl::v1::JoinRequest join;
  std::shared_ptr<SessionChannel> session;
  int64_t last_seen_ns = 0;
  std::string open_task;
  uint64_t server_seq = 0;
  // Clock sync: a ping goes out when the session opens and with every heartbeat; pongs feed the estimator.
  core::ClockOffsetEstimator clock;
  uint64_t next_ping_id = 0;
  std::map<uint64_t, int64_t> pings_in_flight;  // ping id -> t1 (server clock), the last few only
};

struct RoundEngine::TaskInfo {
  std::string id;
  std::string client_id;
  fl::v1::TaskKind kind = fl::v1::TASK_KIND_UNSPECIFIED;
  uint64_t round = 0;
  uint32_t attempt = 1;
  int64_t dispatched_ns = 0;
  int64_t dispatched_unix_ms = 0;
  int64_t deadline_ns = 0;
  bool upload_started = false;  // its update's header arrived (the update may still be in transit)
  bool upload_in_flight = false;  // an upload for it was admitted (or waits for a slot) and has not ended
  bool answered = false;          // an upload for it got its verdict: any further one is a duplicate
  int64_t downlink_server_start_ns = 0;  // the server's view of the task's model download (0: none seen)
  int64_t downlink_server_ns = 0;
  bool closed = false;
  std::string outcome;  // "ok", "late", "dropped", "rejected" once closed
};

struct RoundEngine::RoundState {
  uint64_t round = 0;
  uint32_t attempt = 1;
  bool evaluation = false;
  int64_t started_ns = 0;
  int64_t started_unix_ms = 0;
  int64_t deadline_ns = 0;
  std::vector<std::string> task_ids;
  std::unique_ptr<core::Aggregator> aggregator;
  double train_loss_sum = 0;
  double train_loss_weight = 0;
  uint32_t accepted = 0, late = 0, rejected = 0, dropped = 0;
  double eval_loss_sum = 0, eval_accuracy_sum = 0, eval_mae_sum = 0;
  uint64_t eval_examples = 0;
  uint32_t eval_clients = 0;
  std::vector<instrumentation::ClientRoundRecord> client_rows;  // written after the round's row
  std::vector<instrumentation::EvaluationRecord> evaluation_rows;  // written with the evaluation's figures
};

struct RoundEngine::PendingUpload {
  UploadStartEvent event;
};

namespace {

constexpr int64_t kMsToNs = 1'000'000;

std::string RandomHex(size_t bytes) {
  std::random_device rd;
  std::string out;
  static constexpr char kHex[] = "0123456789abcdef";
  for (size_t i = 0; i < bytes; ++i) {
    const unsigned v = rd() & 0xff;
    out.push_back(kHex[v >> 4]);
    out.push_back(kHex[v & 15]);
  }
  return out;
}

bool ValidClientName(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
           c == '.';
  });
}

fl::v1::UploadUpdateResponse Verdict(const std::string& task_id, fl::v1::UpdateOutcome outcome,
                                     fl::v1::ErrorDetail error = {}) {
  fl::v1::UploadUpdateResponse r;
  r.set_task_id(task_id);
  r.set_outcome(outcome);
  if (error.code() != fl::v1::ERROR_CODE_UNSPECIFIED) *r.mutable_error() = std::move(error);
  return r;
}

fl::v1::UploadUpdateResponse Rejected(const std::string& task_id, ErrorCode code, std::string message,
                                      std::string hint = "") {
  return Verdict(task_id, fl::v1::UPDATE_OUTCOME_REJECTED, wire::MakeError(code, std::move(message), "", std::move(hint)));
}

std::optional<double> PhaseMs(const google::protobuf::RepeatedPtrField<fl::v1::PhaseTiming>& timings,
                              fl::v1::Phase phase) {
  std::optional<double> total;
  for (const auto& t : timings) {
    if (t.phase() == phase) total = total.value_or(0) + static_cast<double>(t.duration_ns()) / 1e6;
  }
  return total;
}

uint64_t PhaseBytes(const google::protobuf::RepeatedPtrField<fl::v1::PhaseTiming>& timings, fl::v1::Phase phase) {
  uint64_t total = 0;
  for (const auto& t : timings) {
    if (t.phase() == phase) total += t.bytes();
  }
  return total;
}

const char* ReasonName(ErrorCode code) {
  switch (code) {
    case fl::v1::ERROR_CODE_MALFORMED: return "malformed";
    case fl::v1::ERROR_CODE_UNKNOWN_CLIENT: return "unknown_client";
    case fl::v1::ERROR_CODE_FINGERPRINT_MISMATCH: return "fingerprint_mismatch";
    case fl::v1::ERROR_CODE_NON_FINITE: return "non_finite";
    case fl::v1::ERROR_CODE_LATE: return "late";
    case fl::v1::ERROR_CODE_WRONG_ROUND: return "wrong_round";
    case fl::v1::ERROR_CODE_CHECKSUM_MISMATCH: return "checksum_mismatch";
    case fl::v1::ERROR_CODE_TOO_LARGE: return "too_large";
    case fl::v1::ERROR_CODE_UNSUPPORTED_CODEC: return "unsupported_codec";
    default: return "other";
  }
}

// Why an evaluation result cannot count, for the experiment's task; "" when it can. Every task's loss is a
// mean cross-entropy or squared error (finite, >= 0); accuracies are fractions; regression must report its
// MAE (metrics["mae"], finite, >= 0).
std::string EvaluationProblem(core::Task task, const fl::v1::EvaluationResult& r) {
  if (r.num_examples() == 0) return "the result covers 0 examples";
  if (!std::isfinite(r.loss()) || r.loss() < 0) {
    return fl::StrCat("its loss ", r.loss(), " is not a finite value >= 0");
  }
  if (task == core::Task::kRegression) {
    auto mae = r.metrics().find("mae");
    if (mae == r.metrics().end()) return "a regression result must report its MAE (metrics[\"mae\"])";
    if (!std::isfinite(mae->second) || mae->second < 0) {
      return fl::StrCat("its MAE ", mae->second, " is not a finite value >= 0");
    }
  } else if (!std::isfinite(r.accuracy()) || r.accuracy() < 0 || r.accuracy() > 1) {
    return fl::StrCat("its accuracy ", r.accuracy(), " is not in [0, 1]");
  }
  return "";
}

// The longest a client can have spent on a task so far by the server's clock, plus slack: no phase it
// reports for the task can be longer.
int64_t PhaseBoundNs(int64_t dispatched_ns, int64_t now_ns) {
  return std::max<int64_t>(0, now_ns - dispatched_ns) + InputLimits::kTimingSlackNs;
}

}  // namespace

absl::StatusOr<core::NormClip> EngineConfig::UpdateNormClip() const {
  // The weighted mean is streamed: it cannot know the round's median norm before adding an update.
  const bool streamed = aggregator == "mean" || aggregator == "fedavg";
  if (clip_update_norm.empty()) {
    core::NormClip clip;
    if (!streamed) clip.mode = core::NormClip::Mode::kMedian;
    return clip;
  }
  auto clip = core::NormClip::Parse(clip_update_norm);
  if (!clip.ok()) {
    return absl::InvalidArgumentError(fl::StrCat("--clip-update-norm=", clip_update_norm, ": ",
                                                 fl::ToStd(clip.status().message())));
  }
  if (clip->mode == core::NormClip::Mode::kMedian && streamed) {
    return absl::InvalidArgumentError(fl::StrCat(
        "--clip-update-norm=median needs a strategy that keeps every update (fedmedian, fedtrimmedavg): the "
        "weighted mean of --strategy fedavg & co. is streamed; give a fixed bound, e.g. --clip-update-norm=10"));
  }
  return clip;
}

std::string_view EngineStateName(EngineState state) {
  switch (state) {
    case EngineState::kWaitingForModel: return "waiting_for_model";
    case EngineState::kWaitingForClients: return "waiting_for_clients";
    case EngineState::kCollecting: return "collecting";
    case EngineState::kEvaluating: return "evaluating";
    case EngineState::kFinished: return "finished";
  }
  return "unknown";
}

absl::Status EngineConfig::Validate() const {
  auto bad = [](std::string_view flag, auto value, std::string_view allowed) {
    return absl::InvalidArgumentError(fl::StrCat("--", flag, "=", value, " is invalid: ", allowed));
  };
  if (num_rounds == 0) return bad("rounds", num_rounds, "run at least one round");
  if (!(fit.fraction > 0 && fit.fraction <= 1)) return bad("fraction-fit", fit.fraction, "must be in (0, 1]");
  if (fit.min_clients == 0) return bad("min-fit-clients", fit.min_clients, "must be at least 1");
  if (fit.min_available < fit.min_clients) {
    return bad("min-available-clients", fit.min_available, "must be at least --min-fit-clients");
  }
  if (!(fraction_evaluate >= 0 && fraction_evaluate <= 1)) {
    return bad("fraction-evaluate", fraction_evaluate, "must be in [0, 1]");
  }
  if (round_deadline_ms < 100) return bad("round-deadline-ms", round_deadline_ms, "must be at least 100");
  if (evaluate_deadline_ms < 100) return bad("evaluate-deadline-ms", evaluate_deadline_ms, "must be at least 100");
  if (max_round_attempts == 0) return bad("max-round-attempts", max_round_attempts, "must be at least 1");
  if (upload_slots == 0) return bad("upload-slots", upload_slots, "must be at least 1");
  if (max_model_values == 0 || max_model_values > core::kMaxSpecElements) {
    return bad("max-model-values", max_model_values, fl::StrCat("must be in [1, ", core::kMaxSpecElements, "]"));
  }
  if (max_client_examples == 0 || static_cast<double>(max_client_examples) > core::kMaxUpdateWeight) {
    return bad("max-client-examples", max_client_examples,
               fl::StrCat("must be in [1, ", core::kMaxUpdateWeight, "] (the largest weight an aggregate takes)"));
  }
  if (initial_model_deadline_ms < 100) {
    return bad("initial-model-deadline-ms", initial_model_deadline_ms, "must be at least 100");
  }
  if (heartbeat_interval_ms < 50) return bad("heartbeat-interval-ms", heartbeat_interval_ms, "must be at least 50");
  // An honest session sends a heartbeat and a pong per interval, plus task reports: leave it room for four.
  const uint32_t min_session_rate = (4000 + heartbeat_interval_ms - 1) / heartbeat_interval_ms;
  if (session_max_messages_per_s < min_session_rate) {
    return bad("session-max-messages-per-s", session_max_messages_per_s,
               fl::StrCat("must be at least ", min_session_rate, " with --heartbeat-interval-ms=",
                          heartbeat_interval_ms, " (four messages per heartbeat interval)"));
  }
  if (session_max_queued_messages < 16) {
    return bad("session-max-queued-messages", session_max_queued_messages, "must be at least 16");
  }
  if (session_hello_timeout_ms < 100) {
    return bad("session-hello-timeout-ms", session_hello_timeout_ms, "must be at least 100");
  }
  if (upload_message_timeout_ms != 0 && upload_message_timeout_ms < 100) {
    return bad("upload-message-timeout-ms", upload_message_timeout_ms, "must be at least 100 (0: off)");
  }
  if (max_chunk_bytes < 1024 || max_chunk_bytes > wire::kMaxChunkBytes) {
    return bad("max-chunk-bytes", max_chunk_bytes, fl::StrCat("must be in [1024, ", wire::kMaxChunkBytes, "]"));
  }
  if (train.batch_size() == 0) return bad("batch-size", train.batch_size(), "must be at least 1");
  if (!(train.learning_rate() > 0)) return bad("lr", train.learning_rate(), "must be > 0");
  if (train.local_epochs() == 0 && train.local_steps() == 0) {
    return bad("local-epochs", 0, "set --local-epochs or --local-steps to at least 1");
  }
  if (train.optimizer() != "sgd" && train.optimizer() != "adamw") {
    return bad("client-optimizer", train.optimizer(), "expected sgd or adamw");
  }
  if (train.proximal_mu() < 0) return bad("proximal-mu", train.proximal_mu(), "must be >= 0");
  for (const std::string* codec : {&uplink_codec, &downlink_codec}) {
    if (auto c = core::MakeCodec(*codec); !c.ok()) {
      return absl::InvalidArgumentError(fl::StrCat("codec '", *codec, "': ", fl::ToStd(c.status().message())));
    }
  }
  auto spec = core::ModelSpec::Create({{"probe", {1}, core::DType::kFloat32, 0}});
  auto shared = std::make_shared<const core::ModelSpec>(*spec);
  if (auto a = core::MakeAggregator(aggregator, shared); !a.ok()) {
    return absl::InvalidArgumentError(fl::StrCat("--aggregator=", aggregator, ": ", fl::ToStd(a.status().message())));
  }
  if (auto clip = UpdateNormClip(); !clip.ok()) return clip.status();
  if (auto o = core::MakeServerOptimizer(optimizer, 1); !o.ok()) {
    return absl::InvalidArgumentError(fl::StrCat("--strategy=", optimizer, ": ", fl::ToStd(o.status().message())));
  }
  return absl::OkStatus();
}

RoundEngine::RoundEngine(EngineConfig config, instrumentation::RecordStore* records, StartPoint start)
    : config_(std::move(config)), records_(records), start_(std::move(start)) {}

void RoundEngine::Record(instrumentation::Record record) {
  if (records_ == nullptr) return;
  if (absl::Status s = records_->Enqueue(std::move(record)); !s.ok()) {
    spdlog::error("cannot record: {}", s.message());
  }
}

RoundEngine::~RoundEngine() {
  Post(ShutdownEvent{"server destroyed"});
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

absl::Status RoundEngine::Start() {
  if (absl::Status s = config_.Validate(); !s.ok()) return s;
  if (config_.experiment_id.empty()) {
    config_.experiment_id = fl::StrCat("exp-", UnixMs(), "-", RandomHex(3));
  }
  auto up = core::MakeCodec(config_.uplink_codec);
  auto down = core::MakeCodec(config_.downlink_codec);
  uplink_codec_ = std::move(*up);
  downlink_codec_ = std::move(*down);

  const bool resumed = start_.resume && start_.checkpoint.has_value();
  if (start_.checkpoint.has_value()) {
    Checkpoint& ckpt = *start_.checkpoint;
    if (resumed) config_.experiment_id = ckpt.experiment_id;
    if (absl::Status s = AdoptModel(ckpt.spec, ckpt.model_name, std::move(ckpt.values), ckpt.model_version);
        !s.ok()) {
      return s;
    }
    if (resumed && !ckpt.task.empty()) {
      // The resumed experiment keeps its task: clients of another one are refused as before the restart.
      auto task = core::ParseTask(ckpt.task);
      if (!task.ok()) {
        return absl::InvalidArgumentError(fl::StrCat("checkpoint of experiment ", ckpt.experiment_id, ": ",
                                                     fl::ToStd(task.status().message())));
      }
      task_ = *task;
    }
    if (resumed) {
      if (ckpt.optimizer.optimizer == optimizer_->name()) {
        if (absl::Status s = optimizer_->ImportState(ckpt.optimizer); !s.ok()) return s;
      } else {
        spdlog::warn("checkpoint holds '{}' optimizer state; starting '{}' fresh", ckpt.optimizer.optimizer,
                     optimizer_->name());
      }
      round_ = ckpt.round;
      committed_attempt_ = start_.committed_attempt;
      evaluation_due_ = start_.redo_evaluation;
      first_attempts_ = start_.first_attempts;
      last_round_summary_.round = round_;
    }
    start_.checkpoint.reset();
    state_ = EngineState::kWaitingForClients;
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
                 round_, model_version_, attempt_,
                 evaluation_due_ ? "; its evaluation was interrupted and is redone first" : "");
  } else {
    nlohmann::json cfg = {
        {"experiment_name", config_.experiment_name}, {"num_rounds", config_.num_rounds},
        {"fraction_fit", config_.fit.fraction}, {"min_fit_clients", config_.fit.min_clients},
        {"min_available_clients", config_.fit.min_available}, {"fraction_evaluate", config_.fraction_evaluate},
        {"evaluate_every", config_.evaluate_every}, {"round_deadline_ms", config_.round_deadline_ms},
        {"max_round_attempts", config_.max_round_attempts}, {"seed", config_.seed},
        {"aggregator", config_.aggregator}, {"optimizer", config_.optimizer},
        {"uplink_codec", config_.uplink_codec}, {"downlink_codec", config_.downlink_codec},
        {"local_epochs", config_.train.local_epochs()}, {"local_steps", config_.train.local_steps()},
        {"batch_size", config_.train.batch_size()}, {"learning_rate", config_.train.learning_rate()},
        {"client_optimizer", config_.train.optimizer()}, {"momentum", config_.train.momentum()},
        {"weight_decay", config_.train.weight_decay()}, {"proximal_mu", config_.train.proximal_mu()}};
    instrumentation::ExperimentRecord exp;
    exp.id = config_.experiment_id;
    exp.name = config_.experiment_name;
    exp.started_unix_ms = UnixMs();
    exp.config_json = cfg.dump();
    exp.software_version = config_.software_version;
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
  thread_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

void RoundEngine::Post(EngineEvent event) {
  {
    std::lock_guard lock(mu_);
    queue_.push_back(std::move(event));
  }
  cv_.notify_all();
}

EngineResult RoundEngine::Wait() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return done_; });
  return result_;
}

void RoundEngine::Stop() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

int64_t RoundEngine::NextDeadlineNs() const {
  int64_t next = INT64_MAX;
  if (current_ != nullptr) next = current_->deadline_ns;
  if (drain_deadline_ns_ != 0) next = std::min(next, drain_deadline_ns_);
  // Uploads holding a slot are checked for stalls and their rate a few times a second (RevokeSlowUploads).
  if (state_ != EngineState::kFinished && !active_uploads_.empty()) next = std::min(next, NowNs() + 100 * kMsToNs);
  if (state_ == EngineState::kWaitingForModel && !initial_model_client_.empty()) {
    next = std::min(next, initial_model_asked_ns_ + int64_t{config_.initial_model_deadline_ms} * kMsToNs);
  }
  if (state_ != EngineState::kFinished && !clients_.empty()) {
    next = std::min(next, NowNs() + int64_t{config_.heartbeat_interval_ms} * kMsToNs);
  }
  return next;
}

void RoundEngine::Loop() {
  Advance();
  for (;;) {
    std::deque<EngineEvent> batch;
    {
      std::unique_lock lock(mu_);
      const int64_t deadline = NextDeadlineNs();
      auto ready = [&] { return !queue_.empty() || stop_; };
      if (deadline == INT64_MAX) {
        cv_.wait(lock, ready);
      } else {
        cv_.wait_until(lock, SteadyTimePoint(deadline), ready);
      }
      batch.swap(queue_);
      if (stop_ && batch.empty()) break;
    }
    for (EngineEvent& e : batch) Handle(e);
    Advance();
  }
}

void RoundEngine::Handle(EngineEvent& event) {
  std::visit(
      [this](auto& e) {
        using T = std::decay_t<decltype(e)>;
        if constexpr (std::is_same_v<T, JoinEvent>) HandleJoin(e);
        else if constexpr (std::is_same_v<T, SessionOpenEvent>) HandleSessionOpen(e);
        else if constexpr (std::is_same_v<T, SessionMessageEvent>) HandleSessionMessage(e);
        else if constexpr (std::is_same_v<T, SessionClosedEvent>) HandleSessionClosed(e);
        else if constexpr (std::is_same_v<T, DownloadEvent>) HandleDownload(e);
        else if constexpr (std::is_same_v<T, DownloadDoneEvent>) HandleDownloadDone(e);
        else if constexpr (std::is_same_v<T, UploadStartEvent>) HandleUploadStart(e);
        else if constexpr (std::is_same_v<T, UploadDoneEvent>) HandleUploadDone(e);
        else if constexpr (std::is_same_v<T, LeaveEvent>) HandleLeave(e);
        else if constexpr (std::is_same_v<T, ShutdownEvent>) HandleShutdown(e);
      },
      event);
}

RoundEngine::ClientInfo* RoundEngine::Authenticate(const std::string& client_id, const std::string& token) {
  auto it = clients_.find(client_id);
  if (it == clients_.end() || it->second->token != token || token.empty()) return nullptr;
  return it->second.get();
}

void RoundEngine::HandleJoin(JoinEvent& e) {
  const fl::v1::JoinRequest& req = e.request;
  fl::v1::JoinResponse resp;
  auto refuse = [&](grpc::StatusCode code, ErrorCode reason, std::string message, std::string field,
                    std::string hint) {
    *resp.mutable_error() = wire::MakeError(reason, std::move(message), std::move(field), std::move(hint));
    spdlog::warn("refused join of '{}' from {}: {}", LogSafe(req.client_name(), 64), LogSafe(e.peer, 64),
                 LogSafe(resp.error().message(), 600));
    e.reply(wire::ToGrpcStatus(code, resp.error()), resp);
  };
  if (state_ == EngineState::kFinished) {
    EngineResult result;
    {
      std::lock_guard lock(mu_);
      result = result_;
    }
    if (result.status == "aborted") {
      return refuse(grpc::StatusCode::UNAVAILABLE, fl::v1::ERROR_CODE_SHUTTING_DOWN,
                    fl::StrCat("fl-server is shutting down: ", result.reason), "", "start a new experiment");
    }
    // Final: a client that was away at the end (stopped, cut off) learns here that there is nothing left to do.
    MarkTold(req.client_name());
    return refuse(grpc::StatusCode::FAILED_PRECONDITION, fl::v1::ERROR_CODE_EXPERIMENT_FINISHED,
                  fl::StrCat("experiment ", config_.experiment_id, " has ended (", result.status, ": ", result.reason,
                             ")"),
                  "", "nothing left to do: fl-client exits");
  }
  if (req.protocol_version() != fl::v1::PROTOCOL_VERSION_1) {
    return refuse(grpc::StatusCode::FAILED_PRECONDITION, fl::v1::ERROR_CODE_ADMISSION_REFUSED,
                  fl::StrCat("protocol version ", static_cast<int>(req.protocol_version()),
                             " is not supported; this server speaks version 1"),
                  "protocol_version", "use an fl-client of the same release as the server");
  }
  if (!ValidClientName(req.client_name())) {
    return refuse(grpc::StatusCode::INVALID_ARGUMENT, fl::v1::ERROR_CODE_MALFORMED,
                  fl::StrCat("client name '", LogSafe(req.client_name(), 64), "' is invalid"), "client_name",
                  "use 1-64 characters from [A-Za-z0-9._-]");
  }
  // Nobody takes over a live session by joining under its name: the rejoin must present that session's token
  // (fl-client does after a reconnect). A name whose session is gone can be joined again without one.
  if (auto holder = clients_.find(req.client_name());
      holder != clients_.end() && holder->second->session != nullptr &&
      (req.session_token().empty() || req.session_token() != holder->second->token)) {
    return refuse(grpc::StatusCode::ALREADY_EXISTS, fl::v1::ERROR_CODE_NAME_IN_USE,
                  fl::StrCat("a live session holds the client name '", req.client_name(), "'; a Join under it must ",
                             req.session_token().empty() ? "present the" : "present the right",
                             " session token of that session (JoinRequest.session_token)"),
                  "session_token",
                  fl::StrCat("use another client name, or retry: a session silent for four heartbeat intervals (",
                             4 * config_.heartbeat_interval_ms, " ms) is dropped"));
  }
  // Every string, map and the spec's size are bounded before anything of the request is kept (the request
  // lives as long as the client, its strings go to the records).
  if (std::optional<InputProblem> p = CheckJoinRequestSizes(req); p.has_value()) {
    return refuse(grpc::StatusCode::INVALID_ARGUMENT, fl::v1::ERROR_CODE_MALFORMED,
                  fl::StrCat("client '", req.client_name(), "': ", p->message), p->field,
                  "send shorter values (docs/round-engine.md, \"Limits on what clients send\")");
  }
  for (const auto& [count, field] : {std::pair{req.num_train_examples(), "num_train_examples"},
                                     std::pair{req.num_test_examples(), "num_test_examples"}}) {
    if (count > config_.max_client_examples) {
      return refuse(grpc::StatusCode::INVALID_ARGUMENT, fl::v1::ERROR_CODE_ADMISSION_REFUSED,
                    fl::StrCat("client '", req.client_name(), "' declares ", count, " ", field,
                               "; this server takes at most ", config_.max_client_examples,
                               " (--max-client-examples)"),
                    field, "declare the size of the client's shard; raise --max-client-examples if it is real");
    }
  }
  auto spec = wire::FromProto(req.model_spec());
  if (!spec.ok()) {
    return refuse(grpc::StatusCode::INVALID_ARGUMENT, fl::v1::ERROR_CODE_MALFORMED,
                  std::string(fl::ToStd(spec.status().message())), "model_spec", "");
  }
  if (spec->num_elements() == 0) {
    return refuse(grpc::StatusCode::INVALID_ARGUMENT, fl::v1::ERROR_CODE_MALFORMED, "the model spec has no parameters",
                  "model_spec", "send the spec of the model the client trains");
  }
  // A model the server does not have yet (it would be this client's) is bounded: the server holds several
  // model-sized buffers, and the first client's declaration alone must not decide how much memory it takes.
  if (spec_ == nullptr && spec->num_elements() > config_.max_model_values) {
    return refuse(grpc::StatusCode::RESOURCE_EXHAUSTED, fl::v1::ERROR_CODE_ADMISSION_REFUSED,
                  fl::StrCat("client '", req.client_name(), "' declares a model of ", spec->num_elements(),
                             " values (", spec->num_elements() * 4, " bytes as fp32, ", spec->num_tensors(),
                             " tensors) but this server takes at most ", config_.max_model_values,
                             " values (--max-model-values)"),
                  "model_spec", "start fl-server with a larger --max-model-values if the model is real");
  }
  auto task = core::ParseTask(req.task());
  if (!task.ok()) {
    return refuse(grpc::StatusCode::INVALID_ARGUMENT, fl::v1::ERROR_CODE_MALFORMED,
                  fl::StrCat("client '", req.client_name(), "': ", fl::ToStd(task.status().message())), "task",
                  "start fl-client with --task classification, regression or next-token");
  }
  if (task_.has_value() && *task != *task_) {
    return refuse(grpc::StatusCode::FAILED_PRECONDITION, fl::v1::ERROR_CODE_ADMISSION_REFUSED,
                  fl::StrCat("client '", req.client_name(), "' trains for task '", core::TaskName(*task),
                             "' but this experiment's task is '", core::TaskName(*task_),
                             "' (set by its first client)"),
                  "task", "start every client of an experiment with the same --task (and model)");
  }
  // The model a joining client must train: the experiment's, or, while the server waits for its initial
  // weights, that of the client asked for them (unless that one has gone: then this client is asked).
  bool ask_for_initial_model = false;
  std::shared_ptr<const core::ModelSpec> expected = spec_;
  std::string_view expected_name = "this experiment's";
  if (state_ == EngineState::kWaitingForModel) {
    auto holder = clients_.find(initial_model_client_);
    const int64_t asked_ago = NowNs() - initial_model_asked_ns_;
    // Past the deadline the holder has stalled (unless its upload is under way): this client is asked instead.
    const bool stalled = asked_ago >= int64_t{config_.initial_model_deadline_ms} * kMsToNs &&
                         !initial_model_upload_in_progress_;
    const bool other_holder = holder != clients_.end() && holder->first != req.client_name();
    const bool holder_alive =
        other_holder && !stalled && (holder->second->session != nullptr || asked_ago < int64_t{30'000} * kMsToNs);
    if (holder_alive) {
      expected = pending_spec_;
      expected_name = "the first client's";
    } else {
      ask_for_initial_model = true;
      if (other_holder && expected == nullptr && spec->num_elements() <= config_.max_model_values) {
        AbandonInitialModelHolder(holder->first, req.client_name(),
                                  stalled ? fl::StrCat("it has not uploaded it within --initial-model-deadline-ms=",
                                                       config_.initial_model_deadline_ms)
                                          : std::string("its session ended without the upload"));
      }
    }
  }
  if (expected != nullptr && spec->fingerprint() != expected->fingerprint()) {
    // The join carries the client's whole spec: name the first tensor that differs, not just two hashes.
    std::string diff = core::DescribeSpecDifference(*expected, *spec, fl::StrCat(expected_name, " model"),
                                                    "the client's model");
    if (diff.empty()) diff = "the specs hold the same tensors but their fingerprints differ";  // not reachable
    return refuse(grpc::StatusCode::FAILED_PRECONDITION, fl::v1::ERROR_CODE_FINGERPRINT_MISMATCH,
                  fl::StrCat("client '", req.client_name(), "' trains a model that differs from ", expected_name,
                             ": ", diff, "; model fingerprints ", spec->FingerprintHex(), " (client, ",
                             spec->num_tensors(), " tensors, ", spec->num_elements(), " values) vs ",
                             expected->FingerprintHex(), " (", expected->num_tensors(), " tensors, ",
                             expected->num_elements(), " values)"),
                  "model_spec", "start the client with the same --model as the other clients");
  }

  auto& slot = clients_[req.client_name()];
  const bool rejoin = slot != nullptr;
  if (!rejoin) slot = std::make_unique<ClientInfo>();
  ClientInfo& client = *slot;
  client.id = req.client_name();
  client.token = RandomHex(16);
  client.join = req;
  // The model's spec is kept once (the experiment's, or the pending one it was compared with), not per client:
  // a spec may be megabytes of tensor names.
  client.join.clear_model_spec();
  client.last_seen_ns = NowNs();
  if (client.session != nullptr) {
    // A rejoin means the client restarted: its old stream (if the server still has one) is stale.
    client.session->Close(grpc::Status(grpc::StatusCode::ABORTED, "replaced by a new session after rejoin"));
    client.session.reset();
  }
  if (!client.open_task.empty()) {
    auto t = tasks_.find(client.open_task);
    if (t != tasks_.end()) CloseTaskAsDropped(*t->second, "the client rejoined (it restarted)");
  }

  resp.set_admitted(true);
  resp.set_client_id(client.id);
  resp.set_session_token(client.token);
  resp.set_experiment_id(config_.experiment_id);
  resp.set_heartbeat_interval_ms(config_.heartbeat_interval_ms);
  resp.set_max_chunk_bytes(config_.max_chunk_bytes);
  if (ask_for_initial_model) {
    // The client asked for the initial weights uploads them before it opens its session; give it a while
    // before asking someone else, or every client joining in the meantime would be asked too.
    initial_model_client_ = client.id;
    initial_model_asked_ns_ = NowNs();
    pending_spec_ = std::make_shared<const core::ModelSpec>(*spec);
    pending_model_name_ = req.model_spec().name();
    resp.set_initial_model_requested(true);
  }
  if (!task_.has_value()) {
    // The first admitted client fixes the experiment's task, as the first client fixes its model.
    task_ = *task;
    spdlog::info("experiment {}: task {} (from client '{}')", config_.experiment_id, core::TaskName(*task_),
                 client.id);
    Record(instrumentation::ExperimentTaskUpdate{config_.experiment_id, std::string(core::TaskName(*task_))});
  }
  spdlog::info("{} client '{}' ({}, {} via {}), {} train examples", rejoin ? "rejoined" : "admitted", client.id,
               LogSafe(req.device().device_class(), 64), wire::LinkKindName(req.link().kind()),
               LogSafe(req.link().interface(), 64), req.num_train_examples());
  instrumentation::ClientRecord rec;
  rec.experiment_id = config_.experiment_id;
  rec.client_id = client.id;
  rec.client_name = req.client_name();
  rec.device_class = req.device().device_class();
  rec.link_kind = std::string(wire::LinkKindName(req.link().kind()));
  rec.link_interface = req.link().interface();
  rec.link_profile = req.link().profile();
  if (req.device().cpu_cores() > 0) rec.cores = req.device().cpu_cores();
  if (req.device().memory_bytes() > 0) rec.memory_bytes = static_cast<int64_t>(req.device().memory_bytes());
  rec.accelerator = req.device().accelerator().name();
  rec.os = req.device().os();
  rec.arch = req.device().arch();
  rec.client_version = req.software_version();
  rec.joined_unix_ms = UnixMs();
  Record(rec);  // a rejoin updates the client's row
  e.reply(grpc::Status::OK, resp);
}

void RoundEngine::HandleSessionOpen(SessionOpenEvent& e) {
  ClientInfo* client = Authenticate(e.hello.client_id(), e.hello.session_token());
  if (client == nullptr) {
    e.channel->Close(wire::ToGrpcStatus(
        grpc::StatusCode::UNAUTHENTICATED,
        wire::MakeError(fl::v1::ERROR_CODE_UNKNOWN_CLIENT,
                        fl::StrCat("client id '", LogSafe(e.hello.client_id(), 64),
                                   "' or its session token is not known"),
                        "hello", "call Join again (the server may have restarted)")));
    return;
  }
  if (state_ == EngineState::kFinished) {
    // The same Shutdown the connected clients got at the end, so that a late session ends its client too.
    EngineResult result;
    {
      std::lock_guard lock(mu_);
      result = result_;
    }
    fl::v1::ServerMessage bye;
    bye.set_seq(1);
    bye.mutable_shutdown()->set_reason(fl::StrCat("experiment ", config_.experiment_id, " has ended (",
                                                  result.status, ": ", result.reason, ")"));
    bye.mutable_shutdown()->set_experiment_finished(result.status != "aborted");
    e.channel->Send(std::move(bye));
    e.channel->Close(grpc::Status::OK);
    if (result.status != "aborted") MarkTold(client->id);
    return;
  }
  if (client->session != nullptr && client->session != e.channel) {
    client->session->Close(grpc::Status(grpc::StatusCode::ABORTED, "replaced by a newer session"));
  }
  client->session = e.channel;
  client->last_seen_ns = NowNs();
  // A new session may be a restarted client process, whose monotonic clock has another origin.
  client->clock = core::ClockOffsetEstimator();
  client->pings_in_flight.clear();
  fl::v1::ServerMessage welcome;
  welcome.set_seq(++client->server_seq);
  welcome.mutable_welcome()->set_sent_server_ns(NowNs());
  welcome.mutable_welcome()->set_current_round(round_);
  client->session->Send(std::move(welcome));
  SendPing(*client);
  UpdateConnectedGauge();
}

std::optional<double> RoundEngine::PlacePhaseStart(
    const ClientInfo& client, const google::protobuf::RepeatedPtrField<fl::v1::PhaseTiming>& timings,
    fl::v1::Phase phase) const {
  const std::optional<core::ClockSample> est = client.clock.Estimate();
  if (!est.has_value()) return std::nullopt;
  for (const auto& t : timings) {
    if (t.phase() == phase) return timeline_.PlaceClient(t.start_client_ns(), est->offset_ns);
  }
  return std::nullopt;
}

void RoundEngine::RecordClientUplink(const ClientInfo& client, const std::string& task_id,
                                     const fl::v1::PhaseTiming& uplink) {
  // Checked before any arithmetic on it (start + duration could overflow) and before it is recorded: the
  // uplink cannot have lasted longer than the task, nor lie outside it on the server's clock.
  if (auto known = tasks_.find(task_id); known != tasks_.end() && known->second->client_id == client.id) {
    const int64_t now = NowNs();
    std::string problem;
    if (auto p = CheckPhaseTiming(uplink, "status.timings", PhaseBoundNs(known->second->dispatched_ns, now),
                                  uint64_t{1} << 62)) {
      problem = p->message;
    } else {
      google::protobuf::RepeatedPtrField<fl::v1::PhaseTiming> one;
      *one.Add() = uplink;
      problem = PhaseWindowProblem(client, one, known->second->dispatched_ns, now);
    }
    if (!problem.empty()) {
      spdlog::warn("ignored the uplink report of client '{}' for task {}: {}", client.id, LogSafe(task_id, 64),
                   problem);
      return;
    }
  } else {
    return;  // not a task of this client: nothing to attach it to
  }
  const double uplink_ms = static_cast<double>(uplink.duration_ns()) / 1e6;
  std::optional<double> start_unix_ms;
  std::optional<double> end_unix_ms;
  if (const std::optional<core::ClockSample> est = client.clock.Estimate(); est.has_value()) {
    start_unix_ms = timeline_.PlaceClient(uplink.start_client_ns(), est->offset_ns);
    end_unix_ms = timeline_.PlaceClient(uplink.start_client_ns() + uplink.duration_ns(), est->offset_ns);
  }
  auto t = tasks_.find(task_id);
  if (state_ == EngineState::kFinished || t == tasks_.end() || t->second->client_id != client.id ||
      t->second->kind != fl::v1::TASK_KIND_TRAIN || !t->second->closed || !std::isfinite(uplink_ms) ||
      uplink_ms < 0) {
    return;  // not an update of this client that the server has answered: nothing to attach it to
  }
  const TaskInfo& task = *t->second;
  uplink_reports_due_.erase(task.id);
  // The row is still buffered while its round is open, and already written once the round closed (the
  // last update of a round closes it before the client can report its uplink).
  if (current_ != nullptr && !current_->evaluation && current_->round == task.round &&
      current_->attempt == task.attempt) {
    for (auto& row : current_->client_rows) {
      if (row.client_id != client.id) continue;
      row.uplink_ms = uplink_ms;
      row.uplink_start_unix_ms = start_unix_ms;
      row.uplink_end_unix_ms = end_unix_ms;
    }
    return;
  }
  Record(instrumentation::ClientRoundUplinkUpdate{config_.experiment_id, static_cast<int64_t>(task.round),
                                                  task.attempt, client.id, uplink_ms, start_unix_ms,
                                                  end_unix_ms});
}

void RoundEngine::UpdateConnectedGauge() {
  if (metrics_ == nullptr) return;
  int64_t connected = 0;
  for (const auto& [id, c] : clients_) connected += c->session != nullptr;
  metrics_->SetConnectedClients(connected);
}

void RoundEngine::SendPing(ClientInfo& client) {
  if (client.session == nullptr) return;
  fl::v1::ServerMessage ping;
  ping.set_seq(++client.server_seq);
  const uint64_t id = ++client.next_ping_id;
  const int64_t t1 = NowNs();
  ping.mutable_ping()->set_ping_id(id);
  ping.mutable_ping()->set_sent_server_ns(t1);
  client.pings_in_flight[id] = t1;
  while (client.pings_in_flight.size() > 8) client.pings_in_flight.erase(client.pings_in_flight.begin());
  client.session->Send(std::move(ping));
}

void RoundEngine::HandleSessionMessage(SessionMessageEvent& e) {
  ClientInfo* client = nullptr;
  for (auto& [id, c] : clients_) {
    if (c->session == e.channel) client = c.get();
  }
  if (client == nullptr) return;  // a stream we already replaced or closed
  client->last_seen_ns = e.received_server_ns;
  const fl::v1::ClientMessage& m = e.message;
  switch (m.kind_case()) {
    case fl::v1::ClientMessage::kStatus:
      // At most InputLimits::kMaxTimings of them are looked at (a status carries one, the uplink).
      for (int i = 0; i < std::min<int>(m.status().timings_size(), InputLimits::kMaxTimings); ++i) {
        const fl::v1::PhaseTiming& t = m.status().timings(i);
        if (t.phase() == fl::v1::PHASE_UPLINK) RecordClientUplink(*client, m.status().task_id(), t);
      }
      if (m.status().state() == fl::v1::CLIENT_STATE_FAILED && m.status().task_id() == client->open_task) {
        auto t = tasks_.find(client->open_task);
        if (t != tasks_.end()) {
          CloseTaskAsDropped(*t->second,
                             fl::StrCat("the client reported a failure: ", LogSafe(m.status().error().message(), 400)));
        }
      }
      break;
    case fl::v1::ClientMessage::kEvaluation: {
      const fl::v1::EvaluationResult& r = m.evaluation();
      auto t = tasks_.find(r.task_id());
      if (t == tasks_.end() || t->second->client_id != client->id || t->second->closed ||
          t->second->kind != fl::v1::TASK_KIND_EVALUATE) {
        break;  // stale or foreign result: nothing to attach it to
      }
      TaskInfo& task = *t->second;
      task.closed = true;
      client->open_task.clear();
      // Every task's results are weighted by num_examples (for next-token: sequences, see trainer.h).
      const core::Task kind = task_.value_or(core::Task::kClassification);
      // The task-independent numbers first (example count, metrics, timings against the server's clock),
      // then the figures of the task. num_examples is bounded by the test examples the client declared.
      const uint64_t declared = client->join.num_test_examples();
      const uint64_t max_examples = declared > 0 ? declared : config_.max_client_examples;
      std::string problem;
      bool numbers_ok = true;
      if (auto p = CheckEvaluationReport(r, max_examples, PhaseBoundNs(task.dispatched_ns, e.received_server_ns))) {
        problem = declared > 0 && p->field == "num_examples"
                      ? fl::StrCat(p->message, " (the client declared ", declared, " test examples at Join)")
                      : p->message;
        numbers_ok = false;
      } else if (std::string w = PhaseWindowProblem(*client, r.timings(), task.dispatched_ns, e.received_server_ns);
                 !w.empty()) {
        problem = w;
        numbers_ok = false;
      } else {
        problem = EvaluationProblem(kind, r);
      }
      const bool valid = problem.empty();
      task.outcome = valid ? "ok" : "rejected";
      const double weight = static_cast<double>(r.num_examples());
      const double mae = valid && kind == core::Task::kRegression ? r.metrics().at("mae") : 0.0;
      if (valid && current_ != nullptr && current_->evaluation && current_->round == task.round) {
        current_->eval_loss_sum += r.loss() * weight;
        current_->eval_accuracy_sum += r.accuracy() * weight;
        current_->eval_mae_sum += mae * weight;
        current_->eval_examples += r.num_examples();
        current_->eval_clients += 1;
      }
      instrumentation::EvaluationRecord rec;
      rec.experiment_id = config_.experiment_id;
      rec.round = static_cast<int64_t>(task.round);
      rec.attempt = task.attempt;
      rec.client_id = client->id;
      // A refused result keeps what the client claimed only when it is a plausible number (the records'
      // CHECK constraints and readers trust these columns).
      rec.num_examples = numbers_ok ? static_cast<int64_t>(r.num_examples()) : 0;
      if (numbers_ok) rec.eval_ms = PhaseMs(r.timings(), fl::v1::PHASE_EVAL);
      if (valid) {
        rec.loss = r.loss();
        if (kind == core::Task::kRegression) {
          rec.mae = mae;
        } else {
          rec.accuracy = r.accuracy();
        }
      } else {
        // Refused like a bad update: recorded with the reason, counted in no figure.
        rec.reject_reason = fl::StrCat("evaluation result for task '", core::TaskName(kind), "' refused: ", problem);
        spdlog::warn("refused the evaluation result of client '{}' for round {}: {}", client->id, task.round,
                     problem);
      }
      // Stored with the round's figures as one unit when the evaluation closes (EvaluationCommitRecord).
      if (current_ != nullptr && current_->evaluation && current_->round == task.round) {
        current_->evaluation_rows.push_back(std::move(rec));
      } else {
        Record(rec);
      }
      break;
    }
    case fl::v1::ClientMessage::kHeartbeat:
      SendPing(*client);
      break;
    case fl::v1::ClientMessage::kPong: {
      // t1 is our own record of the ping, not the echoed value: a client cannot skew the estimate by
      // echoing something else.
      auto it = client->pings_in_flight.find(m.pong().ping_id());
      if (it == client->pings_in_flight.end()) break;
      const int64_t t1 = it->second;
      client->pings_in_flight.erase(it);
      if (!client->clock.Add(t1, m.pong().received_client_ns(), m.pong().sent_client_ns(), e.received_server_ns)) {
        // Impossible timestamps (answered before received, beyond +-2^60 ns): never used to place phases.
        spdlog::warn("client '{}' sent a clock pong with impossible timestamps (received {} ns, sent {} ns of its "
                     "clock); ignored",
                     client->id, m.pong().received_client_ns(), m.pong().sent_client_ns());
      }
      break;
    }
    default:
      break;
  }
}

void RoundEngine::HandleSessionClosed(SessionClosedEvent& e) {
  for (auto& [id, c] : clients_) {
    if (c->session != e.channel) continue;
    c->session.reset();
    if (!c->open_task.empty()) {
      auto t = tasks_.find(c->open_task);
      if (t != tasks_.end()) CloseTaskAsDropped(*t->second, "the client's session ended");
    }
    spdlog::info("client '{}' disconnected", id);
  }
  UpdateConnectedGauge();
}

void RoundEngine::HandleDownload(DownloadEvent& e) {
  const auto& req = e.request;
  if (Authenticate(req.client_id(), req.session_token()) == nullptr) {
    e.reply(wire::ToGrpcStatus(grpc::StatusCode::UNAUTHENTICATED,
                               wire::MakeError(fl::v1::ERROR_CODE_UNKNOWN_CLIENT,
                                               fl::StrCat("client '", req.client_id(), "' is not known"), "",
                                               "call Join again")),
            nullptr);
    return;
  }
  if (payload_ == nullptr) {
    e.reply(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "the server has no global model yet"), nullptr);
    return;
  }
  if (req.model_version() != 0 && req.model_version() != payload_->model_version) {
    e.reply(grpc::Status(grpc::StatusCode::NOT_FOUND,
                         fl::StrCat("model version ", req.model_version(), " is no longer served; the current one is ",
                                    payload_->model_version)),
            nullptr);
    return;
  }
  e.reply(grpc::Status::OK, payload_);
}

void RoundEngine::HandleDownloadDone(const DownloadDoneEvent& e) {
  auto t = tasks_.find(e.task_id);
  if (t == tasks_.end() || t->second->client_id != e.client_id) return;  // outside a task, or a stale one
  t->second->downlink_server_start_ns = e.started_server_ns;
  t->second->downlink_server_ns = e.done_server_ns - e.started_server_ns;
}

void RoundEngine::FillServerDownlink(const TaskInfo& task, instrumentation::ClientRoundRecord& rec) const {
  if (task.downlink_server_start_ns == 0) return;
  rec.downlink_server_start_unix_ms = timeline_.UnixMsAt(task.downlink_server_start_ns);
  rec.downlink_server_ms = static_cast<double>(task.downlink_server_ns) / 1e6;
}

void RoundEngine::HandleUploadStart(UploadStartEvent& e) {
  const fl::v1::UpdateHeader& h = e.header;
  auto refuse = [&](fl::v1::UploadUpdateResponse verdict) { e.admit(std::move(verdict), {}); };
  ClientInfo* client = Authenticate(h.client_id(), h.session_token());
  if (client == nullptr) {
    return refuse(Rejected(h.task_id(), fl::v1::ERROR_CODE_UNKNOWN_CLIENT,
                           fl::StrCat("client '", LogSafe(h.client_id(), 64), "' or its token is not known"),
                           "call Join again"));
  }
  if (state_ == EngineState::kFinished) {
    return refuse(Rejected(h.task_id(), fl::v1::ERROR_CODE_SHUTTING_DOWN, "the experiment has ended"));
  }
  const core::Codec* codec = nullptr;
  std::unique_ptr<core::Codec> initial_codec;
  std::shared_ptr<const core::ModelSpec> expected = spec_;
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
      return refuse(Rejected(h.task_id(), fl::v1::ERROR_CODE_WRONG_ROUND,
                             fl::StrCat("update says round ", h.round(), " but task '", task.id, "' is for round ",
                                        task.round)));
    }
    // One update per task: a second upload (after the verdict, or while the first is still in transit) is a
    // duplicate whatever the deadline, and never changes what the first one got.
    if (task.answered || task.upload_in_flight) {
      return refuse(Rejected(h.task_id(), fl::v1::ERROR_CODE_DUPLICATE,
                             task.answered ? fl::StrCat("task '", task.id, "' was already answered (outcome ",
                                                        task.outcome, "): this upload is a duplicate and is ignored")
                                           : fl::StrCat("an upload for task '", task.id,
                                                        "' is already in progress: this one is a duplicate"),
                             "send each update once"));
    }
    if (task.closed || NowNs() > task.deadline_ns) {
      // Late: recorded as such when the round closes if the upload had begun by then; a round already
      // closed keeps the outcome it recorded.
      return refuse(Verdict(h.task_id(), fl::v1::UPDATE_OUTCOME_LATE,
                            wire::MakeError(fl::v1::ERROR_CODE_LATE,
                                            fl::StrCat("the deadline of round ", task.round, " has passed"), "",
                                            "a faster link or fewer local steps would help")));
    }
    if (h.codec() != config_.uplink_codec) {
      return refuse(Rejected(h.task_id(), fl::v1::ERROR_CODE_UNSUPPORTED_CODEC,
                             fl::StrCat("update uses codec '", h.codec(), "' but the task asked for '",
                                        config_.uplink_codec, "'")));
    }
    // Every number the client reports is checked before a payload byte is read: its weight against what it
    // declared at Join, its metrics, its phase timings against the time since dispatch. A bad report closes
    // the task as rejected, with the reason recorded.
    if (std::optional<InputProblem> p = CheckUpdateReport(h, UpdateReportBounds(*client, task, NowNs()));
        p.has_value()) {
      fl::v1::UploadUpdateResponse verdict = Rejected(
          h.task_id(), fl::v1::ERROR_CODE_MALFORMED, fl::StrCat("update refused: ", p->message),
          "report the numbers the client measured; docs/round-engine.md, \"Limits on what clients send\"");
      verdict.mutable_error()->set_field(p->field);
      RejectAtHeader(task, verdict);
      return refuse(std::move(verdict));
    }
    codec = uplink_codec_.get();
    task.upload_started = true;
    train_task = &task;
  } else {
    return refuse(Rejected(h.task_id(), fl::v1::ERROR_CODE_MALFORMED,
                           fl::StrCat("update kind ", static_cast<int>(h.kind()), " is not known")));
  }
  if (expected == nullptr || h.model_fingerprint() != expected->fingerprint()) {
    return refuse(Rejected(h.task_id(), fl::v1::ERROR_CODE_FINGERPRINT_MISMATCH,
                           fl::StrCat("update is for model ", core::FingerprintToHex(h.model_fingerprint()),
                                      " but the server's model is ",
                                      expected ? expected->FingerprintHex() : std::string("(none)"))));
  }
  const uint64_t want_bytes = codec->EncodedSize(expected->num_elements());
  if (h.payload_bytes() != want_bytes) {
    return refuse(Rejected(h.task_id(),
                           h.payload_bytes() > want_bytes ? fl::v1::ERROR_CODE_TOO_LARGE : fl::v1::ERROR_CODE_MALFORMED,
                           fl::StrCat("update announces ", h.payload_bytes(), " payload bytes but a ", codec->name(),
                                      " payload of this model is exactly ", want_bytes, " bytes")));
  }
  if (h.kind() == fl::v1::UPDATE_KIND_INITIAL_MODEL) initial_model_upload_in_progress_ = true;
  if (train_task != nullptr) train_task->upload_in_flight = true;
  auto pending = std::make_unique<PendingUpload>();
  pending->event = std::move(e);
  waiting_uploads_.push_back(std::move(pending));
  GrantUploadSlots();
}

void RoundEngine::GrantUploadSlots() {
  while (busy_upload_slots_ < config_.upload_slots && !waiting_uploads_.empty()) {
    std::unique_ptr<PendingUpload> next = std::move(waiting_uploads_.front());
    waiting_uploads_.pop_front();
    const fl::v1::UpdateHeader& h = next->event.header;
    if (h.kind() != fl::v1::UPDATE_KIND_INITIAL_MODEL) {
      // A slot goes only to an update that can still count: one whose task closed while it waited is late now.
      auto t = tasks_.find(h.task_id());
      if (t == tasks_.end() || t->second->closed) {
        if (t != tasks_.end()) t->second->upload_in_flight = false;
        next->event.admit(Verdict(h.task_id(), fl::v1::UPDATE_OUTCOME_LATE,
                                  wire::MakeError(fl::v1::ERROR_CODE_LATE,
                                                  "the round closed while the upload waited for a slot")),
                          {});
        continue;
      }
    }
    ++busy_upload_slots_;
    std::vector<uint8_t> buffer;
    if (!free_upload_buffers_.empty()) {
      buffer = std::move(free_upload_buffers_.back());
      free_upload_buffers_.pop_back();
    }
    if (next->event.handle != nullptr) {
      active_uploads_.push_back({next->event.handle, h.client_id(), h.task_id(), NowNs(), false});
    }
    next->event.admit(std::nullopt, std::move(buffer));
  }
}

void RoundEngine::RevokeSlowUploads(int64_t now) {
  for (ActiveUpload& up : active_uploads_) {
    if (up.revoked) continue;
    const int64_t last = std::max(up.granted_ns, up.handle->last_message_ns());
    const int64_t held_ns = now - up.granted_ns;
    const uint64_t bytes = up.handle->bytes_received();
    grpc::Status status;
    if (config_.upload_message_timeout_ms != 0 &&
        now - last > int64_t{config_.upload_message_timeout_ms} * kMsToNs) {
      status = wire::ToGrpcStatus(
          grpc::StatusCode::DEADLINE_EXCEEDED,
          wire::MakeError(fl::v1::ERROR_CODE_RATE_LIMITED,
                          fl::StrCat("the upload of client '", up.client_id, "' for task '", up.task_id,
                                     "' sent no message for ", (now - last) / kMsToNs, " ms (limit ",
                                     config_.upload_message_timeout_ms,
                                     " ms, --upload-message-timeout-ms): its upload slot goes to the next client"),
                          "", "a stalled upload can be sent again while the round is open"));
    } else if (config_.upload_min_bytes_per_s != 0 && held_ns > int64_t{config_.upload_rate_grace_ms} * kMsToNs &&
               static_cast<double>(bytes) < static_cast<double>(config_.upload_min_bytes_per_s) * held_ns * 1e-9) {
      const double rate = static_cast<double>(bytes) / (static_cast<double>(held_ns) * 1e-9);
      status = wire::ToGrpcStatus(
          grpc::StatusCode::RESOURCE_EXHAUSTED,
          wire::MakeError(fl::v1::ERROR_CODE_RATE_LIMITED,
                          absl::StrFormat("the upload of client '%s' for task '%s' averaged %.0f bytes/s over %.1f s, "
                                          "below the minimum rate of %u bytes/s (--upload-min-bytes-per-s): its "
                                          "upload slot goes to the next client",
                                          up.client_id, up.task_id, rate, static_cast<double>(held_ns) * 1e-9,
                                          config_.upload_min_bytes_per_s),
                          "", "a faster link, a smaller model or a more compact --uplink-codec would help"));
    } else {
      continue;
    }
    spdlog::warn("revoking an upload slot: {}", status.error_message());
    up.revoked = true;
    up.handle->Revoke(status);  // the reactor answers with an UploadDoneEvent that frees the slot
  }
}

void RoundEngine::HandleUploadDone(UploadDoneEvent& e) {
  // The slot is given back only once the payload is consumed and freed (end of this function): a slot is a
  // model-sized buffer, and the server's peak memory is bounded by the number of slots, not of clients.
  struct SlotRelease {
    RoundEngine* engine;
    std::vector<uint8_t>* payload;
    ~SlotRelease() {
      // Buffers are kept for the next uploads (at most one per slot): no fresh model-sized allocation, and
      // no page faults, per update.
      payload->clear();
      if (engine->free_upload_buffers_.size() < engine->config_.upload_slots) {
        engine->free_upload_buffers_.push_back(std::move(*payload));
      } else {
        std::vector<uint8_t>().swap(*payload);
      }
      if (engine->busy_upload_slots_ > 0) --engine->busy_upload_slots_;
      engine->GrantUploadSlots();
    }
  } release{this, &e.payload};
  const fl::v1::UpdateHeader& h = e.header;
  std::erase_if(active_uploads_, [&](const ActiveUpload& up) { return up.handle == e.handle; });
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
      absl::Status s = codec.ok() ? (*codec)->Decode(e.payload, values) : codec.status();
      if (s.ok()) s = core::CheckFinite(values, "initial model", pending_spec_.get());
      if (s.ok()) s = AdoptModel(*pending_spec_, pending_model_name_, std::move(values), 0);
      if (s.ok()) s = WriteInitialCheckpoint();
      if (s.ok()) {
        state_ = EngineState::kWaitingForClients;
        verdict = Verdict("", fl::v1::UPDATE_OUTCOME_ACCEPTED);
        spdlog::info("initial model ({} tensors, {} parameters, fingerprint {}) from client '{}'",
                     spec_->num_tensors(), spec_->num_elements(), spec_->FingerprintHex(), h.client_id());
      } else {
        verdict = Rejected("", fl::v1::ERROR_CODE_MALFORMED, std::string(fl::ToStd(s.message())));
      }
    }
  } else {
    auto t = tasks_.find(h.task_id());
    if (t == tasks_.end()) {
      verdict = Rejected(h.task_id(), fl::v1::ERROR_CODE_WRONG_ROUND, "the task is no longer known");
    } else {
      verdict = AcceptUpdate(e, t->second.get());
      t->second->answered = true;  // a later upload for this task is a duplicate
      if (t->second->outcome == "ok" || t->second->outcome == "late") {
        uplink_reports_due_[t->second->id] = t->second->round;  // the client reports its uplink after the ack
      }
    }
  }
  verdict.set_received_bytes(e.payload.size());
  verdict.set_first_byte_server_ns(e.first_byte_server_ns);
  verdict.set_acked_server_ns(NowNs());
  e.reply(verdict);
}

fl::v1::UploadUpdateResponse RoundEngine::AcceptUpdate(UploadDoneEvent& e, TaskInfo* task) {
  const fl::v1::UpdateHeader& h = e.header;
  instrumentation::ClientRoundRecord rec;
  rec.experiment_id = config_.experiment_id;
  rec.round = static_cast<int64_t>(task->round);
  rec.attempt = task->attempt;
  rec.client_id = task->client_id;
  rec.dispatched_unix_ms = task->dispatched_unix_ms;
  FillServerDownlink(*task, rec);
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
  if (auto c = clients_.find(task->client_id); c != clients_.end()) {
    if (auto est = c->second->clock.Estimate(); est.has_value()) {
      rec.clock_offset_ms = static_cast<double>(est->offset_ns) / 1e6;
      rec.clock_rtt_ms = static_cast<double>(est->rtt_ns) / 1e6;
    }
    rec.downlink_start_unix_ms = PlacePhaseStart(*c->second, h.timings(), fl::v1::PHASE_DOWNLINK);
    rec.train_start_unix_ms = PlacePhaseStart(*c->second, h.timings(), fl::v1::PHASE_TRAIN);
    rec.eval_start_unix_ms = PlacePhaseStart(*c->second, h.timings(), fl::v1::PHASE_EVAL);
  }

  // Rows of a round are written after the round's own row (foreign keys), so they wait in the round state;
  // an update for a round already closed was recorded with the outcome it had at closing.
  auto finish = [&](instrumentation::ClientOutcome outcome, fl::v1::UploadUpdateResponse verdict) {
    if (auto c = clients_.find(task->client_id); c != clients_.end() && c->second->open_task == task->id) {
      c->second->open_task.clear();
    }
    const bool in_current = current_ != nullptr && !current_->evaluation && current_->round == task->round &&
                            current_->attempt == task->attempt && !task->closed;
    task->closed = true;
    task->outcome = std::string(instrumentation::ClientOutcomeName(outcome));
    if (in_current) {
      rec.outcome = outcome;
      if (outcome == instrumentation::ClientOutcome::kRejected) rec.reject_reason = verdict.error().message();
      if (outcome == instrumentation::ClientOutcome::kOk) ++current_->accepted;
      if (outcome == instrumentation::ClientOutcome::kLate) ++current_->late;
      if (outcome == instrumentation::ClientOutcome::kRejected) {
        ++current_->rejected;
      }
      if (metrics_ != nullptr) {
        const std::string_view reason =
            outcome == instrumentation::ClientOutcome::kRejected ? ReasonName(verdict.error().code()) : "";
        metrics_->CountUpdate(instrumentation::ClientOutcomeName(outcome), reason);
        if (outcome == instrumentation::ClientOutcome::kOk) {
          const auto& join = clients_.at(task->client_id)->join;
          const std::string link = std::string(wire::LinkKindName(join.link().kind()));
          const std::string& device = join.device().device_class();
          auto phase = [&](std::string_view name, const std::optional<double>& ms) {
            if (ms.has_value()) metrics_->ObservePhase(name, link, device, task->client_id, *ms / 1000.0);
          };
          phase("downlink", rec.downlink_ms);
          phase("train", rec.train_ms);
          phase("eval", rec.eval_ms);
          phase("idle", rec.idle_ms);
          phase("uplink", rec.uplink_server_ms);
          metrics_->AddBytes("down", link, static_cast<uint64_t>(rec.downlink_bytes.value_or(0)));
          metrics_->AddBytes("up", link, static_cast<uint64_t>(rec.uplink_bytes.value_or(0)));
        }
      }
      current_->client_rows.push_back(std::move(rec));
    }
    return verdict;
  };

  if (task->closed) {
    return finish(instrumentation::ClientOutcome::kLate, Verdict(task->id, fl::v1::UPDATE_OUTCOME_LATE,
                                  wire::MakeError(fl::v1::ERROR_CODE_LATE, "the round closed before the update arrived")));
  }
  if (e.done_server_ns > task->deadline_ns) {
    return finish(instrumentation::ClientOutcome::kLate, Verdict(task->id, fl::v1::UPDATE_OUTCOME_LATE,
                                  wire::MakeError(fl::v1::ERROR_CODE_LATE,
                                                  fl::StrCat("the update finished arriving ",
                                                             (e.done_server_ns - task->deadline_ns) / kMsToNs,
                                                             " ms after the deadline"))));
  }
  if (current_ == nullptr || current_->evaluation || current_->round != task->round ||
      current_->attempt != task->attempt) {
    return finish(instrumentation::ClientOutcome::kLate, Verdict(task->id, fl::v1::UPDATE_OUTCOME_LATE,
                                  wire::MakeError(fl::v1::ERROR_CODE_LATE, "the round is over")));
  }
  // The phases, placed on the server's clock, must lie between the dispatch and the update's arrival: a
  // client cannot put its training decades away (or before the task existed) in the records.
  if (auto c = clients_.find(task->client_id); c != clients_.end()) {
    if (std::string w = PhaseWindowProblem(*c->second, h.timings(), task->dispatched_ns, e.done_server_ns);
        !w.empty()) {
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
  const std::string source = fl::StrCat("update from client '", task->client_id, "' for round ", task->round);
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
  const double weight = static_cast<double>(h.num_examples());
  if (h.kind() == fl::v1::UPDATE_KIND_DELTA) {
    // The common path: the payload is the pseudo-gradient itself, decoded straight into the aggregator's
    // own buffer (no extra model-sized copy on the server).
    if (absl::Status s = current_->aggregator->AddEncoded(*uplink_codec_, e.payload, weight, h.model_fingerprint(),
                                                          source);
        !s.ok()) {
      return reject(s);
    }
  } else {
    // Weights: the aggregate is taken over pseudo-gradients theta_global - theta_client.
    scratch_.resize(spec_->num_elements());
    absl::Status s = uplink_codec_->Decode(e.payload, scratch_);
    if (s.ok()) s = core::CheckFinite(scratch_, source, spec_.get());
    if (!s.ok()) return reject(s);
    for (size_t i = 0; i < scratch_.size(); ++i) scratch_[i] = global_[i] - scratch_[i];
    if (s = current_->aggregator->Add(scratch_, weight, h.model_fingerprint(), source); !s.ok()) return reject(s);
  }
  if (rec.train_loss.has_value()) {
    current_->train_loss_sum += *rec.train_loss * static_cast<double>(h.num_examples());
    current_->train_loss_weight += static_cast<double>(h.num_examples());
  }
  return finish(instrumentation::ClientOutcome::kOk, Verdict(task->id, fl::v1::UPDATE_OUTCOME_ACCEPTED));
}

UpdateBounds RoundEngine::UpdateReportBounds(const ClientInfo& client, const TaskInfo& task, int64_t now_ns) const {
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
  b.max_steps = config_.train.local_steps() > 0 ? config_.train.local_steps()
                                                : epochs * ((b.max_examples + batch - 1) / batch);
  b.max_phase_ns = PhaseBoundNs(task.dispatched_ns, now_ns);
  // A phase moves at most the model's download (the only transfer reported in the header), with headroom
  // for framing; 1 MiB when there is no model yet.
  const uint64_t model_bytes = payload_ != nullptr ? payload_->bytes.size() : 0;
  b.max_phase_bytes = 2 * model_bytes + (uint64_t{1} << 20);
  return b;
}

std::string RoundEngine::PhaseWindowProblem(const ClientInfo& client,
                                            const google::protobuf::RepeatedPtrField<fl::v1::PhaseTiming>& timings,
                                            int64_t from_ns, int64_t to_ns) const {
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

void RoundEngine::RejectAtHeader(TaskInfo& task, const fl::v1::UploadUpdateResponse& verdict) {
  if (task.closed) return;
  task.closed = true;
  task.outcome = "rejected";
  if (auto c = clients_.find(task.client_id); c != clients_.end() && c->second->open_task == task.id) {
    c->second->open_task.clear();
  }
  spdlog::warn("rejected the update of client '{}' for round {}: {}", task.client_id, task.round,
               verdict.error().message());
  if (current_ == nullptr || current_->evaluation || current_->round != task.round ||
      current_->attempt != task.attempt) {
    return;
  }
  ++current_->rejected;
  if (metrics_ != nullptr) metrics_->CountUpdate("rejected", ReasonName(verdict.error().code()));
  // Only what the server measured: none of the refused report's numbers reach the records.
  instrumentation::ClientRoundRecord rec;
  rec.experiment_id = config_.experiment_id;
  rec.round = static_cast<int64_t>(task.round);
  rec.attempt = task.attempt;
  rec.client_id = task.client_id;
  rec.dispatched_unix_ms = task.dispatched_unix_ms;
  FillServerDownlink(task, rec);
  rec.outcome = instrumentation::ClientOutcome::kRejected;
  rec.reject_reason = verdict.error().message();
  current_->client_rows.push_back(std::move(rec));
}

void RoundEngine::AbandonInitialModelHolder(const std::string& holder_id, const std::string& next_client,
                                            std::string_view why) {
  const std::string reason =
      fl::StrCat("asked for the initial model ", (NowNs() - initial_model_asked_ns_) / kMsToNs,
                 " ms ago, ", why, "; client '", next_client, "' is asked instead");
  spdlog::warn("client '{}' was {}", holder_id, reason);
  auto holder = clients_.find(holder_id);
  if (holder == clients_.end()) return;
  DisconnectClient(*holder->second, fl::StrCat("this client was ", reason));
  Record(instrumentation::ClientLeftRecord{config_.experiment_id, holder_id, UnixMs(), reason});
}

void RoundEngine::ReaskInitialModelIfStalled(int64_t now) {
  if (initial_model_client_.empty() || initial_model_upload_in_progress_) return;
  auto holder = clients_.find(initial_model_client_);
  const bool connected = holder != clients_.end() && holder->second->session != nullptr;
  const int64_t asked_ago = now - initial_model_asked_ns_;
  const int64_t deadline = int64_t{config_.initial_model_deadline_ms} * kMsToNs;
  // A holder that went away gets the same grace as at Join (30 s to upload before opening its session).
  if (asked_ago < deadline && (connected || asked_ago < std::min<int64_t>(deadline, int64_t{30'000} * kMsToNs))) {
    return;
  }
  // Another connected client, in name order: it joined while the holder was asked, so it trains the holder's
  // model (Join compared them) and can provide the weights.
  ClientInfo* next = nullptr;
  for (auto& [id, c] : clients_) {
    if (id != initial_model_client_ && c->session != nullptr) {
      next = c.get();
      break;
    }
  }
  if (next == nullptr) return;  // none: the next client to join is asked (HandleJoin)
  AbandonInitialModelHolder(initial_model_client_, next->id,
                            asked_ago >= deadline ? fl::StrCat("it has not uploaded it within "
                                                               "--initial-model-deadline-ms=",
                                                               config_.initial_model_deadline_ms)
                                                  : std::string("its session ended without the upload"));
  // pending_spec_ stays: the next client's model equals it (Join compared them); its Join sets it again.
  initial_model_client_ = next->id;
  initial_model_asked_ns_ = now;
  // The protocol asks for the initial model only in a Join answer: the session is closed with the reason,
  // fl-client joins again at once, and that Join asks it (it is the holder now).
  spdlog::info("asking client '{}' for the initial model (it joins again to receive the request)", next->id);
  DisconnectClient(*next, "the server asks this client for the initial model: join again to receive the request");
}

void RoundEngine::HandleLeave(LeaveEvent& e) {
  ClientInfo* client = Authenticate(e.request.client_id(), e.request.session_token());
  fl::v1::LeaveResponse resp;
  if (client == nullptr) {
    e.reply(grpc::Status::OK, resp);
    return;
  }
  resp.set_acknowledged(true);
  spdlog::info("client '{}' left: {}", client->id, LogSafe(e.request.reason(), 200));
  DisconnectClient(*client, fl::StrCat("the client left: ", LogSafe(e.request.reason(), 200)));
  client->token.clear();
  MarkTold(client->id);
  e.reply(grpc::Status::OK, resp);
}

void RoundEngine::HandleShutdown(const ShutdownEvent& e) {
  if (state_ == EngineState::kFinished) return;
  if (current_ != nullptr) {
    for (const std::string& id : current_->task_ids) {
      TaskInfo& task = *tasks_.at(id);
      if (task.closed) continue;
      task.closed = true;
      task.outcome = "dropped";
      if (auto c = clients_.find(task.client_id); c != clients_.end() && c->second->session) {
        fl::v1::ServerMessage cancel;
        cancel.set_seq(++c->second->server_seq);
        cancel.mutable_cancel()->set_task_id(task.id);
        cancel.mutable_cancel()->set_reason(e.reason);
        c->second->session->Send(std::move(cancel));
        c->second->open_task.clear();
      }
    }
    if (!current_->evaluation) {
      instrumentation::RoundRecord rec = RoundRow(*current_, instrumentation::RoundStatus::kAborted);
      rec.failure_reason = e.reason;
      Record(rec);
      for (auto& row : current_->client_rows) Record(std::move(row));
    }
    current_.reset();
  }
  Finish("aborted", e.reason);
}

void RoundEngine::CloseTaskAsDropped(TaskInfo& task, std::string_view why) {
  if (task.closed) return;
  // A task whose update had started arriving when it was closed is "late"; one that never sent is "dropped".
  const bool late = task.upload_started;
  task.closed = true;
  task.outcome = late ? "late" : "dropped";
  if (auto c = clients_.find(task.client_id); c != clients_.end() && c->second->open_task == task.id) {
    c->second->open_task.clear();
  }
  if (current_ != nullptr && current_->round == task.round && current_->attempt == task.attempt) {
    ++(late ? current_->late : current_->dropped);
    if (metrics_ != nullptr && task.kind == fl::v1::TASK_KIND_TRAIN) metrics_->CountUpdate(task.outcome, "");
  }
  spdlog::info("task {} of client '{}' {}: {}", task.id, task.client_id, task.outcome, why);
  if (current_ == nullptr || current_->evaluation || task.kind != fl::v1::TASK_KIND_TRAIN ||
      current_->round != task.round || current_->attempt != task.attempt) {
    return;
  }
  instrumentation::ClientRoundRecord rec;
  rec.experiment_id = config_.experiment_id;
  rec.round = static_cast<int64_t>(task.round);
  rec.attempt = task.attempt;
  rec.client_id = task.client_id;
  rec.dispatched_unix_ms = task.dispatched_unix_ms;
  FillServerDownlink(task, rec);
  rec.outcome = late ? instrumentation::ClientOutcome::kLate : instrumentation::ClientOutcome::kDropped;
  current_->client_rows.push_back(std::move(rec));
}

void RoundEngine::DisconnectClient(ClientInfo& client, std::string_view why) {
  if (client.session != nullptr) {
    client.session->Close(grpc::Status(grpc::StatusCode::CANCELLED, std::string(why)));
    client.session.reset();
    UpdateConnectedGauge();
  }
  if (!client.open_task.empty()) {
    auto t = tasks_.find(client.open_task);
    if (t != tasks_.end()) CloseTaskAsDropped(*t->second, why);
  }
}

std::vector<RoundEngine::ClientInfo*> RoundEngine::IdleConnectedClients() {
  std::vector<ClientInfo*> out;
  for (auto& [id, c] : clients_) {
    if (c->session != nullptr && c->open_task.empty()) out.push_back(c.get());
  }
  return out;
}

absl::Status RoundEngine::AdoptModel(core::ModelSpec spec, std::string model_name, std::vector<float> values,
                                     uint64_t model_version) {
  if (values.size() != spec.num_elements()) {
    return absl::InvalidArgumentError(fl::StrCat("model has ", values.size(), " values but its spec needs ",
                                                 spec.num_elements()));
  }
  spec_ = std::make_shared<const core::ModelSpec>(std::move(spec));
  config_.model_name = std::move(model_name);
  global_ = std::move(values);
  model_version_ = model_version;
  auto opt = core::MakeServerOptimizer(config_.optimizer, global_.size());
  if (!opt.ok()) return opt.status();
  optimizer_ = std::move(*opt);
  PublishPayload();
  return absl::OkStatus();
}

void RoundEngine::PublishPayload() {
  // Drop our reference to the previous version first: downloads still streaming it keep it alive, and when
  // none are (the usual case at a commit) its memory is reused for the new one.
  payload_.reset();
  auto payload = std::make_shared<ModelPayload>();
  payload->model_version = model_version_;
  payload->round = round_;
  payload->spec = wire::ToProto(*spec_, config_.model_name);
  payload->codec = std::string(downlink_codec_->name());
  if (absl::Status s = downlink_codec_->Encode(global_, &payload->bytes); !s.ok()) {
    // The global model is finite by construction (every input is checked); failing here is a bug.
    spdlog::critical("cannot encode the global model: {}", s.message());
    std::abort();
  }
  payload->checksum = core::Checksum64(payload->bytes);
  payload_ = std::move(payload);
}

absl::StatusOr<std::optional<instrumentation::CheckpointRecord>> RoundEngine::WriteCheckpointFile() {
  if (config_.checkpoint_dir.empty()) return std::nullopt;
  Checkpoint ckpt;
  ckpt.experiment_id = config_.experiment_id;
  ckpt.round = round_;
  ckpt.model_version = model_version_;
  ckpt.spec = *spec_;
  ckpt.model_name = config_.model_name;
  ckpt.values = global_;
  ckpt.optimizer = optimizer_->ExportState();
  ckpt.created_unix_ms = UnixMs();
  if (task_.has_value()) ckpt.task = std::string(core::TaskName(*task_));
  const std::string path = CheckpointPath(config_.checkpoint_dir, round_);
  if (absl::Status s = SaveCheckpoint(ckpt, path); !s.ok()) return s;
  instrumentation::CheckpointRecord rec;
  rec.experiment_id = config_.experiment_id;
  rec.round = static_cast<int64_t>(round_);
  rec.model_version = static_cast<int64_t>(model_version_);
  rec.path = path;
  std::error_code ec;
  rec.bytes = static_cast<int64_t>(std::filesystem::file_size(path, ec));
  rec.fingerprint = spec_->FingerprintHex();
  rec.created_unix_ms = ckpt.created_unix_ms;
  return rec;
}

absl::Status RoundEngine::WriteInitialCheckpoint() {
  auto row = WriteCheckpointFile();
  if (!row.ok()) return row.status();
  if (row->has_value()) Record(**std::move(row));
  return absl::OkStatus();
}

void RoundEngine::PruneOldCheckpoints() {
  if (config_.checkpoint_dir.empty() || round_ + 1 <= config_.keep_checkpoints) return;
  // A file that stays behind costs disk space only; the experiment goes on.
  if (absl::Status s = PruneCheckpoints(config_.checkpoint_dir, round_ + 1 - config_.keep_checkpoints); !s.ok()) {
    spdlog::warn("{}", s.message());
  }
}

absl::Status RoundEngine::StoreCommit(instrumentation::Record record) {
  if (records_ == nullptr) return absl::OkStatus();
  // Errors of records enqueued since the last commit (a client's row, an uplink report) come first: the
  // database failed for them as well, and the commit's rows may reference them.
  absl::Status earlier = records_->Flush();
  if (absl::Status s = records_->Enqueue(std::move(record)); !s.ok()) return s;
  absl::Status s = records_->Flush();
  if (!earlier.ok()) return earlier;
  return s;
}

void RoundEngine::MaybeKillForTest(std::string_view step, uint64_t round) const {
  // Read on every call (a handful per round): tests set it in the child's environment only.
  const char* at = std::getenv("FL_SERVER_TEST_KILL_AT");
  if (at == nullptr || fl::StrCat(step, ":", round) != at) return;
  spdlog::warn("FL_SERVER_TEST_KILL_AT={}: killing fl-server (test hook)", at);
  spdlog::default_logger()->flush();
  std::raise(SIGKILL);
}

void RoundEngine::Advance() {
  if (state_ == EngineState::kFinished) return;
  const int64_t now = NowNs();
  // Liveness: a client that has said nothing for four heartbeat intervals is gone, even if TCP has not
  // noticed yet (a Pi that lost its 5G link keeps the socket half-open for minutes).
  for (auto& [id, c] : clients_) {
    if (c->session != nullptr && now - c->last_seen_ns > 4 * int64_t{config_.heartbeat_interval_ms} * kMsToNs) {
      spdlog::warn("client '{}' missed its heartbeats; disconnecting it", id);
      DisconnectClient(*c, "no heartbeat for four intervals");
    }
  }
  RevokeSlowUploads(now);
  switch (state_) {
    case EngineState::kWaitingForModel:
      ReaskInitialModelIfStalled(now);
      return;
    case EngineState::kWaitingForClients:
      if (evaluation_due_) {
        // Resumed after a crash during round_'s evaluation: redo it with as many clients as a round waits for.
        if (IdleConnectedClients().size() < std::max<uint32_t>(1, config_.fit.min_available)) return;
        evaluation_due_ = false;
        spdlog::info("redoing the evaluation of round {} (interrupted before its results were recorded)", round_);
        StartEvaluation();
        if (state_ == EngineState::kEvaluating) return;
      }
      if (round_ >= config_.num_rounds) {
        // The last round's clients report their uplink time only after our ack: give them a moment, so that
        // the final round's records are as complete as the others'.
        std::erase_if(uplink_reports_due_, [&](const auto& due) {
          auto t = tasks_.find(due.first);
          if (t == tasks_.end()) return true;
          auto c = clients_.find(t->second->client_id);
          return c == clients_.end() || c->second->session == nullptr;
        });
        if (!uplink_reports_due_.empty()) {
          if (drain_deadline_ns_ == 0) drain_deadline_ns_ = now + kUplinkReportGraceNs;
          if (now < drain_deadline_ns_) return;
        }
        Finish("finished", fl::StrCat("all ", config_.num_rounds, " rounds committed"));
        return;
      }
      StartRound();
      return;
    case EngineState::kCollecting:
    case EngineState::kEvaluating: {
      bool all_closed = true;
      for (const std::string& id : current_->task_ids) all_closed &= tasks_.at(id)->closed;
      if (all_closed || now >= current_->deadline_ns) {
        if (state_ == EngineState::kCollecting) {
          CloseRound();
        } else {
          CloseEvaluation();
        }
        if (state_ == EngineState::kWaitingForClients) Advance();
      }
      return;
    }
    case EngineState::kFinished:
      return;
  }
}

void RoundEngine::StartRound() {
  // Reports still due from rounds before the last committed one will not come any more.
  std::erase_if(uplink_reports_due_, [&](const auto& due) { return due.second < round_; });
  std::vector<ClientInfo*> idle = IdleConnectedClients();
  auto size = SelectionSize(config_.fit, static_cast<uint32_t>(idle.size()));
  if (!size.ok()) return;  // keep waiting for clients
  std::vector<std::string> ids;
  for (ClientInfo* c : idle) ids.push_back(c->id);
  const uint64_t round = round_ + 1;
  std::vector<std::string> selected = SelectClients(ids, *size, config_.seed, round, attempt_);

  current_ = std::make_unique<RoundState>();
  current_->round = round;
  current_->attempt = attempt_;
  current_->started_ns = NowNs();
  current_->started_unix_ms = UnixMs();
  current_->deadline_ns = current_->started_ns + int64_t{config_.round_deadline_ms} * kMsToNs;
  auto agg = core::MakeAggregator(config_.aggregator, spec_);
  current_->aggregator = std::move(*agg);  // validated in Start()
  // Norm bounding of the updates (--clip-update-norm, or the strategy's default; validated in Start()).
  if (absl::Status s = current_->aggregator->SetNormClip(*config_.UpdateNormClip()); !s.ok()) {
    spdlog::error("--clip-update-norm: {}", s.message());
  }

  for (const std::string& id : selected) {
    fl::v1::Task t;
    t.set_task_id(fl::StrCat("r", round, ".", attempt_, "-", id, "-", ++task_counter_));
    t.set_kind(fl::v1::TASK_KIND_TRAIN);
    t.set_round(round);
    *t.mutable_train() = config_.train;
    t.mutable_train()->set_seed(config_.seed ^ (round * 0x9E3779B97F4A7C15ULL) ^ std::hash<std::string>{}(id));
    t.set_deadline_ms(config_.round_deadline_ms);
    t.set_uplink_codec(config_.uplink_codec);
    Dispatch(*clients_.at(id), std::move(t), attempt_);
  }
  state_ = EngineState::kCollecting;
  spdlog::info("round {} (attempt {}): {} of {} idle clients selected", round, attempt_, selected.size(),
               idle.size());
}

void RoundEngine::Dispatch(ClientInfo& client, fl::v1::Task task, uint32_t attempt) {
  auto info = std::make_unique<TaskInfo>();
  info->id = task.task_id();
  info->client_id = client.id;
  info->kind = task.kind();
  info->round = task.round();
  info->attempt = attempt;
  info->dispatched_ns = current_->started_ns;
  info->dispatched_unix_ms = current_->started_unix_ms;
  info->deadline_ns = current_->deadline_ns;
  task.set_model_version(model_version_);
  task.set_model_fingerprint(spec_->fingerprint());
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

instrumentation::RoundRecord RoundEngine::RoundRow(const RoundState& r, instrumentation::RoundStatus status) const {
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

void RoundEngine::CloseRound() {
  RoundState& r = *current_;
  for (const std::string& id : r.task_ids) CloseTaskAsDropped(*tasks_.at(id), "no update by the round's deadline");

  if (r.accepted < config_.fit.min_clients) {
    instrumentation::RoundRecord rec = RoundRow(r, instrumentation::RoundStatus::kFailed);
    rec.failure_reason = fl::StrCat(r.accepted, " update(s) accepted by the deadline; the round needs ",
                                    config_.fit.min_clients, " (", r.late, " late, ", r.rejected, " rejected, ",
                                    r.dropped, " dropped)");
    spdlog::warn("round {} attempt {} failed: {}", r.round, r.attempt, rec.failure_reason);
    const std::string reason = rec.failure_reason;
    Record(std::move(rec));
    for (auto& row : r.client_rows) Record(std::move(row));
    current_.reset();
    if (attempt_ >= config_.max_round_attempts) {
      Finish("failed", fl::StrCat("round ", round_ + 1, " failed ", attempt_, " times; last: ", reason));
      return;
    }
    ++attempt_;
    state_ = EngineState::kWaitingForClients;
    return;
  }

  // Peak memory is at the commit: give back what the next round can rebuild cheaply (the receive buffers,
  // once per round, not per update) before the aggregate and the new download payload are materialised.
  std::vector<std::vector<uint8_t>>().swap(free_upload_buffers_);
  const int64_t agg_start = NowNs();
  auto pseudo_grad = r.aggregator->Finish();
  if (r.aggregator->num_clipped() > 0) {
    spdlog::info("round {}: {} of {} updates scaled down to the update norm bound ({})", r.round,
                 r.aggregator->num_clipped(), r.aggregator->num_updates(), r.aggregator->norm_clip().ToString());
  }
  // Integer tensors (BatchNorm's num_batches_tracked, ...) are client-local state, never averaged as floats:
  // whatever the aggregator and the server optimizer made of them, they keep the previous global's values.
  absl::StatusOr<std::vector<float>> integer_values = core::SaveIntegerTensors(*spec_, global_);
  absl::Status step = !pseudo_grad.ok()      ? pseudo_grad.status()
                      : !integer_values.ok() ? integer_values.status()
                                             : optimizer_->Step(global_, *pseudo_grad);
  if (step.ok()) step = core::RestoreIntegerTensors(*spec_, *integer_values, global_);
  if (!step.ok()) {
    // Inputs were validated one by one; an optimizer failure means the aggregate itself overflowed.
    Finish("failed", fl::StrCat("round ", r.round, ": the server optimizer step failed: ", fl::ToStd(step.message())));
    return;
  }
  round_ = r.round;
  committed_attempt_ = r.attempt;
  ++model_version_;
  PublishPayload();
  const double aggregation_ms = static_cast<double>(NowNs() - agg_start) / 1e6;
  // Commit order: checkpoint file first, then the round's records (its row, its client rows and the
  // checkpoint's row) as one atomic unit. A round is committed when, and only when, those records are
  // stored: --resume trusts them and loads that round's checkpoint, so a crash before they land re-runs the
  // round (from the previous checkpoint, which is pruned only after the commit) instead of losing or
  // doubling it.
  auto checkpoint_row = WriteCheckpointFile();
  if (!checkpoint_row.ok()) {
    round_ = r.round - 1;
    --model_version_;
    Finish("failed", fl::StrCat("cannot checkpoint round ", r.round, ": ", fl::ToStd(checkpoint_row.status().message()),
                                "; rounds up to ", round_, " are committed: run again with --resume once the "
                                "checkpoint directory is writable"));
    return;
  }
  MaybeKillForTest("checkpoint-written", r.round);
  instrumentation::RoundRecord rec = RoundRow(r, instrumentation::RoundStatus::kCommitted);
  rec.aggregation_ms = aggregation_ms;
  rec.model_version = static_cast<int64_t>(model_version_);
  last_round_summary_ = {r.round, r.accepted, rec.train_loss, rec.duration_ms};
  const std::optional<double> train_loss = rec.train_loss;
  const double duration_ms = rec.duration_ms;
  instrumentation::RoundCommitRecord commit;
  commit.round = std::move(rec);
  commit.client_rounds = r.client_rows;
  commit.checkpoint = *std::move(checkpoint_row);
  if (absl::Status s = StoreCommit(std::move(commit)); !s.ok()) {
    round_ = r.round - 1;
    --model_version_;
    Finish("failed", fl::StrCat("round ", r.round, " was not committed: its records could not be stored: ",
                                fl::ToStd(s.message()), ". The experiment stopped; rounds up to ", round_,
                                " are committed in the records. Fix the records database (disk space, "
                                "permissions, I/O errors) and run fl-server again with --resume"));
    return;
  }
  MaybeKillForTest("records-committed", r.round);
  PruneOldCheckpoints();
  if (metrics_ != nullptr) {
    metrics_->ObserveRound(duration_ms / 1000.0);
    metrics_->ObserveAggregation(aggregation_ms / 1000.0);
    metrics_->SetCurrentRound(r.round);
    metrics_->CountStraggler(r.client_rows);
    if (train_loss.has_value()) metrics_->SetTrainLoss(*train_loss);
  }
  current_.reset();
  auto first = first_attempts_.find(round_ + 1);
  attempt_ = first == first_attempts_.end() ? 1 : first->second;
  spdlog::info("round {} committed: {} accepted, aggregation {:.1f} ms, round {:.0f} ms", round_,
               last_round_summary_.accepted, aggregation_ms, last_round_summary_.duration_ms);
  const bool evaluate = config_.evaluate_every > 0 && config_.fraction_evaluate > 0 &&
                        (round_ % config_.evaluate_every == 0 || round_ == config_.num_rounds);
  if (evaluate) {
    StartEvaluation();
    if (state_ == EngineState::kEvaluating) return;
  }
  PrintRoundRow(std::nullopt);
  state_ = EngineState::kWaitingForClients;
}

void RoundEngine::StartEvaluation() {
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
    Dispatch(*clients_.at(id), std::move(t), committed_attempt_);
  }
  state_ = EngineState::kEvaluating;
  MaybeKillForTest("evaluation-started", round_);
}

void RoundEngine::CloseEvaluation() {
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
    current_.reset();
    Finish("failed", fl::StrCat("the evaluation of round ", round_, " could not be stored: ", fl::ToStd(s.message()),
                                ". The experiment stopped; rounds up to ", round_, " are committed in the records. "
                                "Fix the records database and run fl-server again with --resume (it redoes this "
                                "evaluation)"));
    return;
  }
  MaybeKillForTest("evaluation-committed", round_);
  if (figures.has_value() && metrics_ != nullptr) metrics_->SetEvaluation(*figures);
  current_.reset();
  PrintRoundRow(figures);
  state_ = EngineState::kWaitingForClients;
  // Forget tasks of rounds before this one: a straggler's upload for them is refused as unknown.
  for (auto it = tasks_.begin(); it != tasks_.end();) {
    it = (it->second->closed && it->second->round + 1 < round_) ? tasks_.erase(it) : std::next(it);
  }
}

void RoundEngine::PrintRoundRow(const std::optional<instrumentation::ServerMetrics::Evaluation>& eval) {
  // The per-round table a person watches in the terminal; the records database has everything else. Its
  // metric column is the task's: accuracy, MAE or perplexity (the task is known: a round needs a client).
  const core::Task kind = task_.value_or(core::Task::kClassification);
  if (!printed_table_header_) {
    const char* metric = kind == core::Task::kRegression  ? "test_mae"
                         : kind == core::Task::kNextToken ? "test_ppl"
                                                          : "test_acc";
    std::printf("%6s %8s %11s %10s %10s %12s\n", "round", "clients", "train_loss", "test_loss", metric,
                "round_time_s");
    printed_table_header_ = true;
  }
  const auto& s = last_round_summary_;
  std::optional<double> metric;
  if (eval.has_value()) {
    metric = kind == core::Task::kRegression  ? eval->mae
             : kind == core::Task::kNextToken ? eval->perplexity
                                              : eval->accuracy;
  }
  std::string train_loss = s.train_loss ? absl::StrFormat("%.4f", *s.train_loss) : "-";
  std::string test_loss = eval ? absl::StrFormat("%.4f", eval->loss) : "-";
  std::string test_metric = metric ? absl::StrFormat("%.4f", *metric) : "-";
  std::printf("%6llu %8u %11s %10s %10s %12.2f\n", static_cast<unsigned long long>(s.round), s.accepted,
              train_loss.c_str(), test_loss.c_str(), test_metric.c_str(), s.duration_ms / 1000.0);
  std::fflush(stdout);
}

void RoundEngine::Finish(std::string status, std::string reason) {
  if (state_ == EngineState::kFinished) return;
  state_ = EngineState::kFinished;
  const bool finished = status == "finished";
  if (status != "aborted") NoteUntoldClients();  // before the sessions below are told and let go
  for (auto& [id, c] : clients_) {
    if (c->session == nullptr) continue;
    fl::v1::ServerMessage bye;
    bye.set_seq(++c->server_seq);
    bye.mutable_shutdown()->set_reason(reason);
    bye.mutable_shutdown()->set_experiment_finished(finished);
    c->session->Send(std::move(bye));
    c->session->Close(grpc::Status::OK);
    c->session.reset();
  }
  while (!waiting_uploads_.empty()) {
    waiting_uploads_.front()->event.admit(
        Rejected(waiting_uploads_.front()->event.header.task_id(), fl::v1::ERROR_CODE_SHUTTING_DOWN,
                 "the experiment has ended"),
        {});
    waiting_uploads_.pop_front();
  }
  if (records_ != nullptr) {
    instrumentation::ExperimentStatusUpdate update;
    update.experiment_id = config_.experiment_id;
    auto parsed = instrumentation::ParseExperimentStatus(status);
    update.status = parsed.ok() ? *parsed : instrumentation::ExperimentStatus::kFailed;
    update.status_reason = reason;
    update.finished_unix_ms = UnixMs();
    Record(update);
    if (absl::Status s = records_->Flush(); !s.ok()) {
      spdlog::error("records: {}", s.message());
      if (finished) {
        status = "failed";
        reason = fl::StrCat("records: ", fl::ToStd(s.message()));
      }
    }
  }
  spdlog::info("experiment {} {}: {}", config_.experiment_id, status, reason);
  std::lock_guard lock(mu_);
  result_ = EngineResult{config_.experiment_id, status, reason, round_};
  done_ = true;
  cv_.notify_all();
}

void RoundEngine::NoteUntoldClients() {
  // Clients with a live session are told by the Shutdown message; those that left need nothing. The others
  // (disconnected for missed heartbeats, stopped, cut off) learn it at their next Join or hello.
  untold_.clear();
  for (const auto& [id, c] : clients_) {
    if (c->session == nullptr && !c->token.empty()) untold_.insert(id);
  }
  untold_count_ = untold_.size();
  if (!untold_.empty()) {
    spdlog::info("{} client(s) were away at the end of the experiment and have not been told yet", untold_.size());
  }
}

void RoundEngine::MarkTold(const std::string& client_id) {
  if (untold_.erase(client_id) != 0) untold_count_ = untold_.size();
}

}  // namespace fl::server
