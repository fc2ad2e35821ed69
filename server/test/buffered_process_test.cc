// Buffered asynchronous aggregation (FedBuff) end to end: the real fl-server (--aggregation buffered) and four
// real fl-client processes on loopback, one of them training ten times slower, so that its updates arrive after
// others were applied. The run finishes, and the records hold every aggregation step once with its staleness.
#include <chrono>
#include <cmath>
#include <csignal>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "fl/core/str_cat.h"
#include "fl/instrumentation/record_reader.h"
#include "fl/testing/scratch_dir.h"
#include "fl/testing/subprocess.h"

namespace fl::server {
namespace {

using fl::testing::Subprocess;

// fl-server in buffered mode: B = 2, C = 3, S = 10, s = 1/sqrt(1+tau), FedAvgM, 4 clients, evaluated every 3 steps.
std::vector<std::string> ServerArgs(int port, const fl::testing::ScratchDir& dir, const std::string& db, int steps,
                                    bool resume) {
  std::vector<std::string> args = {FL_SERVER_BIN,
                                   "--listen",
                                   fl::StrCat("127.0.0.1:", port),
                                   "--db",
                                   db,
                                   "--checkpoint-dir",
                                   dir.File("ckpt"),
                                   "--aggregation",
                                   "buffered",
                                   "--buffer-size",
                                   "2",
                                   "--concurrency",
                                   "3",
                                   "--max-staleness",
                                   "10",
                                   "--staleness-weight",
                                   "poly:a=0.5",
                                   "--strategy",
                                   "fedavgm",
                                   "--rounds",
                                   std::to_string(steps),
                                   "--min-fit-clients",
                                   "1",
                                   "--min-available-clients",
                                   "4",
                                   "--evaluate-every",
                                   "3",
                                   "--round-deadline-ms",
                                   "30000",
                                   "--heartbeat-interval-ms",
                                   "300",
                                   "--log-level",
                                   "info",
                                   "--insecure"};
  if (resume) args.push_back("--resume");
  return args;
}

std::vector<std::unique_ptr<Subprocess>> StartClients(int port, const std::string& log) {
  std::vector<std::unique_ptr<Subprocess>> clients;
  for (int i = 0; i < 4; ++i) {
    // 20k parameters; c3 "trains" 800 ms per task, the others 60 ms.
    const std::string model = i == 3 ? "synthetic:20000:800" : "synthetic:20000:60";
    clients.push_back(std::make_unique<Subprocess>(
        std::vector<std::string>{FL_CLIENT_BIN, "--server", fl::StrCat("127.0.0.1:", port), "--name",
                                 fl::StrCat("c", i), "--model", model, "--give-up-after-s", "60", "--log-level", "warn",
                                 "--insecure"},
        log));
  }
  return clients;
}

TEST(BufferedProcessTest, FedBuffRunsToTheEndWithStaleUpdatesWeightedAndRecorded) {
  fl::testing::ScratchDir dir("fl_buffered");
  const int port = fl::testing::FreeLoopbackPort();
  const std::string log = dir.File("log.txt");
  const std::string db = dir.File("records.db");
  constexpr int kSteps = 6;
  Subprocess server(ServerArgs(port, dir, db, kSteps, false), log);
  std::vector<std::unique_ptr<Subprocess>> clients = StartClients(port, log);
  auto code = server.Wait(std::chrono::seconds(120));
  ASSERT_TRUE(code.has_value()) << "fl-server did not finish; see " << log;
  EXPECT_EQ(*code, 0) << "see " << log;
  for (auto& c : clients) {
    auto client_code = c->Wait(std::chrono::seconds(30));
    ASSERT_TRUE(client_code.has_value()) << "see " << log;
    EXPECT_EQ(*client_code, 0) << "a client did not see the experiment finish; see " << log;
  }

  // The console table's rows are aggregation steps.
  std::ifstream log_in(log);
  const std::string console((std::istreambuf_iterator<char>(log_in)), std::istreambuf_iterator<char>());
  EXPECT_NE(console.find("  step  clients  train_loss"), std::string::npos) << console;
  EXPECT_NE(console.find("step_time_s"), std::string::npos);
  auto reader = *instrumentation::RecordReader::Open(db);
  EXPECT_EQ(*reader->QueryText("SELECT status FROM experiments"), "finished");
  EXPECT_EQ(*reader->QueryText("SELECT aggregation FROM experiments"), "buffered");
  // Every step committed once, step k producing model version k; each took at least --buffer-size updates.
  EXPECT_EQ(*reader->QueryInt("SELECT count(*) FROM rounds WHERE status = 'committed'"), kSteps);
  EXPECT_EQ(*reader->QueryInt("SELECT count(DISTINCT round) FROM rounds WHERE status = 'committed'"), kSteps);
  EXPECT_EQ(*reader->QueryInt("SELECT count(*) FROM rounds WHERE status = 'committed' AND model_version <> round"), 0);
  EXPECT_EQ(*reader->QueryInt("SELECT count(*) FROM rounds WHERE status = 'committed' AND num_accepted < 2"), 0);
  // Applied updates: trained from base, applied to step round (version round - 1 before it): staleness is the
  // difference, and the weight 1/sqrt(1 + staleness).
  auto rows = reader->ListClientRounds(*reader->QueryText("SELECT id FROM experiments"));
  ASSERT_TRUE(rows.ok()) << rows.status();
  int applied = 0, stale = 0;
  for (const instrumentation::ClientRoundRecord& r : *rows) {
    if (r.outcome != instrumentation::ClientOutcome::kOk) continue;
    ++applied;
    ASSERT_TRUE(r.staleness.has_value() && r.base_model_version.has_value() && r.staleness_weight.has_value())
        << r.client_id << " step " << r.round;
    EXPECT_EQ(*r.base_model_version + *r.staleness, r.round - 1) << r.client_id << " step " << r.round;
    EXPECT_NEAR(*r.staleness_weight, 1.0 / std::sqrt(1.0 + static_cast<double>(*r.staleness)), 1e-12);
    stale += *r.staleness > 0 ? 1 : 0;
  }
  EXPECT_GE(applied, 2 * kSteps);
  // The slow client's updates arrive after the fast ones filled a step: at least one was stale.
  EXPECT_GE(stale, 1) << "see " << log;
  // Evaluated after steps 3 and 6.
  EXPECT_EQ(*reader->QueryInt("SELECT count(*) FROM rounds WHERE status = 'committed' AND eval_loss IS NOT NULL"), 2);
}

// Checkpoint per step: fl-server SIGKILLed in the middle of a buffered run resumes after its last committed step,
// and every step is in the records exactly once.
TEST(BufferedProcessTest, ASigkilledServerResumesAfterTheLastCommittedStep) {
  fl::testing::ScratchDir dir("fl_buffered_resume");
  const int port = fl::testing::FreeLoopbackPort();
  const std::string log = dir.File("log.txt");
  const std::string db = dir.File("records.db");
  constexpr int kSteps = 30;
  auto server = std::make_unique<Subprocess>(ServerArgs(port, dir, db, kSteps, false), log);
  std::vector<std::unique_ptr<Subprocess>> clients = StartClients(port, log);
  auto committed = [&] {
    auto reader = instrumentation::RecordReader::Open(db);
    if (!reader.ok()) return int64_t{0};
    auto n = (*reader)->QueryInt("SELECT count(*) FROM rounds WHERE status = 'committed'");
    return n.ok() ? *n : 0;
  };
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (committed() < 4 && std::chrono::steady_clock::now() < give_up) {
    ASSERT_TRUE(server->running()) << "fl-server exited early; see " << log;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  server->Kill(SIGKILL);
  ASSERT_EQ(server->Wait(std::chrono::seconds(10)), 128 + SIGKILL);
  const int64_t before = committed();
  ASSERT_GE(before, 4);
  ASSERT_LT(before, kSteps) << "the run finished before it could be killed";

  server = std::make_unique<Subprocess>(ServerArgs(port, dir, db, kSteps, true), log);
  auto code = server->Wait(std::chrono::seconds(120));
  ASSERT_TRUE(code.has_value()) << "resumed fl-server did not finish; see " << log;
  EXPECT_EQ(*code, 0) << "see " << log;
  for (auto& c : clients) {
    auto client_code = c->Wait(std::chrono::seconds(30));
    ASSERT_TRUE(client_code.has_value()) << "see " << log;
    EXPECT_EQ(*client_code, 0) << "see " << log;
  }
  auto reader = *instrumentation::RecordReader::Open(db);
  EXPECT_EQ(*reader->QueryText("SELECT status FROM experiments"), "finished");
  EXPECT_EQ(*reader->QueryInt("SELECT count(*) FROM rounds WHERE status = 'committed'"), kSteps);
  EXPECT_EQ(*reader->QueryInt("SELECT count(DISTINCT round) FROM rounds WHERE status = 'committed'"), kSteps);
  EXPECT_EQ(*reader->QueryInt("SELECT count(*) FROM rounds WHERE status = 'committed' AND model_version <> round"), 0);
  // Every committed step's rows are its clients' (at least --buffer-size applied), none twice.
  EXPECT_EQ(*reader->QueryInt("SELECT count(*) FROM rounds r WHERE r.status = 'committed' AND (SELECT count(*) FROM "
                              "client_rounds c WHERE c.experiment_id = r.experiment_id AND c.round = r.round AND "
                              "c.attempt = r.attempt AND c.outcome = 'ok') < 2"),
            0);
}

}  // namespace
}  // namespace fl::server
