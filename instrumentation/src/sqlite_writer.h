// The write side that RecordStore (records.h kinds) and IslandRecordWriter (island_records.h kinds) share:
// opening a records write connection, running prepared statements, the error policy of a batch, and the
// writer thread with its queue. Each user keeps only its SQL and the binding of its record kinds.
//
// Private to fl::instrumentation (src/, not include/).
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <initializer_list>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fl/core/mutex.h"
#include "fl/instrumentation/record_store.h"
#include "fl/instrumentation/sqlite.h"

namespace fl::instrumentation::internal {

// std::visit over a record variant with one lambda per kind.
template <class... Ts>
struct Overloaded : Ts... {
  using Ts::operator()...;
};
template <class... Ts>
Overloaded(Ts...) -> Overloaded<Ts...>;

// Opens (or creates) `path` for writing records: busy_timeout first (so that switching the journal mode and
// migrating wait for other connections' locks), journal_mode=WAL (refused where SQLite cannot keep it, e.g.
// ":memory:"), synchronous=NORMAL, foreign_keys=ON (refused where this SQLite cannot enforce them), and the
// schema migrated to LatestSchemaVersion(). Errors name the path. A negative busy timeout counts as 0.
absl::StatusOr<sqlite::Database> OpenWriteConnection(const std::string& path, int busy_timeout_ms);

// Prepares each `sql` into its `statement`, marked persistent (kept and reused for every record).
struct StatementSql {
  sqlite::Statement* statement;
  std::string_view sql;
};
absl::Status PrepareStatements(sqlite::Database& db, std::initializer_list<StatementSql> statements);

// Runs `statement` (already bound) on `db` and resets it. `expect_change`: an UPDATE that changed no row is
// NotFound ("<what>: no such row"), for records that amend a row written earlier.
absl::Status RunStatement(sqlite::Database& db, sqlite::Statement& statement, std::string_view what,
                          bool expect_change = false);

// What writing one batch came to.
struct BatchResult {
  std::vector<absl::Status> errors;  // one per dropped record, in queue order
  bool fell_back = false;            // re-run one record per transaction after a transaction-level error
};

// Stores records 0..count-1 of a batch in one BEGIN IMMEDIATE ... COMMIT transaction; `write_one(i)` binds
// and runs record i (one statement) and returns its error. A record that fails on its own (a constraint) is
// undone alone by SQLite (statement-level ABORT) and the rest of the batch still commits. If the transaction
// itself fails (BEGIN/COMMIT errors, or an error that made SQLite roll the whole transaction back: I/O, disk
// full), the batch is re-run one record per transaction so that each record lands or is reported on its
// own; `annotate(i, error)` names record i in a BEGIN/COMMIT error of that fallback.
BatchResult WriteBatch(sqlite::Database& db, size_t count, absl::FunctionRef<absl::Status(size_t)> write_one,
                       absl::FunctionRef<absl::Status(size_t, const absl::Status&)> annotate);

// The writer thread and its queue: producers Push() records from any thread; one thread takes them in FIFO
// batches and hands each batch to `write_batch`. Every dropped record's error goes to `on_error` (on the
// writer thread, after its batch) and the first one to the next Flush() or Stop().
template <class Record>
class WriterThread {
 public:
  struct Options {
    size_t max_queue_records = std::numeric_limits<size_t>::max();  // Push(wait) blocks while this many wait
    size_t max_batch_records = std::numeric_limits<size_t>::max();  // the most records in one batch
    std::function<void(const absl::Status&)> on_error;
  };
  using WriteBatchFn = std::function<BatchResult(std::span<const Record>)>;

  enum class Admission { kQueued, kClosed, kFull };

  // Starts the thread. `write_batch` runs only on it, and not after Stop() returned.
  WriterThread(Options options, WriteBatchFn write_batch)
      : options_(std::move(options)), write_batch_(std::move(write_batch)) {
    options_.max_queue_records = std::max<size_t>(options_.max_queue_records, 1);
    options_.max_batch_records = std::max<size_t>(options_.max_batch_records, 1);
    thread_ = std::thread([this] { Loop(); });
  }
  WriterThread(const WriterThread&) = delete;
  WriterThread& operator=(const WriterThread&) = delete;
  ~WriterThread() { (void)Stop(); }

