// The SVG writer and the plots: escaping, ticks, and one drawn bar per measured phase on the timeline.
#include "fl/report/plots.h"

#include <regex>

#include <gtest/gtest.h>

#include "fl/report/html_report.h"
#include "fl/report/svg.h"
#include "fl/testing/scratch_dir.h"
#include "records_fixture.h"
#include "svg_text.h"

namespace fl::report {
namespace {

using testing::RecordsFixture;

using testing::Count;
using testing::Group;

TEST(SvgWriterTest, EscapesTextAndAttributes) {
  EXPECT_EQ(XmlEscape("a<b & \"c\" 'd'>"), "a&lt;b &amp; &quot;c&quot; &#39;d&#39;&gt;");
  SvgWriter svg(100, 50);
  svg.Rect(1, 2, 3, 4, "#fff", "x < y");
  svg.Text(5, 6, "</svg><script>");
  const std::string out = svg.Finish("id\"", "label");
  EXPECT_EQ(out.find("<script>"), std::string::npos);
  EXPECT_NE(out.find("<title>x &lt; y</title>"), std::string::npos);
  EXPECT_NE(out.find("viewBox=\"0 0 100 50\""), std::string::npos);
  EXPECT_NE(out.find("id=\"id&quot;\""), std::string::npos);
  EXPECT_EQ(Count(out, "<svg"), 1u);
  EXPECT_EQ(Count(out, "</svg>"), 1u);
}

// Ticks are exact where the value is: steps of 0.2 from 1 reach 2 and 3 exactly (summing 0.2 five times gives
// 2.0000000000000004, which the round-time plot, labelling whole rounds only, skipped), and 0.3 is the double 0.3.
TEST(SvgWriterTest, NiceTicksAreExactWholeNumbersAndDecimals) {
  const std::vector<double> t = NiceTicks(1, 3, 10);
  ASSERT_EQ(t.size(), 11u);
  EXPECT_EQ(t[5], 2.0);
  EXPECT_EQ(t[10], 3.0);
  const std::vector<double> u = NiceTicks(0, 1, 10);
  ASSERT_GE(u.size(), 4u);
  EXPECT_EQ(u[3], 0.3);
}

TEST(SvgWriterTest, NiceTicksCoverTheRangeInRoundSteps) {
  const std::vector<double> t = NiceTicks(0, 9.3, 5);
  ASSERT_EQ(t.size(), 5u);
  EXPECT_DOUBLE_EQ(t.front(), 0);
  EXPECT_DOUBLE_EQ(t[1], 2);
  EXPECT_DOUBLE_EQ(t.back(), 8);
  const std::vector<double> u = NiceTicks(1, 40, 10);
  EXPECT_DOUBLE_EQ(u.front(), 5);
  EXPECT_DOUBLE_EQ(u[1] - u[0], 5);
  EXPECT_EQ(NiceTicks(3, 3).size(), 1u);
}

class PlotsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    RecordsFixture f(dir_.File("r.db"));
    f.Experiment("e", 1);
    f.Client("e", "eth", "ethernet");
    f.Client("e", "g5", "5g");
    for (int r = 1; r <= 3; ++r) {
      f.Round("e", r, 1000 * r, 500);
      f.ClientRound("e", r, "eth", 1000 * r, {.downlink_ms = 5, .train_ms = 100, .uplink_ms = 10, .idle_ms = 1});
      f.ClientRound("e", r, "g5", 1000 * r, {.downlink_ms = 30, .train_ms = 100, .uplink_ms = 300, .idle_ms = 1});
    }
    f.Close();
    auto data = LoadExperiment(dir_.File("r.db"));
    ASSERT_TRUE(data.ok()) << data.status();
    data_ = *std::move(data);
    analysis_ = Analyze(data_);
  }

  fl::testing::ScratchDir dir_{"report_plots"};
  ExperimentData data_;
  Analysis analysis_;
};

TEST_F(PlotsTest, TimelineDrawsEveryMeasuredPhaseOfEveryClient) {
  const std::string svg = TimelineSvg(data_, analysis_);
  // 3 rounds x 2 clients x 4 measured phases (downlink, train, idle, uplink), 3 round spans, 3 aggregations.
  EXPECT_EQ(Count(Group(svg, "phases"), "<rect"), 3u * 2 * 4 + 3 + 3) << svg;
  EXPECT_EQ(Count(Group(svg, "phases"), std::string("fill=\"") + std::string(PhaseColor(Phase::kUplink))), 6u);
  EXPECT_NE(svg.find("g5 round 2 uplink: 300.0 ms"), std::string::npos);
  // One straggler tick per round, all the 5g client's.
  EXPECT_EQ(Count(Group(svg, "stragglers"), "<rect"), 3u);
  EXPECT_EQ(Count(Group(svg, "stragglers"), "straggler: g5, dominant phase uplink"), 3u);
  // A window of one round draws that round only.
  const std::string one = TimelineSvg(data_, analysis_, {.first_round = 2, .last_round = 2});
  EXPECT_EQ(Count(Group(one, "phases"), "<rect"), 2u * 4 + 2);
}

TEST_F(PlotsTest, PhaseSharesBarsAddUpToTheRound) {
  const std::string svg = PhaseSharesSvg(data_, analysis_);
  // 5g: 30 + 100 + 1 + 300 of 500 ms -> uplink 60.0%, waiting 13.8%.
  EXPECT_NE(svg.find("5g uplink: 300.0 ms mean, 60.0% of the round"), std::string::npos) << svg;
  EXPECT_NE(svg.find("5g waiting for the round to end: 13.8% of the round"), std::string::npos) << svg;
  EXPECT_NE(svg.find("ethernet uplink: 10.0 ms mean, 2.0% of the round"), std::string::npos) << svg;
}

TEST_F(PlotsTest, RoundTimeHasOnePointPerCommittedRound) {
  const std::string svg = RoundTimeSvg(data_, analysis_);
  EXPECT_EQ(Count(Group(svg, "points"), "<circle"), 3u);
  EXPECT_NE(svg.find("round 3: 500.0 ms, straggler g5 (uplink)"), std::string::npos) << svg;
  EXPECT_EQ(Count(svg, "<path d=\"M"), 1u);
  // Every whole round of the range is labelled on the x axis: 1, 2 and 3 (10 font-size labels centred).
  for (const char* round : {"1", "2", "3"}) {
    EXPECT_EQ(Count(Group(svg, "axes"), fl::StrCat("text-anchor=\"middle\">", round, "</text>")), 1u) << round;
  }
}

TEST_F(PlotsTest, HtmlReportIsSelfContained) {
  const std::string html = HtmlReport(data_, analysis_);
  EXPECT_EQ(Count(html, "<svg"), 4u);                // timeline, phase shares, round time, learning curve
  EXPECT_EQ(Count(html, "<table id=\"table-"), 4u);  // links, groups, stragglers, rounds
  // Nothing fetched from anywhere: no scripts, no links, no external images or fonts.
  for (const char* bad : {"<script", "<link", "src=", "@import", "url("}) {
    EXPECT_EQ(html.find(bad), std::string::npos) << bad;
  }
  EXPECT_NE(html.find("<b>5g</b>: uplink = 60.0% of round time; uplink 30.00x Ethernet's"), std::string::npos)
      << html.substr(0, 3000);
}

}  // namespace
}  // namespace fl::report
