#include "fl/instrumentation/schema.h"

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "fl/core/str_cat.h"
#include "fl/instrumentation/record_columns.h"
#include "fl/instrumentation/record_reader.h"
#include "fl/instrumentation/record_store.h"
#include "test_util.h"

namespace fl::instrumentation {
namespace {

using testing_util::ExecRaw;
using testing_util::ScratchDir;

std::string Message(const absl::Status& s) { return std::string(s.message()); }

sqlite::Database OpenRaw(const std::string& path) {
  absl::StatusOr<sqlite::Database> db = sqlite::Database::Open(path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
  EXPECT_TRUE(db.ok()) << db.status();
  return *std::move(db);
}

int64_t Int(sqlite::Database& db, const std::string& sql) {
  absl::StatusOr<int64_t> v = db.QueryInt(sql);
  EXPECT_TRUE(v.ok()) << v.status();
  return v.ok() ? *v : -1;
}

// The whole schema as text: equal before and after an operation iff the schema did not change.
std::string SchemaText(sqlite::Database& db) {
  absl::StatusOr<std::string> s = db.QueryText(
      "SELECT group_concat(type || ' ' || name || ': ' || coalesce(sql, ''), char(10)) "
      "FROM (SELECT * FROM sqlite_schema ORDER BY name)");
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : "";
}

// Two test migrations: v1 creates a table, v2 adds a column and a second table.
constexpr Migration kTestV1{1, "create a", "CREATE TABLE a (id INTEGER PRIMARY KEY, x TEXT NOT NULL);", false};
constexpr Migration kTestV2{2, "a.y, create b",
                            "ALTER TABLE a ADD COLUMN y REAL; CREATE TABLE b (a_id INTEGER REFERENCES a (id));", false};

TEST(SchemaTest, RealMigrationListIsNumberedInOrder) {
  std::span<const Migration> migrations = SchemaMigrations();
  ASSERT_FALSE(migrations.empty());
  for (size_t i = 0; i < migrations.size(); ++i) {
    EXPECT_EQ(migrations[i].version, static_cast<int>(i) + 1);
    EXPECT_FALSE(migrations[i].description.empty());
    EXPECT_FALSE(migrations[i].sql.empty());
  }
  EXPECT_EQ(LatestSchemaVersion(), migrations.back().version);
}

TEST(SchemaTest, EmptyFileGetsTheWholeSchema) {
  ScratchDir dir;
  const std::string path = dir.File("records.db");
  auto store = RecordStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->settings().schema_version, LatestSchemaVersion());
  ASSERT_TRUE((*store)->Close().ok());

  sqlite::Database db = OpenRaw(path);
  EXPECT_EQ(Int(db, "PRAGMA user_version"), LatestSchemaVersion());
  EXPECT_EQ(Int(db, "PRAGMA application_id"), kRecordsApplicationId);
  for (const char* table : {"experiments", "clients", "rounds", "client_rounds", "evaluations", "checkpoints",
                            "client_events", "security_events"}) {
    EXPECT_EQ(
        Int(db, std::string("SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = '") + table + "'"), 1)
        << table;
  }
  EXPECT_EQ(Int(db,
                "SELECT count(*) FROM sqlite_schema WHERE type = 'index' AND name = 'rounds_committed_once' "
                "AND sql LIKE '%WHERE status = ''committed''%'"),
            1);
  // Columns carry their units in their names.
  EXPECT_EQ(Int(db,
                "SELECT count(*) FROM pragma_table_info('client_rounds') WHERE name IN "
                "('downlink_ms', 'train_ms', 'eval_ms', 'uplink_ms', 'uplink_server_ms', 'idle_ms', "
                "'downlink_bytes', 'uplink_bytes')"),
            8);
  // client_rounds -> rounds (experiment_id, round, attempt) and -> clients (experiment_id, client_id).
  EXPECT_EQ(Int(db, "SELECT count(DISTINCT id) FROM pragma_foreign_key_list('client_rounds')"), 2);
  EXPECT_EQ(Int(db, "SELECT count(*) FROM pragma_foreign_key_list('client_rounds')"), 5);
}

TEST(SchemaTest, ZeroByteFileAtVersionZeroMigrates) {
  ScratchDir dir;
  const std::string path = dir.File("records.db");
  { std::ofstream touch(path); }
  auto store = RecordStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->settings().schema_version, LatestSchemaVersion());
}

TEST(SchemaTest, ReopeningIsANoOp) {
  ScratchDir dir;
  const std::string path = dir.File("records.db");
  ASSERT_TRUE(RecordStore::Open(path).ok());
  std::string before;
  int64_t data_version_before = 0;
  {
    sqlite::Database db = OpenRaw(path);
    before = SchemaText(db);
    data_version_before = Int(db, "SELECT count(*) FROM sqlite_schema");
  }
  auto again = RecordStore::Open(path);
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_TRUE((*again)->Close().ok());
  sqlite::Database db = OpenRaw(path);
  EXPECT_EQ(SchemaText(db), before);
  EXPECT_EQ(Int(db, "SELECT count(*) FROM sqlite_schema"), data_version_before);
  EXPECT_EQ(Int(db, "PRAGMA user_version"), LatestSchemaVersion());

  // The runner itself: a second run of migrations that would fail if re-applied (plain CREATE TABLE).
  ScratchDir dir2;
  sqlite::Database test_db = OpenRaw(dir2.File("t.db"));
  const Migration list[] = {kTestV1};
  ASSERT_TRUE(MigrateSchema(test_db, list).ok());
  absl::Status again_status = MigrateSchema(test_db, list);
  EXPECT_TRUE(again_status.ok()) << again_status;
}

TEST(SchemaTest, NewerDatabaseIsRefusedNamingBothVersions) {
  ScratchDir dir;
  const std::string path = dir.File("records.db");
  ASSERT_TRUE(RecordStore::Open(path).ok());
  const int newer = LatestSchemaVersion() + 7;
  ExecRaw(path, "PRAGMA user_version = " + std::to_string(newer));

  auto store = RecordStore::Open(path);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string message = Message(store.status());
  EXPECT_NE(message.find(path), std::string::npos) << message;
  EXPECT_NE(message.find("schema version " + std::to_string(newer)), std::string::npos) << message;
  EXPECT_NE(message.find("(" + std::to_string(LatestSchemaVersion()) + ")"), std::string::npos) << message;
  EXPECT_NE(message.find("upgrade fl-server"), std::string::npos) << message;

  auto reader = RecordReader::Open(path);
  ASSERT_FALSE(reader.ok());
  EXPECT_NE(Message(reader.status()).find("upgrade fl-server"), std::string::npos) << reader.status();

  // Nothing was changed by the refusal.
  sqlite::Database db = OpenRaw(path);
  EXPECT_EQ(Int(db, "PRAGMA user_version"), newer);
}

TEST(SchemaTest, OlderDatabaseMigratesAndKeepsItsRows) {
  ScratchDir dir;
  sqlite::Database db = OpenRaw(dir.File("t.db"));
  const Migration v1_only[] = {kTestV1};
  ASSERT_TRUE(MigrateSchema(db, v1_only).ok());
  EXPECT_EQ(Int(db, "PRAGMA user_version"), 1);
  ASSERT_TRUE(db.Exec("INSERT INTO a (id, x) VALUES (1, 'kept')").ok());

  const Migration both[] = {kTestV1, kTestV2};
  absl::Status s = MigrateSchema(db, both);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(Int(db, "PRAGMA user_version"), 2);
  EXPECT_EQ(Int(db, "SELECT count(*) FROM a WHERE x = 'kept' AND y IS NULL"), 1);
  EXPECT_EQ(Int(db, "SELECT count(*) FROM sqlite_schema WHERE name = 'b'"), 1);
}

TEST(SchemaTest, HandWrittenVersionOneFileMigratesToLatest) {
  // A file as an older build would have left it: version-1 schema only, user_version 1. Today the latest is
  // 1, so this is "already current"; when migration 2 lands this test starts exercising the upgrade.
  ScratchDir dir;
  const std::string path = dir.File("records.db");
  {
    sqlite::Database db = OpenRaw(path);
    ASSERT_TRUE(MigrateSchema(db, SchemaMigrations().first(1)).ok());
    ASSERT_TRUE(db.Exec("INSERT INTO experiments (id, name, started_unix_ms, software_version) "
                        "VALUES ('old', 'old run', 1, '0.0.1')")
                    .ok());
  }
  auto store = RecordStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->Close().ok());
  auto reader = RecordReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  auto old = (*reader)->GetExperiment("old");
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ(old->name, "old run");
  EXPECT_EQ(old->status, ExperimentStatus::kRunning);
  EXPECT_EQ(old->config_json, "{}");
}

