// Every setting declared once (settings.h): the flag and the manifest key of each setting agree on its default,
// bounds and unit, through the real CLI11 options and fl-server's manifest reader; a value out of bounds and a
// disagreement between the two are refused in the same words; a replay reproduces every recorded setting.
#include "fl/server/settings.h"

#include <gtest/gtest.h>

#include <cmath>
#include <sstream>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "fl/config/yaml_fields.h"
#include "fl/core/str_cat.h"
#include "fl/testing/cli_parse.h"
#include "fl/testing/scratch_dir.h"

namespace fl::server {
namespace {

// Parses `args` through fl-server's setting options and, when `manifest` is not empty, fl-server --manifest.
absl::StatusOr<EngineConfig> Resolve(const std::vector<std::string>& args, const std::string& manifest = {}) {
  CLI::App app{"settings_test"};
  SettingFlags flags;
  AddSettingOptions(app, flags);
  if (absl::Status s = testing::ParseCommandLine(app, "fl-server", args); !s.ok()) {
    return absl::InvalidArgumentError(fl::StrCat("CLI11: ", s.message()));
  }
  std::string path;
  if (!manifest.empty()) {
    static testing::ScratchDir dir("fl_settings_test");
    path = dir.File("manifest.yaml");
    std::ofstream(path) << manifest;
  }
  return ResolveSettings(flags, path);
}

// A manifest giving `text` (in the manifest's unit) at the setting's path, nested as the path says.
std::string ManifestWith(const Setting& s, const std::string& text) {
  std::string yaml;
  std::string indent;
  std::string_view path = s.manifest;
  for (size_t dot = path.find('.'); dot != std::string_view::npos; dot = path.find('.')) {
    yaml = fl::StrCat(yaml, indent, path.substr(0, dot), ":\n");
    indent += "  ";
    path.remove_prefix(dot + 1);
  }
  return fl::StrCat(yaml, indent, path, ": ", text, "\n");
}

std::string Num(double v) {
  std::ostringstream os;
  os.precision(17);
  os << v;
  return os.str();
}

// A value of the setting in its unit that is not its default: a bound, or a valid text.
std::string OtherValue(const Setting& s, const EngineConfig& defaults) {
  static const std::map<std::string, std::string> kText = {
      {"experiment_name", "other"},     {"experiment_id", "exp-1"},
      {"strategy", "fedadam:lr=0.03"},  {"uplink_codec", "int8"},
      {"downlink_codec", "fp16"},       {"uplink_codec_policy", "by-link:5g=int4,default=fp32"},
      {"staleness_weight", "constant"}, {"clip_update_norm", "7.5"},
      {"checkpoint_dir", "/tmp/ckpt"}};
  if (s.type == SettingType::kString) {
    if (!s.choices.empty()) return s.choices.back() == s.get(defaults) ? s.choices.front() : s.choices.back();
    return kText.at(s.name);
  }
  // The lower bound (or just above an open one); the upper one when the default sits there.
  std::string low =
      s.type == SettingType::kUnsigned ? Num(s.min) : Num(s.min_open ? s.min + 0.25 * (s.max - s.min) : s.min);
  if (s.type == SettingType::kUnsigned && s.min == 0 && s.max >= 1) low = "1";
  return low == s.get(defaults) ? (s.type == SettingType::kUnsigned ? Num(s.max > 1e15 ? 12345 : s.max) : Num(s.max))
                                : low;
}

// The message without its source ("--x: " or "<file>:<line>: <path>: "): what both sources say alike.
std::string AfterSource(const std::string& message, const std::string& marker) {
  const size_t at = message.find(marker);
  return at == std::string::npos ? message : message.substr(at);
}

TEST(SettingsTest, EverySettingHasANameAFlagAGroupAUnitOrChoicesAndHelp) {
  std::map<std::string, int> names, flags, paths;
  for (const Setting& s : Settings()) {
    EXPECT_EQ(++names[s.name], 1) << s.name;
    EXPECT_EQ(++flags[s.flag], 1) << s.flag;
    if (!s.manifest.empty()) {
      EXPECT_EQ(++paths[s.manifest], 1) << s.manifest;
    }
    EXPECT_TRUE(s.flag.starts_with("--")) << s.name;
    EXPECT_FALSE(s.group.empty()) << s.name;
    EXPECT_FALSE(s.help.empty()) << s.name;
    EXPECT_TRUE(s.get && s.set) << s.name;
    if (s.type != SettingType::kString) {
      EXPECT_LT(s.min, s.max) << s.name;
    }
    if (s.manifest_scale != 1) {
      EXPECT_FALSE(s.manifest_unit.empty()) << s.name;
    }
    EXPECT_EQ(FindSetting(s.flag), &s);
  }
}

// For every setting that a manifest can give: the same default with neither source, the same value (in the
// setting's unit) from the flag and from the manifest, the same refusal of a value past either bound.
TEST(SettingsTest, FlagAndManifestAgreeOnDefaultBoundsAndUnitOfEverySetting) {
  const EngineConfig defaults = DefaultEngineConfig();
  absl::StatusOr<EngineConfig> none = Resolve({});
  ASSERT_TRUE(none.ok()) << none.status();
  absl::StatusOr<EngineConfig> empty_manifest = Resolve({}, "name: x\n");
  ASSERT_TRUE(empty_manifest.ok()) << empty_manifest.status();
  int checked = 0;
  for (const Setting& s : Settings()) {
    SCOPED_TRACE(s.name);
    EXPECT_EQ(s.get(*none), s.get(defaults));
    EXPECT_EQ(s.get(*empty_manifest), s.get(defaults));
    if (s.manifest.empty()) continue;
    ++checked;
    // A value other than the default, given by each source in its own unit.
    const std::string value = OtherValue(s, defaults);
    const std::string in_manifest =
        s.type == SettingType::kString ? fl::StrCat("\"", value, "\"") : Num(std::stod(value) / s.manifest_scale);
    absl::StatusOr<EngineConfig> by_flag = Resolve({s.flag, value});
    absl::StatusOr<EngineConfig> by_manifest = Resolve({}, ManifestWith(s, in_manifest));
    ASSERT_TRUE(by_flag.ok()) << by_flag.status();
    ASSERT_TRUE(by_manifest.ok()) << by_manifest.status();
    EXPECT_EQ(s.get(*by_flag), s.get(*by_manifest));
    EXPECT_NE(s.get(*by_flag), s.get(defaults));
    // Both at once with the same value: fine.
    absl::StatusOr<EngineConfig> both = Resolve({s.flag, value}, ManifestWith(s, in_manifest));
    EXPECT_TRUE(both.ok()) << both.status();
    if (s.type == SettingType::kString) continue;
    // Past each bound: refused by both, in the same words after the source, which name the setting, the
    // flag, the manifest path, the unit and the bounds.
    const double step = s.type == SettingType::kUnsigned ? 1 : std::max(1e-3, std::fabs(s.max) * 1e-3);
    std::vector<double> outside;
    if (s.max < 1e19) outside.push_back(s.max + (s.max >= 1e15 ? s.max : step));  // not past 2^64
    if (s.min > 0 || s.min_open) outside.push_back(s.min_open ? s.min : s.min - step);
    for (double bad : outside) {
      if (s.zero_off && bad == 0) continue;
      if (s.type == SettingType::kUnsigned && bad < 0) continue;
      const std::string flag_text =
          s.type == SettingType::kUnsigned ? fl::StrCat(static_cast<uint64_t>(bad)) : Num(bad);
      absl::StatusOr<EngineConfig> flag_bad = Resolve({s.flag, flag_text});
      absl::StatusOr<EngineConfig> manifest_bad = Resolve({}, ManifestWith(s, Num(bad / s.manifest_scale)));
      ASSERT_FALSE(flag_bad.ok()) << flag_text;
      ASSERT_FALSE(manifest_bad.ok()) << bad;
      const std::string f(flag_bad.status().message()), m(manifest_bad.status().message());
      EXPECT_EQ(AfterSource(f, " for setting "), AfterSource(m, " for setting ")) << f << "\n" << m;
      EXPECT_NE(f.find(s.Describe()), std::string::npos) << f;
      EXPECT_TRUE(f.starts_with(s.flag)) << f;
      EXPECT_NE(m.find(fl::StrCat("manifest.yaml:")), std::string::npos) << m;
      EXPECT_NE(m.find(s.manifest), std::string::npos) << m;
      if (!s.unit.empty()) {
        EXPECT_NE(f.find(fl::StrCat(" in ", s.unit)), std::string::npos) << f;
      }
    }
  }
  EXPECT_GT(checked, 50);
}

TEST(SettingsTest, ManifestSecondsAreTheFlagsMillisecondsAndBothUnitsAreNamed) {
  const Setting& deadline = *FindSetting("round_deadline_ms");
  absl::StatusOr<EngineConfig> c = Resolve({}, "server:\n  round_deadline_s: 2.5\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->round_deadline_ms, 2500u);
  absl::StatusOr<EngineConfig> bad = Resolve({}, "server:\n  round_deadline_s: 0.05\n");
  ASSERT_FALSE(bad.ok());
  const std::string m(bad.status().message());
  EXPECT_NE(m.find("server.round_deadline_s: 0.05 s (50 ms) is out of bounds for setting round_deadline_ms"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("within [100, 4294967295]"), std::string::npos) << m;
  EXPECT_NE(m.find("a manifest gives s: [0.1, 4294967.295]"), std::string::npos) << m;
  EXPECT_NE(deadline.Describe().find("--round-deadline-ms"), std::string::npos);
  // A fraction of a millisecond is no whole number of ms.
  EXPECT_FALSE(Resolve({}, "server:\n  round_deadline_s: 0.1234\n").ok());
}

TEST(SettingsTest, AManifestAndAFlagThatDisagreeAreRefusedNamingBoth) {
  absl::StatusOr<EngineConfig> c = Resolve({"--round-deadline-ms", "30000"}, "server:\n  round_deadline_s: 60\n");
  ASSERT_FALSE(c.ok());
  const std::string m(c.status().message());
  EXPECT_NE(m.find("manifest.yaml:2: server.round_deadline_s gives 60 s (60000 ms) but --round-deadline-ms gives "
                   "30000 ms for setting round_deadline_ms (--round-deadline-ms, manifest server.round_deadline_s) in "
                   "ms, within [100, 4294967295]"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("give the setting once"), std::string::npos) << m;
  // The same value in both units is no disagreement.
  EXPECT_TRUE(Resolve({"--round-deadline-ms", "60000"}, "server:\n  round_deadline_s: 60\n").ok());
  // Strings too: the strategy, from a map in the manifest.
  absl::StatusOr<EngineConfig> s =
      Resolve({"--strategy", "fedyogi"}, "server:\n  strategy: {name: fedadam, options: {lr: 0.03}}\n");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(std::string(s.status().message()).find("gives fedadam:lr=0.03 but --strategy gives fedyogi"),
            std::string::npos)
      << s.status();
}

// The disagreements issue 28 found: fraction_fit 0 accepted by manifests and refused by fl-server; upload_slots
// 0 in manifests and 1 in the engine.
TEST(SettingsTest, TheOldDisagreementsAreGoneByConstruction) {
  absl::StatusOr<EngineConfig> flag = Resolve({"--fraction-fit", "0"});
  absl::StatusOr<EngineConfig> manifest = Resolve({}, "server:\n  selection:\n    fraction_fit: 0\n");
  ASSERT_FALSE(flag.ok());
  ASSERT_FALSE(manifest.ok());
  EXPECT_EQ(AfterSource(std::string(flag.status().message()), " is out of bounds"),
            AfterSource(std::string(manifest.status().message()), " is out of bounds"));
  EXPECT_EQ(DefaultEngineConfig().upload_slots, 1u);
  EXPECT_EQ(Resolve({}, "server: {rounds: 2}\n")->upload_slots, 1u);
}

TEST(SettingsTest, ValidateChecksTheDeclaredBoundsNamingTheFlag) {
  EngineConfig c = DefaultEngineConfig();
  ASSERT_TRUE(c.Validate().ok()) << c.Validate();
  c.fit.fraction = 0;
  EXPECT_NE(std::string(c.Validate().message()).find("--fraction-fit=0: "), std::string::npos) << c.Validate();
  c = DefaultEngineConfig();
  c.train.set_momentum(1.5);
  EXPECT_NE(std::string(c.Validate().message()).find("setting momentum (--momentum, manifest training.momentum)"),
            std::string::npos)
      << c.Validate();
  // The buffered settings' bounds apply under buffered aggregation only.
  c = DefaultEngineConfig();
  c.max_staleness = 0;
  EXPECT_TRUE(c.Validate().ok()) << c.Validate();
}

// Every recorded setting, set to something other than its default, survives record -> recorded JSON -> replay:
// the configuration read back, and fl-server's arguments built from it, parsed again.
TEST(SettingsTest, AReplayReproducesEveryRecordedSetting) {
  const EngineConfig defaults = DefaultEngineConfig();
  EngineConfig original = defaults;
  int recorded = 0;
  for (const Setting& s : Settings()) {
    if (!s.recorded) continue;
    ++recorded;
    s.set(original, OtherValue(s, defaults));
  }
  // Keep it a configuration fl-server takes (buffered settings that fit together).
  original.fit.min_available = original.fit.min_clients = 2;
  original.aggregator = "mean";
  original.optimizer = "fedadam:lr=0.03";
  const std::string json = RecordedConfigJson(original);
  const nlohmann::json j = nlohmann::json::parse(json);
  for (const Setting& s : Settings()) EXPECT_EQ(j.contains(s.name), s.recorded) << s.name;
  EXPECT_TRUE(j.contains("clip_update_norm"));  // missing before issue 28
  absl::StatusOr<EngineConfig> back = ConfigFromRecordedJson(json);
  ASSERT_TRUE(back.ok()) << back.status();
  absl::StatusOr<EngineConfig> replay = Resolve(SettingArgs(*back, [](const Setting& s) { return s.recorded; }));
  ASSERT_TRUE(replay.ok()) << replay.status();
  for (const Setting& s : Settings()) {
    if (!s.recorded) continue;
    EXPECT_EQ(s.get(*back), s.get(original)) << s.name;
    EXPECT_EQ(s.get(*replay), s.get(original)) << s.name;
  }
  EXPECT_EQ(back->aggregator, "mean");
  EXPECT_EQ(back->optimizer, "fedadam:lr=0.03");
  EXPECT_GT(recorded, 50);
  // A record made before a setting was recorded keeps its default.
  absl::StatusOr<EngineConfig> old = ConfigFromRecordedJson(R"({"num_rounds": 3})");
  ASSERT_TRUE(old.ok());
  EXPECT_EQ(old->num_rounds, 3u);
  EXPECT_EQ(old->clip_update_norm, defaults.clip_update_norm);
}

TEST(SettingsTest, HelpListsTheSettingsInOptionGroupsByConcern) {
  CLI::App app{"settings_test"};
  SettingFlags flags;
  AddSettingOptions(app, flags);
  const std::string help = app.help();
  for (const char* group : {"Experiment", "Selection and rounds", "Clients' training", "Codecs", "Stragglers",
                            "Buffered aggregation", "Sessions and transfers", "Abuse limits", "Checkpoints"}) {
    EXPECT_NE(help.find(fl::StrCat("[Option Group: ", group)), std::string::npos) << group;
  }
  EXPECT_NE(help.find("--round-deadline-ms UINT=120000"), std::string::npos) << help;
  EXPECT_NE(help.find("[manifest: server.round_deadline_s, in s]"), std::string::npos) << help;
}

}  // namespace
}  // namespace fl::server
