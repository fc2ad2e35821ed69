#include "fl/server/service.h"

#include <algorithm>
#include <cctype>
#include <atomic>
#include <chrono>
#include <cstdio>

#include <grpcpp/alarm.h>
#include <spdlog/spdlog.h>

#include "fl/core/log_format.h"

#include "absl/base/thread_annotations.h"
#include "fl/core/checksum.h"
#include "fl/core/mutex.h"
#include "fl/core/str_cat.h"
#include "fl/proto/chunk_reader.h"
#include "fl/proto/convert.h"
#include "fl/rpc/raw_messages.h"
#include "fl/rpc/stream_outbox.h"
#include "peer_guard.h"

namespace fl::server {
namespace {

using fl::v1::ClientMessage;
using fl::v1::ServerMessage;

using rpc::ParseRaw;
using rpc::SerializeRaw;

grpc::Status Unparsable(std::string_view what, std::string_view type, size_t bytes) {
  return rpc::UnparsableMessage(what, type, bytes, "proto/fl/v1/federation.proto");
}

grpc::Status RateLimited(grpc::StatusCode code, std::string message, std::string hint) {
  return proto::ToGrpcStatus(
      code, proto::MakeError(fl::v1::ERROR_CODE_RATE_LIMITED, std::move(message), "", std::move(hint)));
}

// The engine's handle on one session stream. It outlives the reactor (the engine may still hold it after
// the stream ended), so the reactor pointer is cleared in OnDone and every use checks it under the lock.
class SessionStream final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  // The engine's SessionChannel over this stream's outbox (bounded: a client that does not read its stream
  // has its session closed instead of making the server buffer for it).
  class Channel final : public SessionChannel, public std::enable_shared_from_this<Channel> {
   public:
    Channel(SessionStream* stream, RoundEngine* engine) : outbox_(stream), engine_(engine) {
      const uint32_t max_queued = engine->config().session_max_queued_messages;
      outbox_.SetLimit(max_queued,
                       RateLimited(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                   fl::StrCat("the client did not read its session stream: ", max_queued,
                                              " server messages were waiting (limit --session-max-queued-messages);"
                                              " the session is closed"),
                                   "read the Session stream continuously"));
    }
    void Send(ServerMessage message) override {
      if (outbox_.Send(SerializeRaw(message)) ==
          rpc::StreamOutbox<grpc::ByteBuffer, grpc::ByteBuffer>::SendResult::kOverflowed) {
        // The engine forgets the session now, not when the stream finally ends (the client may never read).
        engine_->Post(
            SessionClosedEvent{shared_from_this(), fl::StrCat("the client did not read its session stream (limit ",
                                                              engine_->config().session_max_queued_messages,
                                                              " waiting messages, --session-max-queued-messages)")});
      }
    }
    void Close(const grpc::Status& status) override { outbox_.Close(status); }
    bool closing() { return outbox_.closing(); }
    void OnWriteDone(bool ok) { outbox_.OnWriteDone(ok); }
    void Detach() { outbox_.Detach(); }
    void MarkOpened() { opened_ = true; }
    int64_t last_received_ns() const override { return last_received_ns_.load(std::memory_order_relaxed); }
    void NoteReceived(int64_t now_ns) { last_received_ns_.store(now_ns, std::memory_order_relaxed); }
    // The hello deadline: closes the stream if no SessionHello came.
    void CloseUnlessOpened(const grpc::Status& status) {
      if (!opened_) outbox_.Close(status);
    }

   private:
    rpc::StreamOutbox<grpc::ByteBuffer, grpc::ByteBuffer> outbox_;
    RoundEngine* engine_;
    std::atomic<bool> opened_{false};
    std::atomic<int64_t> last_received_ns_{0};  // for the engine's liveness check (SessionChannel)
  };

