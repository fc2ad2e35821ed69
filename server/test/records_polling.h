// Test support for the tests that run fl-server as a process: read its log, query its records database while it
// runs, and wait for a figure to appear there. One copy for process_test, durability_test and
// hostile_process_test.
#pragma once

#include <chrono>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>

#include "fl/instrumentation/record_reader.h"

namespace fl::server::process_testing {

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// One integer from `sql` on the records database `db`; -1 when it cannot be read (yet).
inline int64_t Query(const std::string& db, const std::string& sql) {
  auto reader = instrumentation::RecordReader::Open(db);
  if (!reader.ok()) return -1;
  auto n = (*reader)->QueryInt(sql);
  return n.ok() ? *n : -1;
}

// Polls until `sql` on `db` returns at least `at_least`, or `timeout`.
inline bool WaitFor(const std::string& db, const std::string& sql, int64_t at_least, std::chrono::seconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (Query(db, sql) >= at_least) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

}  // namespace fl::server::process_testing
