// The fl-report command line, run as a process: clear errors with the right exit codes, and every output
// format written where asked with the figures of the records.
#include <filesystem>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "fl/testing/scratch_dir.h"
#include "records_fixture.h"
#include "run_tool.h"

namespace fl::report {
namespace {

using testing::ReadAll;
using testing::RecordsFixture;
using testing::RunTool;
using testing::ToolResult;

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    RecordsFixture f(db_);
    f.Experiment("older", 100, "first");
    f.Experiment("empty", 200, "nothing yet");
    f.Experiment("main", 300, "main run");
    f.Client("main", "eth", "ethernet");
    f.Client("main", "wifi", "wifi");
    f.Client("main", "g5", "5g");
    f.Client("older", "eth", "ethernet");
    f.Round("older", 1, 100, 10);
    f.ClientRound("older", 1, "eth", 100, {.uplink_ms = 1});
    for (int r = 1; r <= 4; ++r) {
      f.Round("main", r, 1000 * r, 800);
      f.ClientRound("main", r, "eth", 1000 * r, {.downlink_ms = 2, .train_ms = 100, .uplink_ms = 15});
      f.ClientRound("main", r, "wifi", 1000 * r, {.downlink_ms = 5, .train_ms = 100, .uplink_ms = 28});
      f.ClientRound("main", r, "g5", 1000 * r, {.downlink_ms = 9, .train_ms = 100, .uplink_ms = 499.5});
    }
    f.ClientEvent("main", "wifi", fl::instrumentation::ClientEventKind::kSessionClosed, -1, "",
                  "more than 100 messages/s", 4500);
    f.SecurityEvent("main", fl::instrumentation::SecurityRefusal::kSessionLimit, "ipv4:10.0.0.7:5000", "g5", "g5",
                    "too many sessions for this certificate", 4600);
    f.Close();
  }

  ToolResult Report(std::vector<std::string> args) {
    args.insert(args.begin(), FL_REPORT_BIN);
    return RunTool(args, dir_);
  }

  fl::testing::ScratchDir dir_{"report_cli"};
  const std::string db_ = dir_.File("records.db");
};

TEST_F(CliTest, MissingDatabaseFileExitsTwoNamingIt) {
  const ToolResult r = Report({dir_.File("absent.db")});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("fl-report: records database " + dir_.File("absent.db") + " does not exist"),
            std::string::npos)
      << r.output;
}

TEST_F(CliTest, NotARecordsDatabaseExitsTwo) {
  std::ofstream(dir_.File("x.db")) << "hello";
  const ToolResult r = Report({dir_.File("x.db")});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("is not a records database"), std::string::npos) << r.output;
}

TEST_F(CliTest, UnknownExperimentListsTheExistingOnes) {
  const ToolResult r = Report({db_, "--experiment", "mian"});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("experiment 'mian' is not in"), std::string::npos) << r.output;
  for (const char* id : {"older", "empty", "main"}) EXPECT_NE(r.output.find(id), std::string::npos) << id;
}

TEST_F(CliTest, EmptyExperimentExitsOneSayingSo) {
  const ToolResult r = Report({db_, "--experiment", "empty"});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("experiment 'empty'"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("has no rounds recorded"), std::string::npos) << r.output;
}

TEST_F(CliTest, UsageErrorsExitTwo) {
  const ToolResult format = Report({db_, "--format", "pdf"});
  EXPECT_EQ(format.code, 2);
  EXPECT_NE(format.output.find("pdf"), std::string::npos) << format.output;
  EXPECT_EQ(Report({db_, "--table", "clients"}).code, 2);
  const ToolResult csv = Report({db_, "--format", "csv"});
  EXPECT_EQ(csv.code, 2);
  EXPECT_NE(csv.output.find("give --out DIR, or --table NAME"), std::string::npos) << csv.output;
  const ToolResult rounds = Report({db_, "--format", "svg", "--plot", "timeline", "--rounds", "x:3"});
  EXPECT_EQ(rounds.code, 2);
  EXPECT_NE(rounds.output.find("--rounds 'x:3'"), std::string::npos) << rounds.output;
}

