// The named processes of one run (fl-experiment's server, link emulators and clients; the islands launcher's
// coordinator and ranks), started and always stopped together.
//
// Each child is a fl::sys::Child with the defaults of process.h: its own process group (a Ctrl-C at the terminal
// reaches only the parent, which then stops them in order: the server first, so that it records the experiment
// as aborted and closes its records) and PR_SET_PDEATHSIG(SIGTERM), so that a crash of the parent still stops
// every child. The destructor stops whatever is still running (SIGTERM, then SIGKILL after a grace period).
// No orphans on any path.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "fl/sys/process.h"

namespace fl::sys {

struct ChildExit {
  std::string name;
  int code = 0;  // exit status, or 128 + signal
  bool signaled = false;
  ExitStatus status;  // the whole of it (signal, CPU time, peak RSS)
};

class ProcessGroup {
 public:
  ProcessGroup() = default;
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  // Starts argv (argv[0] a path, or looked up in PATH) with stdin from /dev/null and stdout+stderr appended to
  // `log_path`. An error names `name` and the program (a missing binary is an error here, not an exit later).
  absl::StatusOr<pid_t> Start(const std::string& name, const std::vector<std::string>& argv,
                              const std::string& log_path);
  // Starts `options` under `name` (options.name is replaced by it).
  absl::StatusOr<pid_t> Start(const std::string& name, SpawnOptions options);
  // Reaps one exited child, waiting at most `timeout`; nullopt when none exited in that time.
  std::optional<ChildExit> WaitAny(std::chrono::milliseconds timeout);
  // A child of that name that has not exited (one that exited is not running even before WaitAny reports it).
  bool Running(const std::string& name) const;
  // Children not reaped yet.
  size_t num_running() const;
  // `sig` to the process group of every running child called `name`.
  void Signal(const std::string& name, int sig);
  // Stops the children called `first` (if running) on their own (SIGTERM, up to `grace`, then SIGKILL), then
  // all the others together (SIGTERM, up to `grace`, SIGKILL to what is left). Returns the exits it reaped:
  // `first`'s, then the others' in the order they were started.
  std::vector<ChildExit> StopAll(const std::string& first, std::chrono::milliseconds grace);
  // The same with several named stages stopped one after another before the rest.
  std::vector<ChildExit> StopAll(const std::vector<std::string>& order, std::chrono::milliseconds grace);

 private:
  struct Entry {
    Child child;
    bool reported = false;
  };
  static ChildExit Report(Entry& e);
  std::vector<Entry> children_;
};

}  // namespace fl::sys
