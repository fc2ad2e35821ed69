// Mutual TLS on the islands' control plane with certificates from fl::pki: a real coordinator server and real
// islands' clients on loopback. An island is who its certificate says (fl-island://<name>); a client certificate,
// a certificate from another CA and a plaintext island are turned away with errors that say what to do; the
// state transfer between islands checks the source island's certificate.
#include <chrono>
#include <filesystem>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "coord_test_util.h"
#include "fl/core/checksum.h"
#include "fl/pki/pki.h"
#include "fl/testing/scratch_dir.h"

namespace fl::diloco::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// Field by field: the struct may grow (revocation), and what is not set here keeps its default.
rpc::ServerTls ServerTlsOf(const std::string& cert, const std::string& key, const std::string& ca) {
  rpc::ServerTls tls;
  tls.cert_file = cert;
  tls.key_file = key;
  tls.client_ca_file = ca;
  return tls;
}

class IslandsTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ca_ = dir_.File("pki");
    other_ = dir_.File("other");
    ASSERT_TRUE(pki::CreateCa(ca_, {}).ok());
    ASSERT_TRUE(pki::CreateCa(other_, {}).ok());
    pki::IssueOptions server;
    server.ip_addresses = {"127.0.0.1"};
    ASSERT_TRUE(pki::Issue(ca_, pki::Kind::kServer, "coordinator", server).ok());
    for (const char* island : {"a", "b"}) ASSERT_TRUE(pki::Issue(ca_, pki::Kind::kIsland, island, {}).ok());
    ASSERT_TRUE(pki::Issue(ca_, pki::Kind::kClient, "c", {}).ok());
    ASSERT_TRUE(pki::Issue(other_, pki::Kind::kIsland, "a", {}).ok());
    const pki::Paths p{ca_};
    server_tls_ =
        ServerTlsOf(p.Cert(pki::Kind::kServer, "coordinator"), p.Key(pki::Kind::kServer, "coordinator"), p.CaCert());
    harness_ = std::make_unique<CoordinatorHarness>(TestOptions(1), nullptr, nullptr, server_tls_);
  }

  // The island side of mutual TLS: trusts our CA, presents `kind` certificate `name` of the CA in `dir`.
  rpc::ClientTls Tls(const std::string& dir, pki::Kind kind, const std::string& name) const {
    const pki::Paths p{dir};
    rpc::ClientTls tls;
    tls.ca_file = pki::Paths{ca_}.CaCert();
    tls.cert_file = p.Cert(kind, name);
    tls.key_file = p.Key(kind, name);
    return tls;
  }
  CoordinatorClientOptions Options(std::optional<rpc::ClientTls> tls) const {
    CoordinatorClientOptions o;
    o.tls = std::move(tls);
    o.connect_timeout = absl::Seconds(60);  // failures below must come from the handshake, long before this
    return o;
  }

  fl::testing::ScratchDir dir_{"fl_islands_tls"};
  std::string ca_, other_;
  rpc::ServerTls server_tls_;
  std::unique_ptr<CoordinatorHarness> harness_;
};

TEST_F(IslandsTlsTest, AnIslandWithItsOwnCertificateJoinsAndSyncs) {
  SimIsland a("a", Options(Tls(ca_, pki::Kind::kIsland, "a")));
  auto assignment = a.Connect(harness_->address());
  ASSERT_TRUE(assignment.ok()) << assignment.status();
  auto plans = BeginAll({&a}, SyncKey{0, 0});
  ASSERT_TRUE(plans[0].ok()) << plans[0].status();
  auto verdicts = ApplyAndReportAll({&a}, plans);
  ASSERT_TRUE(verdicts[0].ok()) << verdicts[0].status();
  EXPECT_EQ(verdicts[0]->kind, VerdictKind::kCommit);
  EXPECT_TRUE(a.client->Leave("done").ok());
}

TEST_F(IslandsTlsTest, AnIslandClaimingAnotherNameThanItsCertificatesIsRefused) {
  SimIsland b("b", Options(Tls(ca_, pki::Kind::kIsland, "a")));  // a's certificate, b's name
  auto assignment = b.Connect(harness_->address());
  ASSERT_FALSE(assignment.ok());
  EXPECT_EQ(assignment.status().code(), absl::StatusCode::kPermissionDenied) << assignment.status();
  EXPECT_THAT(std::string(assignment.status().message()),
              AllOf(HasSubstr("island certificate is for \"a\""), HasSubstr("island_id \"b\""),
                    HasSubstr("--island-id a"), HasSubstr("fl-provision add-island b")));
  EXPECT_TRUE(harness_->coordinator().Snapshot().members.empty());
}

