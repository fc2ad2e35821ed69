#include "fl/core/clock_sync.h"

namespace fl::core {

bool ClockOffsetEstimator::Add(int64_t t1, int64_t t2, int64_t t3, int64_t t4) {
  // Monotonic clocks count from boot: a timestamp beyond +-kMaxClockNs is not a clock reading (a peer
  // sending INT64 extremes would otherwise overflow the differences below and place its phases decades away).
  // Negative readings are allowed: a test client's skewed clock (--clock-skew-ms) may read below zero.
  for (int64_t t : {t1, t2, t3, t4}) {
    if (t < -kMaxClockNs || t > kMaxClockNs) return false;
  }
  if (t4 < t1 || t3 < t2) return false;
  ClockSample s;
  // Timestamps are within +-2^60 (checked above), so neither the differences nor their sum can overflow.
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
