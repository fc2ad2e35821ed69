// fl-report --compare: experiments written by the real RecordStore compared side by side; time to the target
// accuracy exact for known rows, "not reached", bytes moved over every outcome, buffered experiments (schema v9
// experiments.aggregation) and the command line's outputs.
#include "fl/report/compare.h"

#include <filesystem>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "fl/instrumentation/schema.h"
#include "fl/instrumentation/sqlite.h"
#include "fl/testing/scratch_dir.h"
#include "records_fixture.h"
#include "run_tool.h"

namespace fl::report {
namespace {

using testing::ReadAll;
using testing::RecordsFixture;
using testing::RunTool;
namespace ins = fl::instrumentation;

class CompareTest : public ::testing::Test {
 protected:
  CompareTest() : dir_("fl_report_compare") {}

  // Three rounds starting at 1000, 3000, 5000 ms, each 1500 ms long (committed at 2500, 4500, 6500 ms), two
  // clients a round; test accuracy `acc[i]` after round i+1.
  std::string Sync(const std::string& file, const std::string& name, const std::vector<double>& acc) {
    const std::string db = dir_.File(file);
    RecordsFixture f(db);
    f.Experiment("e", 500, name);
    f.Client("e", "a", "ethernet");
    f.Client("e", "b", "5g");
    for (int r = 1; r <= static_cast<int>(acc.size()); ++r) {
      const int64_t start = 1000 + 2000 * (r - 1);
      f.Round("e", r, start, 1500);
      f.ClientRound("e", r, "a", start,
                    {.train_ms = 100, .uplink_ms = 10, .downlink_bytes = 1000, .uplink_bytes = 400});
      f.ClientRound("e", r, "b", start,
                    {.train_ms = 100, .uplink_ms = 900, .downlink_bytes = 1000, .uplink_bytes = 100},
                    r == 2 ? ins::ClientOutcome::kLate : ins::ClientOutcome::kOk);
      f.RoundEvaluation("e", r, 0.5, acc[r - 1], std::nullopt, std::nullopt);
    }
    f.Close();
    return db;
  }

