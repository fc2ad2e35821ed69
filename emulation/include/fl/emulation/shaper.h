// The shaping logic of one direction of a link, separate from sockets and clocks so that it can be tested
// in virtual time: bytes enter a bottleneck queue, leave it at the link rate (token bucket) or at the
// delivery opportunities of a Mahimahi trace, then wait in a delay line for their one-way delay.
//
// All quantities are cumulative byte counts of one stream, so the shaper never holds data itself:
//   enqueued() >= shaped() >= released()
// The relay reads data (enqueued), lets the shaper move bytes through the bottleneck (shaped) and the
// delay line (released), and writes released bytes to the other side.
#pragma once

#include <cstdint>
#include <deque>
#include <limits>
#include <random>

#include "fl/emulation/link_profile.h"

namespace fl::emulation {

class DirectionShaper {
 public:
  static constexpr int64_t kNever = std::numeric_limits<int64_t>::max();

  // `start_ns` is the stream's start: a trace's first opportunity is at start_ns + its first timestamp.
  DirectionShaper(const LinkDirection& config, uint64_t seed, int64_t start_ns);

  // `bytes` arrived at `now_ns` (time must not go backwards between calls).
  void Enqueue(int64_t now_ns, uint64_t bytes);
  // Moves bytes through the bottleneck and the delay line up to `now_ns`.
  void Advance(int64_t now_ns);

  uint64_t enqueued() const { return enqueued_; }
  uint64_t shaped() const { return shaped_; }
  uint64_t released() const { return released_; }
  // Bytes waiting for the bottleneck (what the queue limit bounds).
  uint64_t queued() const { return enqueued_ - shaped_; }
  // When Advance could next release or shape something; kNever when nothing is pending.
  int64_t NextEventNs() const;

  // Token bucket depth in link (wire) bytes: a few packets, or 1 ms at the rate when that is more, so
  // that a wake-up that is late by less than that loses no throughput.
  static double BurstBytes(double rate_bps);

 private:
  struct Mark {
    int64_t release_ns;
    uint64_t end;  // shaped() after this grant
  };
  void ShapeTokenBucket(int64_t now_ns);
  void ShapeTrace(int64_t now_ns);
  // Puts the bytes up to shaped_ into the delay line as one chunk that left the bottleneck at `at_ns`.
  void Depart(int64_t at_ns);
  void SkipIdleOpportunities(int64_t now_ns);
  int64_t OpportunityNs(uint64_t index) const;

  LinkDirection config_;
  std::mt19937_64 rng_;
  int64_t start_ns_;
  uint64_t enqueued_ = 0;
  uint64_t shaped_ = 0;
  uint64_t released_ = 0;
  // Token bucket (in wire bytes).
  double tokens_ = 0;
  double burst_ = 0;
  int64_t last_ns_ = 0;
  // Trace: index of the next opportunity over the unrolled, repeating trace.
  uint64_t next_opportunity_ = 0;
  // Delay line: release times never decrease, so bytes are never reordered.
  std::deque<Mark> marks_;
  int64_t last_release_ns_ = 0;
};

}  // namespace fl::emulation
