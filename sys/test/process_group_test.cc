#include "fl/sys/process_group.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <map>
#include <string>
#include <thread>

#include "fl/testing/scratch_dir.h"
#include "process_test_util.h"

namespace fl::sys {
namespace {

using namespace std::chrono_literals;
using test::Alive;
using test::WaitForLine;
using test::WaitUntilGone;

TEST(ProcessGroupTest, ReportsEachChildsExitAndLogsItsOutput) {
  fl::testing::ScratchDir dir("fl_pg");
  ProcessGroup group;
  ASSERT_TRUE(group.Start("ok", {"/bin/sh", "-c", "echo hello; echo to-stderr >&2; exit 0"}, dir.File("ok.log")).ok());
  ASSERT_TRUE(group.Start("bad", {"/bin/sh", "-c", "exit 3"}, dir.File("bad.log")).ok());
  std::map<std::string, int> codes;
  while (codes.size() < 2) {
    std::optional<ChildExit> e = group.WaitAny(20s);
    ASSERT_TRUE(e.has_value());
    codes[e->name] = e->code;
  }
  EXPECT_EQ(codes["ok"], 0);
  EXPECT_EQ(codes["bad"], 3);
  EXPECT_EQ(group.num_running(), 0u);
  EXPECT_FALSE(group.WaitAny(10ms).has_value());
  std::ifstream log(dir.File("ok.log"));
  std::string line;
  std::getline(log, line);
  EXPECT_EQ(line, "hello");
  std::getline(log, line);
  EXPECT_EQ(line, "to-stderr");
}

TEST(ProcessGroupTest, MissingProgramIsAClearError) {
  fl::testing::ScratchDir dir("fl_pg");
  ProcessGroup group;
  absl::StatusOr<pid_t> pid = group.Start("ghost", {"/nonexistent/fl-server"}, dir.File("g.log"));
  ASSERT_FALSE(pid.ok());
  EXPECT_NE(std::string(pid.status().message()).find("/nonexistent/fl-server"), std::string::npos);
  EXPECT_NE(std::string(pid.status().message()).find("ghost"), std::string::npos);
  EXPECT_EQ(group.num_running(), 0u);
}

TEST(ProcessGroupTest, StopAllStopsTheFirstOneFirstAndKillsWhatIgnoresSigterm) {
  fl::testing::ScratchDir dir("fl_pg");
  ProcessGroup group;
  ASSERT_TRUE(group.Start("server", {"/bin/sleep", "60"}, dir.File("s.log")).ok());
  // Ignores SIGTERM: only SIGKILL after the grace period stops it.
  const std::string ready = dir.File("ready");
  absl::StatusOr<pid_t> stubborn = group.Start(
      "stubborn", {"/bin/sh", "-c", "trap '' TERM; echo ready > " + ready + "; while true; do sleep 0.05; done"},
      dir.File("x.log"));
  ASSERT_TRUE(stubborn.ok());
  ASSERT_EQ(WaitForLine(ready), "ready");  // the trap is in place
  const std::vector<ChildExit> exits = group.StopAll("server", 500ms);
  EXPECT_EQ(group.num_running(), 0u);
  ASSERT_EQ(exits.size(), 2u);
  EXPECT_EQ(exits[0].name, "server");
  EXPECT_EQ(exits[0].code, 128 + SIGTERM);
  EXPECT_TRUE(exits[0].signaled);
  EXPECT_EQ(exits[1].name, "stubborn");
  EXPECT_EQ(exits[1].code, 128 + SIGKILL);
  EXPECT_FALSE(Alive(*stubborn));
}

TEST(ProcessGroupTest, StopAllStopsNamedStagesInOrder) {
  fl::testing::ScratchDir dir("fl_pg");
  const std::string order = dir.File("order");
  ProcessGroup group;
  for (const std::string name : {"client", "relay", "server"}) {
    const std::string ready = dir.File(name + ".ready");
    ASSERT_TRUE(group
                    .Start(name,
                           {"/bin/sh", "-c",
                            "trap 'echo " + name + " >> " + order + "; exit 0' TERM; echo ready > " + ready +
                                "; while :; do sleep 0.05; done"},
                           dir.File(name + ".log"))
                    .ok());
    ASSERT_EQ(WaitForLine(ready), "ready");
  }
  const std::vector<ChildExit> exits = group.StopAll(std::vector<std::string>{"server", "relay"}, 10s);
  ASSERT_EQ(exits.size(), 3u);
  EXPECT_EQ(exits[0].name, "server");
  EXPECT_EQ(exits[1].name, "relay");
  EXPECT_EQ(exits[2].name, "client");
  std::ifstream in(order);
  std::string a, b, c;
  in >> a >> b >> c;
  EXPECT_EQ(a, "server");
  EXPECT_EQ(b, "relay");
  EXPECT_EQ(c, "client");
}

TEST(ProcessGroupTest, RunningIsFalseOnceItExitedEvenBeforeWaitAny) {
  fl::testing::ScratchDir dir("fl_pg");
  ProcessGroup group;
  ASSERT_TRUE(group.Start("server", {"/bin/sh", "-c", "exit 2"}, dir.File("s.log")).ok());
  const auto end = std::chrono::steady_clock::now() + 20s;
  while (group.Running("server") && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(5ms);
  EXPECT_FALSE(group.Running("server"));
  EXPECT_EQ(group.num_running(), 1u);  // not reaped yet
  std::optional<ChildExit> e = group.WaitAny(20s);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code, 2);
}

TEST(ProcessGroupTest, SignalReachesWhatTheChildStarted) {
  fl::testing::ScratchDir dir("fl_pg");
  ProcessGroup group;
  const std::string pid_file = dir.File("grandchild.pid");
  ASSERT_TRUE(
      group.Start("wrapper", {"/bin/sh", "-c", "sleep 30 & echo $! > " + pid_file + "; wait"}, dir.File("w.log")).ok());
  const pid_t grandchild = std::stoi(WaitForLine(pid_file));
  group.Signal("wrapper", SIGTERM);
  std::optional<ChildExit> e = group.WaitAny(20s);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->name, "wrapper");
  EXPECT_TRUE(WaitUntilGone(grandchild)) << "grandchild " << grandchild << " outlived the group's SIGTERM";
  if (Alive(grandchild)) kill(grandchild, SIGKILL);
}

// If fl-experiment itself dies (crash, kill -9), its children get SIGTERM from the kernel: no orphans.
TEST(ProcessGroupTest, ChildrenDieWithTheirParent) {
  fl::testing::ScratchDir dir("fl_pg");
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const pid_t parent = fork();  // the parent that dies
  ASSERT_GE(parent, 0);
  if (parent == 0) {
    ProcessGroup group;
    absl::StatusOr<pid_t> child = group.Start("sleeper", {"/bin/sleep", "60"}, dir.File("c.log"));
    const pid_t pid = child.ok() ? *child : -1;
    (void)!write(pipe_fds[1], &pid, sizeof pid);
    _exit(0);  // no destructor: as if it crashed
  }
  pid_t child = -1;
  ASSERT_EQ(read(pipe_fds[0], &child, sizeof child), static_cast<ssize_t>(sizeof child));
  close(pipe_fds[0]);
  close(pipe_fds[1]);
  ASSERT_GT(child, 0);
  waitpid(parent, nullptr, 0);
  EXPECT_TRUE(WaitUntilGone(child)) << "the orphan " << child << " outlived its parent";
  if (Alive(child)) kill(child, SIGKILL);
}

}  // namespace
}  // namespace fl::sys
