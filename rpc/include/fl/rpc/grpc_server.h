// Starting the project's gRPC servers (fl-server's Federation service, the islands coordinator, islands' state
// servers) with one set of transport settings, and announcing the port they got.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "fl/rpc/tls.h"

namespace fl::rpc {

// Builds and starts a gRPC server for `service` on `listen_address` ("0.0.0.0:50051"; port 0 picks a free
// one) with the project's limits: message sizes above the chunk size, keepalive pings so that dead links
// are noticed, bounded read-ahead, and server reflection for grpcurl.
struct RunningServer {
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};
absl::StatusOr<RunningServer> StartGrpcServer(grpc::Service* service, const std::string& listen_address);

// As above; with `tls`, the listening port takes only mutually authenticated TLS connections. Without it
// (std::nullopt), plaintext as before: the default until TLS is switched on everywhere. A file that cannot be
// read is an InvalidArgument naming the file and its flag.
absl::StatusOr<RunningServer> StartGrpcServer(grpc::Service* service, const std::string& listen_address,
                                              const std::optional<ServerTls>& tls);

// --port-file: writes "<port>\n" to `path` through a temporary file and a rename, so that whoever waits for
// the file (tests, scripts that started the server on port 0) never reads half of it. Best effort: a path
// that cannot be written is left alone.
void WritePortFile(const std::string& path, int port);

}  // namespace fl::rpc