TEST_F(IslandsTlsTest, AClientCertificateIsNoIslandsEvenUnderItsOwnName) {
  SimIsland c("c", Options(Tls(ca_, pki::Kind::kClient, "c")));
  auto assignment = c.Connect(harness_->address());
  ASSERT_FALSE(assignment.ok());
  EXPECT_EQ(assignment.status().code(), absl::StatusCode::kPermissionDenied) << assignment.status();
  EXPECT_THAT(std::string(assignment.status().message()),
              AllOf(HasSubstr("is not an island certificate"), HasSubstr("fl-island://")));
}

TEST_F(IslandsTlsTest, AnIslandWithACertificateFromAnotherCaFailsTheHandshake) {
  SimIsland a("a", Options(Tls(other_, pki::Kind::kIsland, "a")));
  const auto start = std::chrono::steady_clock::now();
  auto assignment = a.Connect(harness_->address());
  ASSERT_FALSE(assignment.ok());
  EXPECT_EQ(assignment.status().code(), absl::StatusCode::kUnavailable) << assignment.status();
  EXPECT_THAT(std::string(assignment.status().message()),
              AllOf(HasSubstr("TLS handshake with the coordinator failed"), HasSubstr("--tls-ca")));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(50)) << "not the connect timeout";
}

TEST_F(IslandsTlsTest, APlaintextIslandIsTurnedAwayWithAHintAtTls) {
  SimIsland a("a", Options(std::nullopt));
  auto assignment = a.Connect(harness_->address());
  ASSERT_FALSE(assignment.ok());
  EXPECT_EQ(assignment.status().code(), absl::StatusCode::kUnavailable) << assignment.status();
  EXPECT_THAT(std::string(assignment.status().message()),
              AllOf(HasSubstr("serves mutual TLS"), HasSubstr("--tls-ca, --tls-cert and --tls-key")));
  // An island with its certificate gets in afterwards: nothing was left half-admitted.
  SimIsland good("a", Options(Tls(ca_, pki::Kind::kIsland, "a")));
  EXPECT_TRUE(good.Connect(harness_->address()).ok());
}

TEST_F(IslandsTlsTest, StateTransferChecksTheSourceIslandsCertificate) {
  const pki::Paths p{ca_};
  auto server = StateServer::Start(
      "127.0.0.1:0", 2, ServerTlsOf(p.Cert(pki::Kind::kIsland, "a"), p.Key(pki::Kind::kIsland, "a"), p.CaCert()));
  ASSERT_TRUE(server.ok()) << server.status();
  std::vector<uint8_t> image(100000);
  for (size_t i = 0; i < image.size(); ++i) image[i] = static_cast<uint8_t>(i * 31);
  const uint64_t hash = core::Checksum64(image);
  (*server)->Publish({SyncKey{3, 0}, hash, image});

  FetchOptions fetch;
  fetch.tls = Tls(ca_, pki::Kind::kIsland, "b");
  fetch.peer_island = "a";
  fetch.timeout = absl::Seconds(20);
  auto snap = FetchState((*server)->endpoint(), hash, fetch);
  ASSERT_TRUE(snap.ok()) << snap.status();
  EXPECT_EQ(snap->image, image);

  // The endpoint is served by a, not by the island the coordinator named: refused.
  fetch.peer_island = "b";
  EXPECT_EQ(FetchState((*server)->endpoint(), hash, fetch).status().code(), absl::StatusCode::kUnavailable);
  // Plaintext, and a certificate of another CA, never get the state.
  FetchOptions plain;
  plain.timeout = absl::Seconds(20);
  EXPECT_FALSE(FetchState((*server)->endpoint(), hash, plain).ok());
  fetch.peer_island = "a";
  fetch.tls = Tls(other_, pki::Kind::kIsland, "a");
  EXPECT_FALSE(FetchState((*server)->endpoint(), hash, fetch).ok());
  // A client certificate of the same CA gets through the handshake but is no island.
  fetch.tls = Tls(ca_, pki::Kind::kClient, "c");
  absl::StatusOr<StateSnapshot> client = FetchState((*server)->endpoint(), hash, fetch);
  EXPECT_EQ(client.status().code(), absl::StatusCode::kPermissionDenied) << client.status();
  EXPECT_THAT(std::string(client.status().message()), HasSubstr("islands only"));
  EXPECT_EQ((*server)->transfers_served(), 1u);
}

}  // namespace
}  // namespace fl::diloco::testing
