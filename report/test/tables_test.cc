// Text, CSV and JSON renderings of the report's tables: the same figures in every format, full precision
// where machines read them, NULL shown as such.
#include "fl/report/tables.h"

#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "fl/report/analysis.h"
#include "fl/report/html_report.h"
#include "fl/testing/scratch_dir.h"
#include "records_fixture.h"

namespace fl::report {
namespace {

using testing::RecordsFixture;
namespace ins = fl::instrumentation;

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    out.push_back(line);
  }
  return out;
}

class TablesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    RecordsFixture f(dir_.File("r.db"));
    f.Experiment("e", 1, "tables, \"quoted\"");
    f.Client("e", "eth-1", "ethernet");
    f.Client("e", "g5, the slow one", "5g");  // a comma in a name: CSV must quote it
    f.Round("e", 1, 1000, 300.25);
    f.Round("e", 2, 2000, 400.5);
    for (int r = 1; r <= 2; ++r) {
      f.ClientRound("e", r, "eth-1", 1000 * r, {.downlink_ms = 2, .train_ms = 100, .uplink_ms = 3.0});
      f.ClientRound("e", r, "g5, the slow one", 1000 * r, {.downlink_ms = 20, .train_ms = 100, .uplink_ms = 100.0 / 3});
    }
    f.ClientEvent("e", "g5, the slow one", ins::ClientEventKind::kUploadRevoked, 2, "t-2",
                  "upload revoked: 12 bytes/s, under --min-upload-rate", 2500);
    f.ClientEvent("e", "eth-1", ins::ClientEventKind::kReportRefused, -1, "", "clock pong refused", 1500);
    f.SecurityEvent("e", ins::SecurityRefusal::kNameMismatch, "ipv4:127.0.0.1:50514", "alice", "bob",
                    "client_name 'bob' is not the certificate's 'alice'", 1700);
    f.SecurityEvent("e", ins::SecurityRefusal::kBadToken, "ipv4:10.0.0.9:4000", "", "", "unknown client id", 1600);
    f.Close();
    auto data = LoadExperiment(dir_.File("r.db"));
    ASSERT_TRUE(data.ok()) << data.status();
    data_ = *std::move(data);
    analysis_ = Analyze(data_);
  }

  fl::testing::ScratchDir dir_{"report_tables"};
  ExperimentData data_;
  Analysis analysis_;
};

TEST_F(TablesTest, FormatCellUsesDecimalsScaleAndSuffix) {
  EXPECT_EQ(FormatCell(Column("x", 2, "x"), Cell(100.0 / 3)), "33.33x");
  EXPECT_EQ(FormatCell(Column("share", 1, "%", 100), Cell(0.2345)), "23.4%");
  EXPECT_EQ(FormatCell(Column("n", 0), Cell(int64_t{42})), "42");
  EXPECT_EQ(FormatCell(Column("n", 0), Cell()), "-");
  EXPECT_EQ(FormatCell(Column("s", 0), Cell("wifi")), "wifi");
}

TEST_F(TablesTest, TextColumnsAreAligned) {
  const std::string text = RenderText(LinksTable(data_, analysis_));
  const std::vector<std::string> lines = Lines(text);
  ASSERT_EQ(lines.size(), 5u) << text;  // title, header, rule, ethernet, 5g
  EXPECT_EQ(lines[0], LinksTable(data_, analysis_).title);
  // Numbers are right-aligned: every row's uplink_vs_ethernet ends where the header's column name ends.
  const size_t end = lines[1].find("uplink_vs_ethernet") + std::string("uplink_vs_ethernet").size();
  EXPECT_EQ(lines[3].substr(end - 5, 5), "1.00x") << text;
  EXPECT_EQ(lines[4].substr(end - 6, 6), "11.11x") << text;
}

