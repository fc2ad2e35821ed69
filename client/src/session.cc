// fl-client's session: FederatedClient::Impl's Run (join, reconnect with backoff, the initial model), the session
// stream (tasks, heartbeats, clock pings, cancels, shutdown), the worker that runs tasks (download, train or
// evaluate, encode the update, upload, report) and the public FederatedClient. The download and upload calls
// themselves are in session_transfer.cc, the class shared by both files in session_impl.h.
#include "fl/client/session.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <chrono>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <thread>
#include <utility>

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include "fl/client/secure_update.h"
#include "fl/client/update_privacy.h"
#include "fl/client/uplink_encoder.h"
#include "fl/core/log_format.h"

#include "fl/core/codec.h"
#include "fl/core/str_cat.h"
#include "fl/core/task.h"
#include "fl/privacy/noise_rng.h"
#include "fl/proto/convert.h"
#include "fl/v1/federation.grpc.pb.h"
#include "session_impl.h"

namespace fl::client {
namespace {

// Uploads carry no codec body checksum (PROTOCOL_VERSION_3): the upload's trailer has the XXH3-64 of the whole
// payload, which fl-server checks before decoding, so computing Checksum64 too would be a second pass for nothing.
constexpr core::EncodeOptions kUploadEncoding{.body_checksum = false};

// A refusal that a retry cannot fix: the operator has to change something.
bool IsFatalRefusal(const fl::v1::ErrorDetail& e) {
  switch (e.code()) {
    case fl::v1::ERROR_CODE_ADMISSION_REFUSED:
    case fl::v1::ERROR_CODE_FINGERPRINT_MISMATCH:
    case fl::v1::ERROR_CODE_MALFORMED:
    case fl::v1::ERROR_CODE_SHUTTING_DOWN: return true;
    default: return false;
  }
}

std::string Describe(const fl::v1::ErrorDetail& e) {
  return e.hint().empty() ? e.message() : fl::StrCat(e.message(), "; ", e.hint());
}

// Exponential backoff with full jitter (AWS architecture blog's "full jitter"): spreads reconnecting clients
// so that a restarted server is not hit by all of them in the same millisecond.
class Backoff {
 public:
  Backoff(uint32_t initial_ms, uint32_t max_ms, uint64_t seed) : initial_ms_(initial_ms), max_ms_(max_ms), rng_(seed) {}
  uint32_t NextMs() {
    const uint64_t cap = std::min<uint64_t>(max_ms_, uint64_t{initial_ms_} << std::min(attempt_++, 20u));
    return static_cast<uint32_t>(cap / 2 + rng_() % (cap / 2 + 1));
  }
  void Reset() { attempt_ = 0; }