  // Queues `record`, moving from it only when the answer is kQueued (so that the caller can still name it in
  // an error). A full queue: `wait` waits for space, else kFull. kClosed once Stop() began.
  Admission Push(Record& record, bool wait) {
    {
      fl::MutexLock lock(mu_);
      if (stopping_) return Admission::kClosed;
      if (queue_.size() >= options_.max_queue_records) {
        if (!wait) return Admission::kFull;
        ++stats_.backpressure_waits;
        space_cv_.Wait(mu_, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stopping_ || queue_.size() < options_.max_queue_records;
        });
        if (stopping_) return Admission::kClosed;
      }
      queue_.push_back(std::move(record));
      ++enqueued_seq_;
      ++stats_.enqueued;
      stats_.max_queue_depth = std::max<uint64_t>(stats_.max_queue_depth, queue_.size());
    }
    work_cv_.NotifyOne();
    return Admission::kQueued;
  }

  // Waits until every record pushed before the call is committed or dropped; the first error since the
  // previous Flush/Stop (then forgotten), OK if none. With several flushing threads, each error is returned
  // to one of them.
  absl::Status Flush() {
    fl::MutexLock lock(mu_);
    const uint64_t target = enqueued_seq_;
    done_cv_.Wait(mu_, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_seq_ >= target; });
    return std::exchange(first_error_, absl::OkStatus());
  }

  // Refuses further records, lets the thread drain the queue and joins it; returns like Flush. Later calls
  // return OK.
  absl::Status Stop() {
    fl::MutexLock stop_lock(stop_mu_);
    {
      fl::MutexLock lock(mu_);
      if (stopped_) return absl::OkStatus();
      stopping_ = true;
    }
    work_cv_.NotifyAll();
    space_cv_.NotifyAll();
    if (thread_.joinable()) thread_.join();
    fl::MutexLock lock(mu_);
    stopped_ = true;
    return std::exchange(first_error_, absl::OkStatus());
  }

  RecordStoreStats stats() const {
    fl::MutexLock lock(mu_);
    return stats_;
  }

 private:
  void Loop() {
    std::vector<Record> batch;
    while (true) {
      {
        fl::MutexLock lock(mu_);
        work_cv_.Wait(mu_, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, and everything is written
        const size_t n = std::min(queue_.size(), options_.max_batch_records);
        batch.clear();
        for (size_t i = 0; i < n; ++i) {
          batch.push_back(std::move(queue_.front()));
          queue_.pop_front();
        }
      }
      space_cv_.NotifyAll();

      const BatchResult result = write_batch_(batch);
      if (options_.on_error) {
        for (const absl::Status& e : result.errors) options_.on_error(e);
      }
      {
        fl::MutexLock lock(mu_);
        if (first_error_.ok() && !result.errors.empty()) first_error_ = result.errors.front();
        stats_.failed += result.errors.size();
        stats_.written += batch.size() - result.errors.size();
        if (result.fell_back) {
          ++stats_.fallback_batches;
        } else {
          ++stats_.batches;
        }
        done_seq_ += batch.size();
      }
      done_cv_.NotifyAll();
    }
  }

  Options options_;
  const WriteBatchFn write_batch_;

  mutable fl::Mutex mu_;
  fl::CondVar work_cv_;   // the thread waits for records or stop
  fl::CondVar space_cv_;  // producers wait for queue space
  fl::CondVar done_cv_;   // flushers wait for progress
  std::deque<Record> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t enqueued_seq_ ABSL_GUARDED_BY(mu_) = 0;  // records ever queued
  uint64_t done_seq_ ABSL_GUARDED_BY(mu_) = 0;      // records ever committed or dropped (the queue is FIFO)
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
  RecordStoreStats stats_ ABSL_GUARDED_BY(mu_);
  fl::Mutex stop_mu_;                             // serialises Stop(); taken before mu_
  std::thread thread_ ABSL_GUARDED_BY(stop_mu_);  // last: started once everything above exists
};

}  // namespace fl::instrumentation::internal
