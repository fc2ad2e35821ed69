// Every column of every record kind, written and read back: the column declarations (record_columns.h) bind and
// read each field where it belongs, with every optional set and unset; the v6 figures, the v7 client events and the
// v8 security events.
#include "fl/instrumentation/record_store.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "fl/core/str_cat.h"
#include "fl/instrumentation/record_reader.h"
#include "test_util.h"

namespace fl::instrumentation {
namespace {

using testing_util::Client;
using testing_util::ClientRound;
using testing_util::Count;
using testing_util::Experiment;
using testing_util::MustOpen;
using testing_util::MustRead;
using testing_util::Round;
using testing_util::ScratchDir;

std::string Message(const absl::Status& s) { return std::string(s.message()); }

TEST(RecordStoreTest, TaskFiguresRoundTrip) {
  ScratchDir dir;
  const std::string path = dir.File("records.db");
  auto store = MustOpen(path);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Enqueue(Experiment("reg")).ok());
  ExperimentRecord lm = Experiment("lm");
  lm.task = "next-token";
  ASSERT_TRUE(store->Enqueue(lm).ok());
  ASSERT_TRUE(store->Enqueue(ExperimentTaskUpdate{"reg", "regression"}).ok());
  ASSERT_TRUE(store->Enqueue(Client("reg", "c1")).ok());
  ASSERT_TRUE(store->Enqueue(Client("reg", "c2")).ok());
  ASSERT_TRUE(store->Enqueue(Round("reg", 1)).ok());
  RoundRecord lm_round = Round("lm", 1);
  lm_round.eval_loss = 2.0;
  lm_round.eval_accuracy = 0.4;
  lm_round.eval_perplexity = 7.389;
  ASSERT_TRUE(store->Enqueue(lm_round).ok());
  RoundEvaluationUpdate reg_eval{"reg", 1, 0, 0.09, std::nullopt, 300, 0.25, std::nullopt};
  ASSERT_TRUE(store->Enqueue(reg_eval).ok());
  EvaluationRecord accepted{"reg", 1, 0, "c1", 300, 0.09, std::nullopt, 12.5, 0.25, ""};
  EvaluationRecord refused{
      "reg", 1, 0, "c2", 100, std::nullopt, std::nullopt, 11.0, std::nullopt, "mae -1 is negative"};
  ASSERT_TRUE(store->Enqueue(accepted).ok());
  ASSERT_TRUE(store->Enqueue(refused).ok());
  absl::Status flushed = store->Flush();
  ASSERT_TRUE(flushed.ok()) << flushed;
  // Only the three task names are stored; a task update of an unknown experiment is reported.
  ASSERT_TRUE(store->Enqueue(ExperimentTaskUpdate{"reg", "segmentation"}).ok());
  EXPECT_EQ(store->Flush().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(store->Enqueue(ExperimentTaskUpdate{"nope", "regression"}).ok());
  EXPECT_EQ(store->Flush().code(), absl::StatusCode::kNotFound);

  auto reader = MustRead(path);
  ASSERT_NE(reader, nullptr);
  EXPECT_EQ(reader->GetExperiment("reg")->task, "regression");
  EXPECT_EQ(reader->GetExperiment("lm")->task, "next-token");
  auto reg_rounds = *reader->ListRounds("reg");
  ASSERT_EQ(reg_rounds.size(), 1u);
  EXPECT_EQ(reg_rounds[0].eval_mae, 0.25);
  EXPECT_EQ(reg_rounds[0].eval_loss, 0.09);
  EXPECT_FALSE(reg_rounds[0].eval_accuracy.has_value());  // regression has no accuracy: NULL
  EXPECT_FALSE(reg_rounds[0].eval_perplexity.has_value());
  auto lm_rounds = *reader->ListRounds("lm");
  ASSERT_EQ(lm_rounds.size(), 1u);
  EXPECT_EQ(lm_rounds[0].eval_perplexity, 7.389);
  EXPECT_EQ(lm_rounds[0].eval_accuracy, 0.4);
  EXPECT_FALSE(lm_rounds[0].eval_mae.has_value());
  auto evaluations = *reader->ListEvaluations("reg", 1);
  ASSERT_EQ(evaluations.size(), 2u);
  EXPECT_EQ(evaluations[0].mae, 0.25);
  EXPECT_EQ(evaluations[0].reject_reason, "");
  EXPECT_FALSE(evaluations[1].loss.has_value());
  EXPECT_FALSE(evaluations[1].mae.has_value());
  EXPECT_EQ(evaluations[1].reject_reason, "mae -1 is negative");
  EXPECT_EQ(evaluations[1].eval_ms, 11.0);
  EXPECT_EQ(Count(*reader, "SELECT count(*) FROM evaluations WHERE reject_reason IS NULL"), 1);
}

// Schema v7: what the server refused from or did to a client, with and without a round and a task; the reason
// is bounded; a client the experiment does not know and a kind outside the four are refused and reported.
TEST(RecordStoreTest, ClientEventsRoundTrip) {
  ScratchDir dir;
  const std::string path = dir.File("records.db");
  auto store = MustOpen(path);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Enqueue(Experiment("e1")).ok());
  ASSERT_TRUE(store->Enqueue(Client("e1", "c1")).ok());
  ASSERT_TRUE(store->Enqueue(Client("e1", "c2")).ok());
  const ClientEventRecord pong{"e1",
                               "c1",
                               ClientEventKind::kReportRefused,
                               std::nullopt,
                               "",
                               "clock pong refused: answered before it was received",
                               1'700'000'000'500};
  const ClientEventRecord revoked{"e1",
                                  "c2",
                                  ClientEventKind::kUploadRevoked,
                                  3,
                                  "task-3-c2",
                                  "upload of round 3 revoked: 10 bytes/s for 5 s",
                                  1'700'000'000'400};
  ClientEventRecord reasked{
      "e1", "c1", ClientEventKind::kInitialModelReasked, 0, "init-0", std::string(3000, 'r'), 1'700'000'000'500};
  const ClientEventRecord closed{"e1", "c2", ClientEventKind::kSessionClosed, std::nullopt, "", "", 1'700'000'000'600};
  for (const ClientEventRecord& r : {pong, revoked, reasked, closed}) ASSERT_TRUE(store->Enqueue(r).ok());
  absl::Status flushed = store->Flush();
  ASSERT_TRUE(flushed.ok()) << flushed;