  fl::testing::ScratchDir dir_;
};

TEST_F(CompareTest, TimeToTargetIsTheCommitOfTheFirstRoundAtOrAboveItSinceTheFirstDispatch) {
  absl::StatusOr<ExperimentData> data = LoadExperiment(Sync("a.db", "sync", {0.70, 0.85, 0.88}));
  ASSERT_TRUE(data.ok()) << data.status();
  const ComparedExperiment e = Summarize(*data, 0.85);
  EXPECT_EQ(e.label, "sync");
  EXPECT_EQ(e.aggregation, "synchronous");
  ASSERT_EQ(e.accuracy.size(), 3u);
  EXPECT_DOUBLE_EQ(e.accuracy[0].first, 1.5);  // committed at 2500 ms, first dispatch at 1000 ms
  EXPECT_DOUBLE_EQ(e.accuracy[1].first, 3.5);
  EXPECT_DOUBLE_EQ(e.accuracy[2].first, 5.5);
  ASSERT_TRUE(e.time_to_target_s.has_value());
  EXPECT_DOUBLE_EQ(*e.time_to_target_s, 3.5) << "0.85 counts as reaching 0.85";
  EXPECT_DOUBLE_EQ(*e.final_accuracy, 0.88);
  // Every row's bytes, the late update's included: 3 rounds x (1000 + 400 + 1000 + 100).
  EXPECT_EQ(e.uplink_bytes, 3 * 500);
  EXPECT_EQ(e.downlink_bytes, 3 * 2000);
  EXPECT_EQ(e.committed, 3);
  EXPECT_DOUBLE_EQ(*e.wall_s, 5.5);
  EXPECT_FALSE(Summarize(*data, 0.9).time_to_target_s.has_value());
}

TEST_F(CompareTest, TheTableSaysNotReachedAndBufferedExperimentsCountSteps) {
  const std::string a = Sync("a.db", "sync", {0.70, 0.80, 0.86});
  const std::string b = Sync("b.db", "fedbuff", {0.60, 0.70, 0.75, 0.80});
  RecordsFixture(b).Exec("UPDATE experiments SET aggregation = 'buffered'");
  std::vector<ComparedExperiment> all;
  for (const std::string& db : {a, b}) all.push_back(Summarize(*LoadExperiment(db), 0.85));
  const Table t = CompareTable(all, 0.85);
  ASSERT_EQ(t.rows.size(), 2u);
  auto cell = [&](size_t row, std::string_view col) {
    return FormatCell(t.columns[t.ColumnIndex(col)], t.rows[row][t.ColumnIndex(col)]);
  };
  EXPECT_EQ(cell(0, "experiment"), "sync");
  EXPECT_EQ(cell(0, "aggregation"), "synchronous");
  EXPECT_EQ(cell(0, "time_to_target_s"), "5.5");
  EXPECT_EQ(cell(0, "final_accuracy"), "0.8600");
  EXPECT_EQ(cell(0, "bytes_moved"), "7500");
  EXPECT_EQ(cell(1, "aggregation"), "buffered");
  EXPECT_EQ(cell(1, "time_to_target_s"), "not reached");
  EXPECT_EQ(cell(1, "rounds_or_steps"), "4");
  const std::string md = RenderMarkdown(t);
  EXPECT_NE(md.find("| experiment | aggregation | final_accuracy | time_to_target_s |"), std::string::npos) << md;
  EXPECT_NE(md.find("| fedbuff | buffered | 0.8000 | not reached | 10000 |"), std::string::npos) << md;
  const std::string svg = CompareSvg(all, 0.85);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("sync (synchronous): 5.5 s to target"), std::string::npos);
  EXPECT_NE(svg.find("fedbuff (buffered): target not reached"), std::string::npos);
  EXPECT_NE(svg.find("class=\"target\""), std::string::npos);
}

// A database from before schema v9 (no experiments.aggregation; migrated to v8 only, rows inserted with v8's
// columns) compares as a synchronous experiment.
TEST_F(CompareTest, ADatabaseFromBeforeV9ComparesAsSynchronous) {
  const std::string path = dir_.File("v8.db");
  {
    auto db = ins::sqlite::Database::Open(path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
    ASSERT_TRUE(db.ok());
    ASSERT_GE(ins::SchemaMigrations().size(), 8u);
    ASSERT_TRUE(ins::MigrateSchema(*db, ins::SchemaMigrations().first(8)).ok());
    ASSERT_TRUE(db->Exec(R"sql(
      INSERT INTO experiments (id, name, started_unix_ms, software_version) VALUES ('old', 'v8 run', 5, 'x');
      INSERT INTO clients (experiment_id, client_id, link_kind, joined_unix_ms) VALUES ('old', 'a', 'ethernet', 5);
      INSERT INTO rounds (experiment_id, round, attempt, status, started_unix_ms, ended_unix_ms, duration_ms,
                          model_version, eval_accuracy) VALUES
        ('old', 1, 0, 'committed', 1000, 3000, 2000, 1, 0.8), ('old', 2, 0, 'committed', 3000, 5000, 2000, 2, 0.9);
      INSERT INTO client_rounds (experiment_id, round, attempt, client_id, outcome, dispatched_unix_ms, uplink_bytes,
                                 downlink_bytes) VALUES
        ('old', 1, 0, 'a', 'ok', 1000, 10, 20), ('old', 2, 0, 'a', 'ok', 3000, 10, 20);
    )sql")
                    .ok());
  }
  absl::StatusOr<ExperimentData> data = LoadExperiment(path);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->schema_version, 8);
  const ComparedExperiment e = Summarize(*data, 0.85);
  EXPECT_EQ(e.aggregation, "synchronous");
  ASSERT_TRUE(e.time_to_target_s.has_value());
  EXPECT_DOUBLE_EQ(*e.time_to_target_s, 4.0);
  EXPECT_EQ(e.uplink_bytes + e.downlink_bytes, 60);
}

TEST_F(CompareTest, SameNamesAreToldApartByTheirDatabase) {
  std::vector<ComparedExperiment> all;
  for (const char* f : {"x.db", "y.db"}) all.push_back(Summarize(*LoadExperiment(Sync(f, "run", {0.9})), 0.85));
  DisambiguateLabels(all);
  EXPECT_EQ(all[0].label, "run (x.db)");
  EXPECT_EQ(all[1].label, "run (y.db)");
}

TEST_F(CompareTest, TheCommandLineWritesTheTableAndThePlotAndRefusesWhatDoesNotGoWithCompare) {
  const std::string a = Sync("a.db", "sync", {0.70, 0.85, 0.88});
  const std::string b = Sync("b.db", "overcommit", {0.86});
  testing::ToolResult text = RunTool({FL_REPORT_BIN, "--compare", a, b, "--target-accuracy", "0.85"}, dir_);
  ASSERT_EQ(text.code, 0) << text.output;
  EXPECT_NE(text.output.find("### Time to 0.850 test accuracy and bytes moved"), std::string::npos) << text.output;
  EXPECT_NE(text.output.find("| sync | synchronous | 0.8800 | 3.5 |"), std::string::npos) << text.output;
  EXPECT_NE(text.output.find("| overcommit | synchronous | 0.8600 | 1.5 |"), std::string::npos) << text.output;

  const std::string out = dir_.File("cmp");
  std::filesystem::create_directories(out);
  ASSERT_EQ(RunTool({FL_REPORT_BIN, "--compare", a, b, "--out", out}, dir_).code, 0);
  for (const char* f : {"compare.md", "compare.csv", "compare.svg", "compare.html"}) {
    EXPECT_TRUE(std::filesystem::exists(std::filesystem::path(out) / f)) << f;
  }
  EXPECT_NE(ReadAll(out + "/compare.html").find("<table id=\"table-compare\">"), std::string::npos);

  testing::ToolResult json = RunTool({FL_REPORT_BIN, "--compare", a, b, "--format", "json"}, dir_);
  ASSERT_EQ(json.code, 0) << json.output;
  const nlohmann::json doc = nlohmann::json::parse(json.output);
  EXPECT_DOUBLE_EQ(doc["target_accuracy"].get<double>(), 0.85);
  EXPECT_DOUBLE_EQ(doc["experiments"][0]["time_to_target_s"].get<double>(), 3.5);
  EXPECT_EQ(doc["experiments"][0]["accuracy"].size(), 3u);

  testing::ToolResult bad = RunTool({FL_REPORT_BIN, "--compare", a, "--table", "rounds"}, dir_);
  EXPECT_EQ(bad.code, 2) << bad.output;
  EXPECT_NE(bad.output.find("--compare takes databases"), std::string::npos) << bad.output;
  // A records file that is not there is a bad argument at start, like every bad file (docs/input-limits.md).
  testing::ToolResult missing = RunTool({FL_REPORT_BIN, "--compare", a, dir_.File("none.db")}, dir_);
  EXPECT_EQ(missing.code, 2) << missing.output;
  EXPECT_NE(missing.output.find(dir_.File("none.db")), std::string::npos) << missing.output;
  testing::ToolResult none = RunTool({FL_REPORT_BIN}, dir_);
  EXPECT_EQ(none.code, 2) << none.output;
}

}  // namespace
}  // namespace fl::report
