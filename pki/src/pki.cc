// fl::pki on OpenSSL 3: EC P-256 keys, SHA-256 signatures, 128-bit random serials, X.509 v3 extensions built by
// OpenSSL's own configuration parser (from validated names only), CRLs signed by the CA.
#include "fl/pki/pki.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "fl/core/str_cat.h"
#include "fl/sys/user_file.h"
#include "openssl_util.h"

namespace fl::pki {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using namespace openssl;  // NOLINT: this file's OpenSSL vocabulary (openssl_util.h)

constexpr int kIndexVersion = 1;

// The authority's files: certificates and keys (kilobytes), the issue index and the revocation list (tens of
// bytes an entry). 64 MiB is a million entries; a special file or a larger one is not a file fl-provision wrote.
constexpr uint64_t kMaxPkiFileBytes = uint64_t{64} << 20;

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  absl::StatusOr<std::string> text = sys::ReadUserFile(path, "", kMaxPkiFileBytes);
  if (!text.ok()) {
    return absl::Status(text.status().code(),
                        fl::StrCat("cannot read ", text.status().message(),
                                   "; is this a directory made by `fl-provision init` (docs/security.md, layout)?"));
  }
  return text;
}

// Temp file in the same directory, fsync, rename: a reader (a server reloading the CRL) sees the old file or the
// new one, never half of one. The mode is set explicitly: 0600 for keys whatever the umask.
absl::Status WriteFileAtomic(const std::string& path, std::string_view content, mode_t mode) {
  const std::string tmp = fl::StrCat(path, ".tmp.", ::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) return absl::InternalError(fl::StrCat("cannot create ", tmp, ": ", std::strerror(errno)));
  bool ok = ::fchmod(fd, mode) == 0;
  size_t done = 0;
  while (ok && done < content.size()) {
    ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) done += static_cast<size_t>(n);
  }
  ok = ok && ::fsync(fd) == 0;
  const int saved = errno;
  ::close(fd);
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = ok ? errno : saved;
    ::unlink(tmp.c_str());
    return absl::InternalError(fl::StrCat("cannot write ", path, ": ", std::strerror(err)));
  }
  return absl::OkStatus();
}

// One fl-provision at a time per directory: two concurrent add-client calls would each rewrite the index.
class DirLock {
 public:
  static absl::StatusOr<DirLock> Take(const Paths& paths) {
    const std::string path = fl::StrCat(paths.dir, "/ca/.lock");
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
      return absl::FailedPreconditionError(fl::StrCat("cannot open ", path, ": ", std::strerror(errno), "; is ",
                                                      paths.dir, " a directory made by `fl-provision init`?"));
    }
    if (::flock(fd, LOCK_EX) != 0) {
      ::close(fd);
      return absl::InternalError(fl::StrCat("cannot lock ", path, ": ", std::strerror(errno)));
    }
    DirLock l;
    l.fd_ = fd;
    return l;
  }
  DirLock(DirLock&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  DirLock& operator=(DirLock&&) = delete;
  ~DirLock() {
    if (fd_ >= 0) ::close(fd_);
  }

 private:
  DirLock() = default;
  int fd_ = -1;
};

// ---- OpenSSL objects <-> PEM ----

absl::StatusOr<std::string> BioToString(BIO* bio) {
  char* data = nullptr;
  long n = BIO_get_mem_data(bio, &data);
  if (n < 0) return Error("reading a memory BIO");
  return std::string(data, static_cast<size_t>(n));
}

absl::StatusOr<std::string> CertPem(X509* cert) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (!bio || PEM_write_bio_X509(bio.get(), cert) != 1) return Error("encoding a certificate as PEM");
  return BioToString(bio.get());
}

absl::StatusOr<std::string> KeyPem(EVP_PKEY* key) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  // PKCS#8, unencrypted: the key files are protected by their mode (0600), as gRPC's file-based credentials expect.
  if (!bio || PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr) != 1) {
    return Error("encoding a private key as PEM");
  }
  return BioToString(bio.get());
}

absl::StatusOr<X509Ptr> LoadCert(const std::string& path) {
  absl::StatusOr<std::string> pem = ReadFile(path);
  if (!pem.ok()) return pem.status();
  BioPtr bio(BIO_new_mem_buf(pem->data(), static_cast<int>(pem->size())));
  X509Ptr cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  if (!cert) return Error(fl::StrCat(path, " is not a PEM certificate"));
  return cert;
}

