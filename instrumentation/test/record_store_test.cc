#include "fl/instrumentation/record_store.h"

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "fl/core/str_cat.h"
#include "fl/instrumentation/record_reader.h"
#include "test_util.h"

namespace fl::instrumentation {
namespace {

using testing_util::Client;
using testing_util::ClientRound;
using testing_util::Count;
using testing_util::Experiment;
using testing_util::MustOpen;
using testing_util::MustRead;
using testing_util::Round;
using testing_util::ScratchDir;

std::string Message(const absl::Status& s) { return std::string(s.message()); }

std::string ClientName(int thread, int k) { return fl::StrCat("t", thread, "-c", k); }

// Holds the database's write lock from a connection of its own until destroyed.
class WriteLockHolder {
 public:
  explicit WriteLockHolder(const std::string& path) {
    auto db = sqlite::Database::Open(path, SQLITE_OPEN_READWRITE);
    EXPECT_TRUE(db.ok()) << db.status();
    db_ = *std::move(db);
    absl::Status s = db_.Exec("BEGIN IMMEDIATE");
    EXPECT_TRUE(s.ok()) << s;
  }
  ~WriteLockHolder() { Release(); }
  void Release() {
    if (db_.in_transaction()) {
      EXPECT_TRUE(db_.Exec("ROLLBACK").ok());
    }
  }

 private:
  sqlite::Database db_;
};

TEST(RecordStoreTest, EveryKindRoundTrips) {
  ScratchDir dir;
  const std::string path = dir.File("records.db");
  auto store = MustOpen(path);
  ASSERT_NE(store, nullptr);

  ExperimentRecord experiment = Experiment("e1");
  ClientRecord client = Client("e1", "c1");
  client.accelerator = "cuda:NVIDIA H100";
  client.link_profile = "5g-urban";
  ClientRecord bare;  // every optional field unset
  bare.experiment_id = "e1";
  bare.client_id = "c2";
  bare.joined_unix_ms = 5;
  RoundRecord round = Round("e1", 0);
  round.eval_loss = 0.25;
  round.eval_accuracy = 0.9;
  round.eval_num_examples = 10000;
  ClientRoundRecord ok = ClientRound("e1", 0, 0, "c1");
  ok.num_steps = 50;
  ok.idle_ms = 3.5;
  ok.eval_ms = 7;
  ok.dispatched_unix_ms = 1'700'000'001'001;
  ClientRoundRecord rejected;
  rejected.experiment_id = "e1";
  rejected.round = 0;
  rejected.attempt = 0;
  rejected.client_id = "c2";
  rejected.outcome = ClientOutcome::kRejected;
  rejected.reject_reason = "spec fingerprint mismatch";
  EvaluationRecord evaluation{"e1", 0, 0, "c1", 500, 0.3, 0.88, 42.5, std::nullopt, ""};
  CheckpointRecord checkpoint{"e1", 0, 1, "/ckpt/e1/round-0.flat", 4096, "0123456789abcdef", "", 1'700'000'002'000};

  for (Record r : std::vector<Record>{experiment, client, bare, round, ok, rejected, evaluation, checkpoint}) {
    ASSERT_TRUE(store->Enqueue(std::move(r)).ok());
  }
  absl::Status flushed = store->Flush();
  ASSERT_TRUE(flushed.ok()) << flushed;

  auto reader = MustRead(path);
  ASSERT_NE(reader, nullptr);
  auto e = reader->GetExperiment("e1");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->name, experiment.name);
  EXPECT_EQ(e->status, ExperimentStatus::kRunning);
  EXPECT_EQ(e->started_unix_ms, experiment.started_unix_ms);
  EXPECT_FALSE(e->finished_unix_ms.has_value());
  EXPECT_EQ(e->config_json, experiment.config_json);
  EXPECT_EQ(e->software_version, "0.1.0");
  EXPECT_EQ(e->host, "aggregator");
  EXPECT_EQ(reader->GetExperiment("nope").status().code(), absl::StatusCode::kNotFound);