// A database an fl-server of schema v5 wrote (a classifier's experiment with an evaluated round) opens with
// this build: migrated to v6, its rows kept, the new columns NULL (a task of NULL reads as "": the
// experiment predates tasks, and was a classifier).
TEST(SchemaTest, VersionFiveDatabaseWithRowsMigratesToSix) {
  ScratchDir dir;
  const std::string path = dir.File("records.db");
  {
    sqlite::Database db = OpenRaw(path);
    ASSERT_TRUE(MigrateSchema(db, SchemaMigrations().first(5)).ok());
    ASSERT_TRUE(db.Exec(R"sql(
      INSERT INTO experiments (id, name, started_unix_ms, software_version) VALUES ('v5', 'old run', 1, '0.5');
      INSERT INTO clients (experiment_id, client_id, joined_unix_ms) VALUES ('v5', 'c1', 2);
      INSERT INTO rounds (experiment_id, round, attempt, status, started_unix_ms, ended_unix_ms, duration_ms,
                          model_version, eval_loss, eval_accuracy, eval_num_examples)
        VALUES ('v5', 1, 1, 'committed', 3, 4, 1.5, 1, 0.5, 0.8125, 100);
      INSERT INTO evaluations (experiment_id, round, attempt, client_id, num_examples, loss, accuracy, eval_ms)
        VALUES ('v5', 1, 1, 'c1', 100, 0.5, 0.8125, 9);
    )sql")
                    .ok());
    EXPECT_EQ(Int(db, "PRAGMA user_version"), 5);
  }
  ASSERT_GE(LatestSchemaVersion(), 6);
  auto store = RecordStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->Close().ok());
  auto reader = RecordReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  auto old = (*reader)->GetExperiment("v5");
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ(old->task, "");
  auto rounds = (*reader)->ListRounds("v5");
  ASSERT_TRUE(rounds.ok()) << rounds.status();
  ASSERT_EQ(rounds->size(), 1u);
  EXPECT_EQ((*rounds)[0].eval_accuracy, 0.8125);
  EXPECT_FALSE((*rounds)[0].eval_mae.has_value());
  EXPECT_FALSE((*rounds)[0].eval_perplexity.has_value());
  auto evaluations = (*reader)->ListEvaluations("v5", 1);
  ASSERT_TRUE(evaluations.ok()) << evaluations.status();
  ASSERT_EQ(evaluations->size(), 1u);
  EXPECT_EQ((*evaluations)[0].accuracy, 0.8125);
  EXPECT_FALSE((*evaluations)[0].mae.has_value());
  EXPECT_EQ((*evaluations)[0].reject_reason, "");
  sqlite::Database db = OpenRaw(path);
  EXPECT_EQ(Int(db, "SELECT count(*) FROM pragma_table_info('experiments') WHERE name = 'task'"), 1);
  EXPECT_EQ(Int(db,
                "SELECT count(*) FROM pragma_table_info('rounds') WHERE name IN ('eval_mae', "
                "'eval_perplexity')"),
            2);
  EXPECT_EQ(Int(db,
                "SELECT count(*) FROM pragma_table_info('evaluations') WHERE name IN ('mae', "
                "'reject_reason')"),
            2);
}

