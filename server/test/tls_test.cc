// Mutual TLS on the federation channel: an fl-server engine and service behind rpc::ServerTls with certificates
// provisioned by fl::pki, real client sessions with client::ClientTls. The name in a client's certificate is the
// only name it may join under; a client without TLS does not get in, and does not hurt the server.
#include <chrono>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/credentials.h>
#include <gtest/gtest.h>

#include "fl/pki/pki.h"
#include "fl/testing/scratch_dir.h"
#include "federation_harness.h"
#include "test_pki.h"

namespace fl::server {
namespace {

using namespace test_harness;  // NOLINT: the harness is this file's vocabulary

EngineConfig OneClientConfig(const std::string& checkpoint_dir) {
  EngineConfig c = SmallConfig(checkpoint_dir);
  c.fit = {1.0, 1, 1};
  return c;
}

class TlsTest : public ::testing::Test {
 protected:
  rpc::ServerTls ServerTls() const { return pki_.ServerTls(); }
  client::ClientTls ClientTls(const std::string& name) const { return pki_.ClientTls(name); }
  std::shared_ptr<grpc::ChannelCredentials> RawCredentials(const std::string& name) const {
    return pki_.Credentials(name);
  }
  std::unique_ptr<RunningClient> Start(TestServer& server, const std::string& name,
                                       const std::optional<client::ClientTls>& tls, uint64_t seed = 1) {
    return StartClient(server.address(), name, seed, "ethernet", 0, 0, "classification", tls);
  }

  fl::testing::ScratchDir dir_{"fl_tls"};
  test_pki::TestPki pki_{dir_.File("pki"), {"alice", "carol"}};
};

TEST_F(TlsTest, ProvisionedClientJoinsUnderItsCertificateNameAndFinishes) {
  TestServer server(OneClientConfig(dir_.File("ckpt")), dir_.File("records.db"), InitialModel(1), nullptr, ServerTls());
  auto alice = Start(server, "alice", ClientTls("alice"));
  const EngineResult result = server.Wait();
  EXPECT_EQ(result.status_name(), "finished") << result.reason;
  EXPECT_EQ(result.rounds_committed, 2u);
  alice->thread.join();
  EXPECT_TRUE(alice->result.ok()) << alice->result;
}

TEST_F(TlsTest, JoinUnderAnotherNameThanTheCertificateIsRefused) {
  TestServer server(OneClientConfig(dir_.File("ckpt")), dir_.File("records.db"), InitialModel(1), nullptr, ServerTls());
  // The raw call shows the wire answer: PERMISSION_DENIED with ADMISSION_REFUSED, naming both names.
  RawClient raw(server.address(), RawCredentials("alice"));
  fl::v1::JoinResponse resp;
  const grpc::Status status = raw.Join("bob", client::SyntheticTrainer(kParams, 10, 1).spec(), &resp);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED) << status.error_message();
  const fl::v1::ErrorDetail detail = proto::ErrorFromGrpcStatus(status);
  EXPECT_EQ(detail.code(), fl::v1::ERROR_CODE_ADMISSION_REFUSED);
  EXPECT_NE(detail.message().find("\"alice\""), std::string::npos) << detail.message();
  EXPECT_NE(detail.message().find("\"bob\""), std::string::npos) << detail.message();

  // A real session takes the refusal as final instead of retrying until it gives up.
  auto bob = Start(server, "bob", ClientTls("alice"));
  bob->thread.join();
  EXPECT_EQ(bob->result.code(), absl::StatusCode::kFailedPrecondition) << bob->result;
  EXPECT_NE(bob->result.message().find("alice"), std::string::npos) << bob->result;
}

TEST_F(TlsTest, PlaintextClientDoesNotGetInAndTheServerStaysHealthy) {
  TestServer server(OneClientConfig(dir_.File("ckpt")), dir_.File("records.db"), InitialModel(1), nullptr, ServerTls());
  {
    // Without wait_for_ready, so that the failed handshake is the answer rather than a wait for the deadline.
    auto stub = fl::v1::Federation::NewStub(grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
    fl::v1::JoinRequest req;
    req.set_protocol_version(fl::v1::PROTOCOL_VERSION_3);
    req.set_client_name("carol");
    *req.mutable_model_spec() = proto::ToProto(client::SyntheticTrainer(kParams, 10, 1).spec(), "raw");
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    fl::v1::JoinResponse resp;
    const grpc::Status status = stub->Join(&ctx, req, &resp);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  }
  // An honest client afterwards gets the whole experiment done.
  auto carol = Start(server, "carol", ClientTls("carol"));
  const EngineResult result = server.Wait();
  EXPECT_EQ(result.status_name(), "finished") << result.reason;
  EXPECT_EQ(result.rounds_committed, 2u);
  carol->thread.join();
  EXPECT_TRUE(carol->result.ok()) << carol->result;
}

TEST_F(TlsTest, UnreadableFilesAreNamedWithTheirFlag) {
  rpc::ServerTls tls = ServerTls();
  tls.key_file = dir_.File("missing.key");
  FederationService* no_service = nullptr;
  auto running = rpc::StartGrpcServer(no_service, "127.0.0.1:0", tls);
  ASSERT_FALSE(running.ok());
  EXPECT_NE(running.status().message().find("--tls-key"), std::string::npos) << running.status();
  EXPECT_NE(running.status().message().find("missing.key"), std::string::npos) << running.status();

  client::SyntheticTrainer trainer(kParams, 10, 1);
  client::ClientOptions o;
  o.client_name = "alice";
  o.tls = ClientTls("alice");
  o.tls->ca_file = dir_.File("missing-ca.crt");
  client::FederatedClient session(o, &trainer);
  const absl::Status s = session.Run();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("--tls-ca"), std::string::npos) << s;
}

}  // namespace
}  // namespace fl::server
