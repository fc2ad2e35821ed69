#include "fl/rpc/clock.h"

#include <chrono>

namespace fl::rpc {

int64_t SystemClock::NowNs() const {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int64_t SystemClock::UnixNs() const {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int64_t SystemClock::UnixMs() const { return UnixNs() / 1'000'000; }

const Clock* SystemClock::Get() {
  static const SystemClock clock;
  return &clock;
}

}  // namespace fl::rpc
