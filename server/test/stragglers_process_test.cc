// Over-commitment and the deadline policies end to end: the real fl-server and fl-client binaries on loopback
// (plaintext, --insecure; TLS has its own tests), the synthetic model with a fixed "training" time per round, so
// that one client is the straggler. Short runs (2-3 rounds, a few seconds); what they check is read from the
// records database. The exact values (who is cancelled, staleness, the aggregate) are engine_overcommit_test's.
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "fl/core/str_cat.h"
#include "fl/testing/scratch_dir.h"
#include "fl/testing/subprocess.h"
#include "process_run.h"
#include "records_polling.h"

namespace fl::server {
namespace {

using process_testing::Query;
using process_testing::ReadFile;
using process_testing::RunExperiment;

// --overcommit 1.5 with K = 2 (fraction 0.5 of 3 clients, at least 2): all three are selected, each round commits
// with the two fast clients' updates and the slow one's task is cancelled. The cancel reaches fl-client, which stops
// training: its next task (round 2) is downloaded right after round 2's dispatch, not 20 s later, and the whole
// run ends long before one of its 20 s trainings could have.
TEST(StragglersProcessTest, OvercommitCancelsTheSlowClientWhichStopsTraining) {
  fl::testing::ScratchDir dir("fl_overcommit_process");
  const auto start = std::chrono::steady_clock::now();
  const int code = RunExperiment(
      dir,
      {"--rounds", "2", "--fraction-fit", "0.5", "--min-fit-clients", "2", "--min-available-clients", "3",
       "--round-deadline-ms", "60000", "--overcommit", "1.5"},
      {{"fast0", "synthetic:1000:300"}, {"fast1", "synthetic:1000:300"}, {"slow", "synthetic:1000:20000"}});
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_EQ(code, 0) << ReadFile(dir.File("server.txt"));
  EXPECT_LT(took, std::chrono::seconds(20)) << "the slow client's 20 s training held the run";
  const std::string db = dir.File("records.db");
  EXPECT_EQ(Query(db,
                  "SELECT count(*) FROM rounds WHERE status = 'committed' AND num_selected = 3 AND "
                  "num_accepted = 2"),
            2);
  EXPECT_EQ(Query(db,
                  "SELECT count(*) FROM client_rounds c JOIN clients USING (experiment_id, client_id) WHERE "
                  "client_name = 'slow' AND outcome = 'cancelled'"),
            2);
  EXPECT_EQ(Query(db,
                  "SELECT count(*) FROM client_rounds c JOIN clients USING (experiment_id, client_id) WHERE "
                  "client_name LIKE 'fast%' AND outcome = 'ok'"),
            4);
  // The slow client fetched round 2's model while round 2 was open: it had stopped round 1's training.
  EXPECT_EQ(Query(db,
                  "SELECT count(*) FROM client_rounds c JOIN clients USING (experiment_id, client_id) WHERE "
                  "client_name = 'slow' AND round = 2 AND downlink_server_start_unix_ms IS NOT NULL"),
            1)
      << ReadFile(dir.File("server.txt"));
  EXPECT_NE(ReadFile(dir.File("server.txt")).find("committed with its first 2 updates (over-commitment"),
            std::string::npos);
}

// The same straggler under both deadline policies: rounds of 1.5 s, a fast client (0.1 s) and a slow one (2 s).
// Each round commits at its deadline with the fast client's update (min_fit_clients 1); the slow client's update
// of round r arrives during round r + 1.
std::vector<std::string> DeadlineArgs(const std::string& policy) {
  return {"--rounds",
          "3",
          "--min-fit-clients",
          "1",
          "--min-available-clients",
          "2",
          "--round-deadline-ms",
          "1500",
          "--deadline-policy",
          policy,
          "--late-discount",
          "1"};
}

const std::vector<std::pair<std::string, std::string>> kDeadlineClients = {{"fast", "synthetic:1000:100"},
                                                                           {"slow", "synthetic:1000:2000"}};

TEST(StragglersProcessTest, LateUpdatesAreFoldedIntoTheNextRound) {
  fl::testing::ScratchDir dir("fl_fold_process");
  ASSERT_EQ(RunExperiment(dir, DeadlineArgs("fold"), kDeadlineClients), 0) << ReadFile(dir.File("server.txt"));
  const std::string db = dir.File("records.db");
  EXPECT_EQ(Query(db, "SELECT count(*) FROM rounds WHERE status = 'committed'"), 3);
  // Round 1's late update went into round 2's aggregate, one version late, at half its weight.
  EXPECT_EQ(Query(db,
                  "SELECT count(*) FROM client_rounds c JOIN clients USING (experiment_id, client_id) WHERE "
                  "client_name = 'slow' AND round = 1 AND outcome = 'folded' AND folded_into_round = 2 AND "
                  "staleness = 1 AND staleness_weight = 0.5 AND base_model_version = 0 AND num_examples > 0"),
            1)
      << ReadFile(dir.File("server.txt"));
  EXPECT_EQ(Query(db, "SELECT count(*) FROM client_rounds WHERE outcome = 'ok' AND staleness IS NOT NULL"), 0);
  EXPECT_NE(ReadFile(dir.File("server.txt")).find("late update(s) folded in"), std::string::npos);
}

TEST(StragglersProcessTest, LateUpdatesAreDroppedByDefault) {
  fl::testing::ScratchDir dir("fl_drop_process");
  ASSERT_EQ(RunExperiment(dir, DeadlineArgs("drop"), kDeadlineClients), 0) << ReadFile(dir.File("server.txt"));
  const std::string db = dir.File("records.db");
  EXPECT_EQ(Query(db, "SELECT count(*) FROM rounds WHERE status = 'committed' AND num_accepted = 1"), 3);
  EXPECT_EQ(Query(db, "SELECT count(*) FROM client_rounds WHERE outcome = 'folded'"), 0);
  EXPECT_EQ(Query(db,
                  "SELECT count(*) FROM client_rounds c JOIN clients USING (experiment_id, client_id) WHERE "
                  "client_name = 'slow' AND round = 1 AND outcome IN ('dropped', 'late')"),
            1);
}

}  // namespace
}  // namespace fl::server
