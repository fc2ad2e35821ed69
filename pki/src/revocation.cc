#include "fl/pki/revocation.h"

#include <cerrno>
#include <cstring>
#include <ctime>
#include <fstream>
#include <memory>
#include <sstream>

#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "fl/core/str_cat.h"
#include "fl/sys/user_file.h"
#include "openssl_util.h"

namespace fl::pki {
namespace {

using namespace openssl;  // NOLINT: this file's OpenSSL vocabulary (openssl_util.h)

// A revocation list is tens of bytes an entry, a CA certificate kilobytes: 64 MiB is a million revocations. A
// special file (a FIFO would block the reload; /dev/zero would never end) or a larger one is refused.
constexpr uint64_t kMaxRevocationFileBytes = uint64_t{64} << 20;

absl::StatusOr<std::string> ReadText(const std::string& path, std::string_view what) {
  absl::StatusOr<std::string> text = sys::ReadUserFile(path, fl::StrCat("the ", what), kMaxRevocationFileBytes);
  if (!text.ok()) {
    return absl::Status(text.status().code(), fl::StrCat("cannot read ", text.status().message(),
                                                         " (fl-provision writes it: docs/security.md, layout)"));
  }
  return text;
}

absl::StatusOr<std::string> SerialHex(const ASN1_INTEGER* serial) {
  BnPtr bn(ASN1_INTEGER_to_BN(serial, nullptr));
  if (!bn) return absl::InternalError(fl::StrCat("reading a serial number (OpenSSL: ", Errors(), ")"));
  char* hex = BN_bn2hex(bn.get());
  std::string out(hex);
  OPENSSL_free(hex);
  return out;
}

int64_t UnixSeconds(const ASN1_TIME* t) {
  if (t == nullptr) return 0;
  struct tm tm {};
  if (ASN1_TIME_to_tm(t, &tm) != 1) return 0;
  return static_cast<int64_t>(timegm(&tm));
}

}  // namespace

absl::StatusOr<PeerCertificate> ParsePeerCertificate(std::string_view pem) {
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  X509Ptr cert(bio ? PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr) : nullptr);
  if (!cert) {
    return absl::InvalidArgumentError(fl::StrCat("the peer's certificate (", pem.size(),
                                                 " bytes) is not a PEM X.509 certificate (OpenSSL: ", Errors(), ")"));
  }
  PeerCertificate out;
  absl::StatusOr<std::string> serial = SerialHex(X509_get0_serialNumber(cert.get()));
  if (!serial.ok()) return serial.status();
  out.serial_hex = *serial;
  out.not_after = UnixSeconds(X509_get0_notAfter(cert.get()));
  // The identity fl-provision issued the certificate for is its URI SAN; a name found there wins over the CN.
  NamesPtr names(static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(cert.get(), NID_subject_alt_name, nullptr, nullptr)));
  for (int i = 0; names && i < sk_GENERAL_NAME_num(names.get()); ++i) {
    const GENERAL_NAME* n = sk_GENERAL_NAME_value(names.get(), i);
    if (n->type != GEN_URI) continue;
    const std::string_view uri(reinterpret_cast<const char*>(ASN1_STRING_get0_data(n->d.uniformResourceIdentifier)),
                               static_cast<size_t>(ASN1_STRING_length(n->d.uniformResourceIdentifier)));
    for (const auto& [scheme, kind] : {std::pair{std::string_view("fl-client://"), Kind::kClient},
                                       std::pair{std::string_view("fl-island://"), Kind::kIsland}}) {
      if (uri.substr(0, scheme.size()) == scheme) {
        out.name = std::string(uri.substr(scheme.size()));
        out.kind = kind;
      }
    }
  }
  if (!out.kind.has_value()) {
    char cn[256] = {0};
    if (X509_NAME_get_text_by_NID(X509_get_subject_name(cert.get()), NID_commonName, cn, sizeof(cn)) > 0) out.name = cn;
  }
  return out;
}

absl::StatusOr<RevocationList> RevocationList::Load(const std::string& crl_path, const std::string& ca_cert_path) {
  absl::StatusOr<std::string> crl_pem = ReadText(crl_path, "revocation list");
  if (!crl_pem.ok()) return crl_pem.status();
  absl::StatusOr<std::string> ca_pem = ReadText(ca_cert_path, "CA certificate");
  if (!ca_pem.ok()) return ca_pem.status();
  BioPtr crl_bio(BIO_new_mem_buf(crl_pem->data(), static_cast<int>(crl_pem->size())));
  CrlPtr crl(crl_bio ? PEM_read_bio_X509_CRL(crl_bio.get(), nullptr, nullptr, nullptr) : nullptr);
  if (!crl) {
    return absl::InvalidArgumentError(fl::StrCat(
        crl_path, " is not a PEM certificate revocation list (OpenSSL: ", Errors(), "); give the CA's ca/crl.pem"));
  }
  BioPtr ca_bio(BIO_new_mem_buf(ca_pem->data(), static_cast<int>(ca_pem->size())));
  X509Ptr ca(ca_bio ? PEM_read_bio_X509(ca_bio.get(), nullptr, nullptr, nullptr) : nullptr);
  if (!ca) {
    return absl::InvalidArgumentError(fl::StrCat(ca_cert_path, " is not a PEM certificate (OpenSSL: ", Errors(), ")"));
  }
  // A list that the CA did not sign could un-revoke anyone: it is refused, and the caller keeps the one it has.
  EVP_PKEY* ca_key = X509_get0_pubkey(ca.get());
  if (ca_key == nullptr || X509_CRL_verify(crl.get(), ca_key) != 1) {
    ERR_clear_error();
    return absl::PermissionDeniedError(
        fl::StrCat("the revocation list ", crl_path, " is not signed by the CA of ", ca_cert_path,
                   "; give the crl.pem of the CA that issued the clients' certificates"));
  }
  RevocationList out;
  STACK_OF(X509_REVOKED)* revoked = X509_CRL_get_REVOKED(crl.get());
  for (int i = 0; revoked != nullptr && i < sk_X509_REVOKED_num(revoked); ++i) {
    absl::StatusOr<std::string> serial = SerialHex(X509_REVOKED_get0_serialNumber(sk_X509_REVOKED_value(revoked, i)));
    if (!serial.ok()) return serial.status();
    out.serials_.insert(*std::move(serial));
  }
  out.next_update_ = UnixSeconds(X509_CRL_get0_nextUpdate(crl.get()));
  if (auto* number = static_cast<ASN1_INTEGER*>(X509_CRL_get_ext_d2i(crl.get(), NID_crl_number, nullptr, nullptr))) {
    int64_t n = 0;
    if (ASN1_INTEGER_get_int64(&n, number) == 1) out.crl_number_ = n;
    ASN1_INTEGER_free(number);
  }
  return out;
}

}  // namespace fl::pki
