// What the server reads of the PKI at run time: the identity in a peer's certificate and the revocation list.
#include "fl/pki/revocation.h"

#include <filesystem>
#include <set>

#include <fstream>
#include <sstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "fl/pki/pki.h"
#include "fl/pki/revocation_watcher.h"
#include "fl/testing/scratch_dir.h"

namespace fl::pki {
namespace {

using ::testing::HasSubstr;

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

class RevocationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CaOptions ca;
    ASSERT_TRUE(CreateCa(dir_, ca).ok());
  }
  Issued Must(absl::StatusOr<Issued> i) {
    EXPECT_TRUE(i.ok()) << i.status();
    return i.ok() ? *i : Issued{};
  }
  fl::testing::ScratchDir scratch_{"pki-revocation"};
  std::string dir_ = scratch_.File("ca");
  Paths paths_{dir_};
};

TEST_F(RevocationTest, ClientCertificateNamesItsClientSerialAndExpiry) {
  const Issued alice = Must(Issue(dir_, Kind::kClient, "alice", {}));
  absl::StatusOr<PeerCertificate> peer = ParsePeerCertificate(Slurp(paths_.Cert(Kind::kClient, "alice")));
  ASSERT_TRUE(peer.ok()) << peer.status();
  EXPECT_EQ(peer->name, "alice");
  EXPECT_EQ(peer->kind, Kind::kClient);
  EXPECT_EQ(peer->serial_hex, alice.serial_hex);
  EXPECT_EQ(peer->not_after, alice.not_after);
}

TEST_F(RevocationTest, IslandCertificateIsAnIslandAndServerCertificateHasNoKind) {
  Must(Issue(dir_, Kind::kIsland, "island-3", {}));
  IssueOptions server;
  server.dns_names = {"localhost"};
  Must(Issue(dir_, Kind::kServer, "coordinator", server));
  absl::StatusOr<PeerCertificate> island = ParsePeerCertificate(Slurp(paths_.Cert(Kind::kIsland, "island-3")));
  ASSERT_TRUE(island.ok()) << island.status();
  EXPECT_EQ(island->name, "island-3");
  EXPECT_EQ(island->kind, Kind::kIsland);
  absl::StatusOr<PeerCertificate> other = ParsePeerCertificate(Slurp(paths_.Cert(Kind::kServer, "coordinator")));
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(other->name, "coordinator");  // the CN: no fl-client:// or fl-island:// SAN
  EXPECT_FALSE(other->kind.has_value());
}

TEST_F(RevocationTest, GarbageIsNotACertificate) {
  absl::StatusOr<PeerCertificate> peer = ParsePeerCertificate("-----BEGIN CERTIFICATE-----\nnope\n");
  ASSERT_FALSE(peer.ok());
  EXPECT_THAT(peer.status().message(), HasSubstr("not a PEM X.509 certificate"));
}

TEST_F(RevocationTest, ListHoldsExactlyTheRevokedSerialsAfterEachRevoke) {
  const Issued alice = Must(Issue(dir_, Kind::kClient, "alice", {}));
  const Issued bob = Must(Issue(dir_, Kind::kClient, "bob", {}));
  absl::StatusOr<RevocationList> before = RevocationList::Load(paths_.Crl(), paths_.CaCert());
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_TRUE(before->serials().empty());
  EXPECT_GT(before->next_update(), 0);

  ASSERT_TRUE(Revoke(dir_, "alice").ok());
  absl::StatusOr<RevocationList> after = RevocationList::Load(paths_.Crl(), paths_.CaCert());
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_TRUE(after->IsRevoked(alice.serial_hex));
  EXPECT_FALSE(after->IsRevoked(bob.serial_hex));
  EXPECT_EQ(after->serials().size(), 1u);
  EXPECT_GT(after->crl_number(), before->crl_number());
}

TEST_F(RevocationTest, ListSignedByAnotherCaIsRefused) {
  const std::string other = scratch_.File("other-ca");
  ASSERT_TRUE(CreateCa(other, CaOptions{}).ok());
  absl::StatusOr<RevocationList> list = RevocationList::Load(Paths{other}.Crl(), paths_.CaCert());
  ASSERT_FALSE(list.ok());
  EXPECT_EQ(list.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(list.status().message(), HasSubstr("is not signed by the CA of " + paths_.CaCert()));
}

TEST_F(RevocationTest, MissingOrMalformedListNamesTheFile) {
  absl::StatusOr<RevocationList> missing = RevocationList::Load(scratch_.File("absent.pem"), paths_.CaCert());
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr(scratch_.File("absent.pem")));
  // A certificate is not a CRL.
  absl::StatusOr<RevocationList> wrong = RevocationList::Load(paths_.CaCert(), paths_.CaCert());
  ASSERT_FALSE(wrong.ok());
  EXPECT_THAT(wrong.status().message(), HasSubstr("is not a PEM certificate revocation list"));
}

TEST(RevocationWatcherTest, ListThatFailsToLoadLeavesThePreviousOneInForce) {
  fl::testing::ScratchDir dir("fl_revocation_watcher");
  const std::string ca = dir.File("pki"), other = dir.File("other");
  ASSERT_TRUE(CreateCa(ca, CaOptions{}).ok());
  ASSERT_TRUE(CreateCa(other, CaOptions{}).ok());
  absl::StatusOr<Issued> alice = Issue(ca, Kind::kClient, "alice", {});
  ASSERT_TRUE(alice.ok());
  const Paths paths{ca};
  std::set<std::string> told;
  auto watcher = RevocationWatcher::Start({paths.Crl(), paths.CaCert(), 3'600'000},
                                          [&told](const std::set<std::string>& s) { told.insert(s.begin(), s.end()); });
  ASSERT_TRUE(watcher.ok()) << watcher.status();
  EXPECT_FALSE((*watcher)->IsRevoked(alice->serial_hex));

  ASSERT_TRUE(Revoke(ca, "alice").ok());
  EXPECT_TRUE((*watcher)->ReloadIfChanged());
  EXPECT_TRUE((*watcher)->IsRevoked(alice->serial_hex));
  EXPECT_EQ(told, std::set<std::string>{alice->serial_hex});

  // Someone puts another CA's (empty) list in its place: it would un-revoke alice, so it is not taken.
  std::filesystem::copy_file(Paths{other}.Crl(), paths.Crl(), std::filesystem::copy_options::overwrite_existing);
  EXPECT_FALSE((*watcher)->ReloadIfChanged());
  EXPECT_TRUE((*watcher)->IsRevoked(alice->serial_hex));
}

TEST(RevocationWatcherTest, MissingListIsAnErrorNamingTheFile) {
  fl::testing::ScratchDir dir("fl_revocation_watcher");
  ASSERT_TRUE(CreateCa(dir.File("pki"), CaOptions{}).ok());
  auto watcher = RevocationWatcher::Start({dir.File("nowhere.pem"), Paths{dir.File("pki")}.CaCert(), 1000}, nullptr);
  ASSERT_FALSE(watcher.ok());
  EXPECT_THAT(watcher.status().message(), ::testing::HasSubstr(dir.File("nowhere.pem")));
}

}  // namespace
}  // namespace fl::pki
