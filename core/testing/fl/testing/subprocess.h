// Test support: child processes that are always stopped (SIGKILL in the destructor), free loopback ports.
#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace fl::testing {

class Subprocess {
 public:
  // Starts `argv[0]` with `argv`; stdout and stderr go to `log_path` (appended) when given.
  Subprocess(std::vector<std::string> argv, const std::string& log_path = "") {
    pid_ = fork();
    if (pid_ == 0) {
      if (!log_path.empty()) {
        int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
          dup2(fd, 1);
          dup2(fd, 2);
          close(fd);
        }
      }
      std::vector<char*> args;
      for (auto& a : argv) args.push_back(a.data());
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
    EXPECT_GT(pid_, 0) << "fork failed";
  }
  ~Subprocess() {
    if (running()) Kill(SIGKILL);
    (void)Wait(std::chrono::seconds(10));
  }
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  bool running() const { return pid_ > 0 && !exit_code_.has_value(); }
  void Kill(int sig) {
    if (running()) ::kill(pid_, sig);
  }
  // The exit code (128 + signal when killed), or nullopt if still running after `timeout`.
  std::optional<int> Wait(std::chrono::milliseconds timeout) {
    if (exit_code_.has_value() || pid_ <= 0) return exit_code_;
    const auto end = std::chrono::steady_clock::now() + timeout;
    do {
      int status = 0;
      pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        return exit_code_;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    } while (std::chrono::steady_clock::now() < end);
    return std::nullopt;
  }

 private:
  pid_t pid_ = -1;
  std::optional<int> exit_code_;
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
