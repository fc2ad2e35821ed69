// Secure federation through the real binaries (issue 15, "Tests"): fl-server serving mutual TLS with a revocation
// list, honest fl-clients, and hostile peers — a certificate from another CA, an expired one, a revoked one, one
// revoked during the run, a name that does not match its certificate, a client acting for another, an upload that
// never sends its header, a join flood. Each is refused with a clear error on both sides; the server stays healthy
// and the federation's rounds are all committed afterwards.
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "fl/core/str_cat.h"
#include "fl/pki/pki.h"
#include "fl/testing/scratch_dir.h"
#include "fl/testing/subprocess.h"
#include "fl/v1/federation.grpc.pb.h"
#include "records_polling.h"
#include "test_pki.h"

namespace fl::server {
namespace {

using fl::testing::Subprocess;
using process_testing::Query;
using process_testing::ReadFile;
using process_testing::WaitFor;
using ::testing::HasSubstr;

class SecurityProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    pki::IssueOptions expired;
    expired.validity = {-7200, -3600};  // valid for an hour, which ended an hour ago
    ASSERT_TRUE(pki::Issue(ca_, pki::Kind::kClient, "eve", expired).ok());
    ASSERT_TRUE(pki::Revoke(ca_, "rita").ok());
    // Another CA issuing a certificate for an honest client's name.
    ASSERT_TRUE(pki::CreateCa(other_, pki::CaOptions{}).ok());
    ASSERT_TRUE(pki::Issue(other_, pki::Kind::kClient, "c0", {}).ok());
  }

  std::vector<std::string> ServerArgv() const {
    return {FL_SERVER_BIN,
            "--listen",
            address_,
            "--db",
            db_,
            "--rounds",
            "4",
            "--min-fit-clients",
            "2",
            "--min-available-clients",
            "2",
            "--evaluate-every",
            "0",
            "--heartbeat-interval-ms",
            "300",
            "--upload-message-timeout-ms",
            "1000",
            "--round-deadline-ms",
            "5000",  // a round rob leaves fails soon and is retried once c1 is there
            "--log-level",
            "info",
            "--tls-cert",
            paths_.Cert(pki::Kind::kServer, "server"),
            "--tls-key",
            paths_.Key(pki::Kind::kServer, "server"),
            "--tls-client-ca",
            paths_.CaCert(),
            "--tls-crl",
            paths_.Crl(),
            "--tls-crl-reload-ms",
            "100"};
  }
  // An fl-client named `name` presenting `cert_name`'s certificate from the CA in `ca_dir`.
  std::vector<std::string> ClientArgv(const std::string& name, const std::string& cert_name, const std::string& ca_dir,
                                      int give_up_s = 120) const {
    const pki::Paths p{ca_dir};
    return {FL_CLIENT_BIN,
            "--server",
            address_,
            "--name",
            name,
            "--model",
            "synthetic:20000:300",
            "--give-up-after-s",
            std::to_string(give_up_s),
            "--log-level",
            "info",
            "--tls-ca",
            paths_.CaCert(),  // every client trusts the real server's CA
            "--tls-cert",
            p.Cert(pki::Kind::kClient, cert_name),
            "--tls-key",
            p.Key(pki::Kind::kClient, cert_name)};
  }
  // A gRPC stub presenting `name`'s certificate.
  std::unique_ptr<fl::v1::Federation::Stub> Stub(const std::string& name) const {
    return fl::v1::Federation::NewStub(grpc::CreateChannel(address_, pki_.Credentials(name)));
  }
  // Runs `argv` to its end (at most `timeout`): its exit code and output.
  std::pair<int, std::string> RunToEnd(const std::vector<std::string>& argv, const std::string& log,
                                       std::chrono::seconds timeout) {
    Subprocess p(argv, dir_.File(log));
    const std::optional<int> code = p.Wait(timeout);
    EXPECT_TRUE(code.has_value()) << log << " did not end: " << ReadFile(dir_.File(log));
    return {code.value_or(-1), ReadFile(dir_.File(log))};
  }
  int64_t Events(const std::string& reason) const {
    return Query(db_, fl::StrCat("SELECT count(*) FROM security_events WHERE reason = '", reason, "'"));
  }

  fl::testing::ScratchDir dir_{"fl_security_process"};
  test_pki::TestPki pki_{dir_.File("pki"), {"c0", "c1", "rob", "rita", "mallory"}};
  std::string ca_ = pki_.dir();
  std::string other_ = dir_.File("other-ca");
  const pki::Paths& paths_ = pki_.paths();
  std::string db_ = dir_.File("records.db");
  std::string address_ = fl::StrCat("127.0.0.1:", fl::testing::FreeLoopbackPort());
};

