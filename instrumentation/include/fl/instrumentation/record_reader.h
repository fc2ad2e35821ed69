// RecordReader: the read side of an experiment records database, on a read-only connection of its own.
//
// It reads committed data only (WAL snapshot per query, or one for several with ReadSnapshot), never blocks the
// writer, and can be used while an fl-server is writing to the same file. Rows are read as the columns are
// declared (record_columns.h). Used by tests, by fl-server --resume (LastCommittedRound, LatestCheckpoint) and by
// fl-report (OpenAnyVersion: databases of every schema version). Thread-safe (one connection behind a mutex); open one
// reader per thread for parallel reads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fl/core/mutex.h"
#include "fl/instrumentation/island_records.h"
#include "fl/instrumentation/records.h"
#include "fl/instrumentation/sqlite.h"

namespace fl::instrumentation {

// What a records database given by a user must be before SQLite opens it: a regular file (symlinks followed).
// A FIFO would block SQLite's first read forever and /dev/zero reads as zeros without end; a directory is no
// database. OK, or InvalidArgument "records database <path>: is a FIFO, not a regular file; give the file fl-server
// wrote with --db" (NotFound when it does not exist). Checked by RecordReader's Open and OpenAnyVersion; callers
// that open a records file through sqlite::Database directly (fl-experiment replay) call it first.
absl::Status CheckRecordsFile(const std::string& path);

class RecordReader {
 public:
  // Opens an existing records database read-only. NotFound when the file does not exist; FailedPrecondition
  // when its schema version is not LatestSchemaVersion() (newer: upgrade; older: open it with fl-server once).
  static absl::StatusOr<std::unique_ptr<RecordReader>> Open(const std::string& path, int busy_timeout_ms = 5000);
  // Opens a records database of any schema version from 1 to LatestSchemaVersion() read-only, without migrating
  // it (fl-report reads the records of old runs as they are): a column added after the file's version reads as
  // NULL ("" for text), a table added after it has no rows (HasColumn tells "not recorded" from "NULL").
  // NotFound when the file does not exist; FailedPrecondition for a file that is not SQLite, another program's
  // SQLite file, or a newer schema version than this build's.
  static absl::StatusOr<std::unique_ptr<RecordReader>> OpenAnyVersion(const std::string& path,
                                                                      int busy_timeout_ms = 5000);

  RecordReader(const RecordReader&) = delete;
  RecordReader& operator=(const RecordReader&) = delete;

  const std::string& path() const { return path_; }
  // The file's schema version (LatestSchemaVersion() for a reader from Open).
  int schema_version() const { return schema_version_; }
  // Whether the file's schema has `column` of `table` (record_columns.h: the version that added it).
  bool HasColumn(std::string_view table, std::string_view column) const;

  // One read transaction: until the returned object is destroyed, every read of this reader sees the same
  // committed state of the file, whatever a writer commits meanwhile (for reads that combine several tables).
  class Snapshot {
   public:
    Snapshot(Snapshot&& other) noexcept;
    Snapshot& operator=(Snapshot&&) = delete;
    ~Snapshot();

   private:
    friend class RecordReader;
    explicit Snapshot(RecordReader* reader) : reader_(reader) {}
    RecordReader* reader_ = nullptr;
  };
  // FailedPrecondition while another snapshot of this reader is open.
  absl::StatusOr<Snapshot> ReadSnapshot();

  // NotFound for an unknown id.
  absl::StatusOr<ExperimentRecord> GetExperiment(std::string_view experiment_id);
  // All experiments, oldest first (by start time, then in the order they were written).
  absl::StatusOr<std::vector<ExperimentRecord>> ListExperiments();
  // Clients of an experiment, by join time.
  absl::StatusOr<std::vector<ClientRecord>> ListClients(std::string_view experiment_id);
  // Every attempt of every round, by (round, attempt).
  absl::StatusOr<std::vector<RoundRecord>> ListRounds(std::string_view experiment_id);
  // The number of rows in `rounds` of an experiment (every attempt).
  absl::StatusOr<int64_t> CountRounds(std::string_view experiment_id);
  // Per-client rows of one round (all its attempts), by (attempt, client_id).
  absl::StatusOr<std::vector<ClientRoundRecord>> ListClientRounds(std::string_view experiment_id, int64_t round);
  // Per-client rows of every round, by (round, attempt), and within a round attempt in the order they were
  // written (the order the server decided their outcomes: the order updates finished arriving).
  absl::StatusOr<std::vector<ClientRoundRecord>> ListClientRounds(std::string_view experiment_id);
  // Per-client evaluations of one round (all its attempts), by (attempt, client_id).
  absl::StatusOr<std::vector<EvaluationRecord>> ListEvaluations(std::string_view experiment_id, int64_t round);
  // Per-client evaluations of every round, by (round, attempt, client_id).
  absl::StatusOr<std::vector<EvaluationRecord>> ListEvaluations(std::string_view experiment_id);
  // Checkpoints of an experiment, by round.
  absl::StatusOr<std::vector<CheckpointRecord>> ListCheckpoints(std::string_view experiment_id);
  // Client events of an experiment (schema v7), by time, then in the order they were written.
  absl::StatusOr<std::vector<ClientEventRecord>> ListClientEvents(std::string_view experiment_id);
  // Security events of an experiment (schema v8), by time, then in the order they were written; none in older files.
  absl::StatusOr<std::vector<SecurityEventRecord>> ListSecurityEvents(std::string_view experiment_id);
  // Secure-aggregation stages of an experiment (schema v11), by (round, attempt, client_id) and within a client's
  // round attempt in the order the stages run (advertise_keys, share_keys, masked_upload, unmask); none in older
  // files.
  absl::StatusOr<std::vector<SecAggStageRecord>> ListSecAggStages(std::string_view experiment_id);
  // Islands experiments (schema v5): admissions by join_seq, epochs by number, members by (epoch, ring index).
  absl::StatusOr<std::vector<IslandRecord>> ListIslands(std::string_view experiment_id);
  absl::StatusOr<std::vector<IslandEpochRecord>> ListIslandEpochs(std::string_view experiment_id);
  absl::StatusOr<std::vector<IslandSyncRecord>> ListIslandSyncs(std::string_view experiment_id);
  // The committed round with the highest round number; nullopt when none is committed (or no such experiment).
  absl::StatusOr<std::optional<RoundRecord>> LastCommittedRound(std::string_view experiment_id);
  // The checkpoint with the highest round number; nullopt when there is none.
  absl::StatusOr<std::optional<CheckpointRecord>> LatestCheckpoint(std::string_view experiment_id);

  // The first column of the first row of an arbitrary read-only query ("SELECT count(*) FROM rounds",
  // "PRAGMA journal_mode"): for tests and ad-hoc reports.
  absl::StatusOr<int64_t> QueryInt(std::string_view sql);
  absl::StatusOr<std::string> QueryText(std::string_view sql);

 private:
  RecordReader(sqlite::Database db, int schema_version)
      : schema_version_(schema_version), path_(db.path()), db_(std::move(db)) {}

  const int schema_version_;
  const std::string path_;  // the connection's, copied: read without the lock
  fl::Mutex mu_;            // one query at a time on the connection
  sqlite::Database db_ ABSL_GUARDED_BY(mu_);
};

}  // namespace fl::instrumentation