  auto clients = reader->ListClients("e1");
  ASSERT_TRUE(clients.ok()) << clients.status();
  ASSERT_EQ(clients->size(), 2u);
  const ClientRecord& c2 = (*clients)[0];  // joined first
  EXPECT_EQ(c2.client_id, "c2");
  EXPECT_FALSE(c2.cores.has_value());
  EXPECT_EQ(c2.device_class, "");
  const ClientRecord& c1 = (*clients)[1];
  EXPECT_EQ(c1.client_name, "pi-c1");
  EXPECT_EQ(c1.device_class, "rpi5");
  EXPECT_EQ(c1.link_kind, "wifi");
  EXPECT_EQ(c1.link_interface, "wlan0");
  EXPECT_EQ(c1.link_profile, "5g-urban");
  EXPECT_EQ(c1.cores, 4);
  EXPECT_EQ(c1.memory_bytes, 8LL << 30);
  EXPECT_EQ(c1.accelerator, "cuda:NVIDIA H100");
  EXPECT_EQ(c1.arch, "aarch64");
  EXPECT_EQ(Count(*reader, "SELECT count(*) FROM clients WHERE client_id = 'c2' AND device_class IS NULL"), 1);

  auto rounds = reader->ListRounds("e1");
  ASSERT_TRUE(rounds.ok()) << rounds.status();
  ASSERT_EQ(rounds->size(), 1u);
  const RoundRecord& r0 = (*rounds)[0];
  EXPECT_EQ(r0.status, RoundStatus::kCommitted);
  EXPECT_EQ(r0.duration_ms, 900.5);
  EXPECT_EQ(r0.aggregation_ms, 12.25);
  EXPECT_EQ(r0.num_selected, 3);
  EXPECT_EQ(r0.num_accepted, 2);
  EXPECT_EQ(r0.num_late, 1);
  EXPECT_EQ(r0.num_examples, 1200);
  EXPECT_EQ(r0.model_version, 1);
  EXPECT_EQ(r0.train_loss, 0.5);
  EXPECT_EQ(r0.eval_loss, 0.25);
  EXPECT_EQ(r0.eval_accuracy, 0.9);
  EXPECT_EQ(r0.eval_num_examples, 10000);

  auto client_rounds = reader->ListClientRounds("e1", 0);
  ASSERT_TRUE(client_rounds.ok()) << client_rounds.status();
  ASSERT_EQ(client_rounds->size(), 2u);
  const ClientRoundRecord& got_ok = (*client_rounds)[0];
  EXPECT_EQ(got_ok.client_id, "c1");
  EXPECT_EQ(got_ok.outcome, ClientOutcome::kOk);
  EXPECT_EQ(got_ok.reject_reason, "");
  EXPECT_EQ(got_ok.dispatched_unix_ms, ok.dispatched_unix_ms);
  EXPECT_EQ(got_ok.num_examples, 600);
  EXPECT_EQ(got_ok.num_steps, 50);
  EXPECT_EQ(got_ok.downlink_ms, 10.5);
  EXPECT_EQ(got_ok.train_ms, 800);
  EXPECT_EQ(got_ok.eval_ms, 7);
  EXPECT_EQ(got_ok.uplink_ms, 20);
  EXPECT_EQ(got_ok.uplink_server_ms, 18.75);
  EXPECT_EQ(got_ok.idle_ms, 3.5);
  EXPECT_EQ(got_ok.downlink_bytes, 1 << 20);
  EXPECT_EQ(got_ok.uplink_bytes, 1 << 18);
  EXPECT_EQ(got_ok.codec, "int8-blockwise");
  EXPECT_EQ(got_ok.train_loss, 0.75);
  const ClientRoundRecord& got_rejected = (*client_rounds)[1];
  EXPECT_EQ(got_rejected.outcome, ClientOutcome::kRejected);
  EXPECT_EQ(got_rejected.reject_reason, "spec fingerprint mismatch");
  EXPECT_FALSE(got_rejected.train_ms.has_value());
  EXPECT_FALSE(got_rejected.uplink_bytes.has_value());
  EXPECT_TRUE(reader->ListClientRounds("e1", 1)->empty());

