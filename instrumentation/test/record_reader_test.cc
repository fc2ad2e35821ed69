// RecordReader: files of every schema version read as they are (OpenAnyVersion), snapshots over several reads,
// the whole-experiment listings fl-report reads, and the refusals of files that are no records database.
#include "fl/instrumentation/record_reader.h"

#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "fl/core/str_cat.h"
#include "fl/instrumentation/record_store.h"
#include "fl/instrumentation/schema.h"
#include "test_util.h"

namespace fl::instrumentation {
namespace {

using testing_util::Client;
using testing_util::ClientRound;
using testing_util::ExecRaw;
using testing_util::Experiment;
using testing_util::Round;
using testing_util::ScratchDir;

std::string Message(const absl::Status& s) { return std::string(s.message()); }

// A file as an fl-server of schema `version` left it: that version's migrations, and rows with the columns of
// version 1, plus one value in each column a later version added that this one has.
void WriteOldFile(const std::string& path, int version) {
  {
    absl::StatusOr<sqlite::Database> db = sqlite::Database::Open(path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
    ASSERT_TRUE(db.ok()) << db.status();
    ASSERT_TRUE(MigrateSchema(*db, SchemaMigrations().first(static_cast<size_t>(version))).ok());
  }
  ExecRaw(path, R"sql(
    INSERT INTO experiments (id, name, started_unix_ms, software_version) VALUES ('old', 'old run', 1, '0.1');
    INSERT INTO clients (experiment_id, client_id, link_kind, joined_unix_ms) VALUES ('old', 'c1', 'wifi', 2);
    INSERT INTO rounds (experiment_id, round, attempt, status, started_unix_ms, ended_unix_ms, duration_ms,
                        model_version, eval_loss, eval_accuracy)
      VALUES ('old', 1, 0, 'committed', 3, 4, 1.5, 1, 0.5, 0.75);
    INSERT INTO client_rounds (experiment_id, round, attempt, client_id, outcome, train_ms, uplink_ms)
      VALUES ('old', 1, 0, 'c1', 'ok', 80, 20);
    INSERT INTO evaluations (experiment_id, round, attempt, client_id, num_examples, loss, accuracy, eval_ms)
      VALUES ('old', 1, 0, 'c1', 100, 0.5, 0.75, 9);
    INSERT INTO checkpoints (experiment_id, round, model_version, path, bytes, fingerprint, created_unix_ms)
      VALUES ('old', 1, 1, '/ckpt/1', 10, '0123456789abcdef', 5);
  )sql");
  if (version >= 2) ExecRaw(path, "UPDATE client_rounds SET clock_offset_ms = 2.5");
  if (version >= 3) ExecRaw(path, "UPDATE client_rounds SET train_start_unix_ms = 1000.5");
  if (version >= 6) ExecRaw(path, "UPDATE experiments SET task = 'regression'; UPDATE rounds SET eval_mae = 0.25");
  if (version >= 7) {
    ExecRaw(path,
            "INSERT INTO client_events (experiment_id, client_id, kind, reason, at_unix_ms) "
            "VALUES ('old', 'c1', 'report_refused', 'bad pong', 6)");
  }
  if (version >= 8) {
    ExecRaw(path,
            "INSERT INTO security_events (experiment_id, reason, peer, claimed, detail, at_unix_ms) "
            "VALUES ('old', 'bad_token', 'ipv4:127.0.0.1:50514', 'c9', 'unknown client id', 7)");
  }
}

// Every version's file reads without migrating: what it has is read, what came later reads as NULL (or no rows).
TEST(RecordReaderTest, OpenAnyVersionReadsEveryVersionAsItIs) {
  ScratchDir dir;
  for (int version = 1; version <= LatestSchemaVersion(); ++version) {
    SCOPED_TRACE(fl::StrCat("schema version ", version));
    const std::string path = dir.File(fl::StrCat("v", version, ".db"));
    WriteOldFile(path, version);
    auto reader = RecordReader::OpenAnyVersion(path);
    ASSERT_TRUE(reader.ok()) << reader.status();
    RecordReader& r = **reader;
    EXPECT_EQ(r.schema_version(), version);
    EXPECT_EQ(r.HasColumn("client_rounds", "clock_offset_ms"), version >= 2);
    EXPECT_EQ(r.HasColumn("client_rounds", "train_start_unix_ms"), version >= 3);
    EXPECT_EQ(r.HasColumn("experiments", "task"), version >= 6);
    EXPECT_EQ(r.HasColumn("client_events", "reason"), version >= 7);
    EXPECT_EQ(r.HasColumn("security_events", "peer"), version >= 8);
    EXPECT_TRUE(r.HasColumn("rounds", "duration_ms"));
    EXPECT_FALSE(r.HasColumn("rounds", "no_such_column"));
    EXPECT_FALSE(r.HasColumn("no_such_table", "id"));

    auto experiment = r.GetExperiment("old");
    ASSERT_TRUE(experiment.ok()) << experiment.status();
    EXPECT_EQ(experiment->name, "old run");
    EXPECT_EQ(experiment->config_json, "{}");
    EXPECT_EQ(experiment->task, version >= 6 ? "regression" : "");
    auto clients = r.ListClients("old");
    ASSERT_TRUE(clients.ok()) << clients.status();
    ASSERT_EQ(clients->size(), 1u);
    EXPECT_EQ((*clients)[0].link_kind, "wifi");
    auto rounds = r.ListRounds("old");
    ASSERT_TRUE(rounds.ok()) << rounds.status();
    ASSERT_EQ(rounds->size(), 1u);
    EXPECT_EQ((*rounds)[0].eval_accuracy, 0.75);
    EXPECT_EQ((*rounds)[0].eval_mae, version >= 6 ? std::optional<double>(0.25) : std::nullopt);
    EXPECT_EQ(*r.CountRounds("old"), 1);
    auto client_rounds = r.ListClientRounds("old");
    ASSERT_TRUE(client_rounds.ok()) << client_rounds.status();
    ASSERT_EQ(client_rounds->size(), 1u);
    const ClientRoundRecord& c = (*client_rounds)[0];
    EXPECT_EQ(c.train_ms, 80);
    EXPECT_EQ(c.clock_offset_ms, version >= 2 ? std::optional<double>(2.5) : std::nullopt);
    EXPECT_EQ(c.train_start_unix_ms, version >= 3 ? std::optional<double>(1000.5) : std::nullopt);
    EXPECT_FALSE(c.downlink_server_ms.has_value());
    auto evaluations = r.ListEvaluations("old");
    ASSERT_TRUE(evaluations.ok()) << evaluations.status();
    ASSERT_EQ(evaluations->size(), 1u);
    EXPECT_EQ((*evaluations)[0].eval_ms, 9);
    EXPECT_EQ((*evaluations)[0].reject_reason, "");
    auto checkpoints = r.ListCheckpoints("old");
    ASSERT_TRUE(checkpoints.ok()) << checkpoints.status();
    EXPECT_EQ(checkpoints->size(), 1u);
    auto events = r.ListClientEvents("old");
    ASSERT_TRUE(events.ok()) << events.status();
    EXPECT_EQ(events->size(), version >= 7 ? 1u : 0u);
    auto security = r.ListSecurityEvents("old");
    ASSERT_TRUE(security.ok()) << security.status();
    ASSERT_EQ(security->size(), version >= 8 ? 1u : 0u);
    if (version >= 8) {
      EXPECT_EQ((*security)[0].reason, SecurityRefusal::kBadToken);
      EXPECT_EQ((*security)[0].claimed, "c9");
      EXPECT_EQ((*security)[0].identity, "");
    }
    for (auto* list : {+[](RecordReader& rr) { return rr.ListIslands("old").status(); },
                       +[](RecordReader& rr) { return rr.ListIslandEpochs("old").status(); },
                       +[](RecordReader& rr) { return rr.ListIslandSyncs("old").status(); }}) {
      absl::Status s = list(r);
      EXPECT_TRUE(s.ok()) << s;
    }
    auto last = r.LastCommittedRound("old");
    ASSERT_TRUE(last.ok()) << last.status();
    EXPECT_EQ((*last)->round, 1);
  }
}

TEST(RecordReaderTest, OpenStillWantsTheLatestVersion) {
  ScratchDir dir;
  const std::string path = dir.File("v2.db");
  WriteOldFile(path, 2);
  auto reader = RecordReader::Open(path);
  ASSERT_FALSE(reader.ok());
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(Message(reader.status()).find("older than this build's"), std::string::npos) << reader.status();
}

TEST(RecordReaderTest, OpenAnyVersionRefusesWhatIsNoRecordsDatabase) {
  ScratchDir dir;
  auto missing = RecordReader::OpenAnyVersion(dir.File("missing.db"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound) << missing.status();

  const std::string text = dir.File("notes.txt");
  std::ofstream(text) << "round,uplink_ms\n1,2.5\nand more text to fill what SQLite reads as a header\n";
  auto not_sqlite = RecordReader::OpenAnyVersion(text);
  ASSERT_FALSE(not_sqlite.ok());
  EXPECT_EQ(not_sqlite.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(Message(not_sqlite.status()).find(text + " is not a records database"), std::string::npos)
      << not_sqlite.status();

  const std::string other = dir.File("other.db");
  ExecRaw(other, "CREATE TABLE rounds (x INTEGER); INSERT INTO rounds VALUES (1);");
  auto other_program = RecordReader::OpenAnyVersion(other);
  ASSERT_FALSE(other_program.ok());
  EXPECT_EQ(other_program.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(Message(other_program.status()).find("not an fl-testbed records database"), std::string::npos)
      << other_program.status();
  EXPECT_NE(Message(other_program.status()).find("--db"), std::string::npos) << other_program.status();

  const std::string newer = dir.File("newer.db");
  ASSERT_TRUE(RecordStore::Open(newer).ok());
  ExecRaw(newer, fl::StrCat("PRAGMA user_version = ", LatestSchemaVersion() + 1));
  auto too_new = RecordReader::OpenAnyVersion(newer);
  ASSERT_FALSE(too_new.ok());
  EXPECT_EQ(too_new.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(Message(too_new.status()).find("upgrade fl-server (and fl-report)"), std::string::npos) << too_new.status();
}

// A snapshot keeps every read on one committed state while the writer goes on; after it, reads see the rest.
TEST(RecordReaderTest, SnapshotHoldsOneStateWhileTheWriterGoesOn) {
  ScratchDir dir;
  const std::string path = dir.File("records.db");
  auto store = RecordStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->Enqueue(Experiment("e1")).ok());
  ASSERT_TRUE((*store)->Enqueue(Round("e1", 0)).ok());
  ASSERT_TRUE((*store)->Flush().ok());
  auto reader = RecordReader::OpenAnyVersion(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  {
    auto snapshot = (*reader)->ReadSnapshot();
    ASSERT_TRUE(snapshot.ok()) << snapshot.status();
    EXPECT_EQ((*reader)->ReadSnapshot().status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ((*reader)->ListRounds("e1")->size(), 1u);
    ASSERT_TRUE((*store)->Enqueue(Round("e1", 1)).ok());
    ASSERT_TRUE((*store)->Flush().ok());
    EXPECT_EQ((*reader)->ListRounds("e1")->size(), 1u);
    EXPECT_EQ(*(*reader)->CountRounds("e1"), 1);
  }
  EXPECT_EQ((*reader)->ListRounds("e1")->size(), 2u);
  auto again = (*reader)->ReadSnapshot();
  EXPECT_TRUE(again.ok()) << again.status();
}

// The whole experiment at once: client rows by round and attempt, and within one in the order they were written
// (the order the server decided their outcomes); evaluations by round, attempt and client.
TEST(RecordReaderTest, WholeExperimentListingsKeepTheirOrder) {
  ScratchDir dir;
  const std::string path = dir.File("records.db");
  auto store = RecordStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  std::vector<Record> records = {Experiment("e1"),
                                 Client("e1", "a"),
                                 Client("e1", "b"),
                                 Round("e1", 1),
                                 Round("e1", 0),
                                 ClientRound("e1", 1, 0, "a"),
                                 ClientRound("e1", 0, 0, "b"),
                                 ClientRound("e1", 0, 0, "a"),
                                 EvaluationRecord{"e1", 1, 0, "b", 10, 0.5, 0.5, 1.0, std::nullopt, ""},
                                 EvaluationRecord{"e1", 0, 0, "b", 10, 0.5, 0.5, 2.0, std::nullopt, ""},
                                 EvaluationRecord{"e1", 0, 0, "a", 10, 0.5, 0.5, 3.0, std::nullopt, ""}};
  for (Record& r : records) ASSERT_TRUE((*store)->Enqueue(std::move(r)).ok());
  ASSERT_TRUE((*store)->Close().ok());
  auto reader = RecordReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  auto client_rounds = (*reader)->ListClientRounds("e1");
  ASSERT_TRUE(client_rounds.ok()) << client_rounds.status();
  std::vector<std::string> order;
  for (const ClientRoundRecord& c : *client_rounds) order.push_back(fl::StrCat(c.round, c.client_id));
  EXPECT_EQ(order, (std::vector<std::string>{"0b", "0a", "1a"}));
  auto evaluations = (*reader)->ListEvaluations("e1");
  ASSERT_TRUE(evaluations.ok()) << evaluations.status();
  order.clear();
  for (const EvaluationRecord& e : *evaluations) order.push_back(fl::StrCat(e.round, e.client_id));
  EXPECT_EQ(order, (std::vector<std::string>{"0a", "0b", "1b"}));
  EXPECT_EQ(*(*reader)->CountRounds("e1"), 2);
  EXPECT_EQ(*(*reader)->CountRounds("nope"), 0);
}

}  // namespace
}  // namespace fl::instrumentation
