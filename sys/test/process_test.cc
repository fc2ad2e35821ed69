#include "fl/sys/process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "fl/testing/scratch_dir.h"
#include "process_test_util.h"

namespace fl::sys {
namespace {

using namespace std::chrono_literals;
using test::Alive;
using test::WaitForLine;
using test::WaitUntilGone;
using ::testing::HasSubstr;
using ::testing::Not;

SpawnOptions Argv(std::vector<std::string> argv) {
  SpawnOptions o;
  o.argv = std::move(argv);
  return o;
}

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string Message(const absl::Status& s) { return std::string(s.message()); }

TEST(ChildTest, ReportsExitCodes) {
  absl::StatusOr<Child> t = Child::Spawn(Argv({"/bin/true"}));
  ASSERT_TRUE(t.ok()) << t.status();
  ExitStatus e = t->Wait();
  EXPECT_TRUE(e.success());
  EXPECT_EQ(e.code, 0);
  EXPECT_FALSE(t->running());

  absl::StatusOr<Child> f = Child::Spawn(Argv({"/bin/false"}));
  ASSERT_TRUE(f.ok()) << f.status();
  e = f->Wait();
  EXPECT_FALSE(e.success());
  EXPECT_EQ(e.code, 1);
  EXPECT_FALSE(e.signaled());

  absl::StatusOr<Child> seven = Child::Spawn(Argv({"sh", "-c", "exit 7"}));  // found in PATH
  ASSERT_TRUE(seven.ok()) << seven.status();
  e = seven->Wait();
  EXPECT_EQ(e.code, 7);
  EXPECT_EQ(e.Describe(), "exited with 7");
  ASSERT_TRUE(seven->exit_status().has_value());
  EXPECT_EQ(seven->exit_status()->code, 7);
}

TEST(ChildTest, ReportsTheSignalThatEndedIt) {
  absl::StatusOr<Child> c = Child::Spawn(Argv({"/bin/sh", "-c", "kill -9 $$"}));
  ASSERT_TRUE(c.ok()) << c.status();
  const ExitStatus e = c->Wait();
  EXPECT_TRUE(e.signaled());
  EXPECT_EQ(e.signal, SIGKILL);
  EXPECT_EQ(e.code, 128 + SIGKILL);
  EXPECT_THAT(e.Describe(), HasSubstr("killed by signal 9"));
}

TEST(ChildTest, AMissingProgramIsAnErrorNamingIt) {
  absl::StatusOr<Child> c = Child::Spawn(Argv({"/nonexistent/fl-server", "--flag"}));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(c.status()), HasSubstr("/nonexistent/fl-server"));
  EXPECT_THAT(Message(c.status()), HasSubstr("No such file or directory"));

  SpawnOptions named = Argv({"fl-sys-test-no-such-program"});
  named.name = "ghost";
  c = Child::Spawn(named);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(c.status()), HasSubstr("ghost"));
  EXPECT_THAT(Message(c.status()), HasSubstr("fl-sys-test-no-such-program"));
  EXPECT_THAT(Message(c.status()), HasSubstr("PATH"));
}

TEST(ChildTest, ANonExecutableFileOrMissingDirectoryIsAnErrorNamingIt) {
  fl::testing::ScratchDir dir("fl_sys");
  const std::string script = dir.File("not-executable.sh");
  std::ofstream(script) << "#!/bin/sh\nexit 0\n";
  chmod(script.c_str(), 0644);
  absl::StatusOr<Child> c = Child::Spawn(Argv({script}));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kPermissionDenied);  // no x bit: not even root may exec it
  EXPECT_THAT(Message(c.status()), HasSubstr(script));

  SpawnOptions o = Argv({"/bin/true"});
  o.cwd = dir.File("no-such-dir");
  c = Child::Spawn(o);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(Message(c.status()), HasSubstr("/bin/true"));
  EXPECT_THAT(Message(c.status()), HasSubstr(o.cwd));

  o = Argv({"/bin/true"});
  o.stdout_to = Stdio::File(dir.File("no-such-dir/log"));
  c = Child::Spawn(o);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(Message(c.status()), HasSubstr(dir.File("no-such-dir/log")));

  EXPECT_EQ(Child::Spawn(Argv({})).status().code(), absl::StatusCode::kInvalidArgument);
  o = Argv({"/bin/true"});
  o.env = {"NO_EQUALS_SIGN"};
  EXPECT_EQ(Child::Spawn(o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ChildTest, RedirectsStdoutAndStderrToFiles) {
  fl::testing::ScratchDir dir("fl_sys");
  SpawnOptions o = Argv({"/bin/sh", "-c", "echo out; echo err >&2"});
  o.stdout_to = Stdio::File(dir.File("out.log"));
  o.stderr_to = Stdio::File(dir.File("err.log"));
  for (int i = 0; i < 2; ++i) {  // appended
    absl::StatusOr<Child> c = Child::Spawn(o);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_TRUE(c->Wait().success());
  }
  EXPECT_EQ(Read(dir.File("out.log")), "out\nout\n");
  EXPECT_EQ(Read(dir.File("err.log")), "err\nerr\n");

  o.stdout_to = Stdio::File(dir.File("out.log"), /*append_to_it=*/false);
  o.stderr_to = Stdio::ToStdout();
  absl::StatusOr<Child> c = Child::Spawn(o);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->Wait().success());
  EXPECT_EQ(Read(dir.File("out.log")), "out\nerr\n");
}

