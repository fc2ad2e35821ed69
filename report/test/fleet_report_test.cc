// fl-report at fleet scale: the link kind x device class table, the stragglers table cut to the top N, and the
// timeline drawn a row per group once there are more clients than rows fit, on records written through the real
// RecordStore with known phase times.
#include <gtest/gtest.h>

#include "fl/core/str_cat.h"
#include "fl/report/analysis.h"
#include "fl/report/experiment_data.h"
#include "fl/report/plots.h"
#include "fl/report/tables.h"
#include "fl/testing/scratch_dir.h"
#include "records_fixture.h"
#include "svg_text.h"

namespace fl::report {
namespace {

using testing::Count;
using testing::Group;
using testing::RecordsFixture;

constexpr size_t kTrain = static_cast<size_t>(Phase::kTrain);
constexpr size_t kUp = static_cast<size_t>(Phase::kUplink);

// 60 clients: 10 of each of {ethernet, wifi, 5g} x {rpi4, rpi5}, all in each of 3 rounds. Training takes 400 ms on
// rpi4 and 200 on rpi5; the uplink 10 ms on ethernet, 50 on wifi, 500 on 5g. One 5g/rpi4 client trains 450 ms
// and so straggles: 5g-rpi4-3 in rounds 1 and 2, 5g-rpi4-7 in round 3.
class FleetReportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    RecordsFixture f(dir_.File("r.db"));
    f.Experiment("e", 1000);
    for (const char* link : {"ethernet", "wifi", "5g"}) {
      for (const char* device : {"rpi4", "rpi5"}) {
        for (int i = 0; i < 10; ++i) f.Client("e", fl::StrCat(link, "-", device, "-", i), link, device);
      }
    }
    for (int r = 1; r <= 3; ++r) {
      f.Round("e", r, 10'000 * r, 2000);
      const std::string slow = r < 3 ? "5g-rpi4-3" : "5g-rpi4-7";
      for (const char* link : {"ethernet", "wifi", "5g"}) {
        const double up = std::string(link) == "5g" ? 500 : std::string(link) == "wifi" ? 50 : 10;
        for (const char* device : {"rpi4", "rpi5"}) {
          for (int i = 0; i < 10; ++i) {
            const std::string id = fl::StrCat(link, "-", device, "-", i);
            const double train = id == slow ? 450 : std::string(device) == "rpi4" ? 400 : 200;
            f.ClientRound("e", r, id, 10'000 * r, {.downlink_ms = 5, .train_ms = train, .uplink_ms = up});
          }
        }
      }
    }
    f.Close();
    auto data = LoadExperiment(dir_.File("r.db"));
    ASSERT_TRUE(data.ok()) << data.status();
    data_ = *std::move(data);
    analysis_ = Analyze(data_);
  }

  const GroupSummary* FindGroup(std::string_view link, std::string_view device) const {
    for (const GroupSummary& g : analysis_.groups) {
      if (g.link_kind == link && g.device_class == device) return &g;
    }
    return nullptr;
  }

  fl::testing::ScratchDir dir_{"report_fleet"};
  ExperimentData data_;
  Analysis analysis_;
};

TEST_F(FleetReportTest, GroupsSummarizeEachLinkKindAndDeviceClassExactly) {
  ASSERT_EQ(analysis_.groups.size(), 6u);
  // Ordered as the link table (ethernet, wifi, 5g), then by device class.
  EXPECT_EQ(analysis_.groups[0].link_kind, "ethernet");
  EXPECT_EQ(analysis_.groups[0].device_class, "rpi4");
  EXPECT_EQ(analysis_.groups[5].link_kind, "5g");
  EXPECT_EQ(analysis_.groups[5].device_class, "rpi5");
  const GroupSummary* eth5 = FindGroup("ethernet", "rpi5");
  ASSERT_NE(eth5, nullptr);
  EXPECT_EQ(eth5->num_clients, 10);
  EXPECT_EQ(eth5->num_client_rounds, 30);
  EXPECT_DOUBLE_EQ(eth5->phase_ms[kTrain].mean, 200.0);
  EXPECT_DOUBLE_EQ(eth5->phase_ms[kUp].mean, 10.0);
  EXPECT_EQ(eth5->times_straggler, 0);
  EXPECT_FALSE(eth5->top_phase.has_value());
  EXPECT_TRUE(eth5->top_straggler.empty());

  const GroupSummary* slow = FindGroup("5g", "rpi4");
  ASSERT_NE(slow, nullptr);
  EXPECT_DOUBLE_EQ(slow->phase_ms[kTrain].mean, (27 * 400.0 + 3 * 450.0) / 30);
  EXPECT_DOUBLE_EQ(slow->phase_ms[kTrain].max, 450.0);
  EXPECT_DOUBLE_EQ(slow->phase_ms[kUp].max, 500.0);
  EXPECT_EQ(slow->times_straggler, 3);
  EXPECT_DOUBLE_EQ(slow->straggler_share, 1.0);
  ASSERT_TRUE(slow->top_phase.has_value());
  // Its straggler trained longest, but exceeded the round's median uplink (50 ms) by more: uplink dominates.
  EXPECT_EQ(*slow->top_phase, Phase::kUplink);
  EXPECT_EQ(slow->top_straggler, "5g-rpi4-3");
  EXPECT_EQ(slow->top_straggler_times, 2);

  const Table t = GroupsTable(data_, analysis_);
  ASSERT_EQ(t.rows.size(), 6u);
  const absl::StatusOr<Table> named = TableByName(data_, analysis_, "groups");
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_EQ(RenderCsv(*named), RenderCsv(t));
  const std::string csv = RenderCsv(t);
  // (The train mean is 405 up to the running mean's rounding, checked above.)
  EXPECT_NE(csv.find(",450,500,500,3,1,uplink,5g-rpi4-3,2\r\n"), std::string::npos) << csv;
  EXPECT_NE(csv.find("\r\nethernet,rpi5,10,30,5,200,200,10,10,0,0,,,\r\n"), std::string::npos) << csv;
}

TEST_F(FleetReportTest, StragglersTableShowsTheTopNAndSaysHowToSeeAll) {
  const Table top = StragglersTable(data_, analysis_, 5);
  ASSERT_EQ(top.rows.size(), 5u);
  EXPECT_NE(top.title.find("the 5 clients most often the straggler, of 60: fl-report --top 0 lists all"),
            std::string::npos)
      << top.title;
  EXPECT_EQ(top.rows[0][0].text, "5g-rpi4-3");
  EXPECT_EQ(top.rows[1][0].text, "5g-rpi4-7");
  EXPECT_EQ(StragglersTable(data_, analysis_).rows.size(), kDefaultTopStragglers);
  const Table all = StragglersTable(data_, analysis_, 0);
  EXPECT_EQ(all.rows.size(), 60u);
  EXPECT_EQ(all.title.find("--top 0"), std::string::npos);
  EXPECT_EQ(AllTables(data_, analysis_, 3)[3].rows.size(), 3u);  // rounds, links, groups, stragglers, ...
}

TEST_F(FleetReportTest, TimelineHasARowPerGroupAboveTheClientRowLimit) {
  ASSERT_GT(data_.clients.size(), kTimelineMaxClientRows);
  const std::string svg = TimelineSvg(data_, analysis_);
  EXPECT_NE(svg.find("(60 clients: a row per link kind / device class)"), std::string::npos);
  const std::string rows = Group(svg, "rows");
  EXPECT_EQ(Count(rows, "<text"), 7u) << rows;  // the server and 6 groups
  EXPECT_NE(rows.find("5g / rpi4 (10)"), std::string::npos);
  EXPECT_EQ(rows.find("5g-rpi4-3"), std::string::npos);
  // Every measured phase of every client is still drawn, translucent: 3 rounds x 60 clients x 3 phases.
  EXPECT_EQ(Count(Group(svg, "phases"), "fill-opacity=\"0.25\""), 3u * 60 * 3);
  // The stragglers' ticks sit in their group's row and name the client.
  EXPECT_EQ(Count(Group(svg, "stragglers"), "straggler: 5g-rpi4-3, dominant phase uplink"), 2u);
  // A window of one round with the same 60 clients is still grouped.
  EXPECT_NE(TimelineSvg(data_, analysis_, {.first_round = 3, .last_round = 3}).find("a row per link kind"),
            std::string::npos);
}

}  // namespace
}  // namespace fl::report