 private:
  uint32_t initial_ms_, max_ms_;
  uint32_t attempt_ = 0;
  std::mt19937_64 rng_;
};

}  // namespace

absl::Status FederatedClient::Impl::Run() {
  if (!setup_error_.ok()) return setup_error_;
  Backoff backoff(options_.initial_backoff_ms, options_.max_backoff_ms,
                  options_.seed ^ std::hash<std::string>{}(options_.client_name));
  int64_t last_contact_ns = Now();
  absl::Status last_error;
  while (!stop_) {
    // Never wait in one attempt beyond the give-up time.
    const int64_t left_ms = int64_t{options_.give_up_after_ms} - (Now() - last_contact_ns) / 1'000'000;
    auto joined = Join(static_cast<uint32_t>(std::clamp<int64_t>(left_ms, 100, options_.join_timeout_ms)));
    if (!joined.ok()) {
      if (joined.status().code() == absl::StatusCode::kFailedPrecondition) return joined.status();
      if (joined.status().code() == absl::StatusCode::kOutOfRange) {
        // The experiment ended while this client was away (stopped, cut off): nothing is left to do.
        spdlog::info("{}", joined.status().message());
        return absl::OkStatus();
      }
      if (stop_) break;
      last_error = joined.status();
      if (Now() - last_contact_ns >= int64_t{options_.give_up_after_ms} * 1'000'000) {
        return absl::UnavailableError(fl::StrCat(
            "cannot reach fl-server at ", options_.server_address, " for ", options_.give_up_after_ms / 1000,
            " s (last error: ", fl::ToStd(last_error.message()), "); check --server and that fl-server is running"));
      }
      const uint32_t wait_ms = std::max(backoff.NextMs(), std::exchange(server_retry_after_ms_, 0u));
      spdlog::info("join failed ({}); retrying in {} ms", last_error.message(), wait_ms);
      SleepUnlessStopped(wait_ms);
      continue;
    }
    backoff.Reset();
    last_contact_ns = Now();
    client_id_ = joined->client_id();
    token_ = joined->session_token();
    heartbeat_ms_ = std::max<uint32_t>(joined->heartbeat_interval_ms(), 50);
    server_max_chunk_ = joined->max_chunk_bytes() == 0 ? proto::kDefaultChunkBytes : joined->max_chunk_bytes();
    spdlog::info("joined experiment {} as '{}'", joined->experiment_id(), client_id_);
    if (options_.metrics != nullptr) options_.metrics->SetExperiment(joined->experiment_id());
    if (joined->initial_model_requested()) {
      if (absl::Status s = UploadInitialModel(); !s.ok()) {
        if (s.code() == absl::StatusCode::kFailedPrecondition) return s;
        spdlog::warn("initial model upload failed: {}", s.message());
      }
    }
    auto end = RunSession();
    if (!end.ok()) return end.status();
    if (*end == SessionEnd::kFinished) return absl::OkStatus();
    last_contact_ns = Now();
    if (stop_) break;
    const uint32_t wait_ms = backoff.NextMs();
    spdlog::info("session ended; reconnecting in {} ms", wait_ms);
    if (options_.metrics != nullptr) options_.metrics->CountReconnect();
    SleepUnlessStopped(wait_ms);
  }
  return absl::CancelledError("fl-client was stopped");
}

absl::StatusOr<fl::v1::JoinResponse> FederatedClient::Impl::Join(uint32_t timeout_ms) {
  fl::v1::JoinRequest req;
  req.set_protocol_version(fl::v1::PROTOCOL_VERSION_3);
  req.set_client_name(options_.client_name);
  *req.mutable_device() = options_.device;
  *req.mutable_link() = options_.link;
  *req.mutable_model_spec() = proto::ToProto(trainer_->spec(), trainer_->model_name());
  req.set_task(trainer_->task());
  req.set_num_train_examples(trainer_->num_train_examples());
  req.set_num_test_examples(trainer_->num_test_examples());
  req.set_software_version(options_.software_version);
  // The token of our previous Join (empty the first time): while the server still holds our old session (it
  // may not have noticed that the link dropped) it admits a rejoin under our name only with it.
  req.set_session_token(token_);
  // Secure aggregation's stages and masked upload, and Task.privacy (proto/fl/v1/federation.proto).
  req.add_capabilities("secagg-v1");
  req.add_capabilities("client-privacy-v1");
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineAfterMs(timeout_ms));
  ctx.set_wait_for_ready(true);  // wait for the server to come up instead of failing at once
  {
    fl::MutexLock lock(ctx_mu_);
    if (stop_) return absl::CancelledError("fl-client was stopped");
    join_ctx_ = &ctx;
  }
  fl::v1::JoinResponse resp;
  grpc::Status status = stub_->Join(&ctx, req, &resp);
  {
    fl::MutexLock lock(ctx_mu_);
    join_ctx_ = nullptr;
  }
  if (!status.ok()) {
    if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      // The server says when to come back (docs/round-engine.md, "Fleets and overload"): a fleet that retried on
      // its own backoff alone would come back before the server has room, and be refused again.
      const auto& trailers = ctx.GetServerTrailingMetadata();
      if (auto it = trailers.find("retry-after-ms"); it != trailers.end()) {
        uint32_t ms = 0;
        const char* end = it->second.data() + it->second.size();
        if (std::from_chars(it->second.data(), end, ms).ptr == end) server_retry_after_ms_ = std::min(ms, 600'000u);
      }
    }
    fl::v1::ErrorDetail detail = proto::ErrorFromGrpcStatus(status);
    if (detail.code() == fl::v1::ERROR_CODE_EXPERIMENT_FINISHED) {
      return absl::OutOfRangeError(
          fl::StrCat("fl-server at ", options_.server_address, ": ", detail.message(), "; nothing left to do"));
    }
    if (IsFatalRefusal(detail)) {
      return absl::FailedPreconditionError(fl::StrCat("fl-server at ", options_.server_address, " refused client '",
                                                      options_.client_name, "': ", Describe(detail)));
    }
    return absl::UnavailableError(status.error_message());
  }
  if (!resp.admitted()) {
    return absl::FailedPreconditionError(fl::StrCat("fl-server refused admission: ", Describe(resp.error())));
  }
  return resp;
}

