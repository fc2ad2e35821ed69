// The coordinator's records (SQLite tables of schema v5, read back with SQL) and its Prometheus metrics
// (scraped with a raw HTTP GET, linted by the real promtool), after a short run with a repair and a leave.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

#include <sqlite3.h>
#include <gtest/gtest.h>

#include "coord_test_util.h"
#include "fl/instrumentation/island_metrics.h"
#include "fl/instrumentation/island_records.h"
#include "fl/instrumentation/record_store.h"
#include "fl/instrumentation/schema.h"
#include "fl/instrumentation/sqlite.h"
#include "fl/testing/prometheus_server.h"
#include "fl/testing/scratch_dir.h"

namespace fl::diloco::testing {
namespace {

std::string HttpGet(int port, const std::string& path) {
  absl::StatusOr<fl::testing::HttpResponse> r = fl::testing::HttpGetLoopback(port, path);
  return r.ok() && r->status == 200 ? r->body : "";
}

// The value of the sample `name{...}` whose labels include every one of `labels`; NaN when absent.
double Sample(const std::string& text, const std::string& name, const std::vector<std::string>& labels) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(name + "{", 0) != 0) continue;
    bool all = true;
    for (const std::string& l : labels) all = all && line.find(l) != std::string::npos;
    if (all) return std::stod(line.substr(line.rfind(' ') + 1));
  }
  return std::nan("");
}

class Sql {
 public:
  explicit Sql(const std::string& path) {
    auto db = instrumentation::sqlite::Database::Open(path, SQLITE_OPEN_READONLY);
    EXPECT_TRUE(db.ok()) << db.status();
    db_ = std::move(*db);
  }
  int64_t Int(const std::string& sql) {
    auto v = db_.QueryInt(sql);
    EXPECT_TRUE(v.ok()) << sql << ": " << v.status();
    return v.ok() ? *v : -1;
  }
  std::string Text(const std::string& sql) {
    auto v = db_.QueryText(sql);
    EXPECT_TRUE(v.ok()) << sql << ": " << v.status();
    return v.ok() ? *v : "";
  }

 private:
  instrumentation::sqlite::Database db_;
};

