// The HTML report rendered in headless Chromium: what a person would see. Each plot is in the rendered DOM
// with drawn content; the headline figures (the study's 5G/Ethernet and 5G/WiFi uplink ratios and the 5G
// uplink share) and the round count shown in the tables equal values computed with SQL from the records.
#include <gtest/gtest.h>

#include "fl/testing/scratch_dir.h"
#include "chromium_dom.h"
#include "records_fixture.h"
#include "run_tool.h"

namespace fl::report {
namespace {

using namespace fl::report::testing;  // NOLINT: test helpers
namespace ins = fl::instrumentation;

TEST(HtmlChromiumTest, PlotsAreDrawnAndTablesShowTheRecordsFigures) {
  fl::testing::ScratchDir dir("report_chromium");
  const std::string db = dir.File("records.db");
  {
    // Figures in the range the study measured: 5g uplink ~33x Ethernet's and ~18x WiFi's.
    RecordsFixture f(db);
    f.Experiment("study", 1, "links");
    for (const char* c : {"eth-1", "eth-2"}) f.Client("study", c, "ethernet", "rpi4");
    f.Client("study", "wifi-1", "wifi", "rpi4");
    f.Client("study", "5g-1", "5g", "rpi4");
    for (int r = 1; r <= 5; ++r) {
      const int64_t t0 = 100'000 * r;
      f.Round("study", r, t0, 9000 + 100 * r);
      f.ClientRound("study", r, "eth-1", t0, {.downlink_ms = 40, .train_ms = 5000, .uplink_ms = 60.0 + r});
      f.ClientRound("study", r, "eth-2", t0, {.downlink_ms = 41, .train_ms = 5100, .uplink_ms = 62.0});
      f.ClientRound("study", r, "wifi-1", t0, {.downlink_ms = 70, .train_ms = 5050, .uplink_ms = 115.0 + 2 * r});
      f.ClientRound("study", r, "5g-1", t0, {.downlink_ms = 300, .train_ms = 5200, .uplink_ms = 2050.0 + 10 * r});
      if (r >= 2) f.RoundEvaluation("study", r, 1.0 / r, 0.6 + 0.05 * r, {}, {});  // round 1 not evaluated
    }
    // A failed attempt and a late update: shown in the rounds table, excluded from every figure.
    f.Round("study", 6, 700'000, 30'000, ins::RoundStatus::kFailed);
    f.ClientRound("study", 6, "5g-1", 700'000, {.uplink_ms = 25'000}, ins::ClientOutcome::kLate);
    f.Close();
  }
  const std::string html = dir.File("report.html");
  const ToolResult made = RunTool({FL_REPORT_BIN, db, "--format", "html", "--out", html}, dir);
  ASSERT_EQ(made.code, 0) << made.output;

  const std::string dom = RenderDom(html, dir);
  ASSERT_FALSE(dom.empty());

  // Every plot: an <svg> with a viewBox and drawn content.
  for (const char* id : {"plot-timeline", "plot-phase-shares", "plot-round-time", "plot-metric"}) {
    const std::string svg = ElementById(dom, "svg", id);
    ASSERT_FALSE(svg.empty()) << id << " is not in the rendered page";
    EXPECT_NE(svg.find("viewBox=\"0 0 "), std::string::npos) << id;
    EXPECT_GT(CountOf(svg, "<rect") + CountOf(svg, "<path") + CountOf(svg, "<circle"), 0u) << id;
  }
  RecordsFixture sql(db);
  // The timeline: one bar per measured phase of every client round (4 clients x 5 rounds x 3 phases, plus the
  // late update's uplink), one per round attempt and one per aggregation.
  const double phase_bars = sql.QueryDouble(
      "SELECT sum((downlink_ms IS NOT NULL) + (train_ms IS NOT NULL) + (eval_ms IS NOT NULL) + "
      "(idle_ms IS NOT NULL) + (coalesce(uplink_ms, uplink_server_ms) IS NOT NULL)) FROM client_rounds");
  const double round_bars =
      sql.QueryDouble("SELECT count(*) + count(aggregation_ms) FROM rounds WHERE experiment_id = 'study'");
  const std::string timeline = ElementById(dom, "svg", "plot-timeline");
  const size_t phases_begin = timeline.find("<g class=\"phases\">");
  ASSERT_NE(phases_begin, std::string::npos);
  const std::string phases = timeline.substr(phases_begin, timeline.find("</g>", phases_begin) - phases_begin);
  EXPECT_EQ(static_cast<double>(CountOf(phases, "<rect")), phase_bars + round_bars);
  // Round time: one point per committed round.
  EXPECT_EQ(static_cast<double>(CountOf(ElementById(dom, "svg", "plot-round-time"), "<circle")),
            sql.QueryDouble("SELECT count(*) FROM rounds WHERE status = 'committed'"));
  // Learning curve: one point per evaluated committed round, against the round and against wall time.
  EXPECT_EQ(
      static_cast<double>(CountOf(ElementById(dom, "svg", "plot-metric"), "<circle")),
      2 * sql.QueryDouble("SELECT count(*) FROM rounds WHERE status = 'committed' AND eval_accuracy IS NOT NULL"));
  // Phase shares: one bar segment per measured phase and link kind (3 phases x 3 kinds) plus "waiting".
  EXPECT_GE(CountOf(ElementById(dom, "svg", "plot-phase-shares"), "<rect"), 9u);