TEST(ChildTest, AddsToTheEnvironmentAndRunsInTheWorkingDirectory) {
  fl::testing::ScratchDir dir("fl_sys");
  setenv("FL_SYS_TEST_REPLACED", "before", 1);
  SpawnOptions o = Argv({"/bin/sh", "-c", "echo \"$FL_SYS_TEST_ADDED:$FL_SYS_TEST_REPLACED:$HOME:$(pwd -P)\""});
  o.env = {"FL_SYS_TEST_ADDED=a=b", "FL_SYS_TEST_REPLACED=after"};
  o.cwd = dir.path().string();
  absl::StatusOr<CommandOutput> r = Capture(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->exit.success());
  const char* home = getenv("HOME");
  const std::string cwd = std::filesystem::canonical(dir.path()).string();
  EXPECT_EQ(r->out, "a=b:after:" + std::string(home != nullptr ? home : "") + ":" + cwd + "\n");
  unsetenv("FL_SYS_TEST_REPLACED");
}

TEST(ChildTest, StdinIsDevNullAndOnlyStdioIsInherited) {
  // A descriptor the parent forgot to mark close-on-exec stays here.
  const int leaked = dup2(STDERR_FILENO, 100);
  ASSERT_EQ(leaked, 100);
  absl::StatusOr<CommandOutput> r = Capture(Argv({"/bin/sh", "-c", "cat; ls /proc/self/fd"}));
  close(leaked);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->exit.success()) << r->err;
  std::istringstream fds(r->out);
  std::vector<std::string> names;
  for (std::string fd; fds >> fd;) names.push_back(fd);
  EXPECT_THAT(names, ::testing::Contains("0"));
  EXPECT_THAT(names, Not(::testing::Contains("100")));
}

TEST(ChildTest, AWaitThatRunsOutIsATimeoutAndTheChildCanStillBeStopped) {
  absl::StatusOr<Child> c = Child::Spawn(Argv({"/bin/sleep", "30"}));
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<ExitStatus> e = c->Wait(100ms);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(Message(e.status()), HasSubstr("/bin/sleep"));
  EXPECT_TRUE(c->running());
  EXPECT_FALSE(c->exited());
  EXPECT_FALSE(c->Poll().has_value());

  absl::StatusOr<ExitStatus> stopped = c->Stop(5s);
  ASSERT_TRUE(stopped.ok()) << stopped.status();
  EXPECT_EQ(stopped->signal, SIGTERM);
  EXPECT_EQ(stopped->code, 128 + SIGTERM);
  EXPECT_FALSE(c->running());
  EXPECT_FALSE(Alive(c->pid()));
  EXPECT_EQ(c->Signal(SIGTERM).code(), absl::StatusCode::kFailedPrecondition);  // reaped: nothing is sent
}

TEST(ChildTest, StopEscalatesToSigkillForAChildThatIgnoresSigterm) {
  fl::testing::ScratchDir dir("fl_sys");
  const std::string ready = dir.File("ready");
  absl::StatusOr<Child> c = Child::Spawn(Argv({"/bin/sh", "-c", "trap '' TERM; echo ready > " + ready + "; sleep 30"}));
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(WaitForLine(ready), "ready");  // the trap is in place
  absl::StatusOr<ExitStatus> e = c->Stop(300ms);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->signal, SIGKILL);
  EXPECT_FALSE(Alive(c->pid()));
}

