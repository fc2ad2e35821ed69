#include "fl/instrumentation/island_records.h"

#include <cstdio>
#include <span>
#include <utility>

#include "fl/core/str_cat.h"
#include "fl/instrumentation/sqlite.h"
#include "sqlite_writer.h"

namespace fl::instrumentation {
namespace {

using internal::Overloaded;

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

// The write connection and one prepared statement per record kind; the queue, batches and error policy are
// internal::WriterThread's and internal::WriteBatch's, as for RecordStore.
struct IslandRecordWriter::Impl {
  sqlite::Database db;
  sqlite::Statement insert_island, update_left, insert_epoch, insert_sync, update_repaired;
  // Last, so destroyed first: the thread is stopped before the statements it uses go.
  std::unique_ptr<internal::WriterThread<IslandRecordVariant>> thread;

  absl::Status Prepare() {
    return internal::PrepareStatements(db, {{&insert_island, kInsertIsland},
                                            {&update_left, kUpdateIslandLeft},
                                            {&insert_epoch, kInsertEpoch},
                                            {&insert_sync, kInsertSync},
                                            {&update_repaired, kUpdateRepaired}});
  }

  absl::Status Run(sqlite::Statement& st, std::string_view what, bool expect_change = false) {
    return internal::RunStatement(db, st, what, expect_change);
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

  internal::BatchResult WriteBatch(std::span<const IslandRecordVariant> batch) {
    return internal::WriteBatch(
        db, batch.size(), [&](size_t i) { return WriteOne(batch[i]); },
        [](size_t, const absl::Status& s) { return s; });
  }
};

IslandRecordWriter::IslandRecordWriter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

absl::StatusOr<std::unique_ptr<IslandRecordWriter>> IslandRecordWriter::Open(const std::string& path,
                                                                              int busy_timeout_ms) {
  auto impl = std::make_unique<Impl>();
  absl::StatusOr<sqlite::Database> db = internal::OpenWriteConnection(path, busy_timeout_ms);
  if (!db.ok()) return db.status();
  impl->db = *std::move(db);
  if (absl::Status s = impl->Prepare(); !s.ok()) return s;
  Impl* raw = impl.get();
  impl->thread = std::make_unique<internal::WriterThread<IslandRecordVariant>>(
      internal::WriterThread<IslandRecordVariant>::Options{},  // unbounded: the coordinator never waits
      [raw](std::span<const IslandRecordVariant> batch) { return raw->WriteBatch(batch); });
  return std::unique_ptr<IslandRecordWriter>(new IslandRecordWriter(std::move(impl)));
}

IslandRecordWriter::~IslandRecordWriter() {
  absl::Status s = Close();
  if (!s.ok()) std::fprintf(stderr, "island records: %s\n", std::string(s.message()).c_str());
}

absl::Status IslandRecordWriter::Enqueue(IslandRecordVariant record) {
  if (impl_->thread->Push(record, /*wait=*/false) ==
      internal::WriterThread<IslandRecordVariant>::Admission::kQueued) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError("the island record writer is closed");
}

absl::Status IslandRecordWriter::Flush() { return impl_->thread->Flush(); }

absl::Status IslandRecordWriter::Close() { return impl_->thread->Stop(); }

uint64_t IslandRecordWriter::written() const { return impl_->thread->stats().written; }

}  // namespace fl::instrumentation