absl::StatusOr<KeyPtr> LoadKey(const std::string& path) {
  absl::StatusOr<std::string> pem = ReadFile(path);
  if (!pem.ok()) return pem.status();
  BioPtr bio(BIO_new_mem_buf(pem->data(), static_cast<int>(pem->size())));
  KeyPtr key(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  if (!key) return Error(fl::StrCat(path, " is not an unencrypted PEM private key"));
  return key;
}

absl::StatusOr<KeyPtr> NewKey() {
  KeyPtr key(EVP_EC_gen("P-256"));
  if (!key) return Error("generating an EC P-256 key");
  return key;
}

// 128 random bits, top bit cleared so that the DER INTEGER stays positive (RFC 5280: at most 20 octets, positive).
absl::StatusOr<std::string> SetRandomSerial(X509* cert) {
  unsigned char bytes[16];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) return Error("drawing a random serial number");
  bytes[0] &= 0x7f;
  bytes[0] |= 0x01 << 6;  // never a short serial: keeps every serial 128 bits wide in hex listings
  BnPtr bn(BN_bin2bn(bytes, sizeof(bytes), nullptr));
  if (!bn || !BN_to_ASN1_INTEGER(bn.get(), X509_get_serialNumber(cert))) return Error("setting a serial number");
  char* hex = BN_bn2hex(bn.get());
  std::string out(hex);
  OPENSSL_free(hex);
  return out;
}

absl::Status AddExt(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  if (ext == nullptr) return Error(fl::StrCat("building the extension ", OBJ_nid2sn(nid), " = ", value));
  const int ok = X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
  if (ok != 1) return Error(fl::StrCat("adding the extension ", OBJ_nid2sn(nid)));
  return absl::OkStatus();
}

struct NewCert {
  X509Ptr cert;
  std::string serial_hex;
  int64_t not_before = 0;
  int64_t not_after = 0;
};

// UTF-8 characters (code points) of `s`: what X.509 counts a common name's length in.
size_t Utf8Length(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80 ? 1 : 0;
  return n;
}

// The fields every certificate here shares; the caller adds its extensions and signs.
absl::StatusOr<NewCert> StartCert(std::string_view common_name, EVP_PKEY* subject_key, X509* issuer,
                                  const Validity& validity) {
  NewCert out;
  out.cert.reset(X509_new());
  X509* c = out.cert.get();
  if (!c || X509_set_version(c, 2) != 1) return Error("creating a certificate");
  absl::StatusOr<std::string> serial = SetRandomSerial(c);
  if (!serial.ok()) return serial.status();
  out.serial_hex = *serial;
  const int64_t now = ::time(nullptr);
  out.not_before = now + validity.not_before_s;
  out.not_after = now + validity.not_after_s;
  if (!ASN1_TIME_set(X509_getm_notBefore(c), static_cast<time_t>(out.not_before)) ||
      !ASN1_TIME_set(X509_getm_notAfter(c), static_cast<time_t>(out.not_after))) {
    return Error("setting the validity period");
  }
  X509_NAME* name = X509_get_subject_name(c);
  const std::string cn(common_name);
  // OpenSSL's own refusal says only "string too long"; name the value, the limit and what to do.
  if (const size_t length = Utf8Length(cn); length > kMaxCommonNameLength) {
    return absl::InvalidArgumentError(fl::StrCat("the common name '", cn, "' has ", length,
                                                 " characters; X.509 allows at most ", kMaxCommonNameLength,
                                                 " (RFC 5280): use a shorter name"));
  }
  if (X509_NAME_add_entry_by_txt(name, "O", MBSTRING_UTF8, reinterpret_cast<const unsigned char*>("fl-testbed"), -1, -1,
                                 0) != 1 ||
      X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8, reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1,
                                 0) != 1) {
    return Error(fl::StrCat("setting the subject name CN=", cn));
  }
  if (X509_set_issuer_name(c, issuer ? X509_get_subject_name(issuer) : name) != 1 ||
      X509_set_pubkey(c, subject_key) != 1) {
    return Error("setting the issuer and public key");
  }
  return out;
}

// ---- index.json ----

