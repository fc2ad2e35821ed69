#include "fl/sys/process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string_view>
#include <thread>

#include "fl/core/str_cat.h"

extern char** environ;

namespace fl::sys {
namespace {

using Clock = std::chrono::steady_clock;

// A descriptor owned by the parent while it spawns; closed on every path.
class OwnedFd {
 public:
  OwnedFd() = default;
  explicit OwnedFd(int fd) : fd_(fd) {}
  OwnedFd(OwnedFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  OwnedFd& operator=(OwnedFd&& o) noexcept {
    if (this != &o) {
      Close();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  OwnedFd(const OwnedFd&) = delete;
  OwnedFd& operator=(const OwnedFd&) = delete;
  ~OwnedFd() { Close(); }
  int get() const { return fd_; }
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

// What the child writes to the parent through a close-on-exec pipe when it cannot exec.
enum class Stage : int { kStdio = 1, kChdir = 2, kExec = 3 };
struct ExecFailure {
  Stage stage;
  int error;
};

[[noreturn]] void ReportAndExit(int fd, Stage stage) {
  const ExecFailure f{stage, errno};
  (void)!write(fd, &f, sizeof f);
  _exit(127);
}

// A descriptor numbered 3 or more (close-on-exec), so that moving the child's descriptors onto 0, 1 and 2 never
// overwrites one that is still to be moved.
absl::StatusOr<OwnedFd> AboveStdio(int fd, const std::string& what) {
  const int copy = fcntl(fd, F_DUPFD_CLOEXEC, 3);
  if (copy < 0) return absl::InternalError(StrCat(what, ": fcntl(F_DUPFD_CLOEXEC): ", std::strerror(errno)));
  return OwnedFd(copy);
}

// The descriptor the child's stream `target` (0, 1, 2) is moved from; an empty OwnedFd for kInherit/kToStdout.
absl::StatusOr<OwnedFd> OpenStdio(const Stdio& s, int target, const std::string& who) {
  static constexpr const char* kStreams[] = {"stdin", "stdout", "stderr"};
  const std::string what = StrCat("cannot start ", who, ": its ", kStreams[target]);
  switch (s.kind) {
    case Stdio::Kind::kInherit: return OwnedFd();
    case Stdio::Kind::kToStdout:
      if (target != STDERR_FILENO) return absl::InvalidArgumentError(StrCat(what, " cannot go to stdout"));
      return OwnedFd();
    case Stdio::Kind::kDescriptor:
      if (s.fd < 0) return absl::InvalidArgumentError(StrCat(what, ": descriptor ", s.fd));
      return AboveStdio(s.fd, what);
    case Stdio::Kind::kNull:
    case Stdio::Kind::kFile: {
      const std::string path = s.kind == Stdio::Kind::kNull ? std::string("/dev/null") : s.path;
      const int flags = target == STDIN_FILENO ? O_RDONLY : O_WRONLY | O_CREAT | (s.append ? O_APPEND : O_TRUNC);
      OwnedFd fd(open(path.c_str(), flags | O_CLOEXEC, 0644));
      if (fd.get() < 0) {
        return absl::FailedPreconditionError(StrCat(what, ": cannot open ", path, ": ", std::strerror(errno)));
      }
      if (fd.get() > STDERR_FILENO) return fd;
      return AboveStdio(fd.get(), what);
    }
  }
  return absl::InvalidArgumentError(what);
}

bool IsExecutableFile(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(path.c_str(), X_OK) == 0;
}

// argv[0] as execve needs it: as given when it has a '/', else the first executable of that name in `path_var`
// (resolved here, before the fork: execvp is not async-signal-safe).
absl::StatusOr<std::string> ResolveProgram(const std::string& program, const std::string& path_var,
                                           const std::string& who) {
  if (program.find('/') != std::string::npos) return program;
  size_t begin = 0;
  for (;;) {
    const size_t end = path_var.find(':', begin);
    const std::string_view dir =
        std::string_view(path_var).substr(begin, end == std::string::npos ? std::string::npos : end - begin);
    const std::string candidate = StrCat(dir.empty() ? std::string_view(".") : dir, "/", program);
    if (IsExecutableFile(candidate)) return candidate;
    if (end == std::string::npos) break;
    begin = end + 1;
  }
  return absl::NotFoundError(StrCat("cannot start ", who, ": ", program, " is not in PATH (", path_var, ")"));
}

ExitStatus FromWait(int status, const rusage& ru) {
  ExitStatus e;
  if (WIFEXITED(status)) e.code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) {
    e.signal = WTERMSIG(status);
    e.code = 128 + e.signal;
  }
  e.user_s = static_cast<double>(ru.ru_utime.tv_sec) + 1e-6 * static_cast<double>(ru.ru_utime.tv_usec);
  e.sys_s = static_cast<double>(ru.ru_stime.tv_sec) + 1e-6 * static_cast<double>(ru.ru_stime.tv_usec);
  e.max_rss_kb = ru.ru_maxrss;  // kB on Linux
  return e;
}

// Someone else reaped it (SIGCHLD ignored, a stray waitpid(-1)): how it ended is unknown.
ExitStatus ReapedElsewhere() {
  ExitStatus e;
  e.code = -1;
  return e;
}

// A pidfd (readable once the process has exited), or -1 where the kernel has none (before 5.3).
int OpenPidfd(pid_t pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
#else
  (void)pid;
  return -1;
#endif
}

int CeilMs(Clock::duration d) {
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(d).count();
  return static_cast<int>(std::clamp<int64_t>(ms, 1, 1000));
}

bool GroupHasMembers(pid_t pgid) { return kill(-pgid, 0) == 0 || errno == EPERM; }

std::string Who(const std::string& name, const std::string& program) {
  return name == program ? program : StrCat(name, " (", program, ")");
}

}  // namespace

std::string ExitStatus::Describe() const {
  if (signal != 0) {
    const char* what = strsignal(signal);
    return StrCat("killed by signal ", signal, what != nullptr ? StrCat(" (", what, ")") : std::string());
  }
  if (code < 0) return "ended (reaped elsewhere: exit status unknown)";
  return StrCat("exited with ", code);
}

std::string JoinArgs(const std::vector<std::string>& argv) {
  std::string s;
  for (const auto& a : argv) s = s.empty() ? a : StrCat(s, " ", a);
  return s;
}

absl::StatusOr<Child> Child::Spawn(const SpawnOptions& o) {
  if (o.argv.empty()) return absl::InvalidArgumentError(StrCat("cannot start '", o.name, "': empty command"));
  const std::string name = o.name.empty() ? o.argv[0] : o.name;
  const std::string who = Who(name, o.argv[0]);

  // Everything the child needs, prepared before the fork: between fork and exec it may only call
  // async-signal-safe functions (no allocation), since another thread may hold the allocator's lock.
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) env.emplace_back(*e);
  for (const std::string& add : o.env) {
    const size_t eq = add.find('=');
    if (eq == std::string::npos || eq == 0) {
      return absl::InvalidArgumentError(
          StrCat("cannot start ", who, ": environment entry '", add, "' is not NAME=VALUE"));
    }
    const std::string prefix = add.substr(0, eq + 1);
    std::erase_if(env, [&](const std::string& v) { return v.compare(0, prefix.size(), prefix) == 0; });
    env.push_back(add);
  }
  std::string path_var = "/usr/local/bin:/usr/bin:/bin";
  for (const std::string& v : env) {
    if (v.compare(0, 5, "PATH=") == 0) path_var = v.substr(5);
  }
  absl::StatusOr<std::string> program = ResolveProgram(o.argv[0], path_var, who);
  if (!program.ok()) return program.status();
  std::vector<std::string> args = o.argv;
  std::vector<char*> cargs;
  for (auto& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  std::vector<char*> cenv;
  for (auto& v : env) cenv.push_back(v.data());
  cenv.push_back(nullptr);

  absl::StatusOr<OwnedFd> in = OpenStdio(o.stdin_from, STDIN_FILENO, who);
  if (!in.ok()) return in.status();
  absl::StatusOr<OwnedFd> out = OpenStdio(o.stdout_to, STDOUT_FILENO, who);
  if (!out.ok()) return out.status();
  absl::StatusOr<OwnedFd> err = OpenStdio(o.stderr_to, STDERR_FILENO, who);
  if (!err.ok()) return err.status();
  const int in_fd = in->get(), out_fd = out->get(), err_fd = err->get();
  const bool err_to_out = o.stderr_to.kind == Stdio::Kind::kToStdout;
  const char* cwd = o.cwd.empty() ? nullptr : o.cwd.c_str();
  const bool new_group = o.new_process_group;
  const int death_signal = o.death_signal;

  int report[2];
  if (pipe2(report, O_CLOEXEC) != 0)
    return absl::InternalError(StrCat("cannot start ", who, ": pipe: ", std::strerror(errno)));
  OwnedFd report_read(report[0]), report_write(report[1]);
  struct sigaction default_action {};
  default_action.sa_handler = SIG_DFL;
  sigemptyset(&default_action.sa_mask);
  sigset_t no_signals;
  sigemptyset(&no_signals);
  const pid_t parent = getpid();
  rlimit files{};
  const int max_fd = getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY
                         ? static_cast<int>(std::min<rlim_t>(files.rlim_cur, 1 << 16))
                         : 1024;

  const pid_t pid = fork();
  if (pid < 0) return absl::ResourceExhaustedError(StrCat("cannot start ", who, ": fork: ", std::strerror(errno)));
  if (pid == 0) {
    // The child: async-signal-safe calls only.
    if (new_group) setpgid(0, 0);
    if (death_signal != 0) {
      prctl(PR_SET_PDEATHSIG, death_signal);
      if (getppid() != parent) _exit(127);  // the parent died before prctl took effect
    }
    // Dispositions first, then the mask: a signal pending for the parent must not run its handler here.
    for (const int sig : {SIGINT, SIGTERM, SIGQUIT, SIGPIPE, SIGCHLD}) sigaction(sig, &default_action, nullptr);
    sigprocmask(SIG_SETMASK, &no_signals, nullptr);
    if (in_fd >= 0 && dup2(in_fd, STDIN_FILENO) < 0) ReportAndExit(report[1], Stage::kStdio);
    if (out_fd >= 0 && dup2(out_fd, STDOUT_FILENO) < 0) ReportAndExit(report[1], Stage::kStdio);
    if (err_fd >= 0 && dup2(err_fd, STDERR_FILENO) < 0) ReportAndExit(report[1], Stage::kStdio);
    if (err_to_out && dup2(STDOUT_FILENO, STDERR_FILENO) < 0) ReportAndExit(report[1], Stage::kStdio);
    // Only 0, 1 and 2 cross the exec (a listening socket of the parent must not live on in a child). Marked
    // close-on-exec rather than closed: the report pipe must stay open until exec succeeds.
    bool marked = false;
#if defined(SYS_close_range) && defined(CLOSE_RANGE_CLOEXEC)
    marked = syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC) == 0;
#endif
    if (!marked) {  // kernels before 5.11
      for (int fd = 3; fd < max_fd; ++fd) fcntl(fd, F_SETFD, FD_CLOEXEC);
    }
    if (cwd != nullptr && chdir(cwd) != 0) ReportAndExit(report[1], Stage::kChdir);
    execve(program->c_str(), cargs.data(), cenv.data());
    ReportAndExit(report[1], Stage::kExec);
  }

  // Also from this side, so that the group exists before Spawn returns (a Signal() right away reaches it).
  if (new_group) setpgid(pid, pid);
  report_write.Close();
  in->Close();
  out->Close();
  err->Close();
  ExecFailure failure{};
  ssize_t n = 0;
  do {
    n = read(report_read.get(), &failure, sizeof failure);
  } while (n < 0 && errno == EINTR);
  if (n == 0) return Child(pid, name, new_group, o.stop_grace);  // exec closed the pipe: it runs

  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (n != static_cast<ssize_t>(sizeof failure)) {
    return absl::InternalError(StrCat("cannot start ", who, ": the child failed before exec"));
  }
  const std::string reason = std::strerror(failure.error);
  switch (failure.stage) {
    case Stage::kChdir:
      return absl::FailedPreconditionError(StrCat("cannot start ", who, ": working directory ", o.cwd, ": ", reason));
    case Stage::kStdio: return absl::InternalError(StrCat("cannot start ", who, ": dup2: ", reason));
    case Stage::kExec: break;
  }
  const std::string message = StrCat("cannot start ", who, ": ", *program, ": ", reason);
  if (failure.error == ENOENT || failure.error == ENOTDIR) return absl::NotFoundError(message);
  if (failure.error == EACCES || failure.error == EPERM) return absl::PermissionDeniedError(message);
  return absl::FailedPreconditionError(message);
}

Child::Child(Child&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)),
      name_(std::move(other.name_)),
      own_group_(other.own_group_),
      stop_grace_(other.stop_grace_),
      exit_(std::exchange(other.exit_, std::nullopt)) {}

Child& Child::operator=(Child&& other) noexcept {
  if (this != &other) {
    Release();
    pid_ = std::exchange(other.pid_, -1);
    name_ = std::move(other.name_);
    own_group_ = other.own_group_;
    stop_grace_ = other.stop_grace_;
    exit_ = std::exchange(other.exit_, std::nullopt);
  }
  return *this;
}

Child::~Child() { Release(); }

void Child::Release() {
  if (running()) (void)Stop(stop_grace_);
}

bool Child::exited() const {
  if (exit_.has_value()) return true;
  if (pid_ <= 0) return false;
  siginfo_t info{};
  if (waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) != 0) return errno == ECHILD;
  return info.si_pid == pid_;
}

absl::Status Child::Signal(int sig) {
  if (!running()) return absl::FailedPreconditionError(StrCat(name_.empty() ? "child" : name_, " is not running"));
  if (own_group_) {
    if (kill(-pid_, sig) == 0) return absl::OkStatus();
    // It left its group (setsid, setpgid): at least the child itself.
    if (errno != ESRCH) return absl::InternalError(StrCat("kill(-", pid_, ", ", sig, "): ", std::strerror(errno)));
  }
  if (kill(pid_, sig) != 0) return absl::InternalError(StrCat("kill(", pid_, ", ", sig, "): ", std::strerror(errno)));
  return absl::OkStatus();
}

std::optional<ExitStatus> Child::Poll() {
  if (exit_.has_value() || pid_ <= 0) return exit_;
  for (;;) {
    int status = 0;
    rusage ru{};
    const pid_t r = wait4(pid_, &status, WNOHANG, &ru);
    if (r == pid_) {
      exit_ = FromWait(status, ru);
      return exit_;
    }
    if (r == 0) return std::nullopt;
    if (errno == EINTR) continue;
    if (errno == ECHILD) exit_ = ReapedElsewhere();
    return exit_;
  }
}

absl::StatusOr<ExitStatus> Child::Wait(std::chrono::milliseconds timeout) {
  if (pid_ <= 0) return absl::FailedPreconditionError("no process to wait for");
  if (exit_.has_value()) return *exit_;
  if (WaitAny({this}, timeout).has_value()) return *exit_;
  return absl::DeadlineExceededError(
      StrCat(name_, " (pid ", pid_, ") is still running after ", timeout.count(), " ms"));
}

ExitStatus Child::Wait() {
  if (exit_.has_value() || pid_ <= 0) return exit_.value_or(ReapedElsewhere());
  int status = 0;
  rusage ru{};
  for (;;) {
    const pid_t r = wait4(pid_, &status, 0, &ru);
    if (r == pid_) {
      exit_ = FromWait(status, ru);
      break;
    }
    if (r < 0 && errno == EINTR) continue;
    exit_ = ReapedElsewhere();
    break;
  }
  return *exit_;
}

void Child::KillLeftoversOfGroup(Clock::time_point deadline) {
  if (!own_group_ || pid_ <= 0) return;
  while (GroupHasMembers(pid_) && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (GroupHasMembers(pid_)) kill(-pid_, SIGKILL);
}

absl::StatusOr<ExitStatus> Child::Stop(std::chrono::milliseconds grace) {
  if (pid_ <= 0) return absl::FailedPreconditionError("no process to stop");
  if (exit_.has_value()) return *exit_;
  const auto deadline = Clock::now() + grace;
  (void)Signal(SIGTERM);
  if (absl::StatusOr<ExitStatus> e = Wait(grace); e.ok()) {
    KillLeftoversOfGroup(deadline);
    return e;
  }
  (void)Signal(SIGKILL);
  if (absl::StatusOr<ExitStatus> e = Wait(std::chrono::seconds(10)); e.ok()) return e;
  return absl::DeadlineExceededError(StrCat(name_, " (pid ", pid_, ") did not exit within 10 s of SIGKILL"));
}

std::optional<size_t> WaitAny(const std::vector<Child*>& children, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::chrono::milliseconds backoff(1);
  for (;;) {
    std::vector<size_t> running;
    for (size_t i = 0; i < children.size(); ++i) {
      Child* c = children[i];
      if (c == nullptr || !c->running()) continue;
      if (c->Poll().has_value()) return i;
      running.push_back(i);
    }
    if (running.empty()) return std::nullopt;
    const auto now = Clock::now();
    if (now >= deadline) return std::nullopt;
    // Sleep until one of them exits: on their pidfds where the kernel has them, else in short naps.
    std::vector<pollfd> fds;
    for (const size_t i : running) {
      const int fd = OpenPidfd(children[i]->pid());
      if (fd < 0) break;
      fds.push_back({fd, POLLIN, 0});
    }
    if (fds.size() == running.size()) {
      (void)poll(fds.data(), fds.size(), CeilMs(deadline - now));
    } else {
      std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
      backoff = std::min(backoff * 2, std::chrono::milliseconds(20));
    }
    for (const pollfd& p : fds) close(p.fd);
  }
}

void StopInOrder(const std::vector<Child*>& children, std::chrono::milliseconds grace) {
  for (Child* c : children) {
    if (c != nullptr && c->running()) (void)c->Stop(grace);
  }
}

void StopTogether(const std::vector<Child*>& children, std::chrono::milliseconds grace) {
  const auto deadline = Clock::now() + grace;
  std::vector<Child*> stopping;
  for (Child* c : children) {
    if (c == nullptr || !c->running()) continue;
    (void)c->Signal(SIGTERM);
    stopping.push_back(c);
  }
  for (;;) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0 || !WaitAny(stopping, left).has_value()) break;
  }
  for (Child* c : stopping) {
    if (c->running()) {
      (void)c->Signal(SIGKILL);
      (void)c->Wait(std::chrono::seconds(10));
    } else {
      c->KillLeftoversOfGroup(deadline);
    }
  }
}