  auto evaluations = reader->ListEvaluations("e1", 0);
  ASSERT_TRUE(evaluations.ok()) << evaluations.status();
  ASSERT_EQ(evaluations->size(), 1u);
  EXPECT_EQ((*evaluations)[0].num_examples, 500);
  EXPECT_EQ((*evaluations)[0].loss, 0.3);
  EXPECT_EQ((*evaluations)[0].accuracy, 0.88);
  EXPECT_EQ((*evaluations)[0].eval_ms, 42.5);

  auto checkpoints = reader->ListCheckpoints("e1");
  ASSERT_TRUE(checkpoints.ok()) << checkpoints.status();
  ASSERT_EQ(checkpoints->size(), 1u);
  EXPECT_EQ((*checkpoints)[0].path, "/ckpt/e1/round-0.flat");
  EXPECT_EQ((*checkpoints)[0].bytes, 4096);
  EXPECT_EQ((*checkpoints)[0].fingerprint, "0123456789abcdef");
  EXPECT_EQ((*checkpoints)[0].checksum, "");
  EXPECT_EQ((*checkpoints)[0].model_version, 1);

  RecordStoreStats stats = store->stats();
  EXPECT_EQ(stats.enqueued, 8u);
  EXPECT_EQ(stats.written, 8u);
  EXPECT_EQ(stats.failed, 0u);
}

TEST(RecordStoreTest, StatusUpdatesChangeRowsAndUnknownRowsAreNotFound) {
  ScratchDir dir;
  const std::string path = dir.File("records.db");
  auto store = MustOpen(path);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Enqueue(Experiment("e1")).ok());
  ASSERT_TRUE(store->Enqueue(Client("e1", "c1")).ok());
  ASSERT_TRUE(store->Enqueue(ClientLeftRecord{"e1", "c1", 1'700'000'009'000, "heartbeat timeout"}).ok());
  ASSERT_TRUE(
      store->Enqueue(ExperimentStatusUpdate{"e1", ExperimentStatus::kFailed, "out of clients", 1'700'000'010'000})
          .ok());
  ASSERT_TRUE(store->Flush().ok());

  auto reader = MustRead(path);
  ASSERT_NE(reader, nullptr);
  auto e = reader->GetExperiment("e1");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->status, ExperimentStatus::kFailed);
  EXPECT_EQ(e->status_reason, "out of clients");
  EXPECT_EQ(e->finished_unix_ms, 1'700'000'010'000);
  auto clients = reader->ListClients("e1");
  ASSERT_TRUE(clients.ok());
  ASSERT_EQ(clients->size(), 1u);
  EXPECT_EQ((*clients)[0].left_unix_ms, 1'700'000'009'000);
  EXPECT_EQ((*clients)[0].left_reason, "heartbeat timeout");

  // --resume puts the experiment back to running.
  ASSERT_TRUE(store->Enqueue(ExperimentStatusUpdate{"e1", ExperimentStatus::kRunning, "", std::nullopt}).ok());
  ASSERT_TRUE(store->Enqueue(ExperimentStatusUpdate{"ghost", ExperimentStatus::kFinished, "", 1}).ok());
  absl::Status s = store->Flush();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_NE(Message(s).find("experiment status update (id ghost"), std::string::npos) << s;
  e = reader->GetExperiment("e1");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->status, ExperimentStatus::kRunning);
  EXPECT_FALSE(e->finished_unix_ms.has_value());
}