  SessionStream(CallGuard* guard, PeerIdentity who)
      : engine_(guard->engine()),
        guard_(guard),
        who_(std::move(who)),
        channel_(std::make_shared<Channel>(this, engine_)),
        // The session's inbound messages: the rate on average, bursts up to twice it (at least 10).
        bucket_(engine_->config().session_max_messages_per_s,
                2.0 * std::max<uint32_t>(engine_->config().session_max_messages_per_s, 5)) {
    if (std::optional<Refusal> r = guard_->limits().Acquire(PeerLimits::Stream::kSession, who_); r.has_value()) {
      channel_->Close(guard_->Refuse(who_, "", *r));
      return;
    }
    holds_slot_ = true;
    RoundEngine* engine = engine_;
    const uint32_t hello_ms = engine->config().session_hello_timeout_ms;
    // The alarm's callback holds the channel, not the reactor: it may run (cancelled) after OnDone.
    hello_alarm_.Set(std::chrono::system_clock::now() + std::chrono::milliseconds(hello_ms),
                     [channel = channel_, hello_ms](bool fired) {
                       if (!fired) return;
                       channel->CloseUnlessOpened(proto::ToGrpcStatus(
                           grpc::StatusCode::DEADLINE_EXCEEDED,
                           proto::MakeError(fl::v1::ERROR_CODE_MALFORMED,
                                            fl::StrCat("no SessionHello within ", hello_ms,
                                                       " ms of opening the session (--session-hello-timeout-ms)"),
                                            "hello", "send SessionHello with the id and token from Join first")));
                     });
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // The client half-closed or the stream broke: end our side too.
      channel_->Close(grpc::Status::OK);
      return;
    }
    if (channel_->closing()) {
      // Closed for overflowing its queue: its status waits behind messages it does not read, so keep draining
      // (and dropping) what it sends, without the engine, or a client blocked in Write would never see the end.
      in_.Clear();
      StartRead(&in_);
      return;
    }
    const size_t bytes = in_.Length();
    ClientMessage message;
    if (!ParseRaw(&in_, &message)) {
      return Abandon(
          Unparsable(fl::StrCat("message ", received_ + 1, " of the Session stream"), "fl.v1.ClientMessage", bytes));
    }
    ++received_;
    const int64_t now = engine_->clock().NowNs();
    // Before anything reaches the engine: a flooding session costs the engine no more than the limit allows.
    if (!bucket_.Take(now)) {
      const uint32_t limit = engine_->config().session_max_messages_per_s;
      spdlog::warn("closing the session of client '{}': more than {} messages per second", client_id_, limit);
      return Abandon(RateLimited(
          grpc::StatusCode::RESOURCE_EXHAUSTED,
          fl::StrCat("client '", client_id_, "' sent more than ", limit,
                     " session messages per second (limit --session-max-messages-per-s); the session is closed"),
          "send heartbeats at the interval the server gave at Join"));
    }
    if (!opened_) {
      if (message.kind_case() != ClientMessage::kHello) {
        return Abandon(proto::ToGrpcStatus(
            grpc::StatusCode::INVALID_ARGUMENT,
            proto::MakeError(fl::v1::ERROR_CODE_MALFORMED, "the first message on a session must be a SessionHello",
                             "hello", "send SessionHello with the id and token from Join")));
      }
      if (std::optional<Refusal> r = guard_->CheckActingFor(who_, message.hello().client_id(), "the SessionHello");
          r.has_value()) {
        return Abandon(guard_->Refuse(who_, message.hello().client_id(), *r));
      }
      opened_ = true;
      channel_->MarkOpened();
      // For messages and logs only (the engine authenticates the hello): printable name characters, bounded.
      for (char c : message.hello().client_id().substr(0, 64)) {
        client_id_.push_back(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' ? c : '?');
      }
      channel_->NoteReceived(now);
      engine_->Post(SessionOpenEvent{message.hello(), channel_, who_.peer});
    } else {
      channel_->NoteReceived(now);
      engine_->Post(SessionMessageEvent{channel_, std::move(message), now});
    }
    StartRead(&in_);
  }

  void OnWriteDone(bool ok) override { channel_->OnWriteDone(ok); }