absl::Status FederatedClient::Impl::UploadInitialModel() {
  std::vector<float> params(trainer_->spec().num_elements());
  if (absl::Status s = trainer_->GetParameters(params); !s.ok()) return s;
  auto codec = core::MakeCodec(core::CodecKind::kFp32);
  auto payload = std::make_shared<std::vector<uint8_t>>();
  if (absl::Status s = (*codec)->Encode(params, payload.get(), kUploadEncoding); !s.ok()) return s;
  fl::v1::UpdateHeader h;
  h.set_kind(fl::v1::UPDATE_KIND_INITIAL_MODEL);
  h.set_model_fingerprint(trainer_->spec().fingerprint());
  h.set_codec("fp32");
  h.set_num_examples(trainer_->num_train_examples());
  auto resp = Upload(h, std::move(payload), 60000);
  if (!resp.ok()) return resp.status();
  if (resp->outcome() != fl::v1::UPDATE_OUTCOME_ACCEPTED) {
    return absl::UnavailableError(fl::StrCat("initial model not accepted: ", Describe(resp->error())));
  }
  spdlog::info("uploaded the initial model ({} parameters)", params.size());
  return absl::OkStatus();
}

bool FederatedClient::Impl::WriteToSession(const ClientMessage& msg) {
  fl::MutexLock lock(write_mu_);
  if (stream_ == nullptr) return false;
  ClientMessage m = msg;
  m.set_seq(++seq_);
  return stream_->Write(m);
}

