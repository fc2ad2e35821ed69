// RecordReader: the read side of an experiment records database, on a read-only connection of its own.
//
// It reads committed data only (WAL snapshot per query), never blocks the writer, and can be used while an
// fl-server is writing to the same file. Used by tests, by fl-server --resume (LastCommittedRound,
// LatestCheckpoint) and by fl-report. Thread-safe (one connection behind a mutex); open one reader per
// thread for parallel reads.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fl/instrumentation/records.h"
#include "fl/instrumentation/sqlite.h"

namespace fl::instrumentation {

class RecordReader {
 public:
  // Opens an existing records database read-only. NotFound when the file does not exist; FailedPrecondition
  // when its schema version is not LatestSchemaVersion() (newer: upgrade; older: open it with fl-server once).
  static absl::StatusOr<std::unique_ptr<RecordReader>> Open(const std::string& path, int busy_timeout_ms = 5000);

  RecordReader(const RecordReader&) = delete;
  RecordReader& operator=(const RecordReader&) = delete;

  const std::string& path() const { return db_.path(); }

  // NotFound for an unknown id.
  absl::StatusOr<ExperimentRecord> GetExperiment(std::string_view experiment_id);
  // All experiments, oldest first.
  absl::StatusOr<std::vector<ExperimentRecord>> ListExperiments();
  // Clients of an experiment, by join time.
  absl::StatusOr<std::vector<ClientRecord>> ListClients(std::string_view experiment_id);
  // Every attempt of every round, by (round, attempt).
  absl::StatusOr<std::vector<RoundRecord>> ListRounds(std::string_view experiment_id);
  // Per-client rows of one round (all its attempts), by (attempt, client_id).
  absl::StatusOr<std::vector<ClientRoundRecord>> ListClientRounds(std::string_view experiment_id, int64_t round);
  // Per-client evaluations of one round (all its attempts), by (attempt, client_id).
  absl::StatusOr<std::vector<EvaluationRecord>> ListEvaluations(std::string_view experiment_id, int64_t round);
  // Checkpoints of an experiment, by round.
  absl::StatusOr<std::vector<CheckpointRecord>> ListCheckpoints(std::string_view experiment_id);
  // Client events of an experiment (schema v7), by time, then in the order they were written.
  absl::StatusOr<std::vector<ClientEventRecord>> ListClientEvents(std::string_view experiment_id);
  // The committed round with the highest round number; nullopt when none is committed (or no such experiment).
  absl::StatusOr<std::optional<RoundRecord>> LastCommittedRound(std::string_view experiment_id);
  // The checkpoint with the highest round number; nullopt when there is none.
  absl::StatusOr<std::optional<CheckpointRecord>> LatestCheckpoint(std::string_view experiment_id);

  // The first column of the first row of an arbitrary read-only query ("SELECT count(*) FROM rounds",
  // "PRAGMA journal_mode"): for tests and ad-hoc reports.
  absl::StatusOr<int64_t> QueryInt(std::string_view sql);
  absl::StatusOr<std::string> QueryText(std::string_view sql);

 private:
  explicit RecordReader(sqlite::Database db) : db_(std::move(db)) {}

  std::mutex mu_;
  sqlite::Database db_;
};

}  // namespace fl::instrumentation
