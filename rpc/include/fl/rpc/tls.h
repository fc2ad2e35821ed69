// Mutual TLS credentials for both ends of the project's gRPC channels, from PEM files as fl-provision writes them
// (docs/security.md). One reader of those files, so that a path that cannot be read is reported the same way, by
// the flag that named it, on the server and on the client — not later as a handshake failure.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"

namespace fl::rpc {

// A server's side (fl-server --tls-cert/--tls-key/--tls-client-ca). Every client must present a certificate that
// chains to client_ca_file, or the handshake fails before any RPC reaches the service.
struct ServerTls {
  std::string cert_file;       // the server's certificate (chain)
  std::string key_file;        // its private key
  std::string client_ca_file;  // the CA that client certificates must chain to
};

// A client's side (fl-client --tls-ca/--tls-cert/--tls-key). The server's certificate must chain to ca_file and
// name the host of the address dialled; cert_file carries the client's name.
struct ClientTls {
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
  // The name (DNS or IP) the server's certificate is checked against instead of the dialled host; "" = the
  // dialled host. For a client that reaches the server through a relay (fl-experiment's namespace links dial
  // 10.213.x.1, a forwarder to the server on 127.0.0.1). Set on the channel by whoever creates it
  // (grpc::ChannelArguments::SetSslTargetNameOverride).
  std::string server_name;
};

// What a server's security flags ask for (fl-server, fl-coordinator: --tls-cert/--tls-key/--tls-client-ca,
// --tls-crl, --insecure), checked in one place so that both servers refuse the same mistakes the same way.
struct ServerSecurityFlags {
  ServerTls tls;
  std::string crl_file;  // --tls-crl; needs mutual TLS
  bool insecure = false;
};
// Mutual TLS when all three TLS flags are given, nullopt (plaintext) when only --insecure is; anything else is an
// InvalidArgument saying which flags go together. Secure by default: plaintext only when asked for by name, so
// that a forgotten flag never serves the model to whoever reaches the port. `provision_hint` names the
// fl-provision commands that make this server's certificates.
absl::StatusOr<std::optional<ServerTls>> ResolveServerSecurity(const ServerSecurityFlags& flags,
                                                               std::string_view provision_hint);
// The warning --insecure prints: "--insecure: serving plaintext gRPC: anyone who reaches <listen> can <exposes>; ...".
std::string InsecureServerWarning(std::string_view listen, std::string_view exposes);

// Insecure credentials without `tls` (plaintext: the binaries only ask for it with --insecure). A file that
// cannot be read, or is empty, is an InvalidArgument naming the file and its flag.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(const std::optional<ServerTls>& tls);
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentials(const std::optional<ClientTls>& tls);

}  // namespace fl::rpc