// Several threads enqueue at once through a small queue (backpressure); every record lands exactly once.
TEST(RecordStoreTest, ConcurrentWritersLandExactlyOnce) {
  ScratchDir dir;
  const std::string path = dir.File("records.db");
  RecordStoreOptions options;
  options.max_queue_records = 64;
  options.max_batch_records = 50;
  auto store = MustOpen(path, options);
  ASSERT_NE(store, nullptr);
  constexpr int kThreads = 8;
  constexpr int kRounds = 25;
  constexpr int kPerThread = 40;  // client rows per thread per round

  ASSERT_TRUE(store->Enqueue(Experiment("e1")).ok());
  for (int t = 0; t < kThreads; ++t) {
    for (int k = 0; k < kPerThread; ++k) {
      ASSERT_TRUE(store->Enqueue(Client("e1", ClientName(t, k))).ok());
    }
  }
  for (int r = 0; r < kRounds; ++r) ASSERT_TRUE(store->Enqueue(Round("e1", r)).ok());
  ASSERT_TRUE(store->Flush().ok());

  std::atomic<int> enqueue_failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < kRounds; ++r) {
        for (int k = 0; k < kPerThread; ++k) {
          if (!store->Enqueue(ClientRound("e1", r, 0, ClientName(t, k))).ok()) {
            ++enqueue_failures;
          }
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  absl::Status s = store->Flush();
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(enqueue_failures.load(), 0);

  auto reader = MustRead(path);
  ASSERT_NE(reader, nullptr);
  constexpr int64_t kExpected = int64_t{kThreads} * kRounds * kPerThread;
  EXPECT_EQ(Count(*reader, "SELECT count(*) FROM client_rounds"), kExpected);
  EXPECT_EQ(Count(*reader, "SELECT count(*) FROM (SELECT DISTINCT round, client_id FROM client_rounds)"), kExpected);
  RecordStoreStats stats = store->stats();
  EXPECT_EQ(stats.written, stats.enqueued);
  EXPECT_EQ(stats.failed, 0u);
  EXPECT_LE(stats.max_queue_depth, options.max_queue_records);
  EXPECT_GT(stats.batches, 1u);
}

// The policy for a bad record: it alone is dropped and reported; its batch and the other batches commit.
class ConstraintViolationTest : public ::testing::TestWithParam<size_t> {};

TEST_P(ConstraintViolationTest, OnlyTheBadRecordIsLostAndItIsReported) {
  ScratchDir dir;
  const std::string path = dir.File("records.db");
  std::mutex errors_mu;
  std::vector<std::string> reported;
  RecordStoreOptions options;
  options.max_batch_records = GetParam();
  options.on_error = [&](const absl::Status& s) {
    std::lock_guard lock(errors_mu);
    reported.emplace_back(s.message());
  };
  auto store = MustOpen(path, options);
  ASSERT_NE(store, nullptr);

  ASSERT_TRUE(store->Enqueue(Experiment("e1")).ok());
  ASSERT_TRUE(store->Enqueue(Client("e1", "c1")).ok());
  ASSERT_TRUE(store->Enqueue(Round("e1", 0, 0, RoundStatus::kFailed)).ok());     // a failed attempt ...
  ASSERT_TRUE(store->Enqueue(Round("e1", 0, 1, RoundStatus::kCommitted)).ok());  // ... retried and committed
  ASSERT_TRUE(store->Enqueue(ClientRound("e1", 0, 1, "c1")).ok());
  ASSERT_TRUE(store->Enqueue(Round("e1", 0, 2, RoundStatus::kCommitted)).ok());  // BAD: round 0 committed twice
  ASSERT_TRUE(store->Enqueue(Round("e1", 1, 0, RoundStatus::kCommitted)).ok());
  ASSERT_TRUE(store->Enqueue(ClientRound("e1", 1, 0, "c1")).ok());
  absl::Status s = store->Flush();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists) << s;
  EXPECT_NE(Message(s).find("round (experiment e1, round 0, attempt 2, committed)"), std::string::npos) << s;
  EXPECT_NE(Message(s).find("UNIQUE constraint failed: rounds.experiment_id, rounds.round"), std::string::npos) << s;
  EXPECT_NE(Message(s).find(path), std::string::npos) << s;
  EXPECT_TRUE(store->Flush().ok());  // reported once

  {
    std::lock_guard lock(errors_mu);
    ASSERT_EQ(reported.size(), 1u);
    EXPECT_EQ(reported[0], Message(s));
  }
  auto reader = MustRead(path);
  ASSERT_NE(reader, nullptr);
  EXPECT_EQ(Count(*reader, "SELECT count(*) FROM rounds"), 3);
  EXPECT_EQ(Count(*reader, "SELECT count(*) FROM rounds WHERE round = 0 AND status = 'committed'"), 1);
  EXPECT_EQ(Count(*reader, "SELECT count(*) FROM client_rounds"), 2);
  RecordStoreStats stats = store->stats();
  EXPECT_EQ(stats.written, 7u);
  EXPECT_EQ(stats.failed, 1u);

  // The same (round, attempt) twice is refused too, and so is a committed round without a model version.
  RoundRecord no_version = Round("e1", 2);
  no_version.model_version.reset();
  ASSERT_TRUE(store->Enqueue(Round("e1", 1, 0, RoundStatus::kFailed)).ok());
  ASSERT_TRUE(store->Enqueue(no_version).ok());
  ASSERT_TRUE(store->Enqueue(Round("e1", 3)).ok());
  s = store->Flush();
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists) << s;  // the first error of the two
  EXPECT_EQ(store->stats().failed, 3u);
  EXPECT_EQ(Count(*reader, "SELECT count(*) FROM rounds"), 4);
  EXPECT_TRUE(store->Close().ok());
}

