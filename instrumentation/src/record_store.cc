#include "fl/instrumentation/record_store.h"

#include <cstdio>
#include <span>
#include <utility>

#include "fl/core/str_cat.h"
#include "fl/instrumentation/sqlite.h"
#include "sqlite_writer.h"

namespace fl::instrumentation {
namespace {

using internal::Overloaded;

constexpr std::string_view kInsertExperiment = R"sql(
INSERT INTO experiments (id, name, status, status_reason, started_unix_ms, finished_unix_ms, config_json,
                         software_version, host, task)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10))sql";

constexpr std::string_view kUpdateExperimentTask = R"sql(
UPDATE experiments SET task = ?2 WHERE id = ?1)sql";

constexpr std::string_view kUpdateExperiment = R"sql(
UPDATE experiments SET status = ?2, status_reason = ?3, finished_unix_ms = ?4 WHERE id = ?1)sql";

constexpr std::string_view kInsertClient = R"sql(
INSERT INTO clients (experiment_id, client_id, client_name, device_class, link_kind, link_interface,
                     link_profile, cores, memory_bytes, accelerator, os, arch, client_version, joined_unix_ms,
                     left_unix_ms, left_reason)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)
ON CONFLICT (experiment_id, client_id) DO UPDATE SET
  client_name = excluded.client_name, device_class = excluded.device_class, link_kind = excluded.link_kind,
  link_interface = excluded.link_interface, link_profile = excluded.link_profile, cores = excluded.cores,
  memory_bytes = excluded.memory_bytes, accelerator = excluded.accelerator, os = excluded.os,
  arch = excluded.arch, client_version = excluded.client_version, left_unix_ms = NULL, left_reason = NULL)sql";

constexpr std::string_view kUpdateClientLeft = R"sql(
UPDATE clients SET left_unix_ms = ?3, left_reason = ?4 WHERE experiment_id = ?1 AND client_id = ?2)sql";

constexpr std::string_view kInsertRound = R"sql(
INSERT INTO rounds (experiment_id, round, attempt, status, failure_reason, started_unix_ms, ended_unix_ms,
                    duration_ms, aggregation_ms, num_selected, num_accepted, num_late, num_rejected,
                    num_dropped, num_examples, model_version, train_loss, eval_loss, eval_accuracy,
                    eval_num_examples, eval_mae, eval_perplexity)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22))sql";

constexpr std::string_view kUpdateRoundEvaluation = R"sql(
UPDATE rounds SET eval_loss = ?4, eval_accuracy = ?5, eval_num_examples = ?6, eval_mae = ?7, eval_perplexity = ?8
WHERE experiment_id = ?1 AND round = ?2 AND attempt = ?3)sql";

constexpr std::string_view kInsertClientRound = R"sql(
INSERT INTO client_rounds (experiment_id, round, attempt, client_id, outcome, reject_reason,
                           dispatched_unix_ms, num_examples, num_steps, downlink_ms, train_ms, eval_ms,
                           uplink_ms, uplink_server_ms, idle_ms, downlink_bytes, uplink_bytes, codec,
                           train_loss, clock_offset_ms, clock_rtt_ms, downlink_start_unix_ms,
                           train_start_unix_ms, eval_start_unix_ms, uplink_start_unix_ms, uplink_end_unix_ms,
                           uplink_server_start_unix_ms, downlink_server_start_unix_ms, downlink_server_ms)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22, ?23,
        ?24, ?25, ?26, ?27, ?28, ?29))sql";

constexpr std::string_view kUpdateClientRoundUplink = R"sql(
UPDATE client_rounds SET uplink_ms = ?5, uplink_start_unix_ms = ?6, uplink_end_unix_ms = ?7
WHERE experiment_id = ?1 AND round = ?2 AND attempt = ?3 AND client_id = ?4)sql";

constexpr std::string_view kInsertEvaluation = R"sql(
INSERT INTO evaluations (experiment_id, round, attempt, client_id, num_examples, loss, accuracy, eval_ms, mae,
                         reject_reason)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10))sql";

// A checkpoint file is rewritten when its round is re-run (after a crash before the round's commit in a database
// written before commits were atomic, or --resume-from-round): the row follows the file.
constexpr std::string_view kInsertCheckpoint = R"sql(
INSERT INTO checkpoints (experiment_id, round, model_version, path, bytes, fingerprint, checksum,
                         created_unix_ms)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