TEST(ChildTest, SignalReachesTheWholeProcessGroup) {
  fl::testing::ScratchDir dir("fl_sys");
  const std::string pid_file = dir.File("grandchild.pid");
  absl::StatusOr<Child> c = Child::Spawn(Argv({"/bin/sh", "-c", "sleep 30 & echo $! > " + pid_file + "; wait"}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->has_own_group());
  EXPECT_EQ(getpgid(c->pid()), c->pid());
  const pid_t grandchild = std::stoi(WaitForLine(pid_file));
  ASSERT_TRUE(Alive(grandchild));
  ASSERT_TRUE(c->Signal(SIGKILL).ok());
  EXPECT_EQ(c->Wait().signal, SIGKILL);
  EXPECT_TRUE(WaitUntilGone(grandchild)) << "grandchild " << grandchild << " outlived the group's SIGKILL";
  if (Alive(grandchild)) kill(grandchild, SIGKILL);
}

TEST(ChildTest, StopKillsGrandchildrenThatOutliveTheChild) {
  fl::testing::ScratchDir dir("fl_sys");
  const std::string pid_file = dir.File("grandchild.pid");
  // The grandchild ignores SIGTERM; the child itself exits on it.
  absl::StatusOr<Child> c = Child::Spawn(
      Argv({"/bin/sh", "-c", "/bin/sh -c 'trap \"\" TERM; echo $$ > " + pid_file + "; exec sleep 30' & wait"}));
  ASSERT_TRUE(c.ok()) << c.status();
  const pid_t grandchild = std::stoi(WaitForLine(pid_file));
  ASSERT_TRUE(Alive(grandchild));
  absl::StatusOr<ExitStatus> e = c->Stop(300ms);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->signal, SIGTERM);
  EXPECT_TRUE(WaitUntilGone(grandchild)) << "grandchild " << grandchild << " outlived Stop()";
  if (Alive(grandchild)) kill(grandchild, SIGKILL);
}

TEST(ChildTest, ASharedGroupIsSignalledThroughTheChildAlone) {
  SpawnOptions o = Argv({"/bin/sleep", "30"});
  o.new_process_group = false;
  absl::StatusOr<Child> c = Child::Spawn(o);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->has_own_group());
  EXPECT_EQ(getpgid(c->pid()), getpgrp());
  ASSERT_TRUE(c->Signal(SIGTERM).ok());  // not our own group: we are still here
  EXPECT_EQ(c->Wait().signal, SIGTERM);
}

TEST(ChildTest, TheDestructorLeavesNoOrphan) {
  pid_t pid = -1;
  {
    SpawnOptions o = Argv({"/bin/sleep", "30"});
    o.stop_grace = 1s;
    absl::StatusOr<Child> c = Child::Spawn(o);
    ASSERT_TRUE(c.ok()) << c.status();
    pid = c->pid();
    Child moved = std::move(*c);  // the moved-from one owns nothing
    EXPECT_EQ(c->pid(), -1);
    EXPECT_EQ(moved.pid(), pid);
  }
  // Reaped by the destructor: not even a zombie is left.
  EXPECT_EQ(kill(pid, 0), -1);
}

// A child dies with the process that spawned it (PR_SET_PDEATHSIG), even when that one dies without running
// any destructor.
TEST(ChildTest, ChildrenDieWithTheProcessThatSpawnedThem) {
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const pid_t intermediate = fork();  // the process that dies (this test's only fork: it needs a parent to kill)
  ASSERT_GE(intermediate, 0);
  if (intermediate == 0) {
    absl::StatusOr<Child> child = Child::Spawn(Argv({"/bin/sleep", "60"}));
    const pid_t pid = child.ok() ? child->pid() : -1;
    (void)!write(pipe_fds[1], &pid, sizeof pid);
    _exit(0);  // no destructor: as if it crashed
  }
  pid_t child = -1;
  ASSERT_EQ(read(pipe_fds[0], &child, sizeof child), static_cast<ssize_t>(sizeof child));
  close(pipe_fds[0]);
  close(pipe_fds[1]);
  ASSERT_GT(child, 0);
  waitpid(intermediate, nullptr, 0);
  EXPECT_TRUE(WaitUntilGone(child)) << "the orphan " << child << " outlived its parent";
  if (Alive(child)) kill(child, SIGKILL);
}