struct Index {
  std::string ca_name;
  int64_t crl_number = 0;
  int crl_days = 30;
  std::vector<Issued> issued;
};

json ToJson(const Issued& i) {
  return json{{"name", i.name},           {"kind", std::string(KindName(i.kind))},
              {"serial", i.serial_hex},   {"not_before", i.not_before},
              {"not_after", i.not_after}, {"not_after_utc", FormatTime(i.not_after)},
              {"revoked", i.revoked},     {"revoked_at", i.revoked_at},
              {"current", i.current}};
}

absl::StatusOr<Index> LoadIndex(const Paths& paths) {
  absl::StatusOr<std::string> text = ReadFile(paths.Index());
  if (!text.ok()) return text.status();
  try {
    const json j = json::parse(*text);
    if (j.at("version").get<int>() != kIndexVersion) {
      return absl::FailedPreconditionError(fl::StrCat(paths.Index(), ": version ", j.at("version").dump(), " is not ",
                                                      kIndexVersion, "; use the fl-provision that made it"));
    }
    Index index;
    index.ca_name = j.at("ca_name").get<std::string>();
    index.crl_number = j.at("crl_number").get<int64_t>();
    index.crl_days = j.at("crl_days").get<int>();
    for (const json& e : j.at("issued")) {
      Issued i;
      i.name = e.at("name").get<std::string>();
      absl::StatusOr<Kind> kind = ParseKind(e.at("kind").get<std::string>());
      if (!kind.ok()) return absl::DataLossError(fl::StrCat(paths.Index(), ": ", kind.status().message()));
      i.kind = *kind;
      i.serial_hex = e.at("serial").get<std::string>();
      i.not_before = e.at("not_before").get<int64_t>();
      i.not_after = e.at("not_after").get<int64_t>();
      i.revoked = e.at("revoked").get<bool>();
      i.revoked_at = e.at("revoked_at").get<int64_t>();
      i.current = e.at("current").get<bool>();
      index.issued.push_back(std::move(i));
    }
    return index;
  } catch (const json::exception& e) {
    return absl::DataLossError(fl::StrCat(paths.Index(), " is damaged: ", e.what(),
                                          "; restore it from a backup (the certificates themselves are intact)"));
  }
}

absl::Status SaveIndex(const Paths& paths, const Index& index) {
  json issued = json::array();
  for (const Issued& i : index.issued) issued.push_back(ToJson(i));
  const json j{{"version", kIndexVersion},
               {"ca_name", index.ca_name},
               {"crl_number", index.crl_number},
               {"crl_days", index.crl_days},
               {"issued", issued}};
  return WriteFileAtomic(paths.Index(), j.dump(2) + "\n", 0644);
}

// Signs a new CRL with every revoked serial of the index and bumps its CRL number.
absl::Status WriteCrl(const Paths& paths, Index& index, X509* ca, EVP_PKEY* ca_key) {
  CrlPtr crl(X509_CRL_new());
  if (!crl || X509_CRL_set_version(crl.get(), 1) != 1 ||
      X509_CRL_set_issuer_name(crl.get(), X509_get_subject_name(ca)) != 1) {
    return Error("creating a CRL");
  }
  const int64_t now = ::time(nullptr);
  Asn1TimePtr t(ASN1_TIME_new());
  if (!t || !ASN1_TIME_set(t.get(), static_cast<time_t>(now)) || X509_CRL_set1_lastUpdate(crl.get(), t.get()) != 1 ||
      !ASN1_TIME_set(t.get(), static_cast<time_t>(now + int64_t{index.crl_days} * 86400)) ||
      X509_CRL_set1_nextUpdate(crl.get(), t.get()) != 1) {
    return Error("setting the CRL's update times");
  }
  for (const Issued& i : index.issued) {
    if (!i.revoked) continue;
    BIGNUM* raw = nullptr;
    if (BN_hex2bn(&raw, i.serial_hex.c_str()) == 0) {
      return absl::DataLossError(fl::StrCat(paths.Index(), ": serial '", i.serial_hex, "' of ", i.name,
                                            " is not hexadecimal; restore the index from a backup"));
    }
    BnPtr bn(raw);
    Asn1IntPtr serial(BN_to_ASN1_INTEGER(bn.get(), nullptr));
    X509_REVOKED* r = X509_REVOKED_new();
    Asn1TimePtr when(ASN1_TIME_new());
    if (!serial || !r || !when || X509_REVOKED_set_serialNumber(r, serial.get()) != 1 ||
        !ASN1_TIME_set(when.get(), static_cast<time_t>(i.revoked_at)) ||
        X509_REVOKED_set_revocationDate(r, when.get()) != 1 || X509_CRL_add0_revoked(crl.get(), r) != 1) {
      X509_REVOKED_free(r);
      return Error(fl::StrCat("adding serial ", i.serial_hex, " to the CRL"));
    }
  }
  index.crl_number += 1;
  Asn1IntPtr number(ASN1_INTEGER_new());
  if (!number || ASN1_INTEGER_set_int64(number.get(), index.crl_number) != 1 ||
      X509_CRL_add1_ext_i2d(crl.get(), NID_crl_number, number.get(), 0, 0) != 1) {
    return Error("setting the CRL number");
  }
  if (X509_CRL_sort(crl.get()) != 1 || X509_CRL_sign(crl.get(), ca_key, EVP_sha256()) <= 0) {
    return Error("signing the CRL");
  }
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (!bio || PEM_write_bio_X509_CRL(bio.get(), crl.get()) != 1) return Error("encoding the CRL as PEM");
  absl::StatusOr<std::string> pem = BioToString(bio.get());
  if (!pem.ok()) return pem.status();
  return WriteFileAtomic(paths.Crl(), *pem, 0644);
}

