#include "fl/server/service.h"

#include <atomic>
#include <cstdio>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <spdlog/spdlog.h>

#include "fl/core/log_format.h"

#include "fl/core/checksum.h"
#include "fl/core/clock.h"
#include "fl/core/str_cat.h"
#include "fl/proto/convert.h"
#include "fl/server/stream_outbox.h"

namespace fl::server {
namespace {

using fl::v1::ClientMessage;
using fl::v1::ServerMessage;

// The engine's handle on one session stream. It outlives the reactor (the engine may still hold it after
// the stream ended), so the reactor pointer is cleared in OnDone and every use checks it under the lock.
class SessionStream final : public grpc::ServerBidiReactor<ClientMessage, ServerMessage> {
 public:
  // The engine's SessionChannel over this stream's outbox.
  class Channel final : public SessionChannel {
   public:
    explicit Channel(SessionStream* stream) : outbox_(stream) {}
    void Send(ServerMessage message) override { outbox_.Send(std::move(message)); }
    void Close(const grpc::Status& status) override { outbox_.Close(status); }
    void OnWriteDone(bool ok) { outbox_.OnWriteDone(ok); }
    void Detach() { outbox_.Detach(); }

   private:
    StreamOutbox<ClientMessage, ServerMessage> outbox_;
  };

  explicit SessionStream(RoundEngine* engine) : engine_(engine), channel_(std::make_shared<Channel>(this)) {
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // The client half-closed or the stream broke: end our side too.
      channel_->Close(grpc::Status::OK);
      return;
    }
    if (!opened_) {
      if (in_.kind_case() != ClientMessage::kHello) {
        channel_->Close(wire::ToGrpcStatus(
            grpc::StatusCode::INVALID_ARGUMENT,
            wire::MakeError(fl::v1::ERROR_CODE_MALFORMED, "the first message on a session must be a SessionHello",
                            "hello", "send SessionHello with the id and token from Join")));
        return;
      }
      opened_ = true;
      engine_->Post(SessionOpenEvent{in_.hello(), channel_});
    } else {
      engine_->Post(SessionMessageEvent{channel_, in_, NowNs()});
    }
    StartRead(&in_);
  }

  void OnWriteDone(bool ok) override { channel_->OnWriteDone(ok); }

  void OnDone() override {
    channel_->Detach();
    if (opened_) engine_->Post(SessionClosedEvent{channel_});
    delete this;
  }

 private:
  RoundEngine* engine_;
  std::shared_ptr<Channel> channel_;
  ClientMessage in_;
  bool opened_ = false;
};

class DownloadStream final : public grpc::ServerWriteReactor<fl::v1::ModelChunk> {
 public:
  DownloadStream(RoundEngine* engine, const fl::v1::DownloadModelRequest& request)
      : engine_(engine), client_id_(request.client_id()), task_id_(request.task_id()), started_ns_(NowNs()) {
    chunk_bytes_ = request.max_chunk_bytes() == 0 ? wire::kDefaultChunkBytes
                                                  : std::min(request.max_chunk_bytes(), wire::kMaxChunkBytes);
    chunk_bytes_ = std::max<uint32_t>(chunk_bytes_, 1024);
    engine->Post(DownloadEvent{request, [this](const grpc::Status& status, std::shared_ptr<const ModelPayload> p) {
                                 if (!status.ok()) {
                                   Finish(status);
                                   return;
                                 }
                                 payload_ = std::move(p);
                                 fl::v1::ModelHeader* h = out_.mutable_header();
                                 h->set_model_version(payload_->model_version);
                                 h->set_round(payload_->round);
                                 *h->mutable_spec() = payload_->spec;
                                 h->set_codec(payload_->codec);
                                 h->set_payload_bytes(payload_->bytes.size());
                                 StartWrite(&out_);
                               }});
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the client went away during the download"));
      return;
    }
    if (trailer_sent_) {
      engine_->Post(DownloadDoneEvent{client_id_, task_id_, started_ns_, NowNs(), payload_->bytes.size()});
      Finish(grpc::Status::OK);
      return;
    }
    const size_t total = payload_->bytes.size();
    out_.Clear();
    if (offset_ < total) {
      const size_t n = std::min<size_t>(chunk_bytes_, total - offset_);
      out_.set_data(payload_->bytes.data() + offset_, n);
      offset_ += n;
    } else {
      out_.mutable_trailer()->set_payload_checksum(payload_->checksum);
      out_.mutable_trailer()->set_sent_server_ns(NowNs());
      trailer_sent_ = true;
    }
    StartWrite(&out_);
  }