  // The link summary as shown, against SQL over the accepted updates of committed rounds.
  const std::string accepted =
      "FROM client_rounds c JOIN clients USING (experiment_id, client_id) JOIN rounds r USING (experiment_id, "
      "round, attempt) WHERE c.outcome = 'ok' AND r.status = 'committed' AND link_kind = ";
  auto uplink_mean = [&](const std::string& kind) {
    return sql.QueryDouble("SELECT avg(coalesce(uplink_ms, uplink_server_ms)) " + accepted + "'" + kind + "'");
  };
  const double g5 = uplink_mean("5g"), eth = uplink_mean("ethernet"), wifi = uplink_mean("wifi");
  const double g5_share =
      sql.QueryDouble("SELECT sum(coalesce(uplink_ms, uplink_server_ms)) / sum(r.duration_ms) " + accepted + "'5g'");
  const auto links = TableRows(ElementById(dom, "table", "table-links"));
  ASSERT_EQ(links.size(), 3u);
  const auto row = RowWhere(links, "link_kind", "5g");
  ASSERT_FALSE(row.empty());
  EXPECT_EQ(row.at("uplink_vs_ethernet"), Shown(g5 / eth, 2, "x"));
  EXPECT_EQ(row.at("uplink_vs_wifi"), Shown(g5 / wifi, 2, "x"));
  EXPECT_EQ(row.at("uplink_share"), Shown(g5_share * 100, 1, "%"));
  EXPECT_EQ(row.at("uplink_mean_ms"), Shown(g5, 1));
  EXPECT_EQ(row.at("client_rounds"), "5");
  // And the same figures are in the study's range (this fixture was built to be): 33x and 18x.
  EXPECT_EQ(row.at("uplink_vs_ethernet").substr(0, 2), "33");
  EXPECT_EQ(row.at("uplink_vs_wifi").substr(0, 2), "17");

  // The round count shown in the header and the rows of the rounds table.
  const double committed = sql.QueryDouble("SELECT count(*) FROM rounds WHERE status = 'committed'");
  EXPECT_NE(dom.find("<span id=\"committed-rounds\">" + Shown(committed, 0) + "</span>"), std::string::npos);
  const auto rounds = TableRows(ElementById(dom, "table", "table-rounds"));
  ASSERT_EQ(static_cast<double>(rounds.size()), sql.QueryDouble("SELECT count(*) FROM rounds"));
  for (const auto& r : rounds) {
    const std::string where = " FROM rounds WHERE round = " + r.at("round");
    EXPECT_EQ(r.at("round_ms"), Shown(sql.QueryDouble("SELECT duration_ms" + where), 1));
    EXPECT_EQ(r.at("status"), sql.QueryText("SELECT status" + where));
    if (r.at("status") == "committed") {
      EXPECT_EQ(r.at("straggler"), "5g-1");
    }
  }
  // The straggler ranking: the 5g client set every committed round's time, by its uplink.
  const auto stragglers = TableRows(ElementById(dom, "table", "table-stragglers"));
  ASSERT_FALSE(stragglers.empty());
  EXPECT_EQ(stragglers[0].at("client"), "5g-1");
  EXPECT_EQ(stragglers[0].at("times_straggler"), Shown(committed, 0));
  EXPECT_EQ(stragglers[0].at("share"), "100.0%");
  EXPECT_EQ(stragglers[0].at("top_phase"), "uplink");
}

}  // namespace
}  // namespace fl::report
