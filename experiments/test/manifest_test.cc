#include "fl/experiment/manifest.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <sstream>
#include <fstream>
#include <string>

#include <CLI/CLI.hpp>
#include <yaml-cpp/yaml.h>

#include "fl/core/str_cat.h"
#include "fl/experiment/runner.h"
#include "fl/server/settings.h"
#include "fl/testing/cli_parse.h"
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
  EXPECT_EQ(m->settings.seed, 7u);
  EXPECT_EQ(m->settings.strategy, "fedadam:lr=0.03,tau=0.001");
  EXPECT_EQ(m->settings.uplink_codec, "int8");
  ASSERT_EQ(m->clients.size(), 2u);
  EXPECT_EQ(m->num_clients(), 3u);
  const ClientGroup& pi = m->clients[0];
  EXPECT_EQ(pi.device.name, "rpi4");
  EXPECT_EQ(pi.device.relative_speed, 1.0);
  ASSERT_TRUE(pi.link.has_value());
  EXPECT_EQ(pi.link_kind, "5g");                     // from the profile's name
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
    // The fuzz seeds (test/corpus/) resolve their traces elsewhere: manifest_fuzz_test loads them.
    if (e.path().string().find("/test/corpus/") != std::string::npos) continue;
    // Renderers' golden outputs (Kubernetes objects), not manifests.
    if (e.path().string().find("/test/golden/") != std::string::npos) continue;
    absl::StatusOr<Manifest> m = LoadManifest(e.path());
    EXPECT_TRUE(m.ok()) << e.path() << ": " << m.status();
    ++n;
  }
  EXPECT_GE(n, 1);
}

// `fl-experiment run quickstart.yaml` from the manifest's own folder: a path without a folder.
TEST(ManifestTest, ManifestNamedWithoutAFolderLoadsFromTheCurrentOne) {
  const fs::path cwd = fs::current_path();
  fs::current_path(kExperiments);
  absl::StatusOr<Manifest> m = LoadManifest("quickstart.yaml");
  fs::current_path(cwd);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->path, (kExperiments / "quickstart.yaml").string());
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
  ExpectError(
      Replace(kGood, "  rounds: 2\n", "  rounds: 2\n  round: 3\n"),
      {"exp.yaml:6:", "server.round", "unknown key",
       "allowed: rounds, strategy, selection, evaluation, round_deadline_s, max_round_attempts, "
       "initial_model_deadline_ms, uplink_codec_policy, deadline_policy, late_discount, aggregation, buffered, "
       "secure_aggregation, privacy, updates, upload_slots, sessions, fleet, abuse, keep_checkpoints, metrics_addr"});
}

// Buffered aggregation (FedBuff): server.aggregation and server.buffered.*, passed to fl-server as its flags.
TEST(ManifestTest, BufferedAggregationFieldsAreRead) {
  absl::StatusOr<Manifest> m = Parse(Replace(kGood, "  rounds: 2\n",
                                             "  rounds: 2\n  aggregation: buffered\n  buffered: {buffer_size: 2, "
                                             "concurrency: 3, max_staleness: 4, staleness_weight: \"poly:a=1\"}\n"));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->settings.aggregation, "buffered");
  EXPECT_EQ(m->settings.buffer_size, 2u);
  EXPECT_EQ(m->settings.concurrency, 3u);
  EXPECT_EQ(m->settings.max_staleness, 4u);
  EXPECT_EQ(m->settings.staleness_weight, "poly:a=1");
  absl::StatusOr<Manifest> back = ManifestFromResolvedJson(ResolvedManifestJson(*m), m->source_yaml);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->settings, m->settings);
  absl::StatusOr<Manifest> sync = Parse(kGood);
  ASSERT_TRUE(sync.ok());
  EXPECT_EQ(sync->settings.aggregation, "synchronous");
  ExpectError(Replace(kGood, "  rounds: 2\n", "  rounds: 2\n  aggregation: async\n"),
              {"server.aggregation", "synchronous", "buffered"});
}

TEST(ManifestTest, WrongTypeNamesTheField) {
  ExpectError(Replace(kGood, "rounds: 2", "rounds: three"),
              {"exp.yaml:5:", "server.rounds: three rounds is not a whole number for setting num_rounds"});
}