INSTANTIATE_TEST_SUITE_P(BatchSizes, ConstraintViolationTest, ::testing::Values(1, 3, 1024),
                         [](const ::testing::TestParamInfo<size_t>& param_info) {
                           return fl::StrCat("batch", param_info.param);
                         });

TEST(RecordStoreTest, ChildBeforeParentIsAForeignKeyError) {
  ScratchDir dir;
  const std::string path = dir.File("records.db");
  auto store = MustOpen(path);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Enqueue(Experiment("e1")).ok());
  ASSERT_TRUE(store->Enqueue(ClientRound("e1", 0, 0, "c1")).ok());  // neither round 0 nor client c1 exists yet
  ASSERT_TRUE(store->Enqueue(Client("e1", "c1")).ok());
  absl::Status s = store->Flush();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(Message(s).find("FOREIGN KEY constraint failed"), std::string::npos) << s;
  EXPECT_NE(Message(s).find("client round (experiment e1, round 0, attempt 0, client c1)"), std::string::npos) << s;
  auto reader = MustRead(path);
  ASSERT_NE(reader, nullptr);
  EXPECT_EQ(Count(*reader, "SELECT count(*) FROM clients"), 1);
}

TEST(RecordStoreTest, CloseThenReopenShowsEverything) {
  ScratchDir dir;
  const std::string path = dir.File("records.db");
  {
    auto store = MustOpen(path);
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->Enqueue(Experiment("e1")).ok());
    ASSERT_TRUE(store->Enqueue(Client("e1", "c1")).ok());
    for (int r = 0; r < 100; ++r) {
      ASSERT_TRUE(store->Enqueue(Round("e1", r)).ok());
      ASSERT_TRUE(store->Enqueue(ClientRound("e1", r, 0, "c1")).ok());
    }
    EXPECT_TRUE(store->Close().ok());  // no Flush: Close flushes
    EXPECT_TRUE(store->Close().ok());  // idempotent
    absl::Status late = store->Enqueue(Round("e1", 100));
    EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition) << late;
  }
  // After the last connection closed SQLite checkpointed the WAL into the main file.
  EXPECT_FALSE(std::filesystem::exists(path + "-wal"));
  {
    auto store = MustOpen(path);  // reopen: migration is a no-op, data intact
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->Enqueue(Round("e1", 100)).ok());
    // Destruction without Close also flushes.
  }
  auto reader = MustRead(path);
  ASSERT_NE(reader, nullptr);
  EXPECT_EQ(Count(*reader, "SELECT count(*) FROM rounds"), 101);
  EXPECT_EQ(Count(*reader, "SELECT count(*) FROM client_rounds"), 100);
  auto last = reader->LastCommittedRound("e1");
  ASSERT_TRUE(last.ok()) << last.status();
  ASSERT_TRUE(last->has_value());
  EXPECT_EQ((*last)->round, 100);
}

