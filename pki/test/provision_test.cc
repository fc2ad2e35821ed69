// fl::pki against OpenSSL's own verifier: chains, names and usages, validity, revocation, file modes, refusals.
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "fl/core/str_cat.h"
#include "fl/pki/pki.h"
#include "fl/pki/revocation.h"
#include "fl/testing/scratch_dir.h"
#include "x509_check.h"

namespace fl::pki {
namespace {

using test::CommonName;
using test::ReadCert;
using test::ReadCrl;
using test::Sans;
using test::VerifyCode;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

class ProvisionTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(CreateCa(ca_dir_, CaOptions{}).ok()); }
  Issued Must(absl::StatusOr<Issued> i) {
    EXPECT_TRUE(i.ok()) << i.status();
    return i.ok() ? *i : Issued{};
  }
  fl::testing::ScratchDir scratch_{"pki"};
  std::string ca_dir_ = scratch_.File("ca1");
  Paths paths_{ca_dir_};
};

TEST_F(ProvisionTest, ChainVerifiesAgainstItsCaAndNotAnother) {
  Must(Issue(ca_dir_, Kind::kClient, "alice", {}));
  const std::string other = scratch_.File("ca2");
  ASSERT_TRUE(CreateCa(other, CaOptions{}).ok());
  Must(Issue(other, Kind::kClient, "alice", {}));

  EXPECT_EQ(VerifyCode(paths_.CaCert(), paths_.Cert(Kind::kClient, "alice")), X509_V_OK);
  EXPECT_EQ(VerifyCode(paths_.CaCert(), Paths{other}.Cert(Kind::kClient, "alice")),
            X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY);
}

TEST_F(ProvisionTest, ServerCertificateHasItsNamesAndIpsAndServerAuthOnly) {
  IssueOptions o;
  o.dns_names = {"localhost", "fl.example.org"};
  o.ip_addresses = {"127.0.0.1", "::1"};
  Must(Issue(ca_dir_, Kind::kServer, "srv", o));
  test::X509Ptr c = ReadCert(paths_.Cert(Kind::kServer, "srv"));
  ASSERT_NE(c, nullptr);
  EXPECT_THAT(Sans(c.get()), UnorderedElementsAre("DNS:localhost", "DNS:fl.example.org", "IP:127.0.0.1", "IP:::1"));
  EXPECT_EQ(CommonName(c.get()), "srv");
  EXPECT_EQ(X509_get_extended_key_usage(c.get()), uint32_t{XKU_SSL_SERVER});
  EXPECT_EQ(X509_check_host(c.get(), "localhost", 0, 0, nullptr), 1);
  EXPECT_EQ(X509_check_ip_asc(c.get(), "127.0.0.1", 0), 1);
  EXPECT_EQ(VerifyCode(paths_.CaCert(), paths_.Cert(Kind::kServer, "srv"), "", X509_PURPOSE_SSL_SERVER), X509_V_OK);
  EXPECT_EQ(VerifyCode(paths_.CaCert(), paths_.Cert(Kind::kServer, "srv"), "", X509_PURPOSE_SSL_CLIENT),
            X509_V_ERR_INVALID_PURPOSE);
}

TEST_F(ProvisionTest, ClientCertificateNamesTheClientAndIsForClientAuthOnly) {
  Must(Issue(ca_dir_, Kind::kClient, "client-07", {}));
  test::X509Ptr c = ReadCert(paths_.Cert(Kind::kClient, "client-07"));
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(CommonName(c.get()), "client-07");
  EXPECT_THAT(Sans(c.get()), ElementsAre("URI:fl-client://client-07"));
  EXPECT_EQ(X509_get_extended_key_usage(c.get()), uint32_t{XKU_SSL_CLIENT});
  EXPECT_EQ(X509_check_ca(c.get()), 0);
  const std::string cert = paths_.Cert(Kind::kClient, "client-07");
  EXPECT_EQ(VerifyCode(paths_.CaCert(), cert, "", X509_PURPOSE_SSL_CLIENT), X509_V_OK);
  EXPECT_EQ(VerifyCode(paths_.CaCert(), cert, "", X509_PURPOSE_SSL_SERVER), X509_V_ERR_INVALID_PURPOSE);
}

