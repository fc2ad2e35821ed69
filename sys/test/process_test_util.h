// Helpers of the sys suites: whether a pid is alive, waiting for a process to go or a file to appear.
#pragma once

#include <signal.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>

namespace fl::sys::test {

// Alive and not a zombie (a killed grandchild is reparented to init, which may be slow to reap it or, in a
// container whose init does not reap, never does).
inline bool Alive(pid_t pid) {
  if (pid <= 0 || kill(pid, 0) != 0) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t paren = line.rfind(')');
  if (paren == std::string::npos || paren + 2 >= line.size()) return true;
  const char state = line[paren + 2];
  return state != 'Z' && state != 'X';
}

// Waits (a generous bound, not a timing assertion) for `pid` to be gone; true when it is.
inline bool WaitUntilGone(pid_t pid, std::chrono::seconds bound = std::chrono::seconds(20)) {
  const auto end = std::chrono::steady_clock::now() + bound;
  while (Alive(pid) && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return !Alive(pid);
}

// The first line of `path` once a process has written one (a readiness handshake: a shell writes it after its
// `trap`); empty if none within the bound.
inline std::string WaitForLine(const std::string& path, std::chrono::seconds bound = std::chrono::seconds(20)) {
  const auto end = std::chrono::steady_clock::now() + bound;
  while (std::chrono::steady_clock::now() < end) {
    std::ifstream in(path);
    std::string line;
    if (std::getline(in, line) && !line.empty() && in.good()) return line;  // a whole line, newline included
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return "";
}

}  // namespace fl::sys::test
