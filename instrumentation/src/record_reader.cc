#include "fl/instrumentation/record_reader.h"

#include <utility>

#include "fl/core/str_cat.h"
#include "fl/instrumentation/schema.h"

namespace fl::instrumentation {
namespace {

constexpr std::string_view kExperimentColumns =
    "id, name, status, status_reason, started_unix_ms, finished_unix_ms, config_json, software_version, host, "
    "task";
constexpr std::string_view kClientColumns =
    "experiment_id, client_id, client_name, device_class, link_kind, link_interface, link_profile, cores, "
    "memory_bytes, accelerator, os, arch, client_version, joined_unix_ms, left_unix_ms, left_reason";
constexpr std::string_view kRoundColumns =
    "experiment_id, round, attempt, status, failure_reason, started_unix_ms, ended_unix_ms, duration_ms, "
    "aggregation_ms, num_selected, num_accepted, num_late, num_rejected, num_dropped, num_examples, "
    "model_version, train_loss, eval_loss, eval_accuracy, eval_num_examples, eval_mae, eval_perplexity";
constexpr std::string_view kClientRoundColumns =
    "experiment_id, round, attempt, client_id, outcome, reject_reason, dispatched_unix_ms, num_examples, "
    "num_steps, downlink_ms, train_ms, eval_ms, uplink_ms, uplink_server_ms, idle_ms, downlink_bytes, "
    "uplink_bytes, codec, train_loss, clock_offset_ms, clock_rtt_ms, downlink_start_unix_ms, train_start_unix_ms, "
    "eval_start_unix_ms, uplink_start_unix_ms, uplink_end_unix_ms, uplink_server_start_unix_ms, "
    "downlink_server_start_unix_ms, downlink_server_ms";
constexpr std::string_view kEvaluationColumns =
    "experiment_id, round, attempt, client_id, num_examples, loss, accuracy, eval_ms, mae, reject_reason";
constexpr std::string_view kCheckpointColumns =
    "experiment_id, round, model_version, path, bytes, fingerprint, checksum, created_unix_ms";

constexpr std::string_view kClientEventColumns =
    "experiment_id, client_id, kind, round, task_id, reason, at_unix_ms";

absl::StatusOr<ClientEventRecord> ReadClientEvent(const sqlite::Statement& st) {
  ClientEventRecord r;
  r.experiment_id = st.ColumnText(0);
  r.client_id = st.ColumnText(1);
  absl::StatusOr<ClientEventKind> kind = ParseClientEventKind(st.ColumnText(2));
  if (!kind.ok()) return kind.status();
  r.kind = *kind;
  r.round = st.ColumnOptionalInt64(3);
  r.task_id = st.ColumnText(4);
  r.reason = st.ColumnText(5);
  r.at_unix_ms = st.ColumnInt64(6);
  return r;
}

absl::StatusOr<ExperimentRecord> ReadExperiment(const sqlite::Statement& st) {
  ExperimentRecord r;
  r.id = st.ColumnText(0);
  r.name = st.ColumnText(1);
  absl::StatusOr<ExperimentStatus> status = ParseExperimentStatus(st.ColumnText(2));
  if (!status.ok()) return status.status();
  r.status = *status;
  r.status_reason = st.ColumnText(3);
  r.started_unix_ms = st.ColumnInt64(4);
  r.finished_unix_ms = st.ColumnOptionalInt64(5);
  r.config_json = st.ColumnText(6);
  r.software_version = st.ColumnText(7);
  r.host = st.ColumnText(8);
  r.task = st.ColumnText(9);
  return r;
}

absl::StatusOr<ClientRecord> ReadClient(const sqlite::Statement& st) {
  ClientRecord r;
  r.experiment_id = st.ColumnText(0);
  r.client_id = st.ColumnText(1);
  r.client_name = st.ColumnText(2);
  r.device_class = st.ColumnText(3);
  r.link_kind = st.ColumnText(4);
  r.link_interface = st.ColumnText(5);
  r.link_profile = st.ColumnText(6);
  r.cores = st.ColumnOptionalInt64(7);
  r.memory_bytes = st.ColumnOptionalInt64(8);
  r.accelerator = st.ColumnText(9);
  r.os = st.ColumnText(10);
  r.arch = st.ColumnText(11);
  r.client_version = st.ColumnText(12);
  r.joined_unix_ms = st.ColumnInt64(13);
  r.left_unix_ms = st.ColumnOptionalInt64(14);
  r.left_reason = st.ColumnText(15);
  return r;
}

absl::StatusOr<RoundRecord> ReadRound(const sqlite::Statement& st) {
  RoundRecord r;
  r.experiment_id = st.ColumnText(0);
  r.round = st.ColumnInt64(1);
  r.attempt = st.ColumnInt64(2);
  absl::StatusOr<RoundStatus> status = ParseRoundStatus(st.ColumnText(3));
  if (!status.ok()) return status.status();
  r.status = *status;
  r.failure_reason = st.ColumnText(4);
  r.started_unix_ms = st.ColumnInt64(5);
  r.ended_unix_ms = st.ColumnInt64(6);
  r.duration_ms = st.ColumnDouble(7);
  r.aggregation_ms = st.ColumnOptionalDouble(8);
  r.num_selected = st.ColumnInt64(9);
  r.num_accepted = st.ColumnInt64(10);
  r.num_late = st.ColumnInt64(11);
  r.num_rejected = st.ColumnInt64(12);
  r.num_dropped = st.ColumnInt64(13);
  r.num_examples = st.ColumnInt64(14);
  r.model_version = st.ColumnOptionalInt64(15);
  r.train_loss = st.ColumnOptionalDouble(16);
  r.eval_loss = st.ColumnOptionalDouble(17);
  r.eval_accuracy = st.ColumnOptionalDouble(18);
  r.eval_num_examples = st.ColumnOptionalInt64(19);
  r.eval_mae = st.ColumnOptionalDouble(20);
  r.eval_perplexity = st.ColumnOptionalDouble(21);
  return r;
}

absl::StatusOr<ClientRoundRecord> ReadClientRound(const sqlite::Statement& st) {
  ClientRoundRecord r;
  r.experiment_id = st.ColumnText(0);
  r.round = st.ColumnInt64(1);
  r.attempt = st.ColumnInt64(2);
  r.client_id = st.ColumnText(3);
  absl::StatusOr<ClientOutcome> outcome = ParseClientOutcome(st.ColumnText(4));
  if (!outcome.ok()) return outcome.status();
  r.outcome = *outcome;
  r.reject_reason = st.ColumnText(5);
  r.dispatched_unix_ms = st.ColumnOptionalInt64(6);
  r.num_examples = st.ColumnOptionalInt64(7);
  r.num_steps = st.ColumnOptionalInt64(8);
  r.downlink_ms = st.ColumnOptionalDouble(9);
  r.train_ms = st.ColumnOptionalDouble(10);
  r.eval_ms = st.ColumnOptionalDouble(11);
  r.uplink_ms = st.ColumnOptionalDouble(12);
  r.uplink_server_ms = st.ColumnOptionalDouble(13);
  r.idle_ms = st.ColumnOptionalDouble(14);
  r.downlink_bytes = st.ColumnOptionalInt64(15);
  r.uplink_bytes = st.ColumnOptionalInt64(16);
  r.codec = st.ColumnText(17);
  r.train_loss = st.ColumnOptionalDouble(18);
  r.clock_offset_ms = st.ColumnOptionalDouble(19);
  r.clock_rtt_ms = st.ColumnOptionalDouble(20);
  r.downlink_start_unix_ms = st.ColumnOptionalDouble(21);
  r.train_start_unix_ms = st.ColumnOptionalDouble(22);
  r.eval_start_unix_ms = st.ColumnOptionalDouble(23);
  r.uplink_start_unix_ms = st.ColumnOptionalDouble(24);
  r.uplink_end_unix_ms = st.ColumnOptionalDouble(25);
  r.uplink_server_start_unix_ms = st.ColumnOptionalDouble(26);
  r.downlink_server_start_unix_ms = st.ColumnOptionalDouble(27);
  r.downlink_server_ms = st.ColumnOptionalDouble(28);
  return r;
}

absl::StatusOr<EvaluationRecord> ReadEvaluation(const sqlite::Statement& st) {
  EvaluationRecord r;
  r.experiment_id = st.ColumnText(0);
  r.round = st.ColumnInt64(1);
  r.attempt = st.ColumnInt64(2);
  r.client_id = st.ColumnText(3);
  r.num_examples = st.ColumnInt64(4);
  r.loss = st.ColumnOptionalDouble(5);
  r.accuracy = st.ColumnOptionalDouble(6);
  r.eval_ms = st.ColumnOptionalDouble(7);
  r.mae = st.ColumnOptionalDouble(8);
  r.reject_reason = st.ColumnText(9);
  return r;
}

absl::StatusOr<CheckpointRecord> ReadCheckpoint(const sqlite::Statement& st) {
  CheckpointRecord r;
  r.experiment_id = st.ColumnText(0);
  r.round = st.ColumnInt64(1);
  r.model_version = st.ColumnInt64(2);
  r.path = st.ColumnText(3);
  r.bytes = st.ColumnInt64(4);
  r.fingerprint = st.ColumnText(5);
  r.checksum = st.ColumnText(6);
  r.created_unix_ms = st.ColumnInt64(7);
  return r;
}

// Runs `sql` with text parameter ?1 = `key` and optional integer ?2 = `number`, mapping every row with `read`.
template <typename T, typename ReadFn>
absl::StatusOr<std::vector<T>> Query(sqlite::Database& db, const std::string& sql, std::string_view key,
                                     std::optional<int64_t> number, ReadFn read) {
  absl::StatusOr<sqlite::Statement> st = db.Prepare(sql);
  if (!st.ok()) return st.status();
  if (sqlite3_bind_parameter_count(st->get()) >= 1) st->BindText(1, key);
  if (number.has_value()) st->BindInt64(2, *number);
  std::vector<T> out;
  while (true) {
    absl::StatusOr<bool> row = st->Step("read");
    if (!row.ok()) return row.status();
    if (!*row) break;
    absl::StatusOr<T> value = read(*st);
    if (!value.ok()) {
      return absl::DataLossError(fl::StrCat("records database ", db.path(), ": unreadable row: ",
                                            fl::ToStd(value.status().message())));
    }
    out.push_back(*std::move(value));
  }
  return out;
}

template <typename T>
absl::StatusOr<std::optional<T>> First(absl::StatusOr<std::vector<T>> rows) {
  if (!rows.ok()) return rows.status();
  if (rows->empty()) return std::optional<T>();
  return std::optional<T>(std::move(rows->front()));
}

}  // namespace

absl::StatusOr<std::unique_ptr<RecordReader>> RecordReader::Open(const std::string& path, int busy_timeout_ms) {
  if (path.empty()) return absl::InvalidArgumentError("records database: empty path");
  absl::StatusOr<sqlite::Database> db =
      sqlite::Database::Open(path, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX);
  if (!db.ok()) return db.status();
  if (absl::Status s = db->Exec(fl::StrCat("PRAGMA busy_timeout = ", busy_timeout_ms < 0 ? 0 : busy_timeout_ms));
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckSchemaVersion(*db, LatestSchemaVersion()); !s.ok()) return s;
  return std::unique_ptr<RecordReader>(new RecordReader(*std::move(db)));
}

absl::StatusOr<ExperimentRecord> RecordReader::GetExperiment(std::string_view experiment_id) {
  std::lock_guard lock(mu_);
  absl::StatusOr<std::optional<ExperimentRecord>> r = First(Query<ExperimentRecord>(
      db_, fl::StrCat("SELECT ", kExperimentColumns, " FROM experiments WHERE id = ?1"), experiment_id,
      std::nullopt, ReadExperiment));
  if (!r.ok()) return r.status();
  if (!r->has_value()) {
    return absl::NotFoundError(
        fl::StrCat("records database ", db_.path(), ": no experiment with id '", experiment_id, "'"));
  }
  return **std::move(r);
}

absl::StatusOr<std::vector<ExperimentRecord>> RecordReader::ListExperiments() {
  std::lock_guard lock(mu_);
  return Query<ExperimentRecord>(
      db_, fl::StrCat("SELECT ", kExperimentColumns, " FROM experiments ORDER BY started_unix_ms, id"), "",
      std::nullopt, ReadExperiment);
}

absl::StatusOr<std::vector<ClientRecord>> RecordReader::ListClients(std::string_view experiment_id) {
  std::lock_guard lock(mu_);
  return Query<ClientRecord>(db_,
                             fl::StrCat("SELECT ", kClientColumns,
                                        " FROM clients WHERE experiment_id = ?1 ORDER BY joined_unix_ms, client_id"),
                             experiment_id, std::nullopt, ReadClient);
}

absl::StatusOr<std::vector<RoundRecord>> RecordReader::ListRounds(std::string_view experiment_id) {
  std::lock_guard lock(mu_);
  return Query<RoundRecord>(
      db_,
      fl::StrCat("SELECT ", kRoundColumns, " FROM rounds WHERE experiment_id = ?1 ORDER BY round, attempt"),
      experiment_id, std::nullopt, ReadRound);
}

absl::StatusOr<std::vector<ClientRoundRecord>> RecordReader::ListClientRounds(std::string_view experiment_id,
                                                                              int64_t round) {
  std::lock_guard lock(mu_);
  return Query<ClientRoundRecord>(db_,
                                  fl::StrCat("SELECT ", kClientRoundColumns,
                                             " FROM client_rounds WHERE experiment_id = ?1 AND round = ?2 "
                                             "ORDER BY attempt, client_id"),
                                  experiment_id, round, ReadClientRound);
}

absl::StatusOr<std::vector<EvaluationRecord>> RecordReader::ListEvaluations(std::string_view experiment_id,
                                                                            int64_t round) {
  std::lock_guard lock(mu_);
  return Query<EvaluationRecord>(db_,
                                 fl::StrCat("SELECT ", kEvaluationColumns,
                                            " FROM evaluations WHERE experiment_id = ?1 AND round = ?2 "
                                            "ORDER BY attempt, client_id"),
                                 experiment_id, round, ReadEvaluation);
}

absl::StatusOr<std::vector<CheckpointRecord>> RecordReader::ListCheckpoints(std::string_view experiment_id) {
  std::lock_guard lock(mu_);
  return Query<CheckpointRecord>(
      db_, fl::StrCat("SELECT ", kCheckpointColumns, " FROM checkpoints WHERE experiment_id = ?1 ORDER BY round"),
      experiment_id, std::nullopt, ReadCheckpoint);
}

absl::StatusOr<std::vector<ClientEventRecord>> RecordReader::ListClientEvents(std::string_view experiment_id) {
  std::lock_guard lock(mu_);
  return Query<ClientEventRecord>(
      db_,
      fl::StrCat("SELECT ", kClientEventColumns,
                 " FROM client_events WHERE experiment_id = ?1 ORDER BY at_unix_ms, id"),
      experiment_id, std::nullopt, ReadClientEvent);
}

absl::StatusOr<std::optional<RoundRecord>> RecordReader::LastCommittedRound(std::string_view experiment_id) {
  std::lock_guard lock(mu_);
  return First(Query<RoundRecord>(db_,
                                  fl::StrCat("SELECT ", kRoundColumns,
                                             " FROM rounds WHERE experiment_id = ?1 AND status = 'committed' "
                                             "ORDER BY round DESC LIMIT 1"),
                                  experiment_id, std::nullopt, ReadRound));
}

absl::StatusOr<std::optional<CheckpointRecord>> RecordReader::LatestCheckpoint(std::string_view experiment_id) {
  std::lock_guard lock(mu_);
  return First(Query<CheckpointRecord>(
      db_,
      fl::StrCat("SELECT ", kCheckpointColumns,
                 " FROM checkpoints WHERE experiment_id = ?1 ORDER BY round DESC LIMIT 1"),
      experiment_id, std::nullopt, ReadCheckpoint));
}

absl::StatusOr<int64_t> RecordReader::QueryInt(std::string_view sql) {
  std::lock_guard lock(mu_);
  return db_.QueryInt(sql);
}

absl::StatusOr<std::string> RecordReader::QueryText(std::string_view sql) {
  std::lock_guard lock(mu_);
  return db_.QueryText(sql);
}

}  // namespace fl::instrumentation
