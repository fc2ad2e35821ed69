#include "fl/core/clock_sync.h"

#include <limits>

#include <gtest/gtest.h>

namespace fl::core {
namespace {

// A client whose clock runs `skew` ahead of the server's; one-way delays `up` (server->client) and `down`.
void Exchange(ClockOffsetEstimator& e, int64_t t1, int64_t skew, int64_t up, int64_t down, int64_t think = 1000) {
  const int64_t t2 = t1 + up + skew;
  const int64_t t3 = t2 + think;
  const int64_t t4 = t3 - skew + down;
  EXPECT_TRUE(e.Add(t1, t2, t3, t4));
}

TEST(ClockOffsetEstimatorTest, SymmetricDelaysGiveTheExactOffset) {
  ClockOffsetEstimator e;
  EXPECT_FALSE(e.Estimate().has_value());
  Exchange(e, 1'000'000, 250'000'000, 50'000, 50'000);
  ASSERT_TRUE(e.Estimate().has_value());
  EXPECT_EQ(e.Estimate()->offset_ns, 250'000'000);
  EXPECT_EQ(e.Estimate()->rtt_ns, 100'000);
  EXPECT_EQ(e.ToServerNs(250'000'000 + 7), 7);
}

TEST(ClockOffsetEstimatorTest, KeepsTheMinimumRttSampleAndItsErrorIsBoundedByHalfOfIt) {
  ClockOffsetEstimator e(8);
  const int64_t skew = -3'000'000'000;
  // Queueing on the way back inflates one direction: those samples are off by up to half their rtt.
  Exchange(e, 0, skew, 100'000, 9'000'000);
  Exchange(e, 10'000'000, skew, 40'000, 60'000);  // the tight one
  Exchange(e, 20'000'000, skew, 5'000'000, 100'000);
  auto best = e.Estimate();
  ASSERT_TRUE(best.has_value());
  EXPECT_EQ(best->rtt_ns, 100'000);
  EXPECT_LE(std::abs(best->offset_ns - skew), best->rtt_ns / 2);
}

TEST(ClockOffsetEstimatorTest, WindowForgetsOldSamples) {
  ClockOffsetEstimator e(2);
  Exchange(e, 0, 0, 10, 10);          // tiny rtt, offset 0
  Exchange(e, 100, 500, 1000, 1000);  // clock stepped by 500 ns
  Exchange(e, 200, 500, 1000, 1000);
  EXPECT_EQ(e.num_samples(), 2u);
  EXPECT_EQ(e.Estimate()->offset_ns, 500);  // the old tight sample has left the window
}

TEST(ClockOffsetEstimatorTest, RejectsImpossibleTimestamps) {
  ClockOffsetEstimator e;
  EXPECT_FALSE(e.Add(100, 0, 10, 50));  // t4 < t1
  EXPECT_FALSE(e.Add(0, 20, 10, 50));   // t3 < t2
  EXPECT_FALSE(e.Add(0, 0, 100, 50));   // the client held it longer than the round trip
  EXPECT_FALSE(e.Estimate().has_value());
}

TEST(ClockOffsetEstimatorTest, RejectsTimestampsNoClockReadsInsteadOfOverflowing) {
  // A hostile pong at INT64 extremes: the differences would overflow and place the client decades away.
  ClockOffsetEstimator e;
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  EXPECT_FALSE(e.Add(1'000, kMin, kMax, 2'000));
  EXPECT_FALSE(e.Add(1'000, kMax - 1, kMax, 2'000));
  EXPECT_FALSE(e.Add(1'000, kMaxClockNs + 1, kMaxClockNs + 2, 2'000));
  EXPECT_FALSE(e.Estimate().has_value());
  EXPECT_TRUE(e.Add(1'000, kMaxClockNs - 10, kMaxClockNs - 5, 2'000));  // extreme but a clock reading
}

}  // namespace
}  // namespace fl::core