absl::StatusOr<FederatedClient::Impl::SessionEnd> FederatedClient::Impl::RunSession() {
  grpc::ClientContext ctx;
  {
    fl::MutexLock lock(ctx_mu_);
    if (stop_) return SessionEnd::kReconnect;
    session_ctx_ = &ctx;
  }
  std::unique_ptr<grpc::ClientReaderWriter<ClientMessage, ServerMessage>> stream = stub_->Session(&ctx);
  {
    fl::MutexLock lock(write_mu_);
    stream_ = stream.get();
    seq_ = 0;
  }
  {
    fl::MutexLock lock(queue_mu_);
    session_over_ = false;
    tasks_.clear();
  }
  ClientMessage hello;
  hello.mutable_hello()->set_client_id(client_id_);
  hello.mutable_hello()->set_session_token(token_);
  hello.mutable_hello()->set_sent_client_ns(Now());
  WriteToSession(hello);

  std::thread worker([this] { Worker(); });
  fl::Mutex hb_mu;
  fl::CondVar hb_cv;
  bool hb_stop = false;  // under hb_mu (a local: the analysis checks only members)
  std::thread heartbeat([&] {
    fl::MutexLock lock(hb_mu);
    while (!hb_cv.WaitFor(hb_mu, std::chrono::milliseconds(heartbeat_ms_), [&] { return hb_stop; })) {
      ClientMessage m;
      m.mutable_heartbeat()->set_sent_client_ns(Now());
      m.mutable_heartbeat()->set_state(fl::v1::CLIENT_STATE_IDLE);
      WriteToSession(m);
    }
  });

  bool finished = false;
  ServerMessage msg;
  while (stream->Read(&msg)) {
    switch (msg.kind_case()) {
      case ServerMessage::kTask: {
        // Secure aggregation's keys go up at once, while the task downloads and trains (the server closes the
        // advertise-keys stage at its own deadline).
        if (msg.task().has_secagg() && msg.task().kind() == fl::v1::TASK_KIND_TRAIN) StartSecureRound(msg.task());
        fl::MutexLock lock(queue_mu_);
        tasks_.push_back(msg.task());
        queue_cv_.NotifyAll();
        break;
      }
      case ServerMessage::kSecaggNeighbourKeys: {
        if (std::optional<fl::v1::SecAggShares> shares = secure_.OnNeighbourKeys(msg.secagg_neighbour_keys())) {
          ClientMessage m;
          *m.mutable_secagg_shares() = *std::move(shares);
          WriteToSession(m);
        }
        break;
      }
      case ServerMessage::kSecaggMaskingStart: secure_.OnMaskingStart(msg.secagg_masking_start()); break;
      case ServerMessage::kSecaggUnmaskRequest: {
        if (std::optional<fl::v1::SecAggUnmaskResponse> r = secure_.OnUnmaskRequest(msg.secagg_unmask_request())) {
          ClientMessage m;
          *m.mutable_secagg_unmask() = *std::move(r);
          WriteToSession(m);
        }
        break;
      }
      case ServerMessage::kPing: {
        ClientMessage pong;
        const int64_t received = Now();
        pong.mutable_pong()->set_ping_id(msg.ping().ping_id());
        pong.mutable_pong()->set_ping_sent_server_ns(msg.ping().sent_server_ns());
        pong.mutable_pong()->set_received_client_ns(received);
        pong.mutable_pong()->set_sent_client_ns(Now());
        WriteToSession(pong);
        break;
      }
      case ServerMessage::kCancel: {
        {
          fl::MutexLock lock(queue_mu_);
          if (current_task_ == msg.cancel().task_id()) task_cancelled_ = true;
          std::erase_if(tasks_, [&](const fl::v1::Task& t) { return t.task_id() == msg.cancel().task_id(); });
        }
        // A cancelled client counts as dropped in its secure round; a worker waiting for the masking start wakes.
        secure_.Abandon(msg.cancel().task_id(), fl::StrCat("the server cancelled task ", msg.cancel().task_id()));
        secure_.Wake();
        break;
      }
      case ServerMessage::kShutdown:
        finished = msg.shutdown().experiment_finished();
        if (finished) {
          spdlog::info("server shutdown: {}", msg.shutdown().reason());
        } else {
          spdlog::warn("server shutdown: {}; will reconnect when it is back", msg.shutdown().reason());
        }
        break;
      default: break;
    }
  }
  {
    fl::MutexLock lock(hb_mu);
    hb_stop = true;
  }
  hb_cv.NotifyAll();
  heartbeat.join();
  {
    fl::MutexLock lock(queue_mu_);
    session_over_ = true;
    task_cancelled_ = true;
    queue_cv_.NotifyAll();
  }
  // The server lost this session, and with it this client's place in any secure round.
  secure_.Abandon("", "the session ended");
  secure_.Wake();
  worker.join();
  task_cancelled_ = false;
  {
    fl::MutexLock lock(write_mu_);
    stream->WritesDone();
    stream_ = nullptr;
  }
  grpc::Status status = stream->Finish();
  {
    fl::MutexLock lock(ctx_mu_);
    session_ctx_ = nullptr;
  }
  if (finished) return SessionEnd::kFinished;
  if (!status.ok()) {
    fl::v1::ErrorDetail detail = proto::ErrorFromGrpcStatus(status);
    if (detail.code() == fl::v1::ERROR_CODE_SHUTTING_DOWN) return SessionEnd::kFinished;
    spdlog::warn("session ended: {}", status.error_message());
  }
  return SessionEnd::kReconnect;
}

void FederatedClient::Impl::Worker() {
  for (;;) {
    fl::v1::Task task;
    {
      fl::MutexLock lock(queue_mu_);
      queue_cv_.Wait(queue_mu_, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(queue_mu_) {
        return session_over_ || stop_ || !tasks_.empty();
      });
      if (session_over_ || stop_) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
      current_task_ = task.task_id();
      task_cancelled_ = false;
    }
    RunTask(task);
    fl::MutexLock lock(queue_mu_);
    current_task_.clear();
  }
}

