// The gRPC service fl.v1.Islands: callback reactors that parse each call or stream message and post its event
// to the coordinator's loop; the loop answers through the event's reply (from the loop thread). Behind mutual TLS
// every call that names an island is checked against the caller's certificate here, before the loop sees it.
#include <memory>
#include <string_view>

#include "coordinator_core.h"
#include "fl/core/str_cat.h"
#include "fl/rpc/stream_outbox.h"
#include "fl/v1/islands.grpc.pb.h"

namespace fl::diloco {
namespace {

using Post = std::function<void(CoordinatorEvent)>;

// An island is who its certificate says: the name in its fl-island://<name> URI SAN (fl-provision add-island).
// Only that SAN counts, not the CN: a client certificate (fl-client://<name>, clientAuth) from the same CA must
// not pass as an island of the same name. Plaintext calls (fl-coordinator --insecure) are not checked: there is
// nothing to check them against.
grpc::Status CheckIslandCertificate(const grpc::CallbackServerContext& ctx, const std::string& claimed) {
  std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  if (auth == nullptr || !auth->IsPeerAuthenticated()) return grpc::Status::OK;
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
  if (found && name == claimed) return grpc::Status::OK;
  if (!found) {
    std::string cn;
    for (const grpc::string_ref& v : auth->FindPropertyValues("x509_common_name")) cn.assign(v.data(), v.size());
    return CoordError(grpc::StatusCode::PERMISSION_DENIED, fl::v1::ERROR_CODE_ADMISSION_REFUSED,
                      fl::StrCat("the certificate presented (CN \"", cn, "\") is not an island certificate (no ",
                                 kScheme, "<name> subjectAltName) but the call is for island_id \"", claimed, "\""),
                      "island_id",
                      fl::StrCat("give fl-island the certificate of island \"", claimed, "\": fl-provision add-island ",
                                 claimed, " --dir D writes D/islands/", claimed, ".crt and .key"));
  }
  return CoordError(
      grpc::StatusCode::PERMISSION_DENIED, fl::v1::ERROR_CODE_ADMISSION_REFUSED,
      fl::StrCat("island certificate is for \"", name, "\" but the call is for island_id \"", claimed, "\""),
      "island_id",
      fl::StrCat("run fl-island with --island-id ", name, ", or give it the certificate of island \"", claimed,
                 "\" (fl-provision add-island ", claimed, ")"));
}

// Answers a unary call with `refused` when its island_id is not the caller's certificate's; true if it did.
bool Refused(grpc::CallbackServerContext* ctx, grpc::ServerUnaryReactor* reactor, const std::string& island_id) {
  grpc::Status refused = CheckIslandCertificate(*ctx, island_id);
  if (refused.ok()) return false;
  reactor->Finish(refused);
  return true;
}

// A reply that copies the answer into gRPC's response and finishes the call (any thread, exactly once).
template <class Response>
Reply<Response> FinishWith(grpc::ServerUnaryReactor* reactor, Response* response) {
  return [reactor, response](const grpc::Status& status, const Response& r) {
    *response = r;
    reactor->Finish(status);
  };
}

// The coordinator's end of a session stream: the stream's outbox, detached when the stream is done.
class StreamSession final : public IslandSession {
 public:
  explicit StreamSession(grpc::ServerBidiReactor<fl::v1::IslandUp, fl::v1::IslandDown>* stream) : outbox_(stream) {}
  void Send(const fl::v1::IslandDown& message) override { outbox_.Send(message); }
  void Close(const grpc::Status& status) override { outbox_.Close(status); }
  rpc::StreamOutbox<fl::v1::IslandUp, fl::v1::IslandDown>& outbox() { return outbox_; }

