// OpenSSL's objects owned by std::unique_ptr, and OpenSSL's errors as text: what pki.cc and revocation.cc share.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <openssl/asn1.h>
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "absl/status/status.h"
#include "fl/core/str_cat.h"

namespace fl::pki::openssl {

template <auto Free>
struct Deleter {
  template <typename T>
  void operator()(T* p) const {
    Free(p);
  }
};
using X509Ptr = std::unique_ptr<X509, Deleter<X509_free>>;
using KeyPtr = std::unique_ptr<EVP_PKEY, Deleter<EVP_PKEY_free>>;
using BioPtr = std::unique_ptr<BIO, Deleter<BIO_free_all>>;
using CrlPtr = std::unique_ptr<X509_CRL, Deleter<X509_CRL_free>>;
using BnPtr = std::unique_ptr<BIGNUM, Deleter<BN_free>>;
using Asn1IntPtr = std::unique_ptr<ASN1_INTEGER, Deleter<ASN1_INTEGER_free>>;
using Asn1TimePtr = std::unique_ptr<ASN1_TIME, Deleter<ASN1_TIME_free>>;
using NamesPtr = std::unique_ptr<GENERAL_NAMES, Deleter<GENERAL_NAMES_free>>;

// Drains OpenSSL's thread-local error queue into one line, so that every error says what OpenSSL said.
inline std::string Errors() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? "no OpenSSL error recorded" : out;
}

// An InternalError: `what` failed, with OpenSSL's own text.
inline absl::Status Error(std::string_view what) {
  return absl::InternalError(fl::StrCat(what, " (OpenSSL: ", Errors(), ")"));
}

}  // namespace fl::pki::openssl