  void OnDone() override {
    channel_->Detach();
    if (opened_) engine_->Post(SessionClosedEvent{channel_, ""});
    if (holds_slot_) guard_->limits().Release(PeerLimits::Stream::kSession, who_);
    delete this;
  }

 private:
  // Ends the session from our side (no more reads) and has the engine forget it at once.
  void Abandon(const grpc::Status& status) {
    channel_->Close(status);
    if (opened_) engine_->Post(SessionClosedEvent{channel_, status.error_message()});
  }

  RoundEngine* engine_;
  CallGuard* guard_;
  const PeerIdentity who_;
  bool holds_slot_ = false;
  std::shared_ptr<Channel> channel_;
  grpc::ByteBuffer in_;
  TokenBucket bucket_;
  grpc::Alarm hello_alarm_;
  uint64_t received_ = 0;
  std::string client_id_;
  bool opened_ = false;
};

class DownloadStream final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  DownloadStream(CallGuard* guard, grpc::CallbackServerContext* ctx, PeerIdentity who,
                 const fl::v1::DownloadModelRequest& request)
      : engine_(guard->engine()),
        guard_(guard),
        ctx_(ctx),
        who_(std::move(who)),
        watch_(std::make_shared<Watch>()),
        client_id_(request.client_id()),
        task_id_(request.task_id()),
        started_ns_(engine_->clock().NowNs()) {
    RoundEngine* engine = engine_;
    chunk_bytes_ = request.max_chunk_bytes() == 0 ? proto::kDefaultChunkBytes
                                                  : std::min(request.max_chunk_bytes(), proto::kMaxChunkBytes);
    chunk_bytes_ = std::max<uint32_t>(chunk_bytes_, 1024);
    engine->Post(DownloadEvent{request,
                               [this](const grpc::Status& status, std::shared_ptr<const ModelPayload> p) {
                                 if (!status.ok()) {
                                   Finish(status);
                                   return;
                                 }
                                 payload_ = std::move(p);
                                 fl::v1::ModelChunk chunk;
                                 fl::v1::ModelHeader* h = chunk.mutable_header();
                                 h->set_model_version(payload_->model_version);
                                 h->set_round(payload_->round);
                                 *h->mutable_spec() = payload_->spec;
                                 h->set_codec(payload_->codec);
                                 h->set_payload_bytes(payload_->bytes.size());
                                 out_ = SerializeRaw(chunk);
                                 Write();
                               },
                               who_.peer});
  }

