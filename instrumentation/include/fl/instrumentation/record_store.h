// RecordStore: the write side of an experiment records database (SQLite, one file).
//
// One writer thread owns the write connection. Callers Enqueue() typed records (see records.h) from any
// thread; the writer drains the queue in batches, each batch one BEGIN IMMEDIATE ... COMMIT transaction
// with prepared statements. A record that violates a constraint (a second committed row for a round, a
// client of an unknown experiment, ...) is dropped alone: SQLite undoes just that statement and the rest
// of its batch commits. A group record (RoundCommitRecord, EvaluationCommitRecord: a round's commit, an
// evaluation's) is stored whole or not at all, in a savepoint of its own. Every dropped record is reported: to
// Options::on_error as it happens, and as the first error returned by the next Flush() or Close().
//
//   auto store = RecordStore::Open("/data/records.db");   // creates + migrates; refuses a newer schema
//   (*store)->Enqueue(ExperimentRecord{...});
//   (*store)->Enqueue(RoundRecord{...});
//   absl::Status s = (*store)->Flush();                    // everything enqueued so far is committed
//
// Reads go through RecordReader (record_reader.h), on connections of their own.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fl/core/mutex.h"
#include "fl/instrumentation/records.h"

namespace fl::instrumentation {

namespace internal {
template <class Record>
class WriterThread;
}  // namespace internal

struct RecordStoreOptions {
  // Enqueue() blocks while this many records wait for the writer (backpressure); TryEnqueue() fails instead.
  size_t max_queue_records = 8192;
  // The most records the writer puts in one transaction.
  size_t max_batch_records = 1024;
  // How long a connection waits for another one's lock before SQLITE_BUSY.
  int busy_timeout_ms = 5000;
  // Called on the writer thread for every record that could not be stored (after its batch). Keep it short
  // and non-blocking: it delays the writer. Default: none (errors still reach Flush/Close).
  std::function<void(const absl::Status&)> on_error;
};

// What the writer has done so far.
struct RecordStoreStats {
  uint64_t enqueued = 0;          // records accepted by Enqueue/TryEnqueue
  uint64_t written = 0;           // records committed
  uint64_t failed = 0;            // records dropped with an error
  uint64_t batches = 0;           // transactions committed
  uint64_t fallback_batches = 0;  // batches re-run one record per transaction after a transaction-level error
  uint64_t max_queue_depth = 0;
  uint64_t backpressure_waits = 0;  // Enqueue calls that had to wait for space
};

// The effective settings of the write connection, read back after they were set.
struct ConnectionSettings {
  std::string journal_mode;   // "wal"
  int64_t synchronous = -1;   // 1 = NORMAL
  int64_t foreign_keys = -1;  // 1 = on
  int64_t busy_timeout_ms = -1;
  int64_t schema_version = -1;  // PRAGMA user_version
};

class RecordStore {
 public:
  // Opens or creates the database at `path`, sets journal_mode=WAL, synchronous=NORMAL, busy_timeout and
  // foreign_keys=ON, migrates the schema to LatestSchemaVersion() and starts the writer thread. Refuses a
  // database with a newer schema version, another program's database, and paths where WAL is not available
  // (":memory:"). Errors name the path and SQLite's message.
  static absl::StatusOr<std::unique_ptr<RecordStore>> Open(const std::string& path, RecordStoreOptions options = {});

  RecordStore(const RecordStore&) = delete;
  RecordStore& operator=(const RecordStore&) = delete;
  // Close(); an error nobody collected is printed to stderr.
  ~RecordStore();

  // Queues a record for the writer. Returns at once unless the queue is full, then waits for space.
  // FailedPrecondition after Close(). Thread-safe.
  absl::Status Enqueue(Record record);
  // Like Enqueue, but ResourceExhausted instead of waiting when the queue is full.
  absl::Status TryEnqueue(Record record);

  // Waits until every record enqueued before the call is committed or dropped, and returns the first
  // error since the previous Flush/Close (then forgets it), OK if none. Thread-safe; with several
  // flushing threads, each error is returned to one of them.
  absl::Status Flush();

  // Flushes, stops the writer thread and closes the write connection. Returns like Flush. Idempotent:
  // later calls return OK.
  absl::Status Close();

  const std::string& path() const { return path_; }
  const ConnectionSettings& settings() const { return settings_; }
  RecordStoreStats stats() const;

 private:
  struct Writer;  // the write connection and its prepared statements; used by the writer thread only

  RecordStore(std::string path, RecordStoreOptions options, std::unique_ptr<Writer> writer,
              ConnectionSettings settings);
  absl::Status Admit(Record record, bool wait);

  const std::string path_;
  const RecordStoreOptions options_;
  const ConnectionSettings settings_;
  std::unique_ptr<Writer> writer_;
  std::unique_ptr<internal::WriterThread<Record>> thread_;  // queue, batches, flush (src/sqlite_writer.h)
  fl::Mutex close_mu_;                                      // serialises Close()
};

}  // namespace fl::instrumentation
