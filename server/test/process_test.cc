// Process-level tests of the real fl-server and fl-client binaries on loopback: a SIGKILLed server resumes
// and records every round exactly once; SIGTERM aborts cleanly; clients fail with clear errors.
#include <chrono>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>

#include "fl/core/str_cat.h"
#include "fl/instrumentation/record_reader.h"
#include "fl/testing/scratch_dir.h"
#include "fl/testing/subprocess.h"
#include "process_run.h"
#include "records_polling.h"

namespace fl::server {
namespace {

using fl::testing::Subprocess;

std::vector<std::string> ServerArgs(const fl::testing::ScratchDir& dir, int port, bool resume) {
  std::vector<std::string> args = {FL_SERVER_BIN,
                                   "--listen",
                                   fl::StrCat("127.0.0.1:", port),
                                   "--db",
                                   dir.File("records.db"),
                                   "--checkpoint-dir",
                                   dir.File("ckpt"),
                                   "--rounds",
                                   "8",
                                   "--min-fit-clients",
                                   "2",
                                   "--min-available-clients",
                                   "2",
                                   "--evaluate-every",
                                   "2",
                                   "--round-deadline-ms",
                                   "20000",
                                   "--heartbeat-interval-ms",
                                   "300",
                                   "--log-level",
                                   "warn",
                                   "--insecure"};  // TLS has its own tests (tls_process_test)
  if (resume) args.push_back("--resume");
  return args;
}

using process_testing::ClientArgs;
using process_testing::Query;
using process_testing::ReadFile;
using process_testing::WaitFor;

int64_t CommittedRounds(const std::string& db) {
  auto reader = instrumentation::RecordReader::Open(db);
  if (!reader.ok()) return 0;
  auto n = (*reader)->QueryInt("SELECT count(*) FROM rounds WHERE status = 'committed'");
  return n.ok() ? *n : 0;
}

TEST(ProcessTest, SigkilledServerResumesAndRecordsEveryRoundOnce) {
  fl::testing::ScratchDir dir("fl_resume");
  const int port = fl::testing::FreeLoopbackPort();
  const std::string log = dir.File("log.txt");
  auto server = std::make_unique<Subprocess>(ServerArgs(dir, port, false), log);
  std::vector<std::unique_ptr<Subprocess>> clients;
  for (int i = 0; i < 2; ++i) {
    // 200k parameters and 150 ms of "training" per round: rounds long enough to be killed in the middle.
    clients.push_back(std::make_unique<Subprocess>(ClientArgs(port, fl::StrCat("c", i), "synthetic:200000:150"), log));
  }
  const std::string db = dir.File("records.db");
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (CommittedRounds(db) < 3 && std::chrono::steady_clock::now() < give_up) {
    ASSERT_TRUE(server->running()) << "fl-server exited early; see " << log;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_GE(CommittedRounds(db), 3);
  server->Kill(SIGKILL);
  ASSERT_EQ(server->Wait(std::chrono::seconds(10)), 128 + SIGKILL);
  const int64_t before = CommittedRounds(db);
  ASSERT_LT(before, 8) << "the run finished before it could be killed";

  server = std::make_unique<Subprocess>(ServerArgs(dir, port, true), log);
  auto code = server->Wait(std::chrono::seconds(120));
  ASSERT_TRUE(code.has_value()) << "resumed fl-server did not finish; see " << log;
  EXPECT_EQ(*code, 0) << "see " << log;
  for (auto& c : clients) {
    auto client_code = c->Wait(std::chrono::seconds(30));
    ASSERT_TRUE(client_code.has_value());
    EXPECT_EQ(*client_code, 0) << "a client did not see the experiment finish; see " << log;
  }

  auto reader = *instrumentation::RecordReader::Open(db);
  EXPECT_EQ(*reader->QueryInt("SELECT count(*) FROM experiments"), 1);
  EXPECT_EQ(*reader->QueryText("SELECT status FROM experiments"), "finished");
  EXPECT_EQ(*reader->QueryInt("SELECT count(*) FROM rounds WHERE status = 'committed'"), 8);
  EXPECT_EQ(*reader->QueryInt("SELECT count(DISTINCT round) FROM rounds WHERE status = 'committed'"), 8);
  EXPECT_EQ(*reader->QueryInt("SELECT min(round) FROM rounds WHERE status = 'committed'"), 1);
  EXPECT_EQ(*reader->QueryInt("SELECT max(round) FROM rounds WHERE status = 'committed'"), 8);
  // Model versions continue across the restart: round r produced version r.
  EXPECT_EQ(*reader->QueryInt("SELECT count(*) FROM rounds WHERE status = 'committed' AND model_version <> round"), 0);
  // Every committed round has both clients' rows, and the evaluation rounds have their evaluation.
  EXPECT_EQ(*reader->QueryInt("SELECT count(*) FROM client_rounds c JOIN rounds r USING (experiment_id, round, "
                              "attempt) WHERE r.status = 'committed' AND c.outcome = 'ok'"),
            16);
  EXPECT_EQ(*reader->QueryInt("SELECT count(*) FROM rounds WHERE status = 'committed' AND round % 2 = 0 AND "
                              "eval_loss IS NULL"),
            0);
}

TEST(ProcessTest, SigtermAbortsTheOpenRoundRecordsItAndTellsClients) {
  fl::testing::ScratchDir dir("fl_sigterm");
  const int port = fl::testing::FreeLoopbackPort();
  const std::string log = dir.File("log.txt");
  const std::string db = dir.File("records.db");
  Subprocess server(ServerArgs(dir, port, false), log);
  Subprocess c0(ClientArgs(port, "c0", "synthetic:1000:3000"), dir.File("c0.txt"));
  Subprocess c1(ClientArgs(port, "c1", "synthetic:1000:3000"), dir.File("c1.txt"));
  // Both clients joined and the first round was dispatched: they are "training" for 3 s.
  ASSERT_TRUE(WaitFor(db, "SELECT count(*) FROM clients", 2, std::chrono::seconds(30))) << ReadFile(log);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  server.Kill(SIGTERM);
  auto code = server.Wait(std::chrono::seconds(20));
  ASSERT_TRUE(code.has_value()) << "fl-server ignored SIGTERM";
  EXPECT_EQ(*code, 130);
  EXPECT_EQ(Query(db, "SELECT count(*) FROM experiments WHERE status = 'aborted'"), 1);
  EXPECT_EQ(Query(db, "SELECT count(*) FROM rounds WHERE status = 'aborted' AND round = 1"), 1);
  EXPECT_EQ(Query(db, "SELECT count(*) FROM rounds WHERE status = 'committed'"), 0);
  // The clients were told (Shutdown, not finished): they log it and wait for the server to come back.
  c0.Kill(SIGTERM);
  c1.Kill(SIGTERM);
  c0.Wait(std::chrono::seconds(10));
  c1.Wait(std::chrono::seconds(10));
  EXPECT_NE(ReadFile(dir.File("c0.txt")).find("server shutdown: fl-server received signal 15"), std::string::npos)
      << ReadFile(dir.File("c0.txt"));
}

TEST(ProcessTest, ClientWithAnotherModelIsRefusedWithAClearError) {
  fl::testing::ScratchDir dir("fl_refuse");
  const int port = fl::testing::FreeLoopbackPort();
  const std::string db = dir.File("records.db");
  Subprocess server(ServerArgs(dir, port, false), dir.File("log.txt"));
  Subprocess good(ClientArgs(port, "good", "synthetic:1000"), dir.File("good.txt"));
  ASSERT_TRUE(WaitFor(db, "SELECT count(*) FROM clients", 1, std::chrono::seconds(30)));
  Subprocess other(ClientArgs(port, "other", "synthetic:2000"), dir.File("other.txt"));
  auto code = other.Wait(std::chrono::seconds(30));
  ASSERT_TRUE(code.has_value()) << "a refused client must exit, not retry forever";
  EXPECT_EQ(*code, 1);
  const std::string out = ReadFile(dir.File("other.txt"));
  EXPECT_NE(out.find("refused client 'other'"), std::string::npos) << out;
  EXPECT_NE(out.find("fingerprint"), std::string::npos) << out;
  EXPECT_NE(out.find("same --model"), std::string::npos) << out;
}

TEST(ProcessTest, ClientReportsAnUnreachableServerClearly) {
  fl::testing::ScratchDir dir("fl_unreachable");
  const int port = fl::testing::FreeLoopbackPort();  // nothing listens there
  std::vector<std::string> args = ClientArgs(port, "lonely", "synthetic:100");
  args[8] = "2";  // --give-up-after-s 2
  Subprocess client(args, dir.File("out.txt"));
  auto code = client.Wait(std::chrono::seconds(30));
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 1);
  const std::string out = ReadFile(dir.File("out.txt"));
  EXPECT_NE(out.find(fl::StrCat("cannot reach fl-server at 127.0.0.1:", port)), std::string::npos) << out;
  EXPECT_NE(out.find("check --server"), std::string::npos) << out;
}

// Models and updates move only as chunked streams: a 100M-parameter model (400 MB per transfer, 100x
// gRPC's default message limit) goes through a whole round.
TEST(ProcessTest, HundredMillionParameterModelCompletesARound) {
  fl::testing::ScratchDir dir("fl_large");
  const int port = fl::testing::FreeLoopbackPort();
  const std::string db = dir.File("records.db");
  const std::string log = dir.File("log.txt");
  Subprocess server({FL_SERVER_BIN, "--listen", fl::StrCat("127.0.0.1:", port), "--db", db, "--rounds", "1",
                     "--min-fit-clients", "2", "--min-available-clients", "2", "--evaluate-every", "0",
                     "--round-deadline-ms", "300000", "--log-level", "warn", "--insecure"},
                    log);
  Subprocess c0(ClientArgs(port, "c0", "synthetic:100000000"), log);
  Subprocess c1(ClientArgs(port, "c1", "synthetic:100000000"), log);
  auto code = server.Wait(std::chrono::seconds(400));
  ASSERT_TRUE(code.has_value()) << ReadFile(log);
  EXPECT_EQ(*code, 0) << ReadFile(log);
  EXPECT_EQ(Query(db, "SELECT count(*) FROM rounds WHERE status = 'committed'"), 1);
  // fp32 codec payload: 32-byte header + 4 bytes per parameter, each way.
  EXPECT_EQ(Query(db,
                  "SELECT count(*) FROM client_rounds WHERE outcome = 'ok' AND uplink_bytes = 400000032 AND "
                  "downlink_bytes = 400000032"),
            2);
}

}  // namespace
}  // namespace fl::server
