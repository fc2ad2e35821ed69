// Issue 27, "a server paused for 20 s evicts every client when it resumes", made the way the fault-injection harness
// made it: the real fl-server and fl-client binaries on loopback, and fl-server stopped with SIGSTOP while a round is
// open (the clients have the model and train), then continued with SIGCONT. The pause (6 s) is longer than four
// heartbeat intervals (4 x 1 s) and spans the round's deadline (5 s after the dispatch), so a server that judged its
// clients for its own stall would fail the round (and evict them when their heartbeats are read after its check). The
// test waits for the events it needs (the dispatch in the server's log, the downloads in the clients' metrics, the
// end of the run) and reads what happened from the records; faults_engine_test (ManualClock) pins the exact behaviour.
#include <chrono>
#include <csignal>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "fl/core/str_cat.h"
#include "fl/testing/prometheus_server.h"
#include "fl/testing/scratch_dir.h"
#include "fl/testing/subprocess.h"
#include "records_polling.h"

namespace fl::server {
namespace {

using fl::testing::Subprocess;
using process_testing::Query;
using process_testing::ReadFile;

// Polls `path` until it contains `needle` (the server's log is flushed line by line); false after `timeout`.
bool WaitForLine(const std::string& path, const std::string& needle, std::chrono::seconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < until) {
    if (ReadFile(path).find(needle) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

TEST(FaultsProcessTest, AServerStoppedAndContinuedEvictsNobodyAndItsOpenRoundCommits) {
  fl::testing::ScratchDir dir("fl_faults_process");
  const int port = fl::testing::FreeLoopbackPort();
  const std::string log = dir.File("server.txt");
  Subprocess server({FL_SERVER_BIN,
                     "--listen",
                     fl::StrCat("127.0.0.1:", port),
                     "--db",
                     dir.File("records.db"),
                     "--rounds",
                     "2",
                     "--min-fit-clients",
                     "2",
                     "--min-available-clients",
                     "2",
                     "--round-deadline-ms",
                     "5000",
                     "--heartbeat-interval-ms",
                     "1000",
                     "--evaluate-every",
                     "0",
                     "--log-level",
                     "info",
                     "--insecure"},
                    log);
  std::vector<std::unique_ptr<Subprocess>> clients;
  std::vector<int> metrics_ports;
  for (const char* name : {"a", "b"}) {
    metrics_ports.push_back(fl::testing::FreeLoopbackPort());
    clients.push_back(std::make_unique<Subprocess>(
        std::vector<std::string>{FL_CLIENT_BIN, "--server", fl::StrCat("127.0.0.1:", port), "--name", name, "--model",
                                 "synthetic:1000:2000", "--give-up-after-s", "60", "--log-level", "warn", "--insecure",
                                 "--metrics-addr", fl::StrCat("127.0.0.1:", metrics_ports.back())},
        dir.File(fl::StrCat(name, ".txt"))));
  }
  ASSERT_TRUE(WaitForLine(log, "round 1 (attempt 1)", std::chrono::seconds(60))) << ReadFile(log);
  // Both clients have the model (their metrics show its version) and train for 2 s: the server stops now, so that
  // the pause covers their training, their uploads and heartbeats, and the round's deadline, not their download
  // (a download cut by the pause is the client's own give-up at its task's deadline).
  for (int metrics_port : metrics_ports) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    bool downloaded = false;
    while (!downloaded && std::chrono::steady_clock::now() < until) {
      auto r = fl::testing::HttpGetLoopback(metrics_port, "/metrics", std::chrono::seconds(5));
      downloaded = r.ok() && r->body.find("fl_client_model_version{") != std::string::npos;
      if (!downloaded) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_TRUE(downloaded) << "a client never reported the downloaded model";
  }
  server.Kill(SIGSTOP);
  std::this_thread::sleep_for(std::chrono::seconds(6));
  server.Kill(SIGCONT);
  const auto code = server.Wait(std::chrono::seconds(90));
  ASSERT_TRUE(code.has_value()) << "fl-server did not finish: " << ReadFile(log);
  EXPECT_EQ(*code, 0) << ReadFile(log);
  for (auto& c : clients) EXPECT_TRUE(c->Wait(std::chrono::seconds(30)).has_value());
  const std::string db = dir.File("records.db");
  // Nobody was evicted for the server's silence, and round 1 committed in its first attempt with both updates.
  EXPECT_EQ(Query(db, "SELECT count(*) FROM client_events WHERE kind = 'session_closed'"), 0) << ReadFile(log);
  EXPECT_EQ(Query(db, "SELECT count(*) FROM rounds WHERE status != 'committed'"), 0) << ReadFile(log);
  EXPECT_EQ(Query(db,
                  "SELECT count(*) FROM rounds WHERE round = 1 AND attempt = 1 AND status = 'committed' AND "
                  "num_accepted = 2"),
            1)
      << ReadFile(log);
  EXPECT_NE(ReadFile(log).find("the engine did not run for"), std::string::npos) << ReadFile(log);
}

}  // namespace
}  // namespace fl::server
