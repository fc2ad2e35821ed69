// Secure by default, with the real binaries on loopback: fl-server and fl-client refuse to start without either
// the mutual-TLS flags or an explicit --insecure (which warns), refuse both at once, and a plaintext client
// dialling a mutual-TLS server gives up with an error that says why while the server goes on serving.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "fl/core/str_cat.h"
#include "fl/pki/pki.h"
#include "fl/testing/scratch_dir.h"
#include "fl/testing/subprocess.h"
#include "records_polling.h"

namespace fl::server {
namespace {

using fl::testing::Subprocess;
using process_testing::ReadFile;
using ::testing::HasSubstr;
using ::testing::Not;

// The exit code of `argv` run to its end (it must end within 30 s), with its output in `log`.
int RunToEnd(const std::vector<std::string>& argv, const std::string& log) {
  Subprocess p(argv, log);
  return p.Wait(std::chrono::seconds(30)).value_or(-1);
}

// The port fl-server wrote to `port_file`, or 0 when it exited or did not write it in time (the bound only ends
// a hung run; the test then fails with the log).
int WaitForPort(const std::string& port_file, const Subprocess& server) {
  for (int i = 0; i < 3000 && server.running(); ++i) {
    const std::string text = ReadFile(port_file);
    if (!text.empty() && text.back() == '\n') return std::stoi(text);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return 0;
}

// fl-server for one round of one client on a free loopback port (written to `port_file`), plus `security`.
std::vector<std::string> OneRoundServer(const std::string& port_file, std::vector<std::string> security) {
  std::vector<std::string> argv = {FL_SERVER_BIN,
                                   "--listen",
                                   "127.0.0.1:0",
                                   "--port-file",
                                   port_file,
                                   "--db",
                                   "",
                                   "--rounds",
                                   "1",
                                   "--min-fit-clients",
                                   "1",
                                   "--min-available-clients",
                                   "1",
                                   "--evaluate-every",
                                   "0",
                                   "--linger-s",
                                   "0",
                                   "--log-level",
                                   "info"};
  argv.insert(argv.end(), security.begin(), security.end());
  return argv;
}

TEST(TlsProcessTest, ServerWithoutTlsFlagsOrInsecureExits2NamingThem) {
  fl::testing::ScratchDir dir("fl_tls_proc");
  const std::string log = dir.File("server.log");
  EXPECT_EQ(RunToEnd({FL_SERVER_BIN, "--listen", "127.0.0.1:0", "--db", ""}, log), 2);
  const std::string out = ReadFile(log);
  EXPECT_THAT(out, HasSubstr("--tls-cert"));
  EXPECT_THAT(out, HasSubstr("--tls-key"));
  EXPECT_THAT(out, HasSubstr("--tls-client-ca"));
  EXPECT_THAT(out, HasSubstr("fl-provision"));
  EXPECT_THAT(out, HasSubstr("--insecure"));
  EXPECT_THAT(out, Not(HasSubstr("listening")));
}

TEST(TlsProcessTest, ClientWithoutTlsFlagsOrInsecureExits2NamingThem) {
  fl::testing::ScratchDir dir("fl_tls_proc");
  const std::string log = dir.File("client.log");
  EXPECT_EQ(
      RunToEnd({FL_CLIENT_BIN, "--server", "127.0.0.1:1", "--model", "synthetic:100", "--give-up-after-s", "1"}, log),
      2);
  const std::string out = ReadFile(log);
  EXPECT_THAT(out, HasSubstr("--tls-ca"));
  EXPECT_THAT(out, HasSubstr("--tls-cert"));
  EXPECT_THAT(out, HasSubstr("--tls-key"));
  EXPECT_THAT(out, HasSubstr("fl-provision"));
  EXPECT_THAT(out, HasSubstr("--insecure"));
}

TEST(TlsProcessTest, InsecureWithTlsFlagsIsRefusedOnBothSides) {
  fl::testing::ScratchDir dir("fl_tls_proc");
  const std::string server_log = dir.File("server.log");
  EXPECT_EQ(RunToEnd({FL_SERVER_BIN, "--listen", "127.0.0.1:0", "--db", "", "--insecure", "--tls-cert", "a.crt",
                      "--tls-key", "a.key", "--tls-client-ca", "ca.crt"},
                     server_log),
            2);
  EXPECT_THAT(ReadFile(server_log), HasSubstr("--insecure and --tls-cert"));
  const std::string client_log = dir.File("client.log");
  EXPECT_EQ(RunToEnd({FL_CLIENT_BIN, "--server", "127.0.0.1:1", "--model", "synthetic:100", "--insecure", "--tls-ca",
                      "ca.crt", "--tls-cert", "c.crt", "--tls-key", "c.key"},
                     client_log),
            2);
  EXPECT_THAT(ReadFile(client_log), HasSubstr("--insecure and --tls-ca"));
}

TEST(TlsProcessTest, InsecureWarnsOnBothSidesAndServesPlaintext) {
  fl::testing::ScratchDir dir("fl_tls_proc");
  const std::string log = dir.File("server.log");
  const std::string port_file = dir.File("port");
  Subprocess server(OneRoundServer(port_file, {"--insecure"}), log);
  const int port = WaitForPort(port_file, server);
  ASSERT_GT(port, 0) << ReadFile(log);
  const std::string client_log = dir.File("client.log");
  Subprocess client({FL_CLIENT_BIN, "--server", fl::StrCat("127.0.0.1:", port), "--name", "c0", "--model",
                     "synthetic:1000", "--give-up-after-s", "30", "--insecure"},
                    client_log);
  EXPECT_EQ(client.Wait(std::chrono::seconds(60)), std::optional<int>(0)) << ReadFile(client_log);
  EXPECT_EQ(server.Wait(std::chrono::seconds(60)), std::optional<int>(0)) << ReadFile(log);
  const std::string out = ReadFile(log);
  EXPECT_THAT(out, HasSubstr("fl-server: --insecure: serving plaintext gRPC: anyone who reaches 127.0.0.1:0 can join "
                             "under any name and read the model"));
  EXPECT_THAT(out, HasSubstr("(plaintext)"));  // the start line
  EXPECT_THAT(ReadFile(client_log), HasSubstr("fl-client: --insecure: connecting to"));
}

// Certificates as fl-provision makes them: a CA, a server certificate for 127.0.0.1, a client "c0".
class TlsProcessPkiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    pki_.dir = dir_.File("pki");
    ASSERT_TRUE(pki::CreateCa(pki_.dir, {}).ok());
    pki::IssueOptions server;
    server.ip_addresses = {"127.0.0.1"};
    ASSERT_TRUE(pki::Issue(pki_.dir, pki::Kind::kServer, "server", server).ok());
    ASSERT_TRUE(pki::Issue(pki_.dir, pki::Kind::kClient, "c0", {}).ok());
  }

