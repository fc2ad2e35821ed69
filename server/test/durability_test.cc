// Faults and durability through the real fl-server and fl-client binaries (issue 13, item 10 a-d): fl-server
// killed at each step of a round's commit and of its evaluation (the FL_SERVER_TEST_KILL_AT test hook), a
// records database on a file system that fills up, its -shm file truncated under the server, corrupt
// checkpoints. After each, --resume (and --resume-from-round) must bring the experiment to the end with every
// committed round in the records exactly once, its client rows, checkpoint row and evaluation consistent.
#include <sys/mount.h>
#include <unistd.h>

#include <chrono>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>

#include "fl/core/str_cat.h"
#include "fl/instrumentation/record_reader.h"
#include "fl/testing/scratch_dir.h"
#include "fl/testing/subprocess.h"
#include "records_polling.h"

namespace fl::server {
namespace {

using fl::testing::Subprocess;

constexpr int kRounds = 6;  // evaluated after rounds 2, 4 and 6

struct Paths {
  std::string db;
  std::string ckpt;
  std::string log;
};

std::vector<std::string> ServerArgs(const Paths& p, int port, std::vector<std::string> extra = {},
                                    const std::string& kill_at = "") {
  std::vector<std::string> args;
  if (!kill_at.empty()) args = {"/usr/bin/env", fl::StrCat("FL_SERVER_TEST_KILL_AT=", kill_at)};
  for (std::string a : {std::string(FL_SERVER_BIN),
                        std::string("--listen"),
                        fl::StrCat("127.0.0.1:", port),
                        std::string("--db"),
                        p.db,
                        std::string("--checkpoint-dir"),
                        p.ckpt,
                        std::string("--rounds"),
                        std::to_string(kRounds),
                        std::string("--min-fit-clients"),
                        std::string("2"),
                        std::string("--min-available-clients"),
                        std::string("2"),
                        std::string("--evaluate-every"),
                        std::string("2"),
                        std::string("--round-deadline-ms"),
                        std::string("30000"),
                        std::string("--heartbeat-interval-ms"),
                        std::string("300"),
                        std::string("--log-level"),
                        std::string("info"),
                        std::string("--insecure")}) {
    args.push_back(std::move(a));
  }
  for (std::string& e : extra) args.push_back(std::move(e));
  return args;
}

std::vector<std::string> ClientArgs(int port, const std::string& name) {
  // 20 ms of "training": rounds are quick, and fl-server kills itself at an exact step anyway.
  return {FL_CLIENT_BIN,
          "--server",
          fl::StrCat("127.0.0.1:", port),
          "--name",
          name,
          "--model",
          "synthetic:2000:20",
          "--give-up-after-s",
          "90",
          "--log-level",
          "warn",
          "--insecure"};
}

using process_testing::Query;
using process_testing::ReadFile;
using process_testing::WaitFor;

constexpr const char* kCommitted = "SELECT count(*) FROM rounds WHERE status = 'committed'";

// Every committed round of 1..`rounds` is in the records exactly once, with one client row per selected
// client and one 'ok' row per accepted update, the checkpoint row of the model it committed, and (when it was
// due, up to round `evaluated_through`) its evaluation: figures and the clients' rows.
void ExpectConsistentRecords(const std::string& db, int64_t rounds, const std::string& log,
                             int64_t evaluated_through = kRounds) {
  auto opened = instrumentation::RecordReader::Open(db);
  ASSERT_TRUE(opened.ok()) << opened.status();
  auto& r = **opened;
  EXPECT_EQ(*r.QueryInt(kCommitted), rounds) << log;
  EXPECT_EQ(*r.QueryInt("SELECT count(DISTINCT round) FROM rounds WHERE status = 'committed'"), rounds);
  EXPECT_EQ(*r.QueryInt("SELECT coalesce(max(round), 0) FROM rounds WHERE status = 'committed'"), rounds);
  EXPECT_EQ(*r.QueryInt("SELECT count(*) FROM rounds WHERE status = 'committed' AND model_version <> round"), 0);
  EXPECT_EQ(*r.QueryInt(R"sql(SELECT count(*) FROM rounds r WHERE r.status = 'committed' AND (
                 r.num_accepted <> (SELECT count(*) FROM client_rounds c WHERE c.experiment_id = r.experiment_id
                                    AND c.round = r.round AND c.attempt = r.attempt AND c.outcome = 'ok')
              OR r.num_selected <> (SELECT count(*) FROM client_rounds c WHERE c.experiment_id = r.experiment_id
                                    AND c.round = r.round AND c.attempt = r.attempt)))sql"),
            0)
      << "a committed round whose client rows disagree with its counts";
  EXPECT_EQ(*r.QueryInt("SELECT count(*) FROM rounds r JOIN checkpoints k USING (experiment_id, round) "
                        "WHERE r.status = 'committed' AND k.model_version = r.model_version"),
            rounds)
      << "every committed round has the checkpoint row of the model it committed";
  EXPECT_EQ(*r.QueryInt(fl::StrCat("SELECT count(*) FROM rounds r WHERE r.status = 'committed' AND r.round <= ",
                                   evaluated_through, " AND (r.round % 2 = 0 OR r.round = ", kRounds,
                                   ") AND (r.eval_num_examples IS NULL OR NOT EXISTS (SELECT 1 FROM "
                                   "evaluations e WHERE e.experiment_id = r.experiment_id AND e.round = r.round "
                                   "AND e.attempt = r.attempt))")),
            0)
      << "an evaluation round without its evaluation";
}

void ExpectFinishedRun(const std::string& db, const std::string& log) {
  ExpectConsistentRecords(db, kRounds, log);
  EXPECT_EQ(Query(db, "SELECT count(*) FROM experiments"), 1);
  EXPECT_EQ(Query(db, "SELECT count(*) FROM experiments WHERE status = 'finished'"), 1);
}

// Runs fl-server to the end with --resume (and `extra` flags) and checks the clients see the end.
void ResumeToTheEnd(const Paths& p, int port, std::vector<std::unique_ptr<Subprocess>>& clients,
                    std::vector<std::string> extra = {}) {
  extra.insert(extra.begin(), "--resume");
  Subprocess server(ServerArgs(p, port, extra), p.log);
  auto code = server.Wait(std::chrono::seconds(120));
  ASSERT_TRUE(code.has_value()) << "resumed fl-server did not finish; " << ReadFile(p.log);
  EXPECT_EQ(*code, 0) << ReadFile(p.log);
  for (auto& c : clients) {
    auto client_code = c->Wait(std::chrono::seconds(30));
    ASSERT_TRUE(client_code.has_value());
    EXPECT_EQ(*client_code, 0) << "a client did not see the experiment finish; " << ReadFile(p.log);
  }
}

std::vector<std::unique_ptr<Subprocess>> StartClients(int port, const std::string& log) {
  std::vector<std::unique_ptr<Subprocess>> clients;
  for (int i = 0; i < 2; ++i)
    clients.push_back(std::make_unique<Subprocess>(ClientArgs(port, fl::StrCat("c", i)), log));
  return clients;
}

Paths MakePaths(const fl::testing::ScratchDir& dir) {
  return {dir.File("records.db"), dir.File("ckpt"), dir.File("log.txt")};
}

// Overwrites bytes in the middle of a file (its checksum no longer matches).
void Corrupt(const std::string& path) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(f) << path;
  f.seekp(static_cast<std::streamoff>(std::filesystem::file_size(path) / 2));
  f.write("\xde\xad\xbe\xef", 4);
}