  void OnWriteDone(bool ok) override {
    {
      fl::RecursiveMutexLock lock(watch_->mu);
      watch_->writing = false;
    }
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the client went away during the download"));
      return;
    }
    if (trailer_sent_) {
      engine_->Post(
          DownloadDoneEvent{client_id_, task_id_, started_ns_, engine_->clock().NowNs(), payload_->bytes.size()});
      Finish(grpc::Status::OK);
      return;
    }
    const size_t total = payload_->bytes.size();
    if (offset_ < total) {
      const size_t n = std::min<size_t>(chunk_bytes_, total - offset_);
      // In place: the chunk's slice refers to the version's payload (shared by every download of it) and keeps it
      // alive until gRPC has sent it; no per-client copy of the model.
      out_ = proto::EncodeDataChunkInPlace(std::span<const uint8_t>(payload_->bytes.data() + offset_, n), payload_);
      offset_ += n;
    } else {
      fl::v1::ModelChunk chunk;
      chunk.mutable_trailer()->set_payload_checksum(payload_->checksum);
      chunk.mutable_trailer()->set_sent_server_ns(engine_->clock().NowNs());
      out_ = SerializeRaw(chunk);
      trailer_sent_ = true;
    }
    Write();
  }

  void OnDone() override {
    {
      fl::RecursiveMutexLock lock(watch_->mu);
      watch_->ctx = nullptr;
    }
    delete this;
  }

 private:
  // The per-message deadline: each write must complete (the client must read) within
  // --download-message-timeout-ms, or the call is cancelled. A client that opens downloads and never reads would
  // otherwise hold each stream, and the model version it pins, forever. The alarm's callback holds this, not the
  // reactor, which may be gone when a cancelled alarm runs.
  struct Watch {
    // Recursive, on purpose: the alarm calls TryCancel under it (holding it keeps `ctx` alive: OnDone, which
    // clears `ctx` before the call is freed, waits for it), and gRPC may run the callbacks that TryCancel makes
    // ready (this stream's OnWriteDone, even OnDone) on this thread before TryCancel returns; they take it again.
    // A plain mutex would deadlock there.
    fl::RecursiveMutex mu;
    grpc::CallbackServerContext* ctx ABSL_GUARDED_BY(mu) = nullptr;  // null after OnDone
    uint64_t seq ABSL_GUARDED_BY(mu) = 0;                            // of the write in flight
    bool writing ABSL_GUARDED_BY(mu) = false;
  };

  void Write() {
    const uint32_t timeout_ms = engine_->config().download_message_timeout_ms;
    uint64_t seq = 0;
    {
      fl::RecursiveMutexLock lock(watch_->mu);
      watch_->ctx = ctx_;
      watch_->writing = true;
      seq = ++watch_->seq;
    }
    if (timeout_ms != 0) {
      alarm_ = std::make_unique<grpc::Alarm>();  // replacing the previous one cancels it
      alarm_->Set(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms),
                  [watch = watch_, seq, guard = guard_, who = who_, client = client_id_, timeout_ms](bool fired) {
                    if (!fired) return;
                    fl::RecursiveMutexLock lock(watch->mu);
                    if (watch->ctx == nullptr || !watch->writing || watch->seq != seq) return;
                    watch->ctx->TryCancel();
                    guard->Refuse(
                        who, client,
                        Refusal{instrumentation::SecurityRefusal::kStreamDeadline,
                                grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                                             fl::StrCat("a model download chunk was not read within ", timeout_ms,
                                                        " ms (--download-message-timeout-ms); the "
                                                        "download is cancelled"))});
                  });
    }
    StartWrite(&out_);
  }

  // A ModelChunk holding `data` (field 2, bytes), encoded by hand: the payload is copied once, into the
  // message, not into a protobuf string first.
  RoundEngine* engine_;
  CallGuard* guard_;
  grpc::CallbackServerContext* ctx_;
  const PeerIdentity who_;
  std::shared_ptr<Watch> watch_;
  std::unique_ptr<grpc::Alarm> alarm_;
  std::string client_id_;
  std::string task_id_;
  int64_t started_ns_;
  std::shared_ptr<const ModelPayload> payload_;
  grpc::ByteBuffer out_;
  uint32_t chunk_bytes_ = proto::kDefaultChunkBytes;
  size_t offset_ = 0;
  bool trailer_sent_ = false;
};

