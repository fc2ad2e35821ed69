#include "fl/client/session.h"

#include <algorithm>
#include <array>
#include <bit>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <random>
#include <thread>
#include <utility>

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include "absl/base/thread_annotations.h"
#include "fl/core/log_format.h"
#include "fl/client/uplink_encoder.h"

#include "fl/core/checksum.h"
#include "fl/core/clock.h"
#include "fl/core/codec.h"
#include "fl/core/str_cat.h"
#include "fl/core/task.h"
#include "fl/core/tensor_spec.h"
#include "fl/proto/chunk_reader.h"
#include "fl/proto/convert.h"
#include "fl/rpc/tls.h"
#include "fl/v1/federation.grpc.pb.h"

namespace fl::client {
namespace {

using fl::v1::ClientMessage;
using fl::v1::ServerMessage;

// The transfer RPCs by name, for calls that read and write raw ByteBuffers (the generated stub only speaks
// messages); the names are those of proto/fl/v1/federation.proto's Federation service.
constexpr char kDownloadModelMethod[] = "/fl.v1.Federation/DownloadModel";
constexpr char kUploadUpdateMethod[] = "/fl.v1.Federation/UploadUpdate";
// Uploads carry no codec body checksum (PROTOCOL_VERSION_3): the upload's trailer has the XXH3-64 of the whole
// payload, which fl-server checks before decoding, so computing Checksum64 too would be a second pass for nothing.
constexpr core::EncodeOptions kUploadEncoding{.body_checksum = false};

std::chrono::system_clock::time_point DeadlineAfterMs(int64_t ms) {
  return std::chrono::system_clock::now() + std::chrono::milliseconds(ms);
}

fl::v1::PhaseTiming Phase(fl::v1::Phase phase, int64_t start_ns, int64_t end_ns, uint64_t bytes = 0) {
  fl::v1::PhaseTiming t;
  t.set_phase(phase);
  t.set_start_client_ns(start_ns);
  t.set_duration_ns(end_ns - start_ns);
  t.set_bytes(bytes);
  return t;
}

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

// A downloaded model; its values are in FederatedClient::Impl::global_ (reused from round to round).
struct Downloaded {
  uint64_t model_version = 0;
  uint64_t bytes = 0;
  fl::v1::PhaseTiming timing;
};

}  // namespace

class FederatedClient::Impl {
 public:
  Impl(ClientOptions options, Trainer* trainer) : options_(std::move(options)), trainer_(trainer) {
    grpc::ChannelArguments args = wire::SessionChannelArguments();
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
    // A connection of its own even beside other sessions of this process (fl-client --instances): as separate
    // devices would, and so that one instance's reconnect or stalled stream is not every instance's.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    ApplySocketBinding(options_.binding, &args);
    if (options_.tls.has_value() && !options_.tls->server_name.empty()) {
      args.SetSslTargetNameOverride(options_.tls->server_name);
    }
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials = rpc::ChannelCredentials(options_.tls);
    if (!credentials.ok()) {
      // Reported by Run(): a constructor cannot fail, and retrying would not make the file readable.
      setup_error_ = credentials.status();
      credentials = grpc::InsecureChannelCredentials();
    }
    channel_ = grpc::CreateCustomChannel(options_.server_address, *credentials, args);
    stub_ = fl::v1::Federation::NewStub(channel_);
  }

  absl::Status Run();
  // This client's clock: the monotonic clock, shifted by the test skew.
  int64_t Now() const { return NowNs() + options_.clock_skew_ns; }
  void Stop() {
    stop_ = true;
    task_cancelled_ = true;
    {
      std::lock_guard lock(ctx_mu_);
      if (session_ctx_ != nullptr) session_ctx_->TryCancel();
      if (join_ctx_ != nullptr) join_ctx_->TryCancel();
    }
    queue_cv_.notify_all();
    stop_cv_.notify_all();
  }

 private:
  enum class SessionEnd { kFinished, kReconnect };

