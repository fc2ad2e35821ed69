// Central differential privacy end to end: the real fl-server with --dp-* flags and two fl-client processes (the
// synthetic model) on loopback. What it checks is read from the records: every committed round has its ε, growing
// round by round, its clip norm and noise multiplier, and the run stops before the round that would spend past
// --dp-target-epsilon. The exact noise and ε values are engine_privacy_test's.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "fl/testing/scratch_dir.h"
#include "process_run.h"
#include "records_polling.h"

namespace fl::server {
namespace {

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

TEST(PrivacyProcessTest, ANoiseMultiplierWithoutAPopulationIsRefusedAtStartNamingIt) {
  fl::testing::ScratchDir dir("fl_privacy_refused");
  const int code = RunExperiment(dir, {"--rounds", "1", "--dp-noise-multiplier", "1.0"}, {});
  EXPECT_NE(code, 0);
  EXPECT_NE(ReadFile(dir.File("server.txt")).find("--dp-noise-multiplier needs --dp-population"), std::string::npos)
      << ReadFile(dir.File("server.txt"));
}

}  // namespace
}  // namespace fl::server
