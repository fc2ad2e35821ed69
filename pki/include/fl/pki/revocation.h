// What a server needs from the PKI at run time: who a peer's certificate names, and whether it was revoked.
//
// gRPC verifies the chain and validity of a peer's certificate during the handshake; it does not check
// revocation in a way that can be reloaded without a restart. So the server checks each call's certificate
// serial against a RevocationList it reloads when `ca/crl.pem` changes (fl-provision only ever replaces that file
// atomically, so a reload never sees half of it).
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "fl/pki/pki.h"

namespace fl::pki {

// The parts of a peer's certificate the server acts on.
struct PeerCertificate {
  // The name of the fl-client:// or fl-island:// URI SAN (fl-provision's identities); the subject CN when the
  // certificate has neither (one made elsewhere).
  std::string name;
  // kClient for an fl-client:// SAN, kIsland for fl-island://; nullopt for a certificate with neither.
  std::optional<Kind> kind;
  std::string serial_hex;  // upper-case hex, as in index.json and `fl-provision list`
  int64_t not_after = 0;   // Unix seconds
};

// Parses one PEM certificate (as gRPC's auth context hands it over, property "x509_pem_cert").
absl::StatusOr<PeerCertificate> ParsePeerCertificate(std::string_view pem);

// A certificate revocation list, read from a PEM file and verified against the CA certificate that signed it.
class RevocationList {
 public:
  // Errors name the file and what to do: unreadable, not a CRL, not signed by `ca_cert_path`'s key.
  static absl::StatusOr<RevocationList> Load(const std::string& crl_path, const std::string& ca_cert_path);

  bool IsRevoked(std::string_view serial_hex) const { return serials_.count(std::string(serial_hex)) != 0; }
  const std::set<std::string>& serials() const { return serials_; }
  int64_t crl_number() const { return crl_number_; }
  int64_t next_update() const { return next_update_; }  // Unix seconds; 0 when the CRL has none

 private:
  std::set<std::string> serials_;
  int64_t crl_number_ = 0;
  int64_t next_update_ = 0;
};

}  // namespace fl::pki