TEST(ManifestTest, MissingProfileListsTheKnownOnes) {
  ExpectError(Replace(kGood, "link: 5g-sa", "link: 6g"),
              {"exp.yaml:13:", "clients[0].link", "no link profile \"6g\"", "5g-sa", "ethernet", "wifi"});
  ExpectError(Replace(kGood, "device: rpi4", "device: rpi9"), {"clients[0].device", "rpi9", "rpi5"});
}

TEST(ManifestTest, NegativeRateInAnInlineLinkIsRefused) {
  absl::StatusOr<Manifest> m = Parse(Replace(kGood, "rate: 100mbit", "rate: -5mbit"));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(std::string(m.status().message()).find("clients[1].link.uplink.rate"), std::string::npos) << m.status();
}

TEST(ManifestTest, OutOfRangeAndUnknownValuesAreRefused) {
  ExpectError(
      Replace(kGood, "data_share: 0.5", "data_share: 1.5"),
      {"clients[0].data_share", "1.5 is out of bounds for setting data_fraction (--data-fraction", "within (0, 1]"});
  ExpectError(Replace(kGood, "uplink: int8", "uplink: int7"), {"codecs.uplink", "int7", "is not allowed", "fp32"});
  ExpectError(Replace(kGood, "partition: \"dirichlet:0.5\"", "partition: random"), {"training.partition"});
  ExpectError(Replace(kGood, "min_available_clients: 3", "min_available_clients: 9"),
              {"server.selection", "only 3 clients"});
  ExpectError(Replace(kGood, "name: t\n", ""), {"name", "is required"});
  ExpectError("name: [1\n", {"exp.yaml:", "not valid YAML"});
  ExpectError(Replace(kGood, "name: t\n", "name: t\nemulation: {devices: quota}\n"),
              {"emulation.devices", "unknown value \"quota\"", "allowed: auto, duty-cycle, cpu-quota"});
}

// emulation.devices (issue 30 item 3): auto unless given, and what a run asked for is what a replay asks for.
TEST(ManifestTest, DevicesSettingDefaultsToAutoAndRoundTrips) {
  absl::StatusOr<Manifest> m = Parse(kGood);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->emulation.devices, "auto");
  m = Parse(Replace(kGood, "name: t\n", "name: t\nemulation: {devices: duty-cycle}\n"));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->emulation.devices, "duty-cycle");
  absl::StatusOr<Manifest> back = ManifestFromResolvedJson(ResolvedManifestJson(*m), m->source_yaml);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->emulation.devices, "duty-cycle");
}

TEST(ManifestTest, UplinkCodecPolicyIsPassedOnAndABadOneIsRefusedWithItsLine) {
  absl::StatusOr<Manifest> m =
      Parse(Replace(kGood, "  rounds: 2\n", "  rounds: 2\n  uplink_codec_policy: \"by-link:5g=int4,wifi=int8\"\n"));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->settings.uplink_codec_policy, "by-link:5g=int4,wifi=int8");
  absl::StatusOr<Manifest> back = ManifestFromResolvedJson(ResolvedManifestJson(*m), m->source_yaml);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->settings.uplink_codec_policy, "by-link:5g=int4,wifi=int8");
  ExpectError(Replace(kGood, "  rounds: 2\n", "  rounds: 2\n  uplink_codec_policy: \"by-link:6g=int4\"\n"),
              {"exp.yaml:6:", "server.uplink_codec_policy", "unknown link kind '6g'", "fixed, by-link:"});
}

// clients[i].secagg_drop_after_shares (fl-client --secagg-drop-after-shares, for SecAgg+'s recovery runs): read,
// kept in the resolved record, 0 when absent; refused at 1 (no survivors) and below 0, naming the line.
TEST(ManifestTest, SecAggDropAfterSharesIsReadKeptAndBoundedBelowOne) {
  absl::StatusOr<Manifest> m =
      Parse(Replace(kGood, "data_share: 0.5", "data_share: 0.5\n    secagg_drop_after_shares: 0.3"));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_DOUBLE_EQ(m->clients[0].secagg_drop_after_shares, 0.3);
  EXPECT_DOUBLE_EQ(m->clients[1].secagg_drop_after_shares, 0);
  ExpectError(Replace(kGood, "data_share: 0.5", "data_share: 0.5\n    secagg_drop_after_shares: 1"),
              {"exp.yaml:", "clients[0].secagg_drop_after_shares", "1"});
  ExpectError(Replace(kGood, "data_share: 0.5", "data_share: 0.5\n    secagg_drop_after_shares: -0.1"),
              {"exp.yaml:", "clients[0].secagg_drop_after_shares", "-0.1"});
  absl::StatusOr<Manifest> back = ManifestFromResolvedJson(ResolvedManifestJson(*m), m->source_yaml);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_DOUBLE_EQ(back->clients[0].secagg_drop_after_shares, 0.3);
}