absl::Status ValidateDnsName(const std::string& dns) {
  // Host names and a leading wildcard label; anything else (commas, colons) would also be unsafe in the
  // subjectAltName text given to OpenSSL's parser.
  bool ok = !dns.empty() && dns.size() <= 253;
  for (size_t k = 0; ok && k < dns.size(); ++k) {
    const char c = dns[k];
    ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '.' ||
         (c == '*' && k == 0 && dns.size() > 1 && dns[1] == '.');
  }
  if (!ok) {
    return absl::InvalidArgumentError(
        fl::StrCat("DNS name '", dns, "' is not a host name: use letters, digits, '-' and '.' (at most 253)"));
  }
  return absl::OkStatus();
}

absl::Status ValidateIp(const std::string& ip) {
  unsigned char buf[16];
  if (inet_pton(AF_INET, ip.c_str(), buf) == 1 || inet_pton(AF_INET6, ip.c_str(), buf) == 1) return absl::OkStatus();
  return absl::InvalidArgumentError(fl::StrCat("IP address '", ip, "' is neither IPv4 (10.0.0.1) nor IPv6 (fd00::1)"));
}

// Z85 (ZeroMQ RFC 32), the text form of CurveZMQ keys: 4 bytes <-> 5 characters.
constexpr char kZ85[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";

std::string Z85Encode(const unsigned char* data, size_t size) {  // size: a multiple of 4
  std::string out;
  for (size_t i = 0; i < size; i += 4) {
    uint32_t v = (uint32_t{data[i]} << 24) | (uint32_t{data[i + 1]} << 16) | (uint32_t{data[i + 2]} << 8) | data[i + 3];
    char block[5];
    for (int k = 4; k >= 0; --k) {
      block[k] = kZ85[v % 85];
      v /= 85;
    }
    out.append(block, 5);
  }
  return out;
}

// A 40-character Z85 key -> its 32 bytes; false for anything else.
bool Z85Decode32(std::string_view text, unsigned char out[32]) {
  if (text.size() != 40) return false;
  for (size_t i = 0; i < 40; i += 5) {
    uint64_t v = 0;
    for (size_t k = 0; k < 5; ++k) {
      const char* at = std::strchr(kZ85, text[i + k]);
      if (text[i + k] == '\0' || at == nullptr) return false;
      v = v * 85 + static_cast<uint64_t>(at - kZ85);
    }
    if (v > 0xffffffffULL) return false;
    for (int b = 0; b < 4; ++b) out[i / 5 * 4 + b] = static_cast<unsigned char>(v >> (24 - 8 * b));
  }
  return true;
}

std::string_view KindDir(Kind kind) {
  switch (kind) {
    case Kind::kServer: return "server";
    case Kind::kClient: return "clients";
    case Kind::kIsland: return "islands";
  }
  return "unknown";
}

}  // namespace

