// The report's figures against records written through the real RecordStore: exact link ratios and shares,
// the straggler by arrival (laid end to end, and from v3 start times), its dominant phase, the ranking.
#include "fl/report/analysis.h"

#include <gtest/gtest.h>

#include "fl/report/experiment_data.h"
#include "fl/testing/scratch_dir.h"
#include "records_fixture.h"

namespace fl::report {
namespace {

using testing::Phases;
using testing::RecordsFixture;
namespace ins = fl::instrumentation;

constexpr size_t kUp = static_cast<size_t>(Phase::kUplink);
constexpr size_t kDown = static_cast<size_t>(Phase::kDownlink);

const LinkSummary* FindLink(const Analysis& a, std::string_view kind) {
  for (const LinkSummary& l : a.links) {
    if (l.link_kind == kind) return &l;
  }
  return nullptr;
}

// Three link kinds with known uplink times: 5g 500 ms, wifi 30 ms, ethernet 10 and 20 ms (mean 15).
class LinkFiguresTest : public ::testing::Test {
 protected:
  void SetUp() override {
    RecordsFixture f(dir_.File("r.db"));
    f.Experiment("e", 1000);
    f.Client("e", "eth", "ethernet");
    f.Client("e", "wifi", "wifi");
    f.Client("e", "fiveg", "5g");
    f.Round("e", 1, 10'000, 1000);
    f.Round("e", 2, 20'000, 2000);
    f.Round("e", 3, 30'000, 4000, ins::RoundStatus::kFailed);  // never counts in link figures
    const int64_t starts[] = {10'000, 20'000};
    const double eth_up[] = {10, 20};
    for (int r = 0; r < 2; ++r) {
      f.ClientRound("e", r + 1, "eth", starts[r],
                    {.downlink_ms = 4,
                     .train_ms = 100,
                     .uplink_ms = eth_up[r],
                     .uplink_server_ms = 8,
                     .downlink_bytes = 1000,
                     .uplink_bytes = 900});
      f.ClientRound("e", r + 1, "wifi", starts[r],
                    {.downlink_ms = 8, .train_ms = 100, .uplink_ms = 30, .downlink_bytes = 1000, .uplink_bytes = 900});
      f.ClientRound(
          "e", r + 1, "fiveg", starts[r],
          {.downlink_ms = 40, .train_ms = 100, .uplink_ms = 500, .downlink_bytes = 1000, .uplink_bytes = 300});
    }
    // A late 5g update (outcome 'late') with a huge uplink, and the failed attempt's rows: both excluded.
    f.Client("e", "fiveg-late", "5g");
    f.ClientRound("e", 2, "fiveg-late", 20'000, {.uplink_ms = 99'999}, ins::ClientOutcome::kLate);
    f.ClientRound("e", 3, "fiveg", 30'000, {.uplink_ms = 88'888});
    // Federated evaluations after round 2: 5g takes 70 and 90 ms, wifi 12 ms.
    f.Evaluation("e", 2, "fiveg", 70);
    f.Evaluation("e", 2, "fiveg-late", 90);
    f.Evaluation("e", 2, "wifi", 12);
    f.Close();
    auto data = LoadExperiment(dir_.File("r.db"));
    ASSERT_TRUE(data.ok()) << data.status();
    data_ = *std::move(data);
  }

  fl::testing::ScratchDir dir_{"report_links"};
  ExperimentData data_;
};

TEST_F(LinkFiguresTest, UplinkRatiosAgainstEthernetAndWifiAreExact) {
  const Analysis a = Analyze(data_);
  ASSERT_EQ(a.links.size(), 3u);
  EXPECT_EQ(a.links[0].link_kind, "ethernet");
  EXPECT_EQ(a.links[1].link_kind, "wifi");
  EXPECT_EQ(a.links[2].link_kind, "5g");
  const LinkSummary* g5 = FindLink(a, "5g");
  ASSERT_NE(g5, nullptr);
  EXPECT_DOUBLE_EQ(*g5->mean_phase_ms[kUp], 500.0);
  EXPECT_DOUBLE_EQ(*FindLink(a, "ethernet")->mean_phase_ms[kUp], 15.0);
  EXPECT_DOUBLE_EQ(*g5->uplink_vs_ethernet, 500.0 / 15.0);
  EXPECT_DOUBLE_EQ(*g5->uplink_vs_wifi, 500.0 / 30.0);
  EXPECT_DOUBLE_EQ(*g5->downlink_vs_ethernet, 40.0 / 4.0);
  EXPECT_DOUBLE_EQ(*FindLink(a, "ethernet")->uplink_vs_ethernet, 1.0);
  EXPECT_DOUBLE_EQ(*FindLink(a, "wifi")->uplink_vs_ethernet, 2.0);
  EXPECT_EQ(g5->num_clients, 1);  // the late client's only row is not accepted
  EXPECT_EQ(g5->num_client_rounds, 2);
}

TEST_F(LinkFiguresTest, UplinkShareIsUplinkOverRoundTime) {
  const Analysis a = Analyze(data_);
  // 5g: (500 + 500) / (1000 + 2000); ethernet: (10 + 20) / 3000.
  EXPECT_DOUBLE_EQ(*FindLink(a, "5g")->uplink_share, 1000.0 / 3000.0);
  EXPECT_DOUBLE_EQ(*FindLink(a, "ethernet")->uplink_share, 30.0 / 3000.0);
  EXPECT_DOUBLE_EQ(*FindLink(a, "5g")->mean_round_ms, 1500.0);
  EXPECT_DOUBLE_EQ(*FindLink(a, "5g")->mean_uplink_bytes, 300.0);
  EXPECT_DOUBLE_EQ(*FindLink(a, "ethernet")->mean_downlink_bytes, 1000.0);
}

TEST_F(LinkFiguresTest, FederatedEvaluationTimeIsAveragedPerLinkKind) {
  const Analysis a = Analyze(data_);
  EXPECT_DOUBLE_EQ(*FindLink(a, "5g")->mean_federated_eval_ms, 80.0);
  EXPECT_DOUBLE_EQ(*FindLink(a, "wifi")->mean_federated_eval_ms, 12.0);
  EXPECT_FALSE(FindLink(a, "ethernet")->mean_federated_eval_ms.has_value());
  // Local evaluation inside training tasks was never measured here.
  EXPECT_FALSE(FindLink(a, "5g")->mean_phase_ms[static_cast<size_t>(Phase::kEval)].has_value());
}

TEST_F(LinkFiguresTest, FiguresMatchSqlOverTheRecords) {
  // The same figures computed independently, in SQL, from the file.
  RecordsFixture db(dir_.File("r.db"));
  const std::string ok_rows =
      "FROM client_rounds c JOIN clients USING (experiment_id, client_id) JOIN rounds r USING (experiment_id, "
      "round, attempt) WHERE c.outcome = 'ok' AND r.status = 'committed' AND link_kind = ";
  const double g5 = db.QueryDouble("SELECT avg(coalesce(uplink_ms, uplink_server_ms)) " + ok_rows + "'5g'");
  const double eth = db.QueryDouble("SELECT avg(coalesce(uplink_ms, uplink_server_ms)) " + ok_rows + "'ethernet'");
  const double share =
      db.QueryDouble("SELECT sum(coalesce(uplink_ms, uplink_server_ms)) / sum(r.duration_ms) " + ok_rows + "'5g'");
  const Analysis a = Analyze(data_);
  EXPECT_DOUBLE_EQ(*FindLink(a, "5g")->uplink_vs_ethernet, g5 / eth);
  EXPECT_DOUBLE_EQ(*FindLink(a, "5g")->uplink_share, share);
}

TEST_F(LinkFiguresTest, RoundsTableFiguresExcludeLateUpdates) {
  const Analysis a = Analyze(data_);
  ASSERT_EQ(a.rounds.size(), 3u);
  EXPECT_EQ(a.committed_rounds, 2);
  const RoundSummary& r2 = a.rounds[1];
  EXPECT_EQ(r2.uplink_ms.n, 3);
  EXPECT_DOUBLE_EQ(r2.uplink_ms.max, 500.0);
  EXPECT_DOUBLE_EQ(r2.uplink_ms.mean, (20.0 + 30.0 + 500.0) / 3.0);
  EXPECT_DOUBLE_EQ(r2.downlink_ms.mean, (4.0 + 8.0 + 40.0) / 3.0);
  EXPECT_DOUBLE_EQ(r2.train_ms.max, 100.0);
  // The 5g client arrives last in both committed rounds (40 + 100 + 500 ms), by its uplink.
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(a.rounds[i].straggler.has_value());
    EXPECT_EQ(a.rounds[i].straggler->client_id, "fiveg");
    EXPECT_EQ(a.rounds[i].straggler->dominant_phase, Phase::kUplink);
  }
}

TEST_F(LinkFiguresTest, StragglerRankingCountsRoundsAndPhases) {
  const Analysis a = Analyze(data_);
  EXPECT_EQ(a.rounds_with_straggler, 2);
  ASSERT_FALSE(a.stragglers.empty());
  const StragglerRank& top = a.stragglers.front();
  EXPECT_EQ(top.client_id, "fiveg");
  EXPECT_EQ(top.times_straggler, 2);
  EXPECT_EQ(top.rounds_accepted, 2);
  EXPECT_DOUBLE_EQ(top.share, 1.0);
  EXPECT_EQ(top.by_phase[kUp], 2);
  EXPECT_EQ(top.top_phase, Phase::kUplink);
  for (size_t i = 1; i < a.stragglers.size(); ++i) EXPECT_EQ(a.stragglers[i].times_straggler, 0);
}

// Arrival order decides the straggler, not the longest single phase; the dominant phase is the one most
// above the round's median.
TEST(StragglerTest, LastArrivalWithPhasesLaidEndToEnd) {
  fl::testing::ScratchDir dir("report_straggler");
  RecordsFixture f(dir.File("r.db"));
  f.Experiment("e", 1);
  for (const char* c : {"a", "b", "c"}) f.Client("e", c, "wifi");
  f.Round("e", 1, 1000, 500);
  // a: 10 + 100 + 10 = 120; b: 10 + 100 + 200 = 310 (longest uplink); c: 300 + 50 + 10 = 360, arrives last.
  f.ClientRound("e", 1, "a", 1000, {.downlink_ms = 10, .train_ms = 100, .uplink_ms = 10});
  f.ClientRound("e", 1, "c", 1000, {.downlink_ms = 300, .train_ms = 50, .uplink_ms = 10});
  f.ClientRound("e", 1, "b", 1000, {.downlink_ms = 10, .train_ms = 100, .uplink_ms = 200});
  f.Close();
  auto data = LoadExperiment(dir.File("r.db"));
  ASSERT_TRUE(data.ok()) << data.status();
  const Analysis a = Analyze(*data);
  ASSERT_TRUE(a.rounds[0].straggler.has_value());
  EXPECT_EQ(a.rounds[0].straggler->client_id, "c");
  // c's downlink is 290 ms above the median (10); its train is below the median.
  EXPECT_EQ(a.rounds[0].straggler->dominant_phase, Phase::kDownlink);
  EXPECT_DOUBLE_EQ(a.rounds[0].straggler->excess_ms, 290.0);
  EXPECT_DOUBLE_EQ(*a.rounds[0].straggler->arrival_unix_ms, 1000.0 + 360.0);
}

TEST(StragglerTest, RecordedStartTimesWinOverTheSumOfPhases) {
  fl::testing::ScratchDir dir("report_v3");
  RecordsFixture f(dir.File("r.db"));
  f.Experiment("e", 1);
  for (const char* c : {"fast", "queued"}) f.Client("e", c, "ethernet");
  f.Round("e", 1, 1000, 900);
  // "fast" has the longer phases (sum 400) but "queued" started its download 600 ms after dispatch: on the
  // server's timeline it arrives last (1600 + 5 + 150 + 20 = 1775 > 1400).
  f.ClientRound("e", 1, "fast", 1000,
                {.downlink_ms = 100,
                 .train_ms = 200,
                 .uplink_ms = 100,
                 .uplink_server_ms = 90,
                 .downlink_start = 1000,
                 .train_start = 1100,
                 .uplink_start = 1300,
                 .uplink_end = 1400,
                 .uplink_server_start = 1305});
  f.ClientRound("e", 1, "queued", 1000,
                {.downlink_ms = 5,
                 .train_ms = 150,
                 .uplink_ms = 20,
                 .uplink_server_ms = 15,
                 .downlink_start = 1600,
                 .train_start = 1605,
                 .uplink_start = 1755,
                 .uplink_end = 1775,
                 .uplink_server_start = 1757});
  f.Close();
  auto data = LoadExperiment(dir.File("r.db"));
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_TRUE(data->has_phase_starts);
  const Analysis a = Analyze(*data);
  ASSERT_TRUE(a.rounds[0].straggler.has_value());
  EXPECT_EQ(a.rounds[0].straggler->client_id, "queued");
  // Arrival = the server's last byte: uplink_server_start + uplink_server_ms.
  EXPECT_DOUBLE_EQ(*a.rounds[0].straggler->arrival_unix_ms, 1757.0 + 15.0);
  // It exceeds no median (2 clients: the median is the mean; its phases are all shorter): its longest phase.
  EXPECT_EQ(a.rounds[0].straggler->dominant_phase, Phase::kTrain);
  EXPECT_DOUBLE_EQ(a.rounds[0].straggler->excess_ms, 0.0);

  const ClientRoundRow* queued = nullptr;
  for (const ClientRoundRow& c : data->rounds[0].clients) {
    if (c.client_id == "queued") queued = &c;
  }
  ASSERT_NE(queued, nullptr);
  const PlacedPhases placed = PlaceOnServerTimeline(*queued);
  EXPECT_TRUE(placed.from_recorded_starts);
  EXPECT_DOUBLE_EQ(placed.spans[kDown]->start_unix_ms, 1600.0);
  EXPECT_DOUBLE_EQ(placed.spans[kDown]->end_unix_ms, 1605.0);
  EXPECT_DOUBLE_EQ(placed.spans[kUp]->start_unix_ms, 1755.0);
  EXPECT_DOUBLE_EQ(placed.spans[kUp]->end_unix_ms, 1775.0);
  // With recorded starts, idle is the gaps between phases and is not drawn as a bar of its own.
  EXPECT_FALSE(placed.spans[static_cast<size_t>(Phase::kIdle)].has_value());
}

TEST(StragglerTest, UnreportedClientUplinkIsPlacedByTheServersView) {
  ClientRoundRow row;
  row.outcome = "ok";
  row.dispatched_unix_ms = 1000;
  row.downlink_ms = 10;
  row.train_ms = 50;
  row.downlink_start_unix_ms = 1001;
  row.train_start_unix_ms = 1012;
  row.uplink_server_ms = 7;
  row.uplink_server_start_unix_ms = 1070;
  const PlacedPhases placed = PlaceOnServerTimeline(row);
  ASSERT_TRUE(placed.spans[kUp].has_value());
  EXPECT_DOUBLE_EQ(placed.spans[kUp]->start_unix_ms, 1070.0);
  EXPECT_DOUBLE_EQ(placed.spans[kUp]->end_unix_ms, 1077.0);
  EXPECT_DOUBLE_EQ(*placed.arrival_unix_ms, 1077.0);
}

TEST(StragglerTest, FallbackLayoutPutsIdleBeforeTheUplink) {
  ClientRoundRow row;
  row.outcome = "ok";
  row.dispatched_unix_ms = 1000;
  row.downlink_ms = 10;
  row.train_ms = 50;
  row.eval_ms = 5;
  row.idle_ms = 3;
  row.uplink_ms = 20;
  const PlacedPhases placed = PlaceOnServerTimeline(row);
  EXPECT_FALSE(placed.from_recorded_starts);
  EXPECT_DOUBLE_EQ(placed.spans[static_cast<size_t>(Phase::kTrain)]->start_unix_ms, 1010.0);
  EXPECT_DOUBLE_EQ(placed.spans[static_cast<size_t>(Phase::kEval)]->start_unix_ms, 1060.0);
  EXPECT_DOUBLE_EQ(placed.spans[static_cast<size_t>(Phase::kIdle)]->start_unix_ms, 1065.0);
  EXPECT_DOUBLE_EQ(placed.spans[kUp]->start_unix_ms, 1068.0);
  EXPECT_DOUBLE_EQ(*placed.arrival_unix_ms, 1088.0);
}

TEST(StragglerTest, TiesGoToTheRowWrittenLastAndRankingSharesAddUp) {
  fl::testing::ScratchDir dir("report_ties");
  RecordsFixture f(dir.File("r.db"));
  f.Experiment("e", 1);
  for (const char* c : {"x", "y"}) f.Client("e", c, "5g");
  // Round 1: equal sums, y written last -> y. Rounds 2 and 3: x arrives last by training.
  f.Round("e", 1, 1000, 100);
  f.ClientRound("e", 1, "x", 1000, {.downlink_ms = 1, .train_ms = 10, .uplink_ms = 1});
  f.ClientRound("e", 1, "y", 1000, {.downlink_ms = 1, .train_ms = 10, .uplink_ms = 1});
  for (int r = 2; r <= 3; ++r) {
    f.Round("e", r, 1000 * r, 100);
    f.ClientRound("e", r, "y", 1000 * r, {.downlink_ms = 1, .train_ms = 10, .uplink_ms = 1});
    f.ClientRound("e", r, "x", 1000 * r, {.downlink_ms = 1, .train_ms = 60, .uplink_ms = 1});
  }
  // Round 4: no accepted update (both dropped): no straggler, not in the shares' denominator.
  f.Round("e", 4, 4000, 100);
  f.ClientRound("e", 4, "x", 4000, {}, ins::ClientOutcome::kDropped);
  f.Close();
  auto data = LoadExperiment(dir.File("r.db"));
  ASSERT_TRUE(data.ok()) << data.status();
  const Analysis a = Analyze(*data);
  EXPECT_EQ(a.rounds[0].straggler->client_id, "y");
  EXPECT_FALSE(a.rounds[3].straggler.has_value());
  EXPECT_EQ(a.rounds_with_straggler, 3);
  ASSERT_EQ(a.stragglers.size(), 2u);
  EXPECT_EQ(a.stragglers[0].client_id, "x");
  EXPECT_EQ(a.stragglers[0].times_straggler, 2);
  EXPECT_DOUBLE_EQ(a.stragglers[0].share, 2.0 / 3.0);
  EXPECT_EQ(a.stragglers[0].by_phase[static_cast<size_t>(Phase::kTrain)], 2);
  EXPECT_EQ(a.stragglers[1].times_straggler, 1);
  EXPECT_DOUBLE_EQ(a.stragglers[0].share + a.stragglers[1].share, 1.0);
}

}  // namespace
}  // namespace fl::report