// Stragglers: server.selection.overcommit, server.deadline_policy and server.late_discount, read and kept in the
// resolved record; an over-commitment below 1 and an unknown policy are refused with the line.
TEST(ManifestTest, OvercommitAndDeadlinePolicyAreReadAndBadOnesRefused) {
  absl::StatusOr<Manifest> m =
      Parse(Replace(Replace(kGood, "  rounds: 2\n", "  rounds: 2\n  deadline_policy: fold\n  late_discount: 0.5\n"),
                    "selection: {", "selection: {overcommit: 1.3, "));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->settings.overcommit, 1.3);
  EXPECT_EQ(m->settings.deadline_policy, "fold");
  EXPECT_EQ(m->settings.late_discount, 0.5);
  absl::StatusOr<Manifest> back = ManifestFromResolvedJson(ResolvedManifestJson(*m), m->source_yaml);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->settings, m->settings);
  absl::StatusOr<Manifest> plain = Parse(kGood);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->settings.overcommit, 1.0);
  EXPECT_EQ(plain->settings.deadline_policy, "drop");
  ExpectError(Replace(kGood, "selection: {", "selection: {overcommit: 0.8, "),
              {"exp.yaml:", "server.selection.overcommit"});
  ExpectError(Replace(kGood, "  rounds: 2\n", "  rounds: 2\n  deadline_policy: keep\n"),
              {"server.deadline_policy", "drop", "fold"});
}

// Every shipped manifest (experiments/ and examples/) parses, resolves to JSON and reads back field by field
// equal: the writer and the reader of the record come from the same tables as the YAML reader. The examples'
// TorchScript models and data are made by scripts (out/byom/...): empty stand-ins in a scratch directory
// satisfy the loader, which only checks that they exist.
TEST(ManifestTest, EveryShippedManifestRoundTripsThroughTheResolvedJson) {
  const fs::path source_dir = kExperiments.parent_path();
  std::vector<fs::path> manifests;
  for (const fs::path& dir : {source_dir / "experiments", source_dir / "examples"}) {
    for (const auto& e : fs::recursive_directory_iterator(dir)) {
      const std::string p = e.path().string();
      if (e.path().extension() != ".yaml" || p.find("/profiles/") != std::string::npos) continue;
      if (p.find("/experiments/diloco/") != std::string::npos) continue;  // islands manifests (docs/diloco.md)
      if (p.find("/test/corpus/") != std::string::npos) continue;         // fuzz seeds (manifest_fuzz_test)
      if (p.find("/test/golden/") != std::string::npos) continue;         // renderers' golden outputs
      manifests.push_back(e.path());
    }
  }
  ASSERT_GE(manifests.size(), 10u);

  fl::testing::ScratchDir scratch("manifest_round_trip");
  const fs::path cwd = fs::current_path();
  fs::current_path(scratch.path());
  for (const fs::path& path : manifests) {
    const YAML::Node training = YAML::LoadFile(path.string())["training"];
    for (const char* key : {"model", "data"}) {
      if (!training || !training[key]) continue;
      const fs::path file = training[key].as<std::string>();
      if (file.is_absolute() || (std::string(key) == "model" && file.extension() != ".pt")) continue;
      fs::create_directories(file.parent_path());
      std::ofstream(file) << "stand-in";
    }
    absl::StatusOr<Manifest> m = LoadManifest(path);
    ASSERT_TRUE(m.ok()) << path << ": " << m.status();
    const std::string json = ResolvedManifestJson(*m);
    absl::StatusOr<Manifest> back = ManifestFromResolvedJson(json, m->source_yaml);
    ASSERT_TRUE(back.ok()) << path << ": " << back.status();
    EXPECT_EQ(ResolvedManifestJson(*back), json) << path;
    // A recorded link profile was read from the record, not from its file: the one field that differs.
    for (ClientGroup& g : back->clients) {
      if (g.link.has_value()) g.link->source = m->clients[&g - back->clients.data()].link->source;
    }
    EXPECT_TRUE(*back == *m) << path << " reads back different from what was written:\n" << json;
  }
  fs::current_path(cwd);
}