TEST_F(TablesTest, CsvHasFullPrecisionQuotingAndEmptyNulls) {
  const std::string csv = RenderCsv(LinksTable(data_, analysis_));
  const std::vector<std::string> lines = Lines(csv);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0].substr(0, 30), "link_kind,clients,client_round");
  // 5g's uplink vs ethernet: (100/3) / 3, printed so that it reads back to the same double.
  const Table t = LinksTable(data_, analysis_);
  const int col = t.ColumnIndex("uplink_vs_ethernet");
  ASSERT_GE(col, 0);
  std::vector<std::string> fields;
  std::stringstream row(lines[2]);
  for (std::string field; std::getline(row, field, ',');) fields.push_back(field);
  EXPECT_EQ(std::stod(fields[static_cast<size_t>(col)]), (100.0 / 3) / 3.0);
  // No wifi clients: the wifi ratio is empty, not 0.
  EXPECT_EQ(fields[static_cast<size_t>(t.ColumnIndex("uplink_vs_wifi"))], "");
  const std::string stragglers = RenderCsv(StragglersTable(data_, analysis_));
  EXPECT_NE(stragglers.find("\"g5, the slow one\",5g"), std::string::npos) << stragglers;
}

// A buffered (FedBuff) experiment's rows are aggregation steps: the table says so (experiments.aggregation, v9).
TEST_F(TablesTest, BufferedExperimentsLabelRowsAsAggregationSteps) {
  EXPECT_EQ(RoundsTable(data_, analysis_).title, "Rounds (classification)");
  EXPECT_EQ(RoundsTable(data_, analysis_).ColumnIndex("round"), 0);
  data_.experiment.aggregation = "buffered";
  const Table steps = RoundsTable(data_, analysis_);
  EXPECT_EQ(steps.title, "Aggregation steps (buffered, classification)");
  EXPECT_EQ(steps.ColumnIndex("step"), 0);
  EXPECT_EQ(steps.ColumnIndex("round"), -1);
}

TEST_F(TablesTest, JsonHasEveryTableWithTheSameFigures) {
  const std::string text = RenderJson(data_, analysis_, AllTables(data_, analysis_));
  const nlohmann::json doc = nlohmann::json::parse(text);
  EXPECT_EQ(doc["experiment"]["id"], "e");
  EXPECT_EQ(doc["experiment"]["name"], "tables, \"quoted\"");
  EXPECT_EQ(doc["experiment"]["committed_rounds"], 2);
  ASSERT_EQ(doc["tables"]["rounds"].size(), 2u);
  EXPECT_EQ(doc["tables"]["rounds"][1]["round_ms"].get<double>(), 400.5);
  EXPECT_EQ(doc["tables"]["rounds"][0]["straggler"], "g5, the slow one");
  EXPECT_EQ(doc["tables"]["rounds"][0]["straggler_phase"], "uplink");
  EXPECT_TRUE(doc["tables"]["rounds"][0]["eval_accuracy"].is_null());
  ASSERT_EQ(doc["tables"]["links"].size(), 2u);
  EXPECT_EQ(doc["tables"]["links"][1]["link_kind"], "5g");
  EXPECT_EQ(doc["tables"]["links"][1]["uplink_vs_ethernet"].get<double>(), (100.0 / 3) / 3.0);
  EXPECT_EQ(doc["tables"]["links"][1]["uplink_share"].get<double>(), (2 * 100.0 / 3) / (300.25 + 400.5));
  EXPECT_EQ(doc["tables"]["stragglers"][0]["times_straggler"], 2);
  EXPECT_EQ(doc["tables"]["stragglers"][0]["share"].get<double>(), 1.0);
}

TEST_F(TablesTest, TableByNameRejectsUnknownNames) {
  auto t = TableByName(data_, analysis_, "clients");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(std::string(fl::ToStd(t.status().message()))
                .find("the tables are rounds, links, groups, stragglers, client_events, security_events, secagg"),
            std::string::npos)
      << t.status();
  for (std::string_view name : kTableNames) {
    auto named = TableByName(data_, analysis_, name);
    ASSERT_TRUE(named.ok()) << named.status();
    EXPECT_EQ(named->name, name);
  }
  // AllTables: every table once, in kTableNames order; secagg only for a run with secure aggregation (not this one).
  const std::vector<Table> all = AllTables(data_, analysis_);
  ASSERT_EQ(all.size(), std::size(kTableNames) - 1);
  for (size_t i = 0; i < all.size(); ++i) EXPECT_EQ(all[i].name, kTableNames[i]);
  EXPECT_TRUE(TableByName(data_, analysis_, "secagg")->rows.empty());
}

