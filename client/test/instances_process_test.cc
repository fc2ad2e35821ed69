// fl-client --instances with the real binaries on loopback: a few hundred virtual clients in one process finish an
// experiment against a real fl-server, each under its own name in the records; an instance that cannot start (its
// certificate is missing) is reported by name while the others finish; an N that cannot fit is refused before
// anything starts, naming the estimate and the limit. One client (no --instances) is estimated at start too: refused
// below --memory-limit with the estimate, past the check with enough memory or --no-memory-check. Secure
// aggregation: instances told to drop after their shares (--secagg-drop-after-shares) are recovered by the others.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "fl/core/str_cat.h"
#include "fl/instrumentation/record_reader.h"
#include "fl/pki/pki.h"
#include "fl/testing/scratch_dir.h"
#include "fl/testing/subprocess.h"

namespace fl::client {
namespace {

using fl::testing::Subprocess;
using ::testing::HasSubstr;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

int64_t Query(const std::string& db, const std::string& sql) {
  auto reader = instrumentation::RecordReader::Open(db);
  if (!reader.ok()) return -1;
  auto n = (*reader)->QueryInt(sql);
  return n.ok() ? *n : -1;
}

// The port fl-server wrote to `port_file`, or 0 when it exited or did not write it in time.
int WaitForPort(const std::string& port_file, const Subprocess& server) {
  for (int i = 0; i < 3000 && server.running(); ++i) {
    const std::string text = ReadFile(port_file);
    if (!text.empty() && text.back() == '\n') return std::stoi(text);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return 0;
}

std::vector<std::string> ServerArgs(const fl::testing::ScratchDir& dir, int clients, int rounds) {
  return {FL_SERVER_BIN,
          "--listen",
          "127.0.0.1:0",
          "--port-file",
          dir.File("port"),
          "--db",
          dir.File("records.db"),
          "--rounds",
          std::to_string(rounds),
          "--min-fit-clients",
          std::to_string(clients),
          "--min-available-clients",
          std::to_string(clients),
          "--evaluate-every",
          "0",
          "--round-deadline-ms",
          "60000",
          "--linger-s",
          "0",
          "--log-level",
          "warn"};
}

TEST(InstancesProcessTest, ThreeHundredInstancesInOneProcessFinishAnExperimentUnderTheirNames) {
  fl::testing::ScratchDir dir("fl_instances");
  std::vector<std::string> server_args = ServerArgs(dir, 300, 2);
  server_args.push_back("--insecure");
  Subprocess server(server_args, dir.File("server.log"));
  const int port = WaitForPort(dir.File("port"), server);
  ASSERT_GT(port, 0) << ReadFile(dir.File("server.log"));
  const std::string client_log = dir.File("client.log");
  Subprocess client({FL_CLIENT_BIN, "--server", fl::StrCat("127.0.0.1:", port), "--name", "virt", "--instances", "300",
                     "--num-clients", "300", "--model", "synthetic:1000", "--train-concurrency", "2",
                     "--give-up-after-s", "60", "--insecure"},
                    client_log);
  EXPECT_EQ(client.Wait(std::chrono::seconds(180)), std::optional<int>(0)) << ReadFile(client_log);
  EXPECT_EQ(server.Wait(std::chrono::seconds(60)), std::optional<int>(0)) << ReadFile(dir.File("server.log"));
  const std::string db = dir.File("records.db");
  EXPECT_EQ(Query(db, "SELECT count(DISTINCT client_name) FROM clients WHERE client_name LIKE 'virt-%'"), 300);
  EXPECT_EQ(Query(db, "SELECT count(*) FROM clients WHERE client_name IN ('virt-0', 'virt-299')"), 2);
  EXPECT_EQ(Query(db, "SELECT count(*) FROM rounds WHERE status = 'committed'"), 2);
  // Every instance trained in both rounds, each its own session.
  EXPECT_EQ(Query(db, "SELECT count(*) FROM client_rounds WHERE outcome = 'ok'"), 600);
  EXPECT_EQ(Query(db, "SELECT count(*) FROM experiments WHERE status = 'finished'"), 1);
  const std::string out = ReadFile(client_log);
  EXPECT_THAT(out, HasSubstr("300 instances (virt-0..virt-299), shards 0..299 of 300: memory 300 instances x"));
  EXPECT_THAT(out, HasSubstr("at most 2 training at once"));
}

// --secagg-drop-after-shares against a real fl-server with --secure-aggregation secagg+ (issue 29's dropout
// measurements): of 10 instances the first ceil(0.3 x 10) = 3 send their keys and shares, then nothing; every round
// is unmasked from the other 7 (the dropped clients' mask keys reconstructed from the survivors' shares) and
// commits. Over-commitment (10 selected for 7 updates) closes each round at its 7th update, cancelling the three,
// rather than at the deadline, which stays long for a loaded machine (or TSan).
TEST(InstancesProcessTest, InstancesThatDropAfterTheirSharesAreRecoveredBySecureAggregation) {
  fl::testing::ScratchDir dir("fl_instances");
  std::vector<std::string> server_args = ServerArgs(dir, 10, 2);
  for (size_t i = 0; i + 1 < server_args.size(); ++i) {
    if (server_args[i] == "--min-fit-clients") server_args[i + 1] = "7";  // the updates a round commits with
  }
  // K = 0.7 x 10 = 7 updates commit; ceil(1.5 x 7) = 11, capped at the 10 clients, are selected.
  server_args.insert(server_args.end(),
                     {"--insecure", "--secure-aggregation", "secagg+", "--fraction-fit", "0.7", "--overcommit", "1.5"});
  Subprocess server(server_args, dir.File("server.log"));
  const int port = WaitForPort(dir.File("port"), server);
  ASSERT_GT(port, 0) << ReadFile(dir.File("server.log"));
  const std::string client_log = dir.File("client.log");
  Subprocess client(
      {FL_CLIENT_BIN, "--server", fl::StrCat("127.0.0.1:", port), "--name", "sa", "--instances", "10", "--num-clients",
       "10", "--model", "synthetic:5000", "--secagg-drop-after-shares", "0.3", "--give-up-after-s", "60", "--insecure"},
      client_log);
  EXPECT_EQ(client.Wait(std::chrono::seconds(120)), std::optional<int>(0)) << ReadFile(client_log);
  EXPECT_EQ(server.Wait(std::chrono::seconds(60)), std::optional<int>(0)) << ReadFile(dir.File("server.log"));
  const std::string db = dir.File("records.db");
  EXPECT_EQ(Query(db, "SELECT count(*) FROM rounds WHERE status = 'committed'"), 2) << ReadFile(dir.File("server.log"));
  EXPECT_EQ(Query(db,
                  "SELECT count(*) FROM rounds WHERE status = 'committed' AND secagg_survivors = 7 AND "
                  "secagg_dropped = 3"),
            2);
  // The dropped ones are sa-0..sa-2: they shared their keys in both rounds and never uploaded.
  const std::string dropped =
      "client_id IN (SELECT client_id FROM clients WHERE client_name IN ('sa-0','sa-1','sa-2'))";
  EXPECT_EQ(
      Query(db, fl::StrCat("SELECT count(*) FROM secagg_stages WHERE stage = 'share_keys' AND outcome = 'ok' AND ",
                           dropped)),
      6);
  EXPECT_EQ(Query(db, fl::StrCat("SELECT count(*) FROM secagg_stages WHERE stage = 'masked_upload' AND outcome = "
                                 "'ok' AND ",
                                 dropped)),
            0);
  EXPECT_EQ(Query(db, "SELECT count(*) FROM secagg_stages WHERE stage = 'unmask' AND outcome = 'ok'"), 14);
  EXPECT_THAT(ReadFile(client_log), HasSubstr("3 of 10 instances (sa-0..sa-2) drop out of every secure round"));
}

TEST(InstancesProcessTest, AnInstanceWithoutItsCertificateIsReportedByNameAndTheOthersFinish) {
  fl::testing::ScratchDir dir("fl_instances");
  pki::Paths paths;
  paths.dir = dir.File("pki");
  ASSERT_TRUE(pki::CreateCa(paths.dir, {}).ok());
  pki::IssueOptions server_cert;
  server_cert.ip_addresses = {"127.0.0.1"};
  ASSERT_TRUE(pki::Issue(paths.dir, pki::Kind::kServer, "server", server_cert).ok());
  for (int i = 0; i < 20; ++i) {
    if (i == 7) continue;  // edge-7 has no certificate: its session cannot start
    ASSERT_TRUE(pki::Issue(paths.dir, pki::Kind::kClient, fl::StrCat("edge-", i), {}).ok());
  }
  std::vector<std::string> server_args = ServerArgs(dir, 19, 2);
  server_args.insert(server_args.end(), {"--tls-cert", paths.Cert(pki::Kind::kServer, "server"), "--tls-key",
                                         paths.Key(pki::Kind::kServer, "server"), "--tls-client-ca", paths.CaCert()});
  Subprocess server(server_args, dir.File("server.log"));
  const int port = WaitForPort(dir.File("port"), server);
  ASSERT_GT(port, 0) << ReadFile(dir.File("server.log"));
  const std::string cert_dir = fl::StrCat(paths.dir, "/clients");
  ASSERT_EQ(paths.Cert(pki::Kind::kClient, "edge-0"), fl::StrCat(cert_dir, "/edge-0.crt"));
  const std::string client_log = dir.File("client.log");
  Subprocess client({FL_CLIENT_BIN, "--server", fl::StrCat("127.0.0.1:", port), "--name", "edge", "--instances", "20",
                     "--num-clients", "20", "--model", "synthetic:1000", "--give-up-after-s", "60", "--tls-ca",
                     paths.CaCert(), "--tls-cert-dir", cert_dir},
                    client_log);
  EXPECT_EQ(client.Wait(std::chrono::seconds(120)), std::optional<int>(1)) << ReadFile(client_log);
  EXPECT_EQ(server.Wait(std::chrono::seconds(60)), std::optional<int>(0)) << ReadFile(dir.File("server.log"));
  const std::string out = ReadFile(client_log);
  EXPECT_THAT(out, HasSubstr("instance edge-7 (shard 7) failed"));
  EXPECT_THAT(out, HasSubstr("19 of 20 instances finished; failed: edge-7\n"));
  const std::string db = dir.File("records.db");
  EXPECT_EQ(Query(db, "SELECT count(DISTINCT client_name) FROM clients"), 19);
  EXPECT_EQ(Query(db, "SELECT count(*) FROM clients WHERE client_name = 'edge-7'"), 0);
  EXPECT_EQ(Query(db, "SELECT count(*) FROM rounds WHERE status = 'committed'"), 2);
}

// --availability: each instance online half of every 2 s (seeded phases): the server selects among the sessions
// open at dispatch, so no round has all 20, and the experiment still finishes with every instance done (those
// offline at the end learn it from the others).
TEST(InstancesProcessTest, InstancesWithADiurnalScheduleAreSelectedOnlyWhileOnline) {
  fl::testing::ScratchDir dir("fl_instances");
  std::vector<std::string> server_args = ServerArgs(dir, 2, 4);
  server_args.push_back("--insecure");
  Subprocess server(server_args, dir.File("server.log"));
  const int port = WaitForPort(dir.File("port"), server);
  ASSERT_GT(port, 0) << ReadFile(dir.File("server.log"));
  const std::string client_log = dir.File("client.log");
  Subprocess client({FL_CLIENT_BIN, "--server", fl::StrCat("127.0.0.1:", port), "--name", "day", "--instances", "20",
                     "--num-clients", "20", "--model", "synthetic:1000:100", "--availability",
                     "diurnal:period_s=2,online=0.5,seed=5", "--give-up-after-s", "60", "--insecure"},
                    client_log);
  EXPECT_EQ(client.Wait(std::chrono::seconds(120)), std::optional<int>(0)) << ReadFile(client_log);
  EXPECT_EQ(server.Wait(std::chrono::seconds(60)), std::optional<int>(0)) << ReadFile(dir.File("server.log"));
  const std::string db = dir.File("records.db");
  EXPECT_EQ(Query(db, "SELECT count(DISTINCT round) FROM rounds WHERE status = 'committed'"), 4);
  EXPECT_EQ(Query(db, "SELECT count(*) FROM rounds WHERE num_selected >= 20"), 0);
  EXPECT_GE(Query(db, "SELECT count(*) FROM rounds WHERE num_selected >= 2"), 4);
}

TEST(InstancesProcessTest, AnInstanceCountThatCannotFitIsRefusedNamingTheEstimateAndTheLimit) {
  fl::testing::ScratchDir dir("fl_instances");
  const std::string log = dir.File("client.log");
  // 100,000 instances of a 100M-parameter model: about 200 TB, nothing allocated to find out.
  Subprocess client({FL_CLIENT_BIN, "--server", "127.0.0.1:1", "--name", "big", "--instances", "100000",
                     "--num-clients", "100000", "--model", "synthetic:100000000", "--give-up-after-s", "1",
                     "--insecure"},
                    log);
  EXPECT_EQ(client.Wait(std::chrono::seconds(30)), std::optional<int>(2)) << ReadFile(log);
  const std::string out = ReadFile(log);
  EXPECT_THAT(out, HasSubstr("--instances=100000 does not fit this machine's memory: estimated "));
  EXPECT_THAT(out, HasSubstr("100000 instances x "));
  EXPECT_THAT(out, HasSubstr("limit "));
  EXPECT_THAT(out, HasSubstr("at most "));
  EXPECT_THAT(out, ::testing::Not(HasSubstr("instances started")));
}

// One client (no --instances): the estimate at start against --memory-limit, which stands in for what a small
// board has. The server address is never reached: a client that passes the check gives up after a second (exit
// status 1), one that is refused never tries (status 2).
std::vector<std::string> OneClient(const std::string& model, const std::string& limit) {
  return {FL_CLIENT_BIN,    "--server", "127.0.0.1:1",       "--name", "pi",        "--model", model,
          "--memory-limit", limit,      "--give-up-after-s", "1",      "--insecure"};
}

TEST(MemoryCheckProcessTest, AClientAboveTheMemoryLimitIsRefusedWithTheEstimate) {
  fl::testing::ScratchDir dir("fl_memory_check");
  const std::string log = dir.File("client.log");
  Subprocess client(OneClient("synthetic:1000000", "10000000"), log);  // 10 MB: below any process with gRPC
  EXPECT_EQ(client.Wait(std::chrono::seconds(30)), std::optional<int>(2)) << ReadFile(log);
  const std::string out = ReadFile(log);
  EXPECT_THAT(out, HasSubstr("fl-client: --model synthetic:1000000 does not fit this machine's memory: estimated "));
  EXPECT_THAT(out, HasSubstr("resident with the model and its data loaded "));
  EXPECT_THAT(out, HasSubstr("limit 9.54 MB (--memory-limit)"));
  EXPECT_THAT(out, HasSubstr("a smaller --eval-batch-size"));
  EXPECT_THAT(out, HasSubstr("--no-memory-check starts anyway"));
}

TEST(MemoryCheckProcessTest, AClientWithEnoughMemoryOrNoMemoryCheckGetsPastTheCheck) {
  fl::testing::ScratchDir dir("fl_memory_check");
  const std::string enough = dir.File("enough.log");
  Subprocess fits(OneClient("synthetic:1000000", "100000000000"), enough);  // 100 GB
  EXPECT_EQ(fits.Wait(std::chrono::seconds(30)), std::optional<int>(1)) << ReadFile(enough);
  EXPECT_THAT(ReadFile(enough), HasSubstr("memory: --model synthetic:1000000: estimated "));
  EXPECT_THAT(ReadFile(enough), HasSubstr("available to this process: 95367 MB (--memory-limit)"));
  EXPECT_THAT(ReadFile(enough), ::testing::Not(HasSubstr("does not fit")));

  const std::string forced = dir.File("forced.log");
  std::vector<std::string> args = OneClient("synthetic:1000000", "10000000");
  args.push_back("--no-memory-check");
  Subprocess unchecked(args, forced);
  EXPECT_EQ(unchecked.Wait(std::chrono::seconds(30)), std::optional<int>(1)) << ReadFile(forced);
  EXPECT_THAT(ReadFile(forced),
              HasSubstr("--no-memory-check: starting anyway: --model synthetic:1000000 does not fit"));

  // Without --memory-limit: this machine's own memory, which a test machine has enough of.
  const std::string own = dir.File("own.log");
  Subprocess machine({FL_CLIENT_BIN, "--server", "127.0.0.1:1", "--name", "pi", "--model", "synthetic:1000",
                      "--give-up-after-s", "1", "--insecure"},
                     own);
  EXPECT_EQ(machine.Wait(std::chrono::seconds(30)), std::optional<int>(1)) << ReadFile(own);
  EXPECT_THAT(ReadFile(own), HasSubstr("this process's resident set plus MemAvailable"));
}

#if FL_WITH_TORCH
TEST(MemoryCheckProcessTest, TheCnnClientIsEstimatedWithItsDataAndRefusedBelowIt) {
  fl::testing::ScratchDir dir("fl_memory_check");
  const std::string small = dir.File("small.log");
  Subprocess refused(OneClient("cnn", "100000000"), small);  // 100 MB: LibTorch alone is more
  EXPECT_EQ(refused.Wait(std::chrono::seconds(60)), std::optional<int>(2)) << ReadFile(small);
  EXPECT_THAT(ReadFile(small), HasSubstr("fl-client: --model cnn does not fit this machine's memory: estimated "));
  EXPECT_THAT(ReadFile(small), HasSubstr("evaluation batch (100 examples) "));

  const std::string big = dir.File("big.log");
  Subprocess fits(OneClient("cnn", "8000000000"), big);  // 8 GB, the largest Raspberry Pi
  EXPECT_EQ(fits.Wait(std::chrono::seconds(60)), std::optional<int>(1)) << ReadFile(big);
  EXPECT_THAT(ReadFile(big), HasSubstr("memory: --model cnn: estimated "));
  EXPECT_THAT(ReadFile(big), ::testing::Not(HasSubstr("does not fit")));
}
#endif

}  // namespace
}  // namespace fl::client