// ---- (b), (c): SIGKILL at each commit step, then --resume ----

struct KillCase {
  std::string step;         // FL_SERVER_TEST_KILL_AT
  int64_t committed_after;  // rounds the records hold as committed right after the kill
};

void PrintTo(const KillCase& k, std::ostream* os) { *os << k.step; }

class KillAtCommitStepTest : public ::testing::TestWithParam<KillCase> {};

TEST_P(KillAtCommitStepTest, ResumeRecordsEveryRoundOnceWithConsistentRows) {
  const KillCase& k = GetParam();
  fl::testing::ScratchDir dir("fl_kill_step");
  const Paths p = MakePaths(dir);
  const int port = fl::testing::FreeLoopbackPort();
  auto clients = StartClients(port, p.log);
  {
    Subprocess server(ServerArgs(p, port, {}, k.step), p.log);
    auto code = server.Wait(std::chrono::seconds(90));
    ASSERT_TRUE(code.has_value()) << "fl-server did not reach " << k.step << "; " << ReadFile(p.log);
    ASSERT_EQ(*code, 128 + SIGKILL) << ReadFile(p.log);
  }
  EXPECT_NE(ReadFile(p.log).find(fl::StrCat("FL_SERVER_TEST_KILL_AT=", k.step)), std::string::npos);
  // What the records hold at the instant of the kill is consistent already: a commit is all or nothing. A kill
  // during an evaluation leaves nothing of it.
  const bool killed_in_evaluation = k.step.starts_with("evaluation-started");
  ExpectConsistentRecords(p.db, k.committed_after, p.log,
                          killed_in_evaluation ? k.committed_after - 1 : k.committed_after);
  if (killed_in_evaluation) {
    EXPECT_EQ(Query(p.db, fl::StrCat("SELECT count(*) FROM evaluations WHERE round = ", k.committed_after)), 0);
    EXPECT_EQ(Query(p.db, fl::StrCat("SELECT count(*) FROM rounds WHERE round = ", k.committed_after,
                                     " AND eval_num_examples IS NOT NULL")),
              0);
  }
  EXPECT_EQ(Query(p.db, "SELECT count(*) FROM experiments WHERE status = 'running'"), 1);

  ResumeToTheEnd(p, port, clients);
  const std::string log = ReadFile(p.log);
  ExpectFinishedRun(p.db, log);
  if (killed_in_evaluation) {
    EXPECT_NE(log.find(fl::StrCat("redoing the evaluation of round ", k.committed_after)), std::string::npos) << log;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Steps, KillAtCommitStepTest,
    ::testing::Values(
        // Round 3's checkpoint file is on disk, its records are not: round 3 is re-run from round 2's checkpoint
        // (pruning waits for the commit), and its checkpoint row is written once, with the re-run.
        KillCase{"checkpoint-written:3", 2},
        // Round 3's records are stored, older checkpoints not yet pruned.
        KillCase{"records-committed:3", 3},
        // (c) Killed while round 4 is being evaluated: --resume redoes the evaluation before round 5.
        KillCase{"evaluation-started:4", 4},
        // Killed after the evaluation's records: nothing to redo.
        KillCase{"evaluation-committed:4", 4},
        // (c) The last round's evaluation: --resume evaluates, then finishes.
        KillCase{"evaluation-started:6", 6}),
    [](const ::testing::TestParamInfo<KillCase>& case_info) {
      std::string name = case_info.param.step;
      for (char& c : name) {
        if (c == '-' || c == ':') c = '_';
      }
      return name;
    });

// ---- (d): corrupt checkpoints ----

// The newest checkpoint belongs to a round that never committed (killed after writing it) and is damaged: it
// must not stop --resume (without --experiment-id) from using the committed round's intact checkpoint.
TEST(DurabilityTest, CorruptUncommittedNewerCheckpointDoesNotBlockResume) {
  fl::testing::ScratchDir dir("fl_corrupt_newer");
  const Paths p = MakePaths(dir);
  const int port = fl::testing::FreeLoopbackPort();
  auto clients = StartClients(port, p.log);
  {
    Subprocess server(ServerArgs(p, port, {}, "checkpoint-written:3"), p.log);
    auto code = server.Wait(std::chrono::seconds(90));
    ASSERT_TRUE(code.has_value()) << ReadFile(p.log);
    ASSERT_EQ(*code, 128 + SIGKILL) << ReadFile(p.log);
  }
  Corrupt(p.ckpt + "/round-000003.ckpt");
  ResumeToTheEnd(p, port, clients);
  const std::string log = ReadFile(p.log);
  EXPECT_NE(log.find("skipping checkpoint of round 3"), std::string::npos) << log;
  ExpectFinishedRun(p.db, log);
}

// The last committed round's checkpoint is damaged: --resume refuses, naming the intact older checkpoint and
// the flag; --resume-from-round re-runs the rounds after it, recording their earlier commits as aborted.
TEST(DurabilityTest, CorruptCommittedCheckpointResumesFromAnOlderOneWithTheFlag) {
  fl::testing::ScratchDir dir("fl_corrupt_last");
  const Paths p = MakePaths(dir);
  const int port = fl::testing::FreeLoopbackPort();
  auto clients = StartClients(port, p.log);
  {
    Subprocess server(ServerArgs(p, port, {}, "records-committed:3"), p.log);
    auto code = server.Wait(std::chrono::seconds(90));
    ASSERT_TRUE(code.has_value()) << ReadFile(p.log);
    ASSERT_EQ(*code, 128 + SIGKILL) << ReadFile(p.log);
  }
  Corrupt(p.ckpt + "/round-000003.ckpt");
  {
    const std::string out = dir.File("refused.txt");
    Subprocess server(ServerArgs(p, port, {"--resume"}), out);
    auto code = server.Wait(std::chrono::seconds(30));
    ASSERT_TRUE(code.has_value());
    EXPECT_EQ(*code, 2);
    const std::string text = ReadFile(out);
    EXPECT_NE(text.find("the records say round 3 is the last committed one but its checkpoint cannot be used"),
              std::string::npos)
        << text;
    EXPECT_NE(text.find("checksum mismatch"), std::string::npos) << text;
    EXPECT_NE(text.find("--resume --resume-from-round 2 to re-run rounds 3-3"), std::string::npos) << text;
  }
  ResumeToTheEnd(p, port, clients, {"--resume-from-round", "2"});
  const std::string log = ReadFile(p.log);
  ExpectFinishedRun(p.db, log);
  // Round 3's first commit is kept, as aborted, and says why.
  EXPECT_EQ(Query(p.db,
                  "SELECT count(*) FROM rounds WHERE round = 3 AND status = 'aborted' AND failure_reason LIKE "
                  "'superseded: fl-server --resume-from-round 2 %'"),
            1);
}

TEST(DurabilityTest, ResumeFromRoundNeedsACommittedRound) {
  fl::testing::ScratchDir dir("fl_from_round");
  const Paths p = MakePaths(dir);
  const int port = fl::testing::FreeLoopbackPort();
  auto clients = StartClients(port, p.log);
  {
    Subprocess server(ServerArgs(p, port, {}, "records-committed:2"), p.log);
    auto code = server.Wait(std::chrono::seconds(90));
    ASSERT_TRUE(code.has_value()) << ReadFile(p.log);
  }
  const std::string out = dir.File("refused.txt");
  Subprocess server(ServerArgs(p, port, {"--resume", "--resume-from-round", "5"}), out);
  auto code = server.Wait(std::chrono::seconds(30));
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 2);
  EXPECT_NE(ReadFile(out).find("--resume-from-round 5: the records of experiment"), std::string::npos) << ReadFile(out);
  EXPECT_NE(ReadFile(out).find("hold rounds up to 2 as committed"), std::string::npos) << ReadFile(out);
}