// Client events (records v7), by time, with the client's label and link kind; no round or task shows as empty.
TEST_F(TablesTest, ClientEventsTableListsWhatTheServerRefusedInEveryFormat) {
  const Table t = ClientEventsTable(data_);
  ASSERT_EQ(t.rows.size(), 2u);
  const std::vector<std::string> lines = Lines(RenderCsv(t));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], "at_unix_ms,client,link_kind,kind,round,task_id,reason");
  EXPECT_EQ(lines[1], "1500,eth-1,ethernet,report_refused,,,clock pong refused");
  EXPECT_EQ(lines[2],
            "2500,\"g5, the slow one\",5g,upload_revoked,2,t-2,"
            "\"upload revoked: 12 bytes/s, under --min-upload-rate\"");
  EXPECT_NE(RenderText(t).find("report_refused"), std::string::npos);
  const nlohmann::json doc = nlohmann::json::parse(RenderJson(data_, analysis_, AllTables(data_, analysis_)));
  const nlohmann::json& events = doc["tables"]["client_events"];
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[1]["kind"], "upload_revoked");
  EXPECT_EQ(events[1]["round"], 2);
  EXPECT_EQ(events[1]["task_id"], "t-2");
  EXPECT_TRUE(events[0]["round"].is_null());
  EXPECT_TRUE(events[0]["task_id"].is_null());
  EXPECT_TRUE(doc["definitions"].contains("client_events"));
  // The HTML report shows the section only when there are events.
  EXPECT_NE(HtmlReport(data_, analysis_, {}).find("id=\"client-events\""), std::string::npos);
  ExperimentData quiet = data_;
  quiet.client_events.clear();
  EXPECT_EQ(HtmlReport(quiet, Analyze(quiet), {}).find("id=\"client-events\""), std::string::npos);
}

// Security events (records v8), by time: the reason, the peer, the certificate's name and the claimed name (empty
// when none), and what the peer was told.
TEST_F(TablesTest, SecurityEventsTableListsWhatTheServerRefusedInEveryFormat) {
  const Table t = SecurityEventsTable(data_);
  EXPECT_EQ(t.title, "Security events (2: calls fl-server refused on the secure channel, and why)");
  ASSERT_EQ(t.rows.size(), 2u);
  const std::vector<std::string> lines = Lines(RenderCsv(t));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], "at_unix_ms,reason,peer,identity,claimed,detail");
  EXPECT_EQ(lines[1], "1600,bad_token,ipv4:10.0.0.9:4000,,,unknown client id");
  EXPECT_EQ(lines[2],
            "1700,name_mismatch,ipv4:127.0.0.1:50514,alice,bob,client_name 'bob' is not the certificate's 'alice'");
  const std::string text = RenderText(t);
  EXPECT_NE(text.find("name_mismatch"), std::string::npos) << text;
  EXPECT_NE(text.find("ipv4:10.0.0.9:4000"), std::string::npos) << text;
  const nlohmann::json doc = nlohmann::json::parse(RenderJson(data_, analysis_, AllTables(data_, analysis_)));
  const nlohmann::json& events = doc["tables"]["security_events"];
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0]["reason"], "bad_token");
  EXPECT_TRUE(events[0]["identity"].is_null());
  EXPECT_TRUE(events[0]["claimed"].is_null());
  EXPECT_EQ(events[1]["reason"], "name_mismatch");
  EXPECT_EQ(events[1]["identity"], "alice");
  EXPECT_EQ(events[1]["claimed"], "bob");
  EXPECT_EQ(events[1]["at_unix_ms"], 1700);
  EXPECT_TRUE(doc["definitions"].contains("security_events"));
  // The HTML report shows the section only when there are events, after the client events.
  const std::string html = HtmlReport(data_, analysis_, {});
  ASSERT_NE(html.find("id=\"security-events\""), std::string::npos);
  EXPECT_LT(html.find("id=\"client-events\""), html.find("id=\"security-events\""));
  EXPECT_NE(html.find("client_name &#39;bob&#39;"), std::string::npos);
  ExperimentData quiet = data_;
  quiet.security_events.clear();
  EXPECT_EQ(HtmlReport(quiet, Analyze(quiet), {}).find("id=\"security-events\""), std::string::npos);
}

}  // namespace
}  // namespace fl::report

