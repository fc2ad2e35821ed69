// Loading experiments: every error a person can hit names the value and what to do; the latest experiment is
// the default; databases written before schema v3 (no phase start columns) still load.
#include "fl/report/experiment_data.h"

#include <fstream>

#include <gtest/gtest.h>

#include "fl/instrumentation/schema.h"
#include "fl/instrumentation/sqlite.h"
#include "fl/report/analysis.h"
#include "fl/testing/scratch_dir.h"
#include "records_fixture.h"

namespace fl::report {
namespace {

using testing::RecordsFixture;
namespace ins = fl::instrumentation;

std::string Message(const absl::Status& s) { return std::string(fl::ToStd(s.message())); }

TEST(ExperimentDataTest, MissingFileIsNotFoundAndNamesThePath) {
  fl::testing::ScratchDir dir("report_missing");
  auto data = LoadExperiment(dir.File("nope.db"));
  ASSERT_FALSE(data.ok());
  EXPECT_EQ(data.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(Message(data.status()).find(dir.File("nope.db")), std::string::npos) << data.status();
  EXPECT_NE(Message(data.status()).find("--db"), std::string::npos) << data.status();
}

TEST(ExperimentDataTest, TextFileIsNotARecordsDatabase) {
  fl::testing::ScratchDir dir("report_text");
  std::ofstream(dir.File("notes.txt")) << "round,uplink_ms\n1,2.5\n";
  auto data = LoadExperiment(dir.File("notes.txt"));
  ASSERT_FALSE(data.ok());
  EXPECT_EQ(data.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(Message(data.status()).find("is not a records database"), std::string::npos) << data.status();
}

TEST(ExperimentDataTest, AnotherProgramsSqliteDatabaseIsRefused) {
  fl::testing::ScratchDir dir("report_other");
  {
    auto db = ins::sqlite::Database::Open(dir.File("other.db"), SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
    ASSERT_TRUE(db.ok());
    ASSERT_TRUE(db->Exec("CREATE TABLE rounds (x INTEGER); INSERT INTO rounds VALUES (1);").ok());
  }
  auto data = LoadExperiment(dir.File("other.db"));
  ASSERT_FALSE(data.ok());
  EXPECT_EQ(data.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(Message(data.status()).find("not an fl-testbed records database"), std::string::npos) << data.status();
}

TEST(ExperimentDataTest, DatabaseWithoutExperimentsSaysSo) {
  fl::testing::ScratchDir dir("report_empty_db");
  RecordsFixture f(dir.File("r.db"));
  f.Close();
  auto data = LoadExperiment(dir.File("r.db"));
  ASSERT_FALSE(data.ok());
  EXPECT_EQ(data.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(Message(data.status()).find("holds no experiments"), std::string::npos) << data.status();
}

TEST(ExperimentDataTest, UnknownExperimentListsTheOnesThatExist) {
  fl::testing::ScratchDir dir("report_unknown");
  RecordsFixture f(dir.File("r.db"));
  f.Experiment("first-run", 100, "alpha");
  f.Experiment("second-run", 200, "beta");
  f.Close();
  auto data = LoadExperiment(dir.File("r.db"), "third-run");
  ASSERT_FALSE(data.ok());
  EXPECT_EQ(data.status().code(), absl::StatusCode::kNotFound);
  const std::string m = Message(data.status());
  EXPECT_NE(m.find("'third-run'"), std::string::npos) << m;
  EXPECT_NE(m.find("first-run"), std::string::npos) << m;
  EXPECT_NE(m.find("second-run"), std::string::npos) << m;
}

TEST(ExperimentDataTest, ExperimentWithoutRoundsIsAClearError) {
  fl::testing::ScratchDir dir("report_no_rounds");
  RecordsFixture f(dir.File("r.db"));
  f.Experiment("idle-run", 100);
  f.Client("idle-run", "c0", "wifi");
  f.Close();
  auto data = LoadExperiment(dir.File("r.db"));
  ASSERT_FALSE(data.ok());
  EXPECT_EQ(data.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string m = Message(data.status());
  EXPECT_NE(m.find("'idle-run'"), std::string::npos) << m;
  EXPECT_NE(m.find("no rounds"), std::string::npos) << m;
  EXPECT_NE(m.find("1 clients joined"), std::string::npos) << m;
}

TEST(ExperimentDataTest, DefaultIsTheLatestExperimentAndIdsSelect) {
  fl::testing::ScratchDir dir("report_latest");
  RecordsFixture f(dir.File("r.db"));
  f.Experiment("old", 100);
  f.Experiment("new", 900);
  for (const char* e : {"old", "new"}) {
    f.Client(e, "c0", "ethernet");
    f.Round(e, 1, 1000, std::string(e) == "old" ? 111 : 222);
  }
  f.Close();
  auto latest = LoadExperiment(dir.File("r.db"));
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->experiment.id, "new");
  EXPECT_DOUBLE_EQ(latest->rounds.at(0).duration_ms, 222);
  auto old = LoadExperiment(dir.File("r.db"), "old");
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ(old->experiment.id, "old");
  EXPECT_DOUBLE_EQ(old->rounds.at(0).duration_ms, 111);
  auto all = ListExperiments(dir.File("r.db"));
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[0].id, "old");
  EXPECT_EQ((*all)[1].num_rounds, 1);
}

TEST(ExperimentDataTest, ClientLabelIsTheNameUnlessTwoClientsShareIt) {
  fl::testing::ScratchDir dir("report_labels");
  {
    RecordsFixture f(dir.File("r.db"));
    f.Experiment("e", 1);
    f.Client("e", "id-1", "wifi");
    f.Client("e", "id-2", "wifi");
    f.Client("e", "id-3", "5g");
    f.Round("e", 1, 1000, 10);
    f.Close();
  }
  RecordsFixture sql(dir.File("r.db"));
  sql.Exec(
      "UPDATE clients SET client_name = 'pi' WHERE client_id IN ('id-1', 'id-2');"
      "UPDATE clients SET client_name = 'jetson', link_kind = NULL WHERE client_id = 'id-3'");
  sql.Close();
  auto data = LoadExperiment(dir.File("r.db"));
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->FindClient("id-1")->label, "id-1");
  EXPECT_EQ(data->FindClient("id-3")->label, "jetson");
  EXPECT_EQ(data->FindClient("id-3")->link_kind, "unknown");
}

// A database written by an fl-server from before schema v3 (here: migrated to v2 only, rows inserted with
// v2's columns): it loads, phases are laid end to end from dispatch, and the straggler still follows.
TEST(ExperimentDataTest, SchemaV2DatabaseLoadsWithPhasesLaidEndToEnd) {
  fl::testing::ScratchDir dir("report_v2");
  const std::string path = dir.File("v2.db");
  {
    auto db = ins::sqlite::Database::Open(path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
    ASSERT_TRUE(db.ok());
    ASSERT_GE(ins::SchemaMigrations().size(), 2u);
    ASSERT_TRUE(ins::MigrateSchema(*db, ins::SchemaMigrations().first(2)).ok());
    ASSERT_TRUE(db->Exec(R"sql(
      INSERT INTO experiments (id, name, started_unix_ms, software_version) VALUES ('v2run', 'old', 5, 'x');
      INSERT INTO clients (experiment_id, client_id, link_kind, joined_unix_ms) VALUES
        ('v2run', 'a', 'ethernet', 5), ('v2run', 'b', '5g', 5);
      INSERT INTO rounds (experiment_id, round, attempt, status, started_unix_ms, ended_unix_ms, duration_ms,
                          model_version) VALUES ('v2run', 1, 0, 'committed', 1000, 1400, 400, 1);
      INSERT INTO client_rounds (experiment_id, round, attempt, client_id, outcome, dispatched_unix_ms,
                                 downlink_ms, train_ms, uplink_ms, clock_offset_ms) VALUES
        ('v2run', 1, 0, 'b', 'ok', 1000, 20, 100, 250, 0.5),
        ('v2run', 1, 0, 'a', 'ok', 1000, 10, 100, 5, 0.1);
    )sql")
                    .ok());
  }
  auto data = LoadExperiment(path);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->schema_version, 2);
  EXPECT_FALSE(data->has_phase_starts);
  ASSERT_EQ(data->rounds.at(0).clients.size(), 2u);
  const ClientRoundRow& b = data->rounds[0].clients[0];
  EXPECT_EQ(b.client_id, "b");
  EXPECT_FALSE(b.downlink_start_unix_ms.has_value());
  EXPECT_DOUBLE_EQ(*b.clock_offset_ms, 0.5);
  const Analysis a = Analyze(*data);
  ASSERT_TRUE(a.rounds[0].straggler.has_value());
  EXPECT_EQ(a.rounds[0].straggler->client_id, "b");
  EXPECT_EQ(a.rounds[0].straggler->dominant_phase, Phase::kUplink);
  EXPECT_DOUBLE_EQ(*a.rounds[0].straggler->arrival_unix_ms, 1000.0 + 20 + 100 + 250);
  EXPECT_DOUBLE_EQ(*a.links.at(1).uplink_vs_ethernet, 250.0 / 5.0);
}

// A database of every schema version loads as it is (fl-report never migrates): what the version has is there,
// what came later is empty; only v7 and later have client events, only v8 and later security events, only v11 and
// later secure-aggregation stages and counts.
TEST(ExperimentDataTest, EverySchemaVersionLoads) {
  fl::testing::ScratchDir dir("report_versions");
  for (int version = 1; version <= ins::LatestSchemaVersion(); ++version) {
    SCOPED_TRACE(fl::StrCat("schema version ", version));
    const std::string path = dir.File(fl::StrCat("v", version, ".db"));
    {
      auto db = ins::sqlite::Database::Open(path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
      ASSERT_TRUE(db.ok());
      ASSERT_TRUE(ins::MigrateSchema(*db, ins::SchemaMigrations().first(static_cast<size_t>(version))).ok());
      ASSERT_TRUE(db->Exec(R"sql(
        INSERT INTO experiments (id, name, started_unix_ms, software_version) VALUES ('run', 'old', 5, 'x');
        INSERT INTO clients (experiment_id, client_id, client_name, link_kind, joined_unix_ms)
          VALUES ('run', 'a', 'pi', 'wifi', 5);
        INSERT INTO rounds (experiment_id, round, attempt, status, started_unix_ms, ended_unix_ms, duration_ms,
                            model_version, eval_loss, eval_accuracy) VALUES ('run', 1, 0, 'committed', 1000, 1400,
                            400, 1, 0.5, 0.75);
        INSERT INTO client_rounds (experiment_id, round, attempt, client_id, outcome, dispatched_unix_ms,
                                   downlink_ms, train_ms, uplink_ms) VALUES ('run', 1, 0, 'a', 'ok', 1000, 10, 100, 5);
        INSERT INTO evaluations (experiment_id, round, attempt, client_id, num_examples, loss, accuracy, eval_ms)
          VALUES ('run', 1, 0, 'a', 10, 0.5, 0.75, 7);
      )sql")
                      .ok());
      if (version >= 7) {
        ASSERT_TRUE(db->Exec("INSERT INTO client_events (experiment_id, client_id, kind, round, reason, at_unix_ms) "
                             "VALUES ('run', 'a', 'upload_revoked', 1, 'too slow', 1300)")
                        .ok());
      }
      if (version >= 8) {
        ASSERT_TRUE(db->Exec("INSERT INTO security_events (experiment_id, reason, peer, identity, detail, at_unix_ms) "
                             "VALUES ('run', 'revoked_certificate', 'ipv4:10.0.0.2:4000', 'pi', 'revoked', 1350)")
                        .ok());
      }
      if (version >= 11) {
        ASSERT_TRUE(db->Exec(R"sql(
          UPDATE rounds SET secagg_survivors = 1, secagg_dropped = 0;
          INSERT INTO secagg_stages (experiment_id, round, attempt, client_id, stage, outcome, started_unix_ms,
                                     duration_ms, bytes_down, bytes_up)
            VALUES ('run', 1, 0, 'a', 'masked_upload', 'ok', 1100.5, 12.5, 0, 4096);
        )sql")
                        .ok());
      }
    }
    auto data = LoadExperiment(path);
    ASSERT_TRUE(data.ok()) << data.status();
    EXPECT_EQ(data->schema_version, version);
    EXPECT_EQ(data->has_phase_starts, version >= 3);
    EXPECT_EQ(data->experiment.task, "classification");
    EXPECT_EQ(data->experiment.num_rounds, 1);
    ASSERT_EQ(data->clients.size(), 1u);
    EXPECT_EQ(data->clients[0].label, "pi");
    ASSERT_EQ(data->rounds.size(), 1u);
    EXPECT_EQ(data->rounds[0].eval_accuracy, 0.75);
    ASSERT_EQ(data->rounds[0].clients.size(), 1u);
    EXPECT_EQ(data->rounds[0].clients[0].train_ms, 100);
    EXPECT_FALSE(data->rounds[0].clients[0].clock_offset_ms.has_value());
    ASSERT_EQ(data->evaluations.size(), 1u);
    EXPECT_EQ(data->evaluations[0].eval_ms, 7);
    ASSERT_EQ(data->client_events.size(), version >= 7 ? 1u : 0u);
    if (version >= 7) {
      EXPECT_EQ(data->client_events[0].kind, "upload_revoked");
      EXPECT_EQ(data->client_events[0].round, 1);
      EXPECT_EQ(data->client_events[0].reason, "too slow");
    }
    ASSERT_EQ(data->security_events.size(), version >= 8 ? 1u : 0u);
    if (version >= 8) {
      const SecurityEventRow& e = data->security_events[0];
      EXPECT_EQ(e.reason, "revoked_certificate");
      EXPECT_EQ(e.peer, "ipv4:10.0.0.2:4000");
      EXPECT_EQ(e.identity, "pi");
      EXPECT_EQ(e.claimed, "");
      EXPECT_EQ(e.detail, "revoked");
      EXPECT_EQ(e.at_unix_ms, 1350);
    }
    EXPECT_EQ(data->rounds[0].secagg_survivors, version >= 11 ? std::optional<int64_t>(1) : std::nullopt);
    ASSERT_EQ(data->secagg_stages.size(), version >= 11 ? 1u : 0u);
    if (version >= 11) {
      const SecAggStageRow& s = data->secagg_stages[0];
      EXPECT_EQ(s.client_id, "a");
      EXPECT_EQ(s.stage, "masked_upload");
      EXPECT_EQ(s.outcome, "ok");
      EXPECT_EQ(s.duration_ms, 12.5);
      EXPECT_EQ(s.bytes_up, 4096);
      EXPECT_EQ(s.detail, "");
    }
  }
}

TEST(ExperimentDataTest, NewerSchemaVersionIsRefusedNamingWhatToUpgrade) {
  fl::testing::ScratchDir dir("report_newer");
  RecordsFixture f(dir.File("r.db"));
  f.Experiment("e", 1);
  f.Round("e", 1, 1000, 10);
  f.Exec(fl::StrCat("PRAGMA user_version = ", ins::LatestSchemaVersion() + 1));
  f.Close();
  auto data = LoadExperiment(dir.File("r.db"));
  ASSERT_FALSE(data.ok());
  EXPECT_EQ(data.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(Message(data.status()).find("upgrade fl-server (and fl-report)"), std::string::npos) << data.status();
}

}  // namespace
}  // namespace fl::report
