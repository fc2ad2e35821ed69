// The rounds table of a regression and of a next-token experiment: the task's metric under its own header in
// text, CSV, JSON and HTML, with the figures of the records (checked against SQL over the same file), and
// no column of another task's metric.
#include <cmath>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "fl/core/str_cat.h"
#include "fl/instrumentation/schema.h"
#include "fl/instrumentation/sqlite.h"
#include "fl/report/analysis.h"
#include "fl/report/html_report.h"
#include "fl/report/plots.h"
#include "fl/report/tables.h"
#include "fl/testing/scratch_dir.h"
#include "records_fixture.h"
#include "svg_text.h"

namespace fl::report {
namespace {

using testing::RecordsFixture;

// Three committed rounds of two clients; rounds 2 and 3 evaluated with the figures `eval` writes.
template <typename EvalFn>
void WriteExperiment(RecordsFixture& f, const std::string& task, EvalFn eval) {
  f.Experiment("e", 1, task + " run");
  f.Task("e", task);
  f.Client("e", "a", "ethernet");
  f.Client("e", "b", "5g");
  for (int r = 1; r <= 3; ++r) {
    f.Round("e", r, 1000 * r, 300 + r);
    f.ClientRound("e", r, "a", 1000 * r, {.downlink_ms = 2, .train_ms = 100, .uplink_ms = 3.0});
    f.ClientRound("e", r, "b", 1000 * r, {.downlink_ms = 20, .train_ms = 100, .uplink_ms = 30.0});
    if (r >= 2) eval(r);
  }
  f.Close();
}

struct Rendered {
  ExperimentData data;
  std::string text, csv, json_text, html;
  nlohmann::json json;
};

Rendered Render(const std::string& path) {
  Rendered out;
  auto data = LoadExperiment(path);
  EXPECT_TRUE(data.ok()) << data.status();
  if (!data.ok()) return out;
  out.data = *std::move(data);
  const Analysis analysis = Analyze(out.data);
  const Table rounds = RoundsTable(out.data, analysis);
  out.text = RenderText(rounds);
  out.csv = RenderCsv(rounds);
  out.json_text = RenderJson(out.data, analysis, AllTables(out.data, analysis));
  out.json = nlohmann::json::parse(out.json_text);
  out.html = HtmlReport(out.data, analysis, TimelineOptions{});
  return out;
}

std::string FirstLine(const std::string& text, size_t skip = 0) {
  std::istringstream in(text);
  std::string line;
  for (size_t i = 0; i <= skip && std::getline(in, line);) ++i;
  if (!line.empty() && line.back() == '\r') line.pop_back();
  return line;
}

// The rounds table's header cells in the HTML report.
std::string HtmlRoundsHeader(const std::string& html) {
  const size_t at = html.find("<table id=\"table-rounds\">");
  if (at == std::string::npos) return "";
  const size_t end = html.find("</thead>", at);
  return html.substr(at, end - at);
}

// Every JSON round's `column` equals `sql_column` of its rounds row (null where SQL has NULL), and the text
// table shows it with four decimals.
void ExpectColumnEqualsSql(RecordsFixture& sql, const Rendered& r, const std::string& column,
                           const std::string& sql_column) {
  const nlohmann::json& rows = r.json.at("tables").at("rounds");
  ASSERT_EQ(rows.size(), 3u);
  for (const nlohmann::json& row : rows) {
    const std::string where =
        fl::StrCat(" FROM rounds WHERE experiment_id = 'e' AND round = ", row.at("round").get<int>());
    const bool is_null = sql.QueryDouble("SELECT " + sql_column + " IS NULL" + where) == 1;
    ASSERT_TRUE(row.contains(column)) << row.dump();
    if (is_null) {
      EXPECT_TRUE(row.at(column).is_null()) << row.dump();
      continue;
    }
    const double want = sql.QueryDouble("SELECT " + sql_column + where);
    EXPECT_DOUBLE_EQ(row.at(column).get<double>(), want) << column << " round " << row.at("round");
    char shown[64];
    std::snprintf(shown, sizeof(shown), "%.4f", want);
    EXPECT_NE(r.text.find(shown), std::string::npos) << column << " " << shown << "\n" << r.text;
  }
}

TEST(ReportTasksTest, RegressionShowsMaeUnderItsOwnHeader) {
  fl::testing::ScratchDir dir("report_tasks");
  RecordsFixture f(dir.File("reg.db"));
  WriteExperiment(f, "regression", [&](int r) {
    f.RoundEvaluation("e", r, 0.04 / r, std::nullopt, 0.1875 / r, std::nullopt);
    f.TaskEvaluation("e", r, "a", 5, 0.04 / r, std::nullopt, 0.1875 / r);
    f.TaskEvaluation("e", r, "b", 7, std::nullopt, std::nullopt, std::nullopt, "its MAE -1 is not a finite value >= 0");
  });
  const Rendered r = Render(f.path());
  EXPECT_EQ(r.data.experiment.task, "regression");
  EXPECT_EQ(r.json.at("experiment").at("task"), "regression");
  RecordsFixture sql(f.path());
  ExpectColumnEqualsSql(sql, r, "eval_mae", "eval_mae");
  ExpectColumnEqualsSql(sql, r, "eval_loss", "eval_loss");
  for (const nlohmann::json& row : r.json.at("tables").at("rounds")) {
    EXPECT_FALSE(row.contains("eval_accuracy")) << row.dump();
    EXPECT_FALSE(row.contains("eval_perplexity")) << row.dump();
  }
  const std::string text_header = FirstLine(r.text, 1);
  EXPECT_NE(text_header.find("eval_mae"), std::string::npos) << text_header;
  EXPECT_EQ(text_header.find("eval_accuracy"), std::string::npos) << text_header;
  EXPECT_EQ(FirstLine(r.text), "Rounds (regression)");
  const std::string csv_header = FirstLine(r.csv);
  EXPECT_NE(csv_header.find(",round_ms,eval_mae,eval_loss,straggler,"), std::string::npos) << csv_header;
  const std::string html_header = HtmlRoundsHeader(r.html);
  EXPECT_NE(html_header.find(">eval_mae<"), std::string::npos) << html_header;
  EXPECT_EQ(html_header.find("eval_accuracy"), std::string::npos) << html_header;
  EXPECT_NE(r.html.find("task <b id=\"task\">regression</b>"), std::string::npos);
  // The refused evaluation is loaded with its reason and without figures.
  int refused = 0;
  for (const EvaluationRow& e : r.data.evaluations) {
    if (e.reject_reason.empty()) {
      EXPECT_TRUE(e.mae.has_value());
    } else {
      ++refused;
      EXPECT_FALSE(e.mae.has_value() || e.loss.has_value());
    }
  }
  EXPECT_EQ(refused, 2);
}

TEST(ReportTasksTest, NextTokenShowsPerplexityAndTokenAccuracy) {
  fl::testing::ScratchDir dir("report_tasks");
  RecordsFixture f(dir.File("lm.db"));
  WriteExperiment(f, "next-token", [&](int r) {
    const double loss = 3.0 - 0.5 * r;
    f.RoundEvaluation("e", r, loss, 0.1 * r, std::nullopt, std::exp(loss));
    f.TaskEvaluation("e", r, "a", 5, loss, 0.1 * r, std::nullopt);
  });
  const Rendered r = Render(f.path());
  EXPECT_EQ(r.data.experiment.task, "next-token");
  RecordsFixture sql(f.path());
  ExpectColumnEqualsSql(sql, r, "eval_perplexity", "eval_perplexity");
  ExpectColumnEqualsSql(sql, r, "eval_token_accuracy", "eval_accuracy");
  ExpectColumnEqualsSql(sql, r, "eval_loss", "eval_loss");
  for (const nlohmann::json& row : r.json.at("tables").at("rounds")) {
    EXPECT_FALSE(row.contains("eval_accuracy")) << row.dump();  // named for what it is: token accuracy
    EXPECT_FALSE(row.contains("eval_mae")) << row.dump();
    if (!row.at("eval_perplexity").is_null()) {
      EXPECT_NEAR(row.at("eval_perplexity").get<double>(), std::exp(row.at("eval_loss").get<double>()), 1e-12);
    }
  }
  const std::string csv_header = FirstLine(r.csv);
  EXPECT_NE(csv_header.find(",round_ms,eval_perplexity,eval_token_accuracy,eval_loss,straggler,"), std::string::npos)
      << csv_header;
  const std::string html_header = HtmlRoundsHeader(r.html);
  EXPECT_NE(html_header.find(">eval_perplexity<"), std::string::npos) << html_header;
  EXPECT_NE(html_header.find(">eval_token_accuracy<"), std::string::npos) << html_header;
  EXPECT_NE(r.json.at("definitions").at("eval_perplexity").get<std::string>().find("exp(eval_loss)"),
            std::string::npos);
}

TEST(ReportTasksTest, AnExperimentWithoutATaskIsShownAsClassification) {
  // Records from before schema v6 (here: a v5 database) have no task; their experiments were classifiers.
  fl::testing::ScratchDir dir("report_tasks");
  const std::string path = dir.File("v5.db");
  {
    namespace ins = fl::instrumentation;
    auto db = ins::sqlite::Database::Open(path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
    ASSERT_TRUE(db.ok());
    ASSERT_TRUE(ins::MigrateSchema(*db, ins::SchemaMigrations().first(5)).ok());
    ASSERT_TRUE(db->Exec(R"sql(
      INSERT INTO experiments (id, name, started_unix_ms, software_version) VALUES ('v5run', 'old', 5, 'x');
      INSERT INTO rounds (experiment_id, round, attempt, status, started_unix_ms, ended_unix_ms, duration_ms,
                          model_version, eval_loss, eval_accuracy) VALUES ('v5run', 1, 0, 'committed', 1, 2, 1, 1,
                          0.5, 0.8125);
    )sql")
                    .ok());
  }
  const Rendered r = Render(path);
  EXPECT_EQ(r.data.schema_version, 5);
  EXPECT_EQ(r.data.experiment.task, "classification");
  const nlohmann::json& row = r.json.at("tables").at("rounds").at(0);
  EXPECT_DOUBLE_EQ(row.at("eval_accuracy").get<double>(), 0.8125);
  EXPECT_FALSE(row.contains("eval_mae"));
  EXPECT_FALSE(r.data.rounds.at(0).eval_mae.has_value());
}

// The learning curve (fl-report --plot metric, and the HTML report's "Learning curve"), read back from the SVG as
// drawn: one point per evaluated committed round in each panel, its round, value and wall time those of the
// records (SQL over the same file), the task's metric and direction in the titles.
struct DrawnPoint {
  int64_t round;
  double value;
  double seconds;
};

std::vector<DrawnPoint> DrawnPoints(const std::string& svg, const std::string& panel, const std::string& metric) {
  const std::string group = testing::Group(svg, panel);
  const std::regex title("<title>round ([0-9]+): " + metric + " ([-+0-9.e]+) at ([-0-9.]+) s</title>");
  std::vector<DrawnPoint> out;
  for (std::sregex_iterator it(group.begin(), group.end(), title), end; it != end; ++it)
    out.push_back({std::stoll((*it)[1]), std::stod((*it)[2]), std::stod((*it)[3])});
  return out;
}

void ExpectCurveEqualsSql(const std::string& path, const std::string& metric, const std::string& direction) {
  auto data = LoadExperiment(path);
  ASSERT_TRUE(data.ok()) << data.status();
  const std::string svg = MetricSvg(*data);
  EXPECT_EQ(svg, PlotByName("metric", *data, Analyze(*data)));
  EXPECT_NE(svg.find(fl::StrCat("Learning curve: ", metric)), std::string::npos) << svg;
  EXPECT_NE(svg.find(fl::StrCat("(", direction, ")")), std::string::npos) << svg;
  // The round panel's axis (the first) labels the evaluated rounds 2 and 3, whole rounds only.
  const std::string round_axis = testing::Group(svg, "axes");
  EXPECT_NE(round_axis.find(">2</text>"), std::string::npos) << round_axis;
  EXPECT_NE(round_axis.find(">3</text>"), std::string::npos) << round_axis;
  EXPECT_EQ(round_axis.find(">2.5</text>"), std::string::npos) << round_axis;
  RecordsFixture sql(path);
  const std::string evaluated =
      fl::StrCat(" FROM rounds WHERE experiment_id = 'e' AND status = 'committed' AND ", metric, " IS NOT NULL");
  const double t0 = sql.QueryDouble(
      "SELECT MIN(t) FROM (SELECT started_unix_ms AS t FROM rounds UNION ALL SELECT dispatched_unix_ms FROM "
      "client_rounds WHERE dispatched_unix_ms IS NOT NULL)");
  for (const std::string panel : {"points-by-round", "points-by-time"}) {
    const std::vector<DrawnPoint> points = DrawnPoints(svg, panel, metric);
    ASSERT_EQ(static_cast<double>(points.size()), sql.QueryDouble("SELECT COUNT(*)" + evaluated)) << panel << svg;
    ASSERT_FALSE(points.empty());
    for (const DrawnPoint& p : points) {
      const std::string where = fl::StrCat(evaluated, " AND round = ", p.round);
      ASSERT_EQ(sql.QueryDouble("SELECT COUNT(*)" + where), 1) << panel << " round " << p.round;
      const double want = sql.QueryDouble(fl::StrCat("SELECT ", metric, where));
      EXPECT_NEAR(p.value, want, std::abs(want) * 1e-9) << panel << " round " << p.round;
      EXPECT_NEAR(p.seconds, (sql.QueryDouble("SELECT ended_unix_ms" + where) - t0) / 1000, 0.051) << p.round;
    }
  }
}

TEST(ReportTasksTest, LearningCurveOfEachTaskIsItsEvaluatedRounds) {
  fl::testing::ScratchDir dir("report_tasks");
  RecordsFixture cls(dir.File("cls.db"));
  WriteExperiment(cls, "classification", [&](int r) { cls.RoundEvaluation("e", r, 1.0 / r, 0.7 + 0.05 * r, {}, {}); });
  RecordsFixture reg(dir.File("reg.db"));
  WriteExperiment(reg, "regression", [&](int r) { reg.RoundEvaluation("e", r, 0.04 / r, {}, 0.1875 / r, {}); });
  RecordsFixture lm(dir.File("lm.db"));
  WriteExperiment(lm, "next-token", [&](int r) {
    const double loss = 3.0 - 0.5 * r;
    lm.RoundEvaluation("e", r, loss, 0.1 * r, {}, std::exp(loss));
  });
  // Round 1 has no evaluation in each (WriteExperiment evaluates rounds 2 and 3): it is no point.
  ExpectCurveEqualsSql(cls.path(), "eval_accuracy", "higher is better");
  ExpectCurveEqualsSql(reg.path(), "eval_mae", "lower is better");
  ExpectCurveEqualsSql(lm.path(), "eval_perplexity", "lower is better");
  // The HTML report carries the same plot.
  auto data = LoadExperiment(reg.path());
  ASSERT_TRUE(data.ok()) << data.status();
  const std::string html = HtmlReport(*data, Analyze(*data), TimelineOptions{});
  EXPECT_NE(html.find("<h2 id=\"learning-curve\">"), std::string::npos);
  EXPECT_NE(html.find(MetricSvg(*data)), std::string::npos);
}

TEST(ReportTasksTest, LearningCurveOfARunWithoutEvaluationsSaysSo) {
  fl::testing::ScratchDir dir("report_tasks");
  RecordsFixture f(dir.File("none.db"));
  WriteExperiment(f, "regression", [](int) {});
  auto data = LoadExperiment(f.path());
  ASSERT_TRUE(data.ok()) << data.status();
  const std::string svg = MetricSvg(*data);
  EXPECT_NE(svg.find("class=\"no-evaluation\""), std::string::npos) << svg;
  EXPECT_NE(svg.find("recorded no evaluation"), std::string::npos) << svg;
  EXPECT_EQ(testing::Count(svg, "<circle"), 0u) << svg;
  EXPECT_EQ(testing::Group(svg, "axes"), "") << svg;
  EXPECT_TRUE(LearningCurve(*data).points.empty());
}

}  // namespace
}  // namespace fl::report