// ---- (a): the records database fails ----

// A tmpfs of its own for the records database, unmounted (after the processes are gone) at the end.
class SmallTmpfs {
 public:
  SmallTmpfs(const std::string& path, const std::string& size) : path_(path) {
    std::filesystem::create_directories(path);
    mounted_ = ::mount("tmpfs", path.c_str(), "tmpfs", 0, fl::StrCat("size=", size).c_str()) == 0;
    if (!mounted_) error_ = std::strerror(errno);
  }
  ~SmallTmpfs() {
    if (mounted_) ::umount2(path_.c_str(), MNT_DETACH);
  }
  bool mounted() const { return mounted_; }
  const std::string& error() const { return error_; }

  // Writes a file until the file system is full.
  void Fill() {
    std::ofstream out(path_ + "/filler", std::ios::binary);
    const std::string block(64 * 1024, 'x');
    while (out.write(block.data(), static_cast<std::streamsize>(block.size()))) {
    }
  }
  void Unfill() { std::filesystem::remove(path_ + "/filler"); }

 private:
  std::string path_;
  bool mounted_ = false;
  std::string error_;
};

TEST(DurabilityTest, FullRecordsFileSystemStopsTheExperimentAndResumeCompletesIt) {
  fl::testing::ScratchDir dir("fl_records_full");
  SmallTmpfs fs(dir.File("dbfs"), "4m");
  // A failure, not a skip: a skipped test would count as passing. The testbed's tests run as root (README).
  ASSERT_TRUE(fs.mounted()) << "cannot mount a 4 MB tmpfs for the full-disk case (needs root: run the tests as "
                               "root, as ./fl.sh test does on the testbed's machines): "
                            << fs.error();
  Paths p = MakePaths(dir);
  p.db = dir.File("dbfs/records.db");
  const int port = fl::testing::FreeLoopbackPort();
  auto clients = StartClients(port, p.log);
  {
    const std::string out = dir.File("failed.txt");
    Subprocess server(ServerArgs(p, port), out);
    ASSERT_TRUE(WaitFor(p.db, kCommitted, 2, std::chrono::seconds(60))) << ReadFile(out);
    fs.Fill();
    auto code = server.Wait(std::chrono::seconds(90));
    ASSERT_TRUE(code.has_value()) << "fl-server went on with a full records database; " << ReadFile(out);
    EXPECT_EQ(*code, 1) << ReadFile(out);
    const std::string text = ReadFile(out);
    // The disk filled while a round's records or an evaluation's were being stored (whichever came first).
    const bool at_evaluation = text.find("could not be stored") != std::string::npos &&
                               text.find("the evaluation of round") != std::string::npos;
    if (!at_evaluation) {
      EXPECT_NE(text.find("was not committed: its records could not be stored"), std::string::npos) << text;
    }
    EXPECT_NE(text.find("database or disk is full"), std::string::npos) << text;
    EXPECT_NE(text.find("run fl-server again with --resume"), std::string::npos) << text;
    EXPECT_EQ(text.find("rounds committed"), std::string::npos) << "never 'finished: all N rounds committed'";
    // What the records hold is consistent: the rounds before the failure, each once (the last one without its
    // evaluation when that is what failed: --resume redoes it).
    const int64_t committed = Query(p.db, kCommitted);
    EXPECT_GE(committed, 2);
    EXPECT_LE(committed, kRounds);
    ExpectConsistentRecords(p.db, committed, text, at_evaluation ? committed - 1 : committed);
  }
  fs.Unfill();
  ResumeToTheEnd(p, port, clients);
  ExpectFinishedRun(p.db, ReadFile(p.log));
}

