// Test support: reads issued certificates back with OpenSSL itself and verifies them with X509_verify_cert, so the
// tests check fl::pki against OpenSSL's verifier rather than against its own code.
#pragma once

#include <arpa/inet.h>

#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

namespace fl::pki::test {

struct X509Free {
  void operator()(X509* p) const { X509_free(p); }
};
struct CrlFree {
  void operator()(X509_CRL* p) const { X509_CRL_free(p); }
};
using X509Ptr = std::unique_ptr<X509, X509Free>;
using CrlPtr = std::unique_ptr<X509_CRL, CrlFree>;

inline X509Ptr ReadCert(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "r");
  EXPECT_NE(f, nullptr) << path;
  if (f == nullptr) return nullptr;
  X509Ptr c(PEM_read_X509(f, nullptr, nullptr, nullptr));
  std::fclose(f);
  EXPECT_NE(c, nullptr) << path << " is not a PEM certificate";
  return c;
}

inline CrlPtr ReadCrl(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "r");
  EXPECT_NE(f, nullptr) << path;
  if (f == nullptr) return nullptr;
  CrlPtr c(PEM_read_X509_CRL(f, nullptr, nullptr, nullptr));
  std::fclose(f);
  EXPECT_NE(c, nullptr) << path << " is not a PEM CRL";
  return c;
}

// X509_verify_cert of `cert` against the single trusted `ca`; with `crl`, X509_V_FLAG_CRL_CHECK. `purpose` is
// an X509_PURPOSE_* (0: none). Answers X509_V_OK or the verifier's error code.
inline int VerifyCode(const std::string& ca, const std::string& cert, const std::string& crl = "", int purpose = 0) {
  X509Ptr ca_cert = ReadCert(ca);
  X509Ptr leaf = ReadCert(cert);
  if (!ca_cert || !leaf) return -1;
  X509_STORE* store = X509_STORE_new();
  X509_STORE_add_cert(store, ca_cert.get());
  if (!crl.empty()) {
    CrlPtr c = ReadCrl(crl);
    if (c) X509_STORE_add_crl(store, c.get());
    X509_STORE_set_flags(store, X509_V_FLAG_CRL_CHECK);
  }
  X509_STORE_CTX* ctx = X509_STORE_CTX_new();
  X509_STORE_CTX_init(ctx, store, leaf.get(), nullptr);
  if (purpose != 0) X509_STORE_CTX_set_purpose(ctx, purpose);
  const int ok = X509_verify_cert(ctx);
  const int err = X509_STORE_CTX_get_error(ctx);
  X509_STORE_CTX_free(ctx);
  X509_STORE_free(store);
  return ok == 1 ? X509_V_OK : err;
}

// subjectAltName entries as "DNS:x", "IP:x", "URI:x".
inline std::vector<std::string> Sans(X509* cert) {
  std::vector<std::string> out;
  auto* names = static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr));
  if (names == nullptr) return out;
  for (int i = 0; i < sk_GENERAL_NAME_num(names); ++i) {
    const GENERAL_NAME* n = sk_GENERAL_NAME_value(names, i);
    if (n->type == GEN_DNS || n->type == GEN_URI) {
      const ASN1_STRING* s = n->type == GEN_DNS ? n->d.dNSName : n->d.uniformResourceIdentifier;
      out.push_back(std::string(n->type == GEN_DNS ? "DNS:" : "URI:") +
                    std::string(reinterpret_cast<const char*>(ASN1_STRING_get0_data(s)),
                                static_cast<size_t>(ASN1_STRING_length(s))));
    } else if (n->type == GEN_IPADD) {
      char buf[INET6_ADDRSTRLEN];
      const int len = ASN1_STRING_length(n->d.iPAddress);
      inet_ntop(len == 4 ? AF_INET : AF_INET6, ASN1_STRING_get0_data(n->d.iPAddress), buf, sizeof(buf));
      out.push_back(std::string("IP:") + buf);
    }
  }
  GENERAL_NAMES_free(names);
  return out;
}

inline std::string CommonName(X509* cert) {
  char buf[256] = {};
  X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, buf, sizeof(buf));
  return buf;
}

// Seconds from now to notAfter (negative once expired).
inline long SecondsToNotAfter(X509* cert) {
  int days = 0, secs = 0;
  ASN1_TIME_diff(&days, &secs, nullptr, X509_get0_notAfter(cert));
  return long{days} * 86400 + secs;
}

}  // namespace fl::pki::test
