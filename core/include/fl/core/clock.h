// Clocks: the monotonic clock for every duration and timeline, the wall clock only for
// timestamps that people read in the records.
#pragma once

#include <chrono>
#include <cstdint>

namespace fl {

inline int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

inline int64_t UnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

inline std::chrono::steady_clock::time_point SteadyTimePoint(int64_t ns) {
  return std::chrono::steady_clock::time_point(std::chrono::nanoseconds(ns));
}

}  // namespace fl