TEST_F(SecurityProcessTest, HostilePeersAreRefusedAndTheFederationFinishes) {
  const std::string log = dir_.File("server.txt");
  Subprocess server(ServerArgv(), log);
  Subprocess c0(ClientArgv("c0", "c0", ca_), dir_.File("c0.txt"));
  Subprocess rob(ClientArgv("rob", "rob", ca_), dir_.File("rob.txt"));
  ASSERT_TRUE(WaitFor(db_, "SELECT count(*) FROM rounds WHERE status = 'committed'", 1, std::chrono::seconds(90)))
      << ReadFile(log);

  // rob's certificate is revoked during the run: its session is closed, its rejoin refused, and it stops.
  ASSERT_TRUE(pki::Revoke(ca_, "rob").ok());
  auto rob_code = rob.Wait(std::chrono::seconds(60));
  ASSERT_TRUE(rob_code.has_value()) << ReadFile(dir_.File("rob.txt"));
  EXPECT_NE(*rob_code, 0);
  EXPECT_THAT(ReadFile(dir_.File("rob.txt")), HasSubstr("is revoked"));

  // A certificate that was revoked before the run.
  auto [rita_code, rita_out] = RunToEnd(ClientArgv("rita", "rita", ca_), "rita.txt", std::chrono::seconds(60));
  EXPECT_NE(rita_code, 0);
  EXPECT_THAT(rita_out, HasSubstr("is revoked"));
  // A name that is not the certificate's.
  auto [name_code, name_out] = RunToEnd(ClientArgv("c9", "mallory", ca_), "c9.txt", std::chrono::seconds(60));
  EXPECT_NE(name_code, 0);
  EXPECT_THAT(name_out, HasSubstr("client certificate is for \"mallory\" but the Join is for client_name \"c9\""));
  // A certificate from another CA, and an expired one: the handshake fails, the client gives up saying why.
  auto [other_code, other_out] = RunToEnd(ClientArgv("c0", "c0", other_, 3), "other-ca.txt", std::chrono::seconds(60));
  EXPECT_NE(other_code, 0);
  EXPECT_THAT(other_out, HasSubstr("cannot reach fl-server"));
  auto [eve_code, eve_out] = RunToEnd(ClientArgv("eve", "eve", ca_, 3), "eve.txt", std::chrono::seconds(60));
  EXPECT_NE(eve_code, 0);
  EXPECT_THAT(eve_out, HasSubstr("cannot reach fl-server"));

  auto mallory = Stub("mallory");
  {
    // Acting for c0 (its name is known; its token is not needed to be refused).
    fl::v1::DownloadModelRequest req;
    req.set_client_id("c0");
    req.set_session_token("stolen");
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto reader = mallory->DownloadModel(&ctx, req);
    fl::v1::ModelChunk chunk;
    EXPECT_FALSE(reader->Read(&chunk));
    const grpc::Status s = reader->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr("acts for client \"c0\""));
  }
  {
    // An upload that never sends its header is cut off at --upload-message-timeout-ms.
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    fl::v1::UploadUpdateResponse resp;
    auto writer = mallory->UploadUpdate(&ctx, &resp);
    const grpc::Status s = writer->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr("--upload-message-timeout-ms"));
  }
  {
    // A join flood under mallory's own name: the first few get in, the rest are refused until the rate allows.
    int limited = 0;
    for (int i = 0; i < 40; ++i) {
      fl::v1::JoinRequest req;
      req.set_protocol_version(fl::v1::PROTOCOL_VERSION_3);
      req.set_client_name("mallory");
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
      fl::v1::JoinResponse resp;
      if (mallory->Join(&ctx, req, &resp).error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) ++limited;
    }
    EXPECT_GE(limited, 1);
  }

  // The honest second client arrives late and the federation completes every round.
  Subprocess c1(ClientArgv("c1", "c1", ca_), dir_.File("c1.txt"));
  auto server_code = server.Wait(std::chrono::seconds(180));
  ASSERT_TRUE(server_code.has_value()) << ReadFile(log);
  EXPECT_EQ(*server_code, 0) << ReadFile(log);
  EXPECT_EQ(Query(db_, "SELECT count(*) FROM rounds WHERE status = 'committed'"), 4);
  for (Subprocess* c : {&c0, &c1}) {
    auto code = c->Wait(std::chrono::seconds(60));
    ASSERT_TRUE(code.has_value());
    EXPECT_EQ(*code, 0);
  }

  // The server's side of each refusal: its log, and a security_events row with the reason.
  const std::string server_out = ReadFile(log);
  EXPECT_THAT(server_out, HasSubstr("the certificate of client \"rob\""));
  EXPECT_GE(Events("revoked_certificate"), 3);  // rob's session closed, rob's rejoin, rita's join
  EXPECT_EQ(Events("name_mismatch"), 1);
  EXPECT_GE(Events("wrong_identity"), 1);
  EXPECT_EQ(Events("stream_deadline"), 1);
  EXPECT_GE(Events("join_rate"), 1);
  EXPECT_EQ(Query(db_, "SELECT count(*) FROM security_events WHERE peer NOT LIKE 'ipv4:127.0.0.1:%'"), 0);
}

}  // namespace
}  // namespace fl::server
