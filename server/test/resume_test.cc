// fl-server killed with SIGKILL in the middle of a run and restarted with --resume finishes the run with
// every round recorded exactly once. Real binaries, real processes, loopback only.
#include <chrono>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>

#include "fl/core/str_cat.h"
#include "fl/instrumentation/record_reader.h"
#include "fl/testing/scratch_dir.h"
#include "fl/testing/subprocess.h"

namespace fl::server {
namespace {

using fl::testing::Subprocess;

std::vector<std::string> ServerArgs(const fl::testing::ScratchDir& dir, int port, bool resume) {
  std::vector<std::string> args = {FL_SERVER_BIN,
                                   "--listen", fl::StrCat("127.0.0.1:", port),
                                   "--db", dir.File("records.db"),
                                   "--checkpoint-dir", dir.File("ckpt"),
                                   "--rounds", "8",
                                   "--min-fit-clients", "2",
                                   "--min-available-clients", "2",
                                   "--evaluate-every", "2",
                                   "--round-deadline-ms", "20000",
                                   "--heartbeat-interval-ms", "300",
                                   "--log-level", "warn"};
  if (resume) args.push_back("--resume");
  return args;
}

int64_t CommittedRounds(const std::string& db) {
  auto reader = instrumentation::RecordReader::Open(db);
  if (!reader.ok()) return 0;
  auto n = (*reader)->QueryInt("SELECT count(*) FROM rounds WHERE status = 'committed'");
  return n.ok() ? *n : 0;
}

TEST(ResumeTest, SigkilledServerResumesAndRecordsEveryRoundOnce) {
  fl::testing::ScratchDir dir("fl_resume");
  const int port = fl::testing::FreeLoopbackPort();
  const std::string log = dir.File("log.txt");
  auto server = std::make_unique<Subprocess>(ServerArgs(dir, port, false), log);
  std::vector<std::unique_ptr<Subprocess>> clients;
  for (int i = 0; i < 2; ++i) {
    // 200k parameters and 150 ms of "training" per round: rounds long enough to be killed in the middle.
    clients.push_back(std::make_unique<Subprocess>(
        std::vector<std::string>{FL_CLIENT_BIN, "--server", fl::StrCat("127.0.0.1:", port), "--name",
                                 fl::StrCat("c", i), "--model", "synthetic:200000:150", "--give-up-after-s", "60",
                                 "--log-level", "warn"},
        log));
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

}  // namespace
}  // namespace fl::server