// The records database's shared-memory index truncated under fl-server: a clear message and the failure
// status instead of a silent SIGBUS death; --resume completes the experiment.
TEST(DurabilityTest, TruncatedShmFileEndsTheServerWithAMessage) {
  fl::testing::ScratchDir dir("fl_shm");
  const Paths p = MakePaths(dir);
  const int port = fl::testing::FreeLoopbackPort();
  auto clients = StartClients(port, p.log);
  {
    const std::string out = dir.File("bus.txt");
    Subprocess server(ServerArgs(p, port), out);
    ASSERT_TRUE(WaitFor(p.db, kCommitted, 2, std::chrono::seconds(60))) << ReadFile(out);
    // No connection of this process is open now (WaitFor closes its reader), so none re-extends the file.
    ASSERT_EQ(::truncate((p.db + "-shm").c_str(), 0), 0) << std::strerror(errno);
    auto code = server.Wait(std::chrono::seconds(90));
    ASSERT_TRUE(code.has_value()) << ReadFile(out);
    EXPECT_EQ(*code, 1) << ReadFile(out);
    const std::string text = ReadFile(out);
    EXPECT_NE(text.find("bus error (SIGBUS)"), std::string::npos) << text;
    EXPECT_NE(text.find(p.db + "-shm"), std::string::npos) << text;
  }
  ResumeToTheEnd(p, port, clients);
  ExpectFinishedRun(p.db, ReadFile(p.log));
}

}  // namespace
}  // namespace fl::server
