// The real `fl-coordinator` process: two simulated islands run a whole Streaming DiLoCo schedule against it over
// loopback; it exits 0 once the last sync committed and both left, and its records say so. Bad flags are refused
// with a message naming the value, also through the alias `fl-server --mode islands`.
#include <sys/wait.h>

#include <filesystem>
#include <fstream>

#include <sqlite3.h>
#include <gtest/gtest.h>

#include "coord_test_util.h"
#include "fl/instrumentation/sqlite.h"
#include "fl/testing/scratch_dir.h"
#include "fl/testing/subprocess.h"

namespace fl::diloco::testing {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

int WaitForPort(const std::string& port_file, fl::testing::Subprocess& server) {
  for (int i = 0; i < 3000 && server.running(); ++i) {
    if (std::filesystem::exists(port_file)) return std::stoi(ReadFile(port_file));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return 0;
}

TEST(ProcessTest, FlCoordinatorRunsTheScheduleAndRecordsIt) {
  fl::testing::ScratchDir dir("fl_coord_proc");
  const std::string db = dir.File("records.db");
  fl::testing::Subprocess server({FL_COORDINATOR_BIN,
                                  "--listen",
                                  "127.0.0.1:0",
                                  "--port-file",
                                  dir.File("port"),
                                  "--db",
                                  db,
                                  "--experiment-id",
                                  "islands-proc",
                                  "--inner-steps",
                                  "4",
                                  "--fragments",
                                  "2",
                                  "--outer-steps",
                                  "2",
                                  "--min-islands",
                                  "2",
                                  "--codec",
                                  "int8",
                                  "--island-option",
                                  "model=charlm",
                                  "--heartbeat-interval-ms",
                                  "100",
                                  "--insecure"},
                                 dir.File("server.log"));
  const int port = WaitForPort(dir.File("port"), server);
  ASSERT_GT(port, 0) << ReadFile(dir.File("server.log"));
  const std::string address = fl::StrCat("127.0.0.1:", port);

  SimIsland a("a"), b("b");
  auto ja = std::async(std::launch::async, [&] { return a.Connect(address); });
  auto jb = std::async(std::launch::async, [&] { return b.Connect(address); });
  auto assignment = ja.get();
  ASSERT_TRUE(assignment.ok()) << assignment.status();
  ASSERT_TRUE(jb.get().ok());
  EXPECT_EQ(assignment->schedule.num_fragments, 2u);
  EXPECT_EQ(assignment->schedule.codec, "int8");
  EXPECT_EQ(assignment->schedule.options.at("model"), "charlm");
  EXPECT_EQ(assignment->experiment_id, "islands-proc");
  for (uint64_t step = 0; step < 2; ++step) {
    for (uint32_t fragment = 0; fragment < 2; ++fragment) {
      auto plans = BeginAll({&a, &b}, SyncKey{step, fragment});
      for (const auto& p : plans) ASSERT_TRUE(p.ok()) << p.status();
      for (const auto& v : ApplyAndReportAll({&a, &b}, plans)) {
        ASSERT_TRUE(v.ok()) << v.status();
        EXPECT_EQ(v->kind, VerdictKind::kCommit);
      }
    }
  }
  ASSERT_TRUE(a.client->Leave("finished").ok());
  ASSERT_TRUE(b.client->Leave("finished").ok());
  EXPECT_EQ(server.Wait(std::chrono::seconds(60)), 0) << ReadFile(dir.File("server.log"));

  auto sql = instrumentation::sqlite::Database::Open(db, SQLITE_OPEN_READONLY);
  ASSERT_TRUE(sql.ok()) << sql.status();
  EXPECT_EQ(*sql->QueryText("SELECT status FROM experiments WHERE id = 'islands-proc'"), "finished");
  EXPECT_EQ(*sql->QueryInt("SELECT count(*) FROM island_epochs WHERE outcome = 'committed'"), 4);
  EXPECT_EQ(*sql->QueryInt("SELECT count(*) FROM island_syncs WHERE verdict = 'commit'"), 8);
  EXPECT_EQ(*sql->QueryInt("SELECT count(*) FROM islands WHERE left_reason = 'left: finished'"), 2);
  EXPECT_NE(sql->QueryText("SELECT config_json FROM experiments")->find("\"codec\":\"int8\""), std::string::npos);
}

TEST(ProcessTest, BadFlagsAreRefusedNamingTheValue) {
  fl::testing::ScratchDir dir("fl_coord_proc");
  fl::testing::Subprocess server(
      {FL_COORDINATOR_BIN, "--inner-steps", "10", "--fragments", "3", "--db", "", "--insecure"},
      dir.File("server.log"));
  EXPECT_EQ(server.Wait(std::chrono::seconds(30)), 2);
  const std::string log = ReadFile(dir.File("server.log"));
  EXPECT_NE(log.find("--fragments = 3"), std::string::npos) << log;

  // A `fl-server --mode islands` command line runs unchanged under the new name.
  fl::testing::Subprocess codec({FL_COORDINATOR_BIN, "--mode=islands", "--codec", "int9", "--db", "", "--insecure"},
                                dir.File("codec.log"));
  EXPECT_EQ(codec.Wait(std::chrono::seconds(30)), 2);
  EXPECT_NE(ReadFile(dir.File("codec.log")).find("int9"), std::string::npos) << ReadFile(dir.File("codec.log"));
}

// Secure by default: no TLS flags and no --insecure is a refusal naming both ways out; --insecure says what it
// gives away; the three TLS flags go together.
TEST(ProcessTest, PlaintextOnlyWhenAskedForByName) {
  fl::testing::ScratchDir dir("fl_coord_proc");
  fl::testing::Subprocess bare({FL_COORDINATOR_BIN, "--listen", "127.0.0.1:0", "--db", ""}, dir.File("bare.log"));
  EXPECT_EQ(bare.Wait(std::chrono::seconds(30)), 2);
  const std::string log = ReadFile(dir.File("bare.log"));
  for (const char* want : {"--tls-cert", "--tls-key", "--tls-client-ca", "--insecure", "fl-provision"}) {
    EXPECT_NE(log.find(want), std::string::npos) << want << " in: " << log;
  }
  fl::testing::Subprocess half({FL_COORDINATOR_BIN, "--db", "", "--tls-cert", "x.crt"}, dir.File("half.log"));
  EXPECT_EQ(half.Wait(std::chrono::seconds(30)), 2);
  EXPECT_NE(ReadFile(dir.File("half.log")).find("go together"), std::string::npos) << ReadFile(dir.File("half.log"));

  fl::testing::Subprocess insecure({FL_COORDINATOR_BIN, "--listen", "127.0.0.1:0", "--port-file", dir.File("port"),
                                    "--db", "", "--insecure", "--min-islands", "1"},
                                   dir.File("insecure.log"));
  ASSERT_GT(WaitForPort(dir.File("port"), insecure), 0) << ReadFile(dir.File("insecure.log"));
  insecure.Kill(SIGTERM);
  insecure.Wait(std::chrono::seconds(30));
  EXPECT_NE(ReadFile(dir.File("insecure.log"))
                .find("fl-coordinator: --insecure: serving plaintext gRPC: anyone who reaches 127.0.0.1:0 can join as "
                      "any island"),
            std::string::npos)
      << ReadFile(dir.File("insecure.log"));
}

// The old command is an alias: fl-server says so on stderr and execs fl-coordinator with the other arguments.
TEST(ProcessTest, FlServerModeIslandsExecsFlCoordinator) {
  fl::testing::ScratchDir dir("fl_coord_proc");
  fl::testing::Subprocess alias(
      {FL_SERVER_BIN, "--mode", "islands", "--inner-steps", "10", "--fragments", "3", "--db", "", "--insecure"},
      dir.File("alias.log"));
  EXPECT_EQ(alias.Wait(std::chrono::seconds(30)), 2);
  const std::string log = ReadFile(dir.File("alias.log"));
  EXPECT_NE(log.find("fl-server: --mode islands is the islands coordinator's old name: running "), std::string::npos)
      << log;
  EXPECT_NE(log.find("fl-coordinator: --fragments = 3 is invalid"), std::string::npos)
      << "the refusal comes from fl-coordinator itself: " << log;

  fl::testing::Subprocess help({FL_SERVER_BIN, "--mode=islands", "--help"}, dir.File("help.log"));
  EXPECT_EQ(help.Wait(std::chrono::seconds(30)), 0);
  EXPECT_NE(ReadFile(dir.File("help.log")).find("fl-coordinator: the coordinator of cross-site islands"),
            std::string::npos)
      << ReadFile(dir.File("help.log"));
}

}  // namespace
}  // namespace fl::diloco::testing