  absl::StatusOr<fl::v1::JoinResponse> Join(uint32_t timeout_ms);
  absl::Status UploadInitialModel();
  absl::StatusOr<SessionEnd> RunSession();
  void Worker();
  void RunTask(const fl::v1::Task& task);
  absl::StatusOr<Downloaded> Download(const fl::v1::Task& task);
  // Streams `payload` in chunks that refer to it in place (wire::EncodeDataChunkInPlace): gRPC may hold it after
  // this returns, so the caller changes it only once it is the sole holder again.
  absl::StatusOr<fl::v1::UploadUpdateResponse> Upload(fl::v1::UpdateHeader header,
                                                      std::shared_ptr<const std::vector<uint8_t>> payload,
                                                      uint32_t deadline_ms);
  bool WriteToSession(const ClientMessage& msg);
  void ReportFailure(const std::string& task_id, const absl::Status& status);

  ClientOptions options_;
  Trainer* trainer_;
  absl::Status setup_error_;  // the TLS files could not be read (see the constructor)
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<fl::v1::Federation::Stub> stub_;
  // Transfer state reused across tasks (no allocation per chunk or per transfer).
  wire::DataChunkReader download_chunks_;
  core::TransferChecksum download_checksum_;
  core::TransferChecksum upload_checksum_;
  std::atomic<bool> stop_{false};

  // Per join.
  std::string client_id_;
  std::string token_;
  // The retry-after-ms of the last Join refused RESOURCE_EXHAUSTED (a server shedding load or at its session
  // limit); the next attempt waits at least that long. 0: none. Read and written by Run's thread only.
  uint32_t server_retry_after_ms_ = 0;
  uint32_t heartbeat_ms_ = 5000;
  uint32_t server_max_chunk_ = 1u << 20;

  // Per session.
  std::mutex ctx_mu_;
  grpc::ClientContext* session_ctx_ ABSL_GUARDED_BY(ctx_mu_) = nullptr;
  grpc::ClientContext* join_ctx_ ABSL_GUARDED_BY(ctx_mu_) = nullptr;
  std::condition_variable_any stop_cv_;  // wakes backoff sleeps on Stop()

  // Sleeps `ms` unless Stop() comes first.
  void SleepUnlessStopped(uint32_t ms) {
    std::unique_lock lock(ctx_mu_);
    stop_cv_.wait_for(lock, std::chrono::milliseconds(ms), [&] { return stop_.load(); });
  }
  std::mutex write_mu_;
  grpc::ClientReaderWriter<ClientMessage, ServerMessage>* stream_ ABSL_GUARDED_BY(write_mu_) = nullptr;
  uint64_t seq_ ABSL_GUARDED_BY(write_mu_) = 0;
  std::mutex queue_mu_;
  std::condition_variable queue_cv_;
  std::deque<fl::v1::Task> tasks_ ABSL_GUARDED_BY(queue_mu_);
  bool session_over_ ABSL_GUARDED_BY(queue_mu_) = false;
  std::string current_task_ ABSL_GUARDED_BY(queue_mu_);
  std::atomic<bool> task_cancelled_{false};

  // Model-sized buffers reused from round to round: a fresh 100 MB allocation per round costs page faults
  // and munmap that, on a small device, take as long as the transfer itself.
  std::vector<uint8_t> download_bytes_;
  std::vector<float> global_;
  std::vector<float> update_;
  // The update's payload; shared with the slices of its upload until gRPC has sent them (see RunTask).
  std::shared_ptr<std::vector<uint8_t>> encoded_;