  ClientEventRecord ghost = pong;
  ghost.client_id = "ghost";
  ASSERT_TRUE(store->Enqueue(ghost).ok());
  absl::Status refused = store->Flush();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_NE(Message(refused).find("client event (experiment e1, client ghost, report_refused)"), std::string::npos)
      << refused;
  EXPECT_NE(Message(refused).find("FOREIGN KEY constraint failed"), std::string::npos) << refused;
  ClientEventRecord negative_round = revoked;
  negative_round.round = -1;
  ASSERT_TRUE(store->Enqueue(negative_round).ok());
  EXPECT_EQ(store->Flush().code(), absl::StatusCode::kInvalidArgument);

  auto reader = MustRead(path);
  ASSERT_NE(reader, nullptr);
  auto events = reader->ListClientEvents("e1");
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_EQ(events->size(), 4u);
  // By time, then in the order written.
  const ClientEventRecord& e0 = (*events)[0];
  EXPECT_EQ(e0.experiment_id, "e1");
  EXPECT_EQ(e0.client_id, "c2");
  EXPECT_EQ(e0.kind, ClientEventKind::kUploadRevoked);
  EXPECT_EQ(e0.round, 3);
  EXPECT_EQ(e0.task_id, "task-3-c2");
  EXPECT_EQ(e0.reason, revoked.reason);
  EXPECT_EQ(e0.at_unix_ms, 1'700'000'000'400);
  const ClientEventRecord& e1 = (*events)[1];
  EXPECT_EQ(e1.kind, ClientEventKind::kReportRefused);
  EXPECT_FALSE(e1.round.has_value());
  EXPECT_EQ(e1.task_id, "");
  EXPECT_EQ(e1.reason, pong.reason);
  const ClientEventRecord& e2 = (*events)[2];
  EXPECT_EQ(e2.kind, ClientEventKind::kInitialModelReasked);
  EXPECT_EQ(e2.round, 0);
  EXPECT_EQ(e2.reason, BoundClientEventReason(reasked.reason));
  EXPECT_EQ(e2.reason.size(), kMaxClientEventReasonBytes);
  const ClientEventRecord& e3 = (*events)[3];
  EXPECT_EQ(e3.kind, ClientEventKind::kSessionClosed);
  EXPECT_EQ(e3.reason, "");
  // "" task ids are NULL, like every optional text column.
  EXPECT_EQ(Count(*reader, "SELECT count(*) FROM client_events WHERE task_id IS NULL"), 2);
  EXPECT_TRUE(reader->ListClientEvents("other")->empty());
  // The CHECK on kind holds for SQL written by hand too.
  auto db = sqlite::Database::Open(path, SQLITE_OPEN_READWRITE);
  ASSERT_TRUE(db.ok()) << db.status();
  absl::Status bad_kind = db->Exec(
      "INSERT INTO client_events (experiment_id, client_id, kind, reason, at_unix_ms) "
      "VALUES ('e1', 'c1', 'exploded', 'x', 1)");
  EXPECT_NE(Message(bad_kind).find("CHECK constraint failed"), std::string::npos) << bad_kind;
}

// Schema v8: what the server refused on the secure channel, with and without a certificate name and a claimed
// name; the texts a peer controls are bounded; the database numbers the rows (an id in the record is not written);
// an experiment the file does not know and a reason outside the eight are refused and reported.
TEST(RecordStoreTest, SecurityEventsRoundTrip) {
  ScratchDir dir;
  const std::string path = dir.File("records.db");
  auto store = MustOpen(path);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Enqueue(Experiment("e1")).ok());
  const SecurityEventRecord mismatch{0,
                                     "e1",
                                     SecurityRefusal::kNameMismatch,
                                     "ipv4:127.0.0.1:50514",
                                     "alice",
                                     "bob",
                                     "client_name 'bob' is not the certificate's 'alice'",
                                     1'700'000'000'500};
  const SecurityEventRecord token{77, "e1",  SecurityRefusal::kBadToken, "ipv6:[::1]:41000",
                                  "", "c-9", "unknown client id",        1'700'000'000'400};
  const SecurityEventRecord hostile{0,
                                    "e1",
                                    SecurityRefusal::kJoinRate,
                                    std::string(1000, 'p'),
                                    "",
                                    std::string(5000, 'c'),
                                    std::string(3000, 'd'),
                                    1'700'000'000'500};
  const SecurityEventRecord deadline{0,  "e1", SecurityRefusal::kStreamDeadline, "",
                                     "", "",   "no first message within 10 s",   1'700'000'000'600};
  for (const SecurityEventRecord& r : {mismatch, token, hostile, deadline}) ASSERT_TRUE(store->Enqueue(r).ok());
  absl::Status flushed = store->Flush();
  ASSERT_TRUE(flushed.ok()) << flushed;