TEST_F(ProvisionTest, IslandCertificateNamesTheIslandAndHasBothUsages) {
  Must(Issue(ca_dir_, Kind::kIsland, "island.3", {}));
  test::X509Ptr c = ReadCert(paths_.Cert(Kind::kIsland, "island.3"));
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(CommonName(c.get()), "island.3");
  EXPECT_THAT(Sans(c.get()), ElementsAre("URI:fl-island://island.3"));
  EXPECT_EQ(X509_get_extended_key_usage(c.get()), uint32_t{XKU_SSL_SERVER | XKU_SSL_CLIENT});
}

TEST_F(ProvisionTest, IslandGetsACurveKeyPairWhosePublicKeyMatchesItsSecretKey) {
  Must(Issue(ca_dir_, Kind::kIsland, "island-a", {}));
  Must(Issue(ca_dir_, Kind::kIsland, "island-b", {}));
  absl::StatusOr<std::string> pub = ReadCurveKeyFile(paths_.CurvePublic("island-a"));
  absl::StatusOr<std::string> sec = ReadCurveKeyFile(paths_.CurveSecret("island-a"));
  ASSERT_TRUE(pub.ok()) << pub.status();
  ASSERT_TRUE(sec.ok()) << sec.status();
  EXPECT_EQ(pub->size(), 40u);
  absl::StatusOr<std::string> derived = CurvePublicKey(*sec);
  ASSERT_TRUE(derived.ok()) << derived.status();
  EXPECT_EQ(*derived, *pub);
  EXPECT_NE(*ReadCurveKeyFile(paths_.CurvePublic("island-b")), *pub);
  struct stat st {};
  ASSERT_EQ(::stat(paths_.CurveSecret("island-a").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(::stat(paths_.CurvePublic("island-a").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);
  // Clients and servers have no ring keys.
  Must(Issue(ca_dir_, Kind::kClient, "c", {}));
  EXPECT_FALSE(std::filesystem::exists(fl::StrCat(ca_dir_, "/clients/c.curve.pub")));
  // --force replaces the key pair with the certificate.
  IssueOptions force;
  force.force = true;
  Must(Issue(ca_dir_, Kind::kIsland, "island-a", force));
  EXPECT_NE(*ReadCurveKeyFile(paths_.CurvePublic("island-a")), *pub);
}

TEST_F(ProvisionTest, CurveKeysRoundTripZ85AndRefuseOtherText) {
  absl::StatusOr<CurveKeyPair> pair = NewCurveKeyPair();
  ASSERT_TRUE(pair.ok()) << pair.status();
  EXPECT_EQ(pair->secret_key.size(), 40u);
  EXPECT_EQ(*CurvePublicKey(pair->secret_key), pair->public_key);
  EXPECT_EQ(CurvePublicKey("too short").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CurvePublicKey(std::string(40, '~')).status().code(), absl::StatusCode::kInvalidArgument);
  const std::string bad = fl::StrCat(ca_dir_, "/bad.curve.pub");
  std::ofstream(bad) << "not a key\n";
  absl::StatusOr<std::string> read = ReadCurveKeyFile(bad);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(read.status().message()), HasSubstr(bad));
  EXPECT_EQ(ReadCurveKeyFile(fl::StrCat(ca_dir_, "/missing.curve.pub")).status().code(), absl::StatusCode::kNotFound);
}

// Key, certificate and revocation files are users' files too: /dev/zero (or a link to it) and a FIFO are refused
// as what they are, without blocking or reading without end, and the error names the file.
TEST_F(ProvisionTest, SpecialFilesAreRefusedNotRead) {
  const std::string fifo = fl::StrCat(ca_dir_, "/island.curve.key");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  absl::StatusOr<std::string> from_fifo = ReadCurveKeyFile(fifo);
  ASSERT_FALSE(from_fifo.ok());
  EXPECT_THAT(std::string(from_fifo.status().message()), AllOf(HasSubstr(fifo), HasSubstr("a FIFO")));
  absl::StatusOr<std::string> from_zero = ReadCurveKeyFile("/dev/zero");
  ASSERT_FALSE(from_zero.ok());
  EXPECT_THAT(std::string(from_zero.status().message()), HasSubstr("a character device"));
  // A revocation list that is a FIFO: loading it refuses it instead of waiting for a writer.
  const std::string crl_fifo = fl::StrCat(ca_dir_, "/crl-fifo.pem");
  ASSERT_EQ(::mkfifo(crl_fifo.c_str(), 0600), 0);
  absl::StatusOr<RevocationList> crl = RevocationList::Load(crl_fifo, fl::StrCat(ca_dir_, "/ca.pem"));
  ASSERT_FALSE(crl.ok());
  EXPECT_THAT(std::string(crl.status().message()), AllOf(HasSubstr(crl_fifo), HasSubstr("a FIFO")));
}

TEST_F(ProvisionTest, CaIsACaWithA128BitRandomSerialPerCertificate) {
  test::X509Ptr ca = ReadCert(paths_.CaCert());
  ASSERT_NE(ca, nullptr);
  EXPECT_EQ(X509_check_ca(ca.get()), 1);
  std::set<std::string> serials;
  for (const char* n : {"a", "b", "c", "d"}) serials.insert(Must(Issue(ca_dir_, Kind::kClient, n, {})).serial_hex);
  EXPECT_EQ(serials.size(), 4u);
  for (const std::string& s : serials) EXPECT_EQ(s.size(), 32u) << s;
}

TEST_F(ProvisionTest, OneDayOfValidityEndsAboutADayAhead) {
  IssueOptions o;
  o.validity = Validity::Days(1);
  const Issued i = Must(Issue(ca_dir_, Kind::kClient, "short", o));
  test::X509Ptr c = ReadCert(paths_.Cert(Kind::kClient, "short"));
  ASSERT_NE(c, nullptr);
  EXPECT_NEAR(test::SecondsToNotAfter(c.get()), 86400, 60);
  EXPECT_EQ(i.not_after - i.not_before, 86400);
}

TEST_F(ProvisionTest, ExpiredCertificateIsRejectedByTheVerifier) {
  IssueOptions o;
  o.validity = Validity{-2 * 86400, -86400};
  Must(Issue(ca_dir_, Kind::kClient, "old", o));
  EXPECT_EQ(VerifyCode(paths_.CaCert(), paths_.Cert(Kind::kClient, "old")), X509_V_ERR_CERT_HAS_EXPIRED);
}

TEST_F(ProvisionTest, RevokedSerialIsInTheSignedCrlAndRejectedWhileOthersPass) {
  const Issued alice = Must(Issue(ca_dir_, Kind::kClient, "alice", {}));
  Must(Issue(ca_dir_, Kind::kClient, "bob", {}));
  const std::string a = paths_.Cert(Kind::kClient, "alice"), b = paths_.Cert(Kind::kClient, "bob");
  // The empty CRL written by CreateCa already satisfies a verifier that requires one.
  EXPECT_EQ(VerifyCode(paths_.CaCert(), a, paths_.Crl()), X509_V_OK);

  absl::StatusOr<std::vector<Issued>> r = Revoke(ca_dir_, "alice");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 1u);
  EXPECT_EQ((*r)[0].serial_hex, alice.serial_hex);

  test::CrlPtr crl = ReadCrl(paths_.Crl());
  test::X509Ptr ca = ReadCert(paths_.CaCert());
  ASSERT_NE(crl, nullptr);
  EXPECT_EQ(X509_CRL_verify(crl.get(), X509_get0_pubkey(ca.get())), 1);
  test::X509Ptr alice_cert = ReadCert(a);
  X509_REVOKED* entry = nullptr;
  EXPECT_EQ(X509_CRL_get0_by_cert(crl.get(), &entry, alice_cert.get()), 1);

  EXPECT_EQ(VerifyCode(paths_.CaCert(), a, paths_.Crl()), X509_V_ERR_CERT_REVOKED);
  EXPECT_EQ(VerifyCode(paths_.CaCert(), b, paths_.Crl()), X509_V_OK);
  absl::StatusOr<std::vector<Issued>> listed = List(ca_dir_);
  ASSERT_TRUE(listed.ok());
  for (const Issued& i : *listed) EXPECT_EQ(i.revoked, i.name == "alice") << i.name;
}

TEST_F(ProvisionTest, RevokeRefusesUnknownAmbiguousAndAlreadyRevokedNames) {
  EXPECT_EQ(Revoke(ca_dir_, "nobody").status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(Revoke(ca_dir_, "nobody").status().message()), HasSubstr("fl-provision list"));
  Must(Issue(ca_dir_, Kind::kClient, "dual", {}));
  Must(Issue(ca_dir_, Kind::kIsland, "dual", {}));
  EXPECT_EQ(Revoke(ca_dir_, "dual").status().code(), absl::StatusCode::kInvalidArgument);
  const Kind island = Kind::kIsland;
  ASSERT_TRUE(Revoke(ca_dir_, "dual", &island).ok());
  EXPECT_EQ(Revoke(ca_dir_, "dual", &island).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(VerifyCode(paths_.CaCert(), paths_.Cert(Kind::kClient, "dual"), paths_.Crl()), X509_V_OK);
}

TEST_F(ProvisionTest, KeysAreReadableByTheOwnerOnly) {
  IssueOptions server;
  server.ip_addresses = {"10.0.0.1"};
  Must(Issue(ca_dir_, Kind::kServer, "srv", server));
  Must(Issue(ca_dir_, Kind::kClient, "c", {}));
  Must(Issue(ca_dir_, Kind::kIsland, "i", {}));
  for (const std::string& key : {paths_.CaKey(), paths_.Key(Kind::kServer, "srv"), paths_.Key(Kind::kClient, "c"),
                                 paths_.Key(Kind::kIsland, "i")}) {
    struct stat st {};
    ASSERT_EQ(::stat(key.c_str(), &st), 0) << key;
    EXPECT_EQ(st.st_mode & 0777, 0600u) << key;
  }
}

TEST_F(ProvisionTest, RefusesToOverwriteAndForceRevokesTheReplacedCertificate) {
  const Issued first = Must(Issue(ca_dir_, Kind::kClient, "alice", {}));
  const std::string key = paths_.Key(Kind::kClient, "alice");
  const std::string before = Slurp(key);
  absl::StatusOr<Issued> again = Issue(ca_dir_, Kind::kClient, "alice", {});
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(again.status().message()), HasSubstr("--force"));
  EXPECT_EQ(Slurp(key), before);

  const std::string old_cert = scratch_.File("alice-old.crt");
  std::ofstream(old_cert) << Slurp(paths_.Cert(Kind::kClient, "alice"));
  IssueOptions force;
  force.force = true;
  const Issued second = Must(Issue(ca_dir_, Kind::kClient, "alice", force));
  EXPECT_NE(second.serial_hex, first.serial_hex);
  EXPECT_NE(Slurp(key), before);
  EXPECT_EQ(VerifyCode(paths_.CaCert(), old_cert, paths_.Crl()), X509_V_ERR_CERT_REVOKED);
  EXPECT_EQ(VerifyCode(paths_.CaCert(), paths_.Cert(Kind::kClient, "alice"), paths_.Crl()), X509_V_OK);

  // init does not touch an existing CA.
  EXPECT_EQ(CreateCa(ca_dir_, CaOptions{}).code(), absl::StatusCode::kAlreadyExists);
}

TEST_F(ProvisionTest, RejectsBadNamesAndServerAddresses) {
  for (const std::string& bad :
       {std::string(""), std::string("a/b"), std::string(".."), std::string(65, 'x'), std::string("sp ace")}) {
    EXPECT_EQ(Issue(ca_dir_, Kind::kClient, bad, {}).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_TRUE(Issue(ca_dir_, Kind::kClient, std::string(64, 'x'), {}).ok());
  EXPECT_EQ(Issue(ca_dir_, Kind::kServer, "srv", {}).status().code(), absl::StatusCode::kInvalidArgument);
  IssueOptions bad_ip;
  bad_ip.ip_addresses = {"300.1.1.1"};
  EXPECT_THAT(std::string(Issue(ca_dir_, Kind::kServer, "srv", bad_ip).status().message()), HasSubstr("300.1.1.1"));
  IssueOptions bad_dns;
  bad_dns.dns_names = {"a,URI:evil"};
  EXPECT_EQ(Issue(ca_dir_, Kind::kServer, "srv", bad_dns).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ProvisionNoCaTest, IssuingWithoutACaSaysWhatToDo) {
  fl::testing::ScratchDir scratch("pki");
  absl::StatusOr<Issued> i = Issue(scratch.File("none"), Kind::kClient, "alice", {});
  EXPECT_FALSE(i.ok());
  EXPECT_THAT(std::string(i.status().message()), HasSubstr("fl-provision init"));
}

// X.509 caps a common name at 64 characters; OpenSSL's refusal said only "string too long", and a CA named after a
// long manifest name failed the whole run with it (fl-islands-run's "fl-islands-run CA for <name>").
TEST(CommonNameTest, ALongCommonNameIsRefusedNamingItAndTheLimit) {
  fl::testing::ScratchDir scratch("pki_cn");
  CaOptions ca;
  ca.common_name = std::string(65, 'c');
  absl::Status s = CreateCa(scratch.File("long"), ca);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr(ca.common_name), HasSubstr("65 characters"), HasSubstr("at most 64")));
  ca.common_name = std::string(64, 'c');
  ASSERT_TRUE(CreateCa(scratch.File("fits"), ca).ok());
  auto cert = ReadCert(Paths{scratch.File("fits")}.CaCert());
  EXPECT_EQ(CommonName(cert.get()), ca.common_name);
  ASSERT_TRUE(CreateCa(scratch.File("issuer"), CaOptions{}).ok());
  absl::StatusOr<Issued> client = Issue(scratch.File("issuer"), Kind::kClient, std::string(70, 'n'), {});
  EXPECT_FALSE(client.ok());
  EXPECT_THAT(client.status().message(), HasSubstr("1-64 characters"));  // names are checked before the CN
}

TEST(CommonNameTest, FitCommonNameKeepsShortNamesAndFitsLongOnesDistinctly) {
  EXPECT_EQ(FitCommonName("fl-islands-run CA for onebit-adam"), "fl-islands-run CA for onebit-adam");
  const std::string base = "fl-islands-run CA for onebit-table-streaming-fp4-wan-100mbit-40ms-";
  const std::string a = FitCommonName(base + "gru"), b = FitCommonName(base + "char-lm");
  EXPECT_EQ(a.size(), kMaxCommonNameLength);
  EXPECT_EQ(b.size(), kMaxCommonNameLength);
  EXPECT_NE(a, b);
  EXPECT_EQ(a.substr(0, 55), base.substr(0, 55));
  EXPECT_EQ(a, FitCommonName(base + "gru"));  // the same name, the same common name
  // Multi-byte characters count once and are never cut in half.
  std::string greek;
  for (int i = 0; i < 70; ++i) greek += "\xce\xbb";  // U+03BB, two bytes each
  const std::string g = FitCommonName(greek);
  EXPECT_EQ(g.size(), 55 * 2 + 9u);
  EXPECT_EQ(FitCommonName(greek.substr(0, 64 * 2)), greek.substr(0, 64 * 2));
  // And a CA under a fitted name is made.
  fl::testing::ScratchDir scratch("pki_fit");
  CaOptions ca;
  ca.common_name = a;
  EXPECT_TRUE(CreateCa(scratch.File("ca"), ca).ok());
}

}  // namespace
}  // namespace fl::pki
