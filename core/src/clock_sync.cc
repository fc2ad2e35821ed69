#include "fl/core/clock_sync.h"

namespace fl::core {

bool ClockOffsetEstimator::Add(int64_t t1, int64_t t2, int64_t t3, int64_t t4) {
  if (t4 < t1 || t3 < t2) return false;
  ClockSample s;
  // Halve each difference before adding: timestamps are nanoseconds since boot on both sides, so the sum
  // cannot overflow, but this keeps the rounding symmetric.
  s.offset_ns = ((t2 - t1) + (t3 - t4)) / 2;
  s.rtt_ns = (t4 - t1) - (t3 - t2);
  if (s.rtt_ns < 0) return false;
  samples_.push_back(s);
  while (samples_.size() > window_) samples_.pop_front();
  return true;
}

std::optional<ClockSample> ClockOffsetEstimator::Estimate() const {
  if (samples_.empty()) return std::nullopt;
  ClockSample best = samples_.front();
  for (const ClockSample& s : samples_) {
    if (s.rtt_ns < best.rtt_ns) best = s;
  }
  return best;
}

int64_t ClockOffsetEstimator::ToServerNs(int64_t client_ns) const {
  auto e = Estimate();
  return e.has_value() ? client_ns - e->offset_ns : client_ns;
}

}  // namespace fl::core