// A database an fl-server of schema v6 wrote (its DDL is migrations 1..6, which never change) opens with this
// build: migrated to v7, its rows kept, and client events can be stored for the clients it already had.
TEST(SchemaTest, VersionSixDatabaseWithRowsMigratesToSeven) {
  ScratchDir dir;
  const std::string path = dir.File("records.db");
  {
    sqlite::Database db = OpenRaw(path);
    ASSERT_TRUE(MigrateSchema(db, SchemaMigrations().first(6)).ok());
    ASSERT_TRUE(db.Exec(R"sql(
      INSERT INTO experiments (id, name, started_unix_ms, software_version, task)
        VALUES ('v6', 'old run', 1, '0.6', 'regression');
      INSERT INTO clients (experiment_id, client_id, joined_unix_ms) VALUES ('v6', 'c1', 2);
      INSERT INTO rounds (experiment_id, round, attempt, status, started_unix_ms, ended_unix_ms, duration_ms,
                          model_version, eval_loss, eval_mae, eval_num_examples)
        VALUES ('v6', 1, 0, 'committed', 3, 4, 1.5, 1, 0.5, 0.25, 100);
    )sql")
                    .ok());
    EXPECT_EQ(Int(db, "PRAGMA user_version"), 6);
    EXPECT_EQ(Int(db, "SELECT count(*) FROM sqlite_schema WHERE name = 'client_events'"), 0);
  }
  ASSERT_GE(LatestSchemaVersion(), 7);
  auto store = RecordStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->settings().schema_version, LatestSchemaVersion());
  ASSERT_TRUE(
      (*store)
          ->Enqueue(ClientEventRecord{"v6", "c1", ClientEventKind::kReportRefused, 1, "t1", "uplink report refused", 5})
          .ok());
  absl::Status flushed = (*store)->Close();
  ASSERT_TRUE(flushed.ok()) << flushed;

  auto reader = RecordReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  auto old = (*reader)->GetExperiment("v6");
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ(old->task, "regression");
  auto rounds = (*reader)->ListRounds("v6");
  ASSERT_TRUE(rounds.ok()) << rounds.status();
  ASSERT_EQ(rounds->size(), 1u);
  EXPECT_EQ((*rounds)[0].eval_mae, 0.25);
  auto events = (*reader)->ListClientEvents("v6");
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ((*events)[0].reason, "uplink report refused");
  EXPECT_EQ((*events)[0].round, 1);
  sqlite::Database db = OpenRaw(path);
  EXPECT_EQ(Int(db, "SELECT count(*) FROM sqlite_schema WHERE type = 'index' AND name = 'client_events_by_client'"), 1);
  EXPECT_EQ(Int(db, "SELECT count(*) FROM pragma_foreign_key_list('client_events') WHERE \"table\" = 'clients'"), 2);
}

// Every row of a query, each row's columns joined with '|': for comparing what sqlite reports about two files.
std::vector<std::string> Rows(sqlite::Database& db, const std::string& sql) {
  std::vector<std::string> out;
  absl::StatusOr<sqlite::Statement> st = db.Prepare(sql);
  EXPECT_TRUE(st.ok()) << st.status();
  if (!st.ok()) return out;
  while (true) {
    absl::StatusOr<bool> row = st->Step(sql);
    EXPECT_TRUE(row.ok()) << row.status();
    if (!row.ok() || !*row) break;
    std::string line;
    for (int i = 0; i < st->ColumnCount(); ++i) {
      line += (i == 0 ? "" : "|") + (st->ColumnIsNull(i) ? std::string("NULL") : st->ColumnText(i));
    }
    out.push_back(line);
  }
  return out;
}

// The schema of a file as sqlite reports it: per table its columns (pragma table_info: name, type, NOT NULL,
// default, primary key position), foreign keys and indexes (with their columns and partial-ness), and every
// table's and index's SQL with the whitespace taken out (which holds the CHECK constraints pragmas do not show;
// an ALTER TABLE ADD COLUMN puts its column after the last one, where a CREATE TABLE lists it).
std::vector<std::string> SchemaFacts(sqlite::Database& db) {
  std::vector<std::string> facts;
  auto add = [&](const std::string& what, const std::vector<std::string>& rows) {
    for (const std::string& r : rows) facts.push_back(what + ": " + r);
  };
  facts.push_back("user_version " + std::to_string(Int(db, "PRAGMA user_version")));
  facts.push_back("application_id " + std::to_string(Int(db, "PRAGMA application_id")));
  for (const std::string& table : Rows(db, "SELECT name FROM sqlite_schema WHERE type = 'table' ORDER BY name")) {
    add(table + " column", Rows(db, "SELECT cid, name, type, \"notnull\", dflt_value, pk FROM pragma_table_info('" +
                                        table + "') ORDER BY cid"));
    add(table + " foreign key",
        Rows(db,
             "SELECT id, seq, \"table\", \"from\", \"to\", on_update, on_delete, \"match\" FROM "
             "pragma_foreign_key_list('" +
                 table + "') ORDER BY id, seq"));
    for (const std::string& index : Rows(db, "SELECT name FROM pragma_index_list('" + table + "') ORDER BY name")) {
      add(table + " index", Rows(db, "SELECT name, \"unique\", origin, partial FROM pragma_index_list('" + table +
                                         "') WHERE name = '" + index + "'"));
      add(index + " key", Rows(db, "SELECT seqno, cid, name, \"desc\", coll, key FROM pragma_index_xinfo('" + index +
                                       "') ORDER BY seqno"));
    }
  }
  add("sql", Rows(db,
                  "SELECT type || ' ' || name || ' on ' || tbl_name || ': ' || "
                  "replace(replace(replace(replace(coalesce(sql, ''), ' ', ''), char(10), ''), char(13), ''), "
                  "char(9), '') FROM sqlite_schema WHERE name NOT LIKE 'sqlite_%' ORDER BY name"));
  return facts;
}

// A new file is created from the column declarations (record_columns.cc) in one step; a file an older fl-server
// wrote reaches the newest version through the migrations as they shipped. Both must end with the same schema,
// column by column and constraint by constraint, from every older version.
TEST(SchemaTest, NewDatabaseHasTheSchemaTheMigrationsReach) {
  ScratchDir dir;
  const std::string fresh_path = dir.File("fresh.db");
  ASSERT_TRUE(RecordStore::Open(fresh_path).ok());
  sqlite::Database fresh = OpenRaw(fresh_path);
  const std::vector<std::string> expected = SchemaFacts(fresh);
  // The new file did not run the migrations: its CREATE TABLE of client_rounds lists the v3 columns itself.
  EXPECT_EQ(Int(fresh,
                "SELECT count(*) FROM sqlite_schema WHERE name = 'client_rounds' AND "
                "sql LIKE 'CREATE TABLE client_rounds (%downlink_server_ms REAL CHECK%PRIMARY KEY%'"),
            1);
  ASSERT_GT(expected.size(), 100u);

  for (int from = 1; from < LatestSchemaVersion(); ++from) {
    SCOPED_TRACE("migrated from version " + std::to_string(from));
    // StrCat rather than "v" + std::to_string(...): GCC 12 reports a false -Wrestrict on the latter here.
    const std::string path = dir.File(fl::StrCat("v", from, ".db"));
    {
      sqlite::Database db = OpenRaw(path);
      ASSERT_TRUE(MigrateSchema(db, SchemaMigrations().first(static_cast<size_t>(from))).ok());
    }
    ASSERT_TRUE(RecordStore::Open(path).ok());
    sqlite::Database migrated = OpenRaw(path);
    const std::vector<std::string> got = SchemaFacts(migrated);
    EXPECT_EQ(got, expected);
    // On a difference, name the first fact that differs rather than only dumping both lists.
    for (size_t i = 0; i < std::min(got.size(), expected.size()); ++i) {
      if (got[i] != expected[i]) {
        ADD_FAILURE() << "first difference:\n  migrated: " << got[i] << "\n  new:      " << expected[i];
        break;
      }
    }
  }
}