TEST(MetricsRecordsTest, SyncsAreRecordedPerIslandAndExportedToPrometheus) {
  fl::testing::ScratchDir dir("fl_coord");
  const std::string db = dir.File("records.db");
  auto store = instrumentation::RecordStore::Open(db);
  ASSERT_TRUE(store.ok()) << store.status();
  instrumentation::ExperimentRecord exp;
  exp.id = "coord-test";
  exp.name = "islands";
  exp.started_unix_ms = 1;
  exp.software_version = "test";
  ASSERT_TRUE((*store)->Enqueue(exp).ok());
  ASSERT_TRUE((*store)->Flush().ok());
  auto writer = instrumentation::IslandRecordWriter::Open(db);
  ASSERT_TRUE(writer.ok()) << writer.status();
  auto metrics = instrumentation::IslandMetrics::Start("127.0.0.1:0", "coord-test");
  ASSERT_TRUE(metrics.ok()) << metrics.status();

  uint64_t committed_hash = 0;
  {
    CoordinatorHarness h(TestOptions(), writer->get(), metrics->get());
    SimIsland a("a"), b("b");
    for (SimIsland* island : {&a, &b}) ASSERT_TRUE(island->Connect(h.address()).ok());
    auto plans = BeginAll({&a, &b}, SyncKey{0, 0});
    for (const auto& p : plans) ASSERT_TRUE(p.ok());
    for (const auto& v : ApplyAndReportAll({&a, &b}, plans)) ASSERT_TRUE(v.ok());
    // Sync 1: b's state diverges; it is repaired from a.
    auto next = BeginAll({&a, &b}, SyncKey{1, 0});
    for (const auto& p : next) ASSERT_TRUE(p.ok());
    b.params[1] = -7.0f;
    auto verdicts = ApplyAndReportAll({&a, &b}, next);
    ASSERT_TRUE(verdicts[1].ok());
    ASSERT_EQ(verdicts[1]->kind, VerdictKind::kRepair);
    auto snap = FetchState(verdicts[1]->source->endpoint, verdicts[1]->source->expected_hash);
    ASSERT_TRUE(snap.ok()) << snap.status();
    b.Load(snap->image);
    ASSERT_TRUE(b.client->ReportStateLoaded(verdicts[1]->source->key, b.Hash()).ok());
    committed_hash = a.Hash();
    ASSERT_TRUE(b.client->Leave("done").ok());

    // Metrics, scraped as Prometheus would.
    const std::string text = HttpGet((*metrics)->port(), "/metrics");
    ASSERT_FALSE(text.empty());
    EXPECT_EQ(Sample(text, "fl_island_exchange_seconds_count", {"island=\"a\""}), 2);
    EXPECT_EQ(Sample(text, "fl_island_exchange_seconds_sum", {"island=\"a\""}), 0.5);
    EXPECT_EQ(Sample(text, "fl_island_inner_compute_seconds_sum", {"island=\"b\""}), 3.0);
    EXPECT_EQ(Sample(text, "fl_island_exchange_wait_seconds_total", {"island=\"a\""}), 0.25);
    EXPECT_EQ(Sample(text, "fl_island_exchange_bytes_total", {"island=\"a\"", "direction=\"sent\""}), 2000);
    EXPECT_EQ(Sample(text, "fl_island_exchange_bytes_total", {"island=\"b\"", "direction=\"received\""}), 4000);
    EXPECT_EQ(Sample(text, "fl_island_state_hash_mismatches_total", {"island=\"b\""}), 1);
    EXPECT_EQ(Sample(text, "fl_island_syncs_total", {"island=\"b\"", "outcome=\"mismatch\""}), 1);
    EXPECT_EQ(Sample(text, "fl_island_state_loads_total", {"island=\"b\"", "why=\"repair\""}), 1);
    EXPECT_EQ(Sample(text, "fl_island_departures_total", {"island=\"b\"", "reason=\"left\""}), 1);
    EXPECT_EQ(Sample(text, "fl_island_epochs_total", {"outcome=\"committed\""}), 2);
    EXPECT_EQ(Sample(text, "fl_island_members", {"experiment=\"coord-test\""}), 1);
    EXPECT_EQ(Sample(text, "fl_island_committed_outer_step", {}), 1);
    // Step, fragment and epoch numbers are values, never labels.
    for (const char* label : {"step=", "fragment=", "epoch="}) EXPECT_EQ(text.find(label), std::string::npos) << label;
    const std::string file = dir.File("metrics.txt");
    std::ofstream(file) << text;
    const int rc = std::system(("promtool check metrics < " + file + " > " + dir.File("lint.txt") + " 2>&1").c_str());
    std::ifstream lint(dir.File("lint.txt"));
    EXPECT_EQ(rc, 0) << std::string(std::istreambuf_iterator<char>(lint), {});
    h.Stop();
  }
  ASSERT_TRUE((*writer)->Close().ok());
  ASSERT_TRUE((*store)->Close().ok());

  Sql sql(db);
  EXPECT_EQ(sql.Int("PRAGMA user_version"), instrumentation::LatestSchemaVersion());
  EXPECT_EQ(sql.Int("SELECT count(*) FROM islands WHERE experiment_id = 'coord-test'"), 2);
  EXPECT_EQ(sql.Text("SELECT group_concat(island_id) FROM (SELECT island_id FROM islands ORDER BY join_seq)"), "a,b");
  EXPECT_EQ(sql.Int("SELECT num_ranks FROM islands WHERE island_id = 'a'"), 2);
  EXPECT_EQ(sql.Text("SELECT model_fingerprint FROM islands WHERE island_id = 'a'"), "1234abcd5678ef90");
  EXPECT_EQ(sql.Text("SELECT left_reason FROM islands WHERE island_id = 'b'"), "left: done");
  EXPECT_EQ(sql.Int("SELECT count(*) FROM islands WHERE island_id = 'a' AND left_unix_ms IS NOT NULL"), 1)
      << "a was still a member at shutdown: recorded as left then";

  EXPECT_EQ(sql.Int("SELECT count(*) FROM island_epochs WHERE outcome = 'committed'"), 2);
  EXPECT_EQ(sql.Text("SELECT members FROM island_epochs WHERE step = 1"), "a,b");
  EXPECT_EQ(sql.Text("SELECT committed_hash FROM island_epochs WHERE step = 1"),
            instrumentation::HashHex(committed_hash));
  EXPECT_EQ(sql.Int("SELECT num_mismatched FROM island_epochs WHERE step = 1"), 1);
  EXPECT_EQ(sql.Int("SELECT num_mismatched FROM island_epochs WHERE step = 0"), 0);

  EXPECT_EQ(sql.Int("SELECT count(*) FROM island_syncs"), 4);
  EXPECT_EQ(sql.Int("SELECT sum(bytes_sent) FROM island_syncs"), 4000);
  EXPECT_EQ(sql.Int("SELECT sum(bytes_received) FROM island_syncs"), 8000);
  EXPECT_EQ(sql.Int("SELECT count(*) FROM island_syncs WHERE inner_compute_ms = 1500 AND exchange_ms = 250 "
                    "AND wait_ms = 125 AND inner_steps = 4"),
            4);
  EXPECT_EQ(sql.Text("SELECT outcome || '/' || verdict || '/' || repair_source FROM island_syncs "
                     "WHERE island_id = 'b' AND step = 1"),
            "mismatch/repair/a");
  EXPECT_EQ(sql.Int("SELECT count(*) FROM island_syncs WHERE island_id = 'b' AND step = 1 "
                    "AND repaired_unix_ms IS NOT NULL"),
            1);
  EXPECT_EQ(sql.Text("SELECT state_hash FROM island_syncs WHERE island_id = 'a' AND step = 1"),
            instrumentation::HashHex(committed_hash));
  EXPECT_EQ(sql.Text("SELECT group_concat(ring_index) FROM (SELECT ring_index FROM island_syncs WHERE step = 0 "
                     "ORDER BY island_id)"),
            "0,1");
}

}  // namespace
}  // namespace fl::diloco::testing
