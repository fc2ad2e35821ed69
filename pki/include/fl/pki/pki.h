// fl::pki: the testbed's own small certificate authority, on OpenSSL 3 (no cryptography of our own).
//
// One directory holds a root CA and everything it issued, in a fixed layout (docs/security.md):
//
//   <dir>/ca/ca.crt        the root CA certificate (EC P-256, self-signed)       0644
//   <dir>/ca/ca.key        its private key                                       0600
//   <dir>/ca/crl.pem       the revocation list, signed by the CA, replaced atomically (temp file + rename)
//   <dir>/ca/index.json    what was issued: name, kind, serial, validity, revoked or not
//   <dir>/server/<name>.crt, .key    server certificates (DNS names and IPs as subjectAltName, EKU serverAuth)
//   <dir>/clients/<name>.crt, .key   client certificates (CN = name, URI SAN fl-client://<name>, EKU clientAuth)
//   <dir>/islands/<name>.crt, .key   island certificates (CN = name, URI SAN fl-island://<name>, both EKUs)
//   <dir>/islands/<name>.curve.pub, .curve.key   the island's CurveZMQ key pair for the ring (Z85 text, 0644/0600)
//
// Keys are written with mode 0600 and never replaced unless asked (`force`); a replaced certificate is revoked
// in the same step, so that rotating a key leaves no older valid certificate for the same name behind.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fl::pki {

enum class Kind { kServer, kClient, kIsland };

// "server", "client", "island".
std::string_view KindName(Kind kind);
absl::StatusOr<Kind> ParseKind(std::string_view text);

// A name as client names are elsewhere in the project: 1-64 characters of [A-Za-z0-9._-].
absl::Status ValidateName(std::string_view name);

// The layout's paths.
struct Paths {
  std::string dir;
  std::string CaCert() const;
  std::string CaKey() const;
  std::string Crl() const;
  std::string Index() const;
  // <dir>/server|clients|islands/<name>.crt and .key.
  std::string Cert(Kind kind, std::string_view name) const;
  std::string Key(Kind kind, std::string_view name) const;
  // <dir>/islands/<name>.curve.pub and .curve.key: an island's CurveZMQ key pair (islands only).
  std::string CurvePublic(std::string_view island) const;
  std::string CurveSecret(std::string_view island) const;
};

// A CurveZMQ key pair (Curve25519, what zmq_curve_keypair makes) as Z85 text, 40 characters each: the islands'
// ring authenticates its members with it (docs/security.md). Made with OpenSSL's X25519, whose raw keys are
// libsodium's crypto_box keys, so that fl-provision needs no libzmq.
struct CurveKeyPair {
  std::string public_key;
  std::string secret_key;
};
absl::StatusOr<CurveKeyPair> NewCurveKeyPair();
// The public key of a Z85 secret key (what zmq_curve_public computes); InvalidArgument for text that is not
// 40 characters of Z85.
absl::StatusOr<std::string> CurvePublicKey(std::string_view secret_z85);
// Reads a .curve.pub or .curve.key file: its 40 Z85 characters (a trailing newline is allowed). Errors name the
// file and what to do.
absl::StatusOr<std::string> ReadCurveKeyFile(const std::string& path);

// A validity period relative to now. Days is what the tool offers; the seconds form lets tests make a certificate
// that is already expired (not_after_s <= 0) or not yet valid.
struct Validity {
  int64_t not_before_s = 0;  // offset of notBefore from now, seconds
  int64_t not_after_s = 0;   // offset of notAfter from now, seconds
  static Validity Days(int days);
};

// The longest common name X.509 allows, in characters (RFC 5280's ub-common-name); a longer one is refused by
// CreateCa and Issue, naming it.
inline constexpr size_t kMaxCommonNameLength = 64;
// `name` as a common name: unchanged when it fits, else its first characters, "~" and 8 hex digits of a hash of
// the whole name, 64 characters in all, so that two long names that share a beginning stay distinct. For names
// made from a user's (a CA named after a manifest): a manifest name of any length must not fail the PKI.
std::string FitCommonName(std::string_view name);

struct CaOptions {
  std::string common_name = "fl-testbed root CA";
  Validity validity = Validity::Days(3650);
  // Days until the revocation list's nextUpdate; a verifier treats a CRL past it as expired, so `fl-provision crl`
  // (or any revoke) must run again before then.
  int crl_days = 30;
};

// Creates <dir> (which must not exist, or be empty) with a new CA, an empty CRL and an empty index.
absl::Status CreateCa(const std::string& dir, const CaOptions& options);

struct IssueOptions {
  Validity validity = Validity::Days(365);
  // Server certificates only: subjectAltName entries. At least one of the two is required for a server.
  std::vector<std::string> dns_names;
  std::vector<std::string> ip_addresses;
  // Replace an existing certificate and key of the same kind and name (the old one is revoked).
  bool force = false;
};

struct Issued {
  std::string name;
  Kind kind = Kind::kClient;
  std::string serial_hex;  // 128 random bits, upper-case hex
  int64_t not_before = 0;  // Unix seconds
  int64_t not_after = 0;   // Unix seconds
  bool revoked = false;
  int64_t revoked_at = 0;  // Unix seconds, when revoked
  // False for a certificate replaced by a newer one of the same kind and name (its files are gone).
  bool current = true;
};

// The checks Issue makes before touching anything: the name, and a server's DNS names and IP addresses.
absl::Status ValidateIssue(Kind kind, std::string_view name, const IssueOptions& options);

// Issues a certificate and key for `name`, signed by the CA in `dir`, and records it in the index. An island also
// gets a new CurveZMQ key pair (Paths::CurvePublic/CurveSecret), replaced with the certificate under `force`.
absl::StatusOr<Issued> Issue(const std::string& dir, Kind kind, std::string_view name, const IssueOptions& options);

// Revokes every unrevoked certificate named `name` (of `kind` when given: the same name may be a client and an
// island) and rewrites the CRL. An unknown name, or one that is ambiguous without a kind, is an error.
absl::StatusOr<std::vector<Issued>> Revoke(const std::string& dir, std::string_view name, const Kind* kind = nullptr);

// Re-signs the CRL with a fresh lastUpdate/nextUpdate (the same revoked serials).
absl::Status RefreshCrl(const std::string& dir);

// Everything the index holds, in issue order.
absl::StatusOr<std::vector<Issued>> List(const std::string& dir);

// "2026-11-24T07:25:05Z".
std::string FormatTime(int64_t unix_seconds);

}  // namespace fl::pki
