// IslandRecordWriter: the islands' tables written through the writer thread it shares with RecordStore
// (src/sqlite_writer.h), beside a RecordStore on the same file.
#include "fl/instrumentation/island_records.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fl/core/str_cat.h"
#include "fl/instrumentation/record_reader.h"
#include "fl/instrumentation/record_store.h"
#include "fl/instrumentation/sqlite.h"
#include "test_util.h"

namespace fl::instrumentation {
namespace {

using testing_util::Experiment;
using testing_util::ScratchDir;

IslandRecord Island(const std::string& experiment_id, int64_t join_seq) {
  IslandRecord r;
  r.experiment_id = experiment_id;
  r.join_seq = join_seq;
  r.island_id = fl::StrCat("island-", join_seq);
  r.data_endpoint = "tcp://127.0.0.1:7000";
  r.state_endpoint = "127.0.0.1:7001";
  r.model_fingerprint = HashHex(0xfeed);
  r.joined_unix_ms = 1'700'000'000'000 + join_seq;
  return r;
}

int64_t QueryInt(const std::string& path, const std::string& sql) {
  auto db = sqlite::Database::Open(path, SQLITE_OPEN_READONLY);
  EXPECT_TRUE(db.ok()) << db.status();
  if (!db.ok()) return -1;
  auto v = db->QueryInt(sql);
  EXPECT_TRUE(v.ok()) << v.status();
  return v.ok() ? *v : -1;
}

// The experiment row every island row references, written through a RecordStore as fl-server does.
void WriteExperiment(const std::string& path, const std::string& id) {
  auto store = RecordStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->Enqueue(Experiment(id)).ok());
  ASSERT_TRUE((*store)->Close().ok());
}

// A records file with experiment "exp" and an IslandRecordWriter on it.
class IslandRecordsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    WriteExperiment(path_, "exp");
    auto opened = IslandRecordWriter::Open(path_);
    ASSERT_TRUE(opened.ok()) << opened.status();
    writer_ = *std::move(opened);
  }

  ScratchDir dir_{"fl_island_records"};
  const std::string path_ = dir_.File("records.db");
  std::unique_ptr<IslandRecordWriter> writer_;
};

TEST_F(IslandRecordsTest, RowsOfEveryKindAreCommittedByFlush) {
  ASSERT_TRUE(writer_->Enqueue(Island("exp", 1)).ok());
  ASSERT_TRUE(writer_->Enqueue(Island("exp", 2)).ok());
  IslandEpochRecord epoch;
  epoch.experiment_id = "exp";
  epoch.epoch = 1;
  epoch.members = {"island-1", "island-2"};
  epoch.outcome = "committed";
  epoch.committed_hash = HashHex(42);
  epoch.num_applied = 2;
  ASSERT_TRUE(writer_->Enqueue(epoch).ok());
  IslandSyncRecord sync;
  sync.experiment_id = "exp";
  sync.epoch = 1;
  sync.island_id = "island-2";
  sync.join_seq = 2;
  sync.ring_index = 1;
  sync.outcome = "mismatch";
  sync.verdict = "repair";
  sync.bytes_sent = 4096;
  ASSERT_TRUE(writer_->Enqueue(sync).ok());
  ASSERT_TRUE(writer_->Enqueue(IslandRepairedRecord{"exp", 1, "island-2", 1'700'000'000'500}).ok());
  ASSERT_TRUE(writer_->Enqueue(IslandLeftRecord{"exp", 1, 1'700'000'000'900, "left: finished"}).ok());
  ASSERT_TRUE(writer_->Flush().ok());
  EXPECT_EQ(writer_->written(), 6u);

  EXPECT_EQ(QueryInt(path_, "SELECT COUNT(*) FROM islands WHERE experiment_id = 'exp'"), 2);
  EXPECT_EQ(QueryInt(path_, "SELECT num_members FROM island_epochs WHERE epoch = 1"), 2);
  EXPECT_EQ(QueryInt(path_, "SELECT bytes_sent FROM island_syncs WHERE island_id = 'island-2'"), 4096);
  EXPECT_EQ(QueryInt(path_, "SELECT repaired_unix_ms FROM island_syncs WHERE island_id = 'island-2'"),
            1'700'000'000'500);
  EXPECT_EQ(QueryInt(path_, "SELECT left_unix_ms FROM islands WHERE join_seq = 1"), 1'700'000'000'900);
  EXPECT_EQ(QueryInt(path_, "SELECT COUNT(*) FROM islands WHERE left_unix_ms IS NULL"), 1);
  ASSERT_TRUE(writer_->Close().ok());
}

