// The shaping logic in virtual time: exact, deterministic checks of rate, delay, ordering and trace replay.
#include "fl/emulation/shaper.h"

#include <cmath>

#include <gtest/gtest.h>

namespace fl::emulation {
namespace {

constexpr int64_t kMs = 1'000'000;
constexpr double kPayloadPerWire = kMssBytes / kMtuBytes;

// Feeds `total` bytes at t=0 and steps virtual time by 100 us until all are released; returns the time.
int64_t TimeToRelease(DirectionShaper& s, uint64_t total) {
  s.Enqueue(0, total);
  int64_t t = 0;
  while (s.released() < total) {
    t += 100'000;
    s.Advance(t);
    if (t > 1000 * 1000 * kMs) break;
  }
  return t;
}

TEST(ShaperTest, UnshapedDirectionReleasesImmediately) {
  DirectionShaper s(LinkDirection{}, 1, 0);
  s.Enqueue(5, 1000);
  EXPECT_EQ(s.released(), 1000u);
  EXPECT_EQ(s.NextEventNs(), DirectionShaper::kNever);
}

TEST(ShaperTest, TokenBucketReleasesAtTheLinkRate) {
  LinkDirection d;
  d.rate_bps = 8e6;  // 1 MB/s of link bytes
  DirectionShaper s(d, 1, 0);
  const uint64_t total = 1'000'000;
  const int64_t t = TimeToRelease(s, total);
  // Link bytes needed for `total` payload bytes, less the initial bucket.
  const double wire = static_cast<double>(total) / kPayloadPerWire;
  const double expected_ns = (wire - DirectionShaper::BurstBytes(d.rate_bps)) * 8 / d.rate_bps * 1e9;
  EXPECT_GE(static_cast<double>(t), expected_ns - 1e5);
  EXPECT_LE(static_cast<double>(t), expected_ns + 2e5);
}

TEST(ShaperTest, TokenBucketNeverExceedsRatePlusBurst) {
  LinkDirection d;
  d.rate_bps = 100e6;
  DirectionShaper s(d, 1, 0);
  s.Enqueue(0, 50'000'000);
  for (int64_t t = 0; t <= 200 * kMs; t += 37'000) {
    s.Advance(t);
    const double allowed =
        (DirectionShaper::BurstBytes(d.rate_bps) + static_cast<double>(t) * d.rate_bps / 8e9) * kPayloadPerWire;
    ASSERT_LE(static_cast<double>(s.shaped()), allowed + 1) << "at t=" << t;
  }
  // And it keeps up: within one bucket of the rate after 200 ms.
  const double at_end = 200e-3 * d.rate_bps / 8 * kPayloadPerWire;
  EXPECT_GE(static_cast<double>(s.shaped()), at_end - DirectionShaper::BurstBytes(d.rate_bps));
}

TEST(ShaperTest, IdleTimeDoesNotAccumulateMoreThanABurst) {
  LinkDirection d;
  d.rate_bps = 1e6;
  DirectionShaper s(d, 1, 0);
  s.Enqueue(10'000 * kMs, 100'000);  // after 10 s of idleness
  EXPECT_LE(static_cast<double>(s.shaped()), DirectionShaper::BurstBytes(d.rate_bps) * kPayloadPerWire + 1);
}

TEST(ShaperTest, DelayLineHoldsBytesForTheDelay) {
  LinkDirection d;
  d.delay_ms = 20;
  DirectionShaper s(d, 1, 0);
  s.Enqueue(3 * kMs, 500);
  EXPECT_EQ(s.released(), 0u);
  EXPECT_EQ(s.NextEventNs(), 23 * kMs);
  s.Advance(23 * kMs - 1);
  EXPECT_EQ(s.released(), 0u);
  s.Advance(23 * kMs);
  EXPECT_EQ(s.released(), 500u);
}

TEST(ShaperTest, JitterNeverReordersAndStaysInItsRange) {
  LinkDirection d;
  d.delay_ms = 10;
  d.jitter_ms = 8;
  DirectionShaper s(d, 42, 0);
  // One byte every 100 us; release times must be non-decreasing in arrival order.
  int64_t last_release_time = 0;
  uint64_t released = 0;
  double min_delay = 1e18, max_delay = 0;
  std::vector<int64_t> arrival;
  for (int64_t t = 0; t < 2000 * kMs; t += 100'000) {
    if (t < 1000 * kMs) {
      s.Enqueue(t, 1);
      arrival.push_back(t);
    } else {
      s.Advance(t);
    }
    while (released < s.released()) {
      const double delay = static_cast<double>(t - arrival[released]) / kMs;
      min_delay = std::min(min_delay, delay);
      max_delay = std::max(max_delay, delay);
      ASSERT_GE(t, last_release_time);
      last_release_time = t;
      ++released;
    }
  }
  EXPECT_EQ(released, arrival.size());
  EXPECT_GE(min_delay, 2.0 - 0.1);  // delay - jitter (observed on a 100 us grid)
  EXPECT_LE(max_delay, 18.0 + 0.2);
  EXPECT_GT(max_delay - min_delay, 4.0);  // the jitter is really there
}

TEST(ShaperTest, TraceGivesOnePacketPerOpportunityAndRepeats) {
  LinkDirection d;
  d.has_trace = true;
  d.trace.opportunities_ms = {1, 1, 4, 10};
  d.trace.period_ms = 10;
  DirectionShaper s(d, 1, 0);
  s.Enqueue(0, 10'000);
  s.Advance(1 * kMs);
  EXPECT_EQ(s.released(), 2 * 1448u);
  s.Advance(4 * kMs - 1);
  EXPECT_EQ(s.released(), 2 * 1448u);
  s.Advance(4 * kMs);
  EXPECT_EQ(s.released(), 3 * 1448u);
  s.Advance(10 * kMs);
  EXPECT_EQ(s.released(), 4 * 1448u);
  EXPECT_EQ(s.NextEventNs(), 11 * kMs);  // the second cycle's first opportunity
  s.Advance(11 * kMs);
  EXPECT_EQ(s.released(), 6 * 1448u);
  s.Advance(30 * kMs);  // 10000 bytes need 7 opportunities, the last one partly used
  EXPECT_EQ(s.released(), 10'000u);
}

TEST(ShaperTest, TraceWastesOpportunitiesWhileIdle) {
  LinkDirection d;
  d.has_trace = true;
  d.trace.opportunities_ms = {2, 4, 6, 8, 10};
  d.trace.period_ms = 10;
  DirectionShaper s(d, 1, 0);
  s.Advance(25 * kMs);
  s.Enqueue(25 * kMs, 3000);  // the opportunities at 2..24 ms passed with nothing to send
  EXPECT_EQ(s.shaped(), 0u);
  EXPECT_EQ(s.NextEventNs(), 26 * kMs);
  s.Advance(26 * kMs);
  EXPECT_EQ(s.shaped(), 1448u);
}

}  // namespace
}  // namespace fl::emulation
