// A throwaway CA for the tests of mutual TLS (tls_test, security_test, security_process_test): a server
// certificate for 127.0.0.1, client certificates by name, and what a server or a raw gRPC client needs of them.
#pragma once

#include <fstream>
#include <initializer_list>
#include <memory>
#include <sstream>
#include <string>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "fl/pki/pki.h"
#include "fl/rpc/tls.h"

namespace fl::server::test_pki {

inline std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

class TestPki {
 public:
  // Creates the CA in `dir` with a server certificate "server" for 127.0.0.1 and a client certificate per name.
  TestPki(const std::string& dir, std::initializer_list<const char*> clients) : paths_{dir} {
    EXPECT_TRUE(pki::CreateCa(dir, pki::CaOptions{}).ok());
    pki::IssueOptions server;
    server.ip_addresses = {"127.0.0.1"};
    EXPECT_TRUE(pki::Issue(dir, pki::Kind::kServer, "server", server).ok());
    for (const char* name : clients) EXPECT_TRUE(pki::Issue(dir, pki::Kind::kClient, name, {}).ok());
  }

  const std::string& dir() const { return paths_.dir; }
  const pki::Paths& paths() const { return paths_; }
  rpc::ServerTls ServerTls() const {
    return {paths_.Cert(pki::Kind::kServer, "server"), paths_.Key(pki::Kind::kServer, "server"), paths_.CaCert()};
  }
  rpc::ClientTls ClientTls(const std::string& name) const {
    return {paths_.CaCert(), paths_.Cert(pki::Kind::kClient, name), paths_.Key(pki::Kind::kClient, name), ""};
  }
  // gRPC credentials presenting `name`'s certificate (of `kind`) and trusting this CA.
  std::shared_ptr<grpc::ChannelCredentials> Credentials(const std::string& name,
                                                        pki::Kind kind = pki::Kind::kClient) const {
    grpc::SslCredentialsOptions o;
    o.pem_root_certs = Slurp(paths_.CaCert());
    o.pem_cert_chain = Slurp(paths_.Cert(kind, name));
    o.pem_private_key = Slurp(paths_.Key(kind, name));
    return grpc::SslCredentials(o);
  }

 private:
  pki::Paths paths_;
};

}  // namespace fl::server::test_pki