// Replay reads manifests recorded by earlier builds: before bring-your-own-model (no data, task, buffers,
// seq_len), before metrics_addr and upload_slots, and before device descriptions were recorded. Their fields
// keep the defaults those runs had.
TEST(ManifestTest, ManifestsRecordedBeforeNewerFieldsStillReadBack) {
  constexpr char kOld[] = R"({
  "name": "old", "seed": 3,
  "server": {"strategy": "fedavg", "rounds": 2, "round_deadline_s": 60.0, "fraction_fit": 1.0,
             "min_fit_clients": 1, "min_available_clients": 1, "evaluate_every": 1,
             "fraction_evaluate": 1.0, "max_round_attempts": 3},
  "training": {"model": "cnn", "data_dir": "", "partition": "iid", "local_epochs": 1, "local_steps": 0,
               "batch_size": 32, "optimizer": "sgd", "lr": 0.05, "momentum": 0.0, "weight_decay": 0.0,
               "proximal_mu": 0.0, "threads": 1},
  "codecs": {"uplink": "int8", "downlink": "fp32"},
  "emulation": {"backend": "none", "host_relative_speed": 4.0},
  "clients": [{"name": "pi", "count": 2, "link_kind": "ethernet", "data_share": 1.0, "start_delay_s": 0.0,
               "leave_after_s": 0.0, "slowdown": 4.0, "link": null, "link_name": "",
               "device": {"name": "rpi4", "device_class": "rpi4", "relative_speed": 1.0, "cores": 4,
                          "memory_mb": 4096, "reference": "r", "source": "rpi4.yaml", "is_host": false}}]
})";
  absl::StatusOr<Manifest> m = ManifestFromResolvedJson(kOld, "name: old\n");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->name, "old");
  EXPECT_EQ(m->description, "");
  EXPECT_EQ(m->settings.seed, 3u);
  EXPECT_EQ(m->settings.uplink_codec, "int8");
  EXPECT_EQ(m->training.task, "classification");
  EXPECT_EQ(m->training.buffers, "average");
  EXPECT_EQ(m->training.seq_len, 64u);
  EXPECT_EQ(m->training.data, "");
  EXPECT_EQ(m->server.metrics_addr, "");
  EXPECT_EQ(m->settings.upload_slots, 1u);  // fl-server's default, which the old record's 0 meant
  ASSERT_EQ(m->clients.size(), 1u);
  EXPECT_EQ(m->clients[0].count, 2u);
  EXPECT_EQ(m->clients[0].device.memory_mb, 4096u);
  EXPECT_EQ(m->clients[0].device.description, "");
  EXPECT_FALSE(m->clients[0].link.has_value());
  // Recorded before the security section: a replay runs mutual TLS with a throwaway CA (docs/manifests.md).
  EXPECT_EQ(m->security.mode, "mtls");
  EXPECT_EQ(m->security.pki_dir, "");
  // Recorded before virtual clients: a replay runs a group with count as one fl-client --instances process.
  EXPECT_TRUE(m->emulation.virtual_clients);
  // Recorded before emulation.devices: those runs slowed devices by the duty cycle, and a replay does too.
  EXPECT_EQ(m->emulation.devices, "duty-cycle");
  // A field every record has is still required.
  std::string missing = kOld;
  missing.replace(missing.find("\"rounds\": 2, "), 13, "");
  absl::StatusOr<Manifest> bad = ManifestFromResolvedJson(missing, "");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss) << bad.status();
  EXPECT_NE(std::string(bad.status().message()).find("rounds"), std::string::npos) << bad.status();
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

