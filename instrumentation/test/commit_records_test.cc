// Group records of fl-server's commits (issue 13, item 10 b): a round's commit (its row, its client rows, its
// checkpoint row) and an evaluation's commit land whole or not at all, a re-run round's checkpoint row follows
// the rewritten file, and --resume-from-round's superseded rounds are kept as aborted.
#include <string>

#include <gtest/gtest.h>

#include "fl/instrumentation/record_reader.h"
#include "fl/instrumentation/record_store.h"
#include "test_util.h"

namespace fl::instrumentation {
namespace {

using testing_util::Client;
using testing_util::ClientRound;
using testing_util::Experiment;
using testing_util::Round;
using testing_util::ScratchDir;

CheckpointRecord Checkpoint(const std::string& experiment_id, int64_t round, int64_t model_version) {
  CheckpointRecord c;
  c.experiment_id = experiment_id;
  c.round = round;
  c.model_version = model_version;
  c.path = "/ckpt/round-" + std::to_string(round) + ".ckpt";
  c.bytes = 4096;
  c.fingerprint = "0123456789abcdef";
  c.created_unix_ms = 1'700'000'009'000 + model_version;
  return c;
}

RoundCommitRecord Commit(int64_t round, int64_t attempt, std::vector<std::string> clients) {
  RoundCommitRecord commit;
  commit.round = Round("e1", round, attempt);
  commit.round.num_selected = static_cast<int64_t>(clients.size());
  commit.round.num_accepted = static_cast<int64_t>(clients.size());
  commit.round.num_late = 0;
  for (const std::string& c : clients) commit.client_rounds.push_back(ClientRound("e1", round, attempt, c));
  commit.checkpoint = Checkpoint("e1", round, *commit.round.model_version);
  return commit;
}

class CommitRecordsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = dir_.File("records.db");
    auto store = RecordStore::Open(path_);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
    ASSERT_TRUE(store_->Enqueue(Experiment("e1")).ok());
    ASSERT_TRUE(store_->Enqueue(Client("e1", "c1")).ok());
    ASSERT_TRUE(store_->Enqueue(Client("e1", "c2")).ok());
    ASSERT_TRUE(store_->Flush().ok());
  }
  int64_t Count(const std::string& sql) {
    auto reader = RecordReader::Open(path_);
    EXPECT_TRUE(reader.ok()) << reader.status();
    auto n = (*reader)->QueryInt(sql);
    EXPECT_TRUE(n.ok()) << n.status();
    return n.ok() ? *n : -1;
  }

  ScratchDir dir_;
  std::string path_;
  std::unique_ptr<RecordStore> store_;
};

TEST_F(CommitRecordsTest, ARoundCommitLandsWhole) {
  ASSERT_TRUE(store_->Enqueue(Commit(1, 1, {"c1", "c2"})).ok());
  ASSERT_TRUE(store_->Flush().ok());
  EXPECT_EQ(Count("SELECT count(*) FROM rounds WHERE round = 1 AND status = 'committed'"), 1);
  EXPECT_EQ(Count("SELECT count(*) FROM client_rounds WHERE round = 1"), 2);
  EXPECT_EQ(Count("SELECT count(*) FROM checkpoints WHERE round = 1 AND model_version = 2"), 1);
}