  std::vector<std::string> TlsClient(int port) const {
    return {FL_CLIENT_BIN,
            "--server",
            fl::StrCat("127.0.0.1:", port),
            "--name",
            "c0",
            "--model",
            "synthetic:1000",
            "--give-up-after-s",
            "30",
            "--tls-ca",
            pki_.CaCert(),
            "--tls-cert",
            pki_.Cert(pki::Kind::kClient, "c0"),
            "--tls-key",
            pki_.Key(pki::Kind::kClient, "c0")};
  }

  fl::testing::ScratchDir dir_{"fl_tls_proc"};
  pki::Paths pki_;
};

TEST_F(TlsProcessPkiTest, PlaintextClientToMutualTlsServerFailsClearlyAndTheServerGoesOn) {
  const std::string log = dir_.File("server.log");
  const std::string port_file = dir_.File("port");
  Subprocess server(
      OneRoundServer(port_file, {"--tls-cert", pki_.Cert(pki::Kind::kServer, "server"), "--tls-key",
                                 pki_.Key(pki::Kind::kServer, "server"), "--tls-client-ca", pki_.CaCert()}),
      log);
  const int port = WaitForPort(port_file, server);
  ASSERT_GT(port, 0) << ReadFile(log);
  EXPECT_THAT(ReadFile(log), HasSubstr("(mutual TLS)"));  // the start line

  // Plaintext: the handshake never completes, so the client gives up after its give-up time and says why.
  const std::string plain_log = dir_.File("plain.log");
  Subprocess plain({FL_CLIENT_BIN, "--server", fl::StrCat("127.0.0.1:", port), "--name", "c0", "--model",
                    "synthetic:1000", "--give-up-after-s", "2", "--insecure"},
                   plain_log);
  EXPECT_EQ(plain.Wait(std::chrono::seconds(60)), std::optional<int>(1)) << ReadFile(plain_log);
  const std::string plain_out = ReadFile(plain_log);
  EXPECT_THAT(plain_out, HasSubstr("cannot reach fl-server"));
  EXPECT_THAT(plain_out, HasSubstr("mutual TLS"));
  EXPECT_THAT(plain_out, HasSubstr("--tls-ca"));
  ASSERT_TRUE(server.running()) << ReadFile(log);

  // The server is unharmed: a client with its certificate joins and the experiment finishes.
  const std::string tls_log = dir_.File("tls.log");
  Subprocess client(TlsClient(port), tls_log);
  EXPECT_EQ(client.Wait(std::chrono::seconds(60)), std::optional<int>(0)) << ReadFile(tls_log);
  EXPECT_EQ(server.Wait(std::chrono::seconds(60)), std::optional<int>(0)) << ReadFile(log);
  EXPECT_THAT(ReadFile(log), HasSubstr("finished"));
}

}  // namespace
}  // namespace fl::server