class UploadStream final : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  // `guard` has given this upload a slot of `who`'s (released in OnDone).
  UploadStream(CallGuard* guard, PeerIdentity who, grpc::ByteBuffer* response)
      : engine_(guard->engine()),
        guard_(guard),
        who_(std::move(who)),
        response_(response),
        progress_(std::make_shared<Progress>(this)) {
    // The first message's deadline (the later ones are the engine's, once admitted): a peer that opens uploads and
    // sends nothing holds a stream and an upload slot of its peer's until then.
    if (const uint32_t timeout_ms = engine_->config().upload_message_timeout_ms; timeout_ms != 0) {
      header_alarm_.Set(
          std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms),
          [progress = progress_, timeout_ms](bool fired) {
            if (!fired) return;
            fl::RecursiveMutexLock lock(progress->mu);
            UploadStream* stream = progress->stream;
            if (stream == nullptr) return;
            stream->progress_->mu.AssertHeld();  // the same mutex: progress is the stream's progress_
            if (stream->stage_ != Stage::kHeader) return;
            stream->Fail(stream->guard_->Refuse(
                stream->who_, "",
                Refusal{instrumentation::SecurityRefusal::kStreamDeadline,
                        grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                                     fl::StrCat("no upload header within ", timeout_ms,
                                                " ms of opening the upload (--upload-message-timeout-ms)"))}));
          });
    }
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    fl::RecursiveMutexLock lock(progress_->mu);
    if (stage_ == Stage::kDone) return;  // revoked (or failed) while this read was pending
    if (!ok) {
      Fail(grpc::Status(grpc::StatusCode::CANCELLED, "the upload ended before its trailer"));
      return;
    }
    const size_t bytes = in_.Length();
    if (stage_ == Stage::kReceiving) {
      // A data chunk is read in place from gRPC's slices into the payload, its checksum updated as it passes
      // (no protobuf string, no second pass); anything else goes to protobuf's parser below.
      progress_->last_ns = engine_->clock().NowNs();
      absl::StatusOr<proto::DataChunkReader::Kind> kind =
          chunk_reader_.Read(in_, header_.payload_bytes() - payload_.size(),
                             [this](std::span<const uint8_t> piece) ABSL_EXCLUSIVE_LOCKS_REQUIRED(progress_->mu) {
                               GrowFor(piece.size());
                               payload_.insert(payload_.end(), piece.begin(), piece.end());
                               checksum_.Update(piece);
                             });
      if (!kind.ok()) {
        return Fail(
            grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                         kind.status().code() == absl::StatusCode::kOutOfRange
                             ? fl::StrCat("the upload carries more than the ", header_.payload_bytes(),
                                          " bytes its header announced")
                             : fl::StrCat("message ", received_ + 1, " of the upload: ", kind.status().message())));
      }
      if (*kind == proto::DataChunkReader::Kind::kData) {
        ++received_;
        progress_->received_bytes = payload_.size();
        StartRead(&in_);
        return;
      }
    }
    fl::v1::UpdateChunk chunk;
    if (!ParseRaw(&in_, &chunk)) {
      return Fail(Unparsable(fl::StrCat("message ", received_ + 1, " of the upload"), "fl.v1.UpdateChunk", bytes));
    }
    ++received_;
    switch (stage_) {
      case Stage::kHeader:
        if (chunk.part_case() != fl::v1::UpdateChunk::kHeader) {
          return Fail(
              grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "the first message of an upload must be its header"));
        }
        header_ = std::move(*chunk.mutable_header());
        if (std::optional<Refusal> r = guard_->CheckActingFor(who_, header_.client_id(), "the upload"); r.has_value()) {
          return Fail(guard_->Refuse(who_, header_.client_id(), *r));
        }
        first_byte_ns_ = engine_->clock().NowNs();
        stage_ = Stage::kAdmitting;
        engine_->Post(
            UploadStartEvent{header_, first_byte_ns_,
                             [this](std::optional<fl::v1::UploadUpdateResponse> refusal, std::vector<uint8_t> buffer) {
                               fl::RecursiveMutexLock admit_lock(progress_->mu);
                               if (refusal.has_value()) {
                                 *response_ = SerializeRaw(*refusal);
                                 stage_ = Stage::kDone;
                                 Finish(grpc::Status::OK);
                                 return;
                               }
                               stage_ = Stage::kReceiving;
                               payload_ = std::move(buffer);
                               payload_.clear();
                               // An update of the experiment's model (a size the server
                               // knows, checked against the header) gets its whole buffer
                               // now, so nothing is copied as it arrives. An initial model's
                               // size is only its sender's claim: that buffer grows with what
                               // arrives (GrowFor).
                               if (header_.kind() != fl::v1::UPDATE_KIND_INITIAL_MODEL) {
                                 payload_.reserve(header_.payload_bytes());
                               }
                               StartRead(&in_);
                             },
                             progress_, who_.peer});
        return;
      case Stage::kReceiving:
        progress_->last_ns = engine_->clock().NowNs();
        if (chunk.part_case() == fl::v1::UpdateChunk::kData) {
          if (payload_.size() + chunk.data().size() > header_.payload_bytes()) {
            return Fail(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                     fl::StrCat("the upload carries more than the ", header_.payload_bytes(),
                                                " bytes its header announced")));
          }
          GrowFor(chunk.data().size());
          payload_.insert(payload_.end(), chunk.data().begin(), chunk.data().end());
          checksum_.Update(
              std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(chunk.data().data()), chunk.data().size()));
          progress_->received_bytes = payload_.size();
          StartRead(&in_);
          return;
        }
        if (chunk.part_case() == fl::v1::UpdateChunk::kTrailer) {
          if (payload_.size() != header_.payload_bytes()) {
            return Fail(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                     fl::StrCat("the upload ended after ", payload_.size(), " of ",
                                                header_.payload_bytes(), " announced bytes")));
          }
          if (checksum_.Digest() != chunk.trailer().payload_checksum()) {
            return Fail(grpc::Status(grpc::StatusCode::DATA_LOSS,
                                     "the upload's checksum (XXH3-64) does not match its bytes: a chunk was lost or "
                                     "damaged"));
          }
          stage_ = Stage::kDone;
          PostDone(grpc::Status::OK);
          return;
        }
        return Fail(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "a second header in one upload"));
      case Stage::kAdmitting:
      case Stage::kDone: return;  // a read cannot complete in these stages
    }
  }

  void OnDone() override {
    {
      fl::RecursiveMutexLock lock(progress_->mu);
      progress_->stream = nullptr;
    }
    guard_->limits().Release(PeerLimits::Stream::kUpload, who_);
    delete this;
  }

 private:
  enum class Stage { kHeader, kAdmitting, kReceiving, kDone };

  // Makes room for `incoming` more bytes (an initial model's; an update has its buffer already). The receive
  // buffer never holds more than what has arrived plus max(one chunk, 1/8 of what has arrived), and never
  // more than the (validated) announced size: a peer that announces a huge upload and sends little costs
  // little (issue 13: a declared 2^36-value model made the server reserve 256 GiB up front and die of
  // std::bad_alloc). Growing by 1/8 keeps the copying linear (at most 8 bytes copied per byte received).
  void GrowFor(size_t incoming) ABSL_EXCLUSIVE_LOCKS_REQUIRED(progress_->mu) {
    const size_t needed = payload_.size() + incoming;
    if (needed <= payload_.capacity()) return;
    const size_t grown = needed + std::max(incoming, payload_.size() / 8);
    payload_.reserve(std::min<uint64_t>(grown, header_.payload_bytes()));
  }

  // The engine's handle: progress counters the engine reads on its timer, and Revoke. `mu` also serialises
  // the reactor's own callbacks (reads, admission, revocation come from different threads): the reactor's state
  // below is guarded by it.
  struct Progress final : UploadHandle {
    explicit Progress(UploadStream* s) : stream(s) {}
    uint64_t bytes_received() const override { return received_bytes.load(); }
    int64_t last_message_ns() const override { return last_ns.load(); }
    void Revoke(const grpc::Status& status) override {
      fl::RecursiveMutexLock lock(mu);
      if (stream == nullptr) return;
      stream->progress_->mu.AssertHeld();  // the same mutex: the stream's progress_ is this
      if (stream->stage_ == Stage::kReceiving) {
        stream->stage_ = Stage::kDone;
        stream->PostDone(status);
      }
    }
    // Recursive, on purpose, for the same reason as the download's Watch: Finish and StartRead are called under it
    // from threads outside gRPC's callbacks (the engine's: admission, the verdict; the header alarm), and gRPC may
    // run the callbacks they make ready (OnReadDone, OnDone, which take it) on that thread before they return.
    fl::RecursiveMutex mu;
    UploadStream* stream ABSL_GUARDED_BY(mu);  // null after OnDone
    std::atomic<uint64_t> received_bytes{0};
    std::atomic<int64_t> last_ns{0};
  };

  // A transfer failure: before admission the engine never heard of the upload; after it, the engine must
  // be told so that it frees the upload slot.
  void Fail(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(progress_->mu) {
    if (stage_ == Stage::kReceiving) {
      stage_ = Stage::kDone;
      PostDone(status);
      return;
    }
    if (stage_ == Stage::kDone) return;
    stage_ = Stage::kDone;
    Finish(status);
  }

  void PostDone(const grpc::Status& transfer_error) ABSL_EXCLUSIVE_LOCKS_REQUIRED(progress_->mu) {
    UploadDoneEvent done;
    done.header = header_;
    done.payload = std::move(payload_);
    done.first_byte_server_ns = first_byte_ns_;
    done.done_server_ns = engine_->clock().NowNs();
    done.transfer_error = transfer_error;
    done.handle = progress_;
    done.reply = [this, transfer_error](const fl::v1::UploadUpdateResponse& verdict) {
      fl::RecursiveMutexLock lock(progress_->mu);
      *response_ = SerializeRaw(verdict);
      Finish(transfer_error.ok() ? grpc::Status::OK : transfer_error);
    };
    engine_->Post(std::move(done));
  }

  RoundEngine* engine_;
  CallGuard* guard_;
  const PeerIdentity who_;
  grpc::ByteBuffer* response_;
  std::shared_ptr<Progress> progress_;
  grpc::Alarm header_alarm_;
  grpc::ByteBuffer in_;
  fl::v1::UpdateHeader header_ ABSL_GUARDED_BY(progress_->mu);
  std::vector<uint8_t> payload_ ABSL_GUARDED_BY(progress_->mu);
  core::TransferChecksum checksum_ ABSL_GUARDED_BY(progress_->mu);  // XXH3 of payload_, updated as chunks arrive
  proto::DataChunkReader chunk_reader_ ABSL_GUARDED_BY(progress_->mu);
  uint64_t received_ ABSL_GUARDED_BY(progress_->mu) = 0;
  int64_t first_byte_ns_ ABSL_GUARDED_BY(progress_->mu) = 0;
  Stage stage_ ABSL_GUARDED_BY(progress_->mu) = Stage::kHeader;
};

