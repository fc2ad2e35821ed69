// Central differential privacy end to end: the real fl-server with --dp-* flags and two fl-client processes (the
// synthetic model) on loopback. What it checks is read from the records: every committed round has its ε, growing
// round by round, its clip norm and noise multiplier, and the run stops before the round that would spend past
// --dp-target-epsilon; a SIGKILLed private server resumes (--resume) with the accountant's ledger from its checkpoint,
// so ε keeps growing across the restart; local and distributed DP (SecAgg+) run through real clients. The exact noise
// values are engine_privacy_test's.
#include <chrono>
#include <csignal>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "fl/core/str_cat.h"
#include "fl/testing/scratch_dir.h"
#include "process_run.h"
#include "records_polling.h"

namespace fl::server {
namespace {

using process_testing::ClientArgs;
using process_testing::Query;
using process_testing::ReadFile;
using process_testing::RunExperiment;

const std::vector<std::pair<std::string, std::string>> kClients = {{"a", "synthetic:1000:100"},
                                                                   {"b", "synthetic:1000:100"}};

std::vector<std::string> PrivacyArgs(const std::string& rounds, const std::string& target) {
  return {"--rounds",
          rounds,
          "--min-fit-clients",
          "2",
          "--min-available-clients",
          "2",
          "--dp-noise-multiplier",
          "1.0",
          "--dp-clip-norm",
          "0.5",
          "--dp-population",
          "20",
          "--dp-target-epsilon",
          target};
}

TEST(PrivacyProcessTest, EveryRoundRecordsItsEpsilonAndTheRunStopsAtTheTarget) {
  fl::testing::ScratchDir dir("fl_privacy_process");
  // q = 2/20, sigma 1, delta 1e-5: epsilon is 2.133 after one round, 2.504 after two, 2.642 after three
  // (fl-privacy epsilon --noise-multiplier 1 --sampling-rate 0.1 --steps T --delta 1e-5; engine_privacy_test checks
  // the records' values exactly). A target of 2.57 allows two.
  ASSERT_EQ(RunExperiment(dir, PrivacyArgs("5", "2.57"), kClients), 0) << ReadFile(dir.File("server.txt"));
  const std::string db = dir.File("records.db");
  EXPECT_EQ(Query(db, "SELECT count(*) FROM rounds WHERE status = 'committed'"), 2) << ReadFile(dir.File("server.txt"));
  EXPECT_EQ(Query(db,
                  "SELECT count(*) FROM rounds WHERE status = 'committed' AND dp_epsilon > 2 AND dp_epsilon <= 2.57 "
                  "AND dp_clip_norm = 0.5 AND dp_noise_multiplier = 1.0"),
            2);
  EXPECT_EQ(Query(db,
                  "SELECT count(*) FROM rounds r2 JOIN rounds r1 ON r1.experiment_id = r2.experiment_id AND "
                  "r1.round = 1 AND r2.round = 2 WHERE r2.dp_epsilon > r1.dp_epsilon"),
            1);
  EXPECT_EQ(Query(db,
                  "SELECT count(*) FROM experiments WHERE status = 'finished' AND status_reason LIKE "
                  "'privacy budget: round 3 would bring epsilon to%'"),
            1)
      << ReadFile(dir.File("server.txt"));
  EXPECT_NE(ReadFile(dir.File("server.txt")).find("round 1: epsilon"), std::string::npos);
}

// q = 2/20, σ = 1, δ = 1e-5, 6 rounds: killed after at least 2 committed, resumed from the last checkpoint. Without
// the ledger the resumed rounds would start again from ε = 2.133 (one round's); with it every round's ε is above the
// one before, across the restart, and the last is 6 rounds' (fl-privacy epsilon --noise-multiplier 1
// --sampling-rate 0.1 --steps 6 --delta 1e-5: 3.0320).
TEST(PrivacyProcessTest, AKilledPrivateServerResumesWithItsLedgerAndEpsilonKeepsGrowing) {
  fl::testing::ScratchDir dir("fl_privacy_resume");
  const int port = fl::testing::FreeLoopbackPort();
  const std::string log = dir.File("server.txt");
  const std::string db = dir.File("records.db");
  auto args = [&](bool resume) {
    std::vector<std::string> extra = PrivacyArgs("6", "0");  // target 0: none
    const std::vector<std::string> more = {"--checkpoint-dir", dir.File("ckpt"), "--round-deadline-ms", "20000"};
    extra.insert(extra.end(), more.begin(), more.end());
    if (resume) extra.push_back("--resume");
    return process_testing::ServerArgs(dir, port, extra);
  };
  auto server = std::make_unique<fl::testing::Subprocess>(args(false), log);
  std::vector<std::unique_ptr<fl::testing::Subprocess>> clients;
  for (const char* name : {"a", "b"}) {
    // 200 ms of "training" per round: rounds long enough to kill the server between commits.
    clients.push_back(std::make_unique<fl::testing::Subprocess>(ClientArgs(port, name, "synthetic:1000:200"),
                                                                dir.File(std::string(name) + ".txt")));
  }
  ASSERT_TRUE(process_testing::WaitFor(db, "SELECT count(*) FROM rounds WHERE status = 'committed'", 2,
                                       std::chrono::seconds(60)))
      << ReadFile(log);
  server->Kill(SIGKILL);
  ASSERT_EQ(server->Wait(std::chrono::seconds(10)), 128 + SIGKILL);
  const int64_t before = Query(db, "SELECT count(*) FROM rounds WHERE status = 'committed'");
  ASSERT_LT(before, 6) << "the run finished before it could be killed";

  server = std::make_unique<fl::testing::Subprocess>(args(true), log);
  auto code = server->Wait(std::chrono::seconds(120));
  ASSERT_TRUE(code.has_value()) << "the resumed fl-server did not finish; see " << ReadFile(log);
  EXPECT_EQ(*code, 0) << ReadFile(log);
  for (auto& c : clients) EXPECT_TRUE(c->Wait(std::chrono::seconds(30)).has_value());

  EXPECT_EQ(Query(db, "SELECT count(DISTINCT round) FROM rounds WHERE status = 'committed' AND dp_epsilon > 0"), 6)
      << ReadFile(log);
  // Each committed round's ε is above its predecessor's, the rounds after the restart included.
  EXPECT_EQ(Query(db,
                  "SELECT count(*) FROM rounds r2 JOIN rounds r1 ON r1.experiment_id = r2.experiment_id AND "
                  "r1.round + 1 = r2.round AND r1.status = 'committed' AND r2.status = 'committed' WHERE "
                  "r2.dp_epsilon > r1.dp_epsilon"),
            5)
      << ReadFile(log);
  EXPECT_EQ(Query(db,
                  "SELECT count(*) FROM rounds WHERE status = 'committed' AND round = 6 AND abs(dp_epsilon - "
                  "3.0320) < 1e-4"),
            1)
      << ReadFile(log);
}

// Local DP (the clients clip and noise, each client's ε at q = 1 and σ/2) and distributed DP (SecAgg+ with the
// clients' discrete Gaussian shares) through real processes: every round commits with the mode's ε. After two rounds
// at σ = 1: local ε = 16.5536 (fl-privacy epsilon --noise-multiplier 0.5 --sampling-rate 1 --steps 2 --delta 1e-5),
// distributed with both shares in the sum ε = 2.5041 (--noise-multiplier 1 --sampling-rate 0.1 --steps 2).
TEST(PrivacyProcessTest, LocalAndDistributedDpRunThroughRealClients) {
  for (const auto& [mode, epsilon] :
       std::vector<std::pair<std::string, double>>{{"local", 16.5536}, {"distributed", 2.5041}}) {
    fl::testing::ScratchDir dir("fl_privacy_modes");
    std::vector<std::string> args = PrivacyArgs("2", "0");
    const std::vector<std::string> more = {"--dp-mode", mode};
    args.insert(args.end(), more.begin(), more.end());
    if (mode == "distributed") {
      // A share's std is sigma C / sqrt(2) = 0.35: the range needs C + 8 x 0.35 = 3.33.
      const std::vector<std::string> secure = {"--secure-aggregation", "secagg+", "--secagg-range", "4"};
      args.insert(args.end(), secure.begin(), secure.end());
    }
    ASSERT_EQ(RunExperiment(dir, args, kClients), 0) << mode << ": " << ReadFile(dir.File("server.txt"));
    const std::string db = dir.File("records.db");
    EXPECT_EQ(Query(db, "SELECT count(*) FROM rounds WHERE status = 'committed'"), 2) << mode;
    EXPECT_EQ(Query(db, fl::StrCat("SELECT count(*) FROM rounds WHERE status = 'committed' AND round = 2 AND "
                                   "abs(dp_epsilon - ",
                                   epsilon, ") < 1e-4")),
              1)
        << mode << ": " << ReadFile(dir.File("server.txt"));
  }
}

TEST(PrivacyProcessTest, ANoiseMultiplierWithoutAPopulationIsRefusedAtStartNamingIt) {
  fl::testing::ScratchDir dir("fl_privacy_refused");
  const int code = RunExperiment(dir, {"--rounds", "1", "--dp-noise-multiplier", "1.0"}, {});
  EXPECT_NE(code, 0);
  EXPECT_NE(ReadFile(dir.File("server.txt")).find("--dp-noise-multiplier needs --dp-population"), std::string::npos)
      << ReadFile(dir.File("server.txt"));
}

}  // namespace
}  // namespace fl::server