TEST(ManifestTest, SecurityIsMutualTlsUnlessInsecureIsAskedFor) {
  absl::StatusOr<Manifest> m = Parse(kGood);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->security.mode, "mtls");
  EXPECT_EQ(m->security.pki_dir, "");
  absl::StatusOr<Manifest> insecure = Parse(Replace(kGood, "\nclients:", "\nsecurity: {mode: insecure}\nclients:"));
  ASSERT_TRUE(insecure.ok()) << insecure.status();
  EXPECT_EQ(insecure->security.mode, "insecure");
  absl::StatusOr<Manifest> back = ManifestFromResolvedJson(ResolvedManifestJson(*insecure), insecure->source_yaml);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->security.mode, "insecure");

  absl::StatusOr<Manifest> typo = Parse(Replace(kGood, "\nclients:", "\nsecurity: {mode: tls}\nclients:"));
  ASSERT_FALSE(typo.ok());
  EXPECT_NE(std::string(typo.status().message()).find("security.mode"), std::string::npos) << typo.status();
  EXPECT_NE(std::string(typo.status().message()).find("insecure"), std::string::npos) << typo.status();
}

TEST(ManifestTest, PkiDirNeedsACertificateForEveryClient) {
  fl::testing::ScratchDir dir("fl_manifest_pki");
  const fs::path pki = dir.File("pki");
  // fl-provision's layout, as far as the manifest checks it (the files' contents are the handshake's business).
  for (const char* f : {"ca/ca.crt", "ca/crl.pem", "server/server.crt", "server/server.key", "clients/pi-0.crt",
                        "clients/pi-0.key", "clients/pi-1.crt", "clients/pi-1.key", "clients/box-0.crt"}) {
    fs::create_directories((pki / f).parent_path());
    std::ofstream(pki / f) << "x";
  }
  const std::string with_pki =
      Replace(kGood, "\nclients:", fl::StrCat("\nsecurity: {pki_dir: ", pki.string(), "}\nclients:"));
  absl::StatusOr<Manifest> missing = Parse(with_pki);
  ASSERT_FALSE(missing.ok());
  const std::string message(missing.status().message());
  EXPECT_NE(message.find("security.pki_dir"), std::string::npos) << message;
  EXPECT_NE(message.find("clients/box-0.key"), std::string::npos) << message;
  EXPECT_NE(message.find("fl-provision add-client box-0"), std::string::npos) << message;

  std::ofstream(pki / "clients/box-0.key") << "x";
  absl::StatusOr<Manifest> m = Parse(with_pki);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->security.mode, "mtls");
  EXPECT_EQ(m->security.pki_dir, pki.string());
  absl::StatusOr<Manifest> back = ManifestFromResolvedJson(ResolvedManifestJson(*m), m->source_yaml);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->security.pki_dir, pki.string());  // a replay uses the same certificates

  absl::StatusOr<Manifest> gone =
      Parse(Replace(kGood, "\nclients:", "\nsecurity: {pki_dir: /nonexistent/pki}\nclients:"));
  ASSERT_FALSE(gone.ok());
  EXPECT_NE(std::string(gone.status().message()).find("fl-provision init"), std::string::npos) << gone.status();
  absl::StatusOr<Manifest> both = Parse(
      Replace(kGood, "\nclients:", fl::StrCat("\nsecurity: {mode: insecure, pki_dir: ", pki.string(), "}\nclients:")));
  ASSERT_FALSE(both.ok());
  EXPECT_NE(std::string(both.status().message()).find("mode insecure"), std::string::npos) << both.status();
}

// ---- Every setting declared once (fl/server/settings.h): fl-experiment's manifest reader and fl-server's flags ----

// fl-server's settings from its flags, through its real options.
absl::StatusOr<server::EngineConfig> ServerFlags(std::vector<std::string> args) {
  CLI::App app{"fl-server"};
  server::SettingFlags flags;
  server::AddSettingOptions(app, flags);
  if (absl::Status s = testing::ParseCommandLine(app, "fl-server", std::move(args)); !s.ok()) return s;
  return server::ResolveSettings(flags, "");
}

void SetPath(YAML::Node node, const std::vector<std::string>& parts, size_t i, const std::string& value) {
  if (i + 1 == parts.size()) {
    node[parts[i]] = value;
    return;
  }
  SetPath(node[parts[i]], parts, i + 1, value);  // a copy of a node refers to the same node
}

// A manifest of three clients that gives `value` (in the manifest's unit) for `s`.
std::string ManifestGiving(const server::Setting& s, const std::string& value) {
  YAML::Node root;
  root["name"] = "t";
  if (s.manifest != "server.rounds") root["server"]["rounds"] = 2;
  std::vector<std::string> parts;
  for (size_t from = 0, dot; from <= s.manifest.size(); from = dot + 1) {
    dot = s.manifest.find('.', from);
    if (dot == std::string::npos) dot = s.manifest.size();
    parts.push_back(s.manifest.substr(from, dot - from));
  }
  SetPath(root, parts, 0, value);
  YAML::Node client;
  client["name"] = "c";
  client["count"] = 3;
  root["clients"].push_back(client);
  YAML::Emitter out;
  out << root;
  return out.c_str();
}

