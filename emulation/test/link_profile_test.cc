#include "fl/emulation/link_profile.h"

#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "fl/core/str_cat.h"
#include "fl/testing/scratch_dir.h"

namespace fl::emulation {
namespace {

using ::testing::HasSubstr;

std::string Message(const absl::Status& s) { return std::string(ToStd(s.message())); }

class LinkProfileFileTest : public ::testing::Test {
 protected:
  std::filesystem::path Write(const std::string& name, const std::string& text) {
    const auto path = dir_.path() / name;
    std::ofstream(path) << text;
    return path;
  }
  fl::testing::ScratchDir dir_{"link_profile"};
};

TEST(ParseRateTest, AcceptsTcStyleUnits) {
  EXPECT_DOUBLE_EQ(*ParseRate("100mbit"), 100e6);
  EXPECT_DOUBLE_EQ(*ParseRate("2.5gbit"), 2.5e9);
  EXPECT_DOUBLE_EQ(*ParseRate("800kbit"), 800e3);
  EXPECT_DOUBLE_EQ(*ParseRate("1000bit"), 1000);
  EXPECT_DOUBLE_EQ(*ParseRate("12345"), 12345);
  EXPECT_DOUBLE_EQ(*ParseRate(" 15 MBit "), 15e6);
}

TEST(ParseRateTest, RejectsNegativeZeroUnknownAndByteUnits) {
  EXPECT_THAT(Message(ParseRate("-5mbit").status()), HasSubstr("must be positive"));
  EXPECT_THAT(Message(ParseRate("0").status()), HasSubstr("must be positive"));
  EXPECT_THAT(Message(ParseRate("5 furlongs").status()), HasSubstr("unknown unit 'furlongs'"));
  EXPECT_THAT(Message(ParseRate("10mbps").status()), HasSubstr("write mbit"));
  EXPECT_FALSE(ParseRate("fast").ok());
}

TEST(ParseByteSizeTest, Units) {
  EXPECT_EQ(*ParseByteSize("262144"), 262144u);
  EXPECT_EQ(*ParseByteSize("256kib"), 262144u);
  EXPECT_EQ(*ParseByteSize("1mib"), 1048576u);
  EXPECT_EQ(*ParseByteSize("64kb"), 64000u);
  EXPECT_FALSE(ParseByteSize("-1").ok());
  EXPECT_FALSE(ParseByteSize("3 parsecs").ok());
}

TEST(FormatRateTest, RoundTripsThroughParseRate) {
  for (double r : {800e3, 15e6, 100e6, 2.5e9}) EXPECT_DOUBLE_EQ(*ParseRate(FormatRate(r)), r) << r;
}

TEST_F(LinkProfileFileTest, LoadsAFullProfile) {
  Write("t.trace", "0\n5\n5\n10\n");
  const auto path = Write("wifi.yaml", R"(
description: test link
uplink:
  rate: 100mbit
  delay_ms: 3
  jitter_ms: 2
  loss: 0.001
  queue_limit: 256kib
downlink:
  trace: t.trace
  delay_ms: 1.5
)");
  auto p = LoadLinkProfile(path);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->name, "wifi");  // the file's stem when the file has no name
  EXPECT_EQ(p->description, "test link");
  EXPECT_DOUBLE_EQ(p->uplink.rate_bps, 100e6);
  EXPECT_DOUBLE_EQ(p->uplink.delay_ms, 3);
  EXPECT_DOUBLE_EQ(p->uplink.jitter_ms, 2);
  EXPECT_DOUBLE_EQ(p->uplink.loss, 0.001);
  EXPECT_EQ(p->uplink.queue_limit_bytes, 262144u);
  ASSERT_TRUE(p->downlink.has_trace);
  EXPECT_EQ(p->downlink.trace.opportunities_ms, (std::vector<uint64_t>{0, 5, 5, 10}));
  EXPECT_EQ(p->downlink.trace.period_ms, 10u);
  // 4 opportunities of 1500 bytes every 10 ms.
  EXPECT_DOUBLE_EQ(p->downlink.NominalRateBps(), 4 * 1500 * 8 / 0.010);
  EXPECT_DOUBLE_EQ(p->NominalRttMs(), 4.5);
}

TEST_F(LinkProfileFileTest, EmptyDirectionIsUnshaped) {
  auto p = LoadLinkProfile(Write("x.yaml", "name: open\nuplink: {}\ndownlink: {}\n"));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->name, "open");
  EXPECT_TRUE(p->uplink.Unlimited());
  EXPECT_FALSE(p->downlink.HasDelay());
}