void FederatedClient::Impl::ReportFailure(const std::string& task_id, const absl::Status& status) {
  spdlog::warn("task {} failed: {}", task_id, status.message());
  // A failed task sends nothing more in its secure round (the server counts the client as dropped there).
  secure_.Abandon(task_id, fl::ToStd(status.message()));
  ClientMessage m;
  m.mutable_status()->set_task_id(task_id);
  m.mutable_status()->set_state(fl::v1::CLIENT_STATE_FAILED);
  *m.mutable_status()->mutable_error() =
      proto::MakeError(fl::v1::ERROR_CODE_INTERNAL, std::string(fl::ToStd(status.message())));
  WriteToSession(m);
}
void FederatedClient::Impl::StartSecureRound(const fl::v1::Task& task) {
  absl::StatusOr<fl::v1::SecAggPublicKeys> keys =
      secure_.Start(task.task_id(), task.secagg(), trainer_->spec().num_elements(), secagg::RandomSource::System());
  if (!keys.ok()) return;  // logged and kept: RunTask reports it as the task's failure
  ClientMessage m;
  *m.mutable_secagg_keys() = *std::move(keys);
  WriteToSession(m);
}

absl::StatusOr<bool> FederatedClient::Impl::MaskUpdate(const fl::v1::Task& task, uint64_t num_examples,
                                                       int64_t task_start, fl::v1::UpdateHeader* h) {
  const fl::v1::ClientPrivacy& privacy = task.privacy();
  privacy::NoiseRng rng = privacy::NoiseRng::FromSystem();  // 32 bytes from the kernel; drawn from only for noise
  // The delta is formed in the payload buffer itself and masked there: no model-sized buffer besides it.
  if (encoded_ == nullptr || encoded_.use_count() > 1) encoded_ = std::make_shared<std::vector<uint8_t>>();
  std::vector<uint8_t>& payload = *encoded_;
  const size_t n = global_.size();
  payload.resize(SecAggPayloadBytes(n));
  const std::span<float> delta(reinterpret_cast<float*>(payload.data()), n);
  if (absl::Status s = trainer_->GetParameters(delta); !s.ok()) return s;
  for (size_t i = 0; i < n; ++i) delta[i] = global_[i] - delta[i];
  if (ChangesDelta(privacy)) {
    if (absl::StatusOr<privacy::ClipResult> c = ApplyClientPrivacy(delta, privacy, rng); !c.ok()) return c.status();
  }
  // Keys and shares went up from the reader thread, maybe during the training; the masking start may have come
  // too. Wait for it no longer than the task's deadline (from when this client began the task).
  const int64_t wait_start = Now();
  const int64_t left_ms =
      task.deadline_ms() > 0 ? int64_t{task.deadline_ms()} - (wait_start - task_start) / 1'000'000 : 24 * 3600 * 1000;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(std::max<int64_t>(left_ms, 0));
  const SecureUpdate::Waited waited = secure_.AwaitMaskingStart(
      task.task_id(), SecAggWeight(task.secagg().quantization(), num_examples), task_cancelled_, deadline);
  const int64_t wait_end = Now();
  if (task_cancelled_) return false;
  switch (waited.outcome) {
    case SecureUpdate::Outcome::kReady: break;
    case SecureUpdate::Outcome::kDropped:
    case SecureUpdate::Outcome::kInterrupted: return false;
    case SecureUpdate::Outcome::kAbandoned:
    case SecureUpdate::Outcome::kDeadline: return waited.why;
  }
  absl::StatusOr<MaskReport> masked =
      secure_.MaskInPlace(task.task_id(), payload,
                          DistributedNoise{.central_noise_steps = privacy.central_noise_steps(),
                                           .expected_clients = privacy.expected_clients()},
                          rng);
  const int64_t mask_end = Now();
  if (!masked.ok()) return masked.status();
  auto& metrics = *h->mutable_metrics();
  metrics["secagg_clipped_values"] = static_cast<double>(masked->clipped_values);
  metrics["secagg_wait_seconds"] = static_cast<double>(wait_end - wait_start) / 1e9;
  metrics["secagg_mask_seconds"] = static_cast<double>(mask_end - wait_end) / 1e9;
  metrics["secagg_keys_seconds"] = masked->keys_seconds;
  metrics["secagg_shares_seconds"] = masked->shares_seconds;
  metrics["secagg_masking_start_seconds"] = masked->masking_start_seconds;
  return true;
}

