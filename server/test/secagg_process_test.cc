// Secure aggregation end to end through the real binaries (issue 29, "Tests"): fl-server with mutual TLS, SecAgg+
// and central differential privacy (the clients clip, the server noises the unmasked mean), and fl-client
// instances that train, mask and upload; then the same with a fifth of the clients dropping out of every secure
// round after sharing their keys, whose masks the survivors' shares remove. Read from the records database: every
// round committed, its survivors and dropouts, every client's part in every stage, ε per round.
#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "fl/core/str_cat.h"
#include "fl/pki/pki.h"
#include "fl/testing/scratch_dir.h"
#include "fl/testing/subprocess.h"
#include "records_polling.h"
#include "test_pki.h"

namespace fl::server {
namespace {

using fl::testing::Subprocess;
using process_testing::Query;
using process_testing::ReadFile;

class SecAggProcessTest : public ::testing::Test {
 protected:
  std::vector<std::string> ServerArgv(std::vector<std::string> extra) const {
    std::vector<std::string> argv = {FL_SERVER_BIN, "--listen",
                                     address_,      "--db",
                                     db_,           "--rounds",
                                     "3",           "--min-available-clients",
                                     "5",           "--evaluate-every",
                                     "0",           "--heartbeat-interval-ms",
                                     "300",         "--secure-aggregation",
                                     "secagg+",     "--secagg-stage-deadline-ms",
                                     "5000",        "--log-level",
                                     "info"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return argv;
  }
  std::vector<std::string> ClientArgv(std::vector<std::string> extra) const {
    std::vector<std::string> argv = {FL_CLIENT_BIN,
                                     "--server",
                                     address_,
                                     "--name",
                                     "sa",
                                     "--instances",
                                     "5",
                                     "--num-clients",
                                     "5",
                                     "--model",
                                     "synthetic:20000:100",
                                     "--give-up-after-s",
                                     "120",
                                     "--log-level",
                                     "info"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return argv;
  }
  // Runs the server and the client process to their end; the server's exit code.
  int Run(const std::vector<std::string>& server_argv, const std::vector<std::string>& client_argv) {
    Subprocess server(server_argv, dir_.File("server.txt"));
    Subprocess clients(client_argv, dir_.File("clients.txt"));
    // The clients first: they end with the experiment, or at once when they cannot start (then so does the wait).
    EXPECT_TRUE(clients.Wait(std::chrono::seconds(150)).has_value()) << ReadFile(dir_.File("clients.txt"));
    const std::optional<int> code = server.Wait(std::chrono::seconds(30));
    EXPECT_TRUE(code.has_value()) << "fl-server did not finish: " << ReadFile(dir_.File("server.txt"));
    return code.value_or(-1);
  }
  int64_t Count(const std::string& sql) const { return Query(db_, sql); }

  fl::testing::ScratchDir dir_{"fl_secagg_process"};
  std::string db_ = dir_.File("records.db");
  std::string address_ = fl::StrCat("127.0.0.1:", fl::testing::FreeLoopbackPort());
};

TEST_F(SecAggProcessTest, MutualTlsFederationWithSecAggAndCentralDpCommitsEveryRound) {
  test_pki::TestPki pki(dir_.File("pki"), {"sa-0", "sa-1", "sa-2", "sa-3", "sa-4"});
  const pki::Paths& p = pki.paths();
  const std::string cert_dir = std::filesystem::path(p.Cert(pki::Kind::kClient, "sa-0")).parent_path().string();
  const int code = Run(
      ServerArgv({"--min-fit-clients", "5", "--round-deadline-ms", "30000", "--dp-noise-multiplier", "0.5",
                  "--dp-clip-norm", "1", "--dp-population", "50", "--tls-cert", p.Cert(pki::Kind::kServer, "server"),
                  "--tls-key", p.Key(pki::Kind::kServer, "server"), "--tls-client-ca", p.CaCert()}),
      ClientArgv({"--tls-ca", p.CaCert(), "--tls-cert-dir", cert_dir}));
  ASSERT_EQ(code, 0) << ReadFile(dir_.File("server.txt")) << ReadFile(dir_.File("clients.txt"));
  EXPECT_EQ(Count("SELECT count(*) FROM rounds WHERE status = 'committed'"), 3);
  EXPECT_EQ(Count("SELECT count(*) FROM rounds WHERE status = 'committed' AND secagg_survivors = 5 AND "
                  "secagg_dropped = 0"),
            3);
  // Every client in every stage of every round, answered (time and bytes recorded).
  EXPECT_EQ(Count("SELECT count(*) FROM secagg_stages WHERE outcome = 'ok' AND duration_ms IS NOT NULL AND "
                  "bytes_up > 0 AND bytes_down >= 0"),
            3 * 5 * 4);
  // The masked uploads are 4 bytes a coordinate (and the weight), whatever the codec would have been.
  EXPECT_EQ(Count("SELECT count(*) FROM client_rounds WHERE outcome = 'ok' AND codec = 'secagg-z32'"), 15);
  // ε grows with every round; no secure-aggregation message was refused.
  EXPECT_EQ(Count("SELECT count(*) FROM rounds r1 JOIN rounds r2 ON r2.round = r1.round + 1 AND r1.status = "
                  "'committed' AND r2.status = 'committed' WHERE r2.dp_epsilon > r1.dp_epsilon"),
            2);
  EXPECT_EQ(Count("SELECT count(*) FROM security_events WHERE reason = 'secagg'"), 0);
}

TEST_F(SecAggProcessTest, ClientsDroppingAfterSharingKeysAreRemovedFromTheSumByTheSurvivorsShares) {
  // One instance of five drops out of every secure round after sending its shares: the round closes at its
  // deadline with four masked updates and unmasks them with the dropped client's mask key rebuilt from shares.
  const int code = Run(ServerArgv({"--insecure", "--min-fit-clients", "4", "--round-deadline-ms", "6000"}),
                       ClientArgv({"--insecure", "--secagg-drop-after-shares", "0.2"}));
  ASSERT_EQ(code, 0) << ReadFile(dir_.File("server.txt")) << ReadFile(dir_.File("clients.txt"));
  EXPECT_EQ(Count("SELECT count(*) FROM rounds WHERE status = 'committed' AND secagg_survivors = 4 AND "
                  "secagg_dropped = 1"),
            3);
  EXPECT_EQ(Count("SELECT count(*) FROM secagg_stages WHERE stage = 'masked_upload' AND outcome = 'dropped'"), 3);
  EXPECT_EQ(Count("SELECT count(*) FROM secagg_stages WHERE stage = 'unmask' AND outcome = 'ok'"), 3 * 4);
}

}  // namespace
}  // namespace fl::server
