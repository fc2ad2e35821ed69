// Calibration end to end, on both backends (seconds-long transfers: labelled slow). The assertions are
// the bounds the emulation guarantees whatever the machine's load: a link never delivers more than its
// rate, and a round trip never beats the configured delays. How close to nominal the links come on this
// machine is measured and published in docs/testbed.md, not asserted here.
#include "fl/emulation/calibrate.h"

#include <unistd.h>

#include <cmath>
#include <fstream>

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include "fl/emulation/tun_device.h"
#include "fl/testing/scratch_dir.h"

namespace fl::emulation {
namespace {

LinkProfile Profile() {
  LinkProfile p;
  p.name = "cal-test";
  p.uplink.rate_bps = 12e6;
  p.uplink.delay_ms = 3;
  p.downlink.rate_bps = 30e6;
  p.downlink.delay_ms = 5;
  return p;
}

void ExpectWithinGuarantees(const CalibrationResult& r, const LinkProfile& p) {
  // Goodput cannot exceed the payload share of the link rate (plus one bucket over the window).
  for (const auto& [m, d] : {std::pair{r.uplink, p.uplink}, std::pair{r.downlink, p.downlink}}) {
    EXPECT_GT(m.bytes, 0u);
    EXPECT_LE(m.measured_bps, d.rate_bps * 1.02) << BackendName(r.backend);
  }
  EXPECT_GE(r.rtt_p10_ms, p.NominalRttMs()) << BackendName(r.backend);
  EXPECT_EQ(r.pings, 10);
  EXPECT_DOUBLE_EQ(r.nominal_rtt_ms, 8.0);
}

TEST(CalibrateTest, UserspaceBackendMeasuresBothDirectionsAndTheRoundTrip) {
  CalibrationOptions o;
  o.backend = Backend::kUserspace;
  o.bulk_seconds = 1.0;
  o.pings = 10;
  auto r = Calibrate(Profile(), o);
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectWithinGuarantees(*r, Profile());
}

TEST(CalibrateTest, KernelBackendMeasuresBothDirectionsAndTheRoundTrip) {
  if (geteuid() != 0) GTEST_SKIP() << "the kernel backend needs root; this run is not root";
  CalibrationOptions o;
  o.backend = Backend::kKernel;
  o.bulk_seconds = 1.0;
  o.pings = 10;
  auto r = Calibrate(Profile(), o);
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectWithinGuarantees(*r, Profile());
}

TEST(CalibrateTest, PacketBackendMeasuresPhysicsOrNamesWhatIsMissing) {
  LinkProfile p = Profile();
  p.uplink.loss = 0.02;
  p.downlink.loss = 0.01;
  CalibrationOptions o;
  o.backend = Backend::kPacket;
  o.bulk_seconds = 1.0;
  o.pings = 10;
  o.loss_packets = 20'000;
  o.mathis_loss = 0.01;
  o.mathis_seconds = 3;
  const absl::Status support = PacketBackendSupport();
  auto r = Calibrate(p, o);
  if (!support.ok()) {
    // Refused before anything starts, with the same list of what this machine lacks.
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find(support.message()), std::string_view::npos) << r.status();
    return;
  }
  ASSERT_TRUE(r.ok()) << r.status();
  // Capacity and delay are measured without the loss, so the guarantees are those of the lossless link.
  ExpectWithinGuarantees(*r, p);
  // Loss: physics (the configured Bernoulli probability) plus the binomial spread over the datagrams that got
  // past the queue; 6 sigma, so a correct link fails this about once in 500 million runs.
  ASSERT_TRUE(r->has_loss);
  for (const auto& [m, configured] : {std::pair{r->loss_up, 0.02}, std::pair{r->loss_down, 0.01}}) {
    EXPECT_DOUBLE_EQ(m.configured, configured);
    EXPECT_EQ(m.sent, 20'000u);
    const double counted = static_cast<double>(m.sent - m.queue_drops);
    const double lost = m.Measured() * counted;
    const double sigma = std::sqrt(counted * configured * (1 - configured));
    EXPECT_NEAR(lost, counted * configured, 6 * sigma)
        << "sent " << m.sent << ", received " << m.received << ", queue drops " << m.queue_drops;
    // Every datagram the receiver missed was lost by the link's loss model or dropped by its queue.
    EXPECT_LE(m.sent - m.received, m.link_lost + m.queue_drops);
  }
  // TCP under random loss: Reno's own retransmissions, goodput still under the link's rate.
  ASSERT_TRUE(r->has_mathis);
  EXPECT_EQ(r->mathis.congestion_control, "reno");
  EXPECT_GT(r->mathis.retransmits, 0u);
  EXPECT_GT(r->mathis.measured_bps, 0);
  EXPECT_LE(r->mathis.measured_bps, p.uplink.rate_bps * 1.02);
  EXPECT_GE(r->mathis.rtt_ms, p.NominalRttMs());
}

TEST(CalibrateTest, WritesYamlBesideTheProfileKeepingOtherBackends) {
  fl::testing::ScratchDir dir("calibration");
  const auto profile_path = dir.path() / "x.yaml";
  CalibrationResult user;
  user.profile = "x";
  user.backend = Backend::kUserspace;
  user.uplink.nominal_bps = 1e6;
  user.uplink.measured_bps = 0.96e6;
  user.downlink.nominal_bps = 2e6;
  user.downlink.measured_bps = 1.5e6;  // 25% short: misses the target
  user.rtt_median_ms = 10.5;
  user.nominal_rtt_ms = 10;
  CalibrationResult kernel = user;
  kernel.backend = Backend::kKernel;
  ASSERT_TRUE(WriteCalibrationYaml(profile_path, {user}).ok());
  auto out = WriteCalibrationYaml(profile_path, {kernel});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->filename(), "x.calibration.yaml");
  const YAML::Node y = YAML::LoadFile(out->string());
  ASSERT_EQ(y["calibrations"].size(), 2u);
  EXPECT_EQ(y["calibrations"][0]["backend"].as<std::string>(), "userspace");
  EXPECT_EQ(y["calibrations"][1]["backend"].as<std::string>(), "kernel");
  EXPECT_FALSE(y["calibrations"][1]["within_target"]["rate_10pct"].as<bool>());
  EXPECT_TRUE(y["calibrations"][1]["within_target"]["rtt_2ms"].as<bool>());
  EXPECT_NEAR(y["calibrations"][1]["downlink"]["error"].as<double>(), -0.25, 1e-9);
  const std::string table = CalibrationTable({user});
  EXPECT_NE(table.find("RATE MISSED"), std::string::npos);
  EXPECT_NE(table.find("-25.0%"), std::string::npos);
}

}  // namespace
}  // namespace fl::emulation
