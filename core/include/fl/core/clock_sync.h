// Clock-offset estimation from NTP-style four-timestamp exchanges.
//
// The server sends a ping at t1 (its clock); the client receives it at t2 and answers at t3 (its clock); the
// server receives the answer at t4. With symmetric one-way delays,
//   offset = ((t2 - t1) + (t3 - t4)) / 2     (client clock minus server clock)
//   rtt    = (t4 - t1) - (t3 - t2)           (time on the wire, both ways)
// and the error of the offset is at most rtt / 2. Queueing makes delays asymmetric and rtt large, so the
// estimator keeps the last `window` samples and reports the one with the smallest rtt (the NTP clock filter's
// idea): the sample least disturbed by queueing has the tightest error bound.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>

namespace fl::core {

struct ClockSample {
  int64_t offset_ns = 0;  // client clock - server clock
  int64_t rtt_ns = 0;
};

// The largest timestamp (in magnitude) the estimator takes: 2^60 ns, 36.5 years of a monotonic clock.
inline constexpr int64_t kMaxClockNs = int64_t{1} << 60;

class ClockOffsetEstimator {
 public:
  explicit ClockOffsetEstimator(size_t window = 8) : window_(window == 0 ? 1 : window) {}

  // Adds one exchange. Returns false (and ignores it) when the timestamps are inconsistent: a negative
  // round trip (t4 < t1), a client that answered before it received (t3 < t2), or a timestamp beyond
  // +-kMaxClockNs (no monotonic clock reads that).
  bool Add(int64_t t1_server_ns, int64_t t2_client_ns, int64_t t3_client_ns, int64_t t4_server_ns);

  // The minimum-rtt sample of the window; nullopt before the first valid exchange.
  std::optional<ClockSample> Estimate() const;
  size_t num_samples() const { return samples_.size(); }

  // A client timestamp placed on the server's clock with the current estimate (unchanged without one).
  int64_t ToServerNs(int64_t client_ns) const;

 private:
  size_t window_;
  std::deque<ClockSample> samples_;
};

}  // namespace fl::core
