// The provisioned certificates in a real gRPC mutual-TLS handshake (the setup the coming fl-server/fl-client work
// will use): a client with its certificate gets through and the server sees its name; a client without one, or
// with one from another CA, does not.
#include <chrono>
#include <fstream>
#include <future>
#include <memory>
#include <sstream>
#include <string>

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <gtest/gtest.h>

#include "fl/pki/pki.h"
#include "fl/testing/scratch_dir.h"

namespace fl::pki {
namespace {

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Answers every call with what the TLS layer says about the peer: "cn=<CN> id=<peer identity>".
class WhoAmI : public grpc::CallbackGenericService {
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override {
    class Reactor : public grpc::ServerGenericBidiReactor {
     public:
      explicit Reactor(grpc::GenericCallbackServerContext* ctx) {
        std::shared_ptr<const grpc::AuthContext> auth = ctx->auth_context();
        std::string cn, id;
        for (const grpc::string_ref& v : auth->FindPropertyValues("x509_common_name")) cn.assign(v.data(), v.size());
        for (const grpc::string_ref& v : auth->GetPeerIdentity()) id += std::string(v.data(), v.size()) + ",";
        reply_ = "cn=" + cn + " id=" + id;
        StartRead(&request_);
      }
      void OnReadDone(bool ok) override {
        if (!ok) {
          Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no request"));
          return;
        }
        grpc::Slice s(reply_);
        response_ = grpc::ByteBuffer(&s, 1);
        StartWriteAndFinish(&response_, grpc::WriteOptions(), grpc::Status::OK);
      }
      void OnDone() override { delete this; }

     private:
      std::string reply_;
      grpc::ByteBuffer request_, response_;
    };
    return new Reactor(ctx);
  }
};

class MtlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(CreateCa(dir_, CaOptions{}).ok());
    IssueOptions server;
    server.ip_addresses = {"127.0.0.1"};
    ASSERT_TRUE(Issue(dir_, Kind::kServer, "server", server).ok());
    ASSERT_TRUE(Issue(dir_, Kind::kClient, "alice", {}).ok());
    ASSERT_TRUE(CreateCa(other_, CaOptions{}).ok());
    ASSERT_TRUE(Issue(other_, Kind::kClient, "mallory", {}).ok());

    grpc::SslServerCredentialsOptions o(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    o.pem_root_certs = Slurp(paths_.CaCert());
    o.pem_key_cert_pairs.push_back(
        {Slurp(paths_.Key(Kind::kServer, "server")), Slurp(paths_.Cert(Kind::kServer, "server"))});
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::SslServerCredentials(o), &port_);
    b.RegisterCallbackGenericService(&service_);
    server_ = b.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port_, 0);
  }
  void TearDown() override {
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  }

  // One unary call with the given client key and certificate (empty: none); the reply or the failure.
  grpc::Status Call(const std::string& key, const std::string& cert, std::string* reply) {
    grpc::SslCredentialsOptions o;
    o.pem_root_certs = Slurp(paths_.CaCert());
    o.pem_private_key = key;
    o.pem_cert_chain = cert;
    auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(port_), grpc::SslCredentials(o));
    grpc::GenericStub stub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    grpc::Slice s(std::string("who"));
    grpc::ByteBuffer request(&s, 1), response;
    std::promise<grpc::Status> done;
    stub.UnaryCall(&ctx, "/fl.test.WhoAmI/Ask", grpc::StubOptions(), &request, &response,
                   [&done](grpc::Status status) { done.set_value(std::move(status)); });
    grpc::Status status = done.get_future().get();
    std::vector<grpc::Slice> slices;
    if (status.ok() && response.Dump(&slices).ok()) {
      for (const grpc::Slice& piece : slices) reply->append(reinterpret_cast<const char*>(piece.begin()), piece.size());
    }
    return status;
  }

  fl::testing::ScratchDir scratch_{"pki_mtls"};
  std::string dir_ = scratch_.File("ca");
  std::string other_ = scratch_.File("other");
  Paths paths_{dir_};
  WhoAmI service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

TEST_F(MtlsTest, ProvisionedClientConnectsAndTheServerSeesItsName) {
  std::string reply;
  grpc::Status s = Call(Slurp(paths_.Key(Kind::kClient, "alice")), Slurp(paths_.Cert(Kind::kClient, "alice")), &reply);
  ASSERT_TRUE(s.ok()) << s.error_code() << " " << s.error_message();
  EXPECT_NE(reply.find("cn=alice "), std::string::npos) << reply;
  EXPECT_NE(reply.find("fl-client://alice"), std::string::npos) << reply;
}

TEST_F(MtlsTest, ClientWithoutACertificateFailsTheHandshake) {
  std::string reply;
  grpc::Status s = Call("", "", &reply);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  EXPECT_TRUE(reply.empty());
}

TEST_F(MtlsTest, ClientWithACertificateFromAnotherCaFailsTheHandshake) {
  std::string reply;
  const Paths other{other_};
  grpc::Status s =
      Call(Slurp(other.Key(Kind::kClient, "mallory")), Slurp(other.Cert(Kind::kClient, "mallory")), &reply);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  EXPECT_TRUE(reply.empty());
}

}  // namespace
}  // namespace fl::pki