ON CONFLICT (experiment_id, round) DO UPDATE SET
  model_version = excluded.model_version, path = excluded.path, bytes = excluded.bytes,
  fingerprint = excluded.fingerprint, checksum = excluded.checksum, created_unix_ms = excluded.created_unix_ms)sql";

constexpr std::string_view kInsertClientEvent = R"sql(
INSERT INTO client_events (experiment_id, client_id, kind, round, task_id, reason, at_unix_ms)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7))sql";

constexpr std::string_view kSupersedeRounds = R"sql(
UPDATE rounds SET status = 'aborted', failure_reason = ?3
WHERE experiment_id = ?1 AND round > ?2 AND status = 'committed')sql";

}  // namespace

// The write connection and one prepared statement per record kind. Used only by the writer thread once the
// store is open.
struct RecordStore::Writer {
  sqlite::Database db;
  sqlite::Statement insert_experiment;
  sqlite::Statement update_experiment;
  sqlite::Statement update_experiment_task;
  sqlite::Statement insert_client;
  sqlite::Statement update_client_left;
  sqlite::Statement insert_round;
  sqlite::Statement update_round_evaluation;
  sqlite::Statement insert_client_round;
  sqlite::Statement update_client_round_uplink;
  sqlite::Statement insert_evaluation;
  sqlite::Statement insert_checkpoint;
  sqlite::Statement supersede_rounds;
  sqlite::Statement insert_client_event;

  absl::Status Prepare() {
    return internal::PrepareStatements(
        db, {{&insert_experiment, kInsertExperiment}, {&update_experiment, kUpdateExperiment},
             {&update_experiment_task, kUpdateExperimentTask},
             {&insert_client, kInsertClient}, {&update_client_left, kUpdateClientLeft}, {&insert_round, kInsertRound},
             {&update_round_evaluation, kUpdateRoundEvaluation}, {&insert_client_round, kInsertClientRound},
             {&update_client_round_uplink, kUpdateClientRoundUplink}, {&insert_evaluation, kInsertEvaluation},
             {&insert_checkpoint, kInsertCheckpoint}, {&supersede_rounds, kSupersedeRounds},
             {&insert_client_event, kInsertClientEvent}});
  }

  absl::Status Run(sqlite::Statement& stmt, std::string_view what, bool expect_change = false) {
    return internal::RunStatement(db, stmt, what, expect_change);
  }

  // Runs `write_parts` inside a savepoint: if any part fails, every part is undone and the first error returned,
  // so that a group record lands whole or not at all. An error that made SQLite roll back the enclosing
  // transaction (I/O, disk full) leaves nothing to undo here; WriteBatch notices the lost transaction.
  absl::Status WriteAtomically(absl::FunctionRef<absl::Status()> write_parts) {
    if (absl::Status s = db.Exec("SAVEPOINT fl_group"); !s.ok()) return s;
    absl::Status s = write_parts();
    if (s.ok()) s = db.Exec("RELEASE fl_group");
    if (!s.ok() && db.in_transaction()) {
      (void)db.Exec("ROLLBACK TO fl_group");
      (void)db.Exec("RELEASE fl_group");
    }
    return s;
  }

  absl::Status WriteOne(const Record& record) {
    absl::Status s = WritePart(record);
    return s.ok() ? s : Annotate(record, s);
  }