  SecurityEventRecord ghost = mismatch;
  ghost.experiment_id = "ghost";
  ASSERT_TRUE(store->Enqueue(ghost).ok());
  absl::Status refused = store->Flush();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_NE(Message(refused).find("security event (experiment ghost, name_mismatch, peer ipv4:127.0.0.1:50514)"),
            std::string::npos)
      << refused;
  EXPECT_NE(Message(refused).find("FOREIGN KEY constraint failed"), std::string::npos) << refused;

  auto reader = MustRead(path);
  ASSERT_NE(reader, nullptr);
  auto events = reader->ListSecurityEvents("e1");
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_EQ(events->size(), 4u);
  // By time, then in the order written; ids in the order written, whatever the record carried.
  SecurityEventRecord want_token = token;
  want_token.id = 2;
  EXPECT_EQ((*events)[0], want_token);
  SecurityEventRecord want_mismatch = mismatch;
  want_mismatch.id = 1;
  EXPECT_EQ((*events)[1], want_mismatch);
  const SecurityEventRecord& h = (*events)[2];
  EXPECT_EQ(h.id, 3);
  EXPECT_EQ(h.reason, SecurityRefusal::kJoinRate);
  EXPECT_EQ(h.peer, BoundText(hostile.peer, kMaxSecurityEventPeerBytes));
  EXPECT_EQ(h.peer.size(), kMaxSecurityEventPeerBytes);
  EXPECT_EQ(h.claimed, BoundText(hostile.claimed, kMaxSecurityEventPeerBytes));
  EXPECT_EQ(h.claimed.size(), kMaxSecurityEventPeerBytes);
  EXPECT_EQ(h.detail, BoundText(hostile.detail, kMaxSecurityEventDetailBytes));
  EXPECT_EQ(h.detail.size(), kMaxSecurityEventDetailBytes);
  SecurityEventRecord want_deadline = deadline;
  want_deadline.id = 4;
  EXPECT_EQ((*events)[3], want_deadline);
  // "" identity and claimed are NULL, like every optional text column; an empty peer stays "".
  EXPECT_EQ(Count(*reader, "SELECT count(*) FROM security_events WHERE identity IS NULL"), 3);
  EXPECT_EQ(Count(*reader, "SELECT count(*) FROM security_events WHERE claimed IS NULL"), 1);
  EXPECT_EQ(Count(*reader, "SELECT count(*) FROM security_events WHERE peer = ''"), 1);
  EXPECT_TRUE(reader->ListSecurityEvents("other")->empty());
  // The CHECK on reason holds for SQL written by hand too.
  auto db = sqlite::Database::Open(path, SQLITE_OPEN_READWRITE);
  ASSERT_TRUE(db.ok()) << db.status();
  absl::Status bad_reason = db->Exec(
      "INSERT INTO security_events (experiment_id, reason, peer, detail, at_unix_ms) "
      "VALUES ('e1', 'exploded', 'ipv4:1.2.3.4:5', 'x', 1)");
  EXPECT_NE(Message(bad_reason).find("CHECK constraint failed"), std::string::npos) << bad_reason;
}