  // Error feedback of lossy uplink codecs: what they lost is added to the next update, also when the task's
  // codec changes between rounds (uplink_encoder.h).
  UplinkEncoder uplink_encoder_;
};

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
    server_max_chunk_ = joined->max_chunk_bytes() == 0 ? wire::kDefaultChunkBytes : joined->max_chunk_bytes();
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
  *req.mutable_model_spec() = wire::ToProto(trainer_->spec(), trainer_->model_name());
  req.set_task(trainer_->task());
  req.set_num_train_examples(trainer_->num_train_examples());
  req.set_num_test_examples(trainer_->num_test_examples());
  req.set_software_version(options_.software_version);
  // The token of our previous Join (empty the first time): while the server still holds our old session (it
  // may not have noticed that the link dropped) it admits a rejoin under our name only with it.
  req.set_session_token(token_);
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineAfterMs(timeout_ms));
  ctx.set_wait_for_ready(true);  // wait for the server to come up instead of failing at once
  {
    std::lock_guard lock(ctx_mu_);
    if (stop_) return absl::CancelledError("fl-client was stopped");
    join_ctx_ = &ctx;
  }
  fl::v1::JoinResponse resp;
  grpc::Status status = stub_->Join(&ctx, req, &resp);
  {
    std::lock_guard lock(ctx_mu_);
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
    fl::v1::ErrorDetail detail = wire::ErrorFromGrpcStatus(status);
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
  std::lock_guard lock(write_mu_);
  if (stream_ == nullptr) return false;
  ClientMessage m = msg;
  m.set_seq(++seq_);
  return stream_->Write(m);
}