  void OnDone() override { delete this; }

 private:
  RoundEngine* engine_;
  std::string client_id_;
  std::string task_id_;
  int64_t started_ns_;
  std::shared_ptr<const ModelPayload> payload_;
  fl::v1::ModelChunk out_;
  uint32_t chunk_bytes_ = wire::kDefaultChunkBytes;
  size_t offset_ = 0;
  bool trailer_sent_ = false;
};

class UploadStream final : public grpc::ServerReadReactor<fl::v1::UpdateChunk> {
 public:
  UploadStream(RoundEngine* engine, fl::v1::UploadUpdateResponse* response) : engine_(engine), response_(response) {
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      Fail(grpc::Status(grpc::StatusCode::CANCELLED, "the upload ended before its trailer"));
      return;
    }
    switch (stage_) {
      case Stage::kHeader:
        if (in_.part_case() != fl::v1::UpdateChunk::kHeader) {
          return Fail(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "the first message of an upload must be its header"));
        }
        header_ = in_.header();
        first_byte_ns_ = NowNs();
        stage_ = Stage::kAdmitting;
        engine_->Post(UploadStartEvent{header_, first_byte_ns_,
                                       [this](std::optional<fl::v1::UploadUpdateResponse> refusal,
                                              std::vector<uint8_t> buffer) {
                                         if (refusal.has_value()) {
                                           *response_ = std::move(*refusal);
                                           stage_ = Stage::kDone;
                                           Finish(grpc::Status::OK);
                                           return;
                                         }
                                         stage_ = Stage::kReceiving;
                                         payload_ = std::move(buffer);
                                         payload_.clear();
                                         // Nothing is reserved for what the header announces: the
                                         // buffer grows with what arrives (GrowFor).
                                         StartRead(&in_);
                                       }});
        return;
      case Stage::kReceiving:
        if (in_.part_case() == fl::v1::UpdateChunk::kData) {
          if (payload_.size() + in_.data().size() > header_.payload_bytes()) {
            return Fail(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                     fl::StrCat("the upload carries more than the ", header_.payload_bytes(),
                                                " bytes its header announced")));
          }
          GrowFor(in_.data().size());
          payload_.insert(payload_.end(), in_.data().begin(), in_.data().end());
          StartRead(&in_);
          return;
        }
        if (in_.part_case() == fl::v1::UpdateChunk::kTrailer) {
          if (payload_.size() != header_.payload_bytes()) {
            return Fail(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                     fl::StrCat("the upload ended after ", payload_.size(), " of ",
                                                header_.payload_bytes(), " announced bytes")));
          }
          if (core::Checksum64(payload_) != in_.trailer().payload_checksum()) {
            return Fail(grpc::Status(grpc::StatusCode::DATA_LOSS,
                                     "the upload's checksum does not match its bytes: a chunk was lost or damaged"));
          }
          stage_ = Stage::kDone;
          PostDone(grpc::Status::OK);
          return;
        }
        return Fail(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "a second header in one upload"));
      case Stage::kAdmitting:
      case Stage::kDone:
        return;  // a read cannot complete in these stages
    }
  }

  void OnDone() override { delete this; }

 private:
  enum class Stage { kHeader, kAdmitting, kReceiving, kDone };

  // Makes room for `incoming` more bytes. The receive buffer never holds more than what has arrived plus
  // max(one chunk, 1/8 of what has arrived), and never more than the (validated) announced size: a peer that
  // announces a huge upload and sends little costs little (issue 13: a declared 2^36-value model made the
  // server reserve 256 GiB up front and die of std::bad_alloc). Growing by 1/8 keeps the copying linear (at
  // most 8 bytes copied per byte received); a reused slot buffer (the usual case) already has the capacity.
  void GrowFor(size_t incoming) {
    const size_t needed = payload_.size() + incoming;
    if (needed <= payload_.capacity()) return;
    const size_t grown = needed + std::max(incoming, payload_.size() / 8);
    payload_.reserve(std::min<uint64_t>(grown, header_.payload_bytes()));
  }

  // A transfer failure: before admission the engine never heard of the upload; after it, the engine must
  // be told so that it frees the upload slot.
  void Fail(const grpc::Status& status) {
    if (stage_ == Stage::kReceiving) {
      stage_ = Stage::kDone;
      PostDone(status);
      return;
    }
    if (stage_ == Stage::kDone) return;
    stage_ = Stage::kDone;
    Finish(status);
  }

  void PostDone(const grpc::Status& transfer_error) {
    UploadDoneEvent done;
    done.header = header_;
    done.payload = std::move(payload_);
    done.first_byte_server_ns = first_byte_ns_;
    done.done_server_ns = NowNs();
    done.transfer_error = transfer_error;
    done.reply = [this, transfer_error](const fl::v1::UploadUpdateResponse& verdict) {
      *response_ = verdict;
      Finish(transfer_error.ok() ? grpc::Status::OK : transfer_error);
    };
    engine_->Post(std::move(done));
  }

  RoundEngine* engine_;
  fl::v1::UploadUpdateResponse* response_;
  fl::v1::UpdateChunk in_;
  fl::v1::UpdateHeader header_;
  std::vector<uint8_t> payload_;
  int64_t first_byte_ns_ = 0;
  Stage stage_ = Stage::kHeader;
};

}  // namespace