  absl::Status WritePart(const Record& record) {
    return std::visit(
        Overloaded{
            [&](const ExperimentRecord& r) {
              sqlite::Statement& st = insert_experiment;
              st.BindText(1, r.id);
              st.BindText(2, r.name);
              st.BindText(3, ExperimentStatusName(r.status));
              st.BindTextOrNull(4, r.status_reason);
              st.BindInt64(5, r.started_unix_ms);
              st.BindOptionalInt64(6, r.finished_unix_ms);
              st.BindText(7, r.config_json.empty() ? std::string_view("{}") : std::string_view(r.config_json));
              st.BindText(8, r.software_version);
              st.BindTextOrNull(9, r.host);
              st.BindTextOrNull(10, r.task);
              return Run(st, "insert into experiments");
            },
            [&](const ExperimentTaskUpdate& r) {
              sqlite::Statement& st = update_experiment_task;
              st.BindText(1, r.experiment_id);
              st.BindText(2, r.task);
              return Run(st, "update experiments (task)", /*expect_change=*/true);
            },
            [&](const ExperimentStatusUpdate& r) {
              sqlite::Statement& st = update_experiment;
              st.BindText(1, r.experiment_id);
              st.BindText(2, ExperimentStatusName(r.status));
              st.BindTextOrNull(3, r.status_reason);
              st.BindOptionalInt64(4, r.finished_unix_ms);
              return Run(st, "update experiments", /*expect_change=*/true);
            },
            [&](const ClientRecord& r) {
              sqlite::Statement& st = insert_client;
              st.BindText(1, r.experiment_id);
              st.BindText(2, r.client_id);
              st.BindTextOrNull(3, r.client_name);
              st.BindTextOrNull(4, r.device_class);
              st.BindTextOrNull(5, r.link_kind);
              st.BindTextOrNull(6, r.link_interface);
              st.BindTextOrNull(7, r.link_profile);
              st.BindOptionalInt64(8, r.cores);
              st.BindOptionalInt64(9, r.memory_bytes);
              st.BindTextOrNull(10, r.accelerator);
              st.BindTextOrNull(11, r.os);
              st.BindTextOrNull(12, r.arch);
              st.BindTextOrNull(13, r.client_version);
              st.BindInt64(14, r.joined_unix_ms);
              st.BindOptionalInt64(15, r.left_unix_ms);
              st.BindTextOrNull(16, r.left_reason);
              return Run(st, "insert into clients");
            },
            [&](const ClientLeftRecord& r) {
              sqlite::Statement& st = update_client_left;
              st.BindText(1, r.experiment_id);
              st.BindText(2, r.client_id);
              st.BindInt64(3, r.left_unix_ms);
              st.BindTextOrNull(4, r.reason);
              return Run(st, "update clients", /*expect_change=*/true);
            },
            [&](const RoundRecord& r) {
              sqlite::Statement& st = insert_round;
              st.BindText(1, r.experiment_id);
              st.BindInt64(2, r.round);
              st.BindInt64(3, r.attempt);
              st.BindText(4, RoundStatusName(r.status));
              st.BindTextOrNull(5, r.failure_reason);
              st.BindInt64(6, r.started_unix_ms);
              st.BindInt64(7, r.ended_unix_ms);
              st.BindDouble(8, r.duration_ms);
              st.BindOptionalDouble(9, r.aggregation_ms);
              st.BindInt64(10, r.num_selected);
              st.BindInt64(11, r.num_accepted);
              st.BindInt64(12, r.num_late);
              st.BindInt64(13, r.num_rejected);
              st.BindInt64(14, r.num_dropped);
              st.BindInt64(15, r.num_examples);
              st.BindOptionalInt64(16, r.model_version);
              st.BindOptionalDouble(17, r.train_loss);
              st.BindOptionalDouble(18, r.eval_loss);
              st.BindOptionalDouble(19, r.eval_accuracy);
              st.BindOptionalInt64(20, r.eval_num_examples);
              st.BindOptionalDouble(21, r.eval_mae);
              st.BindOptionalDouble(22, r.eval_perplexity);
              return Run(st, "insert into rounds");
            },
            [&](const RoundEvaluationUpdate& r) {
              sqlite::Statement& st = update_round_evaluation;
              st.BindText(1, r.experiment_id);
              st.BindInt64(2, r.round);
              st.BindInt64(3, r.attempt);
              st.BindDouble(4, r.eval_loss);
              st.BindOptionalDouble(5, r.eval_accuracy);
              st.BindInt64(6, r.eval_num_examples);
              st.BindOptionalDouble(7, r.eval_mae);
              st.BindOptionalDouble(8, r.eval_perplexity);
              return Run(st, "update rounds (evaluation)", /*expect_change=*/true);
            },
            [&](const ClientRoundRecord& r) {
              sqlite::Statement& st = insert_client_round;
              st.BindText(1, r.experiment_id);
              st.BindInt64(2, r.round);
              st.BindInt64(3, r.attempt);
              st.BindText(4, r.client_id);
              st.BindText(5, ClientOutcomeName(r.outcome));
              st.BindTextOrNull(6, r.reject_reason);
              st.BindOptionalInt64(7, r.dispatched_unix_ms);
              st.BindOptionalInt64(8, r.num_examples);
              st.BindOptionalInt64(9, r.num_steps);
              st.BindOptionalDouble(10, r.downlink_ms);
              st.BindOptionalDouble(11, r.train_ms);
              st.BindOptionalDouble(12, r.eval_ms);
              st.BindOptionalDouble(13, r.uplink_ms);
              st.BindOptionalDouble(14, r.uplink_server_ms);
              st.BindOptionalDouble(15, r.idle_ms);
              st.BindOptionalInt64(16, r.downlink_bytes);
              st.BindOptionalInt64(17, r.uplink_bytes);
              st.BindTextOrNull(18, r.codec);
              st.BindOptionalDouble(19, r.train_loss);
              st.BindOptionalDouble(20, r.clock_offset_ms);
              st.BindOptionalDouble(21, r.clock_rtt_ms);
              st.BindOptionalDouble(22, r.downlink_start_unix_ms);
              st.BindOptionalDouble(23, r.train_start_unix_ms);
              st.BindOptionalDouble(24, r.eval_start_unix_ms);
              st.BindOptionalDouble(25, r.uplink_start_unix_ms);
              st.BindOptionalDouble(26, r.uplink_end_unix_ms);
              st.BindOptionalDouble(27, r.uplink_server_start_unix_ms);
              st.BindOptionalDouble(28, r.downlink_server_start_unix_ms);
              st.BindOptionalDouble(29, r.downlink_server_ms);
              return Run(st, "insert into client_rounds");
            },
            [&](const ClientRoundUplinkUpdate& r) {
              sqlite::Statement& st = update_client_round_uplink;
              st.BindText(1, r.experiment_id);
              st.BindInt64(2, r.round);
              st.BindInt64(3, r.attempt);
              st.BindText(4, r.client_id);
              st.BindDouble(5, r.uplink_ms);
              st.BindOptionalDouble(6, r.uplink_start_unix_ms);
              st.BindOptionalDouble(7, r.uplink_end_unix_ms);
              return Run(st, "update client_rounds (uplink)", /*expect_change=*/true);
            },
            [&](const EvaluationRecord& r) {
              sqlite::Statement& st = insert_evaluation;
              st.BindText(1, r.experiment_id);
              st.BindInt64(2, r.round);
              st.BindInt64(3, r.attempt);
              st.BindText(4, r.client_id);
              st.BindInt64(5, r.num_examples);
              st.BindOptionalDouble(6, r.loss);
              st.BindOptionalDouble(7, r.accuracy);
              st.BindOptionalDouble(8, r.eval_ms);
              st.BindOptionalDouble(9, r.mae);
              st.BindTextOrNull(10, r.reject_reason);
              return Run(st, "insert into evaluations");
            },
            [&](const CheckpointRecord& r) {
              sqlite::Statement& st = insert_checkpoint;
              st.BindText(1, r.experiment_id);
              st.BindInt64(2, r.round);
              st.BindInt64(3, r.model_version);
              st.BindText(4, r.path);
              st.BindInt64(5, r.bytes);
              st.BindText(6, r.fingerprint);
              st.BindTextOrNull(7, r.checksum);
              st.BindInt64(8, r.created_unix_ms);
              return Run(st, "insert into checkpoints");
            },
            [&](const RoundCommitRecord& r) {
              return WriteAtomically([&]() -> absl::Status {
                // Parent first: client rows reference the round's row.
                if (absl::Status s = WritePart(r.round); !s.ok()) return s;
                for (const ClientRoundRecord& c : r.client_rounds) {
                  if (absl::Status s = WritePart(c); !s.ok()) return Annotate(c, s);
                }
                if (r.checkpoint.has_value()) {
                  if (absl::Status s = WritePart(*r.checkpoint); !s.ok()) return Annotate(*r.checkpoint, s);
                }
                return absl::OkStatus();
              });
            },
            [&](const EvaluationCommitRecord& r) {
              return WriteAtomically([&]() -> absl::Status {
                for (const EvaluationRecord& e : r.evaluations) {
                  if (absl::Status s = WritePart(e); !s.ok()) return Annotate(e, s);
                }
                if (r.figures.has_value()) {
                  if (absl::Status s = WritePart(*r.figures); !s.ok()) return Annotate(*r.figures, s);
                }
                return absl::OkStatus();
              });
            },
            [&](const RoundsSupersededUpdate& r) {
              sqlite::Statement& st = supersede_rounds;
              st.BindText(1, r.experiment_id);
              st.BindInt64(2, r.after_round);
              st.BindText(3, r.reason);
              return Run(st, "update rounds (superseded)");
            },
            [&](const ClientEventRecord& r) {
              sqlite::Statement& st = insert_client_event;
              st.BindText(1, r.experiment_id);
              st.BindText(2, r.client_id);
              st.BindText(3, ClientEventKindName(r.kind));
              st.BindOptionalInt64(4, r.round);
              st.BindTextOrNull(5, r.task_id);
              st.BindText(6, BoundClientEventReason(r.reason));
              st.BindInt64(7, r.at_unix_ms);
              return Run(st, "insert into client_events");
            },
        },
        record);
  }