absl::StatusOr<FederatedClient::Impl::SessionEnd> FederatedClient::Impl::RunSession() {
  grpc::ClientContext ctx;
  {
    std::lock_guard lock(ctx_mu_);
    if (stop_) return SessionEnd::kReconnect;
    session_ctx_ = &ctx;
  }
  std::unique_ptr<grpc::ClientReaderWriter<ClientMessage, ServerMessage>> stream = stub_->Session(&ctx);
  {
    std::lock_guard lock(write_mu_);
    stream_ = stream.get();
    seq_ = 0;
  }
  {
    std::lock_guard lock(queue_mu_);
    session_over_ = false;
    tasks_.clear();
  }
  ClientMessage hello;
  hello.mutable_hello()->set_client_id(client_id_);
  hello.mutable_hello()->set_session_token(token_);
  hello.mutable_hello()->set_sent_client_ns(Now());
  WriteToSession(hello);

  std::thread worker([this] { Worker(); });
  std::mutex hb_mu;
  std::condition_variable hb_cv;
  bool hb_stop = false;
  std::thread heartbeat([&] {
    std::unique_lock lock(hb_mu);
    while (!hb_cv.wait_for(lock, std::chrono::milliseconds(heartbeat_ms_), [&] { return hb_stop; })) {
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
        std::lock_guard lock(queue_mu_);
        tasks_.push_back(msg.task());
        queue_cv_.notify_all();
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
        std::lock_guard lock(queue_mu_);
        if (current_task_ == msg.cancel().task_id()) task_cancelled_ = true;
        std::erase_if(tasks_, [&](const fl::v1::Task& t) { return t.task_id() == msg.cancel().task_id(); });
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
    std::lock_guard lock(hb_mu);
    hb_stop = true;
  }
  hb_cv.notify_all();
  heartbeat.join();
  {
    std::lock_guard lock(queue_mu_);
    session_over_ = true;
    task_cancelled_ = true;
    queue_cv_.notify_all();
  }
  worker.join();
  task_cancelled_ = false;
  {
    std::lock_guard lock(write_mu_);
    stream->WritesDone();
    stream_ = nullptr;
  }
  grpc::Status status = stream->Finish();
  {
    std::lock_guard lock(ctx_mu_);
    session_ctx_ = nullptr;
  }
  if (finished) return SessionEnd::kFinished;
  if (!status.ok()) {
    fl::v1::ErrorDetail detail = wire::ErrorFromGrpcStatus(status);
    if (detail.code() == fl::v1::ERROR_CODE_SHUTTING_DOWN) return SessionEnd::kFinished;
    spdlog::warn("session ended: {}", status.error_message());
  }
  return SessionEnd::kReconnect;
}

void FederatedClient::Impl::Worker() {
  for (;;) {
    fl::v1::Task task;
    {
      std::unique_lock lock(queue_mu_);
      queue_cv_.wait(lock, [&] { return session_over_ || stop_ || !tasks_.empty(); });
      if (session_over_ || stop_) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
      current_task_ = task.task_id();
      task_cancelled_ = false;
    }
    RunTask(task);
    std::lock_guard lock(queue_mu_);
    current_task_.clear();
  }
}

void FederatedClient::Impl::ReportFailure(const std::string& task_id, const absl::Status& status) {
  spdlog::warn("task {} failed: {}", task_id, status.message());
  ClientMessage m;
  m.mutable_status()->set_task_id(task_id);
  m.mutable_status()->set_state(fl::v1::CLIENT_STATE_FAILED);
  *m.mutable_status()->mutable_error() =
      wire::MakeError(fl::v1::ERROR_CODE_INTERNAL, std::string(fl::ToStd(status.message())));
  WriteToSession(m);
}

absl::StatusOr<Downloaded> FederatedClient::Impl::Download(const fl::v1::Task& task) {
  const int64_t start = Now();
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineAfterMs(std::max<uint32_t>(task.deadline_ms(), 1000)));
  fl::v1::DownloadModelRequest req;
  req.set_client_id(client_id_);
  req.set_session_token(token_);
  req.set_task_id(task.task_id());
  req.set_model_version(task.model_version());
  req.set_max_chunk_bytes(options_.max_chunk_bytes);
  // Read as raw ByteBuffers: data chunks go from gRPC's slices straight into the payload and the XXH3 state
  // (wire::DataChunkReader), without a protobuf string per chunk; headers and trailers are parsed as usual.
  auto reader = grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(
      channel_.get(),
      grpc::internal::RpcMethod(kDownloadModelMethod, grpc::internal::RpcMethod::SERVER_STREAMING, channel_), &ctx,
      req);
  grpc::ByteBuffer message;
  fl::v1::ModelChunk chunk;
  fl::v1::ModelHeader header;
  std::vector<uint8_t>& payload = download_bytes_;
  payload.clear();
  download_checksum_.Reset();
  std::optional<uint64_t> checksum;
  bool have_header = false;
  // An fp32 model (the default downlink codec) of this client's size is received in place: the codec header into
  // `head`, the body (the parameters as little-endian floats) straight into global_, so the model is copied once,
  // out of gRPC's slices, instead of into a buffer and then decoded into global_ (a model-sized pass less).
  const size_t num_values = trainer_->spec().num_elements();
  const bool host_is_little_endian = std::endian::native == std::endian::little;
  bool in_place = false;
  std::array<uint8_t, core::kCodecHeaderBytes> head{};
  uint64_t received = 0;
  auto fail = [&](std::string why) {
    ctx.TryCancel();
    reader->Finish();
    return absl::DataLossError(std::move(why));
  };
  auto append = [&](std::span<const uint8_t> piece) {
    download_checksum_.Update(piece);
    if (!in_place) {
      payload.insert(payload.end(), piece.begin(), piece.end());
      received += piece.size();
      return;
    }
    size_t at = 0;
    if (received < head.size()) {
      at = std::min(head.size() - received, piece.size());
      std::memcpy(head.data() + received, piece.data(), at);
    }
    if (at < piece.size()) {
      std::memcpy(reinterpret_cast<uint8_t*>(global_.data()) + (received + at - head.size()), piece.data() + at,
                  piece.size() - at);
    }
    received += piece.size();
  };
  while (reader->Read(&message)) {
    if (have_header) {
      absl::StatusOr<wire::DataChunkReader::Kind> kind =
          download_chunks_.Read(message, header.payload_bytes() - received, append);
      if (!kind.ok()) {
        return fail(kind.status().code() == absl::StatusCode::kOutOfRange
                        ? std::string("the model download carries more bytes than its header announced")
                        : fl::StrCat("the model download is malformed: ", kind.status().message()));
      }
      if (*kind == wire::DataChunkReader::Kind::kData) continue;
    }
    if (!grpc::SerializationTraits<fl::v1::ModelChunk>::Deserialize(&message, &chunk).ok()) {
      return fail("a message of the model download could not be parsed as fl.v1.ModelChunk");
    }
    if (chunk.has_header()) {
      header = chunk.header();
      have_header = true;
      in_place = host_is_little_endian && header.codec() == "fp32" &&
                 header.payload_bytes() == core::kCodecHeaderBytes + uint64_t{num_values} * sizeof(float);
      if (in_place) {
        global_.resize(num_values);
      } else {
        payload.reserve(header.payload_bytes());
      }
    } else if (chunk.part_case() == fl::v1::ModelChunk::kData) {
      if (!have_header || received + chunk.data().size() > header.payload_bytes()) {
        return fail("the model download carries more bytes than its header announced");
      }
      append(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(chunk.data().data()), chunk.data().size()));
    } else if (chunk.has_trailer()) {
      checksum = chunk.trailer().payload_checksum();
    }
  }
  grpc::Status status = reader->Finish();
  if (!status.ok()) {
    return absl::UnavailableError(fl::StrCat("model download failed: ", status.error_message()));
  }
  if (!have_header || !checksum.has_value() || received != header.payload_bytes() ||
      download_checksum_.Digest() != *checksum) {
    return absl::DataLossError(fl::StrCat("the model download is incomplete or damaged (", received, " of ",
                                          header.payload_bytes(), " bytes, checksum ",
                                          checksum.has_value() ? "mismatch" : "missing", ")"));
  }
  const int64_t received_ns = Now();
  if (header.spec().fingerprint() != trainer_->spec().fingerprint()) {
    return absl::FailedPreconditionError(
        fl::StrCat("the server's model has fingerprint ", core::FingerprintToHex(header.spec().fingerprint()),
                   " but this client's ", trainer_->model_name(), " has ", trainer_->spec().FingerprintHex(),
                   "; start the client with the server's model"));
  }
  auto codec = core::MakeCodec(header.codec());
  if (!codec.ok()) return codec.status();
  Downloaded d;
  if (in_place) {
    // What Decode checks, less the body checksum (the XXH3 above verified these bytes): the header, and that
    // every value is finite.
    absl::StatusOr<core::PayloadInfo> info = core::PeekPayloadHeader(head, received);
    if (!info.ok()) return info.status();
    if (info->kind != core::CodecKind::kFp32 || info->num_values != num_values) {
      return absl::InvalidArgumentError(fl::StrCat("the model download's header says ", info->num_values, " ",
                                                   core::CodecKindName(info->kind), " values but the server announced ",
                                                   num_values, " fp32 values: the server's payload is inconsistent"));
    }
    if (absl::Status s = core::CheckFinite(global_, "the downloaded model", &trainer_->spec()); !s.ok()) return s;
  } else {
    global_.resize(num_values);
    // The XXH3 above verified these bytes: the codec's body checksum would be a second pass over them.
    if (absl::Status s = (*codec)->Decode(payload, global_, core::DecodeOptions{.transfer_verified = true}); !s.ok()) {
      return s;
    }
  }
  d.model_version = header.model_version();
  d.bytes = received;
  d.timing = Phase(fl::v1::PHASE_DOWNLINK, start, received_ns, received);
  return d;
}