absl::StatusOr<CurveKeyPair> NewCurveKeyPair() {
  KeyPtr key(EVP_PKEY_Q_keygen(nullptr, nullptr, "X25519"));
  if (!key) return Error("generating an X25519 (CurveZMQ) key pair");
  unsigned char pub[32], sec[32];
  size_t pub_len = sizeof(pub), sec_len = sizeof(sec);
  if (EVP_PKEY_get_raw_public_key(key.get(), pub, &pub_len) != 1 ||
      EVP_PKEY_get_raw_private_key(key.get(), sec, &sec_len) != 1 || pub_len != 32 || sec_len != 32) {
    return Error("reading the raw X25519 key");
  }
  CurveKeyPair pair{Z85Encode(pub, 32), Z85Encode(sec, 32)};
  OPENSSL_cleanse(sec, sizeof(sec));
  return pair;
}

absl::StatusOr<std::string> CurvePublicKey(std::string_view secret_z85) {
  unsigned char sec[32];
  if (!Z85Decode32(secret_z85, sec)) {
    return absl::InvalidArgumentError("a CurveZMQ secret key is 40 characters of Z85 (fl-provision add-island)");
  }
  KeyPtr key(EVP_PKEY_new_raw_private_key(EVP_PKEY_X25519, nullptr, sec, sizeof(sec)));
  OPENSSL_cleanse(sec, sizeof(sec));
  if (!key) return Error("loading an X25519 secret key");
  unsigned char pub[32];
  size_t pub_len = sizeof(pub);
  if (EVP_PKEY_get_raw_public_key(key.get(), pub, &pub_len) != 1 || pub_len != 32) {
    return Error("deriving the X25519 public key");
  }
  return Z85Encode(pub, 32);
}

absl::StatusOr<std::string> ReadCurveKeyFile(const std::string& path) {
  // A Z85 key is 40 characters and a newline: 1 KiB is generous.
  absl::StatusOr<std::string> read = sys::ReadUserFile(path, "CurveZMQ key file", 1024);
  if (!read.ok()) {
    return absl::Status(read.status().code(),
                        fl::StrCat("cannot read ", read.status().message(),
                                   "; `fl-provision add-island NAME --dir D` writes D/islands/NAME.curve.pub "
                                   "and .curve.key (docs/security.md)"));
  }
  std::string text = std::move(*read);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  unsigned char raw[32];
  if (!Z85Decode32(text, raw)) {
    return absl::InvalidArgumentError(fl::StrCat("CurveZMQ key file ", path,
                                                 " does not hold a 40-character Z85 key; "
                                                 "reissue it with `fl-provision add-island NAME --dir D --force`"));
  }
  return text;
}

std::string_view KindName(Kind kind) {
  switch (kind) {
    case Kind::kServer: return "server";
    case Kind::kClient: return "client";
    case Kind::kIsland: return "island";
  }
  return "unknown";
}

absl::StatusOr<Kind> ParseKind(std::string_view text) {
  if (text == "server") return Kind::kServer;
  if (text == "client") return Kind::kClient;
  if (text == "island") return Kind::kIsland;
  return absl::InvalidArgumentError(fl::StrCat("unknown kind '", text, "'; allowed: server, client, island"));
}

absl::Status ValidateName(std::string_view name) {
  bool ok = !name.empty() && name.size() <= 64;
  for (char c : name) {
    ok = ok && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
                c == '-');
  }
  // "." and ".." are file names of their own in the layout.
  if (!ok || name == "." || name == "..") {
    return absl::InvalidArgumentError(
        fl::StrCat("name '", name, "' is not valid: use 1-64 characters of [A-Za-z0-9._-] (not '.' or '..')"));
  }
  return absl::OkStatus();
}

std::string Paths::CaCert() const { return fl::StrCat(dir, "/ca/ca.crt"); }
std::string Paths::CaKey() const { return fl::StrCat(dir, "/ca/ca.key"); }
std::string Paths::Crl() const { return fl::StrCat(dir, "/ca/crl.pem"); }
std::string Paths::Index() const { return fl::StrCat(dir, "/ca/index.json"); }
std::string Paths::Cert(Kind kind, std::string_view name) const {
  return fl::StrCat(dir, "/", KindDir(kind), "/", name, ".crt");
}
std::string Paths::Key(Kind kind, std::string_view name) const {
  return fl::StrCat(dir, "/", KindDir(kind), "/", name, ".key");
}
std::string Paths::CurvePublic(std::string_view island) const {
  return fl::StrCat(dir, "/", KindDir(Kind::kIsland), "/", island, ".curve.pub");
}
std::string Paths::CurveSecret(std::string_view island) const {
  return fl::StrCat(dir, "/", KindDir(Kind::kIsland), "/", island, ".curve.key");
}