 private:
  rpc::StreamOutbox<fl::v1::IslandUp, fl::v1::IslandDown> outbox_;
};

// Reads the session stream: the hello first (anything else closes the stream INVALID_ARGUMENT), then heartbeats.
// The hello is bound optimistically: if the loop refuses it, it closes the stream, and the heartbeats and the
// close that follow do not match the island's token and session there.
class SessionReactor final : public grpc::ServerBidiReactor<fl::v1::IslandUp, fl::v1::IslandDown> {
 public:
  SessionReactor(Post post, grpc::CallbackServerContext* ctx)
      : post_(std::move(post)), ctx_(ctx), session_(std::make_shared<StreamSession>(this)) {
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      session_->Close(grpc::Status::OK);
      return;
    }
    if (island_id_.empty()) {
      if (in_.kind_case() != fl::v1::IslandUp::kHello) {
        session_->Close(CoordError(grpc::StatusCode::INVALID_ARGUMENT, fl::v1::ERROR_CODE_MALFORMED,
                                   "the first message on an island session must be an IslandHello", "hello"));
        return;
      }
      if (grpc::Status refused = CheckIslandCertificate(*ctx_, in_.hello().island_id()); !refused.ok()) {
        session_->Close(refused);
        return;
      }
      island_id_ = in_.hello().island_id();
      token_ = in_.hello().session_token();
      post_(SessionOpenedEvent{in_.hello(), session_});
    } else if (in_.kind_case() == fl::v1::IslandUp::kHeartbeat) {
      post_(HeartbeatEvent{island_id_, token_});
    }
    StartRead(&in_);
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
  std::shared_ptr<StreamSession> session_;
  fl::v1::IslandUp in_;
  std::string island_id_;
  std::string token_;
};

class IslandsService final : public fl::v1::Islands::CallbackService {
 public:
  explicit IslandsService(Post post) : post_(std::move(post)) {}

  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* ctx, const fl::v1::IslandJoinRequest* request,
                                 fl::v1::IslandJoinResponse* response) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    if (Refused(ctx, reactor, request->island_id())) return reactor;
    post_(JoinEvent{*request, FinishWith(reactor, response)});
    return reactor;
  }

  grpc::ServerBidiReactor<fl::v1::IslandUp, fl::v1::IslandDown>* Session(grpc::CallbackServerContext* ctx) override {
    return new SessionReactor(post_, ctx);
  }

  grpc::ServerUnaryReactor* BeginSync(grpc::CallbackServerContext* ctx, const fl::v1::BeginSyncRequest* request,
                                      fl::v1::BeginSyncResponse* response) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    if (Refused(ctx, reactor, request->island_id())) return reactor;
    post_(BeginSyncEvent{*request, FinishWith(reactor, response)});
    return reactor;
  }

  grpc::ServerUnaryReactor* SyncDone(grpc::CallbackServerContext* ctx, const fl::v1::SyncDoneRequest* request,
                                     fl::v1::SyncVerdict* response) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    if (Refused(ctx, reactor, request->island_id())) return reactor;
    post_(SyncDoneEvent{*request, FinishWith(reactor, response)});
    return reactor;
  }

  grpc::ServerUnaryReactor* SyncFailed(grpc::CallbackServerContext* ctx, const fl::v1::SyncFailedRequest* request,
                                       fl::v1::SyncVerdict* response) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    if (Refused(ctx, reactor, request->island_id())) return reactor;
    post_(SyncFailedEvent{*request, FinishWith(reactor, response)});
    return reactor;
  }

  grpc::ServerUnaryReactor* StateLoaded(grpc::CallbackServerContext* ctx, const fl::v1::StateLoadedRequest* request,
                                        fl::v1::StateLoadedResponse* response) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    if (Refused(ctx, reactor, request->island_id())) return reactor;
    post_(StateLoadedEvent{*request, FinishWith(reactor, response)});
    return reactor;
  }

  grpc::ServerUnaryReactor* Leave(grpc::CallbackServerContext* ctx, const fl::v1::IslandLeaveRequest* request,
                                  fl::v1::IslandLeaveResponse* response) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    if (Refused(ctx, reactor, request->island_id())) return reactor;
    post_(LeaveEvent{*request, FinishWith(reactor, response)});
    return reactor;
  }

 private:
  Post post_;
};

}  // namespace

std::unique_ptr<grpc::Service> MakeIslandsService(std::function<void(CoordinatorEvent)> post) {
  return std::make_unique<IslandsService>(std::move(post));
}

}  // namespace fl::diloco