// The reader of old files trusts each column's declared `since_version` (a newer column reads as NULL), so the
// declarations must say exactly which columns each version has.
TEST(SchemaTest, ColumnDeclarationsSayWhichVersionAddedEachColumn) {
  ScratchDir dir;
  for (int version = 1; version <= LatestSchemaVersion(); ++version) {
    SCOPED_TRACE("version " + std::to_string(version));
    sqlite::Database db = OpenRaw(dir.File(fl::StrCat("v", version, ".db")));
    ASSERT_TRUE(MigrateSchema(db, SchemaMigrations().first(static_cast<size_t>(version))).ok());
    std::vector<std::string> declared_tables;
    for (const TableSpec* table : RecordTables()) {
      if (table->since_version > version) continue;
      declared_tables.push_back(table->name);
      std::vector<std::string> declared;
      for (const ColumnSpec& c : table->columns) {
        if (c.since_version <= version) declared.push_back(c.name);
      }
      EXPECT_EQ(Rows(db, "SELECT name FROM pragma_table_info('" + table->name + "') ORDER BY cid"), declared)
          << table->name;
    }
    std::sort(declared_tables.begin(), declared_tables.end());
    EXPECT_EQ(Rows(db, "SELECT name FROM sqlite_schema WHERE type = 'table' ORDER BY name"), declared_tables);
  }
}

// A database an fl-server of schema v7 wrote (its DDL is migrations 1..7, which never change) opens with this
// build: migrated to v8, its rows (client events among them) kept, and security events can be stored for its
// experiment, for peers that never became clients.
TEST(SchemaTest, VersionSevenDatabaseWithRowsMigratesToEight) {
  ScratchDir dir;
  const std::string path = dir.File("records.db");
  {
    sqlite::Database db = OpenRaw(path);
    ASSERT_TRUE(MigrateSchema(db, SchemaMigrations().first(7)).ok());
    ASSERT_TRUE(db.Exec(R"sql(
      INSERT INTO experiments (id, name, started_unix_ms, software_version, task)
        VALUES ('v7', 'old run', 1, '0.7', 'classification');
      INSERT INTO clients (experiment_id, client_id, joined_unix_ms) VALUES ('v7', 'c1', 2);
      INSERT INTO client_events (experiment_id, client_id, kind, reason, at_unix_ms)
        VALUES ('v7', 'c1', 'session_closed', 'hello timeout', 3);
    )sql")
                    .ok());
    EXPECT_EQ(Int(db, "PRAGMA user_version"), 7);
    EXPECT_EQ(Int(db, "SELECT count(*) FROM sqlite_schema WHERE name = 'security_events'"), 0);
  }
  // Before it is migrated, this build reads it as it is: no security events.
  {
    auto old_reader = RecordReader::OpenAnyVersion(path);
    ASSERT_TRUE(old_reader.ok()) << old_reader.status();
    EXPECT_EQ((*old_reader)->schema_version(), 7);
    auto none = (*old_reader)->ListSecurityEvents("v7");
    ASSERT_TRUE(none.ok()) << none.status();
    EXPECT_TRUE(none->empty());
  }
  ASSERT_GE(LatestSchemaVersion(), 8);
  auto store = RecordStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->settings().schema_version, LatestSchemaVersion());
  const SecurityEventRecord event{0,  "v7",    SecurityRefusal::kBadToken,  "ipv4:127.0.0.1:50514",
                                  "", "ghost", "unknown client id 'ghost'", 4};
  ASSERT_TRUE((*store)->Enqueue(event).ok());
  absl::Status flushed = (*store)->Close();
  ASSERT_TRUE(flushed.ok()) << flushed;

  auto reader = RecordReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  auto client_events = (*reader)->ListClientEvents("v7");
  ASSERT_TRUE(client_events.ok()) << client_events.status();
  ASSERT_EQ(client_events->size(), 1u);
  EXPECT_EQ((*client_events)[0].reason, "hello timeout");
  auto events = (*reader)->ListSecurityEvents("v7");
  ASSERT_TRUE(events.ok()) << events.status();
  SecurityEventRecord stored = event;
  stored.id = 1;
  EXPECT_EQ(*events, std::vector<SecurityEventRecord>{stored});
  sqlite::Database db = OpenRaw(path);
  EXPECT_EQ(Int(db, "SELECT count(*) FROM sqlite_schema WHERE type = 'index' AND name = 'security_events_by_reason'"),
            1);
  EXPECT_EQ(Int(db, "SELECT count(*) FROM pragma_foreign_key_list('security_events') WHERE \"table\" = 'experiments'"),
            1);
  EXPECT_EQ(Int(db, "SELECT count(*) FROM pragma_foreign_key_list('security_events') WHERE \"table\" = 'clients'"), 0);
}