grpc::ServerUnaryReactor* FederationService::Join(grpc::CallbackServerContext* ctx, const fl::v1::JoinRequest* request,
                                                  fl::v1::JoinResponse* response) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  engine_->Post(JoinEvent{*request, ctx->peer(),
                          [reactor, response](const grpc::Status& status, const fl::v1::JoinResponse& r) {
                            *response = r;
                            reactor->Finish(status);
                          }});
  return reactor;
}

grpc::ServerBidiReactor<fl::v1::ClientMessage, fl::v1::ServerMessage>* FederationService::Session(
    grpc::CallbackServerContext* /*ctx*/) {
  return new SessionStream(engine_);
}

grpc::ServerWriteReactor<fl::v1::ModelChunk>* FederationService::DownloadModel(
    grpc::CallbackServerContext* /*ctx*/, const fl::v1::DownloadModelRequest* request) {
  return new DownloadStream(engine_, *request);
}

grpc::ServerReadReactor<fl::v1::UpdateChunk>* FederationService::UploadUpdate(grpc::CallbackServerContext* /*ctx*/,
                                                                            fl::v1::UploadUpdateResponse* response) {
  return new UploadStream(engine_, response);
}

grpc::ServerUnaryReactor* FederationService::Leave(grpc::CallbackServerContext* ctx,
                                                   const fl::v1::LeaveRequest* request,
                                                   fl::v1::LeaveResponse* response) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  engine_->Post(LeaveEvent{*request, [reactor, response](const grpc::Status& status, const fl::v1::LeaveResponse& r) {
                             *response = r;
                             reactor->Finish(status);
                           }});
  return reactor;
}

absl::StatusOr<RunningServer> StartGrpcServer(grpc::Service* service, const std::string& listen_address) {
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  RunningServer running;
  builder.AddListeningPort(listen_address, grpc::InsecureServerCredentials(), &running.port);
  builder.RegisterService(service);
  builder.SetMaxReceiveMessageSize(wire::kMaxMessageBytes);
  builder.SetMaxSendMessageSize(wire::kMaxMessageBytes);
  // Keepalive: ping idle connections every 20 s and give up after 10 s without an answer, so a client whose
  // link died is noticed in well under a minute; accept client pings as often as every 5 s.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 20000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  // Bound what the transport reads ahead of the reactors: an upload that waits for a slot must not sit in
  // gRPC's buffers instead (without this, BDP probing grows each stream's window to many MB and server
  // memory grows with the number of clients). 1 MiB per stream still fills a 250 Mbit/s link at 30 ms RTT.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 1 << 20);
  running.server = builder.BuildAndStart();
  if (running.server == nullptr || running.port == 0) {
    return absl::UnavailableError(fl::StrCat("cannot listen on ", listen_address,
                                             ": the address is invalid or the port is in use; pick another with --listen"));
  }
  return running;
}

void WritePortFile(const std::string& path, int port) {
  const std::string tmp = path + ".tmp";
  if (FILE* f = std::fopen(tmp.c_str(), "w")) {
    std::fprintf(f, "%d\n", port);
    std::fclose(f);
    std::rename(tmp.c_str(), path.c_str());
  }
}

}  // namespace fl::server
