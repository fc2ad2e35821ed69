#include "fl/experiment/process_group.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "fl/core/str_cat.h"

namespace fl::experiment {

ProcessGroup::~ProcessGroup() { StopAll("", std::chrono::seconds(5)); }

absl::StatusOr<pid_t> ProcessGroup::Start(const std::string& name, const std::vector<std::string>& argv,
                                          const std::string& log_path) {
  if (argv.empty()) return absl::InvalidArgumentError(fl::StrCat("process '", name, "': empty command"));
  const int log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    return absl::FailedPreconditionError(
        fl::StrCat("process '", name, "': cannot open its log ", log_path, ": ", std::strerror(errno)));
  }
  // Prepared before fork: the child may only call async-signal-safe functions.
  std::vector<std::string> args = argv;
  std::vector<char*> cargs;
  for (auto& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  int err_pipe[2];
  if (pipe2(err_pipe, O_CLOEXEC) != 0) {
    close(log_fd);
    return absl::InternalError(fl::StrCat("pipe: ", std::strerror(errno)));
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    close(log_fd);
    close(err_pipe[0]);
    close(err_pipe[1]);
    return absl::ResourceExhaustedError(fl::StrCat("fork for '", name, "': ", std::strerror(errno)));
  }
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(127);  // the parent died before prctl took effect
    dup2(log_fd, STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    const int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, STDIN_FILENO);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    execvp(cargs[0], cargs.data());
    const int e = errno;
    (void)!write(err_pipe[1], &e, sizeof e);
    _exit(127);
  }
  close(log_fd);
  close(err_pipe[1]);
  int exec_errno = 0;
  const ssize_t n = read(err_pipe[0], &exec_errno, sizeof exec_errno);
  close(err_pipe[0]);
  if (n == sizeof exec_errno) {
    waitpid(pid, nullptr, 0);
    return absl::NotFoundError(fl::StrCat("cannot start '", name, "' (", argv[0], "): ", std::strerror(exec_errno),
                                          "; build it first or check the path"));
  }
  children_.push_back(Child{name, pid, true});
  return pid;
}

std::optional<ChildExit> ProcessGroup::Reap(bool block_until_one, std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    for (Child& c : children_) {
      if (!c.running) continue;
      int status = 0;
      const pid_t r = waitpid(c.pid, &status, WNOHANG);
      if (r == c.pid) {
        c.running = false;
        ChildExit e{c.name, 0, false};
        if (WIFEXITED(status)) e.code = WEXITSTATUS(status);
        if (WIFSIGNALED(status)) {
          e.code = 128 + WTERMSIG(status);
          e.signaled = true;
        }
        return e;
      }
      if (r < 0 && errno == ECHILD) c.running = false;
    }
    if (!block_until_one || num_running() == 0 || std::chrono::steady_clock::now() >= end) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::optional<ChildExit> ProcessGroup::WaitAny(std::chrono::milliseconds timeout) { return Reap(true, timeout); }

bool ProcessGroup::Running(const std::string& name) const {
  for (const Child& c : children_) {
    if (c.name == name && c.running) return true;
  }
  return false;
}

size_t ProcessGroup::num_running() const {
  size_t n = 0;
  for (const Child& c : children_) n += c.running;
  return n;
}

void ProcessGroup::Signal(const std::string& name, int sig) {
  for (const Child& c : children_) {
    if (c.name == name && c.running) kill(c.pid, sig);
  }
}

std::vector<ChildExit> ProcessGroup::StopAll(const std::string& first, std::chrono::milliseconds grace) {
  std::vector<ChildExit> exits;
  auto drain = [&](std::chrono::milliseconds t) {
    const auto end = std::chrono::steady_clock::now() + t;
    while (num_running() > 0) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      if (auto e = Reap(true, left); e.has_value()) exits.push_back(*e);
    }
  };
  if (!first.empty() && Running(first)) {
    Signal(first, SIGTERM);
    const auto end = std::chrono::steady_clock::now() + grace;
    while (Running(first) && std::chrono::steady_clock::now() < end) {
      if (auto e = Reap(true, std::chrono::milliseconds(50)); e.has_value()) exits.push_back(*e);
    }
  }
  for (const Child& c : children_) {
    if (c.running) kill(c.pid, SIGTERM);
  }
  drain(grace);
  for (const Child& c : children_) {
    if (c.running) kill(c.pid, SIGKILL);
  }
  drain(std::chrono::seconds(5));
  return exits;
}

}  // namespace fl::experiment