std::string Num(double v) {
  std::ostringstream os;
  os.precision(17);
  os << v;
  return os.str();
}

// For every setting a manifest can give: fl-experiment's reader and fl-server's flag take the same value in the
// same unit, refuse the same values past the same bounds in the same words, and fl-server, given the arguments
// fl-experiment builds from a manifest (and from its replay), runs with exactly the manifest's settings.
TEST(ManifestSettingsTest, ManifestAndFlagAgreeOnDefaultBoundsAndUnitOfEverySetting) {
  const server::EngineConfig defaults = server::DefaultEngineConfig();
  absl::StatusOr<Manifest> plain = Parse("name: t\nserver: {rounds: 5}\nclients: [{name: c, count: 3}]\n");
  ASSERT_TRUE(plain.ok()) << plain.status();
  int n = 0;
  for (const server::Setting& s : server::Settings()) {
    SCOPED_TRACE(s.name);
    if (s.manifest.empty()) continue;
    ++n;
    EXPECT_EQ(s.get(plain->settings), s.get(defaults));  // the same default
    // A value that is not the default: a bound, or a valid text.
    std::string value;
    if (s.type == server::SettingType::kString) {
      value = !s.choices.empty()     ? (s.choices.back() == s.get(defaults) ? s.choices.front() : s.choices.back())
              : s.name == "strategy" ? "fedyogi"
              : s.name == "uplink_codec_policy" ? "by-rate:0=int4,default=fp32"
              : s.name == "staleness_weight"    ? "constant"
              : s.name == "clip_update_norm"    ? "3"
                                                : "int4";
    } else {
      value = Num(s.min_open ? s.min + 0.25 * (s.max - s.min) : s.min);
      if (s.type == server::SettingType::kUnsigned && s.min == 0) value = "1";
      if (value == s.get(defaults)) value = Num(s.max > 1e15 ? 12345 : s.max);
      if (s.name == "min_fit_clients" || s.name == "min_available_clients") value = "3";  // the manifest has 3
    }
    const std::string in_manifest =
        s.type == server::SettingType::kString ? value : Num(std::stod(value) / s.manifest_scale);
    absl::StatusOr<Manifest> m = Parse(ManifestGiving(s, in_manifest));
    absl::StatusOr<server::EngineConfig> flag = ServerFlags({s.flag, value});
    ASSERT_TRUE(m.ok()) << m.status() << "\n" << ManifestGiving(s, in_manifest);
    ASSERT_TRUE(flag.ok()) << flag.status();
    EXPECT_EQ(s.get(m->settings), s.get(*flag));
    EXPECT_NE(s.get(m->settings), s.get(defaults));
    // fl-server as fl-experiment starts it, for the run and for its replay.
    absl::StatusOr<server::EngineConfig> run = ServerFlags(ServerSettingArgs(*m));
    ASSERT_TRUE(run.ok()) << run.status();
    absl::StatusOr<Manifest> replay = ManifestFromResolvedJson(ResolvedManifestJson(*m), m->source_yaml);
    ASSERT_TRUE(replay.ok()) << replay.status();
    absl::StatusOr<server::EngineConfig> replayed = ServerFlags(ServerSettingArgs(*replay));
    ASSERT_TRUE(replayed.ok()) << replayed.status();
    for (const server::Setting& t : server::Settings()) {
      if (t.manifest.empty()) continue;
      EXPECT_EQ(t.get(*run), t.get(m->settings)) << t.name;
      EXPECT_EQ(t.get(*replayed), t.get(m->settings)) << t.name;
    }
    if (s.type == server::SettingType::kString) continue;
    // Past the upper bound: the same refusal from both, after the source.
    if (s.max > 1e15) continue;
    const double bad = s.max + (s.type == server::SettingType::kUnsigned ? 1 : std::max(1e-3, s.max * 1e-3));
    const std::string flag_text =
        s.type == server::SettingType::kUnsigned ? std::to_string(static_cast<uint64_t>(bad)) : Num(bad);
    absl::StatusOr<Manifest> m_bad = Parse(ManifestGiving(s, Num(bad / s.manifest_scale)));
    absl::StatusOr<server::EngineConfig> flag_bad = ServerFlags({s.flag, flag_text});
    ASSERT_FALSE(m_bad.ok());
    ASSERT_FALSE(flag_bad.ok());
    const std::string a(m_bad.status().message()), b(flag_bad.status().message());
    EXPECT_EQ(a.substr(a.find(" for setting ")), b.substr(b.find(" for setting "))) << a << "\n" << b;
    EXPECT_NE(a.find(fl::StrCat("exp.yaml:")), std::string::npos) << a;
    EXPECT_NE(a.find(s.manifest), std::string::npos) << a;
  }
  EXPECT_GT(n, 50);
}