// Every column of a row: "" when it is NULL.
std::vector<std::string> NullColumns(const std::string& path, const std::string& table, const std::string& where) {
  auto db = sqlite::Database::Open(path, SQLITE_OPEN_READONLY);
  EXPECT_TRUE(db.ok()) << db.status();
  std::vector<std::string> nulls;
  if (!db.ok()) return nulls;
  auto st = db->Prepare("SELECT * FROM " + table + " WHERE " + where);
  EXPECT_TRUE(st.ok()) << st.status();
  if (!st.ok()) return nulls;
  auto row = st->Step("read the row");
  EXPECT_TRUE(row.ok() && *row) << table << " has no row where " << where;
  if (!row.ok() || !*row) return nulls;
  for (int i = 0; i < st->ColumnCount(); ++i) {
    if (st->ColumnIsNull(i)) nulls.push_back(sqlite3_column_name(st->get(), i));
  }
  return nulls;
}

// The nullable columns of a table (pragma table_info), less its primary key: what a record with every optional
// unset leaves NULL.
std::vector<std::string> NullableColumns(const std::string& path, const std::string& table) {
  auto db = sqlite::Database::Open(path, SQLITE_OPEN_READONLY);
  EXPECT_TRUE(db.ok()) << db.status();
  std::vector<std::string> out;
  if (!db.ok()) return out;
  auto st = db->Prepare("SELECT name FROM pragma_table_info('" + table +
                        "') WHERE \"notnull\" = 0 AND pk = 0 "
                        "ORDER BY cid");
  EXPECT_TRUE(st.ok()) << st.status();
  while (st.ok()) {
    auto row = st->Step("table_info");
    if (!row.ok() || !*row) break;
    out.push_back(st->ColumnText(0));
  }
  return out;
}

