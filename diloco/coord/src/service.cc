// The gRPC service fl.v1.Islands: callback reactors that parse each call or stream message and post its event
// to the coordinator's loop; the loop answers through the event's reply (from the loop thread). Behind mutual TLS
// every call that names an island is checked against the caller's certificate (and the revocation list, with
// --tls-crl) here, before the loop sees it.
//
// Every method is registered raw (its messages are grpc::ByteBuffers parsed here), as fl-server's are: a message
// that cannot be parsed is answered INVALID_ARGUMENT naming its type (ERROR_CODE_MALFORMED), not with the callback
// API's default, an UNIMPLEMENTED with an empty message (issue 27).
#include <memory>
#include <string_view>

#include <spdlog/spdlog.h>

#include "coordinator_core.h"
#include "fl/core/log_format.h"
#include "fl/core/str_cat.h"
#include "fl/pki/revocation.h"
#include "fl/pki/revocation_watcher.h"
#include "fl/rpc/raw_messages.h"
#include "fl/rpc/stream_outbox.h"
#include "fl/v1/islands.grpc.pb.h"

namespace fl::diloco {
namespace {

using Post = std::function<void(CoordinatorEvent)>;

using rpc::ParseRaw;
using rpc::SerializeRaw;

grpc::Status Unparsable(std::string_view what, std::string_view type, size_t bytes) {
  return rpc::UnparsableMessage(what, type, bytes, "proto/fl/v1/islands.proto");
}

// What the certificate check found: the refusal, or OK and (with a revocation list) the certificate's serial.
struct CertificateCheck {
  grpc::Status status;
  std::string serial_hex;
};

// The serial of the caller's certificate (pki::ParsePeerCertificate), or "" when it cannot be read.
std::string SerialOf(const grpc::AuthContext& auth) {
  for (const grpc::string_ref& pem : auth.FindPropertyValues("x509_pem_cert")) {
    absl::StatusOr<pki::PeerCertificate> cert = pki::ParsePeerCertificate(std::string_view(pem.data(), pem.size()));
    if (cert.ok()) return cert->serial_hex;
    // gRPC verified this certificate a moment ago; a parse failure is OpenSSL disagreeing with itself.
    spdlog::error("cannot read the serial of a verified island certificate: {}", cert.status().message());
  }
  return "";
}

// An island is who its certificate says: the name in its fl-island://<name> URI SAN (fl-provision add-island).
// Only that SAN counts, not the CN: a client certificate (fl-client://<name>, clientAuth) from the same CA must
// not pass as an island of the same name. With a revocation list (fl-coordinator --tls-crl), a certificate on it
// is refused whatever it names: gRPC checked it once, at the handshake, and HTTP/2 keeps that connection for every
// later call. Plaintext calls (fl-coordinator --insecure) are not checked: there is nothing to check them against.
CertificateCheck CheckIslandCertificate(const grpc::CallbackServerContext& ctx, const std::string& claimed,
                                        const pki::RevocationWatcher* revocation) {
  std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  if (auth == nullptr || !auth->IsPeerAuthenticated()) return {};
  constexpr std::string_view kScheme = "fl-island://";
  std::string name;
  bool found = false;
  for (const grpc::string_ref& v : auth->FindPropertyValues("x509_subject_alternative_name")) {
    const std::string_view san(v.data(), v.size());
    if (san.substr(0, kScheme.size()) == kScheme) {
      name = san.substr(kScheme.size());
      found = true;
    }
  }
  CertificateCheck check;
  if (revocation != nullptr) {
    check.serial_hex = SerialOf(*auth);
    if (!check.serial_hex.empty() && revocation->IsRevoked(check.serial_hex)) {
      const std::string who = found ? fl::StrCat("island \"", name, "\"") : std::string("the caller");
      check.status = CoordError(grpc::StatusCode::PERMISSION_DENIED, fl::v1::ERROR_CODE_ADMISSION_REFUSED,
                                fl::StrCat("the certificate of ", who, " (serial ", check.serial_hex, ") is revoked (",
                                           revocation->options().crl_file, ")"),
                                "", "ask the operator for a new island certificate (fl-provision add-island --force)");
      spdlog::warn("refused a call from {}: {}", ctx.peer(), check.status.error_message());
      return check;
    }
  }
  if (found && name == claimed) return check;
  if (!found) {
    std::string cn;
    for (const grpc::string_ref& v : auth->FindPropertyValues("x509_common_name")) cn.assign(v.data(), v.size());
    check.status =
        CoordError(grpc::StatusCode::PERMISSION_DENIED, fl::v1::ERROR_CODE_ADMISSION_REFUSED,
                   fl::StrCat("the certificate presented (CN \"", cn, "\") is not an island certificate (no ", kScheme,
                              "<name> subjectAltName) but the call is for island_id \"", claimed, "\""),
                   "island_id",
                   fl::StrCat("give fl-island the certificate of island \"", claimed, "\": fl-provision add-island ",
                              claimed, " --dir D writes D/islands/", claimed, ".crt and .key"));
    return check;
  }
  check.status =
      CoordError(grpc::StatusCode::PERMISSION_DENIED, fl::v1::ERROR_CODE_ADMISSION_REFUSED,
                 fl::StrCat("island certificate is for \"", name, "\" but the call is for island_id \"", claimed, "\""),
                 "island_id",
                 fl::StrCat("run fl-island with --island-id ", name, ", or give it the certificate of island \"",
                            claimed, "\" (fl-provision add-island ", claimed, ")"));
  return check;
}

// Answers a unary call with the refusal when its island_id is not the caller's certificate's, or that
// certificate is revoked; true if it did.
bool Refused(grpc::CallbackServerContext* ctx, grpc::ServerUnaryReactor* reactor, const std::string& island_id,
             const pki::RevocationWatcher* revocation, std::string* serial_hex = nullptr) {
  CertificateCheck check = CheckIslandCertificate(*ctx, island_id, revocation);
  if (serial_hex != nullptr) *serial_hex = std::move(check.serial_hex);
  if (check.status.ok()) return false;
  reactor->Finish(check.status);
  return true;
}

// A reply that copies the answer into gRPC's response and finishes the call (any thread, exactly once).
template <class Response>
Reply<Response> FinishWith(grpc::ServerUnaryReactor* reactor, grpc::ByteBuffer* response) {
  return [reactor, response](const grpc::Status& status, const Response& r) {
    *response = SerializeRaw(r);
    reactor->Finish(status);
  };
}

// The coordinator's end of a session stream: the stream's outbox, detached when the stream is done.
class StreamSession final : public IslandSession {
 public:
  explicit StreamSession(grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* stream) : outbox_(stream) {}
  void Send(const fl::v1::IslandDown& message) override { outbox_.Send(SerializeRaw(message)); }
  void Close(const grpc::Status& status) override { outbox_.Close(status); }
  rpc::StreamOutbox<grpc::ByteBuffer, grpc::ByteBuffer>& outbox() { return outbox_; }