// One bad client row (an unknown client: a foreign key) and nothing of the commit is stored — not the round's
// row, not the other client's row, not the checkpoint row — while the records around it are.
TEST_F(CommitRecordsTest, ARoundCommitWithOneBadRowLeavesNothingAndIsReportedWhole) {
  ASSERT_TRUE(store_->Enqueue(Round("e1", 1, 0, RoundStatus::kFailed)).ok());
  ASSERT_TRUE(store_->Enqueue(Commit(1, 1, {"c1", "ghost"})).ok());
  ASSERT_TRUE(store_->Enqueue(Client("e1", "c3")).ok());
  const absl::Status s = store_->Flush();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("commit of round 1 (experiment e1, attempt 1"), std::string_view::npos) << s;
  EXPECT_NE(s.message().find("client ghost"), std::string_view::npos) << s;
  EXPECT_EQ(Count("SELECT count(*) FROM rounds WHERE round = 1 AND status = 'committed'"), 0);
  EXPECT_EQ(Count("SELECT count(*) FROM client_rounds"), 0);
  EXPECT_EQ(Count("SELECT count(*) FROM checkpoints"), 0);
  EXPECT_EQ(Count("SELECT count(*) FROM rounds WHERE status = 'failed'"), 1);
  EXPECT_EQ(Count("SELECT count(*) FROM clients WHERE client_id = 'c3'"), 1);
}

// A second commit of a committed round breaks rounds_committed_once: none of its rows land either.
TEST_F(CommitRecordsTest, ASecondCommitOfARoundLeavesNothing) {
  ASSERT_TRUE(store_->Enqueue(Commit(1, 1, {"c1"})).ok());
  ASSERT_TRUE(store_->Enqueue(Commit(1, 2, {"c1", "c2"})).ok());
  const absl::Status s = store_->Flush();
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(Count("SELECT count(*) FROM rounds WHERE round = 1"), 1);
  EXPECT_EQ(Count("SELECT count(*) FROM client_rounds WHERE attempt = 2"), 0);
  EXPECT_EQ(Count("SELECT model_version FROM checkpoints WHERE round = 1"), 2);
}

TEST_F(CommitRecordsTest, AnEvaluationCommitIsAllOrNothing) {
  ASSERT_TRUE(store_->Enqueue(Commit(2, 1, {"c1", "c2"})).ok());
  EvaluationCommitRecord evaluation;
  evaluation.experiment_id = "e1";
  evaluation.round = 2;
  evaluation.attempt = 1;
  for (const char* client : {"c1", "ghost"}) {
    EvaluationRecord e;
    e.experiment_id = "e1";
    e.round = 2;
    e.attempt = 1;
    e.client_id = client;
    e.num_examples = 100;
    e.loss = 0.5;
    e.accuracy = 0.9;
    evaluation.evaluations.push_back(e);
  }
  RoundEvaluationUpdate figures;
  figures.experiment_id = "e1";
  figures.round = 2;
  figures.attempt = 1;
  figures.eval_loss = 0.5;
  figures.eval_accuracy = 0.9;
  figures.eval_num_examples = 200;
  evaluation.figures = figures;
  ASSERT_TRUE(store_->Enqueue(evaluation).ok());
  EXPECT_FALSE(store_->Flush().ok());
  EXPECT_EQ(Count("SELECT count(*) FROM evaluations"), 0);
  EXPECT_EQ(Count("SELECT count(*) FROM rounds WHERE round = 2 AND eval_loss IS NULL"), 1);

  evaluation.evaluations.pop_back();  // without the unknown client it lands, figures included
  ASSERT_TRUE(store_->Enqueue(evaluation).ok());
  ASSERT_TRUE(store_->Flush().ok());
  EXPECT_EQ(Count("SELECT count(*) FROM evaluations WHERE round = 2"), 1);
  EXPECT_EQ(Count("SELECT eval_num_examples FROM rounds WHERE round = 2"), 200);
}

