// The gRPC face of fl-server: callback-API reactors that parse, post events to the round engine and go
// back to gRPC. No reactor blocks or decides anything (see events.h).
#pragma once

#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "fl/server/round_engine.h"
#include "fl/v1/federation.grpc.pb.h"

namespace fl::server {

class FederationService final : public fl::v1::Federation::CallbackService {
 public:
  explicit FederationService(RoundEngine* engine) : engine_(engine) {}

  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* ctx, const fl::v1::JoinRequest* request,
                                 fl::v1::JoinResponse* response) override;
  grpc::ServerBidiReactor<fl::v1::ClientMessage, fl::v1::ServerMessage>* Session(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerWriteReactor<fl::v1::ModelChunk>* DownloadModel(grpc::CallbackServerContext* ctx,
                                                              const fl::v1::DownloadModelRequest* request) override;
  grpc::ServerReadReactor<fl::v1::UpdateChunk>* UploadUpdate(grpc::CallbackServerContext* ctx,
                                                             fl::v1::UploadUpdateResponse* response) override;
  grpc::ServerUnaryReactor* Leave(grpc::CallbackServerContext* ctx, const fl::v1::LeaveRequest* request,
                                  fl::v1::LeaveResponse* response) override;

 private:
  RoundEngine* engine_;
};

// Builds and starts a gRPC server for `service` on `listen_address` ("0.0.0.0:50051"; port 0 picks a free
// one) with the project's limits: message sizes above the chunk size, keepalive pings so that dead links
// are noticed, and server reflection for grpcurl.
struct RunningServer {
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};
absl::StatusOr<RunningServer> StartGrpcServer(grpc::Service* service, const std::string& listen_address);

// --port-file: writes "<port>\n" to `path` through a temporary file and a rename, so that whoever waits for
// the file (tests, scripts that started the server on port 0) never reads half of it. Best effort: a path
// that cannot be written is left alone.
void WritePortFile(const std::string& path, int port);

}  // namespace fl::server