// A database an fl-server of schema v8 wrote opens with this build: v9 rebuilds client_rounds (the outcome CHECK
// gains 'cancelled' and 'folded'), keeping every row and column, the index and the foreign keys; experiments gain
// `aggregation` (NULL for the old run: synchronous). Before the migration this build reads the file as it is, the
// v9 columns as NULL; after it, the new outcomes and columns can be stored, and the CHECKs hold.
TEST(SchemaTest, VersionEightDatabaseWithRowsMigratesToNine) {
  ScratchDir dir;
  const std::string path = dir.File("records.db");
  {
    sqlite::Database db = OpenRaw(path);
    ASSERT_TRUE(MigrateSchema(db, SchemaMigrations().first(8)).ok());
    ASSERT_TRUE(db.Exec(R"sql(
      INSERT INTO experiments (id, name, started_unix_ms, software_version, task)
        VALUES ('v8', 'old run', 1, '0.8', 'classification');
      INSERT INTO clients (experiment_id, client_id, joined_unix_ms) VALUES ('v8', 'c1', 2), ('v8', 'c2', 2);
      INSERT INTO rounds (experiment_id, round, attempt, status, started_unix_ms, ended_unix_ms, duration_ms,
                          model_version)
        VALUES ('v8', 0, 0, 'committed', 3, 4, 1.5, 1), ('v8', 1, 0, 'committed', 5, 6, 1.5, 2);
      INSERT INTO client_rounds (experiment_id, round, attempt, client_id, outcome, num_examples, codec, train_loss,
                                 downlink_server_ms)
        VALUES ('v8', 0, 0, 'c1', 'ok', 100, 'fp32', 0.5, 7.25), ('v8', 0, 0, 'c2', 'late', NULL, NULL, NULL, NULL);
      INSERT INTO client_events (experiment_id, client_id, kind, reason, at_unix_ms)
        VALUES ('v8', 'c1', 'session_closed', 'hello timeout', 3);
    )sql")
                    .ok());
  }
  {
    auto old_reader = RecordReader::OpenAnyVersion(path);
    ASSERT_TRUE(old_reader.ok()) << old_reader.status();
    EXPECT_EQ((*old_reader)->schema_version(), 8);
    auto rows = (*old_reader)->ListClientRounds("v8");
    ASSERT_TRUE(rows.ok()) << rows.status();
    ASSERT_EQ(rows->size(), 2u);
    EXPECT_EQ((*rows)[0].num_examples, 100);
    EXPECT_FALSE((*rows)[0].staleness.has_value());
    auto experiment = (*old_reader)->GetExperiment("v8");
    ASSERT_TRUE(experiment.ok()) << experiment.status();
    EXPECT_EQ(experiment->aggregation, "");
  }
  ASSERT_GE(LatestSchemaVersion(), 9);
  {
    auto store = RecordStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    // A cancelled task, in the new vocabulary (a folded row is written by the commit tests).
    ClientRoundRecord cancelled;
    cancelled.experiment_id = "v8";
    cancelled.round = 1;
    cancelled.client_id = "c1";
    cancelled.outcome = ClientOutcome::kCancelled;
    cancelled.train_ms = 12.5;
    ASSERT_TRUE((*store)->Enqueue(cancelled).ok());
    absl::Status flushed = (*store)->Close();
    ASSERT_TRUE(flushed.ok()) << flushed;
  }
  sqlite::Database db = OpenRaw(path);
  EXPECT_EQ(Int(db, "PRAGMA user_version"), LatestSchemaVersion());
  EXPECT_EQ(Int(db, "SELECT count(*) FROM client_rounds WHERE experiment_id = 'v8'"), 3);
  EXPECT_EQ(Int(db,
                "SELECT count(*) FROM client_rounds WHERE client_id = 'c1' AND round = 0 AND outcome = 'ok' AND "
                "num_examples = 100 AND codec = 'fp32' AND train_loss = 0.5 AND downlink_server_ms = 7.25 AND "
                "staleness IS NULL AND folded_into_round IS NULL"),
            1);
  EXPECT_EQ(Int(db, "SELECT count(*) FROM client_rounds WHERE outcome = 'cancelled' AND train_ms = 12.5"), 1);
  EXPECT_EQ(Int(db, "SELECT count(*) FROM experiments WHERE id = 'v8' AND aggregation IS NULL"), 1);
  EXPECT_EQ(Int(db, "SELECT count(*) FROM sqlite_schema WHERE name LIKE 'client_rounds_v8%'"), 0);
  EXPECT_EQ(Int(db,
                "SELECT count(*) FROM sqlite_schema WHERE type = 'index' AND name = 'client_rounds_by_client' AND "
                "tbl_name = 'client_rounds'"),
            1);
  EXPECT_EQ(Int(db, "SELECT count(*) FROM pragma_foreign_key_list('client_rounds')"), 5);
  EXPECT_EQ(Int(db, "SELECT count(*) FROM client_events"), 1);
  // The CHECKs of v9: no unknown outcome, no negative staleness, a fold only into a later round.
  EXPECT_FALSE(db.Exec("UPDATE client_rounds SET outcome = 'lost' WHERE client_id = 'c2'").ok());
  EXPECT_FALSE(db.Exec("UPDATE client_rounds SET staleness = -1 WHERE client_id = 'c2'").ok());
  EXPECT_FALSE(db.Exec("UPDATE client_rounds SET folded_into_round = 0 WHERE client_id = 'c2'").ok());
  EXPECT_TRUE(db.Exec("UPDATE client_rounds SET outcome = 'folded', folded_into_round = 1, staleness = 1, "
                      "staleness_weight = 0.5 WHERE client_id = 'c2'")
                  .ok());
  EXPECT_FALSE(db.Exec("UPDATE experiments SET aggregation = 'eventual' WHERE id = 'v8'").ok());
  EXPECT_TRUE(db.Exec("UPDATE experiments SET aggregation = 'buffered' WHERE id = 'v8'").ok());
}

// v10 adds the central differential privacy columns to `rounds`: a v9 file's rows read as before, with NULL there,
// and a private round written after the migration reads back with its epsilon, clip norm and noise multiplier.
TEST(SchemaTest, VersionNineDatabaseWithRowsMigratesToTen) {
  ScratchDir dir;
  const std::string path = dir.File("records.db");
  {
    sqlite::Database db = OpenRaw(path);
    ASSERT_TRUE(MigrateSchema(db, SchemaMigrations().first(9)).ok());
    ASSERT_TRUE(db.Exec(R"sql(
      INSERT INTO experiments (id, name, started_unix_ms, software_version, task, aggregation)
        VALUES ('v9', 'old run', 1, '0.9', 'classification', 'synchronous');
      INSERT INTO rounds (experiment_id, round, attempt, status, started_unix_ms, ended_unix_ms, duration_ms,
                          model_version, eval_loss, eval_accuracy, eval_num_examples)
        VALUES ('v9', 1, 0, 'committed', 3, 4, 1.5, 1, 0.5, 0.75, 100);
    )sql")
                    .ok());
    EXPECT_EQ(Int(db, "PRAGMA user_version"), 9);
  }
  ASSERT_GE(LatestSchemaVersion(), 10);
  auto store = RecordStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  RoundRecord private_round;
  private_round.experiment_id = "v9";
  private_round.round = 2;
  private_round.status = RoundStatus::kCommitted;
  private_round.started_unix_ms = 5;
  private_round.ended_unix_ms = 6;
  private_round.model_version = 2;
  private_round.dp_epsilon = 0.72;
  private_round.dp_clip_norm = 0.5;
  private_round.dp_noise_multiplier = 1.3;
  ASSERT_TRUE((*store)->Enqueue(private_round).ok());
  absl::Status flushed = (*store)->Close();
  ASSERT_TRUE(flushed.ok()) << flushed;

  auto reader = RecordReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  auto rounds = (*reader)->ListRounds("v9");
  ASSERT_TRUE(rounds.ok()) << rounds.status();
  ASSERT_EQ(rounds->size(), 2u);
  EXPECT_EQ((*rounds)[0].eval_accuracy, 0.75);
  EXPECT_FALSE((*rounds)[0].dp_epsilon.has_value()) << "a round from before v10 had no privacy";
  EXPECT_EQ((*rounds)[1].dp_epsilon, 0.72);
  EXPECT_EQ((*rounds)[1].dp_clip_norm, 0.5);
  EXPECT_EQ((*rounds)[1].dp_noise_multiplier, 1.3);
  sqlite::Database db = OpenRaw(path);
  EXPECT_FALSE(db.Exec("UPDATE rounds SET dp_epsilon = -1 WHERE round = 2").ok()) << "epsilon >= 0 (CHECK)";
}

