#include "fl/emulation/rate_process.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numbers>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <yaml-cpp/yaml.h>

#include "fl/core/str_cat.h"

namespace fl::emulation {
namespace {

using ::testing::HasSubstr;

std::string Message(const absl::Status& s) { return std::string(ToStd(s.message())); }

// The measured traces live beside the repository (../shared/traces, as CI lays it out); never in it.
std::filesystem::path SharedTraces() { return std::filesystem::path(FL_SOURCE_DIR) / ".." / "shared" / "traces"; }

RateProcess Process(std::vector<double> q, double lag1, uint64_t duration_s = 120) {
  RateProcess p;
  p.quantiles_mbit = std::move(q);
  p.lag1_autocorrelation = lag1;
  p.duration_s = duration_s;
  return p;
}

TEST(RateStatsTest, QuantilesInterpolateLikePythonsInclusiveMethod) {
  // statistics.quantiles([1, 2, 3, 4, 10], n=20, method="inclusive"): p5 = 1.2, p95 = 8.8; median 3.
  const std::vector<double> v = {4, 1, 10, 3, 2};
  EXPECT_DOUBLE_EQ(InclusiveQuantile(v, 0.05), 1.2);
  EXPECT_DOUBLE_EQ(InclusiveQuantile(v, 0.5), 3);
  EXPECT_DOUBLE_EQ(InclusiveQuantile(v, 0.95), 8.8);
  EXPECT_DOUBLE_EQ(InclusiveQuantile(v, 0), 1);
  EXPECT_DOUBLE_EQ(InclusiveQuantile(v, 1), 10);
}

TEST(RateStatsTest, Lag1OfAlternatingAndConstantSeries) {
  EXPECT_DOUBLE_EQ(Lag1Autocorrelation({5, 5, 5, 5}), 0);
  // 1, -1, 1, -1: sum of products -3 over sum of squares 4.
  EXPECT_DOUBLE_EQ(Lag1Autocorrelation({1, -1, 1, -1}), -0.75);
}

TEST(RateStatsTest, IntervalRatesCountDeliveriesInTheReadmesWindows) {
  MahimahiTrace t;
  t.path = "t";
  // Window (t-1)/1000: 1..1000 -> 0, 1001..2000 -> 1; t = 0 -> window 0. 2500 is in a partial window.
  t.opportunities_ms = {0, 1, 1000, 1001, 2000, 2500};
  t.period_ms = 2500;
  absl::StatusOr<std::vector<double>> r = IntervalRatesMbit(t, 1000);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 2u);
  EXPECT_DOUBLE_EQ((*r)[0], 3 * 0.012);
  EXPECT_DOUBLE_EQ((*r)[1], 2 * 0.012);
  t.period_ms = 999;
  EXPECT_THAT(Message(IntervalRatesMbit(t, 1000).status()), HasSubstr("less than one interval of 1000 ms"));
}

// The README's conversion rule, exactly: 1 Mbit/s gains 10^6 millibits a ms; a packet is 1.2e7 millibits, so
// 1.2 Mbit/s delivers one packet every 10 ms (at ms 10, 20, ...), and the period is intervals x interval_ms.
TEST(RatesToTraceTest, FollowsTheReadmesCreditRule) {
  absl::StatusOr<MahimahiTrace> t = RatesToTrace({1.2, 0, 0}, 1000, "x");
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->opportunities_ms.size(), 101u);  // 100 in the first second, then the period marker 3000
  EXPECT_EQ(t->opportunities_ms[0], 10u);
  EXPECT_EQ(t->opportunities_ms[99], 1000u);
  EXPECT_EQ(t->opportunities_ms[100], 3000u);
  EXPECT_EQ(t->period_ms, 3000u);
  // 24 Mbit/s: two packets each ms, the timestamp repeated.
  absl::StatusOr<MahimahiTrace> fast = RatesToTrace({24}, 1000, "y");
  ASSERT_TRUE(fast.ok());
  ASSERT_EQ(fast->opportunities_ms.size(), 2000u);
  EXPECT_EQ(fast->opportunities_ms[0], 1u);
  EXPECT_EQ(fast->opportunities_ms[1], 1u);
  EXPECT_THAT(Message(RatesToTrace({-1}, 1000, "z").status()), HasSubstr("rate -1 Mbit/s is not >= 0"));
  // 10^6 Mbit/s for 3600 s is 3e11 opportunities: refused before anything is allocated.
  EXPECT_THAT(Message(RatesToTrace(std::vector<double>(3600, 1e6), 1000, "w").status()),
              HasSubstr("shorten duration_s"));
}

