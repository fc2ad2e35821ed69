// The gRPC face of fl-server: callback-API reactors that parse, post events to the round engine and go
// back to gRPC. No reactor blocks or decides anything (see events.h).
#pragma once

#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "fl/pki/revocation_watcher.h"
#include "fl/server/round_engine.h"
#include "fl/v1/federation.grpc.pb.h"

namespace fl::server {

class CallGuard;

// Every method is registered "raw" (its messages are grpc::ByteBuffers parsed here) so that a request that
// cannot be parsed is answered INVALID_ARGUMENT naming the message type, instead of the callback API's
// default (UNIMPLEMENTED with an empty message). The session limits of EngineConfig (messages per second,
// unread messages, hello timeout), the stream deadlines, the abuse limits per peer and per identity, and the
// identity and revocation checks of mutual TLS (peer_guard.h) are enforced here, before anything reaches the
// engine.
class FederationService final
    : public fl::v1::Federation::WithRawCallbackMethod_Join<
          fl::v1::Federation::WithRawCallbackMethod_Session<fl::v1::Federation::WithRawCallbackMethod_DownloadModel<
              fl::v1::Federation::WithRawCallbackMethod_UploadUpdate<
                  fl::v1::Federation::WithRawCallbackMethod_Leave<fl::v1::Federation::Service>>>>> {
 public:
  // `engine` must be started (its configuration holds the limits). `revocation` (may be null: none) is checked
  // for every call's certificate; both must outlive the service.
  explicit FederationService(RoundEngine* engine, const pki::RevocationWatcher* revocation = nullptr);
  ~FederationService() override;

  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Session(grpc::CallbackServerContext* ctx) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* DownloadModel(grpc::CallbackServerContext* ctx,
                                                            const grpc::ByteBuffer* request) override;
  grpc::ServerReadReactor<grpc::ByteBuffer>* UploadUpdate(grpc::CallbackServerContext* ctx,
                                                          grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Leave(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                  grpc::ByteBuffer* response) override;

 private:
  RoundEngine* engine_;
  std::unique_ptr<CallGuard> guard_;
};

}  // namespace fl::server