  // Names the record in an error about storing it.
  static absl::Status Annotate(const Record& record, const absl::Status& s) {
    return absl::Status(s.code(), fl::StrCat("could not store ", DescribeRecord(record), ": ", fl::ToStd(s.message())));
  }

  // One transaction per batch; the error policy is internal::WriteBatch's.
  internal::BatchResult WriteBatch(std::span<const Record> batch) {
    return internal::WriteBatch(
        db, batch.size(), [&](size_t i) { return WriteOne(batch[i]); },
        [&](size_t i, const absl::Status& s) { return Annotate(batch[i], s); });
  }
};

absl::StatusOr<std::unique_ptr<RecordStore>> RecordStore::Open(const std::string& path, RecordStoreOptions options) {
  if (options.max_queue_records == 0) options.max_queue_records = 1;
  if (options.max_batch_records == 0) options.max_batch_records = 1;
  if (options.busy_timeout_ms < 0) options.busy_timeout_ms = 0;

  auto writer = std::make_unique<Writer>();
  absl::StatusOr<sqlite::Database> db = internal::OpenWriteConnection(path, options.busy_timeout_ms);
  if (!db.ok()) return db.status();
  writer->db = *std::move(db);
  sqlite::Database& d = writer->db;

  ConnectionSettings settings;
  settings.journal_mode = "wal";  // OpenWriteConnection refuses every other mode
  for (auto [pragma, out] : {std::pair{"PRAGMA synchronous", &settings.synchronous},
                             std::pair{"PRAGMA foreign_keys", &settings.foreign_keys},
                             std::pair{"PRAGMA busy_timeout", &settings.busy_timeout_ms},
                             std::pair{"PRAGMA user_version", &settings.schema_version}}) {
    absl::StatusOr<int64_t> v = d.QueryInt(pragma);
    if (!v.ok()) return v.status();
    *out = *v;
  }
  if (absl::Status s = writer->Prepare(); !s.ok()) return s;

  return std::unique_ptr<RecordStore>(new RecordStore(path, std::move(options), std::move(writer), settings));
}