TEST_F(LinkProfileFileTest, UnknownKeyNamesFileFieldLineAndAllowedKeys) {
  const auto path = Write("bad.yaml", "name: x\nuplink:\n  rate: 1mbit\n  latency_ms: 3\ndownlink: {}\n");
  auto p = LoadLinkProfile(path);
  ASSERT_FALSE(p.ok());
  const std::string m = Message(p.status());
  EXPECT_THAT(m, HasSubstr(StrCat(path.string(), ":4:")));
  EXPECT_THAT(m, HasSubstr("uplink.latency_ms: unknown key"));
  EXPECT_THAT(m, HasSubstr("allowed: rate, delay_ms, jitter_ms, loss, burst_loss, queue_limit, queue_limit_packets, "
                           "reorder, trace, rate_process"));
}

TEST_F(LinkProfileFileTest, NegativeRateIsAnError) {
  const auto path = Write("neg.yaml", "uplink: {}\ndownlink:\n  rate: -100mbit\n");
  auto p = LoadLinkProfile(path);
  ASSERT_FALSE(p.ok());
  const std::string m = Message(p.status());
  EXPECT_THAT(m, HasSubstr(StrCat(path.string(), ":3: downlink.rate:")));
  EXPECT_THAT(m, HasSubstr("must be positive"));
  EXPECT_THAT(m, HasSubstr("allowed: a positive rate"));
}

TEST_F(LinkProfileFileTest, WrongTypesAreErrors) {
  auto p = LoadLinkProfile(Write("t1.yaml", "uplink: fast\ndownlink: {}\n"));
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(Message(p.status()), HasSubstr(":1: uplink: expected a map, got \"fast\""));

  p = LoadLinkProfile(Write("t2.yaml", "uplink: {}\ndownlink:\n  delay_ms: [1, 2]\n"));
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(Message(p.status()), HasSubstr(":3: downlink.delay_ms: expected a number, got a list"));

  p = LoadLinkProfile(Write("t3.yaml", "uplink: {}\ndownlink:\n  delay_ms: 3ms\n"));
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(Message(p.status()), HasSubstr("downlink.delay_ms: expected a number, got \"3ms\""));

  p = LoadLinkProfile(Write("t4.yaml", "uplink:\n  delay_ms: -1\ndownlink: {}\n"));
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(Message(p.status()), HasSubstr(":2: uplink.delay_ms: value -1 is out of range"));

  p = LoadLinkProfile(Write("t5.yaml", "uplink:\n  loss: 1.5\ndownlink: {}\n"));
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(Message(p.status()), HasSubstr("uplink.loss: value 1.5 is out of range; allowed: a fraction"));
}

TEST_F(LinkProfileFileTest, MissingDirectionAndBadYaml) {
  auto p = LoadLinkProfile(Write("m.yaml", "name: x\nuplink: {}\n"));
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(Message(p.status()), HasSubstr("downlink: missing"));

  p = LoadLinkProfile(Write("y.yaml", "uplink: {\ndownlink: [\n"));
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(Message(p.status()), HasSubstr("not valid YAML"));

  p = LoadLinkProfile(dir_.path() / "absent.yaml");
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(Message(p.status()), HasSubstr("does not exist"));
}

