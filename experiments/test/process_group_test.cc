#include "fl/experiment/process_group.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>

#include "fl/testing/scratch_dir.h"

namespace fl::experiment {
namespace {

using namespace std::chrono_literals;

bool Alive(pid_t pid) { return kill(pid, 0) == 0; }

TEST(ProcessGroupTest, ReportsEachChildsExitAndLogsItsOutput) {
  fl::testing::ScratchDir dir("fl_pg");
  ProcessGroup group;
  ASSERT_TRUE(group.Start("ok", {"/bin/sh", "-c", "echo hello; exit 0"}, dir.File("ok.log")).ok());
  ASSERT_TRUE(group.Start("bad", {"/bin/sh", "-c", "exit 3"}, dir.File("bad.log")).ok());
  std::map<std::string, int> codes;
  while (codes.size() < 2) {
    std::optional<ChildExit> e = group.WaitAny(10s);
    ASSERT_TRUE(e.has_value());
    codes[e->name] = e->code;
  }
  EXPECT_EQ(codes["ok"], 0);
  EXPECT_EQ(codes["bad"], 3);
  std::ifstream log(dir.File("ok.log"));
  std::string line;
  std::getline(log, line);
  EXPECT_EQ(line, "hello");
}

TEST(ProcessGroupTest, MissingProgramIsAClearError) {
  fl::testing::ScratchDir dir("fl_pg");
  ProcessGroup group;
  absl::StatusOr<pid_t> pid = group.Start("ghost", {"/nonexistent/fl-server"}, dir.File("g.log"));
  ASSERT_FALSE(pid.ok());
  EXPECT_NE(std::string(pid.status().message()).find("/nonexistent/fl-server"), std::string::npos);
  EXPECT_EQ(group.num_running(), 0u);
}

TEST(ProcessGroupTest, StopAllStopsTheFirstOneFirstAndKillsWhatIgnoresSigterm) {
  fl::testing::ScratchDir dir("fl_pg");
  ProcessGroup group;
  ASSERT_TRUE(group.Start("server", {"/bin/sleep", "60"}, dir.File("s.log")).ok());
  // Ignores SIGTERM: only SIGKILL after the grace period stops it.
  absl::StatusOr<pid_t> stubborn =
      group.Start("stubborn", {"/bin/sh", "-c", "trap '' TERM; while true; do sleep 0.05; done"}, dir.File("x.log"));
  ASSERT_TRUE(stubborn.ok());
  std::this_thread::sleep_for(200ms);  // let the shell install its trap
  const std::vector<ChildExit> exits = group.StopAll("server", 500ms);
  EXPECT_EQ(group.num_running(), 0u);
  ASSERT_EQ(exits.size(), 2u);
  EXPECT_EQ(exits[0].name, "server");
  EXPECT_EQ(exits[0].code, 128 + SIGTERM);
  EXPECT_EQ(exits[1].code, 128 + SIGKILL);
  EXPECT_FALSE(Alive(*stubborn));
}

// If fl-experiment itself dies (crash, kill -9), its children get SIGTERM from the kernel: no orphans.
TEST(ProcessGroupTest, ChildrenDieWithTheirParent) {
  fl::testing::ScratchDir dir("fl_pg");
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const pid_t parent = fork();
  ASSERT_GE(parent, 0);
  if (parent == 0) {
    ProcessGroup group;
    absl::StatusOr<pid_t> child = group.Start("sleeper", {"/bin/sleep", "60"}, dir.File("c.log"));
    const pid_t pid = child.ok() ? *child : -1;
    (void)!write(pipe_fds[1], &pid, sizeof pid);
    std::this_thread::sleep_for(100ms);
    _exit(0);  // no destructor: as if it crashed
  }
  pid_t child = -1;
  ASSERT_EQ(read(pipe_fds[0], &child, sizeof child), static_cast<ssize_t>(sizeof child));
  ASSERT_GT(child, 0);
  waitpid(parent, nullptr, 0);
  const auto end = std::chrono::steady_clock::now() + 10s;
  while (Alive(child) && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(Alive(child)) << "the orphan " << child << " outlived its parent";
  if (Alive(child)) kill(child, SIGKILL);
  close(pipe_fds[0]);
  close(pipe_fds[1]);
}

}  // namespace
}  // namespace fl::experiment