// A database an fl-server of schema v10 wrote opens with this build: v11 rebuilds security_events (the reason CHECK
// gains 'secagg'), keeping every row with its id, the index and the foreign key; rounds gain secagg_survivors and
// secagg_dropped (NULL for the old rounds); secagg_stages is created. Before the migration this build reads the file
// as it is (no stages, NULL counts); after it, secure-aggregation rows and 'secagg' refusals store and read back.
TEST(SchemaTest, VersionTenDatabaseWithRowsMigratesToEleven) {
  ScratchDir dir;
  const std::string path = dir.File("records.db");
  {
    sqlite::Database db = OpenRaw(path);
    ASSERT_TRUE(MigrateSchema(db, SchemaMigrations().first(10)).ok());
    ASSERT_TRUE(db.Exec(R"sql(
      INSERT INTO experiments (id, name, started_unix_ms, software_version, task, aggregation)
        VALUES ('v10', 'old run', 1, '0.10', 'classification', 'synchronous');
      INSERT INTO clients (experiment_id, client_id, joined_unix_ms) VALUES ('v10', 'c1', 2), ('v10', 'c2', 2);
      INSERT INTO rounds (experiment_id, round, attempt, status, started_unix_ms, ended_unix_ms, duration_ms,
                          model_version, dp_epsilon)
        VALUES ('v10', 0, 0, 'committed', 3, 4, 1.5, 1, 0.5);
      INSERT INTO client_rounds (experiment_id, round, attempt, client_id, outcome, num_examples)
        VALUES ('v10', 0, 0, 'c1', 'ok', 100);
      INSERT INTO security_events (id, experiment_id, reason, peer, identity, claimed, detail, at_unix_ms)
        VALUES (5, 'v10', 'bad_token', 'ipv4:10.0.0.1:4000', NULL, 'ghost', 'unknown client id', 5),
               (9, 'v10', 'join_rate', 'ipv4:10.0.0.2:4000', 'alice', 'alice', 'too many joins', 6);
    )sql")
                    .ok());
    EXPECT_EQ(Int(db, "PRAGMA user_version"), 10);
    EXPECT_FALSE(db.Exec("INSERT INTO security_events (experiment_id, reason, peer, detail, at_unix_ms) "
                         "VALUES ('v10', 'secagg', 'p', 'd', 7)")
                     .ok())
        << "v10 has no 'secagg' reason";
  }
  {
    auto old_reader = RecordReader::OpenAnyVersion(path);
    ASSERT_TRUE(old_reader.ok()) << old_reader.status();
    EXPECT_EQ((*old_reader)->schema_version(), 10);
    auto stages = (*old_reader)->ListSecAggStages("v10");
    ASSERT_TRUE(stages.ok()) << stages.status();
    EXPECT_TRUE(stages->empty());
    auto rounds = (*old_reader)->ListRounds("v10");
    ASSERT_TRUE(rounds.ok()) << rounds.status();
    ASSERT_EQ(rounds->size(), 1u);
    EXPECT_FALSE((*rounds)[0].secagg_survivors.has_value());
    EXPECT_FALSE((*old_reader)->HasColumn("rounds", "secagg_dropped"));
  }
  ASSERT_GE(LatestSchemaVersion(), 11);
  RoundRecord secure_round = testing_util::Round("v10", 1);
  secure_round.secagg_survivors = 1;
  secure_round.secagg_dropped = 1;
  const SecAggStageRecord ok_stage{"v10", 1,   0,   "c1", SecAggStage::kShareKeys, SecAggStageOutcome::kOk, 11.5,
                                   2.25,  300, 600, ""};
  const SecAggStageRecord dropped_stage{"v10",
                                        1,
                                        0,
                                        "c2",
                                        SecAggStage::kMaskedUpload,
                                        SecAggStageOutcome::kDropped,
                                        12.5,
                                        std::nullopt,
                                        0,
                                        0,
                                        "no masked upload by the stage's deadline (30 s)"};
  const SecurityEventRecord refusal{0,     "v10", SecurityRefusal::kSecAgg,       "ipv4:10.0.0.3:4000",
                                    "bob", "bob", "share for round 7 in round 1", 13};
  {
    auto store = RecordStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    for (Record r : std::vector<Record>{secure_round, ok_stage, dropped_stage, refusal}) {
      ASSERT_TRUE((*store)->Enqueue(std::move(r)).ok());
    }
    absl::Status flushed = (*store)->Close();
    ASSERT_TRUE(flushed.ok()) << flushed;
  }
  auto reader = RecordReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  auto events = (*reader)->ListSecurityEvents("v10");
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_EQ(events->size(), 3u);
  EXPECT_EQ((*events)[0].id, 5);
  EXPECT_EQ((*events)[0].reason, SecurityRefusal::kBadToken);
  EXPECT_EQ((*events)[0].claimed, "ghost");
  EXPECT_EQ((*events)[1].id, 9);
  EXPECT_EQ((*events)[1].identity, "alice");
  SecurityEventRecord stored_refusal = refusal;
  stored_refusal.id = 10;  // after the highest id kept
  EXPECT_EQ((*events)[2], stored_refusal);
  auto rounds = (*reader)->ListRounds("v10");
  ASSERT_TRUE(rounds.ok()) << rounds.status();
  ASSERT_EQ(rounds->size(), 2u);
  EXPECT_EQ((*rounds)[0].dp_epsilon, 0.5);
  EXPECT_FALSE((*rounds)[0].secagg_survivors.has_value()) << "a round from before v11 had no secure aggregation";
  EXPECT_EQ((*rounds)[1], secure_round);
  auto stages = (*reader)->ListSecAggStages("v10");
  ASSERT_TRUE(stages.ok()) << stages.status();
  EXPECT_EQ(*stages, (std::vector<SecAggStageRecord>{ok_stage, dropped_stage}));

  sqlite::Database db = OpenRaw(path);
  EXPECT_EQ(Int(db, "SELECT count(*) FROM client_rounds WHERE experiment_id = 'v10' AND num_examples = 100"), 1);
  EXPECT_EQ(Int(db, "SELECT count(*) FROM sqlite_schema WHERE name LIKE 'security_events_v10%'"), 0);
  EXPECT_EQ(Int(db,
                "SELECT count(*) FROM sqlite_schema WHERE type = 'index' AND name = 'security_events_by_reason' AND "
                "tbl_name = 'security_events'"),
            1);
  EXPECT_EQ(Int(db, "SELECT count(*) FROM pragma_foreign_key_list('security_events') WHERE \"table\" = 'experiments'"),
            1);
  EXPECT_EQ(Int(db, "SELECT count(*) FROM pragma_foreign_key_list('secagg_stages')"), 5);
  // The CHECKs of v11.
  EXPECT_FALSE(db.Exec("UPDATE security_events SET reason = 'masked' WHERE id = 10").ok());
  EXPECT_FALSE(db.Exec("UPDATE rounds SET secagg_survivors = -1 WHERE round = 1").ok());
  EXPECT_FALSE(db.Exec("UPDATE rounds SET secagg_dropped = -1 WHERE round = 1").ok());
  EXPECT_FALSE(db.Exec("UPDATE secagg_stages SET stage = 'train' WHERE client_id = 'c1'").ok());
  EXPECT_FALSE(db.Exec("UPDATE secagg_stages SET outcome = 'late' WHERE client_id = 'c1'").ok());
  EXPECT_FALSE(db.Exec("UPDATE secagg_stages SET duration_ms = -0.5 WHERE client_id = 'c1'").ok());
  EXPECT_FALSE(db.Exec("UPDATE secagg_stages SET bytes_down = -1 WHERE client_id = 'c1'").ok());
  EXPECT_FALSE(db.Exec("UPDATE secagg_stages SET bytes_up = -1 WHERE client_id = 'c1'").ok());
  EXPECT_FALSE(db.Exec("UPDATE secagg_stages SET detail = 'why' WHERE client_id = 'c1'").ok()) << "ok has no detail";
  EXPECT_TRUE(db.Exec("UPDATE secagg_stages SET outcome = 'refused', detail = 'bad tag' WHERE client_id = 'c1'").ok());
}

