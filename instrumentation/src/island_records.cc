#include "fl/instrumentation/island_records.h"

#include <cstdio>
#include <span>
#include <utility>

#include "fl/core/str_cat.h"
#include "fl/instrumentation/record_columns.h"
#include "fl/instrumentation/sqlite.h"
#include "sqlite_writer.h"

namespace fl::instrumentation {
namespace {

using internal::Overloaded;

// The updates of rows written earlier (record_columns.h).
const UpdateSpec<IslandLeftRecord>& IslandLeftSpec() {
  using U = IslandLeftRecord;
  static const UpdateSpec<U> spec{&IslandsTable().spec,
                                  {Col<&U::left_unix_ms>("left_unix_ms"), Col<&U::reason>("left_reason")},
                                  {Col<&U::experiment_id>("experiment_id"), Col<&U::join_seq>("join_seq")}};
  return spec;
}

const UpdateSpec<IslandRepairedRecord>& IslandRepairedSpec() {
  using U = IslandRepairedRecord;
  static const UpdateSpec<U> spec{
      &IslandSyncsTable().spec,
      {Col<&U::repaired_unix_ms>("repaired_unix_ms")},
      {Col<&U::experiment_id>("experiment_id"), Col<&U::epoch>("epoch"), Col<&U::island_id>("island_id")}};
  return spec;
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
    absl::StatusOr<std::string> left = UpdateSql(IslandLeftSpec());
    if (!left.ok()) return left.status();
    absl::StatusOr<std::string> repaired = UpdateSql(IslandRepairedSpec());
    if (!repaired.ok()) return repaired.status();
    return internal::PrepareStatements(db, {{&insert_island, InsertSql(IslandsTable())},
                                            {&update_left, *left},
                                            {&insert_epoch, InsertSql(IslandEpochsTable())},
                                            {&insert_sync, InsertSql(IslandSyncsTable())},
                                            {&update_repaired, *repaired}});
  }

  absl::Status Run(sqlite::Statement& st, std::string_view what, bool expect_change = false) {
    return internal::RunStatement(db, st, what, expect_change);
  }

  template <class Row>
  absl::Status Insert(sqlite::Statement& st, const RowTable<Row>& table, const Row& row) {
    BindRow(st, table, row);
    return Run(st, fl::StrCat("insert into ", table.spec.name));
  }

  absl::Status WriteOne(const IslandRecordVariant& record) {
    return std::visit(Overloaded{
                          [&](const IslandRecord& r) { return Insert(insert_island, IslandsTable(), r); },
                          [&](const IslandLeftRecord& r) {
                            BindUpdate(update_left, IslandLeftSpec(), r);
                            return Run(update_left, fl::StrCat("island ", r.join_seq, " left"), /*expect_change=*/true);
                          },
                          [&](const IslandEpochRecord& r) { return Insert(insert_epoch, IslandEpochsTable(), r); },
                          [&](const IslandSyncRecord& r) { return Insert(insert_sync, IslandSyncsTable(), r); },
                          [&](const IslandRepairedRecord& r) {
                            BindUpdate(update_repaired, IslandRepairedSpec(), r);
                            return Run(update_repaired,
                                       fl::StrCat("island ", r.island_id, " repaired after epoch ", r.epoch),
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
  if (impl_->thread->Push(record, /*wait=*/false) == internal::WriterThread<IslandRecordVariant>::Admission::kQueued) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError("the island record writer is closed");
}

absl::Status IslandRecordWriter::Flush() { return impl_->thread->Flush(); }

absl::Status IslandRecordWriter::Close() { return impl_->thread->Stop(); }

uint64_t IslandRecordWriter::written() const { return impl_->thread->stats().written; }

}  // namespace fl::instrumentation