TEST(ChildTest, StopInOrderStopsEachBeforeSignallingTheNext) {
  fl::testing::ScratchDir dir("fl_sys");
  const std::string order = dir.File("order");
  std::vector<Child> children;
  for (const std::string name : {"a", "b", "c"}) {
    const std::string ready = dir.File(name + ".ready");
    SpawnOptions o = Argv({"/bin/sh", "-c",
                           "trap 'echo " + name + " >> " + order + "; exit 0' TERM; echo ready > " + ready +
                               "; while :; do sleep 0.05; done"});
    o.stderr_to = Stdio::Null();  // the shell's "Terminated" about its sleep
    absl::StatusOr<Child> c = Child::Spawn(o);
    ASSERT_TRUE(c.ok()) << c.status();
    ASSERT_EQ(WaitForLine(ready), "ready");
    children.push_back(std::move(*c));
  }
  StopInOrder({&children[2], &children[0], nullptr, &children[1]}, 10s);
  for (Child& c : children) {
    EXPECT_FALSE(c.running());
    ASSERT_TRUE(c.exit_status().has_value());
    EXPECT_EQ(c.exit_status()->code, 0);  // each one's trap ran
  }
  EXPECT_EQ(Read(order), "c\na\nb\n");
}

TEST(ChildTest, StopTogetherKillsWhatIgnoresSigterm) {
  fl::testing::ScratchDir dir("fl_sys");
  absl::StatusOr<Child> polite = Child::Spawn(Argv({"/bin/sleep", "30"}));
  const std::string ready = dir.File("ready");
  absl::StatusOr<Child> stubborn =
      Child::Spawn(Argv({"/bin/sh", "-c", "trap '' TERM; echo ready > " + ready + "; sleep 30"}));
  ASSERT_TRUE(polite.ok() && stubborn.ok());
  ASSERT_EQ(WaitForLine(ready), "ready");
  StopTogether({&*polite, &*stubborn}, 300ms);
  ASSERT_TRUE(polite->exit_status().has_value() && stubborn->exit_status().has_value());
  EXPECT_EQ(polite->exit_status()->signal, SIGTERM);
  EXPECT_EQ(stubborn->exit_status()->signal, SIGKILL);
}

TEST(ChildTest, WaitAnyReapsTheOneThatExited) {
  absl::StatusOr<Child> sleeper = Child::Spawn(Argv({"/bin/sleep", "30"}));
  absl::StatusOr<Child> quick = Child::Spawn(Argv({"/bin/sh", "-c", "exit 5"}));
  ASSERT_TRUE(sleeper.ok() && quick.ok());
  std::optional<size_t> i = WaitAny({&*sleeper, &*quick}, 20s);
  ASSERT_TRUE(i.has_value());
  EXPECT_EQ(*i, 1u);
  EXPECT_EQ(quick->exit_status()->code, 5);
  EXPECT_FALSE(WaitAny({&*sleeper, &*quick}, 50ms).has_value());  // the sleeper still runs
  EXPECT_TRUE(sleeper->running());
}

TEST(ChildTest, ExitedSeesAnExitWithoutReaping) {
  absl::StatusOr<Child> c = Child::Spawn(Argv({"/bin/true"}));
  ASSERT_TRUE(c.ok());
  const auto end = std::chrono::steady_clock::now() + 20s;
  while (!c->exited() && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(5ms);
  EXPECT_TRUE(c->exited());
  EXPECT_TRUE(c->running());  // not reaped yet
  ASSERT_TRUE(c->Poll().has_value());
  EXPECT_EQ(c->exit_status()->code, 0);
}

TEST(CaptureTest, SeparatesStdoutAndStderrAndReportsTheExit) {
  absl::StatusOr<CommandOutput> r = Capture(Argv({"/bin/sh", "-c", "echo out; echo err >&2; exit 4"}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->out, "out\n");
  EXPECT_EQ(r->err, "err\n");
  EXPECT_EQ(r->exit.code, 4);
}

TEST(RunCommandTest, ErrorNamesTheCommandAndItsStderr) {
  absl::StatusOr<std::string> r = RunCommand({"sh", "-c", "echo something broke >&2; exit 3"});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(Message(r.status()), HasSubstr("`sh -c echo something broke >&2; exit 3` exited with 3"));
  EXPECT_THAT(Message(r.status()), HasSubstr("something broke"));
  absl::StatusOr<std::string> ok = RunCommand({"sh", "-c", "echo out"});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, "out\n");
  absl::StatusOr<std::string> missing = RunCommand({"/nonexistent/binary", "arg"});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(missing.status()), HasSubstr("/nonexistent/binary"));
}

}  // namespace
}  // namespace fl::sys