// The disagreements issue 28 found, gone: fraction_fit 0 was accepted here and refused by fl-server; upload_slots
// was 0 here and 1 there; the deadline was in seconds here and milliseconds there (it still is, declared).
TEST(ManifestSettingsTest, TheOldDisagreementsAreGone) {
  ExpectError(Replace(kGood, "selection: {", "selection: {fraction_fit: 0, "),
              {"exp.yaml:6: server.selection.fraction_fit: 0 is out of bounds for setting fraction_fit "
               "(--fraction-fit, manifest server.selection.fraction_fit), within (0, 1]"});
  absl::StatusOr<Manifest> m = Parse(Replace(kGood, "  rounds: 2\n", "  rounds: 2\n  round_deadline_s: 1.5\n"));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->settings.upload_slots, 1u);
  EXPECT_EQ(m->settings.round_deadline_ms, 1500u);
  const std::vector<std::string> args = ServerSettingArgs(*m);
  const auto at = std::find(args.begin(), args.end(), "--round-deadline-ms");
  ASSERT_NE(at, args.end());
  EXPECT_EQ(*(at + 1), "1500");
}

// ---- fl-client's settings that manifests set, declared once (fl/client/settings.h) ----

// fl-client's settings from its flags, through its real options.
absl::StatusOr<client::ClientSettings> ClientFlags(std::vector<std::string> args) {
  CLI::App app{"fl-client"};
  client::ClientSettingFlags flags;
  client::AddClientSettingOptions(app, flags);
  if (absl::Status s = testing::ParseCommandLine(app, "fl-client", std::move(args)); !s.ok()) return s;
  client::ClientSettings settings;
  if (absl::Status st = flags.ApplyTo(settings); !st.ok()) return st;
  return settings;
}

// A manifest of one group of three clients that gives `value` for `s` (training.<key> or clients[0].<key>), and
// `model` as training.model when not empty.
std::string ManifestGivingClient(const client::ClientSetting& s, const std::string& value, const std::string& model) {
  YAML::Node root;
  root["name"] = "t";
  root["server"]["rounds"] = 2;
  if (!model.empty()) root["training"]["model"] = model;
  YAML::Node group;
  group["name"] = "c";
  group["count"] = 3;
  const size_t dot = s.manifest.find('.');
  const std::string section = s.manifest.substr(0, dot), key = s.manifest.substr(dot + 1);
  if (section == "training") {
    root["training"][key] = value;
  } else {
    group[key] = value;
  }
  root["clients"].push_back(group);
  YAML::Emitter out;
  out << root;
  return out.c_str();
}

