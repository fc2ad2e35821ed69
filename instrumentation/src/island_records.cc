#include "fl/instrumentation/island_records.h"

#include <cstdio>
#include <utility>

#include <sqlite3.h>

#include "fl/core/str_cat.h"
#include "fl/instrumentation/schema.h"
#include "fl/instrumentation/sqlite.h"

namespace fl::instrumentation {
namespace {

template <class... Ts>
struct Overloaded : Ts... {
  using Ts::operator()...;
};
template <class... Ts>
Overloaded(Ts...) -> Overloaded<Ts...>;

constexpr std::string_view kInsertIsland = R"sql(
INSERT INTO islands (experiment_id, join_seq, island_id, data_endpoint, state_endpoint, num_ranks,
                     model_fingerprint, software_version, device_class, accelerator, joined_unix_ms, late_join,
                     state_source_island, state_source_step, state_source_fragment)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15))sql";

constexpr std::string_view kUpdateIslandLeft = R"sql(
UPDATE islands SET left_unix_ms = ?3, left_reason = ?4 WHERE experiment_id = ?1 AND join_seq = ?2)sql";

constexpr std::string_view kInsertEpoch = R"sql(
INSERT INTO island_epochs (experiment_id, epoch, step, fragment, attempt, members, num_members, outcome,
                           committed_hash, num_applied, num_failed, num_mismatched, barrier_ms, formed_unix_ms,
                           resolved_unix_ms, reason)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16))sql";

constexpr std::string_view kInsertSync = R"sql(
INSERT INTO island_syncs (experiment_id, epoch, island_id, join_seq, step, fragment, ring_index, outcome, verdict,
                          inner_compute_ms, exchange_ms, wait_ms, bytes_sent, bytes_received, inner_steps,
                          state_hash, failure_reason, vanished_island, repair_source, reported_unix_ms)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20))sql";

constexpr std::string_view kUpdateRepaired = R"sql(
UPDATE island_syncs SET repaired_unix_ms = ?4 WHERE experiment_id = ?1 AND epoch = ?2 AND island_id = ?3)sql";

std::string JoinIds(const std::vector<std::string>& ids) {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) out.push_back(',');
    out += ids[i];
  }
  return out;
}

}  // namespace

std::string HashHex(uint64_t value) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(16, '0');
  for (int i = 15; i >= 0; --i) {
    out[static_cast<size_t>(i)] = kDigits[value & 0xf];
    value >>= 4;
  }
  return out;
}

struct IslandRecordWriter::Impl {
  sqlite::Database db;
  sqlite::Statement insert_island, update_left, insert_epoch, insert_sync, update_repaired;

  std::mutex mu;
  std::condition_variable work_cv;
  std::condition_variable done_cv;
  std::deque<IslandRecordVariant> queue;
  uint64_t enqueued = 0;
  uint64_t done = 0;
  uint64_t written = 0;
  bool stopping = false;
  bool closed = false;
  absl::Status first_error;
  std::thread thread;

  absl::Status Prepare() {
    for (auto [stmt, sql] : {std::pair{&insert_island, kInsertIsland}, std::pair{&update_left, kUpdateIslandLeft},
                             std::pair{&insert_epoch, kInsertEpoch}, std::pair{&insert_sync, kInsertSync},
                             std::pair{&update_repaired, kUpdateRepaired}}) {
      absl::StatusOr<sqlite::Statement> prepared = db.Prepare(sql, /*persistent=*/true);
      if (!prepared.ok()) return prepared.status();
      *stmt = *std::move(prepared);
    }
    return absl::OkStatus();
  }

  absl::Status Run(sqlite::Statement& st, std::string_view what, bool expect_change = false) {
    absl::Status s = st.Run(what);
    st.Reset();
    if (s.ok() && expect_change && sqlite3_changes(db.get()) == 0) {
      return absl::NotFoundError(fl::StrCat("records database ", db.path(), ": ", what, ": no such row"));
    }
    return s;
  }

