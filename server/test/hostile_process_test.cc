// Faults through the real fl-server and fl-client binaries (issue 13, item 10(e)): a client stopped with
// SIGSTOP during the run and continued after the experiment ended must exit at once, told by fl-server that
// the experiment is over, instead of retrying Join until its give-up time.
#include <signal.h>

#include <chrono>
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

using process_testing::Query;
using process_testing::ReadFile;
using process_testing::WaitFor;

TEST(HostileProcessTest, AClientStoppedDuringTheRunExitsWhenContinuedAfterTheEnd) {
  fl::testing::ScratchDir dir("fl_stopped");
  const int port = fl::testing::FreeLoopbackPort();
  const std::string db = dir.File("records.db");
  const std::string log = dir.File("server.txt");
  // One client is enough for a round, so that the experiment goes on without the stopped one; the linger is
  // long, so that the client is continued while fl-server still waits for it.
  Subprocess server({FL_SERVER_BIN,
                     "--listen",
                     fl::StrCat("127.0.0.1:", port),
                     "--db",
                     db,
                     "--rounds",
                     "4",
                     "--min-fit-clients",
                     "1",
                     "--min-available-clients",
                     "1",
                     "--evaluate-every",
                     "0",
                     "--heartbeat-interval-ms",
                     "300",
                     "--upload-message-timeout-ms",
                     "2000",
                     "--linger-s",
                     "120",
                     "--log-level",
                     "info",
                     "--insecure"},
                    log);
  auto client = [&](const std::string& name) {
    return std::vector<std::string>{FL_CLIENT_BIN,
                                    "--server",
                                    fl::StrCat("127.0.0.1:", port),
                                    "--name",
                                    name,
                                    "--model",
                                    "synthetic:20000:300",
                                    "--give-up-after-s",
                                    "120",
                                    "--log-level",
                                    "info",
                                    "--insecure"};
  };
  // c1 first, and c0 only once c1 is admitted: the experiment needs one client to run, so a c1 slow to start
  // (a loaded machine) could otherwise find all four rounds committed by c0 before it joined, and there would be
  // no session left to stop.
  Subprocess c1(client("c1"), dir.File("c1.txt"));
  ASSERT_TRUE(WaitFor(db, "SELECT count(*) FROM clients WHERE client_name = 'c1'", 1, std::chrono::seconds(60)))
      << ReadFile(log);
  Subprocess c0(client("c0"), dir.File("c0.txt"));
  ASSERT_TRUE(WaitFor(db, "SELECT count(*) FROM rounds WHERE status = 'committed'", 1, std::chrono::seconds(60)))
      << ReadFile(log);
  c1.Kill(SIGSTOP);
  // The experiment ends without it: c0 trains the remaining rounds alone.
  ASSERT_TRUE(WaitFor(db, "SELECT count(*) FROM experiments WHERE status = 'finished'", 1, std::chrono::seconds(90)))
      << ReadFile(log);
  auto c0_code = c0.Wait(std::chrono::seconds(30));
  ASSERT_TRUE(c0_code.has_value());
  EXPECT_EQ(*c0_code, 0) << ReadFile(dir.File("c0.txt"));
  EXPECT_FALSE(server.Wait(std::chrono::milliseconds(200)).has_value())
      << "fl-server must wait for c1; " << ReadFile(log);

  c1.Kill(SIGCONT);
  auto c1_code = c1.Wait(std::chrono::seconds(60));
  ASSERT_TRUE(c1_code.has_value()) << "the continued client did not exit; " << ReadFile(dir.File("c1.txt"));
  EXPECT_EQ(*c1_code, 0) << ReadFile(dir.File("c1.txt"));
  const std::string c1_out = ReadFile(dir.File("c1.txt"));
  EXPECT_NE(c1_out.find("has ended (finished: all 4 rounds committed)"), std::string::npos) << c1_out;
  EXPECT_EQ(c1_out.find("cannot reach fl-server"), std::string::npos) << c1_out;
  // Once it was told, fl-server stops lingering and exits with the experiment's status.
  auto server_code = server.Wait(std::chrono::seconds(60));
  ASSERT_TRUE(server_code.has_value()) << ReadFile(log);
  EXPECT_EQ(*server_code, 0) << ReadFile(log);
  EXPECT_EQ(Query(db, "SELECT count(*) FROM rounds WHERE status = 'committed'"), 4);
}

}  // namespace
}  // namespace fl::server