TEST_F(LinkProfileFileTest, QueueLimitJitterAndUnlimitedRate) {
  auto p = LoadLinkProfile(Write("q1.yaml", "uplink:\n  queue_limit: 1kb\ndownlink: {}\n"));
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(Message(p.status()), HasSubstr(":2: uplink.queue_limit: value 1kb is below one packet; allowed: a size"));

  p = LoadLinkProfile(Write("q2.yaml", "uplink: {}\ndownlink:\n  queue_limit: [1]\n"));
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(Message(p.status()), HasSubstr(":3: downlink.queue_limit: expected a size, got a list"));

  p = LoadLinkProfile(Write("j.yaml", "uplink:\n  jitter_ms: 2\ndownlink: {}\n"));
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(Message(p.status()), HasSubstr(":2: uplink.jitter_ms: jitter without a delay_ms"));

  p = LoadLinkProfile(Write("u.yaml", "uplink:\n  rate: Unlimited\n  jitter_ms: 2\n  delay_ms: 0\ndownlink: {}\n"));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->uplink.Unlimited());
  EXPECT_DOUBLE_EQ(p->uplink.jitter_ms, 2);
}

TEST_F(LinkProfileFileTest, TraceErrorsNameTheTraceLine) {
  Write("bad.trace", "0\n7\n3\n");
  auto p = LoadLinkProfile(Write("p.yaml", "uplink:\n  trace: bad.trace\ndownlink: {}\n"));
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(Message(p.status()), HasSubstr("uplink.trace"));
  EXPECT_THAT(Message(p.status()), HasSubstr("bad.trace:3: timestamp 3 is smaller than the previous one"));

  Write("words.trace", "0\nten\n");
  p = LoadLinkProfile(Write("q.yaml", "uplink:\n  trace: words.trace\ndownlink: {}\n"));
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(Message(p.status()), HasSubstr("words.trace:2: 'ten' is not a non-negative integer"));

  p = LoadLinkProfile(Write("r.yaml", "uplink:\n  trace: nowhere.trace\ndownlink: {}\n"));
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(Message(p.status()),
              HasSubstr("trace file " + (dir_.path() / "nowhere.trace").string() + ": no such file"));

  Write("ok.trace", "1\n2\n");
  p = LoadLinkProfile(Write("s.yaml", "uplink:\n  trace: ok.trace\n  rate: 1mbit\ndownlink: {}\n"));
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(Message(p.status()), HasSubstr("either a rate or a trace"));
}

TEST(ParseLinkProfileTest, InlineNodeUsesTheCallersContextInErrors) {
  const YAML::Node manifest =
      YAML::Load("clients:\n  - link:\n      uplink: {rate: 1mbit}\n      downlink: {bogus: 1}\n");
  YamlContext ctx;
  ctx.file = "experiments/m.yaml";
  ctx.field_path = "clients[0].link";
  auto p = ParseLinkProfile(manifest["clients"][0]["link"], ctx);
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(Message(p.status()), HasSubstr("experiments/m.yaml:4: clients[0].link.downlink.bogus: unknown key"));

  const YAML::Node good = YAML::Load("uplink: {rate: 1mbit}\ndownlink: {rate: 2mbit, delay_ms: 4}\n");
  auto q = ParseLinkProfile(good, ctx);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_DOUBLE_EQ(q->downlink.rate_bps, 2e6);
  EXPECT_EQ(q->source, "experiments/m.yaml");
}

TEST_F(LinkProfileFileTest, YamlOutputParsesBackToTheSameProfile) {
  auto p = LoadLinkProfile(Write("w.yaml",
                                 "name: w\nuplink: {rate: 15mbit, delay_ms: 12, jitter_ms: 4, loss: 0.001}\n"
                                 "downlink: {rate: 150mbit, delay_ms: 12, queue_limit: 100000}\n"));
  ASSERT_TRUE(p.ok()) << p.status();
  auto q = ParseLinkProfile(YAML::Load(LinkProfileToYaml(*p)), YamlContext{});
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->name, "w");
  EXPECT_DOUBLE_EQ(q->uplink.rate_bps, 15e6);
  EXPECT_DOUBLE_EQ(q->uplink.jitter_ms, 4);
  EXPECT_DOUBLE_EQ(q->uplink.loss, 0.001);
  EXPECT_DOUBLE_EQ(q->downlink.rate_bps, 150e6);
  EXPECT_EQ(q->downlink.queue_limit_bytes, 100000u);
}