  absl::Status WriteOne(const IslandRecordVariant& record) {
    return std::visit(
        Overloaded{
            [&](const IslandRecord& r) {
              sqlite::Statement& st = insert_island;
              st.BindText(1, r.experiment_id);
              st.BindInt64(2, r.join_seq);
              st.BindText(3, r.island_id);
              st.BindText(4, r.data_endpoint);
              st.BindText(5, r.state_endpoint);
              st.BindInt64(6, r.num_ranks);
              st.BindText(7, r.model_fingerprint);
              st.BindTextOrNull(8, r.software_version);
              st.BindTextOrNull(9, r.device_class);
              st.BindTextOrNull(10, r.accelerator);
              st.BindInt64(11, r.joined_unix_ms);
              st.BindInt64(12, r.late_join ? 1 : 0);
              st.BindTextOrNull(13, r.state_source_island);
              st.BindOptionalInt64(14, r.state_source_step);
              st.BindOptionalInt64(15, r.state_source_fragment);
              return Run(st, "insert into islands");
            },
            [&](const IslandLeftRecord& r) {
              sqlite::Statement& st = update_left;
              st.BindText(1, r.experiment_id);
              st.BindInt64(2, r.join_seq);
              st.BindInt64(3, r.left_unix_ms);
              st.BindTextOrNull(4, r.reason);
              return Run(st, fl::StrCat("island ", r.join_seq, " left"), /*expect_change=*/true);
            },
            [&](const IslandEpochRecord& r) {
              sqlite::Statement& st = insert_epoch;
              st.BindText(1, r.experiment_id);
              st.BindInt64(2, r.epoch);
              st.BindInt64(3, r.step);
              st.BindInt64(4, r.fragment);
              st.BindInt64(5, r.attempt);
              st.BindText(6, JoinIds(r.members));
              st.BindInt64(7, static_cast<int64_t>(r.members.size()));
              st.BindText(8, r.outcome);
              st.BindTextOrNull(9, r.committed_hash);
              st.BindInt64(10, r.num_applied);
              st.BindInt64(11, r.num_failed);
              st.BindInt64(12, r.num_mismatched);
              st.BindOptionalDouble(13, r.barrier_ms);
              st.BindInt64(14, r.formed_unix_ms);
              st.BindInt64(15, r.resolved_unix_ms);
              st.BindTextOrNull(16, r.reason);
              return Run(st, "insert into island_epochs");
            },
            [&](const IslandSyncRecord& r) {
              sqlite::Statement& st = insert_sync;
              st.BindText(1, r.experiment_id);
              st.BindInt64(2, r.epoch);
              st.BindText(3, r.island_id);
              st.BindInt64(4, r.join_seq);
              st.BindInt64(5, r.step);
              st.BindInt64(6, r.fragment);
              st.BindInt64(7, r.ring_index);
              st.BindText(8, r.outcome);
              st.BindText(9, r.verdict);
              st.BindOptionalDouble(10, r.inner_compute_ms);
              st.BindOptionalDouble(11, r.exchange_ms);
              st.BindOptionalDouble(12, r.wait_ms);
              st.BindOptionalInt64(13, r.bytes_sent);
              st.BindOptionalInt64(14, r.bytes_received);
              st.BindOptionalInt64(15, r.inner_steps);
              st.BindTextOrNull(16, r.state_hash);
              st.BindTextOrNull(17, r.failure_reason);
              st.BindTextOrNull(18, r.vanished_island);
              st.BindTextOrNull(19, r.repair_source);
              st.BindOptionalInt64(20, r.reported_unix_ms);
              return Run(st, "insert into island_syncs");
            },
            [&](const IslandRepairedRecord& r) {
              sqlite::Statement& st = update_repaired;
              st.BindText(1, r.experiment_id);
              st.BindInt64(2, r.epoch);
              st.BindText(3, r.island_id);
              st.BindInt64(4, r.repaired_unix_ms);
              return Run(st, fl::StrCat("island ", r.island_id, " repaired after epoch ", r.epoch),
                         /*expect_change=*/true);
            },
        },
        record);
  }