namespace fl::report {
namespace {

// Schema v9's outcomes: over-commitment's cancelled tasks and deadline folding's folded updates are counted per
// round attempt in the rounds table (they have no column of `rounds`), and never count as accepted.
TEST(RoundsTableTest, CountsCancelledAndFoldedRowsOfEachRound) {
  fl::testing::ScratchDir dir("report_v9_outcomes");
  testing::RecordsFixture f(dir.File("r.db"));
  f.Experiment("e", 1);
  for (const char* c : {"a", "b", "c", "d"}) f.Client("e", c, "wifi");
  f.Round("e", 1, 1000, 100);
  f.ClientRound("e", 1, "a", 1000, {.train_ms = 10, .uplink_ms = 1});
  f.ClientRound("e", 1, "b", 1000, {.train_ms = 10}, ins::ClientOutcome::kCancelled);
  f.ClientRound("e", 1, "c", 1000, {.train_ms = 10}, ins::ClientOutcome::kCancelled);
  f.ClientRound("e", 1, "d", 1000, {.train_ms = 90, .uplink_ms = 1}, ins::ClientOutcome::kFolded);
  f.Round("e", 2, 2000, 100);
  f.ClientRound("e", 2, "a", 2000, {.train_ms = 10, .uplink_ms = 1});
  f.Close();
  auto data = LoadExperiment(dir.File("r.db"));
  ASSERT_TRUE(data.ok()) << data.status();
  const Analysis analysis = Analyze(*data);
  const Table t = RoundsTable(*data, analysis);
  const int cancelled = t.ColumnIndex("cancelled"), folded = t.ColumnIndex("folded");
  ASSERT_GE(cancelled, 0);
  ASSERT_GE(folded, 0);
  ASSERT_EQ(t.rows.size(), 2u);
  EXPECT_EQ(t.rows[0][static_cast<size_t>(cancelled)].int_value, 2);
  EXPECT_EQ(t.rows[0][static_cast<size_t>(folded)].int_value, 1);
  EXPECT_EQ(t.rows[1][static_cast<size_t>(cancelled)].int_value, 0);
  EXPECT_EQ(t.rows[0][static_cast<size_t>(t.ColumnIndex("straggler"))].text, "a");  // folded d is not accepted
}

// Secure aggregation (records v11), from rows stored through the real RecordStore: per round attempt and stage its
// clients' outcomes, the median and maximum time of the clients that answered, and the bytes; the rounds table gains
// the survivors and the dropped, and the HTML report a section; a run without it has neither.
TEST(SecAggTableTest, SummarizesEachStageOfEachRoundFromStoredRows) {
  fl::testing::ScratchDir dir("report_secagg");
  testing::RecordsFixture f(dir.File("r.db"));
  f.Experiment("e", 1);
  for (const char* c : {"a", "b", "c"}) f.Client("e", c, "wifi");
  f.SecureRound("e", 1, 1000, 500, 2, 1);
  using S = ins::SecAggStage;
  using O = ins::SecAggStageOutcome;
  // Written as the engine does, client by client; the table orders stages as they run.
  for (const char* c : {"a", "b", "c"}) {
    f.SecAggStage("e", 1, c, S::kAdvertiseKeys, O::kOk, 10, 100, 200);
    f.SecAggStage("e", 1, c, S::kShareKeys, O::kOk, std::string(c) == "c" ? 40 : 20, 300, 600);
  }
  f.SecAggStage("e", 1, "a", S::kMaskedUpload, O::kOk, 200, 0, 4000);
  f.SecAggStage("e", 1, "b", S::kMaskedUpload, O::kOk, 300, 0, 4000);
  f.SecAggStage("e", 1, "c", S::kMaskedUpload, O::kDropped, std::nullopt, 0, 0, "no masked upload by the deadline");
  f.SecAggStage("e", 1, "a", S::kUnmask, O::kOk, 5, 50, 70);
  f.SecAggStage("e", 1, "b", S::kUnmask, O::kRefused, 7, 50, 0, "share of an unknown client");
  f.SecurityEvent("e", ins::SecurityRefusal::kSecAgg, "ipv4:10.0.0.2:4000", "b", "b", "share of an unknown client",
                  1400);
  f.Close();
  auto data = LoadExperiment(dir.File("r.db"));
  ASSERT_TRUE(data.ok()) << data.status();
  ASSERT_EQ(data->secagg_stages.size(), 11u);
  EXPECT_EQ(data->secagg_stages[0].stage, "advertise_keys");
  EXPECT_EQ(data->secagg_stages[3].stage, "unmask");  // a's four stages first, in the order they run
  ASSERT_EQ(data->security_events.size(), 1u);
  EXPECT_EQ(data->security_events[0].reason, "secagg");
  const Analysis analysis = Analyze(*data);

  const Table t = SecAggTable(*data);
  ASSERT_EQ(t.rows.size(), 4u);
  auto cell = [&](size_t row, const char* column) {
    const int i = t.ColumnIndex(column);
    EXPECT_GE(i, 0) << column;
    return t.rows[row][static_cast<size_t>(i)];
  };
  const char* stages[] = {"advertise_keys", "share_keys", "masked_upload", "unmask"};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(cell(i, "round").int_value, 1);
    EXPECT_EQ(cell(i, "stage").text, stages[i]);
  }
  EXPECT_EQ(cell(0, "clients").int_value, 3);
  EXPECT_EQ(cell(0, "ok").int_value, 3);
  EXPECT_EQ(cell(0, "bytes_down").int_value, 300);
  EXPECT_EQ(cell(0, "bytes_up").int_value, 600);
  EXPECT_EQ(cell(1, "duration_median_ms").real_value, 20);
  EXPECT_EQ(cell(1, "duration_max_ms").real_value, 40);
  // masked_upload: c dropped without an answer, so the median is over a and b.
  EXPECT_EQ(cell(2, "ok").int_value, 2);
  EXPECT_EQ(cell(2, "dropped").int_value, 1);
  EXPECT_EQ(cell(2, "refused").int_value, 0);
  EXPECT_EQ(cell(2, "duration_median_ms").real_value, 250);
  EXPECT_EQ(cell(2, "duration_max_ms").real_value, 300);
  EXPECT_EQ(cell(2, "bytes_up").int_value, 8000);
  EXPECT_EQ(cell(3, "refused").int_value, 1);
  EXPECT_EQ(cell(3, "clients").int_value, 2);