TEST_F(CliTest, TextDefaultsToTheLatestExperiment) {
  const ToolResult r = Report({db_});
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("experiment main (main run)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("4 committed rounds"), std::string::npos) << r.output;
  // The headline ratios, as computed from the records: 499.5 / 15 = 33.30, 499.5 / 28 = 17.84.
  EXPECT_NE(r.output.find("33.30x"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("17.84x"), std::string::npos) << r.output;
  const ToolResult only = Report({db_, "--table", "stragglers", "--experiment", "main"});
  ASSERT_EQ(only.code, 0);
  EXPECT_NE(only.output.find("Stragglers (4 committed rounds with a straggler)"), std::string::npos) << only.output;
  EXPECT_EQ(only.output.find("Link kinds"), std::string::npos);
}

TEST_F(CliTest, ListShowsEveryExperiment) {
  const ToolResult r = Report({db_, "--list"});
  ASSERT_EQ(r.code, 0);
  EXPECT_LT(r.output.find("older\tfirst"), r.output.find("main\tmain run"));
}

TEST_F(CliTest, CsvWritesOneFilePerTable) {
  const std::string out = dir_.File("csv");
  ASSERT_EQ(Report({db_, "--format", "csv", "--out", out}).code, 0);
  for (const char* t : {"rounds", "links", "stragglers", "client_events", "security_events"}) {
    EXPECT_TRUE(std::filesystem::exists(out + "/" + t + ".csv")) << t;
  }
  const std::string rounds = ReadAll(out + "/rounds.csv");
  size_t lines = 0;
  for (char c : rounds) lines += c == '\n';
  EXPECT_EQ(lines, 1u + 4u);  // header + 4 rounds
  const ToolResult one = Report({db_, "--format", "csv", "--table", "links"});
  ASSERT_EQ(one.code, 0);
  EXPECT_EQ(one.output.rfind("link_kind,clients,", 0), 0u) << one.output;
  EXPECT_NE(one.output.find("\n5g,1,4,"), std::string::npos) << one.output;
  const ToolResult events = Report({db_, "--format", "csv", "--table", "client_events"});
  ASSERT_EQ(events.code, 0);
  EXPECT_NE(events.output.find("\n4500,wifi,wifi,session_closed,,,more than 100 messages/s\r\n"), std::string::npos)
      << events.output;
  const ToolResult security = Report({db_, "--format", "csv", "--table", "security_events"});
  ASSERT_EQ(security.code, 0) << security.output;
  EXPECT_EQ(security.output,
            "at_unix_ms,reason,peer,identity,claimed,detail\r\n"
            "4600,session_limit,ipv4:10.0.0.7:5000,g5,g5,too many sessions for this certificate\r\n");
}

TEST_F(CliTest, JsonFileParsesWithTheFiguresOfTheRecords) {
  const std::string out = dir_.File("report.json");
  ASSERT_EQ(Report({db_, "--format", "json", "--out", out}).code, 0);
  const nlohmann::json doc = nlohmann::json::parse(ReadAll(out));
  EXPECT_EQ(doc["experiment"]["id"], "main");
  RecordsFixture sql(db_);
  EXPECT_EQ(doc["experiment"]["committed_rounds"].get<double>(),
            sql.QueryDouble("SELECT count(*) FROM rounds WHERE experiment_id = 'main' AND status = 'committed'"));
  const nlohmann::json& g5 = doc["tables"]["links"][2];
  EXPECT_EQ(g5["link_kind"], "5g");
  EXPECT_DOUBLE_EQ(g5["uplink_vs_ethernet"].get<double>(), 499.5 / 15);
  EXPECT_DOUBLE_EQ(g5["uplink_share"].get<double>(), 499.5 / 800);
}

TEST_F(CliTest, SvgWritesEveryPlotOrOneToStdout) {
  const std::string out = dir_.File("plots");
  ASSERT_EQ(Report({db_, "--format", "svg", "--out", out}).code, 0);
  for (const char* p : {"timeline", "phase_shares", "round_time"}) {
    const std::string svg = ReadAll(out + "/" + p + ".svg");
    EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u) << p;
    EXPECT_NE(svg.find("<rect"), std::string::npos) << p;
  }
  // The learning curve beside them (this fixture's rounds have no evaluation: it says so).
  EXPECT_NE(ReadAll(out + "/metric.svg").find("id=\"plot-metric\""), std::string::npos);
  EXPECT_NE(Report({db_, "--format", "svg", "--plot", "metric"}).output.find("no evaluated rounds"), std::string::npos);
  const ToolResult one = Report({db_, "--format", "svg", "--plot", "timeline", "--rounds", "2:3"});
  ASSERT_EQ(one.code, 0);
  EXPECT_NE(one.output.find("g5 round 2 uplink"), std::string::npos);
  EXPECT_NE(one.output.find("g5 round 3 uplink"), std::string::npos);
  EXPECT_EQ(one.output.find("g5 round 4 uplink"), std::string::npos);
}

}  // namespace
}  // namespace fl::report
