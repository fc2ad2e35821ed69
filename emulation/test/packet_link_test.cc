// PacketLink on virtual time: every expectation is computed from the configuration (serialisation times,
// trace opportunities, the loss models' formulas), never from a clock.
#include "fl/emulation/packet_link.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

namespace fl::emulation {
namespace {

constexpr int64_t kMs = 1'000'000;

std::vector<uint8_t> Bytes(size_t n, uint8_t tag = 0) { return std::vector<uint8_t>(n, tag); }

PacketLink Make(const LinkDirection& d, uint64_t seed = 1, int64_t start = 0) {
  absl::StatusOr<PacketLink> l = PacketLink::Create(d, seed, start, "uplink");
  EXPECT_TRUE(l.ok()) << l.status();
  return *std::move(l);
}

// Runs the link to completion, event by event, and returns (leave time, first byte) of each delivery.
std::vector<std::pair<int64_t, uint8_t>> Drain(PacketLink& l) {
  std::vector<std::pair<int64_t, uint8_t>> out;
  for (int64_t t = l.NextEventNs(); t != std::numeric_limits<int64_t>::max(); t = l.NextEventNs()) {
    std::vector<Packet> got;
    l.Deliver(t, &got);
    for (const Packet& p : got) out.emplace_back(t, p.bytes.empty() ? 0 : p.bytes[0]);
  }
  return out;
}

TEST(PacketLinkTest, FixedRateDeliversBytesInBytesTimesEightOverRate) {
  LinkDirection d;
  d.rate_bps = 12e6;  // 1500 bytes = 1 ms
  d.queue_limit_bytes = 1 << 20;
  PacketLink l = Make(d);
  for (int i = 0; i < 100; ++i) ASSERT_EQ(l.Offer(0, Bytes(1500, static_cast<uint8_t>(i))), OfferResult::kQueued);
  const auto out = Drain(l);
  ASSERT_EQ(out.size(), 100u);
  for (size_t i = 0; i < out.size(); ++i) {
    EXPECT_EQ(out[i].first, static_cast<int64_t>(i + 1) * kMs) << i;  // back to back
    EXPECT_EQ(out[i].second, static_cast<uint8_t>(i));
  }
  EXPECT_EQ(l.stats().delivered_bytes, 150'000u);
  EXPECT_EQ(l.stats().max_late_ns, 0);  // delivered at their times
}

TEST(PacketLinkTest, FixedRateRoundingDoesNotAccumulatePerPacket) {
  LinkDirection d;
  d.rate_bps = 7e6;  // 1500 bytes = 1,714,285.71 ns: 7 packets = 12 ms exactly
  d.queue_limit_bytes = 1 << 20;
  PacketLink l = Make(d);
  for (int i = 0; i < 7; ++i) l.Offer(0, Bytes(1500));
  const auto out = Drain(l);
  ASSERT_EQ(out.size(), 7u);
  EXPECT_EQ(out[0].first, 1'714'286);
  EXPECT_EQ(out[6].first, 12 * kMs);
  // After an idle gap the next packet starts at its arrival, a new busy period.
  l.Offer(20 * kMs, Bytes(1500));
  const auto later = Drain(l);
  ASSERT_EQ(later.size(), 1u);
  EXPECT_EQ(later[0].first, 20 * kMs + 1'714'286);
}

TEST(PacketLinkTest, LatenessCountsPacketsDeliveredAfterTheirTime) {
  LinkDirection d;
  d.delay_ms = 10;
  PacketLink l = Make(d);
  l.Offer(0, Bytes(100));
  l.Offer(0, Bytes(100));
  std::vector<Packet> got;
  l.Deliver(10 * kMs + 3 * kMs, &got);  // the loop woke 3 ms late
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(l.stats().max_late_ns, 3 * kMs);
  EXPECT_EQ(l.stats().late_over_1ms, 2u);
}

TEST(PacketLinkTest, AnIdleLinkStartsAPacketAtItsArrival) {
  LinkDirection d;
  d.rate_bps = 8e6;  // 1000 bytes = 1 ms
  PacketLink l = Make(d);
  l.Offer(5 * kMs, Bytes(1000));
  EXPECT_EQ(l.NextEventNs(), 6 * kMs);
  std::vector<Packet> got;
  l.Deliver(6 * kMs - 1, &got);
  EXPECT_TRUE(got.empty());
  l.Deliver(6 * kMs, &got);
  ASSERT_EQ(got.size(), 1u);
}

TEST(PacketLinkTest, TraceOpportunitiesAreFollowedAndRepeatWithThePeriod) {
  LinkDirection d;
  d.has_trace = true;
  d.trace.opportunities_ms = {2, 2, 5, 10};  // two at 2 ms, one at 5, one at 10; period 10 ms
  d.trace.period_ms = 10;
  d.queue_limit_bytes = 1 << 20;
  PacketLink l = Make(d);
  for (int i = 0; i < 6; ++i) l.Offer(0, Bytes(1500, static_cast<uint8_t>(i)));
  const auto out = Drain(l);
  const std::vector<int64_t> want = {2, 2, 5, 10, 12, 12};
  ASSERT_EQ(out.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(out[i].first, want[i] * kMs) << i;
}

TEST(PacketLinkTest, SmallPacketsShareAnOpportunityUpTo1500Bytes) {
  LinkDirection d;
  d.has_trace = true;
  d.trace.opportunities_ms = {1, 2};
  d.trace.period_ms = 2;
  PacketLink l = Make(d);
  for (int i = 0; i < 4; ++i) l.Offer(0, Bytes(500, static_cast<uint8_t>(i)));  // 3 fit in 1500, the 4th waits
  const auto out = Drain(l);
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[0].first, 1 * kMs);
  EXPECT_EQ(out[2].first, 1 * kMs);
  EXPECT_EQ(out[3].first, 2 * kMs);
}

TEST(PacketLinkTest, APacketArrivingAtAnOpportunityTakesIt) {
  LinkDirection d;
  d.has_trace = true;
  d.trace.opportunities_ms = {3, 10};  // the last line is the period: 10 ms, 20 ms, ... are opportunities
  d.trace.period_ms = 10;
  PacketLink l = Make(d);
  l.Offer(3 * kMs, Bytes(100, 1));   // at the first line's time
  l.Offer(20 * kMs, Bytes(100, 2));  // at the second period's last line, where the third period begins
  const auto out = Drain(l);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].first, 3 * kMs);
  EXPECT_EQ(out[1].first, 20 * kMs);
  EXPECT_EQ(l.stats().opportunities_unused, 2u);  // 10 ms and 13 ms found the queue empty
}

TEST(PacketLinkTest, OpportunitiesThatFindTheQueueEmptyAreLostEvenAcrossManyPeriods) {
  LinkDirection d;
  d.has_trace = true;
  d.trace.opportunities_ms = {1, 2, 3, 4};
  d.trace.period_ms = 4;
  PacketLink l = Make(d);
  // A packet arriving after 1,000,000 periods: the opportunities before it are counted, not served.
  const int64_t arrival = 4'000'000 * kMs + kMs / 2;
  l.Offer(arrival, Bytes(100));
  EXPECT_EQ(l.NextEventNs(), 4'000'000 * kMs + kMs);
  const auto out = Drain(l);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(l.stats().opportunities_unused, 4'000'000u);
}

TEST(PacketLinkTest, DelayAndJitterNeverReorder) {
  LinkDirection d;
  d.rate_bps = 120e6;  // 0.1 ms per 1500 bytes: packets closer than the jitter
  d.delay_ms = 20;
  d.jitter_ms = 5;
  d.queue_limit_bytes = 1 << 22;
  PacketLink l = Make(d, 7);
  for (int i = 0; i < 1000; ++i) l.Offer(0, Bytes(1500, static_cast<uint8_t>(i % 256)));
  const auto out = Drain(l);
  ASSERT_EQ(out.size(), 1000u);
  for (size_t i = 0; i < out.size(); ++i) {
    EXPECT_EQ(out[i].second, static_cast<uint8_t>(i % 256)) << "reordered at " << i;
    const int64_t departed = static_cast<int64_t>(i + 1) * kMs / 10;
    EXPECT_GE(out[i].first, departed + 15 * kMs) << i;
    if (i > 0) {
      EXPECT_GE(out[i].first, out[i - 1].first);
      // Later than its own delay + jitter allows only by waiting for its predecessor: then with it.
      if (out[i].first > departed + 25 * kMs) {
        EXPECT_EQ(out[i].first, out[i - 1].first) << i;
      }
    }
  }
}

TEST(PacketLinkTest, ReorderLetsJitterOvertake) {
  LinkDirection d;
  d.rate_bps = 120e6;
  d.delay_ms = 20;
  d.jitter_ms = 5;
  d.reorder = true;
  d.queue_limit_bytes = 1 << 22;
  PacketLink l = Make(d, 7);
  for (int i = 0; i < 1000; ++i) l.Offer(0, Bytes(1500, static_cast<uint8_t>(i % 256)));
  const auto out = Drain(l);
  ASSERT_EQ(out.size(), 1000u);
  int overtaken = 0;
  for (size_t i = 1; i < out.size(); ++i) overtaken += out[i].second != static_cast<uint8_t>(i % 256);
  EXPECT_GT(overtaken, 100);  // 0.1 ms spacing against +-5 ms of jitter: most packets move
}

// |observed - n p| within 6 standard deviations: a correct model fails this about once in 500 million runs.
void ExpectBinomial(uint64_t observed, uint64_t n, double p) {
  const double mean = static_cast<double>(n) * p;
  const double sd = std::sqrt(static_cast<double>(n) * p * (1 - p));
  EXPECT_NEAR(static_cast<double>(observed), mean, 6 * sd) << "of " << n << " at p = " << p;
}

TEST(PacketLinkTest, BernoulliLossAtTheConfiguredRate) {
  LinkDirection d;  // unlimited: every offer departs at once
  d.loss = 0.01;
  PacketLink l = Make(d, 3);
  for (int i = 0; i < 100'000; ++i) l.Offer(i, Bytes(100));
  std::vector<Packet> got;
  l.Deliver(100'000, &got);
  ExpectBinomial(l.stats().lost, 100'000, 0.01);
  EXPECT_EQ(l.stats().lost + got.size(), 100'000u);
  EXPECT_EQ(l.stats().lost_burst, 0u);
}

TEST(PacketLinkTest, GilbertElliottStationaryLossAndBurstLength) {
  LinkDirection d;
  d.burst_loss = {.p_good_to_bad = 0.01, .p_bad_to_good = 0.25, .loss_good = 0, .loss_bad = 1};
  PacketLink l = Make(d, 11);
  constexpr int kN = 400'000;
  std::vector<bool> lost(kN);
  uint64_t delivered_before = 0;
  for (int i = 0; i < kN; ++i) {
    l.Offer(i, Bytes(64));
    std::vector<Packet> got;
    l.Deliver(i, &got);
    lost[i] = l.stats().delivered == delivered_before;
    delivered_before = l.stats().delivered;
  }
  // Stationary loss pi_bad = 0.01 / 0.26 = 3.85%. Bursts make the count's variance larger than a binomial's:
  // by the chain's mixing, var ~ n p (1 - p) (1 + lambda) / (1 - lambda), lambda = 1 - 0.01 - 0.25.
  const double p = d.burst_loss.StationaryLoss();
  const double lambda = 1 - 0.01 - 0.25;
  const double sd = std::sqrt(kN * p * (1 - p) * (1 + lambda) / (1 - lambda));
  EXPECT_NEAR(static_cast<double>(l.stats().lost), kN * p, 6 * sd);
  EXPECT_EQ(l.stats().lost, l.stats().lost_burst);
  // Runs of consecutive losses: geometric with mean 1 / p_bad_to_good = 4 (sd of the mean ~ 3.5 / sqrt(runs)).
  uint64_t runs = 0, in_runs = 0;
  for (int i = 0; i < kN; ++i) {
    if (lost[i]) {
      ++in_runs;
      if (i == 0 || !lost[i - 1]) ++runs;
    }
  }
  ASSERT_GT(runs, 1000u);
  const double mean_run = static_cast<double>(in_runs) / static_cast<double>(runs);
  EXPECT_NEAR(mean_run, d.burst_loss.MeanBadRunPackets(), 6 * 3.5 / std::sqrt(static_cast<double>(runs)));
}

TEST(PacketLinkTest, QueueOverflowDropsTheTailByBytesAndByPackets) {
  LinkDirection d;
  d.rate_bps = 12e6;
  d.queue_limit_bytes = 4500;  // three full packets
  PacketLink bytes = Make(d);
  for (int i = 0; i < 5; ++i) bytes.Offer(0, Bytes(1500, static_cast<uint8_t>(i)));
  EXPECT_EQ(bytes.stats().dropped_queue, 2u);
  const auto out = Drain(bytes);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[2].second, 2);  // the tail was dropped, not the head
  EXPECT_EQ(bytes.stats().max_queue_bytes, 4500u);

  d.queue_limit_bytes = 1 << 20;
  d.queue_limit_packets = 2;
  PacketLink packets = Make(d);
  for (int i = 0; i < 5; ++i) packets.Offer(0, Bytes(100));
  EXPECT_EQ(packets.stats().dropped_queue, 3u);
}

TEST(PacketLinkTest, SameSeedSameLossesOtherSeedOthers) {
  LinkDirection d;
  d.loss = 0.2;
  auto pattern = [&](uint64_t seed) {
    PacketLink l = Make(d, seed);
    std::vector<bool> out;
    uint64_t before = 0;
    for (int i = 0; i < 200; ++i) {
      l.Offer(i, Bytes(10));
      std::vector<Packet> got;
      l.Deliver(i, &got);
      out.push_back(l.stats().delivered > before);
      before = l.stats().delivered;
    }
    return out;
  };
  EXPECT_EQ(pattern(5), pattern(5));
  EXPECT_NE(pattern(5), pattern(6));
}

TEST(PacketLinkTest, BadParametersAreRefusedNamingTheField) {
  auto refused = [](const LinkDirection& d) {
    absl::StatusOr<PacketLink> l = PacketLink::Create(d, 1, 0, "uplink");
    EXPECT_FALSE(l.ok());
    return l.ok() ? std::string() : std::string(l.status().message());
  };
  LinkDirection d;
  d.delay_ms = -1;
  EXPECT_NE(refused(d).find("uplink.delay_ms: -1"), std::string::npos) << refused(d);
  d = {};
  d.delay_ms = 5;
  d.jitter_ms = 6;
  EXPECT_NE(refused(d).find("uplink.jitter_ms: 6"), std::string::npos) << refused(d);
  d = {};
  d.loss = 1;
  EXPECT_NE(refused(d).find("uplink.loss: 1"), std::string::npos) << refused(d);
  d = {};
  d.burst_loss.p_good_to_bad = 1.5;
  EXPECT_NE(refused(d).find("uplink.burst_loss.p_good_to_bad: 1.5"), std::string::npos) << refused(d);
  d = {};
  d.burst_loss = {.p_good_to_bad = 0.1, .p_bad_to_good = 0, .loss_good = 0, .loss_bad = 1};
  EXPECT_NE(refused(d).find("uplink.burst_loss.p_bad_to_good"), std::string::npos) << refused(d);
  d = {};
  d.rate_bps = std::nan("");
  EXPECT_NE(refused(d).find("uplink.rate"), std::string::npos) << refused(d);
  d = {};
  d.has_trace = true;
  d.trace.path = "empty.mahi";
  EXPECT_NE(refused(d).find("uplink.trace: empty.mahi"), std::string::npos) << refused(d);
}

}  // namespace
}  // namespace fl::emulation