RecordStore::RecordStore(std::string path, RecordStoreOptions options, std::unique_ptr<Writer> writer,
                         ConnectionSettings settings)
    : path_(std::move(path)),
      options_(std::move(options)),
      settings_(std::move(settings)),
      writer_(std::move(writer)) {
  Writer* w = writer_.get();
  thread_ = std::make_unique<internal::WriterThread<Record>>(
      internal::WriterThread<Record>::Options{options_.max_queue_records, options_.max_batch_records,
                                              options_.on_error},
      [w](std::span<const Record> batch) { return w->WriteBatch(batch); });
}

RecordStore::~RecordStore() {
  absl::Status s = Close();
  if (!s.ok()) {
    std::fprintf(stderr, "fl records: error not collected before the record store closed: %s\n",
                 std::string(fl::ToStd(s.message())).c_str());
  }
}

absl::Status RecordStore::Admit(Record record, bool wait) {
  switch (thread_->Push(record, wait)) {
    case internal::WriterThread<Record>::Admission::kQueued:
      return absl::OkStatus();
    case internal::WriterThread<Record>::Admission::kFull:
      return absl::ResourceExhaustedError(fl::StrCat("records database ", path_, ": write queue full (",
                                                     options_.max_queue_records, " records); dropped ",
                                                     DescribeRecord(record)));
    case internal::WriterThread<Record>::Admission::kClosed:
      break;
  }
  return absl::FailedPreconditionError(
      fl::StrCat("records database ", path_, ": record store is closed; dropped ", DescribeRecord(record)));
}

absl::Status RecordStore::Enqueue(Record record) { return Admit(std::move(record), /*wait=*/true); }

absl::Status RecordStore::TryEnqueue(Record record) { return Admit(std::move(record), /*wait=*/false); }

absl::Status RecordStore::Flush() { return thread_->Flush(); }

absl::Status RecordStore::Close() {
  std::lock_guard close_lock(close_mu_);
  absl::Status s = thread_->Stop();  // the writer drains the queue before it exits
  writer_.reset();                   // finalizes statements, closes the connection (checkpoints the WAL)
  return s;
}

RecordStoreStats RecordStore::stats() const { return thread_->stats(); }

}  // namespace fl::instrumentation