// Every column of the island tables, once with every optional set and once unset, written and read back through
// RecordReader into the fields they came from; the two updates set exactly their columns.
TEST_F(IslandRecordsTest, EveryColumnRoundTripsSetAndUnset) {
  IslandRecord full{"exp",    1,  "island-1", "tcp://a:1", "a:2", 4, HashHex(1), "0.9",           "gpu",
                    "cuda:x", 10, true,       "island-0",  3,     1, 11,         "left: finished"};
  IslandRecord bare = Island("exp", 2);
  IslandEpochRecord full_epoch{"exp", 1, 2,    1,  1,  {"island-1", "island-2"}, "committed", HashHex(2), 2,
                               1,     1, 12.5, 13, 14, "a retry's reason"};
  IslandEpochRecord bare_epoch;
  bare_epoch.experiment_id = "exp";
  bare_epoch.epoch = 2;
  bare_epoch.members = {"island-2"};
  bare_epoch.outcome = "retried";
  IslandSyncRecord full_sync{"exp",      1,          "island-1", 1,          2,          1,   0,
                             "mismatch", "repair",   1.5,        2.5,        3.5,        100, 200,
                             7,          HashHex(3), "timeout",  "island-2", "island-2", 15,  16};
  IslandSyncRecord bare_sync;
  bare_sync.experiment_id = "exp";
  bare_sync.epoch = 2;
  bare_sync.island_id = "island-2";
  bare_sync.join_seq = 2;
  bare_sync.outcome = "missing";
  bare_sync.verdict = "evicted";
  for (IslandRecordVariant r :
       std::vector<IslandRecordVariant>{full, bare, full_epoch, bare_epoch, full_sync, bare_sync}) {
    ASSERT_TRUE(writer_->Enqueue(std::move(r)).ok());
  }
  absl::Status flushed = writer_->Flush();
  ASSERT_TRUE(flushed.ok()) << flushed;
  for (const char* table : {"islands", "island_epochs", "island_syncs"}) {
    const std::string first = std::string(table) == "islands" ? "join_seq = 1" : "epoch = 1";
    EXPECT_EQ(QueryInt(path_, fl::StrCat("SELECT count(*) FROM pragma_table_info('", table, "')")), [&] {
      // No column of the full row is NULL: count the non-NULL ones.
      auto db = sqlite::Database::Open(path_, SQLITE_OPEN_READONLY);
      auto st = db->Prepare(fl::StrCat("SELECT * FROM ", table, " WHERE ", first));
      EXPECT_TRUE(st.ok() && *st->Step("row"));
      int64_t set = 0;
      for (int i = 0; i < st->ColumnCount(); ++i) set += st->ColumnIsNull(i) ? 0 : 1;
      return set;
    }()) << table;
  }
  EXPECT_EQ(QueryInt(path_,
                     "SELECT count(*) FROM islands WHERE join_seq = 2 AND software_version IS NULL AND "
                     "device_class IS NULL AND accelerator IS NULL AND state_source_island IS NULL AND "
                     "state_source_step IS NULL AND state_source_fragment IS NULL AND left_unix_ms IS NULL "
                     "AND left_reason IS NULL"),
            1);
  EXPECT_EQ(QueryInt(path_,
                     "SELECT count(*) FROM island_epochs WHERE epoch = 2 AND committed_hash IS NULL AND "
                     "barrier_ms IS NULL AND reason IS NULL"),
            1);
  EXPECT_EQ(QueryInt(path_,
                     "SELECT count(*) FROM island_syncs WHERE epoch = 2 AND inner_compute_ms IS NULL AND "
                     "exchange_ms IS NULL AND wait_ms IS NULL AND bytes_sent IS NULL AND bytes_received IS "
                     "NULL AND inner_steps IS NULL AND state_hash IS NULL AND failure_reason IS NULL AND "
                     "vanished_island IS NULL AND repair_source IS NULL AND repaired_unix_ms IS NULL AND "
                     "reported_unix_ms IS NULL"),
            1);

  auto reader = RecordReader::Open(path_);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ(*(*reader)->ListIslands("exp"), (std::vector<IslandRecord>{full, bare}));
  EXPECT_EQ(*(*reader)->ListIslandEpochs("exp"), (std::vector<IslandEpochRecord>{full_epoch, bare_epoch}));
  EXPECT_EQ(*(*reader)->ListIslandSyncs("exp"), (std::vector<IslandSyncRecord>{full_sync, bare_sync}));

  ASSERT_TRUE(writer_->Enqueue(IslandLeftRecord{"exp", 2, 17, "evicted: heartbeat lost"}).ok());
  ASSERT_TRUE(writer_->Enqueue(IslandRepairedRecord{"exp", 2, "island-2", 18}).ok());
  flushed = writer_->Flush();
  ASSERT_TRUE(flushed.ok()) << flushed;
  bare.left_unix_ms = 17;
  bare.left_reason = "evicted: heartbeat lost";
  bare_sync.repaired_unix_ms = 18;
  EXPECT_EQ(*(*reader)->ListIslands("exp"), (std::vector<IslandRecord>{full, bare}));
  EXPECT_EQ(*(*reader)->ListIslandSyncs("exp"), (std::vector<IslandSyncRecord>{full_sync, bare_sync}));
}