TEST_F(LinkProfileFileTest, PacketBackendFieldsParseAndRoundTrip) {
  auto p = LoadLinkProfile(Write("pk.yaml",
                                 "uplink:\n  rate: 10mbit\n  delay_ms: 10000\n  loss: 0.01\n"
                                 "  burst_loss: {p_good_to_bad: 0.001, p_bad_to_good: 0.25, loss_good: 0, loss_bad: "
                                 "0.5}\n  queue_limit_packets: 64\n  reorder: true\ndownlink: {}\n"));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_DOUBLE_EQ(p->uplink.delay_ms, 10000);
  EXPECT_DOUBLE_EQ(p->uplink.burst_loss.p_good_to_bad, 0.001);
  EXPECT_DOUBLE_EQ(p->uplink.burst_loss.p_bad_to_good, 0.25);
  EXPECT_DOUBLE_EQ(p->uplink.burst_loss.loss_bad, 0.5);
  EXPECT_EQ(p->uplink.queue_limit_packets, 64u);
  EXPECT_TRUE(p->uplink.reorder);
  EXPECT_FALSE(p->downlink.reorder);
  EXPECT_EQ(p->downlink.burst_loss, BurstLoss{});
  auto q = ParseLinkProfile(YAML::Load(LinkProfileToYaml(*p)), YamlContext{});
  ASSERT_TRUE(q.ok()) << q.status() << "\n" << LinkProfileToYaml(*p);
  q->source = p->source;
  q->name = p->name;
  EXPECT_EQ(*q, *p);
}

TEST_F(LinkProfileFileTest, PacketBackendFieldsRefuseBadValuesNamingFieldValueAndAllowed) {
  struct Case {
    const char* yaml;
    const char* message;
  };
  for (const Case c : {
           Case{"  burst_loss: {p_good_to_bad: 1.5}\n",
                "uplink.burst_loss.p_good_to_bad: value 1.5 is out of range; allowed: a probability per packet"},
           Case{"  burst_loss: {p_good_to_bad: 0.1, p_bad_to_good: 0}\n",
                "uplink.burst_loss.p_bad_to_good: p_bad_to_good 0 with p_good_to_bad 0.1 never leaves the bad state; "
                "allowed: 0 < p_bad_to_good <= 1 when p_good_to_bad > 0"},
           Case{"  burst_loss: {loss_good: -0.1}\n", "uplink.burst_loss.loss_good: value -0.1 is out of range"},
           Case{"  burst_loss: {loss_bad: 2}\n", "uplink.burst_loss.loss_bad: value 2 is out of range"},
           Case{"  burst_loss: {p_loss: 2}\n", "uplink.burst_loss.p_loss: unknown key"},
           Case{"  burst_loss: 0.1\n", "uplink.burst_loss: expected a map"},
           Case{"  queue_limit_packets: 0\n",
                "uplink.queue_limit_packets: value 0 is out of range; allowed: an integer number of packets, 1 <="},
           Case{"  queue_limit_packets: 2.5\n", "uplink.queue_limit_packets: expected an integer"},
           Case{"  reorder: maybe\n", "uplink.reorder: expected"},
           Case{"  delay_ms: 10001\n",
                "uplink.delay_ms: value 10001 is out of range; allowed: a number of "
                "milliseconds, 0 <= delay_ms <= 10000"},
           Case{"  delay_ms: 1\n  jitter_ms: 20000\n", "uplink.jitter_ms: value 20000 is out of range"},
       }) {
    auto p = LoadLinkProfile(Write("bad.yaml", StrCat("uplink:\n", c.yaml, "downlink: {}\n")));
    ASSERT_FALSE(p.ok()) << c.yaml;
    EXPECT_THAT(Message(p.status()), HasSubstr(c.message)) << c.yaml;
  }
}

constexpr char kProcess[] =
    "{interval_ms: 1000, duration_s: 30, lag1_autocorrelation: 0.6, quantiles_mbit: [2, 5, 10, 15, 18], "
    "source: \"test\", seed: 3}";