TEST(RecordStoreTest, LastCommittedRoundAndLatestCheckpoint) {
  ScratchDir dir;
  const std::string path = dir.File("records.db");
  auto store = MustOpen(path);
  ASSERT_NE(store, nullptr);
  auto reader = MustRead(path);
  ASSERT_NE(reader, nullptr);

  auto none = reader->LastCommittedRound("e1");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->has_value());

  ASSERT_TRUE(store->Enqueue(Experiment("e1")).ok());
  ASSERT_TRUE(store->Enqueue(Experiment("e2")).ok());
  ASSERT_TRUE(store->Enqueue(Round("e1", 0, 0, RoundStatus::kFailed)).ok());
  ASSERT_TRUE(store->Flush().ok());
  none = reader->LastCommittedRound("e1");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value()) << "a failed attempt is not a committed round";

  for (int r = 0; r < 5; ++r) ASSERT_TRUE(store->Enqueue(Round("e1", r, r == 0 ? 1 : 0)).ok());
  ASSERT_TRUE(store->Enqueue(Round("e1", 5, 0, RoundStatus::kFailed)).ok());
  ASSERT_TRUE(store->Enqueue(Round("e1", 5, 1, RoundStatus::kAborted)).ok());
  ASSERT_TRUE(store->Enqueue(Round("e2", 9)).ok());
  ASSERT_TRUE(store->Enqueue(CheckpointRecord{"e1", 2, 3, "/c/2", 10, "00000000000000aa", "", 1}).ok());
  ASSERT_TRUE(store->Enqueue(CheckpointRecord{"e1", 4, 5, "/c/4", 10, "00000000000000aa", "beef", 2}).ok());
  ASSERT_TRUE(store->Flush().ok());

  auto last = reader->LastCommittedRound("e1");
  ASSERT_TRUE(last.ok()) << last.status();
  ASSERT_TRUE(last->has_value());
  EXPECT_EQ((*last)->round, 4);
  EXPECT_EQ((*last)->attempt, 0);
  EXPECT_EQ((*last)->model_version, 5);
  auto last_e2 = reader->LastCommittedRound("e2");
  ASSERT_TRUE(last_e2.ok() && last_e2->has_value());
  EXPECT_EQ((*last_e2)->round, 9);
  auto unknown = reader->LastCommittedRound("nope");
  ASSERT_TRUE(unknown.ok());
  EXPECT_FALSE(unknown->has_value());

  auto checkpoint = reader->LatestCheckpoint("e1");
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  ASSERT_TRUE(checkpoint->has_value());
  EXPECT_EQ((*checkpoint)->round, 4);
  EXPECT_EQ((*checkpoint)->path, "/c/4");
  EXPECT_EQ((*checkpoint)->checksum, "beef");
  auto no_checkpoint = reader->LatestCheckpoint("e2");
  ASSERT_TRUE(no_checkpoint.ok());
  EXPECT_FALSE(no_checkpoint->has_value());

  auto rounds = reader->ListRounds("e1");
  ASSERT_TRUE(rounds.ok());
  ASSERT_EQ(rounds->size(), 8u);
  EXPECT_EQ((*rounds)[0].round, 0);
  EXPECT_EQ((*rounds)[0].attempt, 0);
  EXPECT_EQ((*rounds)[0].status, RoundStatus::kFailed);
  EXPECT_EQ((*rounds)[0].failure_reason, "too few updates");
  EXPECT_EQ((*rounds)[1].attempt, 1);
  EXPECT_EQ((*rounds)[7].status, RoundStatus::kAborted);
  auto experiments = reader->ListExperiments();
  ASSERT_TRUE(experiments.ok());
  EXPECT_EQ(experiments->size(), 2u);
}

// A reader on its own connection sees each batch as soon as it commits, while the writer keeps writing,
// and is never blocked by it (WAL).
TEST(RecordStoreTest, ConcurrentReaderSeesCommittedRowsWhileTheWriterRuns) {
  ScratchDir dir;
  const std::string path = dir.File("records.db");
  auto store = MustOpen(path);
  ASSERT_NE(store, nullptr);
  constexpr int kRounds = 200;
  constexpr int kClients = 20;
  ASSERT_TRUE(store->Enqueue(Experiment("e1")).ok());
  for (int k = 0; k < kClients; ++k) ASSERT_TRUE(store->Enqueue(Client("e1", ClientName(0, k))).ok());
  ASSERT_TRUE(store->Flush().ok());

  std::atomic<bool> done{false};
  std::atomic<int> read_errors{0};
  std::atomic<int> went_backwards{0};
  std::atomic<int> reads{0};
  std::thread poller([&] {
    auto reader = RecordReader::Open(path);
    if (!reader.ok()) {
      ++read_errors;
      return;
    }
    int64_t seen = 0;
    while (!done.load()) {
      absl::StatusOr<int64_t> n = (*reader)->QueryInt("SELECT count(*) FROM rounds");
      if (!n.ok()) {
        ++read_errors;
        continue;
      }
      if (*n < seen) ++went_backwards;
      seen = *n;
      ++reads;
    }
  });

  auto reader = MustRead(path);
  ASSERT_NE(reader, nullptr);
  for (int r = 0; r < kRounds; ++r) {
    ASSERT_TRUE(store->Enqueue(Round("e1", r)).ok());
    for (int k = 0; k < kClients; ++k) ASSERT_TRUE(store->Enqueue(ClientRound("e1", r, 0, ClientName(0, k))).ok());
    if (r % 20 == 19) {
      ASSERT_TRUE(store->Flush().ok());
      EXPECT_EQ(Count(*reader, "SELECT count(*) FROM rounds"), r + 1);  // read-after-flush
    }
  }
  ASSERT_TRUE(store->Flush().ok());
  done = true;
  poller.join();
  EXPECT_EQ(read_errors.load(), 0);
  EXPECT_EQ(went_backwards.load(), 0);
  EXPECT_GT(reads.load(), 0);
  EXPECT_EQ(Count(*reader, "SELECT count(*) FROM rounds"), kRounds);
  EXPECT_EQ(Count(*reader, "SELECT count(*) FROM client_rounds"), kRounds * kClients);
}