absl::StatusOr<fl::v1::UploadUpdateResponse> FederatedClient::Impl::Upload(
    fl::v1::UpdateHeader header, std::shared_ptr<const std::vector<uint8_t>> payload, uint32_t deadline_ms) {
  header.set_client_id(client_id_);
  header.set_session_token(token_);
  header.set_payload_bytes(payload->size());
  header.set_upload_started_client_ns(Now());
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineAfterMs(std::max<uint32_t>(deadline_ms, 1000)));
  fl::v1::UploadUpdateResponse resp;
  // Written as raw ByteBuffers: each data chunk is encoded by hand (wire::EncodeDataChunk), its bytes copied
  // once into the message and into the XXH3 state as they go, instead of into a protobuf string then a buffer.
  auto writer = grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(
      channel_.get(),
      grpc::internal::RpcMethod(kUploadUpdateMethod, grpc::internal::RpcMethod::CLIENT_STREAMING, channel_), &ctx,
      &resp);
  fl::v1::UpdateChunk chunk;
  *chunk.mutable_header() = header;
  auto serialize = [](const fl::v1::UpdateChunk& m) {
    grpc::ByteBuffer out;
    bool own = false;
    (void)grpc::SerializationTraits<fl::v1::UpdateChunk>::Serialize(m, &out, &own);  // a header: far below 2 GiB
    return out;
  };
  // A false Write means the server already answered (a refusal) or the stream broke: Finish says which.
  bool open = writer->Write(serialize(chunk));
  const size_t chunk_bytes = std::min<size_t>(options_.max_chunk_bytes, server_max_chunk_);
  core::TransferChecksum& sum = upload_checksum_;
  sum.Reset();
  for (size_t off = 0; open && off < payload->size(); off += chunk_bytes) {
    const std::span<const uint8_t> piece(payload->data() + off, std::min(chunk_bytes, payload->size() - off));
    sum.Update(piece);
    open = writer->Write(wire::EncodeDataChunkInPlace(piece, payload));
  }
  if (open) {
    chunk.Clear();
    chunk.mutable_trailer()->set_payload_checksum(sum.Digest());
    open = writer->Write(serialize(chunk));
  }
  if (open) writer->WritesDone();
  grpc::Status status = writer->Finish();
  if (!status.ok()) {
    return absl::UnavailableError(fl::StrCat("upload failed: ", status.error_message()));
  }
  return resp;
}