 private:
  rpc::StreamOutbox<grpc::ByteBuffer, grpc::ByteBuffer> outbox_;
};

// Reads the session stream: the hello first (anything else closes the stream INVALID_ARGUMENT), then heartbeats;
// a message that does not parse closes it INVALID_ARGUMENT naming fl.v1.IslandUp.
// The hello is bound optimistically: if the loop refuses it, it closes the stream, and the heartbeats and the
// close that follow do not match the island's token and session there.
class SessionReactor final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  SessionReactor(Post post, grpc::CallbackServerContext* ctx, const pki::RevocationWatcher* revocation)
      : post_(std::move(post)), ctx_(ctx), revocation_(revocation), session_(std::make_shared<StreamSession>(this)) {
    StartRead(&raw_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      session_->Close(grpc::Status::OK);
      return;
    }
    const size_t bytes = raw_.Length();
    in_.Clear();
    if (!ParseRaw(&raw_, &in_)) {
      session_->Close(
          Unparsable(fl::StrCat("message ", received_ + 1, " of the island session"), "fl.v1.IslandUp", bytes));
      return;
    }
    ++received_;
    if (island_id_.empty()) {
      if (in_.kind_case() != fl::v1::IslandUp::kHello) {
        session_->Close(CoordError(grpc::StatusCode::INVALID_ARGUMENT, fl::v1::ERROR_CODE_MALFORMED,
                                   "the first message on an island session must be an IslandHello", "hello"));
        return;
      }
      CertificateCheck check = CheckIslandCertificate(*ctx_, in_.hello().island_id(), revocation_);
      if (!check.status.ok()) {
        session_->Close(check.status);
        return;
      }
      island_id_ = in_.hello().island_id();
      token_ = in_.hello().session_token();
      post_(SessionOpenedEvent{in_.hello(), session_, std::move(check.serial_hex)});
    } else if (in_.kind_case() == fl::v1::IslandUp::kHeartbeat) {
      post_(HeartbeatEvent{island_id_, token_});
    }
    StartRead(&raw_);
  }

  void OnWriteDone(bool ok) override { session_->outbox().OnWriteDone(ok); }

  void OnDone() override {
    session_->outbox().Detach();
    if (!island_id_.empty()) post_(SessionClosedEvent{island_id_, token_, session_});
    delete this;
  }