absl::StatusOr<CommandOutput> Capture(const SpawnOptions& options) {
  int out_pipe[2];
  int err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0) return absl::InternalError(StrCat("pipe: ", std::strerror(errno)));
  OwnedFd out_read(out_pipe[0]), out_write(out_pipe[1]);
  if (pipe2(err_pipe, O_CLOEXEC) != 0) return absl::InternalError(StrCat("pipe: ", std::strerror(errno)));
  OwnedFd err_read(err_pipe[0]), err_write(err_pipe[1]);
  SpawnOptions o = options;
  o.stdout_to = Stdio::Descriptor(out_write.get());
  o.stderr_to = Stdio::Descriptor(err_write.get());
  absl::StatusOr<Child> child = Child::Spawn(o);
  out_write.Close();  // the child has its copies: EOF once it (and whatever inherited them) is done
  err_write.Close();
  if (!child.ok()) return child.status();

  CommandOutput result;
  pollfd fds[2] = {{out_read.get(), POLLIN, 0}, {err_read.get(), POLLIN, 0}};
  int open_fds = 2;
  while (open_fds > 0) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      char buf[4096];
      const ssize_t n = read(fds[i].fd, buf, sizeof(buf));
      if (n > 0) {
        (i == 0 ? result.out : result.err).append(buf, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  result.exit = child->Wait();
  return result;
}

absl::StatusOr<std::string> RunCommand(const std::vector<std::string>& argv) {
  if (argv.empty()) return absl::InvalidArgumentError("RunCommand: empty command");
  SpawnOptions o;
  o.argv = argv;
  absl::StatusOr<CommandOutput> r = Capture(o);
  if (!r.ok()) {
    return absl::Status(r.status().code(),
                        StrCat("`", JoinArgs(argv), "` could not be run: ", ToStd(r.status().message())));
  }
  if (r->exit.success()) return std::move(r->out);
  std::string& err = r->err;
  while (!err.empty() && (err.back() == '\n' || err.back() == ' ')) err.pop_back();
  return absl::InternalError(StrCat("`", JoinArgs(argv), "` ", r->exit.Describe(), err.empty() ? "" : ": ", err));
}

}  // namespace fl::sys