// When the whole transaction cannot happen (the database stays locked past busy_timeout), the batch falls
// back to one record per transaction, and every record that still cannot be written is reported.
TEST(RecordStoreTest, LockedDatabaseIsReportedNotSilentlyLost) {
  ScratchDir dir;
  const std::string path = dir.File("records.db");
  RecordStoreOptions options;
  options.busy_timeout_ms = 50;
  auto store = MustOpen(path, options);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Enqueue(Experiment("e1")).ok());
  ASSERT_TRUE(store->Flush().ok());
  {
    WriteLockHolder lock(path);
    ASSERT_TRUE(store->Enqueue(Round("e1", 0)).ok());
    ASSERT_TRUE(store->Enqueue(Round("e1", 1)).ok());
    absl::Status s = store->Flush();
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    EXPECT_NE(Message(s).find("database is locked"), std::string::npos) << s;
    EXPECT_NE(Message(s).find("round (experiment e1, round 0"), std::string::npos) << s;
  }
  RecordStoreStats stats = store->stats();
  EXPECT_EQ(stats.failed, 2u);
  EXPECT_GE(stats.fallback_batches, 1u);
  // The lock is gone: writing works again.
  ASSERT_TRUE(store->Enqueue(Round("e1", 0)).ok());
  EXPECT_TRUE(store->Flush().ok());
  auto reader = MustRead(path);
  ASSERT_NE(reader, nullptr);
  EXPECT_EQ(Count(*reader, "SELECT count(*) FROM rounds"), 1);
}