TEST_F(IslandRecordsTest, ARecordThatViolatesAConstraintIsDroppedAloneAndReportedOnce) {
  ASSERT_TRUE(writer_->Enqueue(Island("exp", 1)).ok());
  ASSERT_TRUE(writer_->Enqueue(Island("exp", 1)).ok());    // the same admission again: primary key
  ASSERT_TRUE(writer_->Enqueue(Island("other", 2)).ok());  // an experiment nobody wrote: foreign key
  ASSERT_TRUE(writer_->Enqueue(IslandLeftRecord{"exp", 99, 1, "left"}).ok());  // no such admission
  ASSERT_TRUE(writer_->Enqueue(Island("exp", 3)).ok());
  const absl::Status first = writer_->Flush();
  EXPECT_EQ(first.code(), absl::StatusCode::kAlreadyExists) << first;
  EXPECT_NE(std::string(first.message()).find(path_), std::string::npos) << first;
  EXPECT_TRUE(writer_->Flush().ok());  // reported once
  EXPECT_EQ(writer_->written(), 2u);
  EXPECT_EQ(QueryInt(path_, "SELECT COUNT(*) FROM islands"), 2);
  EXPECT_EQ(QueryInt(path_, "SELECT COUNT(*) FROM islands WHERE join_seq = 3"), 1);

  ASSERT_TRUE(writer_->Enqueue(IslandLeftRecord{"exp", 99, 1, "left"}).ok());
  EXPECT_EQ(writer_->Close().code(), absl::StatusCode::kNotFound);  // Close returns what Flush would
}

TEST_F(IslandRecordsTest, EnqueueAfterCloseIsRefusedAndCloseIsIdempotent) {
  ASSERT_TRUE(writer_->Enqueue(Island("exp", 1)).ok());
  ASSERT_TRUE(writer_->Close().ok());  // drains first
  EXPECT_EQ(QueryInt(path_, "SELECT COUNT(*) FROM islands"), 1);
  EXPECT_EQ(writer_->Enqueue(Island("exp", 2)).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(writer_->Close().ok());
}

TEST(IslandRecordWriterOpenTest, RefusesAPathWithoutWal) {
  const auto writer = IslandRecordWriter::Open(":memory:");
  ASSERT_FALSE(writer.ok());
  EXPECT_EQ(writer.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(writer.status().message()).find("journal_mode=WAL"), std::string::npos) << writer.status();
}

}  // namespace
}  // namespace fl::instrumentation
