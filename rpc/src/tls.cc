#include "fl/rpc/tls.h"

#include <fstream>
#include <sstream>
#include <string_view>

#include "fl/core/str_cat.h"
#include "fl/sys/user_file.h"

namespace fl::rpc {
namespace {

// A certificate chain, a key or a CA bundle: kilobytes. 1 MiB holds hundreds of certificates; more is not a PEM
// file of ours (and /dev/zero or a FIFO named by mistake must not be read until the memory is gone).
constexpr uint64_t kMaxPemBytes = uint64_t{1} << 20;

// A PEM file's contents; an unreadable, special, oversized or empty file is an error naming the file and the
// flag that named it.
absl::StatusOr<std::string> ReadPem(const std::string& path, std::string_view flag) {
  absl::StatusOr<std::string> text = sys::ReadUserFile(path, fl::StrCat(flag, " file"), kMaxPemBytes);
  if (!text.ok() || text->empty()) {
    return absl::InvalidArgumentError(
        fl::StrCat("cannot read ", flag, " file ", path, ": ",
                   text.ok() ? std::string("it is empty") : std::string(text.status().message()),
                   " (fl-provision writes these files, docs/security.md)"));
  }
  return text;
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(const std::optional<ServerTls>& tls) {
  if (!tls.has_value()) return grpc::InsecureServerCredentials();
  absl::StatusOr<std::string> cert = ReadPem(tls->cert_file, "--tls-cert");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPem(tls->key_file, "--tls-key");
  if (!key.ok()) return key.status();
  absl::StatusOr<std::string> ca = ReadPem(tls->client_ca_file, "--tls-client-ca");
  if (!ca.ok()) return ca.status();
  // Require and verify: a client without a certificate from our CA never reaches the service, and the service
  // can then trust the name in the certificate (FederationService::Join compares it with the claimed one).
  grpc::SslServerCredentialsOptions options(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = *std::move(ca);
  options.pem_key_cert_pairs.push_back({*std::move(key), *std::move(cert)});
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentials(const std::optional<ClientTls>& tls) {
  if (!tls.has_value()) return grpc::InsecureChannelCredentials();
  absl::StatusOr<std::string> ca = ReadPem(tls->ca_file, "--tls-ca");
  if (!ca.ok()) return ca.status();
  absl::StatusOr<std::string> cert = ReadPem(tls->cert_file, "--tls-cert");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPem(tls->key_file, "--tls-key");
  if (!key.ok()) return key.status();
  grpc::SslCredentialsOptions options;
  // Only our CA: a server is trusted because fl-provision issued its certificate, not because some public CA did.
  options.pem_root_certs = *std::move(ca);
  options.pem_cert_chain = *std::move(cert);
  options.pem_private_key = *std::move(key);
  return grpc::SslCredentials(options);
}

absl::StatusOr<std::optional<ServerTls>> ResolveServerSecurity(const ServerSecurityFlags& flags,
                                                               std::string_view provision_hint) {
  const ServerTls& t = flags.tls;
  const int given = int{!t.cert_file.empty()} + int{!t.key_file.empty()} + int{!t.client_ca_file.empty()};
  // All three or none: a half-configured TLS server would either fail every handshake or, worse, be taken for a
  // secured one while it serves plaintext.
  if (given != 0 && given != 3) {
    return absl::InvalidArgumentError(
        "--tls-cert, --tls-key and --tls-client-ca go together: give all three for mutual TLS (or none, with "
        "--insecure, for plaintext)");
  }
  if (given == 3 && flags.insecure) {
    return absl::InvalidArgumentError(
        "--insecure and --tls-cert/--tls-key/--tls-client-ca contradict each other: drop --insecure to serve mutual "
        "TLS, or the TLS flags to serve plaintext");
  }
  if (given == 0 && !flags.insecure) {
    return absl::InvalidArgumentError(fl::StrCat(
        "no transport security configured: give --tls-cert, --tls-key and --tls-client-ca to serve mutual TLS (make "
        "the certificates with ",
        provision_hint, ", docs/security.md), or pass --insecure to serve plaintext gRPC on a trusted network"));
  }
  if (!flags.crl_file.empty() && given != 3) {
    return absl::InvalidArgumentError(
        "--tls-crl needs mutual TLS (--tls-cert, --tls-key, --tls-client-ca): in plaintext there is no certificate "
        "to check");
  }
  if (given == 0) return std::optional<ServerTls>();
  return std::optional<ServerTls>(t);
}

std::string InsecureServerWarning(std::string_view listen, std::string_view exposes) {
  return fl::StrCat("--insecure: serving plaintext gRPC: anyone who reaches ", listen, " can ", exposes,
                    "; use --tls-cert/--tls-key/--tls-client-ca (docs/security.md)");
}

}  // namespace fl::rpc
