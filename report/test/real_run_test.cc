// fl-report on a real run: fl-server and three fl-clients (synthetic model, links declared ethernet, wifi
// and 5g) on loopback write the records; the report's figures (JSON) and the HTML report rendered in
// headless Chromium must equal what SQL computes from the same file.
#include <chrono>
#include <filesystem>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "fl/core/str_cat.h"
#include "fl/testing/scratch_dir.h"
#include "fl/testing/subprocess.h"
#include "fl/testing/suite_set_up.h"
#include "chromium_dom.h"
#include "records_fixture.h"
#include "run_tool.h"

namespace fl::report {
namespace {

using namespace fl::report::testing;  // NOLINT: test helpers
using fl::testing::Subprocess;

constexpr int kRounds = 4;

class RealRunTest : public ::testing::Test {
 protected:
  void SetUp() override { fl::testing::SetUpSuiteOnce<RealRunTest>(&RealRunTest::SetUpSuite); }
  // Once, from the first test's SetUp (suite_set_up.h: a failure here fails the tests, not skips them).
  static void SetUpSuite() {
    dir_ = new fl::testing::ScratchDir("report_real_run");
    db_ = dir_->File("records.db");
    const std::string log = dir_->File("run.log");
    const std::string port_file = dir_->File("port");
    Subprocess server({FL_SERVER_BIN,
                       "--listen",
                       "127.0.0.1:0",
                       "--port-file",
                       port_file,
                       "--db",
                       db_,
                       "--experiment-name",
                       "report-real-run",
                       "--rounds",
                       std::to_string(kRounds),
                       "--min-fit-clients",
                       "3",
                       "--min-available-clients",
                       "3",
                       "--evaluate-every",
                       "2",
                       "--round-deadline-ms",
                       "30000",
                       "--heartbeat-interval-ms",
                       "300",
                       "--log-level",
                       "warn",
                       "--insecure"},
                      log);
    std::string port;
    for (int i = 0; i < 500 && port.empty(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      port = ReadAll(port_file);
      while (!port.empty() && (port.back() == '\n' || port.back() == ' ')) port.pop_back();
    }
    ASSERT_FALSE(port.empty()) << "fl-server did not write its port; see " << log << ":\n" << ReadAll(log);
    std::vector<std::unique_ptr<Subprocess>> clients;
    for (const char* kind : {"ethernet", "wifi", "5g"}) {
      clients.push_back(std::make_unique<Subprocess>(
          std::vector<std::string>{FL_CLIENT_BIN, "--server", "127.0.0.1:" + port, "--name", fl::StrCat("c-", kind),
                                   "--model", "synthetic:300000:40", "--link-kind", kind, "--give-up-after-s", "60",
                                   "--log-level", "warn", "--insecure"},
          log));
    }
    const auto code = server.Wait(std::chrono::seconds(120));
    ASSERT_TRUE(code.has_value()) << "fl-server did not finish; see:\n" << ReadAll(log);
    ASSERT_EQ(*code, 0) << ReadAll(log);
    for (auto& c : clients) c->Wait(std::chrono::seconds(20));  // the destructors kill what is left
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }

  static fl::testing::ScratchDir* dir_;
  static std::string db_;
};

fl::testing::ScratchDir* RealRunTest::dir_ = nullptr;
std::string RealRunTest::db_;

// SQL over the accepted updates of committed rounds, for one link kind.
std::string Accepted(const std::string& kind) {
  return "FROM client_rounds c JOIN clients USING (experiment_id, client_id) JOIN rounds r USING (experiment_id, "
         "round, attempt) WHERE c.outcome = 'ok' AND r.status = 'committed' AND link_kind = '" +
         kind + "'";
}

TEST_F(RealRunTest, JsonFiguresEqualSqlOverTheRecords) {
  const std::string out = dir_->File("report.json");
  const ToolResult r = RunTool({FL_REPORT_BIN, db_, "--format", "json", "--out", out}, *dir_);
  ASSERT_EQ(r.code, 0) << r.output;
  const nlohmann::json doc = nlohmann::json::parse(ReadAll(out));
  RecordsFixture sql(db_);
  EXPECT_EQ(doc.at("experiment")["committed_rounds"].get<int>(), kRounds);
  EXPECT_TRUE(doc.at("experiment")["phase_starts_recorded"].get<bool>());

  const nlohmann::json& rounds = doc.at("tables")["rounds"];
  ASSERT_EQ(rounds.size(), static_cast<size_t>(sql.QueryDouble("SELECT count(*) FROM rounds")));
  for (const nlohmann::json& row : rounds) {
    const std::string key = fl::StrCat(" WHERE round = ", row.at("round").get<int64_t>(),
                                       " AND attempt = ", row.at("attempt").get<int64_t>());
    EXPECT_DOUBLE_EQ(row.at("round_ms").get<double>(), sql.QueryDouble("SELECT duration_ms FROM rounds" + key));
    EXPECT_EQ(row.at("accepted").get<double>(), sql.QueryDouble("SELECT num_accepted FROM rounds" + key));
    EXPECT_DOUBLE_EQ(row.at("uplink_max_ms").get<double>(),
                     sql.QueryDouble("SELECT max(coalesce(uplink_ms, uplink_server_ms)) FROM client_rounds" + key +
                                     " AND outcome = 'ok'"));
    EXPECT_DOUBLE_EQ(row.at("train_mean_ms").get<double>(),
                     sql.QueryDouble("SELECT avg(train_ms) FROM client_rounds" + key + " AND outcome = 'ok'"));
    // The straggler: the accepted update whose last byte reached the server last.
    const std::string straggler =
        sql.QueryText("SELECT c.client_name FROM client_rounds JOIN clients c USING (experiment_id, client_id)" + key +
                      " AND outcome = 'ok' ORDER BY uplink_server_start_unix_ms + uplink_server_ms DESC LIMIT 1");
    EXPECT_EQ(row.at("straggler").get<std::string>(), straggler) << row.dump();
  }

  const nlohmann::json& links = doc.at("tables")["links"];
  ASSERT_EQ(links.size(), 3u);
  const double eth = sql.QueryDouble("SELECT avg(coalesce(uplink_ms, uplink_server_ms)) " + Accepted("ethernet"));
  const double wifi = sql.QueryDouble("SELECT avg(coalesce(uplink_ms, uplink_server_ms)) " + Accepted("wifi"));
  for (const nlohmann::json& l : links) {
    const std::string kind = l.at("link_kind").get<std::string>();
    const double up = sql.QueryDouble("SELECT avg(coalesce(uplink_ms, uplink_server_ms)) " + Accepted(kind));
    EXPECT_DOUBLE_EQ(l.at("uplink_mean_ms").get<double>(), up) << kind;
    EXPECT_DOUBLE_EQ(l.at("downlink_mean_ms").get<double>(),
                     sql.QueryDouble("SELECT avg(downlink_ms) " + Accepted(kind)));
    EXPECT_DOUBLE_EQ(l.at("uplink_vs_ethernet").get<double>(), up / eth) << kind;
    EXPECT_DOUBLE_EQ(l.at("uplink_vs_wifi").get<double>(), up / wifi) << kind;
    EXPECT_DOUBLE_EQ(
        l.at("uplink_share").get<double>(),
        sql.QueryDouble("SELECT sum(coalesce(uplink_ms, uplink_server_ms)) / sum(r.duration_ms) " + Accepted(kind)))
        << kind;
    EXPECT_EQ(l.at("client_rounds").get<int>(), kRounds) << kind;
    // Federated evaluation ran after rounds 2 and 4 (--evaluate-every 2).
    EXPECT_DOUBLE_EQ(l.at("fed_eval_mean_ms").get<double>(),
                     sql.QueryDouble("SELECT avg(eval_ms) FROM evaluations JOIN clients USING (experiment_id, "
                                     "client_id) WHERE link_kind = '" +
                                     kind + "'"))
        << kind;
  }

  int64_t straggler_rounds = 0;
  for (const nlohmann::json& s : doc.at("tables")["stragglers"])
    straggler_rounds += s.at("times_straggler").get<int64_t>();
  EXPECT_EQ(straggler_rounds, kRounds);
}

TEST_F(RealRunTest, HtmlReportRendersInChromiumWithTheRecordsFigures) {
  const std::string html = dir_->File("report.html");
  const ToolResult r = RunTool({FL_REPORT_BIN, db_, "--format", "html", "--out", html}, *dir_);
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string dom = RenderDom(html, *dir_);
  ASSERT_FALSE(dom.empty());
  for (const char* id : {"plot-timeline", "plot-phase-shares", "plot-round-time"}) {
    const std::string svg = ElementById(dom, "svg", id);
    ASSERT_FALSE(svg.empty()) << id;
    EXPECT_NE(svg.find("viewBox=\"0 0 "), std::string::npos) << id;
    EXPECT_GT(CountOf(svg, "<rect"), 0u) << id;
  }
  // Each client has its row on the timeline and every round its start mark.
  const std::string timeline = ElementById(dom, "svg", "plot-timeline");
  for (const char* row : {"c-ethernet [ethernet]", "c-wifi [wifi]", "c-5g [5g]"}) {
    EXPECT_NE(timeline.find(row), std::string::npos) << row;
  }
  for (int round = 1; round <= kRounds; ++round) {
    EXPECT_NE(timeline.find(fl::StrCat(">r", round, "<")), std::string::npos) << round;
  }
  RecordsFixture sql(db_);
  const auto links = TableRows(ElementById(dom, "table", "table-links"));
  ASSERT_EQ(links.size(), 3u);
  const double eth = sql.QueryDouble("SELECT avg(coalesce(uplink_ms, uplink_server_ms)) " + Accepted("ethernet"));
  for (const char* kind : {"wifi", "5g"}) {
    const auto row = RowWhere(links, "link_kind", kind);
    ASSERT_FALSE(row.empty()) << kind;
    const double up = sql.QueryDouble("SELECT avg(coalesce(uplink_ms, uplink_server_ms)) " + Accepted(kind));
    EXPECT_EQ(row.at("uplink_vs_ethernet"), Shown(up / eth, 2, "x")) << kind;
    EXPECT_EQ(row.at("uplink_mean_ms"), Shown(up, 1)) << kind;
  }
  EXPECT_NE(dom.find(fl::StrCat("<span id=\"committed-rounds\">", kRounds, "</span>")), std::string::npos);
}

}  // namespace
}  // namespace fl::report