  const Table rounds = RoundsTable(*data, analysis);
  ASSERT_GE(rounds.ColumnIndex("secagg_survivors"), 0);
  EXPECT_EQ(rounds.rows[0][static_cast<size_t>(rounds.ColumnIndex("secagg_survivors"))].int_value, 2);
  EXPECT_EQ(rounds.rows[0][static_cast<size_t>(rounds.ColumnIndex("secagg_dropped"))].int_value, 1);
  const std::vector<Table> all = AllTables(*data, analysis);
  ASSERT_EQ(all.size(), std::size(kTableNames));
  EXPECT_EQ(all.back().name, "secagg");
  const nlohmann::json doc = nlohmann::json::parse(RenderJson(*data, analysis, all));
  EXPECT_EQ(doc["tables"]["secagg"][2]["duration_median_ms"].get<double>(), 250);
  EXPECT_TRUE(doc["definitions"].contains("secagg"));
  EXPECT_NE(HtmlReport(*data, analysis, {}).find("id=\"secagg\""), std::string::npos);

  ExperimentData plain = *data;
  plain.secagg_stages.clear();
  for (RoundAttempt& r : plain.rounds) r.secagg_survivors = r.secagg_dropped = std::nullopt;
  const Analysis plain_analysis = Analyze(plain);
  EXPECT_EQ(RoundsTable(plain, plain_analysis).ColumnIndex("secagg_survivors"), -1);
  EXPECT_EQ(HtmlReport(plain, plain_analysis, {}).find("id=\"secagg\""), std::string::npos);
}

}  // namespace
}  // namespace fl::report
