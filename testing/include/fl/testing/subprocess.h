// Test support: child processes that are always stopped (SIGKILL in the destructor), free loopback ports.
#pragma once

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "fl/sys/process.h"

namespace fl::testing {

// A fl::sys::Child for tests: its own process group, SIGKILL when the test process dies (even a crashed or
// killed test leaves no server behind), stdin from /dev/null. A program that cannot be started is a test
// failure naming it (and Wait() then answers 127).
class Subprocess {
 public:
  // Starts `argv[0]` with `argv`; stdout and stderr go to `log_path` (appended) when given.
  Subprocess(std::vector<std::string> argv, const std::string& log_path = "") {
    fl::sys::SpawnOptions o;
    o.argv = std::move(argv);
    o.death_signal = SIGKILL;
    if (!log_path.empty()) {
      o.stdout_to = fl::sys::Stdio::File(log_path, /*append_to_it=*/true);
      o.stderr_to = fl::sys::Stdio::ToStdout();
    }
    absl::StatusOr<fl::sys::Child> child = fl::sys::Child::Spawn(o);
    if (child.ok()) {
      child_ = std::move(*child);
    } else {
      ADD_FAILURE() << child.status().message();
      spawn_failed_ = true;
    }
  }
  ~Subprocess() {
    if (running()) Kill(SIGKILL);
    (void)Wait(std::chrono::seconds(10));
  }
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return child_.pid(); }
  bool running() const { return child_.running(); }
  // `sig` to the child's process group.
  void Kill(int sig) {
    if (running()) (void)child_.Signal(sig);
  }
  // The exit code (128 + signal when killed), or nullopt if still running after `timeout`.
  std::optional<int> Wait(std::chrono::milliseconds timeout) {
    if (spawn_failed_) return 127;
    absl::StatusOr<fl::sys::ExitStatus> e = child_.Wait(timeout);
    if (!e.ok()) return std::nullopt;
    return e->code;
  }

 private:
  fl::sys::Child child_;
  bool spawn_failed_ = false;
};

// A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0, read it back, close).
inline int FreeLoopbackPort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

// A TCP connection to 127.0.0.1:`port` (blocking connect), or -1 when nothing accepts there. The caller
// closes the descriptor.
inline int ConnectLoopback(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

}  // namespace fl::testing
