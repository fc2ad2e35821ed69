#include "fl/rpc/grpc_server.h"

#include <cstdio>

#include <grpcpp/ext/proto_server_reflection_plugin.h>

#include "fl/core/str_cat.h"
#include "fl/proto/convert.h"
#include "fl/rpc/tls.h"

namespace fl::rpc {

absl::StatusOr<RunningServer> StartGrpcServer(grpc::Service* service, const std::string& listen_address) {
  return StartGrpcServer(service, listen_address, std::nullopt);
}

absl::StatusOr<RunningServer> StartGrpcServer(grpc::Service* service, const std::string& listen_address,
                                              const std::optional<ServerTls>& tls) {
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials = ServerCredentials(tls);
  if (!credentials.ok()) return credentials.status();
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  RunningServer running;
  builder.AddListeningPort(listen_address, *credentials, &running.port);
  builder.RegisterService(service);
  builder.SetMaxReceiveMessageSize(proto::kMaxMessageBytes);
  builder.SetMaxSendMessageSize(proto::kMaxMessageBytes);
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
    return absl::UnavailableError(
        fl::StrCat("cannot listen on ", listen_address,
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

}  // namespace fl::rpc
