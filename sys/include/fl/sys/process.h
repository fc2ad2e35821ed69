// Child processes: the one place that forks and execs (fl-experiment, the islands launcher, fl-link, the kernel
// link backend's `ip`/`tc` commands, the end-to-end benchmark and the test helpers all go through it).
//
// A spawned child gets, unless told otherwise:
//   * its own process group (setpgid), so that a Ctrl-C at the terminal reaches only the parent, which stops
//     its children in order, and so that signalling the child reaches whatever it started in turn;
//   * PR_SET_PDEATHSIG, so that it dies with the parent even when the parent is killed with SIGKILL or crashes.
//     The kernel sends the signal when the *thread* that spawned the child exits: spawn from a thread that
//     outlives the child (the main thread);
//   * stdin from /dev/null, the default disposition of SIGINT, SIGTERM and SIGPIPE and an empty signal mask
//     (whatever the parent blocked or ignored for itself), and only descriptors 0, 1 and 2 of the parent.
// A program that cannot be executed (missing, not executable, a bad working directory) is an error from Spawn
// naming the program and the reason, never a child that silently exits with 127.
//
// Only async-signal-safe calls run between fork and exec (everything else is prepared before the fork), so
// spawning from a multi-threaded process (gRPC, spdlog, LibTorch) is safe.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fl::sys {

// Where one of a child's standard streams goes (or, for stdin, comes from).
struct Stdio {
  enum class Kind {
    kInherit,     // the parent's descriptor
    kNull,        // /dev/null
    kFile,        // `path`: for stdout/stderr created if missing (0644), appended to or truncated
    kDescriptor,  // `fd`, a descriptor of the parent (a pipe's end, say); duplicated, the caller still owns it
    kToStdout,    // stderr only: wherever stdout goes (2>&1)
  };
  Kind kind = Kind::kInherit;
  std::string path;
  bool append = true;
  int fd = -1;

  static Stdio Inherit() { return {}; }
  static Stdio Null() { return {Kind::kNull, "", true, -1}; }
  static Stdio File(std::string file, bool append_to_it = true) {
    return {Kind::kFile, std::move(file), append_to_it, -1};
  }
  static Stdio Descriptor(int descriptor) { return {Kind::kDescriptor, "", true, descriptor}; }
  static Stdio ToStdout() { return {Kind::kToStdout, "", true, -1}; }
};

struct SpawnOptions {
  // argv[0]: a path, or a name looked up in PATH (the child's PATH when `env` sets one).
  std::vector<std::string> argv;
  // What errors and Describe() call the child; argv[0] when empty.
  std::string name;
  // NAME=VALUE entries added to the inherited environment (replacing a variable of the same name).
  std::vector<std::string> env;
  // The child's working directory; the parent's when empty.
  std::string cwd;
  Stdio stdin_from = Stdio::Null();
  Stdio stdout_to = Stdio::Inherit();
  Stdio stderr_to = Stdio::Inherit();
  // Its own process group (pgid = its pid). false keeps the parent's group, e.g. for an interactive command
  // that must stay in the terminal's foreground group; Signal() then reaches the child alone.
  bool new_process_group = true;
  // Sent to the child when the spawning thread exits (PR_SET_PDEATHSIG); 0 for none.
  int death_signal = SIGTERM;
  // How long the destructor waits after SIGTERM before SIGKILL (Stop()).
  std::chrono::milliseconds stop_grace{5000};
};

// How a child ended, with its resource usage (wait4).
struct ExitStatus {
  int code = 0;    // the exit status, or 128 + signal when a signal ended it (the shell's convention)
  int signal = 0;  // the signal that ended it; 0 when it exited
  double user_s = 0;
  double sys_s = 0;
  int64_t max_rss_kb = 0;  // peak resident set size

  bool signaled() const { return signal != 0; }
  bool success() const { return signal == 0 && code == 0; }
  double cpu_s() const { return user_s + sys_s; }
  // "exited with 3", "killed by signal 9 (Killed)".
  std::string Describe() const;
};

