#include "fl/instrumentation/record_reader.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "fl/core/str_cat.h"
#include "fl/instrumentation/record_columns.h"
#include "fl/instrumentation/schema.h"

namespace fl::instrumentation {
namespace {

// SELECT <the table's columns> FROM <table> <rest>, with text parameter ?1 = `key` (when `rest` has it) and
// integer ?2 = `number`, every row read as the table declares (record_columns.h). A table newer than the file's
// schema version has no rows; its columns newer than the file read as NULL.
template <typename Row>
absl::StatusOr<std::vector<Row>> Select(sqlite::Database& db, int schema_version, const RowTable<Row>& table,
                                        std::string_view rest, std::string_view key = "",
                                        std::optional<int64_t> number = std::nullopt) {
  std::vector<Row> out;
  if (table.spec.since_version > schema_version) return out;
  absl::StatusOr<sqlite::Statement> st =
      db.Prepare(fl::StrCat("SELECT ", SelectList(table, schema_version), " FROM ", table.spec.name, " ", rest));
  if (!st.ok()) return st.status();
  if (sqlite3_bind_parameter_count(st->get()) >= 1) st->BindText(1, key);
  if (number.has_value()) st->BindInt64(2, *number);
  while (true) {
    absl::StatusOr<bool> row = st->Step(fl::StrCat("read ", table.spec.name));
    if (!row.ok()) return row.status();
    if (!*row) break;
    absl::StatusOr<Row> value = ReadRow(*st, table);
    if (!value.ok()) {
      return absl::DataLossError(
          fl::StrCat("records database ", db.path(), ": unreadable row: ", fl::ToStd(value.status().message())));
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

absl::StatusOr<sqlite::Database> OpenReadOnly(const std::string& path, int busy_timeout_ms) {
  if (path.empty()) return absl::InvalidArgumentError("records database: empty path");
  if (absl::Status s = CheckRecordsFile(path); !s.ok()) return s;
  absl::StatusOr<sqlite::Database> db = sqlite::Database::Open(path, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX);
  if (!db.ok()) return db.status();
  if (absl::Status s = db->Exec(fl::StrCat("PRAGMA busy_timeout = ", busy_timeout_ms < 0 ? 0 : busy_timeout_ms));
      !s.ok()) {
    return s;
  }
  return db;
}

std::string_view FileKind(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

}  // namespace

absl::Status CheckRecordsFile(const std::string& path) {
  struct stat st {};
  // stat(2) never opens the file: it cannot block on a FIFO.
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) {
      return absl::NotFoundError(
          fl::StrCat("records database ", path, " does not exist: give the file fl-server wrote with --db"));
    }
    return absl::InvalidArgumentError(fl::StrCat("records database ", path, ": ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    const std::string_view kind = FileKind(st.st_mode);
    return absl::InvalidArgumentError(fl::StrCat("records database ", path, ": is ", kind,
                                                 kind == "not a regular file" ? "" : ", not a regular file",
                                                 "; give the file fl-server wrote with --db"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<RecordReader>> RecordReader::Open(const std::string& path, int busy_timeout_ms) {
  absl::StatusOr<sqlite::Database> db = OpenReadOnly(path, busy_timeout_ms);
  if (!db.ok()) return db.status();
  if (absl::Status s = CheckSchemaVersion(*db, LatestSchemaVersion()); !s.ok()) return s;
  return std::unique_ptr<RecordReader>(new RecordReader(*std::move(db), LatestSchemaVersion()));
}

absl::StatusOr<std::unique_ptr<RecordReader>> RecordReader::OpenAnyVersion(const std::string& path,
                                                                           int busy_timeout_ms) {
  absl::StatusOr<sqlite::Database> db = OpenReadOnly(path, busy_timeout_ms);
  if (!db.ok()) return db.status();
  absl::StatusOr<int> version = CheckReadableSchemaVersion(*db, LatestSchemaVersion());
  if (!version.ok()) return version.status();
  return std::unique_ptr<RecordReader>(new RecordReader(*std::move(db), *version));
}

bool RecordReader::HasColumn(std::string_view table, std::string_view column) const {
  const TableSpec* t = FindRecordTable(table);
  const ColumnSpec* c = t != nullptr ? t->Find(column) : nullptr;
  return c != nullptr && c->since_version <= schema_version_;
}

RecordReader::Snapshot::Snapshot(Snapshot&& other) noexcept : reader_(std::exchange(other.reader_, nullptr)) {}

RecordReader::Snapshot::~Snapshot() {
  if (reader_ == nullptr) return;
  fl::MutexLock lock(reader_->mu_);
  // A read transaction has nothing to keep: ending it only lets the file's WAL be checkpointed past it.
  (void)reader_->db_.Exec("COMMIT");
}

absl::StatusOr<RecordReader::Snapshot> RecordReader::ReadSnapshot() {
  fl::MutexLock lock(mu_);
  if (db_.in_transaction()) {
    return absl::FailedPreconditionError(
        fl::StrCat("records database ", db_.path(), ": a snapshot is already open on this reader"));
  }
  if (absl::Status s = db_.Exec("BEGIN"); !s.ok()) return s;
  return Snapshot(this);
}

absl::StatusOr<ExperimentRecord> RecordReader::GetExperiment(std::string_view experiment_id) {
  fl::MutexLock lock(mu_);
  absl::StatusOr<std::optional<ExperimentRecord>> r =
      First(Select(db_, schema_version_, ExperimentsTable(), "WHERE id = ?1", experiment_id));
  if (!r.ok()) return r.status();
  if (!r->has_value()) {
    return absl::NotFoundError(
        fl::StrCat("records database ", db_.path(), ": no experiment with id '", experiment_id, "'"));
  }
  return **std::move(r);
}

absl::StatusOr<std::vector<ExperimentRecord>> RecordReader::ListExperiments() {
  fl::MutexLock lock(mu_);
  return Select(db_, schema_version_, ExperimentsTable(), "ORDER BY started_unix_ms, rowid");
}

absl::StatusOr<std::vector<ClientRecord>> RecordReader::ListClients(std::string_view experiment_id) {
  fl::MutexLock lock(mu_);
  return Select(db_, schema_version_, ClientsTable(), "WHERE experiment_id = ?1 ORDER BY joined_unix_ms, client_id",
                experiment_id);
}

absl::StatusOr<std::vector<RoundRecord>> RecordReader::ListRounds(std::string_view experiment_id) {
  fl::MutexLock lock(mu_);
  return Select(db_, schema_version_, RoundsTable(), "WHERE experiment_id = ?1 ORDER BY round, attempt", experiment_id);
}

absl::StatusOr<int64_t> RecordReader::CountRounds(std::string_view experiment_id) {
  fl::MutexLock lock(mu_);
  absl::StatusOr<sqlite::Statement> st = db_.Prepare("SELECT count(*) FROM rounds WHERE experiment_id = ?1");
  if (!st.ok()) return st.status();
  st->BindText(1, experiment_id);
  absl::StatusOr<bool> row = st->Step("count rounds");
  if (!row.ok()) return row.status();
  return st->ColumnInt64(0);
}

absl::StatusOr<std::vector<ClientRoundRecord>> RecordReader::ListClientRounds(std::string_view experiment_id,
                                                                              int64_t round) {
  fl::MutexLock lock(mu_);
  return Select(db_, schema_version_, ClientRoundsTable(),
                "WHERE experiment_id = ?1 AND round = ?2 ORDER BY attempt, client_id", experiment_id, round);
}

absl::StatusOr<std::vector<ClientRoundRecord>> RecordReader::ListClientRounds(std::string_view experiment_id) {
  fl::MutexLock lock(mu_);
  // rowid: the order the server decided the outcomes in, i.e. the order updates finished arriving.
  return Select(db_, schema_version_, ClientRoundsTable(), "WHERE experiment_id = ?1 ORDER BY round, attempt, rowid",
                experiment_id);
}

absl::StatusOr<std::vector<EvaluationRecord>> RecordReader::ListEvaluations(std::string_view experiment_id,
                                                                            int64_t round) {
  fl::MutexLock lock(mu_);
  return Select(db_, schema_version_, EvaluationsTable(),
                "WHERE experiment_id = ?1 AND round = ?2 ORDER BY attempt, client_id", experiment_id, round);
}

absl::StatusOr<std::vector<EvaluationRecord>> RecordReader::ListEvaluations(std::string_view experiment_id) {
  fl::MutexLock lock(mu_);
  return Select(db_, schema_version_, EvaluationsTable(), "WHERE experiment_id = ?1 ORDER BY round, attempt, client_id",
                experiment_id);
}

absl::StatusOr<std::vector<CheckpointRecord>> RecordReader::ListCheckpoints(std::string_view experiment_id) {
  fl::MutexLock lock(mu_);
  return Select(db_, schema_version_, CheckpointsTable(), "WHERE experiment_id = ?1 ORDER BY round", experiment_id);
}

absl::StatusOr<std::vector<ClientEventRecord>> RecordReader::ListClientEvents(std::string_view experiment_id) {
  fl::MutexLock lock(mu_);
  return Select(db_, schema_version_, ClientEventsTable(), "WHERE experiment_id = ?1 ORDER BY at_unix_ms, id",
                experiment_id);
}

absl::StatusOr<std::vector<SecurityEventRecord>> RecordReader::ListSecurityEvents(std::string_view experiment_id) {
  fl::MutexLock lock(mu_);
  return Select(db_, schema_version_, SecurityEventsTable(), "WHERE experiment_id = ?1 ORDER BY at_unix_ms, id",
                experiment_id);
}

absl::StatusOr<std::vector<SecAggStageRecord>> RecordReader::ListSecAggStages(std::string_view experiment_id) {
  fl::MutexLock lock(mu_);
  // Stages in the order they run, not in the order of their names.
  return Select(db_, schema_version_, SecAggStagesTable(),
                "WHERE experiment_id = ?1 ORDER BY round, attempt, client_id, CASE stage WHEN 'advertise_keys' THEN 0 "
                "WHEN 'share_keys' THEN 1 WHEN 'masked_upload' THEN 2 ELSE 3 END",
                experiment_id);
}

absl::StatusOr<std::vector<IslandRecord>> RecordReader::ListIslands(std::string_view experiment_id) {
  fl::MutexLock lock(mu_);
  return Select(db_, schema_version_, IslandsTable(), "WHERE experiment_id = ?1 ORDER BY join_seq", experiment_id);
}

absl::StatusOr<std::vector<IslandEpochRecord>> RecordReader::ListIslandEpochs(std::string_view experiment_id) {
  fl::MutexLock lock(mu_);
  return Select(db_, schema_version_, IslandEpochsTable(), "WHERE experiment_id = ?1 ORDER BY epoch", experiment_id);
}

absl::StatusOr<std::vector<IslandSyncRecord>> RecordReader::ListIslandSyncs(std::string_view experiment_id) {
  fl::MutexLock lock(mu_);
  return Select(db_, schema_version_, IslandSyncsTable(), "WHERE experiment_id = ?1 ORDER BY epoch, ring_index",
                experiment_id);
}

absl::StatusOr<std::optional<RoundRecord>> RecordReader::LastCommittedRound(std::string_view experiment_id) {
  fl::MutexLock lock(mu_);
  return First(Select(db_, schema_version_, RoundsTable(),
                      "WHERE experiment_id = ?1 AND status = 'committed' ORDER BY round DESC LIMIT 1", experiment_id));
}

absl::StatusOr<std::optional<CheckpointRecord>> RecordReader::LatestCheckpoint(std::string_view experiment_id) {
  fl::MutexLock lock(mu_);
  return First(Select(db_, schema_version_, CheckpointsTable(), "WHERE experiment_id = ?1 ORDER BY round DESC LIMIT 1",
                      experiment_id));
}

absl::StatusOr<int64_t> RecordReader::QueryInt(std::string_view sql) {
  fl::MutexLock lock(mu_);
  return db_.QueryInt(sql);
}

absl::StatusOr<std::string> RecordReader::QueryText(std::string_view sql) {
  fl::MutexLock lock(mu_);
  return db_.QueryText(sql);
}

}  // namespace fl::instrumentation