// Every record kind, once with every optional field set (and every text non-empty, every figure off its default)
// and once with every optional unset: each column of each table is written (no NULL in the full row, NULL in
// every nullable column of the bare one) and read back into the field it came from (the records read back are
// equal to the records written). Updates are applied to the bare rows and read back the same way.
TEST(RecordStoreTest, EveryColumnOfEveryKindRoundTripsSetAndUnset) {
  ScratchDir dir;
  const std::string path = dir.File("records.db");
  auto store = MustOpen(path);
  ASSERT_NE(store, nullptr);

  ExperimentRecord full_experiment{
      "full",       "name",    ExperimentStatus::kFailed, "why", 11, 12, R"({"a":1})", "1.2.3", "host-1",
      "next-token", "buffered"};
  ExperimentRecord bare_experiment;
  bare_experiment.id = "bare";
  bare_experiment.name = "bare name";
  bare_experiment.started_unix_ms = 21;
  bare_experiment.config_json = R"({"b":2})";
  bare_experiment.software_version = "0.0.1";
  ClientRecord full_client{"full",    "c",      "name",   "rpi5",    "wifi", "wlan0", "5g-urban", 4,
                           8LL << 30, "cuda:x", "Debian", "aarch64", "0.9",  13,      14,         "gone"};
  ClientRecord bare_client;
  bare_client.experiment_id = "bare";
  bare_client.client_id = "c";
  bare_client.joined_unix_ms = 22;
  RoundRecord full_round{"full", 3,    1,    RoundStatus::kCommitted,
                         "",     15,   16,   17.5,
                         18.5,   5,    4,    3,
                         2,      1,    900,  7,
                         0.5,    0.25, 0.75, 300,
                         0.125,  1.5,  2.5,  0.75,
                         1.1,    9,    2};
  full_round.failure_reason = "a committed round keeps a reason it is given";
  RoundRecord bare_round;
  bare_round.experiment_id = "bare";
  bare_round.round = 0;
  bare_round.status = RoundStatus::kAborted;
  bare_round.started_unix_ms = 23;
  bare_round.ended_unix_ms = 24;
  bare_round.duration_ms = 2.5;
  ClientRoundRecord full_client_round{"full", 3,     1,      "c",   ClientOutcome::kRejected,
                                      "bad",  19,    600,    50,    1.5,
                                      2.5,    3.5,   4.5,    5.5,   6.5,
                                      1000,   2000,  "fp16", 0.875, -3.5,
                                      2.25,   100.5, 101.5,  102.5, 103.5,
                                      104.5,  105.5, 106.5,  7.5,   2,
                                      1,      0.5,   4};
  ClientRoundRecord bare_client_round;
  bare_client_round.experiment_id = "bare";
  bare_client_round.client_id = "c";
  bare_client_round.outcome = ClientOutcome::kDropped;
  EvaluationRecord full_evaluation{"full", 3, 1, "c", 100, 0.5, 0.75, 8.5, 0.25, "refused"};
  EvaluationRecord bare_evaluation;
  bare_evaluation.experiment_id = "bare";
  bare_evaluation.client_id = "c";
  CheckpointRecord full_checkpoint{"full", 3, 7, "/ckpt/3", 4096, "0123456789abcdef", "fedcba9876543210", 25};
  CheckpointRecord bare_checkpoint{"bare", 0, 1, "/ckpt/0", 0, "0000000000000000", "", 26};
  ClientEventRecord full_event{"full", "c", ClientEventKind::kInitialModelReasked, 3, "task-1", "asked b", 27};
  ClientEventRecord bare_event{"bare", "c", ClientEventKind::kSessionClosed, std::nullopt, "", "rate", 28};
  SecurityEventRecord full_security{
      1, "full", SecurityRefusal::kRevokedCertificate, "ipv4:10.0.0.2:4000", "alice", "alice", "revoked", 31};
  SecurityEventRecord bare_security{2, "bare", SecurityRefusal::kUploadLimit, "ipv4:10.0.0.3:4001", "", "", "busy", 32};
  // A full row is a refused one: only a stage that did not end ok has a detail.
  SecAggStageRecord full_secagg{"full",
                                3,
                                1,
                                "c",
                                SecAggStage::kMaskedUpload,
                                SecAggStageOutcome::kRefused,
                                33.5,
                                120.25,
                                4096,
                                8192,
                                "wrong length: 10 chunks, expected 12"};
  SecAggStageRecord bare_secagg;
  bare_secagg.experiment_id = "bare";
  bare_secagg.client_id = "c";

  std::vector<Record> records = {full_experiment, bare_experiment, full_client, bare_client};
  // The group kinds carry the full rows, the row kinds the bare ones.
  records.push_back(RoundCommitRecord{full_round, {full_client_round}, full_checkpoint, {}});
  records.push_back(EvaluationCommitRecord{"full", 3, 1, {full_evaluation}, std::nullopt});
  for (Record r : std::vector<Record>{bare_round, bare_client_round, bare_evaluation, bare_checkpoint, full_event,
                                      bare_event, full_security, bare_security, full_secagg, bare_secagg}) {
    records.push_back(std::move(r));
  }
  for (Record& r : records) ASSERT_TRUE(store->Enqueue(std::move(r)).ok());
  absl::Status flushed = store->Flush();
  ASSERT_TRUE(flushed.ok()) << flushed;

  const std::vector<std::string> none;
  EXPECT_EQ(NullColumns(path, "experiments", "id = 'full'"), none);
  EXPECT_EQ(NullColumns(path, "clients", "experiment_id = 'full'"), none);
  EXPECT_EQ(NullColumns(path, "rounds", "experiment_id = 'full'"), none);
  EXPECT_EQ(NullColumns(path, "client_rounds", "experiment_id = 'full'"), none);
  EXPECT_EQ(NullColumns(path, "evaluations", "experiment_id = 'full'"), none);
  EXPECT_EQ(NullColumns(path, "checkpoints", "experiment_id = 'full'"), none);
  EXPECT_EQ(NullColumns(path, "client_events", "experiment_id = 'full'"), none);
  EXPECT_EQ(NullColumns(path, "security_events", "experiment_id = 'full'"), none);
  EXPECT_EQ(NullColumns(path, "secagg_stages", "experiment_id = 'full'"), none);
  for (const char* table : {"experiments", "clients", "rounds", "client_rounds", "evaluations", "checkpoints",
                            "client_events", "security_events", "secagg_stages"}) {
    const std::string where = std::string(table) == "experiments" ? "id = 'bare'" : "experiment_id = 'bare'";
    EXPECT_EQ(NullColumns(path, table, where), NullableColumns(path, table)) << table;
  }

  auto reader = MustRead(path);
  ASSERT_NE(reader, nullptr);
  EXPECT_EQ(*reader->GetExperiment("full"), full_experiment);
  EXPECT_EQ(*reader->GetExperiment("bare"), bare_experiment);
  EXPECT_EQ(*reader->ListClients("full"), std::vector<ClientRecord>{full_client});
  EXPECT_EQ(*reader->ListClients("bare"), std::vector<ClientRecord>{bare_client});
  EXPECT_EQ(*reader->ListRounds("full"), std::vector<RoundRecord>{full_round});
  EXPECT_EQ(*reader->ListRounds("bare"), std::vector<RoundRecord>{bare_round});
  EXPECT_EQ(*reader->ListClientRounds("full", 3), std::vector<ClientRoundRecord>{full_client_round});
  EXPECT_EQ(*reader->ListClientRounds("bare"), std::vector<ClientRoundRecord>{bare_client_round});
  EXPECT_EQ(*reader->ListEvaluations("full", 3), std::vector<EvaluationRecord>{full_evaluation});
  EXPECT_EQ(*reader->ListEvaluations("bare"), std::vector<EvaluationRecord>{bare_evaluation});
  EXPECT_EQ(*reader->ListCheckpoints("full"), std::vector<CheckpointRecord>{full_checkpoint});
  EXPECT_EQ(*reader->ListCheckpoints("bare"), std::vector<CheckpointRecord>{bare_checkpoint});
  EXPECT_EQ(*reader->ListClientEvents("full"), std::vector<ClientEventRecord>{full_event});
  EXPECT_EQ(*reader->ListClientEvents("bare"), std::vector<ClientEventRecord>{bare_event});
  // The ids the database gave, in the order written: the records carried the same.
  EXPECT_EQ(*reader->ListSecurityEvents("full"), std::vector<SecurityEventRecord>{full_security});
  EXPECT_EQ(*reader->ListSecurityEvents("bare"), std::vector<SecurityEventRecord>{bare_security});
  EXPECT_EQ(*reader->ListSecAggStages("full"), std::vector<SecAggStageRecord>{full_secagg});
  EXPECT_EQ(*reader->ListSecAggStages("bare"), std::vector<SecAggStageRecord>{bare_secagg});

  // The updates, on the bare rows: each sets exactly its columns.
  const ExperimentStatusUpdate finished{"bare", ExperimentStatus::kAborted, "stopped", 29};
  const ExperimentTaskUpdate task{"bare", "regression"};
  const ClientLeftRecord left{"bare", "c", 30, "heartbeat lost"};
  const RoundEvaluationUpdate figures{"bare", 0, 0, 0.5, 0.625, 40, 0.375, 1.25};
  const ClientRoundUplinkUpdate uplink{"bare", 0, 0, "c", 9.5, 200.5, 210.0};
  for (Record r : std::vector<Record>{finished, task, left, figures, uplink,
                                      RoundsSupersededUpdate{"full", 2, "superseded: re-run"}}) {
    ASSERT_TRUE(store->Enqueue(std::move(r)).ok());
  }
  flushed = store->Flush();
  ASSERT_TRUE(flushed.ok()) << flushed;
  ExperimentRecord expected_experiment = bare_experiment;
  expected_experiment.status = finished.status;
  expected_experiment.status_reason = finished.status_reason;
  expected_experiment.finished_unix_ms = finished.finished_unix_ms;
  expected_experiment.task = task.task;
  EXPECT_EQ(*reader->GetExperiment("bare"), expected_experiment);
  ClientRecord expected_client = bare_client;
  expected_client.left_unix_ms = left.left_unix_ms;
  expected_client.left_reason = left.reason;
  EXPECT_EQ(*reader->ListClients("bare"), std::vector<ClientRecord>{expected_client});
  RoundRecord expected_round = bare_round;
  expected_round.eval_loss = figures.eval_loss;
  expected_round.eval_accuracy = figures.eval_accuracy;
  expected_round.eval_num_examples = figures.eval_num_examples;
  expected_round.eval_mae = figures.eval_mae;
  expected_round.eval_perplexity = figures.eval_perplexity;
  EXPECT_EQ(*reader->ListRounds("bare"), std::vector<RoundRecord>{expected_round});
  ClientRoundRecord expected_client_round = bare_client_round;
  expected_client_round.uplink_ms = uplink.uplink_ms;
  expected_client_round.uplink_start_unix_ms = uplink.uplink_start_unix_ms;
  expected_client_round.uplink_end_unix_ms = uplink.uplink_end_unix_ms;
  EXPECT_EQ(*reader->ListClientRounds("bare"), std::vector<ClientRoundRecord>{expected_client_round});
  RoundRecord superseded = full_round;
  superseded.status = RoundStatus::kAborted;
  superseded.failure_reason = "superseded: re-run";
  EXPECT_EQ(*reader->ListRounds("full"), std::vector<RoundRecord>{superseded});
}

}  // namespace
}  // namespace fl::instrumentation
