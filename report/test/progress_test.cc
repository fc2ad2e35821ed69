// fl-experiment's progress lines (fl/report/progress.h): the line of a committed round, of a failed attempt and of
// an evaluation that arrives after its round's line, and the follower reading a database as it grows.
#include "fl/report/progress.h"

#include <gtest/gtest.h>

#include "fl/testing/scratch_dir.h"
#include "records_fixture.h"

namespace fl::report {
namespace {

using testing::RecordsFixture;
namespace ins = fl::instrumentation;

class ProgressTest : public ::testing::Test {
 protected:
  ProgressTest() : dir_("fl_report_progress"), db_(dir_.File("records.db")) {}

  // Round r: three clients; g5's uplink (499.5 ms) makes it the slowest, by its uplink.
  static void Round(RecordsFixture& f, int r) {
    f.Round("e", r, 1000 * r, 800);
    f.ClientRound("e", r, "eth", 1000 * r, {.downlink_ms = 2, .train_ms = 100, .uplink_ms = 15});
    f.ClientRound("e", r, "wifi", 1000 * r, {.downlink_ms = 5, .train_ms = 100, .uplink_ms = 28});
    f.ClientRound("e", r, "g5", 1000 * r, {.downlink_ms = 9, .train_ms = 100, .uplink_ms = 499.5});
  }

  static void Clients(RecordsFixture& f) {
    f.Experiment("e", 100, "progress");
    f.Client("e", "eth", "ethernet");
    f.Client("e", "wifi", "wifi");
    f.Client("e", "g5", "5g");
  }

  fl::testing::ScratchDir dir_;
  std::string db_;
};

TEST_F(ProgressTest, ACommittedRoundNamesAcceptedSelectedTheSlowestClientItsPhaseAndTheAccuracy) {
  RecordsFixture f(db_);
  Clients(f);
  Round(f, 1);
  f.RoundEvaluation("e", 1, 0.5, 0.8123, std::nullopt, std::nullopt);
  f.Flush();
  absl::StatusOr<ExperimentData> data = LoadExperiment(db_, "e");
  ASSERT_TRUE(data.ok()) << data.status();
  const Analysis a = Analyze(*data);
  ASSERT_EQ(a.rounds.size(), 1u);
  EXPECT_EQ(ProgressLine(*data, a.rounds[0], 20),
            "round 1/20: 3/3 accepted in 0.8 s; slowest g5: uplink 0.50 s; test accuracy 0.8123");
  EXPECT_EQ(ProgressLine(*data, a.rounds[0], std::nullopt),
            "round 1: 3/3 accepted in 0.8 s; slowest g5: uplink 0.50 s; test accuracy 0.8123");
}

TEST_F(ProgressTest, TheFollowerPrintsEachRoundOnceAndALateEvaluationOnALineOfItsOwn) {
  ProgressFollower follower(db_, "e", 5);
  EXPECT_TRUE(follower.Poll().empty()) << "no database yet";
  RecordsFixture f(db_);
  Clients(f);
  f.Flush();
  EXPECT_TRUE(follower.Poll().empty()) << "no round yet";
  Round(f, 1);
  f.Flush();
  EXPECT_EQ(follower.Poll(), std::vector<std::string>{"round 1/5: 3/3 accepted in 0.8 s; slowest g5: uplink 0.50 s"});
  EXPECT_TRUE(follower.Poll().empty());
  f.RoundEvaluation("e", 1, 0.5, 0.75, std::nullopt, std::nullopt);
  f.Round("e", 2, 2000, 60000, ins::RoundStatus::kFailed);
  f.Flush();
  EXPECT_EQ(follower.Poll(), (std::vector<std::string>{"round 1/5 evaluated: test accuracy 0.7500",
                                                       "round 2/5 attempt 0 failed after 60.0 s: test"}));
  EXPECT_TRUE(follower.Poll().empty());
}

TEST_F(ProgressTest, OtherOutcomesAreCountedAndABufferedExperimentSaysStepsAndUpdatesApplied) {
  RecordsFixture f(db_);
  Clients(f);
  f.Round("e", 1, 1000, 3100);
  f.ClientRound("e", 1, "eth", 1000, {.train_ms = 100, .uplink_ms = 15});
  f.ClientRound("e", 1, "g5", 1000, {.train_ms = 100, .uplink_ms = 2400});
  f.ClientRound("e", 1, "wifi", 1000, {.train_ms = 100}, ins::ClientOutcome::kDropped);
  f.Flush();
  {
    absl::StatusOr<ExperimentData> data = LoadExperiment(db_, "e");
    ASSERT_TRUE(data.ok()) << data.status();
    data->rounds[0].num_dropped = 1;  // the fixture's round row counts no dropped update
    const Analysis a = Analyze(*data);
    EXPECT_EQ(ProgressLine(*data, a.rounds[0], 3),
              "round 1/3: 3/3 accepted (1 dropped) in 3.1 s; slowest g5: uplink 2.40 s");
    data->experiment.aggregation = "buffered";
    EXPECT_EQ(ProgressLine(*data, a.rounds[0], 3),
              "step 1: 3 updates applied in 3.1 s (1 dropped); slowest g5: uplink 2.40 s");
  }
}

}  // namespace
}  // namespace fl::report