void FederatedClient::Impl::RunTask(const fl::v1::Task& task) {
  const int64_t task_start = Now();
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

  TrainOptions opts;
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

  // The update is the pseudo-gradient global - local (see UPDATE_KIND_DELTA), encoded with the task's
  // codec, with error feedback when the codec is lossy.
  const std::string codec_name = task.uplink_codec().empty() ? "fp32" : task.uplink_codec();
  auto codec = core::MakeCodec(codec_name);
  if (!codec.ok()) {
    ReportFailure(task.task_id(), codec.status());
    return;
  }
  // The last upload's slices may still hold encoded_ (gRPC releases them after the call, on its own thread):
  // reuse the buffer only when nothing else holds it, so that no byte changes under a slice being sent.
  if (encoded_ == nullptr || encoded_.use_count() > 1) encoded_ = std::make_shared<std::vector<uint8_t>>();
  std::vector<uint8_t>& payload = *encoded_;
  const size_t n = global_.size();
  absl::Status encoded;
  if ((*codec)->kind() == core::CodecKind::kFp32 && uplink_encoder_.residual().empty() &&
      std::endian::native == std::endian::little) {
    // fp32 with nothing owed to error feedback: the update is computed straight into the payload's body and
    // sealed there (core::SealFp32Payload), the same bytes as encoding it, without the update buffer and its copy.
    payload.resize((*codec)->EncodedSize(n));
    const std::span<float> body(reinterpret_cast<float*>(payload.data() + core::kCodecHeaderBytes), n);
    encoded = trainer_->GetParameters(body);
    if (encoded.ok()) {
      for (size_t i = 0; i < n; ++i) body[i] = global_[i] - body[i];
      encoded = core::SealFp32Payload(payload, kUploadEncoding);
    }
  } else {
    std::vector<float>& update = update_;
    update.resize(n);
    encoded = trainer_->GetParameters(update);
    if (encoded.ok()) {
      for (size_t i = 0; i < n; ++i) update[i] = global_[i] - update[i];
      encoded = uplink_encoder_.Encode(**codec, update, &payload, kUploadEncoding);
    }
  }
  if (!encoded.ok()) {
    // Non-finite values after training: the local model diverged. Tell the server rather than go silent.
    ReportFailure(task.task_id(), encoded);
    return;
  }

  fl::v1::UpdateHeader h;
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

FederatedClient::FederatedClient(ClientOptions options, Trainer* trainer)
    : impl_(std::make_unique<Impl>(std::move(options), trainer)) {}
FederatedClient::~FederatedClient() = default;
absl::Status FederatedClient::Run() { return impl_->Run(); }
void FederatedClient::Stop() { impl_->Stop(); }

}  // namespace fl::client