// fl-server --resume-from-round 1 re-runs round 2: its first commit becomes aborted (kept, with the reason),
// the re-run commits attempt 2, and the checkpoint row of round 2 describes the rewritten file.
TEST_F(CommitRecordsTest, SupersededRoundsAreKeptAsAbortedAndTheirCheckpointRowIsReplaced) {
  ASSERT_TRUE(store_->Enqueue(Commit(1, 1, {"c1"})).ok());
  ASSERT_TRUE(store_->Enqueue(Commit(2, 1, {"c1"})).ok());
  ASSERT_TRUE(store_->Flush().ok());
  RoundsSupersededUpdate superseded{"e1", 1, "superseded: fl-server --resume-from-round 1 re-ran round 2"};
  ASSERT_TRUE(store_->Enqueue(superseded).ok());
  RoundCommitRecord rerun = Commit(2, 2, {"c1", "c2"});
  rerun.checkpoint->bytes = 8192;
  ASSERT_TRUE(store_->Enqueue(rerun).ok());
  ASSERT_TRUE(store_->Flush().ok());
  EXPECT_EQ(Count("SELECT count(*) FROM rounds WHERE round = 2 AND attempt = 1 AND status = 'aborted' AND "
                  "failure_reason LIKE 'superseded:%'"),
            1);
  EXPECT_EQ(Count("SELECT attempt FROM rounds WHERE round = 2 AND status = 'committed'"), 2);
  EXPECT_EQ(Count("SELECT count(*) FROM rounds WHERE round = 1 AND status = 'committed'"), 1);
  EXPECT_EQ(Count("SELECT count(*) FROM checkpoints WHERE round = 2"), 1);
  EXPECT_EQ(Count("SELECT bytes FROM checkpoints WHERE round = 2"), 8192);
}

// Schema v9, late folding: round 1 committed with c2 late (its row says 'late', no figures); round 2's aggregate
// folded c2's late update in, so round 2's commit replaces that row of round 1 whole (outcome 'folded', the
// figures, staleness, discount and folded_into_round = 2), in the same unit as round 2's own rows.
TEST_F(CommitRecordsTest, ACommitReplacesTheRowsOfTheLateUpdatesItFolded) {
  RoundCommitRecord first = Commit(1, 0, {"c1"});
  ClientRoundRecord late;
  late.experiment_id = "e1";
  late.round = 1;
  late.client_id = "c2";
  late.outcome = ClientOutcome::kLate;
  first.client_rounds.push_back(late);
  ASSERT_TRUE(store_->Enqueue(first).ok());
  RoundCommitRecord second = Commit(2, 0, {"c1"});
  ClientRoundRecord folded = ClientRound("e1", 1, 0, "c2");
  folded.outcome = ClientOutcome::kFolded;
  folded.base_model_version = 1;
  folded.staleness = 1;
  folded.staleness_weight = 0.5;
  folded.folded_into_round = 2;
  second.folded_rows.push_back(folded);
  ASSERT_TRUE(store_->Enqueue(second).ok());
  absl::Status flushed = store_->Flush();
  ASSERT_TRUE(flushed.ok()) << flushed;
  auto reader = RecordReader::Open(path_);
  ASSERT_TRUE(reader.ok()) << reader.status();
  auto rows = (*reader)->ListClientRounds("e1", 1);
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 2u);
  EXPECT_EQ((*rows)[1], folded);
  EXPECT_EQ(Count("SELECT count(*) FROM client_rounds WHERE round = 2"), 1);

  // A folded row that breaks a CHECK (folded into its own round) undoes the whole commit of round 3.
  RoundCommitRecord third = Commit(3, 0, {"c1"});
  ClientRoundRecord bad = folded;
  bad.round = 3;
  bad.folded_into_round = 3;
  third.client_rounds.push_back(ClientRound("e1", 3, 0, "c2"));
  third.folded_rows.push_back(bad);
  ASSERT_TRUE(store_->Enqueue(third).ok());
  flushed = store_->Flush();
  EXPECT_FALSE(flushed.ok());
  EXPECT_NE(std::string(flushed.message()).find("1 folded rows of earlier rounds"), std::string::npos) << flushed;
  EXPECT_EQ(Count("SELECT count(*) FROM rounds WHERE round = 3"), 0);
  EXPECT_EQ(Count("SELECT count(*) FROM client_rounds WHERE round = 3"), 0);
}

}  // namespace
}  // namespace fl::instrumentation