TEST(GenerateTest, TheSameSeedGivesTheSameTraceAndAnotherSeedAnother) {
  RateProcess p = Process({1, 2, 4, 8, 16}, 0.6, 60);
  absl::StatusOr<MahimahiTrace> a = GenerateTrace(p);
  absl::StatusOr<MahimahiTrace> b = GenerateTrace(p);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(a->opportunities_ms, b->opportunities_ms);
  EXPECT_EQ(a->period_ms, 60'000u);
  EXPECT_THAT(a->path, HasSubstr("seed 1"));
  p.seed = 2;
  absl::StatusOr<MahimahiTrace> c = GenerateTrace(p);
  ASSERT_TRUE(c.ok());
  EXPECT_NE(a->opportunities_ms, c->opportunities_ms);
  EXPECT_THAT(c->path, HasSubstr("seed 2"));
}

// The generated trace carries the generated rates: each interval's packet count is rate x 1000/12 within one
// packet (the credit carries at most one packet's worth across an interval boundary).
TEST(GenerateTest, TheTraceCarriesTheGeneratedRatesWithinOnePacket) {
  const RateProcess p = Process({0, 3, 9, 12, 20}, 0.5, 60);
  const std::vector<double> rates = GenerateIntervalRates(p, p.seed, 60);
  absl::StatusOr<MahimahiTrace> t = GenerateTrace(p);
  ASSERT_TRUE(t.ok());
  absl::StatusOr<std::vector<double>> measured = IntervalRatesMbit(*t, 1000);
  ASSERT_TRUE(measured.ok());
  ASSERT_EQ(measured->size(), rates.size());
  for (size_t i = 0; i < rates.size(); ++i) {
    // The last interval also holds the period marker: one more packet at most.
    EXPECT_NEAR((*measured)[i], rates[i], 0.012 * (i + 1 == rates.size() ? 2 : 1) + 1e-9) << i;
  }
}

// The Gaussian coefficient is found so that the mapped rates have the asked lag-1 correlation: the quadrature
// is exact to ~1e-6 and the bisection to 1e-9, so 0.01 can only fail if the mapping is wrong.
TEST(GenerateTest, GaussianCoefficientCompensatesTheQuantileMapping) {
  const std::vector<double> linear = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  const std::vector<double> skewed = {0, 0, 0, 0.5, 1, 2, 4, 8, 30, 100, 500};
  EXPECT_NEAR(GaussianLag1For(skewed, 0), 0, 0.01);
  // A skewed map loses correlation, so the Gaussian one must be larger than asked.
  EXPECT_GT(GaussianLag1For(skewed, 0.5), 0.55);
  // For a uniform marginal the answer is known in closed form: corr(Phi(X), Phi(Y)) = (6 / pi) asin(rho / 2),
  // so rho = 2 sin(pi target / 6) = 0.5176 for 0.5.
  EXPECT_NEAR(GaussianLag1For(linear, 0.5), 2 * std::sin(std::numbers::pi * 0.5 / 6), 0.002);
}

// Long runs of a process have its statistics. Mean and quantiles do not depend on the seed (rates are assigned
// by rank: the sorted series is Q(k / (n - 1))), so they are checked tightly: the sample mean of Q at n evenly
// spaced points differs from Q's integral by under range / n, and an inclusive quantile of those points lies on Q
// up to the curvature at one breakpoint. Lag-1 depends on the seed: its standard error at 20,000 intervals is
// about sqrt((1 - phi^2) / n) < 0.006, and 0.04 is over six of those (the seed is fixed, so the test is
// deterministic anyway).
TEST(GenerateTest, LongRunsHaveTheProcessStatistics) {
  for (const RateProcess& p :
       {Process({2, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 13.5, 14, 14.5, 15, 15.5, 16, 16.5, 17, 17.5, 18}, 0.62),
        Process({0, 0, 0, 1, 5, 20, 50, 80, 100, 115, 130, 160, 200, 250, 300, 350, 400, 450, 500, 525, 600}, 0.8)}) {
    const std::vector<double> rates = GenerateIntervalRates(p, 7, 20'000);
    const RateStats s = ComputeRateStats(rates);
    const double spread = p.quantiles_mbit.back() - p.quantiles_mbit.front();
    // The process's own mean: the average of the piecewise-linear quantile function (trapezoids).
    double mean = 0;
    for (size_t i = 0; i + 1 < p.quantiles_mbit.size(); ++i) {
      mean += 0.5 * (p.quantiles_mbit[i] + p.quantiles_mbit[i + 1]) / (p.quantiles_mbit.size() - 1);
    }
    EXPECT_NEAR(s.mean_mbit, mean, 0.001 * spread);
    EXPECT_NEAR(s.p5_mbit, p.quantiles_mbit[1], 0.001 * spread);
    EXPECT_NEAR(s.median_mbit, p.quantiles_mbit[10], 0.001 * spread);
    EXPECT_NEAR(s.p95_mbit, p.quantiles_mbit[19], 0.001 * spread);
    // Another seed orders the same values differently.
    std::vector<double> a = rates, b = GenerateIntervalRates(p, 8, 20'000);
    EXPECT_NE(a, b);
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    EXPECT_EQ(a, b);
    EXPECT_NEAR(s.lag1, p.lag1_autocorrelation, 0.04);
  }
}

TEST(ValidateTest, RefusesEachBadFigureNamingItAndWhatIsAllowed) {
  RateProcess p = Process({1, 2}, 0.5);
  EXPECT_TRUE(ValidateRateProcess(p).ok());
  p.lag1_autocorrelation = 1;
  EXPECT_THAT(Message(ValidateRateProcess(p)), HasSubstr("lag1_autocorrelation 1 is out of range; allowed: -1 <"));
  p = Process({1}, 0);
  EXPECT_THAT(Message(ValidateRateProcess(p)), HasSubstr("quantiles_mbit has 1 values; allowed: 2 to 1001"));
  p = Process({3, 2}, 0);
  EXPECT_THAT(Message(ValidateRateProcess(p)), HasSubstr("quantiles_mbit[1] = 2 is below quantiles_mbit[0] = 3"));
  p = Process({-1, 2}, 0);
  EXPECT_THAT(Message(ValidateRateProcess(p)), HasSubstr("quantiles_mbit[0] = -1 is out of range"));
  p = Process({0, 0}, 0);
  EXPECT_THAT(Message(ValidateRateProcess(p)), HasSubstr("all 0"));
  p = Process({1, 2}, 0, 0);
  EXPECT_THAT(Message(ValidateRateProcess(p)), HasSubstr("duration_s 0 is out of range"));
  p = Process({1, 2}, 0);
  p.interval_ms = 0;
  EXPECT_THAT(Message(ValidateRateProcess(p)), HasSubstr("interval_ms 0 is out of range"));
}

// ../shared/traces/stats.json (JSON, which yaml-cpp reads): each trace's mean, p5, median, p95 in Mbit/s.
YAML::Node SharedStats() { return YAML::LoadFile((SharedTraces() / "stats.json").string()); }

// The fit of every measured trace reproduces stats.json: the same 1 s windows and the same interpolation as
// convert.py, so only floating-point rounding may differ. The gzip-compressed traces are not read here (the
// library reads plain files); the shipped-profile test below checks their fits against stats.json.
TEST(FitTest, TheMeasuredTracesFitsReproduceStatsJson) {
  ASSERT_TRUE(std::filesystem::exists(SharedTraces() / "stats.json"))
      << SharedTraces() << " is missing: the measured traces live beside the repository in ../shared/traces";
  const YAML::Node stats = SharedStats();
  for (const char* name :
       {"5g-sa-srsran_up_indoor-20ft", "5g-sa-srsran_up_indoor-100ft", "lte_up_driving", "lte_down_driving"}) {
    absl::StatusOr<MahimahiTrace> trace = LoadMahimahiTrace(SharedTraces() / StrCat(name, ".mahi"));
    ASSERT_TRUE(trace.ok()) << trace.status();
    absl::StatusOr<RateProcess> p = FitRateProcess(*trace, 1000, name);
    ASSERT_TRUE(p.ok()) << p.status();
    ASSERT_EQ(p->quantiles_mbit.size(), 41u);  // p0, p2.5, ..., p100
    const YAML::Node s = stats[name];
    ASSERT_TRUE(s.IsMap()) << name;
    EXPECT_EQ(p->duration_s, s["windows"].as<uint64_t>()) << name;
    EXPECT_NEAR(p->quantiles_mbit[2], s["p5_mbps"].as<double>(), 1e-9) << name;
    EXPECT_NEAR(p->quantiles_mbit[20], s["median_mbps"].as<double>(), 1e-9) << name;
    EXPECT_NEAR(p->quantiles_mbit[38], s["p95_mbps"].as<double>(), 1e-9) << name;
    absl::StatusOr<std::vector<double>> rates = IntervalRatesMbit(*trace, 1000);
    ASSERT_TRUE(rates.ok());
    EXPECT_NEAR(ComputeRateStats(*rates).mean_mbit, s["mean_mbps"].as<double>(), 1e-9) << name;
  }
  // And the README's table for the SDR uplink, as printed there (rounded to 0.01).
  absl::StatusOr<MahimahiTrace> up = LoadMahimahiTrace(SharedTraces() / "5g-sa-srsran_up_indoor-20ft.mahi");
  ASSERT_TRUE(up.ok());
  absl::StatusOr<RateProcess> p = FitRateProcess(*up, 1000, "srsran up 20ft");
  ASSERT_TRUE(p.ok());
  EXPECT_NEAR(p->quantiles_mbit[2], 5.47, 0.005);
  EXPECT_NEAR(p->quantiles_mbit[20], 12.80, 0.005);
  EXPECT_NEAR(p->quantiles_mbit[38], 17.90, 0.005);
  EXPECT_THAT(RateProcessToYamlFlow(*p), HasSubstr("quantiles_mbit: [2.988, "));
}

// Every shipped profile's generated traces have the statistics of the trace its process was fitted from. All of
// these figures are seed-independent (rates are assigned by rank; rate_process.h), so the bounds are arguments,
// not luck:
//   - a quantile of n generated intervals lies between Q(p - 1/(n-1)) and Q(p + 1/(n-1)) (the sorted series is
//     Q(k/(n-1))), plus two packets a second (0.024 Mbit/s) for the credit rule's rounding;
//   - the mean is that of Q through 41 points, which overstates heavy tails a little: 2% at most for the shipped
//     traces (LTE downlink), so 3%;
//   - the lag-1 autocorrelation depends on the seed; it is checked on 20,000 intervals of the same process, where
//     its standard error is under 0.006: 0.04 is over six of those.
TEST(ShippedProfilesTest, GeneratedTracesHaveTheirSourcesStatistics) {
  ASSERT_TRUE(std::filesystem::exists(SharedTraces() / "stats.json")) << SharedTraces() << " is missing";
  const YAML::Node stats = SharedStats();
  const std::filesystem::path dir = std::filesystem::path(FL_SOURCE_DIR) / "experiments/profiles/links";
  int fitted = 0;
  for (const char* profile : {"5g-sa-sdr", "5g-midband", "5g-mmwave", "lte"}) {
    absl::StatusOr<LinkProfile> p = LoadLinkProfile(dir / StrCat(profile, ".yaml"));
    ASSERT_TRUE(p.ok()) << p.status();
    for (const LinkDirection* d : {&p->uplink, &p->downlink}) {
      if (!d->has_rate_process) continue;
      ++fitted;
      const RateProcess& rp = d->rate_process;
      // "../shared/traces/<name>.mahi[.gz] (fitted)" names the stats.json entry.
      std::string name = rp.source.substr(rp.source.rfind('/') + 1);
      name = name.substr(0, name.find(".mahi"));
      const YAML::Node s = stats[name];
      ASSERT_TRUE(s.IsMap()) << profile << ": " << rp.source;
      absl::StatusOr<std::vector<double>> rates = IntervalRatesMbit(d->trace, rp.interval_ms);
      ASSERT_TRUE(rates.ok());
      const RateStats g = ComputeRateStats(*rates);
      ASSERT_EQ(g.intervals, rp.duration_s);
      const double step = 1.0 / static_cast<double>(g.intervals - 1);
      const auto bound = [&](double q) {
        return QuantileFunction(rp.quantiles_mbit, q + step) - QuantileFunction(rp.quantiles_mbit, q - step) + 0.024;
      };
      const std::string what = StrCat(profile, " ", name);
      EXPECT_NEAR(g.p5_mbit, s["p5_mbps"].as<double>(), bound(0.05)) << what;
      EXPECT_NEAR(g.median_mbit, s["median_mbps"].as<double>(), bound(0.5)) << what;
      EXPECT_NEAR(g.p95_mbit, s["p95_mbps"].as<double>(), bound(0.95)) << what;
      EXPECT_NEAR(g.mean_mbit, s["mean_mbps"].as<double>(), 0.03 * s["mean_mbps"].as<double>()) << what;
      const RateStats long_run = ComputeRateStats(GenerateIntervalRates(rp, rp.seed, 20'000));
      EXPECT_NEAR(long_run.lag1, rp.lag1_autocorrelation, 0.04) << what;
    }
    // Deterministic: the same profile gives the same traces.
    absl::StatusOr<LinkProfile> again = LoadLinkProfile(dir / StrCat(profile, ".yaml"));
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->uplink.trace, p->uplink.trace) << profile;
    EXPECT_EQ(again->downlink.trace, p->downlink.trace) << profile;
  }
  EXPECT_EQ(fitted, 6);  // 5g-sa-sdr both ways, the two commercial 5G downlinks, LTE both ways
}

}  // namespace
}  // namespace fl::emulation
