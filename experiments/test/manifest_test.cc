#include "fl/experiment/manifest.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "fl/core/str_cat.h"
#include "fl/testing/scratch_dir.h"

namespace fl::experiment {
namespace {

namespace fs = std::filesystem;

const fs::path kExperiments = FL_EXPERIMENTS_DIR;

// A valid manifest; tests break one thing at a time.
constexpr char kGood[] = R"(name: t
seed: 7
server:
  strategy: {name: fedadam, options: {lr: 0.03, tau: 0.001}}
  rounds: 2
  selection: {min_fit_clients: 3, min_available_clients: 3}
training: {model: "synthetic:1000:5", partition: "dirichlet:0.5", lr: 0.1}
codecs: {uplink: int8}
clients:
  - name: pi
    count: 2
    device: rpi4
    link: 5g-sa
    data_share: 0.5
  - name: box
    device: {relative_speed: 8, device_class: nuc}
    link:
      uplink: {rate: 100mbit, delay_ms: 2}
      downlink: {rate: 200mbit}
    availability: {start_delay_s: 1, leave_after_s: 30}
)";

absl::StatusOr<Manifest> Parse(const std::string& text) {
  return ParseManifest(text, "exp.yaml", kExperiments, ManifestOptions{kExperiments / "profiles"});
}

std::string Replace(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return at == std::string::npos ? text : text.replace(at, from.size(), to);
}

TEST(ManifestTest, GoodManifestResolvesProfilesAndOptions) {
  absl::StatusOr<Manifest> m = Parse(kGood);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->name, "t");
  EXPECT_EQ(m->seed, 7u);
  EXPECT_EQ(m->server.strategy, "fedadam:lr=0.03,tau=0.001");
  EXPECT_EQ(m->codecs.uplink, "int8");
  ASSERT_EQ(m->clients.size(), 2u);
  EXPECT_EQ(m->num_clients(), 3u);
  const ClientGroup& pi = m->clients[0];
  EXPECT_EQ(pi.device.name, "rpi4");
  EXPECT_EQ(pi.device.relative_speed, 1.0);
  ASSERT_TRUE(pi.link.has_value());
  EXPECT_EQ(pi.link_kind, "5g");  // from the profile's name
  EXPECT_DOUBLE_EQ(pi.link->uplink.rate_bps, 15e6);  // experiments/profiles/links/5g-sa.yaml
  EXPECT_DOUBLE_EQ(pi.data_share, 0.5);
  const ClientGroup& box = m->clients[1];
  EXPECT_DOUBLE_EQ(box.device.relative_speed, 8);
  EXPECT_EQ(box.device.device_class, "nuc");
  EXPECT_DOUBLE_EQ(box.link->uplink.rate_bps, 100e6);
  EXPECT_DOUBLE_EQ(box.start_delay_s, 1);
  EXPECT_DOUBLE_EQ(box.leave_after_s, 30);
  // host 4x a Pi 4: a Pi 4 runs 4x slower, a device faster than the host runs at host speed.
  EXPECT_DOUBLE_EQ(SlowdownFor(*m, pi.device), 4.0);
  EXPECT_DOUBLE_EQ(SlowdownFor(*m, box.device), 1.0);
}

TEST(ManifestTest, EveryShippedManifestLoads) {
  int n = 0;
  for (const auto& e : fs::recursive_directory_iterator(kExperiments)) {
    if (e.path().extension() != ".yaml" || e.path().string().find("/profiles/") != std::string::npos) continue;
    if (e.path().string().find("/diloco/") != std::string::npos) continue;  // islands manifests: docs/diloco.md
    absl::StatusOr<Manifest> m = LoadManifest(e.path());
    EXPECT_TRUE(m.ok()) << e.path() << ": " << m.status();
    ++n;
  }
  EXPECT_GE(n, 1);
}

void ExpectError(const std::string& text, const std::vector<std::string>& parts) {
  absl::StatusOr<Manifest> m = Parse(text);
  ASSERT_FALSE(m.ok()) << "accepted:\n" << text;
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << m.status();
  for (const std::string& p : parts) {
    EXPECT_NE(std::string(m.status().message()).find(p), std::string::npos)
        << "error lacks \"" << p << "\": " << m.status().message();
  }
}

TEST(ManifestTest, UnknownKeyNamesFileLinePathAndAllowedKeys) {
  ExpectError(Replace(kGood, "  rounds: 2\n", "  rounds: 2\n  round: 3\n"),
              {"exp.yaml:6:", "server.round", "unknown key", "allowed here:", "rounds"});
}

TEST(ManifestTest, WrongTypeNamesTheField) {
  ExpectError(Replace(kGood, "rounds: 2", "rounds: three"), {"exp.yaml:5:", "server.rounds", "expected an integer",
                                                              "\"three\""});
}

TEST(ManifestTest, MissingProfileListsTheKnownOnes) {
  ExpectError(Replace(kGood, "link: 5g-sa", "link: 6g"),
              {"exp.yaml:13:", "clients[0].link", "no link profile \"6g\"", "5g-sa", "ethernet", "wifi"});
  ExpectError(Replace(kGood, "device: rpi4", "device: rpi9"), {"clients[0].device", "rpi9", "rpi5"});
}

TEST(ManifestTest, NegativeRateInAnInlineLinkIsRefused) {
  absl::StatusOr<Manifest> m = Parse(Replace(kGood, "rate: 100mbit", "rate: -5mbit"));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(std::string(m.status().message()).find("clients[1].link.uplink.rate"), std::string::npos)
      << m.status();
}

TEST(ManifestTest, OutOfRangeAndUnknownValuesAreRefused) {
  ExpectError(Replace(kGood, "data_share: 0.5", "data_share: 1.5"), {"clients[0].data_share", "[1e-06, 1]"});
  ExpectError(Replace(kGood, "uplink: int8", "uplink: int7"), {"codecs.uplink", "int7", "allowed:", "fp32"});
  ExpectError(Replace(kGood, "partition: \"dirichlet:0.5\"", "partition: random"), {"training.partition"});
  ExpectError(Replace(kGood, "min_available_clients: 3", "min_available_clients: 9"),
              {"server.selection", "only 3 clients"});
  ExpectError(Replace(kGood, "name: t\n", ""), {"name", "is required"});
  ExpectError("name: [1\n", {"exp.yaml:", "not valid YAML"});
}

TEST(ManifestTest, ResolvedJsonRoundTripsWithTheProfilesItRanWith) {
  absl::StatusOr<Manifest> m = Parse(kGood);
  ASSERT_TRUE(m.ok()) << m.status();
  const std::string json = ResolvedManifestJson(*m);
  absl::StatusOr<Manifest> back = ManifestFromResolvedJson(json, m->source_yaml);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(ResolvedManifestJson(*back), json);
  EXPECT_EQ(back->clients[1].link->uplink.rate_bps, 100e6);
  EXPECT_FALSE(ManifestFromResolvedJson("{\"name\": 1}", "").ok());
}

}  // namespace
}  // namespace fl::experiment