// A writer stalled on a lock fills the queue: TryEnqueue says so, Enqueue waits, and nothing is lost once
// the lock is released.
TEST(RecordStoreTest, FullQueueAppliesBackpressure) {
  ScratchDir dir;
  const std::string path = dir.File("records.db");
  RecordStoreOptions options;
  options.busy_timeout_ms = 60'000;
  options.max_queue_records = 4;
  options.max_batch_records = 1;
  auto store = MustOpen(path, options);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Enqueue(Experiment("e1")).ok());
  ASSERT_TRUE(store->Flush().ok());

  auto lock = std::make_unique<WriteLockHolder>(path);
  int accepted = 0;
  absl::Status full;
  for (int r = 0; r < 20 && full.ok(); ++r) {
    full = store->TryEnqueue(Round("e1", r));
    if (full.ok()) ++accepted;
  }
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_NE(Message(full).find("write queue full"), std::string::npos) << full;
  EXPECT_GE(accepted, 4);
  EXPECT_LE(accepted, 5);  // the queue, plus the one record the stalled writer may hold

  std::atomic<bool> producer_done{false};
  std::thread producer([&] {
    for (int r = 100; r < 110; ++r) EXPECT_TRUE(store->Enqueue(Round("e1", r)).ok());
    producer_done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(producer_done.load()) << "Enqueue must wait while the queue is full";
  EXPECT_GE(store->stats().backpressure_waits, 1u);
  lock.reset();
  producer.join();
  EXPECT_TRUE(store->Flush().ok());
  auto reader = MustRead(path);
  ASSERT_NE(reader, nullptr);
  EXPECT_EQ(Count(*reader, "SELECT count(*) FROM rounds"), accepted + 10);
}

TEST(RecordStoreTest, CloseWakesABlockedProducerWithAnError) {
  ScratchDir dir;
  const std::string path = dir.File("records.db");
  RecordStoreOptions options;
  options.busy_timeout_ms = 300;
  options.max_queue_records = 1;
  options.max_batch_records = 1;
  auto store = MustOpen(path, options);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Enqueue(Experiment("e1")).ok());
  ASSERT_TRUE(store->Flush().ok());
  WriteLockHolder lock(path);
  // Fill the writer and the queue, then block a producer; Close drains (every record fails on the lock).
  std::atomic<int> closed_errors{0};
  std::thread producer([&] {
    for (int r = 0; r < 6; ++r) {
      absl::Status s = store->Enqueue(Round("e1", r));
      if (s.code() == absl::StatusCode::kFailedPrecondition) ++closed_errors;
    }
  });
  // Wait until the writer holds a record, the queue is full and the producer is blocked on it.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (store->stats().backpressure_waits < 1 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_GE(store->stats().backpressure_waits, 1u);
  absl::Status s = store->Close();
  producer.join();
  EXPECT_FALSE(s.ok());  // the records that met the lock
  EXPECT_GE(closed_errors.load(), 1);
  RecordStoreStats stats = store->stats();
  EXPECT_EQ(stats.enqueued, stats.written + stats.failed);
}

TEST(RecordStoreTest, ARejoiningClientUpdatesItsRow) {
  ScratchDir dir;
  const std::string path = dir.File("records.db");
  auto store = MustOpen(path);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Enqueue(Experiment("e1")).ok());
  ClientRecord first = Client("e1", "c1");
  first.link_kind = "wifi";
  ASSERT_TRUE(store->Enqueue(first).ok());
  ASSERT_TRUE(store->Enqueue(ClientLeftRecord{"e1", "c1", 5, "link lost"}).ok());
  ClientRecord again = Client("e1", "c1");
  again.link_kind = "5g";
  ASSERT_TRUE(store->Enqueue(again).ok());
  ASSERT_TRUE(store->Flush().ok());
  auto reader = MustRead(path);
  auto clients = reader->ListClients("e1");
  ASSERT_TRUE(clients.ok());
  ASSERT_EQ(clients->size(), 1u);
  EXPECT_EQ((*clients)[0].link_kind, "5g");
  EXPECT_FALSE((*clients)[0].left_unix_ms.has_value());
}

TEST(RecordStoreTest, RoundEvaluationFillsTheCommittedRound) {
  ScratchDir dir;
  const std::string path = dir.File("records.db");
  auto store = MustOpen(path);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Enqueue(Experiment("e1")).ok());
  ASSERT_TRUE(store->Enqueue(Round("e1", 1, 2)).ok());
  ASSERT_TRUE(store->Enqueue(RoundEvaluationUpdate{"e1", 1, 2, 0.5, 0.875, 10000, std::nullopt, std::nullopt}).ok());
  ASSERT_TRUE(store->Flush().ok());
  // An evaluation of a round attempt that does not exist is reported, not silently dropped.
  ASSERT_TRUE(store->Enqueue(RoundEvaluationUpdate{"e1", 7, 1, 0.5, 0.5, 1, std::nullopt, std::nullopt}).ok());
  absl::Status missing = store->Flush();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound) << missing;
  auto reader = MustRead(path);
  auto rounds = reader->ListRounds("e1");
  ASSERT_TRUE(rounds.ok());
  ASSERT_EQ(rounds->size(), 1u);
  EXPECT_DOUBLE_EQ((*rounds)[0].eval_accuracy.value_or(-1), 0.875);
  EXPECT_EQ((*rounds)[0].eval_num_examples.value_or(-1), 10000);
}

// Schema v6: the experiment's task (set once its first client is admitted), the regression and next-token
// figures of a round, and a client's evaluation with its MAE or the reason it was refused.
}  // namespace
}  // namespace fl::instrumentation