// One child process. Movable, not copyable; the destructor stops it (Stop(stop_grace)) if it still runs, so
// that no path leaves an orphan. Not thread-safe: one thread at a time uses a Child.
class Child {
 public:
  // Starts options.argv. Errors: InvalidArgument (empty argv, an env entry without '='), NotFound (the program
  // is not there or not in PATH), PermissionDenied, FailedPrecondition (a log file or the working directory
  // cannot be opened), ... — each naming the program.
  static absl::StatusOr<Child> Spawn(const SpawnOptions& options);

  Child() = default;  // no process
  Child(Child&& other) noexcept;
  Child& operator=(Child&& other) noexcept;
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child();

  pid_t pid() const { return pid_; }
  const std::string& name() const { return name_; }
  bool has_own_group() const { return own_group_; }
  // Spawned and not reaped yet (it may have exited already: Poll() reaps).
  bool running() const { return pid_ > 0 && !exit_.has_value(); }
  // Set once the child has been reaped.
  const std::optional<ExitStatus>& exit_status() const { return exit_; }
  // Whether it has exited, reaped or not (does not reap it: Poll() or Wait() then report how).
  bool exited() const;

  // Sends `sig` to the child's process group (the child and what it started), or to the child alone when it
  // shares the parent's group. Nothing is sent once the child has been reaped.
  absl::Status Signal(int sig);
  // Reaps the child if it has exited; nullopt while it runs.
  std::optional<ExitStatus> Poll();
  // Waits until the child exits or `timeout` passes: DeadlineExceeded (naming the child) if it still runs
  // then; it is left running, and may be waited for or stopped again.
  absl::StatusOr<ExitStatus> Wait(std::chrono::milliseconds timeout);
  // Waits as long as it takes.
  ExitStatus Wait();
  // SIGTERM to its group, up to `grace` for the child to exit (and for the rest of its group to go), then
  // SIGKILL to the group. Returns how it ended; an error only when even SIGKILL did not end it in 10 s
  // (a process stuck in the kernel).
  absl::StatusOr<ExitStatus> Stop(std::chrono::milliseconds grace);

 private:
  Child(pid_t pid, std::string name, bool own_group, std::chrono::milliseconds stop_grace)
      : pid_(pid), name_(std::move(name)), own_group_(own_group), stop_grace_(stop_grace) {}
  void Release();
  // After the child itself has exited: up to `deadline` for the rest of its process group (what it started) to
  // go, then SIGKILL to what is left of the group.
  void KillLeftoversOfGroup(std::chrono::steady_clock::time_point deadline);
  friend void StopTogether(const std::vector<Child*>& children, std::chrono::milliseconds grace);

  pid_t pid_ = -1;
  std::string name_;
  bool own_group_ = false;
  std::chrono::milliseconds stop_grace_{5000};
  std::optional<ExitStatus> exit_;
};

// Reaps one of `children` that has exited, waiting up to `timeout`: its index, or nullopt when none exited in
// that time (or none of them runs). Null pointers and children already reaped are skipped.
std::optional<size_t> WaitAny(const std::vector<Child*>& children, std::chrono::milliseconds timeout);

// Stops `children` one after another, in this order: each gets SIGTERM, up to `grace` to exit, then SIGKILL,
// before the next one is signalled (e.g. the server first, so that it records the experiment as aborted
// while its clients are still connected). Null pointers and children no longer running are skipped.
void StopInOrder(const std::vector<Child*>& children, std::chrono::milliseconds grace);
// Stops `children` together: SIGTERM to all, up to `grace` for all of them, SIGKILL to what is left.
void StopTogether(const std::vector<Child*>& children, std::chrono::milliseconds grace);

// A command run to completion.
struct CommandOutput {
  ExitStatus exit;
  std::string out;  // its stdout
  std::string err;  // its stderr
};
// Runs `options` (stdout and stderr captured: their fields in `options` are ignored) until it exits. An error
// only when it cannot be started; a non-zero exit is in `exit`.
absl::StatusOr<CommandOutput> Capture(const SpawnOptions& options);
// Runs argv (argv[0] looked up in PATH) and returns its stdout; an error names the command, how it ended and
// its stderr ("`ip link del fle1_0h` exited with 1: Cannot find device").
absl::StatusOr<std::string> RunCommand(const std::vector<std::string>& argv);

// argv joined with spaces, for messages.
std::string JoinArgs(const std::vector<std::string>& argv);

}  // namespace fl::sys