Validity Validity::Days(int days) { return Validity{0, int64_t{days} * 86400}; }

std::string FormatTime(int64_t unix_seconds) {
  const time_t t = static_cast<time_t>(unix_seconds);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string FitCommonName(std::string_view name) {
  if (Utf8Length(name) <= kMaxCommonNameLength) return std::string(name);
  // FNV-1a over the whole name: stable across builds and machines (the CA's name is recorded and compared by
  // people, not by code), and enough to tell two long names apart.
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  char suffix_buf[16];
  std::snprintf(suffix_buf, sizeof suffix_buf, "~%08x", static_cast<unsigned>(static_cast<uint32_t>(h ^ (h >> 32))));
  const std::string suffix(suffix_buf);
  // The first characters, cut at a character's start so that no UTF-8 sequence is split.
  const size_t keep = kMaxCommonNameLength - suffix.size();
  size_t chars = 0, end = 0;
  for (; end < name.size(); ++end) {
    if ((static_cast<unsigned char>(name[end]) & 0xC0) != 0x80 && chars++ == keep) break;
  }
  return fl::StrCat(name.substr(0, end), suffix);
}

absl::Status CreateCa(const std::string& dir, const CaOptions& options) {
  std::error_code ec;
  if (fs::exists(dir, ec) && !(fs::is_directory(dir, ec) && fs::is_empty(dir, ec))) {
    return absl::AlreadyExistsError(
        fl::StrCat(dir,
                   " already exists and is not empty; `init` makes a new CA only in a new or empty directory "
                   "(to add to an existing CA use add-client/add-island/add-server)"));
  }
  const Paths paths{dir};
  for (std::string_view sub : {"ca", "server", "clients", "islands"}) {
    fs::create_directories(fl::StrCat(dir, "/", sub), ec);
    if (ec) return absl::InternalError(fl::StrCat("cannot create ", dir, "/", sub, ": ", ec.message()));
  }
  // Only the owner may look into ca/ (the CA key).
  fs::permissions(fl::StrCat(dir, "/ca"), fs::perms::owner_all, fs::perm_options::replace, ec);

  absl::StatusOr<KeyPtr> key = NewKey();
  if (!key.ok()) return key.status();
  absl::StatusOr<NewCert> ca = StartCert(options.common_name, key->get(), nullptr, options.validity);
  if (!ca.ok()) return ca.status();
  X509* c = ca->cert.get();
  for (auto [nid, value] :
       {std::pair{NID_basic_constraints, "critical,CA:TRUE,pathlen:0"},
        std::pair{NID_key_usage, "critical,keyCertSign,cRLSign"}, std::pair{NID_subject_key_identifier, "hash"}}) {
    if (absl::Status s = AddExt(c, c, nid, value); !s.ok()) return s;
  }
  if (X509_sign(c, key->get(), EVP_sha256()) <= 0) return Error("self-signing the CA certificate");

  absl::StatusOr<std::string> key_pem = KeyPem(key->get());
  if (!key_pem.ok()) return key_pem.status();
  absl::StatusOr<std::string> cert_pem = CertPem(c);
  if (!cert_pem.ok()) return cert_pem.status();
  if (absl::Status s = WriteFileAtomic(paths.CaKey(), *key_pem, 0600); !s.ok()) return s;
  if (absl::Status s = WriteFileAtomic(paths.CaCert(), *cert_pem, 0644); !s.ok()) return s;
  Index index;
  index.ca_name = options.common_name;
  index.crl_days = options.crl_days;
  if (absl::Status s = WriteCrl(paths, index, c, key->get()); !s.ok()) return s;
  return SaveIndex(paths, index);
}

absl::Status ValidateIssue(Kind kind, std::string_view name, const IssueOptions& options) {
  if (absl::Status s = ValidateName(name); !s.ok()) return s;
  if (kind != Kind::kServer) return absl::OkStatus();
  if (options.dns_names.empty() && options.ip_addresses.empty()) {
    return absl::InvalidArgumentError(fl::StrCat(
        "server certificate '", name, "' needs at least one DNS name or IP address (the names clients dial)"));
  }
  for (const std::string& d : options.dns_names) {
    if (absl::Status s = ValidateDnsName(d); !s.ok()) return s;
  }
  for (const std::string& ip : options.ip_addresses) {
    if (absl::Status s = ValidateIp(ip); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<Issued> Issue(const std::string& dir, Kind kind, std::string_view name, const IssueOptions& options) {
  if (absl::Status s = ValidateIssue(kind, name, options); !s.ok()) return s;
  // Validated above: no commas or colons can reach OpenSSL's extension parser.
  std::string san;
  if (kind == Kind::kServer) {
    for (const std::string& d : options.dns_names) san += fl::StrCat(san.empty() ? "" : ",", "DNS:", d);
    for (const std::string& ip : options.ip_addresses) san += fl::StrCat(san.empty() ? "" : ",", "IP:", ip);
  } else {
    san = fl::StrCat("URI:", kind == Kind::kClient ? "fl-client://" : "fl-island://", name);
  }

  const Paths paths{dir};
  absl::StatusOr<DirLock> lock = DirLock::Take(paths);
  if (!lock.ok()) return lock.status();
  absl::StatusOr<Index> index = LoadIndex(paths);
  if (!index.ok()) return index.status();
  const std::string cert_path = paths.Cert(kind, name);
  const std::string key_path = paths.Key(kind, name);
  std::error_code ec;
  if (!options.force && (fs::exists(cert_path, ec) || fs::exists(key_path, ec))) {
    return absl::AlreadyExistsError(fl::StrCat(
        cert_path,
        " already exists; pass --force to replace it (the old certificate is revoked), or pick another name"));
  }
  absl::StatusOr<X509Ptr> ca = LoadCert(paths.CaCert());
  if (!ca.ok()) return ca.status();
  absl::StatusOr<KeyPtr> ca_key = LoadKey(paths.CaKey());
  if (!ca_key.ok()) return ca_key.status();

  absl::StatusOr<KeyPtr> key = NewKey();
  if (!key.ok()) return key.status();
  absl::StatusOr<NewCert> cert = StartCert(name, key->get(), ca->get(), options.validity);
  if (!cert.ok()) return cert.status();
  X509* c = cert->cert.get();
  const char* eku = kind == Kind::kServer   ? "serverAuth"
                    : kind == Kind::kClient ? "clientAuth"
                                            : "serverAuth,clientAuth";  // an island both dials and accepts
  for (auto [nid, value] : {std::pair<int, std::string>{NID_basic_constraints, "critical,CA:FALSE"},
                            std::pair<int, std::string>{NID_key_usage, "critical,digitalSignature,keyAgreement"},
                            std::pair<int, std::string>{NID_ext_key_usage, eku},
                            std::pair<int, std::string>{NID_subject_key_identifier, "hash"},
                            std::pair<int, std::string>{NID_authority_key_identifier, "keyid:always"},
                            std::pair<int, std::string>{NID_subject_alt_name, san}}) {
    if (absl::Status s = AddExt(c, ca->get(), nid, value); !s.ok()) return s;
  }
  if (X509_sign(c, ca_key->get(), EVP_sha256()) <= 0) return Error(fl::StrCat("signing the certificate of ", name));
  absl::StatusOr<std::string> key_pem = KeyPem(key->get());
  if (!key_pem.ok()) return key_pem.status();
  absl::StatusOr<std::string> cert_pem = CertPem(c);
  if (!cert_pem.ok()) return cert_pem.status();

  // The certificate this one replaces is revoked: its key may be why it is replaced.
  bool revoked_any = false;
  const int64_t now = ::time(nullptr);
  for (Issued& old : index->issued) {
    if (old.kind != kind || old.name != name || !old.current) continue;
    old.current = false;
    if (!old.revoked) {
      old.revoked = true;
      old.revoked_at = now;
      revoked_any = true;
    }
  }
  if (absl::Status s = WriteFileAtomic(key_path, *key_pem, 0600); !s.ok()) return s;
  if (absl::Status s = WriteFileAtomic(cert_path, *cert_pem, 0644); !s.ok()) return s;
  if (kind == Kind::kIsland) {  // the ring's CurveZMQ keys travel with the island's certificate
    absl::StatusOr<CurveKeyPair> curve = NewCurveKeyPair();
    if (!curve.ok()) return curve.status();
    if (absl::Status s = WriteFileAtomic(paths.CurveSecret(name), curve->secret_key + "\n", 0600); !s.ok()) return s;
    if (absl::Status s = WriteFileAtomic(paths.CurvePublic(name), curve->public_key + "\n", 0644); !s.ok()) return s;
  }
  Issued issued;
  issued.name = std::string(name);
  issued.kind = kind;
  issued.serial_hex = cert->serial_hex;
  issued.not_before = cert->not_before;
  issued.not_after = cert->not_after;
  index->issued.push_back(issued);
  if (revoked_any) {
    if (absl::Status s = WriteCrl(paths, *index, ca->get(), ca_key->get()); !s.ok()) return s;
  }
  if (absl::Status s = SaveIndex(paths, *index); !s.ok()) return s;
  return issued;
}

absl::StatusOr<std::vector<Issued>> Revoke(const std::string& dir, std::string_view name, const Kind* kind) {
  if (absl::Status s = ValidateName(name); !s.ok()) return s;
  const Paths paths{dir};
  absl::StatusOr<DirLock> lock = DirLock::Take(paths);
  if (!lock.ok()) return lock.status();
  absl::StatusOr<Index> index = LoadIndex(paths);
  if (!index.ok()) return index.status();
  std::set<Kind> kinds;
  bool known = false;
  for (const Issued& i : index->issued) {
    if (i.name != name || (kind && i.kind != *kind)) continue;
    known = true;
    if (!i.revoked) kinds.insert(i.kind);
  }
  const std::string what = kind ? fl::StrCat(KindName(*kind), " '", name, "'") : fl::StrCat("'", name, "'");
  if (!known) {
    return absl::NotFoundError(fl::StrCat("no certificate was issued to ", what, " by the CA in ", dir,
                                          "; `fl-provision list --dir ", dir, "` shows what was"));
  }
  if (kinds.empty()) return absl::FailedPreconditionError(fl::StrCat(what, " is already revoked"));
  if (kinds.size() > 1) {
    return absl::InvalidArgumentError(
        fl::StrCat(what, " names certificates of several kinds; pass --kind server|client|island"));
  }
  absl::StatusOr<X509Ptr> ca = LoadCert(paths.CaCert());
  if (!ca.ok()) return ca.status();
  absl::StatusOr<KeyPtr> ca_key = LoadKey(paths.CaKey());
  if (!ca_key.ok()) return ca_key.status();
  std::vector<Issued> out;
  const int64_t now = ::time(nullptr);
  for (Issued& i : index->issued) {
    if (i.name != name || i.revoked || (kind && i.kind != *kind)) continue;
    i.revoked = true;
    i.revoked_at = now;
    out.push_back(i);
  }
  if (absl::Status s = WriteCrl(paths, *index, ca->get(), ca_key->get()); !s.ok()) return s;
  if (absl::Status s = SaveIndex(paths, *index); !s.ok()) return s;
  return out;
}

absl::Status RefreshCrl(const std::string& dir) {
  const Paths paths{dir};
  absl::StatusOr<DirLock> lock = DirLock::Take(paths);
  if (!lock.ok()) return lock.status();
  absl::StatusOr<Index> index = LoadIndex(paths);
  if (!index.ok()) return index.status();
  absl::StatusOr<X509Ptr> ca = LoadCert(paths.CaCert());
  if (!ca.ok()) return ca.status();
  absl::StatusOr<KeyPtr> ca_key = LoadKey(paths.CaKey());
  if (!ca_key.ok()) return ca_key.status();
  if (absl::Status s = WriteCrl(paths, *index, ca->get(), ca_key->get()); !s.ok()) return s;
  return SaveIndex(paths, *index);
}

absl::StatusOr<std::vector<Issued>> List(const std::string& dir) {
  absl::StatusOr<Index> index = LoadIndex(Paths{dir});
  if (!index.ok()) return index.status();
  return index->issued;
}

}  // namespace fl::pki