// A read reactor that only finishes: the answer to an upload refused before its first message.
class RefusedUpload final : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  explicit RefusedUpload(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

// A write reactor that only finishes: the answer to a download request that cannot be parsed.
class RefusedDownload final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  explicit RefusedDownload(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};
}  // namespace

FederationService::FederationService(RoundEngine* engine, const pki::RevocationWatcher* revocation)
    : engine_(engine), guard_(std::make_unique<CallGuard>(engine, revocation)) {}

FederationService::~FederationService() = default;

grpc::ServerUnaryReactor* FederationService::Join(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                                  grpc::ByteBuffer* response) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  grpc::ByteBuffer bytes(*request);
  fl::v1::JoinRequest req;
  if (!ParseRaw(&bytes, &req)) {
    reactor->Finish(Unparsable("the Join request's bytes", "fl.v1.JoinRequest", request->Length()));
    return reactor;
  }
  // The join rates first: every Join, whatever it claims, spends its peer's and certificate's tokens, so that a
  // flood of Joins under other names costs the server no more than the rate allows (issue 27: the name check ran
  // first, and 1,000 Joins under other names were 1,000 name_mismatch refusals). Then, over mutual TLS, the
  // client's name is its certificate's: a Join under another name is refused before the engine sees it, so that
  // one provisioned client cannot take another's place.
  const PeerIdentity who = IdentifyPeer(*ctx);
  std::optional<Refusal> refusal = guard_->limits().TakeJoin(who, engine_->clock().NowNs());
  if (!refusal.has_value()) refusal = guard_->CheckJoin(who, req.client_name());
  if (refusal.has_value()) {
    reactor->Finish(guard_->Refuse(who, req.client_name(), *refusal));
    return reactor;
  }
  // Load shedding (docs/round-engine.md, "Fleets and overload"): while the engine is behind, a Join is answered
  // here, with a retry-after, instead of adding to its queue; the sessions it serves keep going.
  const uint32_t retry_after_ms = engine_->config().join_retry_after_ms;
  if (engine_->ShedJoins()) {
    engine_->NoteShedJoin();
    ctx->AddTrailingMetadata("retry-after-ms", std::to_string(retry_after_ms));
    reactor->Finish(proto::ToGrpcStatus(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        proto::MakeError(fl::v1::ERROR_CODE_RATE_LIMITED,
                         fl::StrCat("fl-server is overloaded: ", engine_->QueuedEvents(),
                                    " events wait for its engine (limit --max-engine-queue=",
                                    engine_->config().max_engine_queue, "); the Join is not queued"),
                         "", fl::StrCat("retry after ", retry_after_ms, " ms (trailing metadata retry-after-ms)"))));
    return reactor;
  }
  engine_->Post(
      JoinEvent{std::move(req), who.peer,
                [reactor, response, ctx, retry_after_ms](const grpc::Status& status, const fl::v1::JoinResponse& r) {
                  // The engine's refusals that a later attempt can pass (the session limit).
                  if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED &&
                      r.error().code() == fl::v1::ERROR_CODE_RATE_LIMITED) {
                    ctx->AddTrailingMetadata("retry-after-ms", std::to_string(retry_after_ms));
                  }
                  *response = SerializeRaw(r);
                  reactor->Finish(status);
                },
                who.serial_hex});
  return reactor;
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* FederationService::Session(
    grpc::CallbackServerContext* ctx) {
  return new SessionStream(guard_.get(), IdentifyPeer(*ctx));
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* FederationService::DownloadModel(grpc::CallbackServerContext* ctx,
                                                                             const grpc::ByteBuffer* request) {
  grpc::ByteBuffer bytes(*request);
  fl::v1::DownloadModelRequest req;
  if (!ParseRaw(&bytes, &req)) {
    return new RefusedDownload(
        Unparsable("the DownloadModel request's bytes", "fl.v1.DownloadModelRequest", request->Length()));
  }
  PeerIdentity who = IdentifyPeer(*ctx);
  if (std::optional<Refusal> r = guard_->CheckActingFor(who, req.client_id(), "the download"); r.has_value()) {
    return new RefusedDownload(guard_->Refuse(who, req.client_id(), *r));
  }
  return new DownloadStream(guard_.get(), ctx, std::move(who), req);
}

grpc::ServerReadReactor<grpc::ByteBuffer>* FederationService::UploadUpdate(grpc::CallbackServerContext* ctx,
                                                                           grpc::ByteBuffer* response) {
  PeerIdentity who = IdentifyPeer(*ctx);
  if (std::optional<Refusal> r = guard_->limits().Acquire(PeerLimits::Stream::kUpload, who); r.has_value()) {
    return new RefusedUpload(guard_->Refuse(who, "", *r));
  }
  return new UploadStream(guard_.get(), std::move(who), response);
}

grpc::ServerUnaryReactor* FederationService::Leave(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                                   grpc::ByteBuffer* response) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  grpc::ByteBuffer bytes(*request);
  fl::v1::LeaveRequest req;
  if (!ParseRaw(&bytes, &req)) {
    reactor->Finish(Unparsable("the Leave request's bytes", "fl.v1.LeaveRequest", request->Length()));
    return reactor;
  }
  const PeerIdentity who = IdentifyPeer(*ctx);
  if (std::optional<Refusal> r = guard_->CheckActingFor(who, req.client_id(), "the Leave"); r.has_value()) {
    reactor->Finish(guard_->Refuse(who, req.client_id(), *r));
    return reactor;
  }
  engine_->Post(LeaveEvent{std::move(req),
                           [reactor, response](const grpc::Status& status, const fl::v1::LeaveResponse& r) {
                             *response = SerializeRaw(r);
                             reactor->Finish(status);
                           },
                           who.peer});
  return reactor;
}

}  // namespace fl::server