void FederatedClient::Impl::RunTask(const fl::v1::Task& task) {
  const int64_t task_start = Now();
  if (task.kind() == fl::v1::TASK_KIND_TRAIN) {
    // Refused before any work: values that would give no privacy, or none that the server meant.
    if (absl::Status s = CheckClientPrivacy(task.privacy(), task.has_secagg()); !s.ok()) {
      ReportFailure(task.task_id(), s);
      return;
    }
  }
  auto global = Download(task);
  if (!global.ok()) {
    ReportFailure(task.task_id(), global.status());
    return;
  }
  if (ClientMetrics* m = options_.metrics; m != nullptr) {
    m->ObservePhase("downlink", static_cast<double>(global->timing.duration_ns()) / 1e9, global->bytes);
    m->SetModelVersion(global->model_version);
  }
  if (task_cancelled_) return;

  if (task.kind() == fl::v1::TASK_KIND_EVALUATE) {
    const int64_t eval_start = Now();
    auto result = trainer_->Evaluate(global_);
    const int64_t eval_end = Now();
    if (options_.metrics != nullptr)
      options_.metrics->ObservePhase("eval", static_cast<double>(eval_end - eval_start) / 1e9);
    if (!result.ok()) {
      ReportFailure(task.task_id(), result.status());
      return;
    }
    ClientMessage m;
    fl::v1::EvaluationResult* r = m.mutable_evaluation();
    r->set_task_id(task.task_id());
    r->set_round(task.round());
    r->set_model_version(global->model_version);
    r->set_num_examples(result->num_examples);
    r->set_loss(result->loss);
    r->set_accuracy(result->accuracy);
    if (trainer_->task() == core::TaskName(core::Task::kRegression)) (*r->mutable_metrics())["mae"] = result->mae;
    *r->add_timings() = global->timing;
    *r->add_timings() = Phase(fl::v1::PHASE_EVAL, eval_start, eval_end);
    WriteToSession(m);
    return;
  }

  training::TrainOptions opts;
  const fl::v1::TrainConfig& c = task.train();
  opts.local_epochs = c.local_epochs();
  opts.local_steps = c.local_steps();
  opts.batch_size = c.batch_size();
  opts.learning_rate = c.learning_rate();
  opts.optimizer = c.optimizer().empty() ? "sgd" : c.optimizer();
  opts.momentum = c.momentum();
  opts.weight_decay = c.weight_decay();
  opts.proximal_mu = c.proximal_mu();
  opts.seed = c.seed();
  opts.cancelled = &task_cancelled_;
  const int64_t train_start = Now();
  auto result = trainer_->Train(global_, opts);
  const int64_t train_end = Now();
  if (options_.metrics != nullptr)
    options_.metrics->ObservePhase("train", static_cast<double>(train_end - train_start) / 1e9);
  if (task_cancelled_) return;
  if (!result.ok()) {
    ReportFailure(task.task_id(), result.status());
    return;
  }

  // The update is the pseudo-gradient global - local (see UPDATE_KIND_DELTA), clipped and noised as Task.privacy
  // says, then masked (Task.secagg) or encoded with the task's codec, with error feedback when the codec is lossy.
  fl::v1::UpdateHeader h;
  const fl::v1::ClientPrivacy& privacy = task.privacy();
  std::string codec_name;
  absl::Status encoded;
  if (task.has_secagg()) {
    codec_name = kSecAggCodec;
    absl::StatusOr<bool> masked = MaskUpdate(task, result->num_examples, task_start, &h);
    if (!masked.ok()) {
      ReportFailure(task.task_id(), masked.status());
      return;
    }
    if (!*masked) return;
  } else {
    codec_name = task.uplink_codec().empty() ? "fp32" : task.uplink_codec();
    auto codec = core::MakeCodec(codec_name);
    if (!codec.ok()) {
      ReportFailure(task.task_id(), codec.status());
      return;
    }
    // The last upload's slices may still hold encoded_ (gRPC releases them after the call, on its own thread):
    // reuse the buffer only when nothing else holds it, so that no byte changes under a slice being sent.
    if (encoded_ == nullptr || encoded_.use_count() > 1) encoded_ = std::make_shared<std::vector<uint8_t>>();
    encoded =
        uplink_encoder_.EncodeDelta(**codec, global_, *trainer_, privacy, update_, encoded_.get(), kUploadEncoding);
  }
  if (!encoded.ok()) {
    // Non-finite values after training: the local model diverged. Tell the server rather than go silent.
    ReportFailure(task.task_id(), encoded);
    return;
  }
  const std::vector<uint8_t>& payload = *encoded_;

  h.set_task_id(task.task_id());
  h.set_round(task.round());
  h.set_base_model_version(global->model_version);
  h.set_model_fingerprint(trainer_->spec().fingerprint());
  h.set_kind(fl::v1::UPDATE_KIND_DELTA);
  h.set_num_examples(result->num_examples);
  h.set_codec(codec_name);
  (*h.mutable_metrics())["train_loss"] = result->train_loss;
  (*h.mutable_metrics())["train_accuracy"] = result->train_accuracy;
  (*h.mutable_metrics())["num_steps"] = static_cast<double>(result->num_steps);
  *h.add_timings() = global->timing;
  *h.add_timings() = Phase(fl::v1::PHASE_TRAIN, train_start, train_end);
  // Idle: time in the task not spent downloading or training (queueing, decoding, encoding).
  const int64_t idle_ns = (Now() - task_start) - global->timing.duration_ns() - (train_end - train_start);
  fl::v1::PhaseTiming idle = Phase(fl::v1::PHASE_IDLE, task_start, task_start + std::max<int64_t>(idle_ns, 0));
  *h.add_timings() = idle;
  const int64_t remaining_ms =
      (task.deadline_ms() > 0) ? std::max<int64_t>(1000, task.deadline_ms() - (Now() - task_start) / 1'000'000 + 5000)
                               : 60000;
  const int64_t upload_start = Now();
  auto resp = Upload(h, encoded_, static_cast<uint32_t>(remaining_ms));
  const int64_t upload_acked = Now();
  if (options_.metrics != nullptr && resp.ok()) {
    options_.metrics->ObservePhase("uplink", static_cast<double>(upload_acked - upload_start) / 1e9, payload.size());
    if (resp->outcome() == fl::v1::UPDATE_OUTCOME_ACCEPTED) options_.metrics->CountRoundCompleted();
  }
  if (resp.ok()) {
    // The uplink ends with the server's ack, so the client can report its own view of it only now.
    ClientMessage m;
    m.mutable_status()->set_task_id(task.task_id());
    m.mutable_status()->set_state(fl::v1::CLIENT_STATE_IDLE);
    m.mutable_status()->set_progress(1.0f);
    *m.mutable_status()->add_timings() = Phase(fl::v1::PHASE_UPLINK, upload_start, upload_acked, payload.size());
    WriteToSession(m);
  }
  if (!resp.ok()) {
    spdlog::warn("round {}: {}", task.round(), resp.status().message());
    return;
  }
  if (resp->outcome() == fl::v1::UPDATE_OUTCOME_ACCEPTED) {
    spdlog::info("round {}: update accepted ({} examples, loss {:.4f}, {} bytes)", task.round(), result->num_examples,
                 result->train_loss, payload.size());
  } else {
    spdlog::warn("round {}: update {} — {}", task.round(),
                 resp->outcome() == fl::v1::UPDATE_OUTCOME_LATE ? "late" : "rejected", Describe(resp->error()));
  }
}

FederatedClient::FederatedClient(ClientOptions options, training::Trainer* trainer)
    : impl_(std::make_unique<Impl>(std::move(options), trainer)) {}
FederatedClient::~FederatedClient() = default;
absl::Status FederatedClient::Run() { return impl_->Run(); }
void FederatedClient::Stop() { impl_->Stop(); }

}  // namespace fl::client