TEST_F(LinkProfileFileTest, RateProcessBecomesAGeneratedTraceAndRoundTrips) {
  auto p = LoadLinkProfile(Write(
      "rp.yaml", StrCat("uplink:\n  rate_process: ", kProcess, "\n  delay_ms: 12\n", "downlink: {rate: 40mbit}\n")));
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE(p->uplink.has_trace);
  ASSERT_TRUE(p->uplink.has_rate_process);
  EXPECT_EQ(p->uplink.trace.period_ms, 30'000u);
  EXPECT_THAT(p->uplink.trace.path, HasSubstr("rate_process(seed 3"));
  EXPECT_THAT(p->uplink.trace.path, HasSubstr("from test"));
  EXPECT_EQ(p->uplink.rate_process.quantiles_mbit, (std::vector<double>{2, 5, 10, 15, 18}));
  // Between the smallest and the largest quantile on average; the exact figures are rate_process_test's.
  EXPECT_GT(p->uplink.NominalRateBps(), 2e6);
  EXPECT_LT(p->uplink.NominalRateBps(), 18e6);
  // Written back as the process (not the generated trace's name), and read back to the same trace.
  const std::string yaml = LinkProfileToYaml(*p);
  EXPECT_THAT(yaml, HasSubstr("rate_process:"));
  auto q = ParseLinkProfile(YAML::Load(yaml), YamlContext{});
  ASSERT_TRUE(q.ok()) << q.status() << "\n" << yaml;
  EXPECT_EQ(q->uplink, p->uplink);
}

TEST_F(LinkProfileFileTest, RateProcessRefusesBadFiguresAndOtherCapacities) {
  struct Case {
    std::string yaml;
    const char* message;
  };
  for (const Case& c : {
           Case{StrCat("  rate: 1mbit\n  rate_process: ", kProcess, "\n"),
                "uplink.rate_process: a direction has one of rate, trace and rate_process; this one also has rate"},
           Case{StrCat("  trace: ok.trace\n  rate_process: ", kProcess, "\n"), "this one also has trace"},
           Case{"  rate_process: {lag1_autocorrelation: 0.5, quantiles_mbit: [3, 1]}\n",
                "uplink.rate_process: quantiles_mbit[1] = 1 is below quantiles_mbit[0] = 3; allowed: non-decreasing"},
           Case{"  rate_process: {lag1_autocorrelation: 0.5, quantiles_mbit: [1]}\n",
                "quantiles_mbit has 1 values; allowed: 2 to 1001"},
           Case{"  rate_process: {lag1_autocorrelation: 0.5, quantiles_mbit: [1, fast]}\n",
                "uplink.rate_process.quantiles_mbit[1]: expected a number, got \"fast\""},
           Case{"  rate_process: {lag1_autocorrelation: 0.5, quantiles_mbit: 3}\n",
                "uplink.rate_process.quantiles_mbit: expected a list of numbers"},
           Case{"  rate_process: {lag1_autocorrelation: 1, quantiles_mbit: [1, 2]}\n",
                "uplink.rate_process.lag1_autocorrelation: value 1 is out of range; allowed: the lag-1"},
           Case{"  rate_process: {quantiles_mbit: [1, 2]}\n", "uplink.rate_process.lag1_autocorrelation: missing"},
           Case{"  rate_process: {lag1_autocorrelation: 0}\n", "uplink.rate_process.quantiles_mbit: missing"},
           Case{"  rate_process: {lag1_autocorrelation: 0, quantiles_mbit: [0, 0]}\n", "all 0"},
           Case{"  rate_process: {lag1_autocorrelation: 0, quantiles_mbit: [1, 2], duration_s: 0}\n",
                "uplink.rate_process.duration_s: value 0 is out of range"},
           Case{"  rate_process: {lag1_autocorrelation: 0, quantiles_mbit: [1, 2], interval_ms: 0}\n",
                "uplink.rate_process.interval_ms: value 0 is out of range"},
           Case{"  rate_process: {lag1_autocorrelation: 0, quantiles_mbit: [1, 2], period: 3}\n",
                "uplink.rate_process.period: unknown key"},
           Case{"  rate_process: {lag1_autocorrelation: 0, quantiles_mbit: [900000, 1000000], duration_s: 86400}\n",
                "shorten duration_s"},
       }) {
    Write("ok.trace", "1\n2\n");
    auto p = LoadLinkProfile(Write("bad.yaml", StrCat("uplink:\n", c.yaml, "downlink: {}\n")));
    ASSERT_FALSE(p.ok()) << c.yaml;
    EXPECT_THAT(Message(p.status()), HasSubstr(c.message)) << c.yaml;
  }
}

TEST_F(LinkProfileFileTest, BadTracesAreRefusedNamingFileLineValueAndWhatIsAllowed) {
  struct Case {
    const char* text;
    const char* message;
  };
  for (const Case c : {
           Case{"", "a trace needs at least one line and a last timestamp above 0"},
           Case{"0\n0\n", "a trace needs at least one line and a last timestamp above 0"},
           Case{"1\n5\n3\n",
                "t.trace:3: timestamp 3 is smaller than the previous one (5); timestamps must not "
                "decrease"},
           Case{"1\n2.5\n", "t.trace:2: '2.5' is not a non-negative integer ms timestamp"},
           Case{"1\n-4\n", "t.trace:2: '-4' is not a non-negative integer"},
           Case{"1\n99999999999999999999999\n", "t.trace:2: '99999999999999999999999' is not a non-negative"},
           Case{"1\n\n2\n", "t.trace:2: an empty line; every line must hold one integer ms timestamp"},
       }) {
    const auto path = Write("t.trace", c.text);
    absl::StatusOr<MahimahiTrace> t = LoadMahimahiTrace(path);
    ASSERT_FALSE(t.ok()) << c.text;
    EXPECT_THAT(Message(t.status()), HasSubstr(c.message)) << c.text;
    EXPECT_THAT(Message(t.status()), HasSubstr(path.string())) << c.text;
  }
  // One byte over the limit (a sparse file: nothing is written) is refused before it is read.
  const auto big = Write("big.trace", "");
  std::filesystem::resize_file(big, kMaxTraceBytes + 1);
  absl::StatusOr<MahimahiTrace> t = LoadMahimahiTrace(big);
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(Message(t.status()), HasSubstr(StrCat(kMaxTraceBytes + 1, " bytes, over the limit of ", kMaxTraceBytes)));
  // A final newline is not an empty line.
  EXPECT_TRUE(LoadMahimahiTrace(Write("ok.trace", "1\n2\n")).ok());
  EXPECT_TRUE(LoadMahimahiTrace(Write("ok2.trace", "1\n2")).ok());
}

// The repository's profiles load, and carry the starting values of ../shared/REFERENCES.md.
TEST(RepositoryProfilesTest, StartingProfilesLoadWithTheReferenceValues) {
  const std::filesystem::path dir = std::filesystem::path(FL_SOURCE_DIR) / "experiments/profiles/links";
  struct Expected {
    const char* name;
    double down_mbit, up_mbit, delay_ms, jitter_ms, loss;
  };
  for (const Expected e : {Expected{"ethernet", 1000, 1000, 0.1, 0, 0}, Expected{"wifi", 200, 100, 3, 2, 0.001},
                           Expected{"5g-sa", 150, 15, 12, 4, 0.001}, Expected{"5g-edge", 20, 3, 30, 15, 0.01}}) {
    auto p = LoadLinkProfile(dir / StrCat(e.name, ".yaml"));
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->name, e.name);
    EXPECT_DOUBLE_EQ(p->downlink.rate_bps, e.down_mbit * 1e6) << e.name;
    EXPECT_DOUBLE_EQ(p->uplink.rate_bps, e.up_mbit * 1e6) << e.name;
    for (const LinkDirection* d : {&p->uplink, &p->downlink}) {
      EXPECT_DOUBLE_EQ(d->delay_ms, e.delay_ms) << e.name;
      EXPECT_DOUBLE_EQ(d->jitter_ms, e.jitter_ms) << e.name;
      EXPECT_DOUBLE_EQ(d->loss, e.loss) << e.name;
    }
  }
  for (const char* r : {"10", "50", "100", "200"}) {
    auto p = LoadLinkProfile(dir / "calibration" / StrCat("rate-", r, "mbit.yaml"));
    ASSERT_TRUE(p.ok()) << p.status();
  }
}

}  // namespace
}  // namespace fl::emulation