 private:
  Post post_;
  grpc::CallbackServerContext* ctx_;  // valid until OnDone
  const pki::RevocationWatcher* revocation_;
  std::shared_ptr<StreamSession> session_;
  grpc::ByteBuffer raw_;
  fl::v1::IslandUp in_;
  uint64_t received_ = 0;
  std::string island_id_;
  std::string token_;
};

// A unary method's request parsed from its raw bytes, or the call answered INVALID_ARGUMENT naming its type.
template <class Request>
bool ParseRequest(grpc::ServerUnaryReactor* reactor, const grpc::ByteBuffer* raw, std::string_view method,
                  std::string_view type, Request* request) {
  grpc::ByteBuffer bytes(*raw);
  if (ParseRaw(&bytes, request)) return true;
  reactor->Finish(Unparsable(fl::StrCat("the ", method, " request's bytes"), type, raw->Length()));
  return false;
}

using RawIslandsService = fl::v1::Islands::WithRawCallbackMethod_Join<fl::v1::Islands::WithRawCallbackMethod_Session<
    fl::v1::Islands::WithRawCallbackMethod_BeginSync<fl::v1::Islands::WithRawCallbackMethod_SyncDone<
        fl::v1::Islands::WithRawCallbackMethod_SyncFailed<fl::v1::Islands::WithRawCallbackMethod_StateLoaded<
            fl::v1::Islands::WithRawCallbackMethod_Leave<fl::v1::Islands::Service>>>>>>>;

class IslandsService final : public RawIslandsService {
 public:
  IslandsService(Post post, const pki::RevocationWatcher* revocation)
      : post_(std::move(post)), revocation_(revocation) {}

  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
                                 grpc::ByteBuffer* response) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    fl::v1::IslandJoinRequest request;
    if (!ParseRequest(reactor, raw, "Join", "fl.v1.IslandJoinRequest", &request)) return reactor;
    std::string serial_hex;
    if (Refused(ctx, reactor, request.island_id(), revocation_, &serial_hex)) return reactor;
    post_(JoinEvent{std::move(request), FinishWith<fl::v1::IslandJoinResponse>(reactor, response),
                    std::move(serial_hex)});
    return reactor;
  }

  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Session(grpc::CallbackServerContext* ctx) override {
    return new SessionReactor(post_, ctx, revocation_);
  }

  grpc::ServerUnaryReactor* BeginSync(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
                                      grpc::ByteBuffer* response) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    fl::v1::BeginSyncRequest request;
    if (!ParseRequest(reactor, raw, "BeginSync", "fl.v1.BeginSyncRequest", &request)) return reactor;
    if (Refused(ctx, reactor, request.island_id(), revocation_)) return reactor;
    post_(BeginSyncEvent{std::move(request), FinishWith<fl::v1::BeginSyncResponse>(reactor, response)});
    return reactor;
  }

  grpc::ServerUnaryReactor* SyncDone(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
                                     grpc::ByteBuffer* response) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    fl::v1::SyncDoneRequest request;
    if (!ParseRequest(reactor, raw, "SyncDone", "fl.v1.SyncDoneRequest", &request)) return reactor;
    if (Refused(ctx, reactor, request.island_id(), revocation_)) return reactor;
    post_(SyncDoneEvent{std::move(request), FinishWith<fl::v1::SyncVerdict>(reactor, response)});
    return reactor;
  }

  grpc::ServerUnaryReactor* SyncFailed(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
                                       grpc::ByteBuffer* response) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    fl::v1::SyncFailedRequest request;
    if (!ParseRequest(reactor, raw, "SyncFailed", "fl.v1.SyncFailedRequest", &request)) return reactor;
    if (Refused(ctx, reactor, request.island_id(), revocation_)) return reactor;
    post_(SyncFailedEvent{std::move(request), FinishWith<fl::v1::SyncVerdict>(reactor, response)});
    return reactor;
  }

  grpc::ServerUnaryReactor* StateLoaded(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
                                        grpc::ByteBuffer* response) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    fl::v1::StateLoadedRequest request;
    if (!ParseRequest(reactor, raw, "StateLoaded", "fl.v1.StateLoadedRequest", &request)) return reactor;
    if (Refused(ctx, reactor, request.island_id(), revocation_)) return reactor;
    post_(StateLoadedEvent{std::move(request), FinishWith<fl::v1::StateLoadedResponse>(reactor, response)});
    return reactor;
  }

  grpc::ServerUnaryReactor* Leave(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
                                  grpc::ByteBuffer* response) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    fl::v1::IslandLeaveRequest request;
    if (!ParseRequest(reactor, raw, "Leave", "fl.v1.IslandLeaveRequest", &request)) return reactor;
    if (Refused(ctx, reactor, request.island_id(), revocation_)) return reactor;
    post_(LeaveEvent{std::move(request), FinishWith<fl::v1::IslandLeaveResponse>(reactor, response)});
    return reactor;
  }

 private:
  Post post_;
  const pki::RevocationWatcher* revocation_;  // null: no revocation list
};

}  // namespace

std::unique_ptr<grpc::Service> MakeIslandsService(std::function<void(CoordinatorEvent)> post,
                                                  const pki::RevocationWatcher* revocation) {
  return std::make_unique<IslandsService>(std::move(post), revocation);
}

}  // namespace fl::diloco
