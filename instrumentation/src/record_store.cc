#include "fl/instrumentation/record_store.h"

#include <cstdio>
#include <span>
#include <utility>
#include <vector>

#include "fl/core/str_cat.h"
#include "fl/instrumentation/record_columns.h"
#include "fl/instrumentation/sqlite.h"
#include "sqlite_writer.h"

namespace fl::instrumentation {
namespace {

using internal::Overloaded;

// The updates of rows written earlier: each names the columns it sets and the key it matches (record_columns.h).
const UpdateSpec<ExperimentTaskUpdate>& ExperimentTaskUpdateSpec() {
  using U = ExperimentTaskUpdate;
  static const UpdateSpec<U> spec{&ExperimentsTable().spec, {Col<&U::task>("task")}, {Col<&U::experiment_id>("id")}};
  return spec;
}

const UpdateSpec<ExperimentStatusUpdate>& ExperimentStatusUpdateSpec() {
  using U = ExperimentStatusUpdate;
  static const UpdateSpec<U> spec{&ExperimentsTable().spec,
                                  {Col<&U::status>("status"), Col<&U::status_reason>("status_reason"),
                                   Col<&U::finished_unix_ms>("finished_unix_ms")},
                                  {Col<&U::experiment_id>("id")}};
  return spec;
}

const UpdateSpec<ClientLeftRecord>& ClientLeftSpec() {
  using U = ClientLeftRecord;
  static const UpdateSpec<U> spec{&ClientsTable().spec,
                                  {Col<&U::left_unix_ms>("left_unix_ms"), Col<&U::reason>("left_reason")},
                                  {Col<&U::experiment_id>("experiment_id"), Col<&U::client_id>("client_id")}};
  return spec;
}

const UpdateSpec<RoundEvaluationUpdate>& RoundEvaluationSpec() {
  using U = RoundEvaluationUpdate;
  static const UpdateSpec<U> spec{
      &RoundsTable().spec,
      {Col<&U::eval_loss>("eval_loss"), Col<&U::eval_accuracy>("eval_accuracy"),
       Col<&U::eval_num_examples>("eval_num_examples"), Col<&U::eval_mae>("eval_mae"),
       Col<&U::eval_perplexity>("eval_perplexity")},
      {Col<&U::experiment_id>("experiment_id"), Col<&U::round>("round"), Col<&U::attempt>("attempt")}};
  return spec;
}

const UpdateSpec<ClientRoundUplinkUpdate>& ClientRoundUplinkSpec() {
  using U = ClientRoundUplinkUpdate;
  static const UpdateSpec<U> spec{
      &ClientRoundsTable().spec,
      {Col<&U::uplink_ms>("uplink_ms"), Col<&U::uplink_start_unix_ms>("uplink_start_unix_ms"),
       Col<&U::uplink_end_unix_ms>("uplink_end_unix_ms")},
      {Col<&U::experiment_id>("experiment_id"), Col<&U::round>("round"), Col<&U::attempt>("attempt"),
       Col<&U::client_id>("client_id")}};
  return spec;
}

// The primary key of client_rounds, for the upsert of a folded row.
std::vector<std::string_view> ClientRoundKey() { return {"experiment_id", "round", "attempt", "client_id"}; }

// Not an equality on a key, so written out; its parameters are bound by name.
constexpr std::string_view kSupersedeRounds = R"sql(
UPDATE rounds SET status = 'aborted', failure_reason = :reason
WHERE experiment_id = :experiment_id AND round > :after_round AND status = 'committed')sql";

// A client fl-server forgot (ClientForgottenRecord): only one no round or evaluation row refers to.
constexpr std::string_view kForgetClient = R"sql(
DELETE FROM clients WHERE experiment_id = :experiment_id AND client_id = :client_id
  AND NOT EXISTS (SELECT 1 FROM client_rounds c WHERE c.experiment_id = :experiment_id AND c.client_id = :client_id)
  AND NOT EXISTS (SELECT 1 FROM evaluations e WHERE e.experiment_id = :experiment_id AND e.client_id = :client_id)
  AND NOT EXISTS (SELECT 1 FROM secagg_stages s WHERE s.experiment_id = :experiment_id AND s.client_id = :client_id)
)sql";

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
  sqlite::Statement replace_client_round;
  sqlite::Statement update_client_round_uplink;
  sqlite::Statement insert_evaluation;
  sqlite::Statement insert_checkpoint;
  sqlite::Statement supersede_rounds;
  sqlite::Statement forget_client;
  sqlite::Statement insert_client_event;
  sqlite::Statement insert_security_event;
  sqlite::Statement insert_secagg_stage;

  absl::Status Prepare() {
    std::vector<absl::StatusOr<std::string>> updates = {
        UpdateSql(ExperimentStatusUpdateSpec()), UpdateSql(ExperimentTaskUpdateSpec()), UpdateSql(ClientLeftSpec()),
        UpdateSql(RoundEvaluationSpec()), UpdateSql(ClientRoundUplinkSpec())};
    for (const absl::StatusOr<std::string>& sql : updates) {
      if (!sql.ok()) return sql.status();
    }
    return internal::PrepareStatements(
        db, {{&insert_experiment, InsertSql(ExperimentsTable())},
             {&update_experiment, *updates[0]},
             {&update_experiment_task, *updates[1]},
             // A client that joins again replaces what it reported; its first admission time stays.
             {&insert_client, InsertSql(ClientsTable(), {"experiment_id", "client_id"}, {"joined_unix_ms"})},
             {&update_client_left, *updates[2]},
             {&insert_round, InsertSql(RoundsTable())},
             {&update_round_evaluation, *updates[3]},
             {&insert_client_round, InsertSql(ClientRoundsTable())},
             // A late update folded into a later round replaces the row its own round's commit wrote (schema v9).
             {&replace_client_round, InsertSql(ClientRoundsTable(), ClientRoundKey())},
             {&update_client_round_uplink, *updates[4]},
             {&insert_evaluation, InsertSql(EvaluationsTable())},
             // A checkpoint file is rewritten when its round is re-run (after a crash before the round's commit in
             // a database written before commits were atomic, or --resume-from-round): the row follows the file.
             {&insert_checkpoint, InsertSql(CheckpointsTable(), {"experiment_id", "round"})},
             {&supersede_rounds, kSupersedeRounds},
             {&forget_client, kForgetClient},
             {&insert_client_event, InsertSql(ClientEventsTable())},
             {&insert_security_event, InsertSql(SecurityEventsTable())},
             {&insert_secagg_stage, InsertSql(SecAggStagesTable())}});
  }

  absl::Status Run(sqlite::Statement& stmt, std::string_view what, bool expect_change = false) {
    return internal::RunStatement(db, stmt, what, expect_change);
  }

  template <class Row>
  absl::Status Insert(sqlite::Statement& st, const RowTable<Row>& table, const Row& row) {
    BindRow(st, table, row);
    return Run(st, fl::StrCat("insert into ", table.spec.name));
  }

  // An update of a row written earlier: one that matches no row is NotFound.
  template <class Row>
  absl::Status Update(sqlite::Statement& st, const UpdateSpec<Row>& update, const Row& row, std::string_view what) {
    BindUpdate(st, update, row);
    return Run(st, fl::StrCat("update ", update.table->name, " (", what, ")"), /*expect_change=*/true);
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
            [&](const ExperimentRecord& r) { return Insert(insert_experiment, ExperimentsTable(), r); },
            [&](const ExperimentTaskUpdate& r) {
              return Update(update_experiment_task, ExperimentTaskUpdateSpec(), r, "task");
            },
            [&](const ExperimentStatusUpdate& r) {
              return Update(update_experiment, ExperimentStatusUpdateSpec(), r, "status");
            },
            [&](const ClientRecord& r) { return Insert(insert_client, ClientsTable(), r); },
            [&](const ClientLeftRecord& r) { return Update(update_client_left, ClientLeftSpec(), r, "left"); },
            [&](const RoundRecord& r) { return Insert(insert_round, RoundsTable(), r); },
            [&](const RoundEvaluationUpdate& r) {
              return Update(update_round_evaluation, RoundEvaluationSpec(), r, "evaluation");
            },
            [&](const ClientRoundRecord& r) { return Insert(insert_client_round, ClientRoundsTable(), r); },
            [&](const ClientRoundUplinkUpdate& r) {
              return Update(update_client_round_uplink, ClientRoundUplinkSpec(), r, "uplink");
            },
            [&](const EvaluationRecord& r) { return Insert(insert_evaluation, EvaluationsTable(), r); },
            [&](const CheckpointRecord& r) { return Insert(insert_checkpoint, CheckpointsTable(), r); },
            [&](const ClientEventRecord& r) { return Insert(insert_client_event, ClientEventsTable(), r); },
            [&](const SecurityEventRecord& r) { return Insert(insert_security_event, SecurityEventsTable(), r); },
            [&](const SecAggStageRecord& r) { return Insert(insert_secagg_stage, SecAggStagesTable(), r); },
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
                for (const ClientRoundRecord& c : r.folded_rows) {
                  if (absl::Status s = Insert(replace_client_round, ClientRoundsTable(), c); !s.ok()) {
                    return Annotate(c, s);
                  }
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
              st.BindText(st.ParameterIndex(":experiment_id"), r.experiment_id);
              st.BindInt64(st.ParameterIndex(":after_round"), r.after_round);
              st.BindText(st.ParameterIndex(":reason"), r.reason);
              return Run(st, "update rounds (superseded)");
            },
            [&](const ClientForgottenRecord& r) {
              sqlite::Statement& st = forget_client;
              st.BindText(st.ParameterIndex(":experiment_id"), r.experiment_id);
              st.BindText(st.ParameterIndex(":client_id"), r.client_id);
              return Run(st, "delete from clients (forgotten)");
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
    : path_(std::move(path)), options_(std::move(options)), settings_(std::move(settings)), writer_(std::move(writer)) {
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
    case internal::WriterThread<Record>::Admission::kQueued: return absl::OkStatus();
    case internal::WriterThread<Record>::Admission::kFull:
      return absl::ResourceExhaustedError(fl::StrCat("records database ", path_, ": write queue full (",
                                                     options_.max_queue_records, " records); dropped ",
                                                     DescribeRecord(record)));
    case internal::WriterThread<Record>::Admission::kClosed: break;
  }
  return absl::FailedPreconditionError(
      fl::StrCat("records database ", path_, ": record store is closed; dropped ", DescribeRecord(record)));
}

absl::Status RecordStore::Enqueue(Record record) { return Admit(std::move(record), /*wait=*/true); }

absl::Status RecordStore::TryEnqueue(Record record) { return Admit(std::move(record), /*wait=*/false); }

absl::Status RecordStore::Flush() { return thread_->Flush(); }

absl::Status RecordStore::Close() {
  fl::MutexLock close_lock(close_mu_);
  absl::Status s = thread_->Stop();  // the writer drains the queue before it exits
  writer_.reset();                   // finalizes statements, closes the connection (checkpoints the WAL)
  return s;
}

RecordStoreStats RecordStore::stats() const { return thread_->stats(); }

}  // namespace fl::instrumentation