// The store refuses a secure-aggregation row without its parents (the round attempt, the client) and with a value
// out of range, each alone: the rest of the batch lands. Its detail is bounded like a client event's reason, and a
// client with such rows is not forgotten.
TEST(SchemaTest, SecAggStageRowsNeedTheirParentsAndBoundTheirDetail) {
  ScratchDir dir;
  const std::string path = dir.File("records.db");
  auto store = testing_util::MustOpen(path);
  ASSERT_NE(store, nullptr);
  for (Record r : std::vector<Record>{testing_util::Experiment("e"), testing_util::Client("e", "c1"),
                                      testing_util::Round("e", 0)}) {
    ASSERT_TRUE(store->Enqueue(std::move(r)).ok());
  }
  ASSERT_TRUE(store->Flush().ok());
  SecAggStageRecord good{"e", 0,   0,  "c1", SecAggStage::kUnmask,  SecAggStageOutcome::kRefused,
                         1.5, 0.5, 10, 20,   std::string(5000, 'x')};
  SecAggStageRecord no_round = good;
  no_round.round = 1;
  no_round.stage = SecAggStage::kAdvertiseKeys;
  SecAggStageRecord no_client = good;
  no_client.client_id = "ghost";
  SecAggStageRecord negative = good;
  negative.stage = SecAggStage::kShareKeys;
  negative.duration_ms = -1;
  for (const SecAggStageRecord& r : {no_round, good, no_client, negative}) ASSERT_TRUE(store->Enqueue(r).ok());
  absl::Status flushed = store->Flush();
  EXPECT_FALSE(flushed.ok());
  EXPECT_NE(std::string(flushed.message()).find("secure-aggregation stage (experiment e, round 1"), std::string::npos)
      << flushed;
  EXPECT_EQ(store->stats().failed, 3u);
  ASSERT_TRUE(store->Enqueue(ClientForgottenRecord{"e", "c1"}).ok());
  ASSERT_TRUE(store->Close().ok());

  auto reader = testing_util::MustRead(path);
  ASSERT_NE(reader, nullptr);
  auto stages = reader->ListSecAggStages("e");
  ASSERT_TRUE(stages.ok()) << stages.status();
  ASSERT_EQ(stages->size(), 1u);
  EXPECT_EQ((*stages)[0].detail.size(), kMaxSecAggDetailBytes);
  EXPECT_EQ((*stages)[0].detail, BoundText(good.detail, kMaxSecAggDetailBytes));
  EXPECT_EQ(testing_util::Count(*reader, "SELECT count(*) FROM clients WHERE client_id = 'c1'"), 1)
      << "a client with secure-aggregation rows is kept";
}
TEST(SchemaTest, FailedMigrationLeavesThePreviousVersion) {
  ScratchDir dir;
  sqlite::Database db = OpenRaw(dir.File("t.db"));
  const Migration v1_only[] = {kTestV1};
  ASSERT_TRUE(MigrateSchema(db, v1_only).ok());
  const Migration broken_v2{2, "half broken", "CREATE TABLE c (id INTEGER); INSERT INTO no_such_table VALUES (1);",
                            false};
  const Migration list[] = {kTestV1, broken_v2};
  absl::Status s = MigrateSchema(db, list);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(Message(s).find("migration to schema version 2 (half broken)"), std::string::npos) << s;
  EXPECT_NE(Message(s).find("no such table: no_such_table"), std::string::npos) << s;
  EXPECT_EQ(Int(db, "PRAGMA user_version"), 1);
  EXPECT_EQ(Int(db, "SELECT count(*) FROM sqlite_schema WHERE name = 'c'"), 0);  // rolled back whole
}

