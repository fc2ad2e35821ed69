// The processes of one experiment, started and always stopped together.
//
// Children get their own process group (a Ctrl-C at the terminal reaches only fl-experiment, which then stops
// them in order: the server first, so that it records the experiment as aborted and closes its records) and
// PR_SET_PDEATHSIG(SIGTERM), so that a crash of fl-experiment itself still stops every child. The destructor
// stops whatever is still running (SIGTERM, then SIGKILL after a grace period). No orphans on any path.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace fl::experiment {

struct ChildExit {
  std::string name;
  int code = 0;           // exit status, or 128 + signal
  bool signaled = false;
};

class ProcessGroup {
 public:
  ProcessGroup() = default;
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  // Starts argv (argv[0] a path, or looked up in PATH) with stdout+stderr appended to `log_path`.
  absl::StatusOr<pid_t> Start(const std::string& name, const std::vector<std::string>& argv,
                              const std::string& log_path);
  // Reaps one exited child, waiting at most `timeout`; nullopt when none exited in that time.
  std::optional<ChildExit> WaitAny(std::chrono::milliseconds timeout);
  bool Running(const std::string& name) const;
  size_t num_running() const;
  void Signal(const std::string& name, int sig);
  // SIGTERM to `first` (if running) and waits up to `grace` for it; then SIGTERM to the rest, SIGKILL to
  // whatever is left after `grace`. Returns the exits it reaped.
  std::vector<ChildExit> StopAll(const std::string& first, std::chrono::milliseconds grace);

 private:
  struct Child {
    std::string name;
    pid_t pid = -1;
    bool running = true;
  };
  std::optional<ChildExit> Reap(bool block_until_one, std::chrono::milliseconds timeout);
  std::vector<Child> children_;
};

}  // namespace fl::experiment