// For every fl-client setting a manifest sets: the manifest's default is fl-client's, a value reads the same from
// the manifest's key and from fl-client's flag, a value past the bounds (or not among the choices) is refused by
// both in the same words, and the arguments fl-experiment starts fl-client with (for the run and for its replay)
// give fl-client exactly the manifest's settings.
TEST(ManifestSettingsTest, ManifestAndFlagAgreeOnDefaultBoundsAndUnitOfEveryClientSetting) {
  static testing::ScratchDir dir("fl_manifest_client_settings");
  const std::string pt = dir.File("model.pt"), npz = dir.File("data.npz");
  std::ofstream(pt) << "x";
  std::ofstream(npz) << "x";
  absl::StatusOr<Manifest> plain = Parse("name: t\nserver: {rounds: 5}\nclients: [{name: c, count: 3}]\n");
  ASSERT_TRUE(plain.ok()) << plain.status();
  absl::StatusOr<client::ClientSettings> no_flags = ClientFlags({});
  ASSERT_TRUE(no_flags.ok()) << no_flags.status();
  const client::ClientSettings plain_settings = ClientSettingsFor(*plain, plain->clients[0]);
  EXPECT_EQ(plain_settings, *no_flags);  // the same defaults, all of them
  int n = 0;
  for (const client::ClientSetting& s : client::ClientSettingsTable()) {
    SCOPED_TRACE(s.name);
    ++n;
    const std::string def = s.Get(*no_flags);
    // A value that is not the default: a bound, another choice, or a valid text.
    std::string value;
    if (s.type == config::SettingType::kString) {
      value = !s.choices.empty()      ? (s.choices.back() == def ? s.choices.front() : s.choices.back())
              : s.name == "model"     ? "synthetic:1000:5"
              : s.name == "partition" ? "shards:2"
              : s.name == "data"      ? npz
                                      : "/srv/fashion-mnist";
    } else {
      value = Num(s.min_open ? s.min + 0.25 * (s.max - s.min) : s.min);
      if (value == def) value = Num(s.max);
    }
    // Data and the tasks other than classification are for TorchScript models.
    const bool needs_pt = s.name == "data" || s.name == "task";
    absl::StatusOr<Manifest> m = Parse(ManifestGivingClient(s, value, needs_pt ? pt : ""));
    std::vector<std::string> args = {s.flag, value};
    if (needs_pt) args.insert(args.end(), {"--model", pt});
    absl::StatusOr<client::ClientSettings> flag = ClientFlags(args);
    ASSERT_TRUE(m.ok()) << m.status() << "\n" << ManifestGivingClient(s, value, needs_pt ? pt : "");
    ASSERT_TRUE(flag.ok()) << flag.status();
    const client::ClientSettings given = ClientSettingsFor(*m, m->clients[0]);
    EXPECT_EQ(s.Get(given), s.Get(*flag));
    EXPECT_NE(s.Get(given), def);
    // fl-client as fl-experiment starts it (runner.cc's ClientArgs), for the run and for its replay.
    absl::StatusOr<client::ClientSettings> run = ClientFlags(client::ClientSettingArgs(given));
    ASSERT_TRUE(run.ok()) << run.status();
    EXPECT_EQ(*run, given);
    absl::StatusOr<Manifest> replay = ManifestFromResolvedJson(ResolvedManifestJson(*m), m->source_yaml);
    ASSERT_TRUE(replay.ok()) << replay.status();
    absl::StatusOr<client::ClientSettings> replayed =
        ClientFlags(client::ClientSettingArgs(ClientSettingsFor(*replay, replay->clients[0])));
    ASSERT_TRUE(replayed.ok()) << replayed.status();
    EXPECT_EQ(*replayed, given);
    // Past the upper bound, or not a choice: the same refusal from both, after the source.
    std::string bad;
    if (s.type != config::SettingType::kString) {
      bad = s.type == config::SettingType::kUnsigned ? Num(s.max + 1) : Num(s.max * 1.001);
    } else if (!s.choices.empty() || s.check) {
      bad = "nonsense";
    } else {
      continue;  // a path: any text
    }
    absl::StatusOr<Manifest> m_bad = Parse(ManifestGivingClient(s, bad, ""));
    absl::StatusOr<client::ClientSettings> flag_bad = ClientFlags({s.flag, bad});
    ASSERT_FALSE(m_bad.ok());
    ASSERT_FALSE(flag_bad.ok());
    const std::string a(m_bad.status().message()), b(flag_bad.status().message());
    ASSERT_NE(a.find(" for setting "), std::string::npos) << a;
    ASSERT_NE(b.find(" for setting "), std::string::npos) << b;
    EXPECT_EQ(a.substr(a.find(" for setting ")), b.substr(b.find(" for setting "))) << a << "\n" << b;
    EXPECT_NE(a.find("exp.yaml:"), std::string::npos) << a;
    EXPECT_NE(b.find(fl::StrCat(s.flag, ": ")), std::string::npos) << b;
    if (!s.unit.empty()) {
      EXPECT_NE(a.find(fl::StrCat(" in ", s.unit, ", within ")), std::string::npos) << a;
    }
  }
  EXPECT_EQ(n, 10);
}

}  // namespace
}  // namespace fl::experiment