  // One transaction per batch; each record inside its own savepoint, so that a record that violates a
  // constraint is undone alone and the rest of the batch commits.
  void WriteBatch(std::deque<IslandRecordVariant>& batch, std::vector<absl::Status>* errors, uint64_t* n_written) {
    if (absl::Status s = db.Exec("BEGIN IMMEDIATE"); !s.ok()) {
      for (size_t i = 0; i < batch.size(); ++i) errors->push_back(s);
      return;
    }
    for (const IslandRecordVariant& record : batch) {
      (void)db.Exec("SAVEPOINT island_record");
      absl::Status s = WriteOne(record);
      if (s.ok()) {
        (void)db.Exec("RELEASE island_record");
        ++*n_written;
      } else {
        (void)db.Exec("ROLLBACK TO island_record; RELEASE island_record");
        errors->push_back(s);
      }
    }
    if (absl::Status s = db.Exec("COMMIT"); !s.ok()) {
      (void)db.Exec("ROLLBACK");
      errors->push_back(s);
    }
  }

  void Loop() {
    std::unique_lock lock(mu);
    while (true) {
      work_cv.wait(lock, [&] { return stopping || !queue.empty(); });
      if (queue.empty() && stopping) return;
      std::deque<IslandRecordVariant> batch;
      batch.swap(queue);
      lock.unlock();
      std::vector<absl::Status> errors;
      uint64_t n_written = 0;
      WriteBatch(batch, &errors, &n_written);
      lock.lock();
      written += n_written;
      for (const absl::Status& e : errors) {
        if (first_error.ok()) first_error = e;
      }
      done += batch.size();
      done_cv.notify_all();
    }
  }
};

IslandRecordWriter::IslandRecordWriter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

absl::StatusOr<std::unique_ptr<IslandRecordWriter>> IslandRecordWriter::Open(const std::string& path,
                                                                              int busy_timeout_ms) {
  absl::StatusOr<sqlite::Database> db =
      sqlite::Database::Open(path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX);
  if (!db.ok()) return db.status();
  auto impl = std::make_unique<Impl>();
  impl->db = *std::move(db);
  if (absl::Status s = impl->db.Exec(fl::StrCat("PRAGMA busy_timeout = ", busy_timeout_ms)); !s.ok()) return s;
  absl::StatusOr<std::string> mode = impl->db.QueryText("PRAGMA journal_mode = WAL");
  if (!mode.ok()) return mode.status();
  if (*mode != "wal") {
    return absl::FailedPreconditionError(fl::StrCat("records database ", path,
                                                    ": journal_mode=WAL is not available here (SQLite kept '",
                                                    *mode, "'); use a file on a local disk"));
  }
  if (absl::Status s = impl->db.Exec("PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON"); !s.ok()) return s;
  if (absl::Status s = MigrateSchema(impl->db, SchemaMigrations()); !s.ok()) return s;
  if (absl::Status s = impl->Prepare(); !s.ok()) return s;
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->Loop(); });
  return std::unique_ptr<IslandRecordWriter>(new IslandRecordWriter(std::move(impl)));
}

IslandRecordWriter::~IslandRecordWriter() {
  absl::Status s = Close();
  if (!s.ok()) std::fprintf(stderr, "island records: %s\n", std::string(s.message()).c_str());
}

absl::Status IslandRecordWriter::Enqueue(IslandRecordVariant record) {
  std::lock_guard lock(impl_->mu);
  if (impl_->stopping) return absl::FailedPreconditionError("the island record writer is closed");
  impl_->queue.push_back(std::move(record));
  ++impl_->enqueued;
  impl_->work_cv.notify_one();
  return absl::OkStatus();
}

absl::Status IslandRecordWriter::Flush() {
  std::unique_lock lock(impl_->mu);
  const uint64_t target = impl_->enqueued;
  impl_->done_cv.wait(lock, [&] { return impl_->done >= target; });
  absl::Status error = std::move(impl_->first_error);
  impl_->first_error = absl::OkStatus();
  return error;
}

absl::Status IslandRecordWriter::Close() {
  {
    std::lock_guard lock(impl_->mu);
    if (impl_->closed) return absl::OkStatus();
    impl_->closed = true;
    impl_->stopping = true;
    impl_->work_cv.notify_all();
  }
  if (impl_->thread.joinable()) impl_->thread.join();
  std::lock_guard lock(impl_->mu);
  absl::Status error = std::move(impl_->first_error);
  impl_->first_error = absl::OkStatus();
  return error;
}

uint64_t IslandRecordWriter::written() const {
  std::lock_guard lock(impl_->mu);
  return impl_->written;
}

}  // namespace fl::instrumentation