TEST(SchemaTest, ForeignKeysOffMigrationRebuildsATableAndChecksKeys) {
  ScratchDir dir;
  sqlite::Database db = OpenRaw(dir.File("t.db"));
  ASSERT_TRUE(db.Exec("PRAGMA foreign_keys = ON").ok());
  const Migration both[] = {kTestV1, kTestV2};
  ASSERT_TRUE(MigrateSchema(db, both).ok());
  ASSERT_TRUE(db.Exec("INSERT INTO a (id, x) VALUES (1, 'one'); INSERT INTO b (a_id) VALUES (1);").ok());

  // SQLite's table rebuild: with enforcement on, DROP TABLE a would fail (b references it).
  const Migration rebuild{3, "rebuild a",
                          "CREATE TABLE a_new (id INTEGER PRIMARY KEY, x TEXT NOT NULL, y REAL, z TEXT);"
                          "INSERT INTO a_new (id, x, y) SELECT id, x, y FROM a;"
                          "DROP TABLE a; ALTER TABLE a_new RENAME TO a;",
                          true};
  const Migration three[] = {kTestV1, kTestV2, rebuild};
  absl::Status s = MigrateSchema(db, three);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(Int(db, "PRAGMA user_version"), 3);
  EXPECT_EQ(Int(db, "PRAGMA foreign_keys"), 1);  // restored
  EXPECT_EQ(Int(db, "SELECT count(*) FROM a JOIN b ON b.a_id = a.id"), 1);

  // A rebuild that loses a parent row is caught by foreign_key_check and rolled back.
  const Migration lossy{4, "lose rows", "DELETE FROM a;", true};
  const Migration four[] = {kTestV1, kTestV2, rebuild, lossy};
  s = MigrateSchema(db, four);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(Message(s).find("foreign key violations"), std::string::npos) << s;
  EXPECT_EQ(Int(db, "PRAGMA user_version"), 3);
  EXPECT_EQ(Int(db, "SELECT count(*) FROM a"), 1);
  EXPECT_EQ(Int(db, "PRAGMA foreign_keys"), 1);
}

TEST(SchemaTest, InvalidMigrationListIsAnInternalError) {
  ScratchDir dir;
  sqlite::Database db = OpenRaw(dir.File("t.db"));
  const Migration skipped{3, "skips 2", "CREATE TABLE z (id INTEGER);", false};
  const Migration list[] = {kTestV1, skipped};
  absl::Status s = MigrateSchema(db, list);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_EQ(Int(db, "PRAGMA user_version"), 0);
}

TEST(SchemaTest, AnotherProgramsDatabaseIsRefused) {
  ScratchDir dir;
  const std::string with_tables = dir.File("app.db");
  ExecRaw(with_tables, "CREATE TABLE users (id INTEGER PRIMARY KEY)");
  auto store = RecordStore::Open(with_tables);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(Message(store.status()).find("not an fl-testbed records database"), std::string::npos) << store.status();

  const std::string other_app = dir.File("other.db");
  ExecRaw(other_app, "PRAGMA application_id = 1234; PRAGMA user_version = 1;");
  store = RecordStore::Open(other_app);
  ASSERT_FALSE(store.ok());
  EXPECT_NE(Message(store.status()).find("application_id is 0x000004d2"), std::string::npos) << store.status();
}

TEST(SchemaTest, NotADatabaseFileIsDataLossNamingThePath) {
  ScratchDir dir;
  const std::string path = dir.File("notes.txt");
  {
    std::ofstream out(path);
    out << "this is not a database, just some text that is long enough to fill a header page...\n";
  }
  auto store = RecordStore::Open(path);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss) << store.status();
  EXPECT_NE(Message(store.status()).find(path), std::string::npos) << store.status();
}

TEST(SchemaTest, UnopenablePathNamesThePath) {
  ScratchDir dir;
  const std::string path = dir.File("no/such/dir/records.db");
  auto store = RecordStore::Open(path);
  ASSERT_FALSE(store.ok());
  EXPECT_NE(Message(store.status()).find(path), std::string::npos) << store.status();
  EXPECT_NE(Message(store.status()).find("unable to open database file"), std::string::npos) << store.status();

  auto reader = RecordReader::Open(dir.File("missing.db"));
  ASSERT_FALSE(reader.ok());
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kNotFound) << reader.status();
}

TEST(SchemaTest, InMemoryDatabaseIsRefusedBecauseWalIsUnavailable) {
  auto store = RecordStore::Open(":memory:");
  ASSERT_FALSE(store.ok());
  EXPECT_NE(Message(store.status()).find("journal_mode=WAL is not available"), std::string::npos) << store.status();
}

TEST(SchemaTest, ReaderRefusesAnUnmigratedDatabase) {
  ScratchDir dir;
  const std::string path = dir.File("records.db");
  ExecRaw(path, "PRAGMA user_version = 0; VACUUM;");
  auto reader = RecordReader::Open(path);
  ASSERT_FALSE(reader.ok());
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(Message(reader.status()).find("older than this build's"), std::string::npos) << reader.status();
}

TEST(SchemaTest, PragmasAreActuallyOn) {
  ScratchDir dir;
  const std::string path = dir.File("records.db");
  RecordStoreOptions options;
  options.busy_timeout_ms = 1234;
  auto store = RecordStore::Open(path, options);
  ASSERT_TRUE(store.ok()) << store.status();
  const ConnectionSettings& s = (*store)->settings();
  EXPECT_EQ(s.journal_mode, "wal");
  EXPECT_EQ(s.synchronous, 1);  // NORMAL
  EXPECT_EQ(s.foreign_keys, 1);
  EXPECT_EQ(s.busy_timeout_ms, 1234);

  // journal_mode=WAL is persistent in the file: any other connection sees it.
  auto reader = RecordReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  auto mode = (*reader)->QueryText("PRAGMA journal_mode");
  ASSERT_TRUE(mode.ok()) << mode.status();
  EXPECT_EQ(*mode, "wal");
  // foreign_keys is per connection: prove the writer's is on by breaking a key.
  ASSERT_TRUE((*store)->Enqueue(testing_util::Client("no-such-experiment", "c1")).ok());
  absl::Status flushed = (*store)->Flush();
  EXPECT_EQ(flushed.code(), absl::StatusCode::kFailedPrecondition) << flushed;
  EXPECT_NE(Message(flushed).find("FOREIGN KEY constraint failed"), std::string::npos) << flushed;
}

}  // namespace
}  // namespace fl::instrumentation
